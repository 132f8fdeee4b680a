//! The tie rule, in Rust: how an incoming state relates to the stored row, and which of
//! those relations each write path applies. Pure.
//!
//! Its SQL twin is `store::sql::guard_condition`, the WHERE of the guarded upsert, which
//! decides again under the row lock. `tests/it/tie_rule.rs` runs one truth table through
//! both, on both backends, so the two cannot drift apart.

use serde_json::Value;

use super::Change;
use crate::config::Action;

/// Which relations a write path applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Webhook path: strictly newer versions only. An equal version is a no-op here;
    /// the caller tells `stale` from `conflict`.
    NewerOnly,
    /// Reconcile path: the sender's listing is current state, so an equal version with
    /// a different state (or deletion flag) is applied too. Older versions never are.
    NewerOrDifferent,
}

/// The stored row, as the rule sees it.
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    pub version: i64,
    pub deleted: bool,
    /// `None` when only the digest was read.
    pub state: Option<&'a str>,
    /// [`super::state_digest`] of the stored state, when the row has one.
    pub digest: Option<i64>,
}

/// How an incoming state relates to the stored row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// No row yet.
    Missing,
    /// The incoming version is newer.
    NewerIncoming,
    /// Equal version, and the deletion flag or the state differs.
    Differing,
    /// The stored version is newer (a webhook overtook a listing, or a late retry).
    NewerStored,
    /// Equal version, same deletion flag and same state (a delete without state says
    /// nothing about the state).
    Equal,
}

/// The relation of `incoming` to `stored`.
pub fn relation(stored: Option<Stored<'_>>, incoming: &Change) -> Relation {
    let Some(stored) = stored else {
        return Relation::Missing;
    };
    if incoming.version > stored.version {
        return Relation::NewerIncoming;
    }
    if incoming.version < stored.version {
        return Relation::NewerStored;
    }
    let same_deletion = stored.deleted == (incoming.action == Action::Delete);
    if same_deletion && same_state(stored, incoming) {
        Relation::Equal
    } else {
        Relation::Differing
    }
}

/// Whether `incoming` carries the stored state (a delete without state says nothing
/// about it, so it does): by digest when the row has one, else by JSON value.
pub fn same_state(stored: Stored<'_>, incoming: &Change) -> bool {
    match (incoming.state.as_deref(), stored.digest, stored.state) {
        (None, _, _) => true,
        // The digest is over the canonical text, which the incoming state is.
        (Some(a), Some(digest), _) => super::state_digest(a) == digest,
        (Some(a), None, Some(b)) => a == b || json_equal(a, b),
        (Some(_), None, None) => false,
    }
}

impl Guard {
    /// Whether a write under this guard changes the row.
    pub fn admits(self, relation: Relation) -> bool {
        match relation {
            Relation::Missing | Relation::NewerIncoming => true,
            Relation::Differing => self == Guard::NewerOrDifferent,
            Relation::NewerStored | Relation::Equal => false,
        }
    }
}

/// Compares JSON documents by value: PostgreSQL's JSONB text differs from our canonical
/// text in whitespace and key order.
pub fn json_equal(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// One case of the tie rule's truth table.
#[derive(Debug, Clone, Copy)]
pub struct TieCase {
    pub name: &'static str,
    /// `(version, deleted, state)` of the stored row, if there is one.
    pub stored: Option<(i64, bool, Option<&'static str>)>,
    pub version: i64,
    pub state: Option<&'static str>,
    pub action: Action,
    /// The relation the rule must find.
    pub relation: Relation,
}

/// The truth table that the unit test below and `tests/it/tie_rule.rs` (the SQL, on both
/// backends) both run, so the Rust rule and the SQL guard are held to the same cases.
pub fn truth_table() -> Vec<TieCase> {
    use Action::{Delete, Upsert};
    use Relation::*;
    let a = Some(r#"{"status":"paid"}"#);
    let a_spaced = Some(r#"{"status": "paid"}"#);
    let b = Some(r#"{"status":"refunded"}"#);
    let case = |name, stored, version, state, action, relation| TieCase {
        name,
        stored,
        version,
        state,
        action,
        relation,
    };
    vec![
        case("no row", None, 1, a, Upsert, Missing),
        case("no row, delete", None, 1, None, Delete, Missing),
        case(
            "newer version",
            Some((5, false, a)),
            6,
            b,
            Upsert,
            NewerIncoming,
        ),
        case(
            "newer delete",
            Some((5, false, a)),
            6,
            None,
            Delete,
            NewerIncoming,
        ),
        case(
            "older version",
            Some((5, false, a)),
            4,
            b,
            Upsert,
            NewerStored,
        ),
        case(
            "older delete",
            Some((5, false, a)),
            3,
            None,
            Delete,
            NewerStored,
        ),
        case(
            "equal version, same state",
            Some((5, false, a)),
            5,
            a,
            Upsert,
            Equal,
        ),
        case(
            "equal version, same state spelled otherwise",
            Some((5, false, a_spaced)),
            5,
            a,
            Upsert,
            Equal,
        ),
        case(
            "equal version, other state",
            Some((5, false, a)),
            5,
            b,
            Upsert,
            Differing,
        ),
        case(
            "equal version, delete of a live row",
            Some((5, false, a)),
            5,
            None,
            Delete,
            Differing,
        ),
        case(
            "equal version, delete of a tombstone",
            Some((5, true, a)),
            5,
            None,
            Delete,
            Equal,
        ),
        case(
            "equal version, upsert over a tombstone",
            Some((5, true, a)),
            5,
            a,
            Upsert,
            Differing,
        ),
        case(
            "insert-once, same content",
            Some((0, false, a)),
            0,
            a,
            Upsert,
            Equal,
        ),
        case(
            "insert-once, other content",
            Some((0, false, a)),
            0,
            b,
            Upsert,
            Differing,
        ),
    ]
}

impl TieCase {
    /// The incoming change of this case, for resource `id` of `s`/`k`.
    pub fn incoming(&self, source: &str, kind: &str, id: &str) -> Change {
        Change {
            source: source.into(),
            account: String::new(),
            kind: kind.into(),
            id: id.into(),
            version: self.version,
            state: self.state.map(String::from),
            action: self.action,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_truth_table_gets_its_relation_and_each_guard_its_decision() {
        for case in truth_table() {
            let (name, want) = (case.name, case.relation);
            let incoming = case.incoming("s", "k", "1");
            let stored = case.stored.map(|(version, deleted, state)| Stored {
                digest: None,
                version,
                deleted,
                state,
            });
            let got = relation(stored, &incoming);
            assert_eq!(got, want, "{name}");
            assert_eq!(
                Guard::NewerOnly.admits(got),
                matches!(want, Relation::Missing | Relation::NewerIncoming),
                "{name}"
            );
            assert_eq!(
                Guard::NewerOrDifferent.admits(got),
                matches!(
                    want,
                    Relation::Missing | Relation::NewerIncoming | Relation::Differing
                ),
                "{name}"
            );
        }
    }
}

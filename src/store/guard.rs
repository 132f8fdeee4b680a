//! The version guard's rules, as pure functions. The SQL in `db::sql` applies a strictly
//! newer version atomically; when it did not apply, these rules say why.

use serde_json::Value;

use crate::change::Change;
use crate::config::Action;
use crate::db::sql::StoredRow;

use super::Outcome;

/// Outcome of a webhook change the guarded upsert did not apply.
///
/// - stored version newer: `stale`;
/// - equal version, same state and deletion flag: `stale` (a replay with a new event id);
/// - equal version, anything different: `conflict` — senders with whole-second
///   timestamps emit several states within one second, and neither can be trusted to be
///   the latest, so the row is kept and the sender's current state decides later.
pub fn classify_unapplied(stored: &StoredRow, incoming: &Change) -> Outcome {
    if stored.version > incoming.version {
        return Outcome::Stale;
    }
    let same_deletion = stored.deleted == (incoming.action == Action::Delete);
    let same_state = match (&incoming.state, &stored.state) {
        // A delete without state says nothing about the state.
        (None, _) => true,
        (Some(a), Some(b)) => json_equal(a, b),
        (Some(_), None) => false,
    };
    if stored.version == incoming.version && same_deletion && same_state {
        Outcome::Stale
    } else {
        Outcome::Conflict
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

#[cfg(test)]
mod tests {
    use super::*;

    fn change(version: i64, state: Option<&str>, action: Action) -> Change {
        Change {
            source: "s".into(),
            kind: "k".into(),
            id: "1".into(),
            version,
            state: state.map(String::from),
            action,
        }
    }

    fn stored(version: i64, deleted: bool, state: Option<&str>) -> StoredRow {
        StoredRow {
            version,
            deleted,
            state: state.map(String::from),
        }
    }

    #[test]
    fn unapplied_changes_are_classified_by_the_documented_tie_rule() {
        use Action::{Delete, Upsert};
        use Outcome::{Conflict, Stale};
        let a = r#"{"status":"paid"}"#;
        let a_pg = r#"{"status": "paid"}"#;
        let b = r#"{"status":"refunded"}"#;
        let cases = [
            (
                "older version",
                stored(5, false, Some(a)),
                change(4, Some(b), Upsert),
                Stale,
            ),
            (
                "equal version, same state",
                stored(5, false, Some(a)),
                change(5, Some(a), Upsert),
                Stale,
            ),
            (
                "equal version, same state in JSONB's spelling",
                stored(5, false, Some(a_pg)),
                change(5, Some(a), Upsert),
                Stale,
            ),
            (
                "equal version, other state",
                stored(5, false, Some(a)),
                change(5, Some(b), Upsert),
                Conflict,
            ),
            (
                "equal version, delete of a live row",
                stored(5, false, Some(a)),
                change(5, None, Delete),
                Conflict,
            ),
            (
                "equal version, delete of a tombstone",
                stored(5, true, Some(a)),
                change(5, None, Delete),
                Stale,
            ),
            (
                "equal version, upsert over a tombstone",
                stored(5, true, Some(a)),
                change(5, Some(a), Upsert),
                Conflict,
            ),
            (
                "older delete",
                stored(5, false, Some(a)),
                change(3, None, Delete),
                Stale,
            ),
            (
                "insert-once, same content",
                stored(0, false, Some(a)),
                change(0, Some(a), Upsert),
                Stale,
            ),
            (
                "insert-once, other content",
                stored(0, false, Some(a)),
                change(0, Some(b), Upsert),
                Conflict,
            ),
        ];
        for (name, s, c, want) in cases {
            assert_eq!(classify_unapplied(&s, &c), want, "{name}");
        }
    }
}

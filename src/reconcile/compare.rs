//! Comparing a page of the sender's listing with the local rows. Pure.
//!
//! The listing is the sender's current state: an item is applied when it is missing
//! here, newer at the sender, or at the same version with a different state (or a local
//! tombstone): the tie rule (`change::tie`) under the reconcile guard. A row newer here
//! was written by a webhook that overtook the listing and is never overwritten — the guarded write in `store` re-checks this in SQL, so a
//! webhook landing between this compare and the write cannot be regressed either.

use std::collections::HashMap;

use crate::bookkeeping::RunCounts;
use crate::change::Change;
use crate::change::tie::{Guard, Relation, relation};
use crate::store::StoredRow;

/// How one listed item relates to the local row: the tie rule's relation.
pub fn verdict(local: Option<&StoredRow>, remote: &Change) -> Relation {
    relation(local.map(StoredRow::view), remote)
}

/// What to do with a compared page.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Indexes of the items to write.
    pub write: Vec<usize>,
    /// Indexes of items versioned by fetch time whose state differs from the local
    /// row's at the same second: which came first is unknown, so they are settled
    /// through `get` once that second has passed (see [`by_fetch_time`]).
    pub ambiguous: Vec<usize>,
}

/// The write guard of a kind's listing: see [`by_fetch_time`].
pub fn guard_for(by_fetch_time: bool) -> Guard {
    if by_fetch_time {
        Guard::NewerOnly
    } else {
        Guard::NewerOrDifferent
    }
}

/// How an item versioned by the response's `Date` (`version_from = "response_date"`)
/// is judged: the same state is never written (a later fetch alone is no change), a
/// later second with another state is, and the same second with another state is
/// ambiguous (the page may have been read just before the event that wrote the local
/// row, or just after).
pub fn by_fetch_time(relation: Relation, same_state: bool) -> (Relation, bool) {
    match relation {
        Relation::NewerIncoming if same_state => (Relation::Equal, false),
        Relation::Differing => (Relation::Differing, true),
        other => (other, false),
    }
}

/// Classifies a page and adds to `counts`: the items to write (what the kind's guard
/// admits) and those to settle through `get`.
pub fn compare_page(
    items: &[Change],
    local: &[StoredRow],
    fetch_time: bool,
    counts: &mut RunCounts,
) -> Verdicts {
    let by_id: HashMap<&str, &StoredRow> = local.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut out = Verdicts::default();
    for (i, item) in items.iter().enumerate() {
        let stored = by_id.get(item.id.as_str()).copied();
        let mut v = verdict(stored, item);
        let mut ambiguous = false;
        if fetch_time {
            let same_state = stored.is_some_and(|s| {
                !s.deleted && item.state.is_some() && crate::change::tie::same_state(s.view(), item)
            });
            (v, ambiguous) = by_fetch_time(v, same_state);
        }
        match v {
            Relation::Missing => counts.missing += 1,
            Relation::NewerIncoming => counts.newer_remote += 1,
            Relation::Differing => counts.differing += 1,
            Relation::NewerStored => counts.newer_local += 1,
            Relation::Equal => counts.equal += 1,
        }
        if ambiguous {
            out.ambiguous.push(i);
        } else if guard_for(fetch_time).admits(v) {
            out.write.push(i);
        }
    }
    counts.scanned += items.len() as i64;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Action;

    fn remote(id: &str, version: i64, state: &str) -> Change {
        Change {
            source: "s".into(),
            account: String::new(),
            kind: "k".into(),
            id: id.into(),
            version,
            state: Some(state.into()),
            action: Action::Upsert,
        }
    }

    fn local(id: &str, version: i64, deleted: bool, state: &str) -> StoredRow {
        StoredRow {
            id: id.into(),
            version,
            deleted,
            state: Some(state.into()),
            digest: None,
        }
    }

    #[test]
    fn each_relation_between_listing_and_local_row_gets_its_verdict() {
        let a = r#"{"s":"a"}"#;
        let b = r#"{"s":"b"}"#;
        let cases: [(&str, Option<StoredRow>, Change, Relation); 7] = [
            ("absent here", None, remote("1", 1, a), Relation::Missing),
            (
                "newer at the sender",
                Some(local("1", 1, false, a)),
                remote("1", 2, a),
                Relation::NewerIncoming,
            ),
            (
                "newer here",
                Some(local("1", 3, false, a)),
                remote("1", 2, b),
                Relation::NewerStored,
            ),
            (
                "equal",
                Some(local("1", 2, false, a)),
                remote("1", 2, a),
                Relation::Equal,
            ),
            (
                "equal, JSONB spelling",
                Some(local("1", 2, false, r#"{"s": "a"}"#)),
                remote("1", 2, a),
                Relation::Equal,
            ),
            (
                "same version, other state",
                Some(local("1", 2, false, a)),
                remote("1", 2, b),
                Relation::Differing,
            ),
            (
                "listed but tombstoned here",
                Some(local("1", 2, true, a)),
                remote("1", 2, a),
                Relation::Differing,
            ),
        ];
        for (name, l, r, want) in cases {
            assert_eq!(verdict(l.as_ref(), &r), want, "{name}");
        }
    }

    #[test]
    fn by_fetch_time_the_same_state_is_never_written_and_the_same_second_is_ambiguous() {
        let a = r#"{"s":"a"}"#;
        let b = r#"{"s":"b"}"#;
        let local_rows = vec![
            local("same", 1_000_000, false, a),
            local("later", 1_000_000, false, a),
            local("tie", 2_000_000, false, a),
            local("older", 3_000_000, false, a),
        ];
        let items = vec![
            remote("same", 5_000_000, a),
            remote("later", 5_000_000, b),
            remote("tie", 2_000_000, b),
            remote("older", 2_000_000, b),
            remote("new", 2_000_000, b),
        ];
        let mut counts = RunCounts::default();
        let v = compare_page(&items, &local_rows, true, &mut counts);
        assert_eq!(
            v.write,
            vec![1, 4],
            "a later second with another state, and a missing row"
        );
        assert_eq!(
            v.ambiguous,
            vec![2],
            "same second, other state: settled through get"
        );
        assert_eq!((counts.equal, counts.newer_local), (1, 1));
    }

    #[test]
    fn a_row_read_with_its_digest_only_compares_by_digest() {
        let a = r#"{"s":"a"}"#;
        let with_digest = |id: &str, state: &str| StoredRow {
            id: id.into(),
            version: 2,
            deleted: false,
            state: None,
            digest: Some(crate::change::state_digest(state)),
        };
        let local_rows = vec![with_digest("same", a), with_digest("other", r#"{"s":"b"}"#)];
        let items = vec![remote("same", 2, a), remote("other", 2, a)];
        let mut counts = RunCounts::default();
        let v = compare_page(&items, &local_rows, false, &mut counts);
        assert_eq!(v.write, vec![1]);
        assert_eq!((counts.equal, counts.differing), (1, 1));
    }

    #[test]
    fn a_page_is_counted_and_only_the_drift_is_written() {
        let items = vec![
            remote("a", 1, "{}"),
            remote("b", 5, "{}"),
            remote("c", 1, "{}"),
            remote("d", 2, "{}"),
        ];
        let local_rows = vec![
            local("b", 4, false, "{}"),
            local("c", 2, false, "{}"),
            local("d", 2, false, "{}"),
        ];
        let mut counts = RunCounts::default();
        let v = compare_page(&items, &local_rows, false, &mut counts);
        assert_eq!(v.write, vec![0, 1]);
        assert_eq!(
            (
                counts.scanned,
                counts.missing,
                counts.newer_remote,
                counts.newer_local,
                counts.equal
            ),
            (4, 1, 1, 1, 1)
        );
    }
}

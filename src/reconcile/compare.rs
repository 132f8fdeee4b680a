//! Comparing a page of the sender's listing with the local rows. Pure.
//!
//! The listing is the sender's current state: an item is applied when it is missing
//! here, newer at the sender, or at the same version with a different state (or a local
//! tombstone): the tie rule (`change::tie`) under the reconcile guard. A row newer here
//! was written by a webhook that overtook the listing and is never overwritten — the guarded write in `store` re-checks this in SQL, so a
//! webhook landing between this compare and the write cannot be regressed either.

use std::collections::HashMap;

use crate::change::Change;
use crate::change::tie::{Guard, Relation, relation};
use crate::db::sql::{RunCounts, StoredRow};

/// How one listed item relates to the local row: the tie rule's relation.
pub fn verdict(local: Option<&StoredRow>, remote: &Change) -> Relation {
    relation(local.map(StoredRow::view), remote)
}

/// Classifies a page; returns the indexes of the items to write (what the reconcile
/// guard admits) and adds to `counts`.
pub fn compare_page(items: &[Change], local: &[StoredRow], counts: &mut RunCounts) -> Vec<usize> {
    let by_id: HashMap<&str, &StoredRow> = local.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut write = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let v = verdict(by_id.get(item.id.as_str()).copied(), item);
        match v {
            Relation::Missing => counts.missing += 1,
            Relation::NewerIncoming => counts.newer_remote += 1,
            Relation::Differing => counts.differing += 1,
            Relation::NewerStored => counts.newer_local += 1,
            Relation::Equal => counts.equal += 1,
        }
        if Guard::NewerOrDifferent.admits(v) {
            write.push(i);
        }
    }
    counts.scanned += items.len() as i64;
    write
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Action;

    fn remote(id: &str, version: i64, state: &str) -> Change {
        Change {
            source: "s".into(),
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
        let write = compare_page(&items, &local_rows, &mut counts);
        assert_eq!(write, vec![0, 1]);
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

//! Comparing a page of the sender's listing with the local rows. Pure.
//!
//! The listing is the sender's current state: an item is applied when it is missing
//! here, newer at the sender, or at the same version with a different state (or a local
//! tombstone). A row newer here was written by a webhook that overtook the listing and
//! is never overwritten — the guarded write in `store` re-checks this in SQL, so a
//! webhook landing between this compare and the write cannot be regressed either.

use std::collections::HashMap;

use crate::change::Change;
use crate::db::sql::{LocalRow, RunCounts};
use crate::store::guard::json_equal;

/// How one listed item relates to the local row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Missing,
    NewerRemote,
    Differing,
    NewerLocal,
    Equal,
}

impl Verdict {
    pub fn needs_write(self) -> bool {
        matches!(
            self,
            Verdict::Missing | Verdict::NewerRemote | Verdict::Differing
        )
    }
}

pub fn verdict(local: Option<&LocalRow>, remote: &Change) -> Verdict {
    let Some(local) = local else {
        return Verdict::Missing;
    };
    if remote.version > local.version {
        return Verdict::NewerRemote;
    }
    if remote.version < local.version {
        return Verdict::NewerLocal;
    }
    let same_state = match (&remote.state, &local.state) {
        (Some(r), Some(l)) => r == l || json_equal(r, l),
        (None, _) => true,
        (Some(_), None) => false,
    };
    if same_state && !local.deleted {
        Verdict::Equal
    } else {
        Verdict::Differing
    }
}

/// Classifies a page; returns the indexes of the items to write and adds to `counts`.
pub fn compare_page(items: &[Change], local: &[LocalRow], counts: &mut RunCounts) -> Vec<usize> {
    let by_id: HashMap<&str, &LocalRow> = local.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut write = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let v = verdict(by_id.get(item.id.as_str()).copied(), item);
        match v {
            Verdict::Missing => counts.missing += 1,
            Verdict::NewerRemote => counts.newer_remote += 1,
            Verdict::Differing => counts.differing += 1,
            Verdict::NewerLocal => counts.newer_local += 1,
            Verdict::Equal => counts.equal += 1,
        }
        if v.needs_write() {
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

    fn local(id: &str, version: i64, deleted: bool, state: &str) -> LocalRow {
        LocalRow {
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
        let cases: [(&str, Option<LocalRow>, Change, Verdict); 7] = [
            ("absent here", None, remote("1", 1, a), Verdict::Missing),
            (
                "newer at the sender",
                Some(local("1", 1, false, a)),
                remote("1", 2, a),
                Verdict::NewerRemote,
            ),
            (
                "newer here",
                Some(local("1", 3, false, a)),
                remote("1", 2, b),
                Verdict::NewerLocal,
            ),
            (
                "equal",
                Some(local("1", 2, false, a)),
                remote("1", 2, a),
                Verdict::Equal,
            ),
            (
                "equal, JSONB spelling",
                Some(local("1", 2, false, r#"{"s": "a"}"#)),
                remote("1", 2, a),
                Verdict::Equal,
            ),
            (
                "same version, other state",
                Some(local("1", 2, false, a)),
                remote("1", 2, b),
                Verdict::Differing,
            ),
            (
                "listed but tombstoned here",
                Some(local("1", 2, true, a)),
                remote("1", 2, a),
                Verdict::Differing,
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

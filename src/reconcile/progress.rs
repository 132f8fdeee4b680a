//! The guard that stops a sweep whose sender makes no progress.

use std::collections::HashSet;
use std::hash::BuildHasher;

use super::RunError;
use crate::sender::Next;

/// Stops a sweep whose sender makes no progress: a next position (cursor, URL,
/// `starting_after`) already visited in this run, or a page listing exactly the ids of
/// the page before. Without it a stuck cursor would loop for ever, renewing the lease.
pub(super) struct ProgressGuard {
    /// Every position of this run, encoded; one short string a page.
    visited: HashSet<String>,
    /// A hash of the previous page's ids.
    previous_ids: Option<u64>,
    hasher: std::collections::hash_map::RandomState,
}

impl ProgressGuard {
    pub(super) fn new(start: Option<&Next>) -> Self {
        let mut visited = HashSet::new();
        if let Some(at) = start {
            visited.insert(at.encode());
        }
        Self {
            visited,
            previous_ids: None,
            hasher: Default::default(),
        }
    }

    /// Records the page fetched from `url` and refuses a `next` already visited.
    pub(super) fn visit(&mut self, url: &str, next: Option<&Next>) -> Result<(), RunError> {
        // A page's own URL is a position too, so a self-referencing Link is caught.
        self.visited.insert(Next::Url(url.to_string()).encode());
        match next {
            Some(n) if !self.visited.insert(n.encode()) => Err(RunError::NoProgress {
                at: describe(n),
                why: "the sender sent a next position this run has already visited",
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a page that lists exactly the ids of the page before.
    pub(super) fn same_items_as_before<'a>(
        &mut self,
        url: &str,
        ids: impl Iterator<Item = &'a str>,
    ) -> Result<(), RunError> {
        let ids: Vec<&str> = ids.collect();
        if ids.is_empty() {
            self.previous_ids = None;
            return Ok(());
        }
        let hash = self.hasher.hash_one(&ids);
        if self.previous_ids.replace(hash) == Some(hash) {
            return Err(RunError::NoProgress {
                at: url.to_string(),
                why: "the page repeats the previous page's items",
            });
        }
        Ok(())
    }
}

fn describe(n: &Next) -> String {
    match n {
        Next::Cursor(c) => format!("cursor {c:?}"),
        Next::Url(u) => u.clone(),
        Next::StartingAfter(id) => format!("starting_after {id:?}"),
    }
}

//! Deletion detection: after a complete full sweep, the live rows the listing no longer
//! has — and that nothing wrote since the sweep began — are gone at the sender.

use std::collections::HashSet;
use std::hash::BuildHasher;

use super::{Reconciler, RunError};
use crate::config::{KindConfig, SourceConfig};
use crate::db::DbTime;

/// Ids per page of the local scan.
const DELETE_SCAN_PAGE: i64 = 1000;

/// The ids seen by a sweep, as 64-bit hashes: 8 bytes an item whatever the id's length.
/// A collision can only make a deleted row look seen, which keeps it (the safe side).
#[derive(Default)]
pub(super) struct SeenIds {
    hashes: HashSet<u64>,
    state: std::collections::hash_map::RandomState,
}

impl SeenIds {
    fn hash(&self, id: &str) -> u64 {
        self.state.hash_one(id)
    }

    pub fn insert(&mut self, id: &str) {
        let h = self.hash(id);
        self.hashes.insert(h);
    }

    pub fn contains(&self, id: &str) -> bool {
        self.hashes.contains(&self.hash(id))
    }
}

impl Reconciler {
    /// Tombstones the live rows of the kind not in `seen` and not written since
    /// `sweep_started`; returns how many.
    pub(super) async fn detect_deletes(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        seen: &SeenIds,
        sweep_started: DbTime,
    ) -> Result<usize, RunError> {
        let (s, k) = (&source.name, &kind.name);
        let mut after = String::new();
        let mut total = 0;
        loop {
            let ids = self
                .store
                .live_ids_before(s, k, sweep_started, after, DELETE_SCAN_PAGE)
                .await?;
            let Some(last) = ids.last().cloned() else {
                break;
            };
            let gone: Vec<String> = ids.into_iter().filter(|id| !seen.contains(id)).collect();
            if !gone.is_empty() {
                total += self.store.tombstone(s, k, gone, sweep_started).await?;
            }
            after = last;
        }
        Ok(total)
    }
}

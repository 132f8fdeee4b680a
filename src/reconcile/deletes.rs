//! Deletion detection: after a complete full sweep, the live rows the listing no longer
//! has — and that nothing wrote since the sweep began — are gone at the sender.

use std::hash::BuildHasher;

use super::sweep::{DRY_RUN_EXAMPLES, Run};
use super::{Reconciler, RunError};
use crate::config::{KindConfig, SourceConfig};
use crate::db::DbTime;

/// Ids per page of the local scan.
const DELETE_SCAN_PAGE: i64 = 1000;

/// The ids seen by a sweep, as 64-bit hashes: 8 bytes an item whatever the id's length,
/// in a vector sorted once the sweep is complete (a hash set costs twice that, and
/// three times while it grows). A collision can only make a deleted row look seen,
/// which keeps it (the safe side).
#[derive(Default)]
pub(super) struct SeenIds {
    hashes: Vec<u64>,
    sorted: bool,
    state: std::collections::hash_map::RandomState,
}

impl SeenIds {
    fn hash(&self, id: &str) -> u64 {
        self.state.hash_one(id)
    }

    pub fn insert(&mut self, id: &str) {
        let h = self.hash(id);
        self.hashes.push(h);
        self.sorted = false;
    }

    /// Sorts the hashes for [`Self::contains`]; called once, after the sweep.
    pub fn seal(&mut self) {
        self.hashes.sort_unstable();
        self.hashes.dedup();
        self.hashes.shrink_to_fit();
        self.sorted = true;
    }

    pub fn contains(&self, id: &str) -> bool {
        debug_assert!(self.sorted, "SeenIds::seal before contains");
        self.hashes.binary_search(&self.hash(id)).is_ok()
    }
}

impl Reconciler {
    /// After a complete full sweep: finds the live rows of the kind not in `seen` and
    /// not written since `sweep_started`, and tombstones them — unless they are more
    /// than the kind's `max_delete_fraction` of its live rows (a listing that suddenly
    /// lacks items is more likely broken than emptied), which fails the run and
    /// tombstones nothing unless `--allow-mass-delete` was given. A dry run counts them
    /// and lists the first few.
    pub(super) async fn detect_deletes(
        &self,
        run: &mut Run<'_>,
        seen: &SeenIds,
        sweep_started: DbTime,
        dry_run: bool,
    ) -> Result<(), RunError> {
        let (source, kind) = (run.source, run.kind);
        // First pass: count, without writing anything.
        let mut gone = 0usize;
        let mut scan = LiveScan::default();
        while let Some(ids) = scan.next(self, source, kind, sweep_started).await? {
            for id in ids.iter().filter(|id| !seen.contains(id)) {
                gone += 1;
                if dry_run && run.report.would_tombstone.len() < DRY_RUN_EXAMPLES {
                    run.report.would_tombstone.push(id.clone());
                }
            }
        }
        if dry_run || gone == 0 {
            run.report.counts.tombstoned = gone as i64;
            return Ok(());
        }
        let live = self.store.count_live(&source.name, &kind.name).await? as usize;
        let fraction = kind.max_delete_fraction;
        if gone as f64 > fraction * live as f64 && !run.opts.allow_mass_delete {
            return Err(RunError::MassDelete {
                sender: source.name.clone(),
                kind: kind.name.clone(),
                would: gone,
                live,
                fraction,
            });
        }
        // Second pass: tombstone. A row written since the sweep began is skipped by the
        // statement itself, so a webhook landing between the passes is safe; tombstoned
        // rows leave the scan (it reads live rows) without moving its keyset position.
        let fence = self
            .book
            .fence(&source.name, &kind.name, source.reconcile.lease_ttl);
        let mut total = 0;
        let mut scan = LiveScan::default();
        while let Some(ids) = scan.next(self, source, kind, sweep_started).await? {
            let unseen: Vec<String> = ids.into_iter().filter(|id| !seen.contains(id)).collect();
            if !unseen.is_empty() {
                total += self
                    .store
                    .tombstone(
                        &source.name,
                        &kind.name,
                        unseen,
                        sweep_started,
                        fence.clone(),
                    )
                    .await??;
            }
        }
        run.report.counts.tombstoned = total as i64;
        Ok(())
    }
}

/// A keyset scan over a kind's live rows last written before the sweep began, a page of
/// ids at a time.
#[derive(Default)]
struct LiveScan {
    after: String,
    done: bool,
}

impl LiveScan {
    async fn next(
        &mut self,
        r: &Reconciler,
        source: &SourceConfig,
        kind: &KindConfig,
        sweep_started: DbTime,
    ) -> Result<Option<Vec<String>>, RunError> {
        if self.done {
            return Ok(None);
        }
        let ids = r
            .store
            .live_ids_before(
                &source.name,
                &kind.name,
                sweep_started,
                self.after.clone(),
                DELETE_SCAN_PAGE,
            )
            .await?;
        match ids.last() {
            Some(last) => self.after = last.clone(),
            None => self.done = true,
        }
        Ok((!ids.is_empty()).then_some(ids))
    }
}

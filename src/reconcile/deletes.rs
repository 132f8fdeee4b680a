//! Deletion detection: after a complete full sweep, the live rows the listing no longer
//! has — and that nothing wrote since the sweep began — are gone at the sender.

use std::hash::BuildHasher;

use tokio_util::task::AbortOnDropHandle;

use super::run::{DRY_RUN_EXAMPLES, Run};
use super::{Reconciler, RunError};
use crate::change::Key;
use crate::db::DbTime;

/// Ids per page of the local scan (~300 KB): a tenth of the round trips of 1,000. Most
/// of the scan's time is the index and heap reads themselves.
const DELETE_SCAN_PAGE: i64 = 10_000;

/// Up to this many seen ids are kept exactly (8 bytes each: 8 MiB at most); past it,
/// [`SeenIds`] becomes a Bloom filter. Both live at once while it switches: at 2M
/// (16 MiB) a sweep of 10M items peaked at 68 MiB, over the 64 MiB the daemon is sized
/// for; at 1M (8 MiB) it peaked at 68.2 MiB again on 2026-12-04, so a kind whose last
/// full sweep listed more starts with the filter ([`SeenIds::for_kind_of`]).
const EXACT_UP_TO: usize = 1_000_000;
/// The Bloom filter's false-positive rate: the share of deleted rows a sweep keeps.
const BLOOM_FP_RATE: f64 = 0.001;

/// The ids seen by a sweep that deletion detection asks about: the listed ids of rows
/// that were live locally (a row the sweep itself wrote is never a candidate, so a first
/// sync records nothing). Kept as 64-bit hashes, sorted once the sweep is complete
/// (8 bytes an item whatever the id's length; a hash set costs twice that) up to
/// [`EXACT_UP_TO`]; a larger kind keeps them in a Bloom filter (~1.8 bytes an item at
/// 0.1%), from the start when its last full sweep listed more, so a sweep of 10M rows
/// stays within tens of MiB. Both can only err on one side: a collision or a false
/// positive makes a deleted row look seen, which keeps it for one more sweep (the hash
/// seed is new each sweep), never tombstones a live one.
#[derive(Default)]
pub(super) struct SeenIds {
    state: foldhash::quality::RandomState,
    exact: Vec<u64>,
    sorted: bool,
    /// Once sealed: where each bucket of the exact hashes (by their top bits) starts, a
    /// bucket holding ~8 hashes (one cache line). A lookup reads its bucket instead of
    /// binary-searching up to 8 MiB: a deletion scan asks about every live row, and at
    /// 1M rows the binary search's 20 dependent cache misses a lookup were an eighth of
    /// the sweep's CPU.
    buckets: Vec<u32>,
    bucket_bits: u32,
    bloom: Option<bloomfilter::Bloom<u64>>,
}

impl SeenIds {
    /// The set for a sweep of a kind whose last complete full sweep listed
    /// `last_listed` items: a Bloom filter from the start when that was more than the
    /// exact set holds (no exact set to fill and then hold beside the filter while it
    /// switches), exact otherwise. A kind that grew past its filter's size only keeps a
    /// few more deleted rows for one more sweep.
    pub fn for_kind_of(last_listed: Option<i64>) -> Self {
        let mut seen = Self::default();
        if let Some(n) = last_listed.and_then(|n| usize::try_from(n).ok()) {
            if n > EXACT_UP_TO {
                seen.switch_to_bloom(n);
            }
        }
        seen
    }

    fn hash(&self, id: &str) -> u64 {
        self.state.hash_one(id)
    }

    pub fn insert(&mut self, id: &str) {
        let h = self.hash(id);
        match &mut self.bloom {
            Some(bloom) => bloom.set(&h),
            None => {
                self.exact.push(h);
                self.sorted = false;
            }
        }
    }

    /// Whether the exact set is full and should become a Bloom filter: the caller then
    /// counts the kind's live rows and calls [`Self::switch_to_bloom`].
    pub fn wants_bloom(&self) -> bool {
        self.bloom.is_none() && self.exact.len() >= EXACT_UP_TO
    }

    /// Moves the hashes into a Bloom filter sized for `live` rows (with room for rows
    /// that arrive during the sweep). Stays exact if no filter can be made.
    pub fn switch_to_bloom(&mut self, live: usize) {
        // A sixteenth of room: past `expected` the false-positive rate rises gently
        // (0.19% at a tenth more), and a quarter cost 3.4 MiB at 10M rows, which put a
        // 10M sweep's peak at 64.3 MiB.
        let expected = live.max(2 * EXACT_UP_TO) + live / 16;
        let Ok(mut bloom) = bloomfilter::Bloom::new_for_fp_rate(expected, BLOOM_FP_RATE) else {
            return;
        };
        for h in self.exact.drain(..) {
            bloom.set(&h);
        }
        self.exact = Vec::new();
        self.bloom = Some(bloom);
    }

    /// Sorts the exact hashes for [`Self::contains`]; called once, after the sweep.
    pub fn seal(&mut self) {
        self.exact.sort_unstable();
        self.exact.dedup();
        self.exact.shrink_to_fit();
        self.bucket_bits = (self.exact.len() / 8)
            .max(1)
            .next_power_of_two()
            .trailing_zeros();
        let count = 1usize << self.bucket_bits;
        let mut buckets = Vec::with_capacity(count + 1);
        let mut at = 0;
        for b in 0..count {
            while at < self.exact.len() && self.bucket(self.exact[at]) < b {
                at += 1;
            }
            buckets.push(u32::try_from(at).unwrap_or(u32::MAX));
        }
        buckets.push(u32::try_from(self.exact.len()).unwrap_or(u32::MAX));
        self.buckets = buckets;
        self.sorted = true;
    }

    fn bucket(&self, h: u64) -> usize {
        // The top `bucket_bits` bits; none (one bucket) when there are none.
        usize::try_from(h.checked_shr(64 - self.bucket_bits).unwrap_or(0)).unwrap_or(0)
    }

    pub fn contains(&self, id: &str) -> bool {
        let h = self.hash(id);
        match &self.bloom {
            Some(bloom) => bloom.check(&h),
            None => {
                debug_assert!(self.sorted, "SeenIds::seal before contains");
                let b = self.bucket(h);
                match (self.buckets.get(b), self.buckets.get(b + 1)) {
                    (Some(&from), Some(&to)) => self
                        .exact
                        .get(from as usize..to as usize)
                        .is_some_and(|bucket| bucket.contains(&h)),
                    // Not sealed: the hashes as they are.
                    _ => self.exact.contains(&h),
                }
            }
        }
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
        let mut scan = LiveScan::start(self, run.key(), sweep_started);
        while let Some(ids) = scan.next().await? {
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
        let live = self.store.count_live(&run.key()).await? as usize;
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
        let fence = self.book.fence(&run.key(), source.reconcile.lease_ttl);
        let mut total = 0;
        let mut scan = LiveScan::start(self, run.key(), sweep_started);
        while let Some(ids) = scan.next().await? {
            let unseen: Vec<String> = ids.into_iter().filter(|id| !seen.contains(id)).collect();
            if !unseen.is_empty() {
                total += self
                    .store
                    .tombstone(&run.key(), unseen, sweep_started, fence.clone())
                    .await??;
            }
        }
        run.report.counts.tombstoned = total as i64;
        Ok(())
    }
}

/// A keyset scan over a kind's live rows last written before the sweep began, a page of
/// ids at a time. The next page is read while the caller checks this one: the scan runs
/// after the sweep, on the run's path, and the database's read of a page (~5 ms for
/// 10,000 ids) then hides the lookups and the decoding of the page before.
struct LiveScan {
    store: crate::store::Store,
    key: Key,
    sweep_started: DbTime,
    /// The read of the next page; `None` once a short page ended the scan.
    next: Option<AbortOnDropHandle<Result<Vec<String>, crate::db::DbError>>>,
}

impl LiveScan {
    fn start(r: &Reconciler, key: Key, sweep_started: DbTime) -> Self {
        let mut scan = LiveScan {
            store: r.store.clone(),
            key,
            sweep_started,
            next: None,
        };
        scan.read_after(String::new());
        scan
    }

    fn read_after(&mut self, after: String) {
        let (store, key, before) = (self.store.clone(), self.key.clone(), self.sweep_started);
        self.next = Some(AbortOnDropHandle::new(tokio::spawn(async move {
            store
                .live_ids_before(&key, before, after, DELETE_SCAN_PAGE)
                .await
        })));
    }

    async fn next(&mut self) -> Result<Option<Vec<String>>, RunError> {
        let Some(read) = self.next.take() else {
            return Ok(None);
        };
        let ids = read
            .await
            .map_err(|e| RunError::from(crate::db::DbError::Task(e.to_string())))??;
        // Rows this page's caller tombstones are at or before its last id, so the next
        // page, read from after it, is the same whether or not they are written yet.
        if let Some(last) = ids.last().filter(|_| ids.len() as i64 == DELETE_SCAN_PAGE) {
            self.read_after(last.clone());
        }
        Ok((!ids.is_empty()).then_some(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_set_finds_every_seen_id_and_no_other_at_any_size() {
        for n in [0, 1, 2, 7, 9, 1000, 100_000] {
            let mut seen = SeenIds::default();
            for i in 0..n {
                seen.insert(&format!("id-{i}"));
            }
            seen.seal();
            assert!((0..n).all(|i| seen.contains(&format!("id-{i}"))), "{n}");
            let others = (n..n + 10_000)
                .filter(|i| seen.contains(&format!("id-{i}")))
                .count();
            assert_eq!(others, 0, "{n}");
        }
    }

    #[test]
    fn a_kind_listed_past_the_exact_bound_starts_with_the_filter_and_misses_no_seen_id() {
        for last in [
            None,
            Some(-1),
            Some(0),
            Some(1000),
            Some(EXACT_UP_TO as i64),
        ] {
            assert!(SeenIds::for_kind_of(last).bloom.is_none(), "{last:?}");
        }
        let mut seen = SeenIds::for_kind_of(Some(EXACT_UP_TO as i64 + 1));
        assert!(seen.bloom.is_some());
        assert!(seen.exact.capacity() == 0 && !seen.wants_bloom());
        for i in 0..5000 {
            seen.insert(&format!("id-{i}"));
        }
        seen.seal();
        assert!(seen.exact.is_empty());
        assert!((0..5000).all(|i| seen.contains(&format!("id-{i}"))));
    }

    #[test]
    fn exact_and_bloom_never_miss_a_seen_id() {
        let mut seen = SeenIds::default();
        for i in 0..1000 {
            seen.insert(&format!("id-{i}"));
        }
        seen.seal();
        assert!((0..1000).all(|i| seen.contains(&format!("id-{i}"))));
        assert!((1000..2000).all(|i| !seen.contains(&format!("id-{i}"))));
        seen.switch_to_bloom(10_000);
        for i in 1000..5000 {
            seen.insert(&format!("id-{i}"));
        }
        assert!((0..5000).all(|i| seen.contains(&format!("id-{i}"))));
        let false_positives = (5000..105_000)
            .filter(|i| seen.contains(&format!("id-{i}")))
            .count();
        assert!(false_positives < 1000, "{false_positives} of 100000");
    }
}

//! A run's sweep (the lease and the run record around it are `run`'s): page through the
//! listing; per page one bulk read of the local rows, the pure compare, and one
//! transaction that writes what differs together with the page's bookkeeping.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::task::AbortOnDropHandle;

use super::deletes::SeenIds;
use super::plan::Plan;
use super::progress::ProgressGuard;
use super::run::{DRY_RUN_EXAMPLES, Run};
use super::stages::{ReadItem, fetch_pages, read_page};
use super::write_order::{InFlight, Record, WriteOrder};
use super::{Mode, Reconciler, RunCounts, RunError, compare};
use crate::bookkeeping::RunId;
use crate::change::Change;
use crate::config::Listing;
use crate::db::ErrorClass;
use crate::store::StoredRow;

impl Reconciler {
    /// Pages through the listing as planned; `run_id` is `None` for a dry run (which
    /// writes nothing, not even its run).
    pub(super) async fn sweep(
        &self,
        run: &mut Run<'_>,
        plan: Plan,
        run_id: Option<RunId>,
    ) -> Result<(), RunError> {
        let (source, kind) = (run.source, run.kind);
        let sender = self.sender_for(&source.name, run.account).await?;
        let Plan {
            mode,
            mut at,
            sweep_started,
            resumed,
            since,
        } = plan;
        run.report.resumed = resumed;
        run.report.mode = mode;
        let mut pages = match kind.listing {
            Listing::Resources => {
                let detect = kind.detect_deletes && mode == Mode::Full && !resumed;
                let seen = if detect {
                    SeenIds::for_kind_of(self.book.last_full_sweep_size(&run.key()).await?)
                } else {
                    SeenIds::default()
                };
                Pages::Resources(Box::new(ResourcePages {
                    detect,
                    seen,
                    unreadable_ids: false,
                }))
            }
            Listing::Events => Pages::Events,
        };
        let mut watermark: Option<i64> = None;
        let filter: Option<(String, String)> = match (&kind.incremental, since) {
            (Some(inc), Some(since)) => Some((inc.param.clone(), since)),
            _ => None,
        };
        // Three stages joined by channels of one page: the fetcher pages through the
        // listing (the sender's latency and the page's JSON; the next request needs
        // this page's cursor, so one at a time), the reader starts each page's read on
        // its own task (its items into changes, then its local rows: our parsing and
        // the database's read, which for consecutive pages run side by side on their
        // own connections), and this loop awaits the reads in page order, compares and
        // starts each page's write, finishing the previous page's meanwhile (`page`).
        // At most three reads and two writes run at once; six pages are in memory, and
        // the drift of the page being written. A read taken before an earlier page's
        // commit may miss that commit; the guarded write re-checks in SQL, so the
        // compare can only propose, never regress.
        let (pages_tx, mut pages_rx) = tokio::sync::mpsc::channel(1);
        let _fetcher = AbortOnDropHandle::new(tokio::spawn(fetch_pages(
            sender.clone(),
            kind.clone(),
            filter,
            at.clone(),
            pages_tx,
        )));
        let (read_tx, mut read_rx) = tokio::sync::mpsc::channel(1);
        let ranges = Arc::new(crate::store::RangeReads::default());
        let _reader = {
            let (store, key, kind) = (self.store.clone(), run.key(), kind.clone());
            let ranges = ranges.clone();
            AbortOnDropHandle::new(tokio::spawn(async move {
                while let Some(fetched) = pages_rx.recv().await {
                    let failed = fetched.is_err();
                    let (store, key, kind) = (store.clone(), key.clone(), kind.clone());
                    let ranges = ranges.clone();
                    // Dropped with the channel when the run stops: the read is aborted.
                    let read = AbortOnDropHandle::new(tokio::spawn(async move {
                        read_page(&store, &key, &kind, fetched?, ranges).await
                    }));
                    if read_tx.send(read).await.is_err() || failed {
                        break;
                    }
                }
            }))
        };
        let mut guard = ProgressGuard::new(at.as_ref());
        // Where a full sweep resumes: after the last page committed together with every
        // page before it (at first, where this run started).
        let mut writes = Writes {
            in_flight: None,
            order: WriteOrder::new(
                at.as_ref()
                    .filter(|_| mode == Mode::Full)
                    .map(|n| (n.encode(), sweep_started)),
            ),
        };
        let listed: Result<(), RunError> = async {
            loop {
                if run.cancel.is_cancelled() {
                    return Err(RunError::Stopped {
                        pages: run.report.counts.pages,
                    });
                }
                let waiting = Instant::now();
                let Some(read) = read_rx.recv().await else {
                    break;
                };
                let read = read.await.map_err(|e| RunError::FetchTask(e.to_string()))?;
                let (page, read, local, (read_items, local_read)) = read?;
                let stages = &mut run.report.stages;
                stages.writer_waiting += waiting.elapsed().as_secs_f64();
                stages.fetch += page.fetch_seconds;
                stages.parse_page += page.parse_seconds;
                stages.read_items += read_items;
                stages.local_read += local_read;
                at = page.next.clone();
                match &mut pages {
                    Pages::Events => {
                        self.events_page(run, &mut guard, page, run_id, &mut watermark)
                            .await?
                    }
                    Pages::Resources(r) => {
                        // Only full sweeps are worth resuming; an incremental run restarts
                        // from its watermark.
                        let resume_at = at
                            .as_ref()
                            .filter(|_| mode == Mode::Full)
                            .map(|n| (n.encode(), sweep_started));
                        let mark = PageAt {
                            url: &page.url,
                            run_id,
                            resume_at,
                        };
                        self.resources_page(
                            run,
                            &mut guard,
                            r,
                            mark,
                            (read, local),
                            &mut watermark,
                            &mut writes,
                        )
                        .await?
                    }
                }
                (run.progress)(&run.report.counts);
                if at.is_none() {
                    break;
                }
            }
            Ok(())
        }
        .await;
        // A page still being written is finished before the run goes on (its commit
        // must not land after the run's end is recorded); a run that ends early saves
        // the resume point its committed pages reached.
        let drained = self.drain_writes(run, &mut writes).await;
        run.report.stages.local_read_ranges = ranges.read();
        if listed.is_err() || drained.is_err() {
            self.record_resume_point(run, &writes, run_id).await;
        }
        listed?;
        drained?;
        if let Pages::Resources(r) = pages {
            self.after_complete_listing(run, r, sweep_started, run_id)
                .await?;
        }
        if run_id.is_some() && kind.incremental.is_some() {
            let full_started = (mode == Mode::Full).then_some(sweep_started);
            self.book
                .advance_watermark(&run.key(), watermark, full_started)
                .await?;
        }
        if run.report.counts.skipped > 0 {
            return Err(RunError::SkippedItems {
                count: run.report.counts.skipped,
                first: run.report.skipped.first().cloned().unwrap_or_default(),
            });
        }
        Ok(())
    }

    /// A page of resources, read into changes by the reader stage: unreadable items
    /// reported and skipped (one bad item must not wedge the kind), the rest compared
    /// and the drift written with the page's bookkeeping.
    #[expect(
        clippy::too_many_arguments,
        reason = "a page's parts, each borrowed from the run for the page's time"
    )]
    async fn resources_page(
        &self,
        run: &mut Run<'_>,
        guard: &mut ProgressGuard,
        pages: &mut ResourcePages,
        at: PageAt<'_>,
        (read, local): (Vec<ReadItem>, Vec<StoredRow>),
        watermark: &mut Option<i64>,
        writes: &mut Writes,
    ) -> Result<(), RunError> {
        let mut indexes = Vec::with_capacity(read.len());
        let mut changes = Vec::with_capacity(read.len());
        for item in read {
            match item {
                ReadItem::Read {
                    index,
                    change,
                    modified,
                } => {
                    if let Some(t) = modified {
                        *watermark = Some(watermark.map_or(t, |w| w.max(t)));
                    }
                    indexes.push(index);
                    changes.push(change);
                }
                ReadItem::Unreadable { index, id, reason } => {
                    // A skipped item still counts as listed for deletion detection; one
                    // without a readable id could be any row, so this sweep then
                    // detects no deletions.
                    match &id {
                        Some(id) => pages.seen.insert(id),
                        None => pages.unreadable_ids = true,
                    }
                    run.skip(at.url, index, id.as_deref(), &reason);
                }
                ReadItem::Excluded => {}
            }
        }
        guard.same_items_as_before(at.url, changes.iter().map(|c| c.id.as_str()))?;
        if pages.detect {
            // Only rows live before this read can be tombstoned; the local read is of
            // exactly this page's ids.
            for row in local.iter().filter(|r| !r.deleted) {
                pages.seen.insert(&row.id);
            }
            if pages.seen.wants_bloom() {
                let live = self.store.count_live(&run.key()).await?;
                pages
                    .seen
                    .switch_to_bloom(usize::try_from(live).unwrap_or(usize::MAX));
            }
        }
        self.page(run, at, indexes, changes, local, writes).await
    }

    /// After the last page of a resource listing: deletion detection, if this sweep
    /// may detect deletions.
    async fn after_complete_listing(
        &self,
        run: &mut Run<'_>,
        mut pages: Box<ResourcePages>,
        sweep_started: crate::db::DbTime,
        run_id: Option<RunId>,
    ) -> Result<(), RunError> {
        if !pages.detect {
            return Ok(());
        }
        if pages.unreadable_ids {
            tracing::warn!(
                source = run.source.name,
                kind = run.kind.name,
                "deletion detection skipped: an item without a readable id was listed"
            );
            return Ok(());
        }
        pages.seen.seal();
        self.detect_deletes(run, &pages.seen, sweep_started, run_id.is_none())
            .await
    }

    /// One page: compare the listed changes with the local rows and (unless a dry run)
    /// start the transaction that commits the drift with the page's bookkeeping, then
    /// finish the previous page's. Two pages' transactions are in flight at most: the
    /// database works on one page's commit while the next page's rows are written,
    /// instead of the run waiting for each commit in turn.
    async fn page(
        &self,
        run: &mut Run<'_>,
        at: PageAt<'_>,
        indexes: Vec<usize>,
        changes: Vec<Change>,
        local: Vec<StoredRow>,
        writes: &mut Writes,
    ) -> Result<(), RunError> {
        let PageAt {
            url,
            run_id,
            resume_at,
        } = at;
        let fetch_time = run.kind.by_fetch_time();
        let started = Instant::now();
        // Counted as compared; `applied` once the write is committed.
        let compare::Verdicts { write, ambiguous } =
            compare::compare_page(&changes, &local, fetch_time, &mut run.report.counts);
        run.report.stages.compare += started.elapsed().as_secs_f64();
        let guard = compare::guard_for(fetch_time);
        run.report.counts.pages += 1;
        let ambiguous: Vec<String> = ambiguous.iter().map(|i| changes[*i].id.clone()).collect();
        let Some(run_id) = run_id else {
            run.report.counts.applied += write.len() as i64;
            for i in write {
                if run.report.would_change.len() < DRY_RUN_EXAMPLES {
                    run.report.would_change.push(changes[i].id.clone());
                }
            }
            return Ok(());
        };
        let in_flight = writes.in_flight.as_ref().map(|w| InFlight {
            finished: w.write.is_finished(),
            has_position: w.resume_at.is_some(),
        });
        if WriteOrder::finish_first(in_flight, &resume_at) {
            self.drain_writes(run, writes).await?;
        }
        let mut changes = changes;
        // The drift, moved out of the page (highest index first, so each swap_remove
        // leaves the lower indexes in place).
        let (batch_indexes, batch): (Vec<usize>, Vec<Change>) = write
            .into_iter()
            .rev()
            .map(|i| (indexes[i], changes.swap_remove(i)))
            .unzip();
        let batch: Arc<[Change]> = batch.into();
        // With a page in flight, this page's counts lack its applied rows (the run's
        // end records all).
        let mark = match writes.order.record(writes.in_flight.is_some(), &resume_at) {
            Record::At(at) => self.page_mark(run, run_id, at, run.report.counts),
            Record::Keep => self
                .page_mark(run, run_id, None, run.report.counts)
                .keeping_checkpoint(),
        };
        let (store, pending_batch) = (self.store.clone(), batch.clone());
        let write = AbortOnDropHandle::new(tokio::spawn(async move {
            let started = Instant::now();
            let applied = store.apply_page(pending_batch, guard, mark).await;
            (applied, started.elapsed().as_secs_f64())
        }));
        let previous = writes.in_flight.replace(PendingWrite {
            url: url.to_string(),
            run_id,
            guard,
            resume_at,
            batch_indexes,
            batch,
            ambiguous,
            write,
        });
        if let Some(previous) = previous {
            self.finish_write(run, writes, previous).await?;
        }
        Ok(())
    }

    /// The bookkeeping a page's transaction records, fenced on the run's lease.
    fn page_mark(
        &self,
        run: &Run<'_>,
        run_id: RunId,
        resume_at: Option<(String, crate::db::DbTime)>,
        counts: RunCounts,
    ) -> crate::bookkeeping::PageMark {
        let fence = self.book.fence(&run.key(), run.source.reconcile.lease_ttl);
        self.book.page_mark(run_id, fence, resume_at, counts)
    }

    /// Waits for the page still being written, if any.
    async fn drain_writes(&self, run: &mut Run<'_>, writes: &mut Writes) -> Result<(), RunError> {
        match writes.in_flight.take() {
            Some(pending) => self.finish_write(run, writes, pending).await,
            None => Ok(()),
        }
    }

    /// A page's write, awaited: its rows counted, its ambiguous items settled and its
    /// position the resume point. After a page failed, later pages' commits still count
    /// but no longer move the resume point (the failed page's drift is not written).
    async fn finish_write(
        &self,
        run: &mut Run<'_>,
        writes: &mut Writes,
        mut pending: PendingWrite,
    ) -> Result<(), RunError> {
        let (applied, seconds) = (&mut pending.write)
            .await
            .map_err(|e| RunError::FetchTask(e.to_string()))?;
        run.report.stages.write += seconds;
        let written = match applied {
            Ok(Ok(written)) => {
                run.report.counts.applied += written as i64;
                Ok(())
            }
            Ok(Err(lost)) => Err(lost.into()),
            Err(e) if e.class() == ErrorClass::Data => {
                let key = run.key();
                tracing::warn!(source = key.source, kind = key.kind, url = pending.url, error = %e, "the database refused an item of this page; writing its items one by one to find it");
                self.write_one_by_one(run, writes, &pending).await
            }
            Err(e) => Err(e.into()),
        };
        if let Err(e) = written {
            writes.order.failed();
            return Err(e);
        }
        writes.order.committed(pending.resume_at.clone());
        self.settle_ambiguous(run, &pending.ambiguous).await;
        Ok(())
    }

    /// A page's drift written item by item: an item the database refuses is reported
    /// and skipped, the others are written, and the page's position is recorded with
    /// the last write (until then, the position before the page).
    async fn write_one_by_one(
        &self,
        run: &mut Run<'_>,
        writes: &Writes,
        pending: &PendingWrite,
    ) -> Result<(), RunError> {
        let (before, after) = writes.order.one_by_one(&pending.resume_at);
        for (index, change) in pending.batch_indexes.iter().zip(pending.batch.iter()) {
            let one: Arc<[Change]> = Arc::new([change.clone()]);
            let mark = self.page_mark(run, pending.run_id, before.clone(), run.report.counts);
            match self.store.apply_page(one, pending.guard, mark).await {
                Ok(written) => run.report.counts.applied += written? as i64,
                Err(e) if e.class() == ErrorClass::Data => {
                    run.skip(
                        &pending.url,
                        *index,
                        Some(&change.id),
                        &format!("the database refused it: {e}"),
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mark = self.page_mark(run, pending.run_id, after, run.report.counts);
        self.store
            .apply_page(Arc::new([]), pending.guard, mark)
            .await??;
        Ok(())
    }

    /// After a run that ended early: the resume point its committed pages reached,
    /// recorded (a page's own commit may have recorded an earlier one). Best effort:
    /// the database may be what failed, and a lost lease is not ours to write.
    async fn record_resume_point(&self, run: &Run<'_>, writes: &Writes, run_id: Option<RunId>) {
        let (Some(run_id), Some(at)) = (run_id, writes.order.committed_at()) else {
            return;
        };
        let mark = self.page_mark(run, run_id, Some(at), run.report.counts);
        let guard = compare::guard_for(run.kind.by_fetch_time());
        if let Err(e) = self.store.apply_page(Arc::new([]), guard, mark).await {
            tracing::debug!(error = %e, "could not record the resume point of a run that ended early");
        }
    }

    /// Records the page's ambiguous items (same second, other state) as pending
    /// fetches: settled through `get` once the sender's clock has moved on, by this
    /// process's fetcher or any replica's (or the one-shot command's, after its runs).
    async fn settle_ambiguous(&self, run: &mut Run<'_>, ids: &[String]) {
        if ids.is_empty() || run.kind.get.is_none() {
            return;
        }
        let key = run.key();
        let keys = ids.iter().map(|id| key.resource(id.clone())).collect();
        if let Err(e) = self
            .store
            .request_fetches(keys, crate::store::FetchReason::Conflict)
            .await
        {
            tracing::warn!(
                source = key.source,
                kind = key.kind,
                error = %e,
                "could not record listed items fetched in the same second as the local row; the next run will"
            );
        }
    }
}

/// How a run handles its pages, chosen once from the kind's listing.
enum Pages {
    Resources(Box<ResourcePages>),
    Events,
}

/// What a resource listing carries from page to page: the ids seen, for deletion
/// detection after a complete full sweep.
struct ResourcePages {
    /// This sweep may detect deletions (a full, non-resumed sweep of a kind that does).
    detect: bool,
    seen: SeenIds,
    /// An item without a readable id was listed: it could be any row.
    unreadable_ids: bool,
}

/// The sweep's page writes: at most one still in flight while the next is compared.
struct Writes {
    in_flight: Option<PendingWrite>,
    /// Where a full sweep resumes (`write_order`'s rules).
    order: WriteOrder<(String, crate::db::DbTime)>,
}

/// A page's transaction on its own task, and what finishing it needs.
struct PendingWrite {
    url: String,
    run_id: RunId,
    guard: crate::change::tie::Guard,
    /// This page's own position (`None`: not worth resuming, or the last page).
    resume_at: Option<(String, crate::db::DbTime)>,
    batch_indexes: Vec<usize>,
    batch: Arc<[Change]>,
    ambiguous: Vec<String>,
    /// The rows written (or the lease lost), and the seconds the write took.
    write: AbortOnDropHandle<(PageWritten, f64)>,
}

/// What `Store::apply_page` answers.
type PageWritten = Result<Result<usize, crate::bookkeeping::LeaseLost>, crate::db::DbError>;

/// Where a page came from and what its commit records besides its rows.
struct PageAt<'a> {
    url: &'a str,
    /// `None` for a dry run.
    run_id: Option<RunId>,
    /// Where the sweep resumes after this page, if it is worth resuming.
    resume_at: Option<(String, crate::db::DbTime)>,
}

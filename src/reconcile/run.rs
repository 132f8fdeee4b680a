//! One run of an account-kind around its sweep: the lease (taken, waited for, or
//! named as another process's), the run record, and the run's end recorded with the
//! lease released in one commit. [`Run`] is the context the sweep's stages share.

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{KindReport, Reconciler, RunCounts, RunError, RunOptions, RunStatus};
use crate::bookkeeping::{Lease, RunState};
use crate::change::{Account, Key};
use crate::config::{KindConfig, SourceConfig};
use crate::sender::SenderError;

/// How many ids a dry run lists as examples.
pub(super) const DRY_RUN_EXAMPLES: usize = 10;
/// How often `reconcile --wait` asks for a lease another process holds.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// The context of one run, passed down once.
pub(super) struct Run<'a> {
    pub source: &'a SourceConfig,
    pub account: &'a Account,
    pub kind: &'a KindConfig,
    pub opts: &'a RunOptions,
    pub report: &'a mut KindReport,
    pub cancel: &'a CancellationToken,
    pub progress: &'a (dyn Fn(&RunCounts) + Send + Sync),
}

impl Run<'_> {
    /// The run's lease, records and rows: its source's kind (or catch-up).
    pub fn key(&self) -> Key {
        Key {
            source: self.source.name.clone(),
            account: self.account.clone(),
            kind: self.kind.name.clone(),
        }
    }
}

impl Reconciler {
    /// A dry run: no lease, no run record, nothing written.
    pub(super) async fn dry_run(&self, mut run: Run<'_>) -> Result<(), RunError> {
        let plan = self.plan(run.source, run.kind, &run.key(), true).await?;
        self.sweep(&mut run, plan, None).await
    }

    pub(super) async fn leased_run(&self, mut run: Run<'_>) -> Result<(), RunError> {
        let key = run.key();
        let (s, k) = (&key.source, &key.kind);
        let ttl = run.source.reconcile.lease_ttl;
        loop {
            match self.book.acquire_lease(&key, ttl).await? {
                Lease::Acquired => break,
                Lease::HeldBy { holder, expires_at } if run.opts.wait => {
                    tracing::info!(source = s, kind = k, lease_holder = holder, lease_expires_at = %expires_at, "waiting for another process's reconcile lease");
                    tokio::select! {
                        () = run.cancel.cancelled() => {
                            return Err(RunError::Stopped { pages: 0 });
                        }
                        () = tokio::time::sleep(LEASE_POLL) => {}
                    }
                }
                Lease::HeldBy { holder, expires_at } => {
                    run.report.status = RunStatus::Skipped {
                        lease_holder: holder,
                        lease_expires_at: expires_at.to_string(),
                    };
                    return Ok(());
                }
            }
        }
        // Renews the lease while the run waits on the sender or the database; every
        // write is fenced on the lease besides.
        let heartbeat = self.book.keep_alive(&key, ttl);
        let mut released = false;
        let result = self.recorded_run(&mut run, heartbeat, &mut released).await;
        // Best effort: if the database is gone the lease expires by itself.
        if !released {
            if let Err(e) = self.book.release_lease(&key).await {
                tracing::warn!(error = %e, "could not release the reconcile lease");
            }
        }
        result
    }

    /// A leased run with its `reconcile_runs` row; its end recorded with the lease
    /// released (`released`), the heartbeat stopped first.
    async fn recorded_run(
        &self,
        run: &mut Run<'_>,
        heartbeat: AbortOnDropHandle<()>,
        released: &mut bool,
    ) -> Result<(), RunError> {
        let (source, kind) = (run.source, run.kind);
        let plan = self.plan(source, kind, &run.key(), false).await?;
        let run_id = self.book.start_run(&run.key(), plan.mode).await?;
        let mut result = self.sweep(run, plan, Some(run_id)).await;
        // A resume point the sender no longer accepts (an expired cursor) must not
        // wedge the kind: start the sweep over from the first page, in this same run.
        if let Err(RunError::Sender(
            e @ (SenderError::Refused { .. }
            | SenderError::BadPage { .. }
            | SenderError::ForeignOrigin { .. }),
        )) = &result
        {
            if run.report.resumed && run.report.counts.pages == 0 {
                tracing::warn!(source = source.name, kind = kind.name, error = %e, "the sender refused the resume point; starting the sweep over");
                self.book.clear_checkpoint(&run.key()).await?;
                let plan = self.plan(source, kind, &run.key(), false).await?;
                result = self.sweep(run, plan, Some(run_id)).await;
            }
        }
        let (status, error) = match &result {
            Ok(()) => (RunState::Succeeded, None),
            Err(e) => (RunState::Failed, Some(e.to_string())),
        };
        // Best effort: if the database is gone, the run stays `running` and the next
        // run of the kind marks it abandoned; the lease expires by itself.
        drop(heartbeat);
        let key = run.key();
        let recorded = self
            .book
            .finish_and_release(run_id, status, run.report.counts, error, &key)
            .await;
        match recorded {
            Ok(()) => {
                *released = true;
                run.report.due_recorded = true;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not record the end of the reconcile run")
            }
        }
        result
    }
}

impl Run<'_> {
    /// Reports and counts a listed item that could not be read or stored.
    pub(super) fn skip(&mut self, url: &str, index: usize, id: Option<&str>, reason: &str) {
        let id = id.map_or_else(|| "(unreadable)".to_string(), |id| format!("{id:?}"));
        let line = format!("{url} item {index} (id {id}): {reason}");
        if self.report.skipped.len() < DRY_RUN_EXAMPLES {
            tracing::warn!(
                source = self.source.name,
                kind = self.kind.name,
                item = line,
                "listed item skipped"
            );
            self.report.skipped.push(line);
        }
        self.report.counts.skipped += 1;
    }
}

//! Retention: processed event ids are kept for the source's retention (twice its retry
//! window unless overridden), finished reconcile runs and dead letters for their own
//! settings, changes until every consumer has them and `retention.changes` has passed.
//! Each table's owner deletes its own rows (`store`, `bookkeeping`, `feed`); this pass
//! only drives them: bounded batches through the time indexes, each its own short
//! transaction, so a large backlog never holds a long lock or scans a table.

use std::future::Future;
use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::{Bookkeeping, PruneCounts};
use crate::config::Config;
use crate::db::{Db, DbError};
use crate::feed::Feed;
use crate::feed::outbox::Outbox;
use crate::store::Store;

/// What one retention pass deleted.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    pub processed_events: i64,
    pub reconcile_runs: i64,
    pub dead_letters: i64,
    /// Change-feed rows every consumer had (and older than `retention.changes`).
    pub changes: i64,
    pub seconds: f64,
}

/// The owners of the tables a retention pass prunes.
#[derive(Clone)]
pub struct Owners {
    pub store: Store,
    pub book: Bookkeeping,
    pub feed: Feed,
}

/// Runs one retention pass; stops between batches when `cancel` fires.
pub async fn prune(
    owners: &Owners,
    config: &Config,
    cancel: &CancellationToken,
) -> Result<PruneReport, DbError> {
    let started = Instant::now();
    let id = owners.book.start_prune().await?;
    let mut report = PruneReport::default();
    let result = prune_all(owners, config, cancel, &mut report).await;
    // Webhook deliveries leave dead change_pending rows too, and a daemon that only
    // receives them reconciles nothing that would vacuum them.
    owners.outbox().vacuum().await;
    report.seconds = started.elapsed().as_secs_f64();
    let error = result.as_ref().err().map(ToString::to_string);
    let pruned = PruneCounts {
        processed_events: report.processed_events,
        reconcile_runs: report.reconcile_runs,
        dead_letters: report.dead_letters,
    };
    owners.book.finish_prune(id, pruned, error).await?;
    for (table, n) in [
        ("processed_events", report.processed_events),
        ("reconcile_runs", report.reconcile_runs),
        ("dead_letters", report.dead_letters),
        ("changes", report.changes),
    ] {
        metrics::counter!("retention_pruned_rows_total", "table" => table).increment(n as u64);
    }
    result.map(|()| report)
}

impl Owners {
    /// The owners over one database handle (the one-shot `prune` command, tests).
    pub fn new(db: Db) -> Self {
        Self {
            store: Store::new(db.clone()),
            book: Bookkeeping::new(db.clone()),
            feed: Feed::new(db),
        }
    }

    fn outbox(&self) -> &Outbox {
        self.store.outbox()
    }
}

async fn prune_all(
    owners: &Owners,
    config: &Config,
    cancel: &CancellationToken,
    report: &mut PruneReport,
) -> Result<(), DbError> {
    let batch = i64::from(config.retention.batch);
    for source in &config.sources {
        let age = source.retention;
        report.processed_events += batches(cancel, batch, || {
            owners.store.prune_events(&source.name, age, batch)
        })
        .await?;
    }
    let age = config.retention.reconcile_runs;
    report.reconcile_runs += batches(cancel, batch, || owners.book.prune_runs(age, batch)).await?;
    let age = config.retention.dead_letters;
    report.dead_letters += batches(cancel, batch, || {
        owners.store.prune_dead_letters(age, batch)
    })
    .await?;
    // Only what every configured consumer has acknowledged.
    report.changes += owners
        .feed
        .prune(&config.consumers, config.retention.changes, batch)
        .await?;
    Ok(())
}

/// Repeats a bounded delete until it deletes less than a full batch.
async fn batches<F, Fut>(cancel: &CancellationToken, batch: i64, delete: F) -> Result<i64, DbError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<usize, DbError>>,
{
    let mut total = 0i64;
    loop {
        if cancel.is_cancelled() {
            return Ok(total);
        }
        let n = delete().await? as i64;
        total += n;
        if n < batch {
            return Ok(total);
        }
        // Let other writers (webhooks first) in between batches.
        tokio::task::yield_now().await;
    }
}

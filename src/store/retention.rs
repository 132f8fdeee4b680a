//! Retention: processed event ids are kept for the source's retention (twice its retry
//! window unless overridden), finished reconcile runs and dead letters for their own
//! settings. Deletes go in bounded batches through the time indexes, each batch its own
//! short transaction, so a large backlog never holds a long lock or scans a table.

use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::sql;
use crate::db::{Db, DbError};

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

/// Runs one retention pass; stops between batches when `cancel` fires.
pub async fn prune(
    db: &Db,
    config: &Config,
    cancel: &CancellationToken,
) -> Result<PruneReport, DbError> {
    let started = Instant::now();
    let id = db.write(sql::start_prune).await?;
    let mut report = PruneReport::default();
    let result = prune_all(db, config, cancel, &mut report).await;
    // Webhook deliveries leave dead change_pending rows too, and a daemon that only
    // receives them reconciles nothing that would vacuum them.
    db.vacuum_pending_changes().await;
    report.seconds = started.elapsed().as_secs_f64();
    let error = result.as_ref().err().map(ToString::to_string);
    let r = report.clone();
    db.write(move |c| {
        sql::finish_prune(
            c,
            id,
            r.processed_events,
            r.reconcile_runs,
            r.dead_letters,
            error.as_deref(),
        )
    })
    .await?;
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

async fn prune_all(
    db: &Db,
    config: &Config,
    cancel: &CancellationToken,
    report: &mut PruneReport,
) -> Result<(), DbError> {
    let batch = i64::from(config.retention.batch);
    for source in &config.sources {
        let age = source.retention.as_secs_f64();
        report.processed_events += batches(db, cancel, batch, |c| {
            let s = source.name.clone();
            move |conn: &mut crate::db::Conn| sql::prune_events(conn, &s, age, c)
        })
        .await?;
    }
    let age = config.retention.reconcile_runs.as_secs_f64();
    report.reconcile_runs += batches(db, cancel, batch, |c| {
        move |conn: &mut crate::db::Conn| sql::prune_runs(conn, age, c)
    })
    .await?;
    let age = config.retention.dead_letters.as_secs_f64();
    report.dead_letters += batches(db, cancel, batch, |c| {
        move |conn: &mut crate::db::Conn| sql::prune_dead_letters(conn, age, c)
    })
    .await?;
    // Only what every configured consumer has acknowledged.
    report.changes += crate::feed::Feed::new(db.clone())
        .prune(&config.consumers, config.retention.changes, batch)
        .await?;
    Ok(())
}

/// Repeats a bounded delete until it deletes less than a full batch.
async fn batches<F, G>(
    db: &Db,
    cancel: &CancellationToken,
    batch: i64,
    make: F,
) -> Result<i64, DbError>
where
    F: Fn(i64) -> G,
    G: FnOnce(&mut crate::db::Conn) -> diesel::QueryResult<usize> + Send + 'static,
{
    let mut total = 0i64;
    loop {
        if cancel.is_cancelled() {
            return Ok(total);
        }
        let n = db.write(make(batch)).await? as i64;
        total += n;
        if n < batch {
            return Ok(total);
        }
        // Let other writers (webhooks first) in between batches.
        tokio::task::yield_now().await;
    }
}

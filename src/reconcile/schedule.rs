//! The scheduler is a thin trigger: tokio-cron-scheduler fires, and each firing either
//! starts a run of its kind or, if the previous run of that kind is still going, is
//! skipped.
//!
//! What the crate does not do, done here: `every` intervals are expressed as cron
//! expressions (its fixed-interval jobs stop for good after a process pause longer than
//! the interval; cron jobs survive it), overlapping runs are prevented with a per-kind
//! lock, and shutdown waits for running runs through our own task tracker, since the
//! crate's `shutdown()` does not.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Reconciler, RunOptions};
#[cfg(test)]
use crate::config::every_to_cron;

/// Starts the schedules of every kind with a list endpoint. Runs are spawned on
/// `tracker` and see `cancel` between pages.
pub async fn start(
    reconciler: Reconciler,
    cancel: CancellationToken,
    tracker: TaskTracker,
) -> anyhow::Result<Option<JobScheduler>> {
    let mut planned = Vec::new();
    for (source, kind) in reconciler.kinds(None, None) {
        let Some(schedule) = source.schedule_of(kind) else {
            continue;
        };
        let cron = schedule.cron_expression();
        planned.push((
            source.name.clone(),
            kind.name.clone(),
            cron,
            source.reconcile.jitter,
            source.reconcile.run_at_start,
        ));
    }
    if planned.is_empty() {
        return Ok(None);
    }
    let scheduler = JobScheduler::new().await?;
    for (source, kind, cron, jitter, run_at_start) in planned {
        let busy = Arc::new(Mutex::new(()));
        let fire = {
            let (reconciler, cancel, tracker, busy) = (
                reconciler.clone(),
                cancel.clone(),
                tracker.clone(),
                busy.clone(),
            );
            let (source, kind) = (source.clone(), kind.clone());
            move |delay: Duration| {
                trigger(&reconciler, &cancel, &tracker, &busy, &source, &kind, delay);
            }
        };
        let f = fire.clone();
        let job = Job::new_async(cron.as_str(), move |_id, _sched| {
            let delay = if jitter.is_zero() {
                Duration::ZERO
            } else {
                Duration::from_millis(rand::random_range(0..=jitter.as_millis() as u64))
            };
            f(delay);
            Box::pin(async {})
        })
        .map_err(|e| anyhow::anyhow!("sources.{source}.reconcile: schedule {cron:?}: {e}"))?;
        scheduler.add(job).await?;
        tracing::info!(source, kind, cron, "reconcile scheduled (UTC)");
        if run_at_start {
            fire(Duration::ZERO);
        }
    }
    scheduler.start().await?;
    Ok(Some(scheduler))
}

fn trigger(
    reconciler: &Reconciler,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    busy: &Arc<Mutex<()>>,
    source: &str,
    kind: &str,
    delay: Duration,
) {
    if cancel.is_cancelled() {
        return;
    }
    let (reconciler, cancel, busy) = (reconciler.clone(), cancel.clone(), busy.clone());
    let (source, kind) = (source.to_string(), kind.to_string());
    tracker.spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cancel.cancelled() => return,
        }
        let Ok(_running) = busy.try_lock() else {
            tracing::info!(
                source,
                kind,
                "reconcile tick skipped: the previous run of this kind is still going"
            );
            return;
        };
        let Some((s, k)) = reconciler
            .kinds(Some(&source), Some(&kind))
            .into_iter()
            .next()
            .map(|(s, k)| (s.clone(), k.clone()))
        else {
            return;
        };
        reconciler
            .run_kind(&s, &k, &RunOptions::default(), &cancel, &|_| {})
            .await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_that_divide_a_minute_an_hour_or_a_day_become_exact_cron_schedules() {
        let cases = [
            (1, "*/1 * * * * *"),
            (15, "*/15 * * * * *"),
            (300, "0 */5 * * * *"),
            (3600, "0 0 */1 * * *"),
            (6 * 3600, "0 0 */6 * * *"),
            (86_400, "0 0 0 * * *"),
        ];
        for (secs, want) in cases {
            assert_eq!(
                every_to_cron(Duration::from_secs(secs)).unwrap(),
                want,
                "{secs}s"
            );
        }
    }

    #[test]
    fn intervals_the_schedule_cannot_keep_are_refused_not_rounded() {
        for secs in [45, 7 * 60, 90, 5 * 3600, 3 * 86_400, 25 * 3600] {
            let err = every_to_cron(Duration::from_secs(secs)).unwrap_err();
            assert!(err.contains("cron"), "{secs}s: {err}");
        }
        assert!(every_to_cron(Duration::from_millis(1500)).is_err());
    }
}

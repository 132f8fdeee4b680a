//! The scheduler is a thin trigger: tokio-cron-scheduler fires, and each firing either
//! starts a run of its kind or, if the previous run of that kind is still going, is
//! skipped.
//!
//! A many-account source's kinds are not one timer per account: each kind has one loop
//! (`accounts_loop`) that claims the due account-kinds from the database — most overdue
//! first, moving each to the kind's next tick as it is claimed, other replicas' claims
//! skipped — and runs them, at most `accounts.concurrency` of the source at once in
//! this process. A failing account is recorded and waits for its next tick; the others
//! go on.
//!
//! What the crate does not do, done here: `every` intervals are expressed as cron
//! expressions (its fixed-interval jobs stop for good after a process pause longer than
//! the interval; cron jobs survive it), overlapping runs are prevented with a per-kind
//! lock, and shutdown waits for running runs through our own task tracker, since the
//! crate's `shutdown()` does not.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, Semaphore};
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
    let mut slots: std::collections::HashMap<String, Arc<Semaphore>> = Default::default();
    for (source, kind) in reconciler.kinds(None, None) {
        let Some(schedule) = source.schedule_of(kind) else {
            continue;
        };
        let cron = schedule.cron_expression();
        if let Some(a) = &source.accounts {
            let slots = slots
                .entry(source.name.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(a.concurrency)))
                .clone();
            let parsed = croner::parser::CronParser::builder()
                .seconds(croner::parser::Seconds::Required)
                .build()
                .parse(&cron)
                .map_err(|e| {
                    anyhow::anyhow!("sources.{}.reconcile: schedule {cron:?}: {e}", source.name)
                })?;
            let lp = AccountsLoop {
                reconciler: reconciler.clone(),
                source: source.name.clone(),
                kind: kind.name.clone(),
                cron: parsed,
                slots,
                cancel: cancel.clone(),
                tracker: tracker.clone(),
            };
            tracing::info!(
                source = source.name,
                kind = kind.name,
                cron,
                "reconcile of each account scheduled (UTC)"
            );
            tracker.spawn(lp.run());
            if !Reconciler::reconciles_own_account(source) {
                continue;
            }
        }
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

/// How often a kind's loop looks for due account-kinds (an `accounts add` is picked up
/// within this).
const CLAIM_POLL: Duration = Duration::from_secs(1);
/// How often it schedules accounts registered behind its back (SQL, an older release).
const SEED_EVERY: Duration = Duration::from_secs(60);

/// One kind of a many-account source: claims due account-kinds and runs them.
struct AccountsLoop {
    reconciler: Reconciler,
    source: String,
    kind: String,
    cron: croner::Cron,
    /// The source's run slots in this process (`accounts.concurrency`).
    slots: Arc<Semaphore>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl AccountsLoop {
    async fn run(self) {
        let registry = self.reconciler.registry();
        let mut seeded: Option<tokio::time::Instant> = None;
        while !self.cancel.is_cancelled() {
            if seeded.is_none_or(|t| t.elapsed() >= SEED_EVERY) {
                match registry.seed_due(&self.source, &self.kind).await {
                    Ok(_) => seeded = Some(tokio::time::Instant::now()),
                    Err(e) => {
                        tracing::warn!(source = self.source, kind = self.kind, error = %e, "could not schedule the registered accounts; trying again")
                    }
                }
            }
            // A paused kind is not claimed: its account-kinds stay due (overdue in
            // `status`) and run as soon as it is resumed.
            let paused = self
                .reconciler
                .book()
                .is_paused(&self.source, &self.kind)
                .await
                .unwrap_or(false);
            let free = if paused {
                0
            } else {
                self.slots.available_permits()
            };
            let claimed = if free == 0 {
                Vec::new()
            } else {
                match registry
                    .claim_due(&self.source, &self.kind, self.next_tick(), free)
                    .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(source = self.source, kind = self.kind, error = %e, "could not claim due accounts; trying again");
                        Vec::new()
                    }
                }
            };
            let full = !claimed.is_empty() && claimed.len() == free;
            for account in claimed {
                // Another kind of the source may have taken the slot meanwhile: the
                // claimed account-kind waits for the next one free.
                let permit = tokio::select! {
                    () = self.cancel.cancelled() => return,
                    p = self.slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                let this = self.clone_parts();
                let registry = registry.clone();
                self.tracker.spawn(async move {
                    let _permit = permit;
                    this.run_account(&registry, &account).await;
                });
            }
            if full {
                // Every slot is taken: wait for one, then claim again at once.
                tokio::select! {
                    () = self.cancel.cancelled() => return,
                    p = self.slots.acquire() => drop(p),
                }
                continue;
            }
            tokio::select! {
                () = self.cancel.cancelled() => return,
                () = tokio::time::sleep(CLAIM_POLL) => {}
            }
        }
    }

    /// The kind's next tick at least a second from now: a claimed account-kind is due
    /// again then (a second's margin for clocks that differ between replicas and the
    /// database).
    fn next_tick(&self) -> crate::db::DbTime {
        let from = chrono::Utc::now() + chrono::Duration::seconds(1);
        let next = self
            .cron
            .find_next_occurrence(&from, false)
            .unwrap_or(from + chrono::Duration::hours(1));
        crate::db::DbTime(next)
    }

    fn clone_parts(&self) -> Self {
        Self {
            reconciler: self.reconciler.clone(),
            source: self.source.clone(),
            kind: self.kind.clone(),
            cron: self.cron.clone(),
            slots: self.slots.clone(),
            cancel: self.cancel.clone(),
            tracker: self.tracker.clone(),
        }
    }

    async fn run_account(&self, registry: &crate::accounts::Accounts, account: &str) {
        let Some((s, k)) = self
            .reconciler
            .kinds(Some(&self.source), Some(&self.kind))
            .into_iter()
            .next()
            .map(|(s, k)| (s.clone(), k.clone()))
        else {
            return;
        };
        let report = self
            .reconciler
            .run_account_kind(
                &s,
                &k,
                account,
                &RunOptions {
                    scheduled: true,
                    ..RunOptions::default()
                },
                &self.cancel,
                &|_| {},
            )
            .await;
        if report.due_recorded {
            return;
        }
        let (status, error) = match report.status {
            super::RunStatus::Succeeded => ("succeeded", None),
            super::RunStatus::Failed { error } => ("failed", Some(error)),
            super::RunStatus::Skipped { .. } | super::RunStatus::Paused => ("skipped", None),
        };
        self.finish(registry, account, status, error).await;
    }

    async fn finish(
        &self,
        registry: &crate::accounts::Accounts,
        account: &str,
        status: &'static str,
        error: Option<String>,
    ) {
        if let Err(e) = registry
            .finish_due(&self.source, account, &self.kind, status, error)
            .await
        {
            tracing::warn!(source = self.source, account, kind = self.kind, error = %e, "could not record the end of an account's run");
        }
    }
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

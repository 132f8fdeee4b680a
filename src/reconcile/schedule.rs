//! One schedule for every (source, account, kind), kept in the database
//! (`bookkeeping`'s `reconcile_due`; a single-account source's kinds are account `""`).
//!
//! Each kind has one claim loop per process (`KindLoop`) that claims its due
//! account-kinds — most overdue first, each moved to the kind's next tick as it is
//! claimed, other replicas' claims skipped, none while the kind is paused — and runs
//! them, at most `accounts.concurrency` of a many-account source at once in this
//! process. A failing account is recorded and waits for its next tick; the others go
//! on. What was overdue when no process ran (a restart) is claimed at once.
//!
//! tokio-cron-scheduler is the clock: each kind's cron job, at each tick (after the
//! kind's `jitter`), makes the kind's account-kinds due and wakes its loop. What the
//! crate does not do, done here: `every` intervals are expressed as cron expressions
//! (its fixed-interval jobs stop for good after a process pause longer than the
//! interval; cron jobs survive it), and shutdown waits for running runs through our
//! own task tracker, since the crate's `shutdown()` does not.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Reconciler, RunOptions, RunStatus};
use crate::bookkeeping::DueStatus;
#[cfg(test)]
use crate::config::every_to_cron;
use crate::db::DbTime;

/// How often a kind's loop looks for due account-kinds without being woken (an
/// `accounts add` is picked up within this).
const CLAIM_POLL: Duration = Duration::from_secs(1);
/// How often it brings the kind's schedule in line with the registry (accounts
/// registered or removed behind its back: SQL, another replica's `accounts add`).
const SYNC_EVERY: Duration = Duration::from_secs(60);

/// Starts one claim loop and one cron job per kind with a list endpoint. Runs are
/// spawned on `tracker` and see `cancel` between pages.
pub async fn start(
    reconciler: Reconciler,
    cancel: CancellationToken,
    tracker: TaskTracker,
) -> anyhow::Result<Option<JobScheduler>> {
    let mut slots: std::collections::HashMap<String, Arc<Semaphore>> = Default::default();
    let scheduler = JobScheduler::new().await?;
    let mut any = false;
    for (source, kind) in reconciler.kinds(None, None) {
        let Some(schedule) = source.schedule_of(kind) else {
            continue;
        };
        let cron = schedule.cron_expression();
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse(&cron)
            .map_err(|e| {
                anyhow::anyhow!("sources.{}.reconcile: schedule {cron:?}: {e}", source.name)
            })?;
        // A single-account source runs each kind's one row; a many-account source at
        // most `accounts.concurrency` account-kinds at once, all its kinds together.
        let per_source = source
            .accounts
            .as_ref()
            .map_or(Semaphore::MAX_PERMITS, |a| a.concurrency);
        let slots = slots
            .entry(source.name.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(per_source)))
            .clone();
        let wake = Arc::new(Notify::new());
        let lp = KindLoop {
            reconciler: reconciler.clone(),
            source: source.name.clone(),
            kind: kind.name.clone(),
            cron: parsed,
            run_at_start: source.reconcile.run_at_start && source.reconciles_own_account(),
            slots,
            wake: wake.clone(),
            cancel: cancel.clone(),
            tracker: tracker.clone(),
        };
        tracker.spawn(lp.run());
        let jitter = source.reconcile.jitter;
        let (book, tracker, cancel) = (reconciler.book().clone(), tracker.clone(), cancel.clone());
        let (s, k) = (source.name.clone(), kind.name.clone());
        let job = Job::new_async(cron.as_str(), move |_id, _sched| {
            let (book, wake, cancel) = (book.clone(), wake.clone(), cancel.clone());
            let (s, k) = (s.clone(), k.clone());
            tracker.spawn(async move {
                let delay = if jitter.is_zero() {
                    Duration::ZERO
                } else {
                    Duration::from_millis(rand::random_range(0..=jitter.as_millis() as u64))
                };
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = cancel.cancelled() => return,
                }
                if let Err(e) = book.tick(&s, &k).await {
                    tracing::warn!(source = s, kind = k, error = %e, "could not make the kind due at its tick; its rows fall due by themselves");
                }
                wake.notify_one();
            });
            Box::pin(async {})
        })
        .map_err(|e| {
            anyhow::anyhow!("sources.{}.reconcile: schedule {cron:?}: {e}", source.name)
        })?;
        scheduler.add(job).await?;
        tracing::info!(
            source = source.name,
            kind = kind.name,
            cron,
            "reconcile scheduled (UTC)"
        );
        any = true;
    }
    if !any {
        return Ok(None);
    }
    scheduler.start().await?;
    Ok(Some(scheduler))
}

/// One kind of a source: keeps its schedule in line with the accounts, claims due
/// account-kinds and runs them.
struct KindLoop {
    reconciler: Reconciler,
    source: String,
    kind: String,
    cron: croner::Cron,
    /// `reconcile.run_at_start`, for a source whose own account is reconciled.
    run_at_start: bool,
    /// The source's run slots in this process.
    slots: Arc<Semaphore>,
    /// Woken by the kind's cron job at each tick.
    wake: Arc<Notify>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl KindLoop {
    async fn run(self) {
        let book = self.reconciler.book().clone();
        let mut synced: Option<tokio::time::Instant> = None;
        let mut started = false;
        while !self.cancel.is_cancelled() {
            if synced.is_none_or(|t| t.elapsed() >= SYNC_EVERY) {
                match self.sync().await {
                    Ok(()) => synced = Some(tokio::time::Instant::now()),
                    Err(e) => {
                        tracing::warn!(source = self.source, kind = self.kind, error = %e, "could not schedule the kind's accounts; trying again")
                    }
                }
            }
            if !started && synced.is_some() {
                started = true;
                if self.run_at_start {
                    // `run_at_start`: this process's start makes the source's own
                    // account-kind due (one replica runs it).
                    if let Err(e) = book
                        .due_now(&self.source, "", vec![self.kind.clone()])
                        .await
                    {
                        tracing::warn!(source = self.source, kind = self.kind, error = %e, "could not make the kind due at start");
                    }
                }
            }
            let free = self.slots.available_permits();
            let claimed = if free == 0 {
                Vec::new()
            } else {
                match book
                    .claim_due(&self.source, &self.kind, self.next_tick(), free)
                    .await
                {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(source = self.source, kind = self.kind, error = %e, "could not claim due account-kinds; trying again");
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
                self.tracker.spawn(async move {
                    let _permit = permit;
                    this.run_account(&account).await;
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
                () = self.wake.notified() => {}
                () = tokio::time::sleep(CLAIM_POLL) => {}
            }
        }
    }

    /// The kind's rows made exactly the accounts it serves: the source's own (first due
    /// at the next tick) and its enabled registered accounts (their first sync due now).
    async fn sync(&self) -> Result<(), crate::db::DbError> {
        let Some((s, _)) = self
            .reconciler
            .kinds(Some(&self.source), Some(&self.kind))
            .into_iter()
            .next()
        else {
            return Ok(());
        };
        let next = self.next_tick();
        let book = self.reconciler.book();
        let listed_at = book.clock().await?;
        let accounts = self
            .reconciler
            .accounts_of(s)
            .await?
            .into_iter()
            .map(|a| {
                let first = a.is_own().then_some(next);
                (a.stored().to_string(), first)
            })
            .collect();
        book.sync_schedule(&self.source, &self.kind, accounts, listed_at)
            .await?;
        Ok(())
    }

    /// The kind's next tick at least a second from now: a claimed account-kind is due
    /// again then (a second's margin for clocks that differ between replicas and the
    /// database).
    fn next_tick(&self) -> DbTime {
        let from = chrono::Utc::now() + chrono::Duration::seconds(1);
        let next = self
            .cron
            .find_next_occurrence(&from, false)
            .unwrap_or(from + chrono::Duration::hours(1));
        DbTime(next)
    }

    fn clone_parts(&self) -> Self {
        Self {
            reconciler: self.reconciler.clone(),
            source: self.source.clone(),
            kind: self.kind.clone(),
            cron: self.cron.clone(),
            run_at_start: self.run_at_start,
            slots: self.slots.clone(),
            wake: self.wake.clone(),
            cancel: self.cancel.clone(),
            tracker: self.tracker.clone(),
        }
    }

    async fn run_account(&self, account: &str) {
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
                &crate::change::Account::from_stored(account),
                &RunOptions::default(),
                &self.cancel,
                &|_| {},
            )
            .await;
        // A run recorded its own end (`run_account_kind`); one that did not run ends
        // its claim here.
        if let RunStatus::Skipped { .. } | RunStatus::Paused = report.status {
            let key = crate::change::Key::new(&self.source, &self.kind).in_account(account);
            if let Err(e) = self
                .reconciler
                .book()
                .finish_due(&key, DueStatus::Skipped, None)
                .await
            {
                tracing::warn!(source = self.source, account, kind = self.kind, error = %e, "could not record a skipped run");
            }
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

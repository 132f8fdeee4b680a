//! Reconcile bookkeeping behind typed methods: the lease on an account-kind, the run
//! record, the checkpoint of an unfinished sweep, the incremental watermark, pauses, and
//! the one schedule (`schedule`: when each account-kind is due, claimed, ended). The
//! reconcile flow calls these and `store`; it holds no database handle and runs no SQL.
//!
//! A page's write and its bookkeeping commit together: the flow hands `store` a
//! [`PageMark`] built here, and `store` records it in the transaction that writes the
//! page, so a checkpoint never runs ahead of (or behind) the rows it stands for.
//!
//! Invariant: every time here is the database's clock ([`DbTime`]), the one clock all
//! replicas share; none is ever used as a resource version.

use std::time::Duration;

mod pauses;
mod schedule;
mod sql;

use crate::change::Key;
use crate::db::{Conn, Db, DbError, DbTime};
pub use schedule::{DueCount, DueStatus, Overdue};
pub use sql::{Checkpoint, PausedRow, PruneRow, RunRow, SuccessAge, SweepState};

/// `reconcile_runs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    /// Its process stopped before it finished; set by the next run of the kind.
    Abandoned,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Abandoned => "abandoned",
        }
    }
}

/// `reconcile_runs.mode`: what a run lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Everything.
    Full,
    /// What changed since the watermark.
    Incremental,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Incremental => "incremental",
        }
    }
}

/// Counts of one run, as stored in `reconcile_runs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunCounts {
    pub pages: i64,
    pub scanned: i64,
    /// Listed by the sender, absent here.
    pub missing: i64,
    /// Newer version at the sender.
    pub newer_remote: i64,
    /// Same version, different state (or a local tombstone of a listed item).
    pub differing: i64,
    /// Newer here (a webhook overtook the listing): never overwritten.
    pub newer_local: i64,
    pub equal: i64,
    /// Rows written (or, in a dry run, that would be).
    pub applied: i64,
    /// Live rows the complete sweep did not see, marked deleted.
    pub tombstoned: i64,
    /// Listed items that could not be read or stored: reported and skipped.
    pub skipped: i64,
}

/// A run's row in `reconcile_runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunId(i64);

/// Who holds a kind's lease after an attempt to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This process holds it now.
    Acquired,
    /// Another live process holds it (or one on another host, whose life we cannot
    /// see): its holder id and when its lease expires unless renewed.
    HeldBy { holder: String, expires_at: DbTime },
}

/// A run's write was refused because its lease now belongs to `0` (a holder id, or
/// "nobody" when it was released or expired and not yet taken).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease lost to {0}")]
pub struct LeaseLost(pub String);

/// The lease check of a write: inside the write's transaction, extend our lease, or find
/// it is no longer ours and write nothing. The `UPDATE` holds the lease row's lock until
/// the transaction ends, so no one can take the lease between the check and the commit.
#[derive(Debug, Clone)]
pub struct Fence {
    key: Key,
    holder: String,
    ttl: Duration,
}

impl Fence {
    /// `Ok(Err(_))` when the lease is no longer ours: the caller writes nothing.
    pub(crate) fn check(&self, conn: &mut Conn) -> diesel::QueryResult<Result<(), LeaseLost>> {
        if sql::renew_lease(conn, &self.key, &self.holder, self.ttl.as_secs_f64())? {
            return Ok(Ok(()));
        }
        Ok(Err(self.lost(conn)?))
    }

    /// Who holds the lease now that it is not ours.
    fn lost(&self, conn: &mut Conn) -> diesel::QueryResult<LeaseLost> {
        let now = sql::current_lease(conn, &self.key)?;
        Ok(LeaseLost(
            now.map_or_else(|| "nobody".to_string(), |(h, _)| h),
        ))
    }
}

/// Where a kind's next run starts from, as the database remembers it.
#[derive(Debug, Clone)]
pub struct SweepPosition {
    /// An unfinished full sweep.
    pub checkpoint: Option<Checkpoint>,
    /// The incremental watermark and whether a full sweep is due.
    pub state: SweepState,
    /// The database's clock now (the start of a new sweep).
    pub now: DbTime,
}

/// What a page commits besides its rows: the run's counts so far and where the sweep
/// goes on from. Built by [`Bookkeeping::page_mark`], recorded by `store` in the page's
/// transaction.
#[derive(Debug, Clone)]
pub struct PageMark {
    fence: Fence,
    run: RunId,
    /// `None` clears the checkpoint (last page, or a run not worth resuming).
    resume_at: Option<(String, DbTime)>,
    /// Leave the checkpoint as it is (`keeping_checkpoint`).
    keep_checkpoint: bool,
    counts: RunCounts,
}

impl PageMark {
    /// The same mark, leaving the checkpoint as it is: for a page whose commit may land
    /// before an earlier page's while no position of this run is known committed yet.
    pub fn keeping_checkpoint(mut self) -> Self {
        self.keep_checkpoint = true;
        self
    }

    /// The lease check, then the mark recorded, in the caller's transaction; `applied`
    /// rows were written by this page. `Ok(Err(_))` when the lease is no longer ours:
    /// nothing is recorded and the caller undoes its rows. On PostgreSQL a page that
    /// moves or clears the checkpoint does it in one statement
    /// ([`sql::renew_lease_and_record_page`]).
    pub(crate) fn check_and_record(
        &self,
        conn: &mut Conn,
        applied: usize,
    ) -> diesel::QueryResult<Result<(), LeaseLost>> {
        if let (Conn::Postgres(c), false) = (&mut *conn, self.keep_checkpoint) {
            let mut counts = self.counts;
            counts.applied += applied as i64;
            let f = &self.fence;
            if sql::renew_lease_and_record_page(
                c,
                &f.key,
                &f.holder,
                f.ttl.as_secs_f64(),
                self.resume_at.as_ref().map(|(p, t)| (p.as_str(), *t)),
                self.run.0,
                &counts,
            )? {
                return Ok(Ok(()));
            }
            return Ok(Err(f.lost(conn)?));
        }
        if let Err(lost) = self.fence.check(conn)? {
            return Ok(Err(lost));
        }
        self.record(conn, applied)?;
        Ok(Ok(()))
    }

    /// Records the mark in the caller's transaction; `applied` rows were written by
    /// this page.
    pub(crate) fn record(&self, conn: &mut Conn, applied: usize) -> diesel::QueryResult<()> {
        if !self.keep_checkpoint {
            sql::set_checkpoint(
                conn,
                &self.fence.key,
                self.resume_at.as_ref().map(|(p, t)| (p.as_str(), *t)),
            )?;
        }
        let mut counts = self.counts;
        counts.applied += applied as i64;
        sql::update_run(conn, self.run.0, RunState::Running, &counts, None)
    }
}

/// The bookkeeping of this process's reconcile runs. Cheap to clone.
#[derive(Clone)]
pub struct Bookkeeping {
    db: Db,
    holder: String,
}

impl Bookkeeping {
    /// The database these records are kept in (owners of other tables on it are built
    /// from it).
    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn new(db: Db) -> Self {
        Self {
            db,
            holder: holder_id(),
        }
    }

    /// This process's lease holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Takes the kind's lease for `ttl` if it is free, expired or already ours, or if
    /// its holder is a process of this host that no longer runs (killed, crashed): that
    /// one is replaced at once instead of after its lease expires.
    pub async fn acquire_lease(&self, key: &Key, ttl: Duration) -> Result<Lease, DbError> {
        let (k, me) = (key.clone(), self.holder.clone());
        let (holder, expires_at) = self
            .db
            .write_statement(move |c| sql::acquire_lease(c, &k, &me, ttl.as_secs_f64()))
            .await?;
        if holder == self.holder {
            return Ok(Lease::Acquired);
        }
        if holder_is_gone(&holder) {
            let (k, me, dead) = (key.clone(), self.holder.clone(), holder.clone());
            let taken = self
                .db
                .write(move |c| sql::take_over_lease(c, &k, &dead, &me, ttl.as_secs_f64()))
                .await?;
            if taken {
                tracing::warn!(
                    source = key.source,
                    kind = key.kind,
                    dead_holder = holder,
                    "took over the reconcile lease of a process of this host that no longer runs"
                );
                return Ok(Lease::Acquired);
            }
            return Box::pin(self.acquire_lease(key, ttl)).await;
        }
        Ok(Lease::HeldBy { holder, expires_at })
    }

    /// The lease check a write of a run of (source, kind) commits with.
    pub fn fence(&self, key: &Key, ttl: Duration) -> Fence {
        Fence {
            key: key.clone(),
            holder: self.holder.clone(),
            ttl,
        }
    }

    /// Keeps our lease of (source, kind) alive while the returned handle lives: renewed
    /// every third of `ttl`, so a run waiting on the sender (retries, back-off, rate
    /// limit, a slow page) or on deletion detection does not lose it. A lease found
    /// lost is not taken back; the run's next fenced write fails.
    pub fn keep_alive(&self, key: &Key, ttl: Duration) -> tokio_util::task::AbortOnDropHandle<()> {
        let (book, key) = (self.clone(), key.clone());
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let every = (ttl / 3).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(every).await;
                match book.renew_lease(&key, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            source = key.source,
                            kind = key.kind,
                            "the reconcile lease was lost (this process stalled longer than lease_ttl); the run writes nothing more"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(source = key.source, kind = key.kind, error = %e, "could not renew the reconcile lease; retrying")
                    }
                }
            }
        }))
    }

    /// Extends our lease by `ttl`; false when it is no longer ours.
    pub async fn renew_lease(&self, key: &Key, ttl: Duration) -> Result<bool, DbError> {
        let (k, me) = (key.clone(), self.holder.clone());
        self.db
            .write(move |c| sql::renew_lease(c, &k, &me, ttl.as_secs_f64()))
            .await
    }

    /// Revokes every lease of `account` (it is being erased or removed): a run of it in
    /// flight writes no further page.
    pub async fn revoke_account_leases(
        &self,
        source: &str,
        account: &str,
    ) -> Result<usize, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db
            .write(move |c| sql::revoke_account_leases(c, &s, &a))
            .await
    }

    /// Gives the lease up (if it is still ours).
    pub async fn release_lease(&self, key: &Key) -> Result<(), DbError> {
        let (k, me) = (key.clone(), self.holder.clone());
        self.db.write(move |c| sql::release_lease(c, &k, &me)).await
    }

    /// Records a run's start (and marks runs of the kind whose process died
    /// `abandoned`; the caller holds the lease).
    pub async fn start_run(&self, key: &Key, mode: Mode) -> Result<RunId, DbError> {
        let k = key.clone();
        self.db
            .write_statement(move |c| sql::start_run(c, &k, mode))
            .await
            .map(RunId)
    }

    /// Records a run's end — its run record, its account-kind's schedule row (so a
    /// one-shot run's failure shows like a scheduled one's) — and releases its lease, in
    /// one commit.
    pub async fn finish_and_release(
        &self,
        run: RunId,
        status: RunState,
        counts: RunCounts,
        error: Option<String>,
        lease: &Key,
    ) -> Result<(), DbError> {
        let (k, me) = (lease.clone(), self.holder.clone());
        let due_status = match status {
            RunState::Succeeded => DueStatus::Succeeded,
            _ => DueStatus::Failed,
        };
        self.db
            .write_statement(move |c| match c {
                Conn::Postgres(pg) => sql::finish_and_release(
                    pg,
                    run.0,
                    status,
                    &counts,
                    error.as_deref(),
                    &k,
                    &me,
                    due_status.as_str(),
                ),
                Conn::Sqlite(_) => {
                    sql::update_run(c, run.0, status, &counts, error.as_deref())?;
                    sql::release_lease(c, &k, &me)?;
                    sql::due::finish(c, &k, due_status.as_str(), error.as_deref())
                }
            })
            .await
    }

    /// Where the kind's next run starts: its checkpoint, its incremental state (a full
    /// sweep is due when the last began more than `full_every` ago), and the clock.
    pub async fn sweep_position(
        &self,
        key: &Key,
        full_every: Duration,
    ) -> Result<SweepPosition, DbError> {
        let k = key.clone();
        self.db
            .read(move |c| {
                let (checkpoint, state, now) =
                    sql::sweep_position(c, &k, full_every.as_secs_f64())?;
                Ok(SweepPosition {
                    checkpoint,
                    state,
                    now,
                })
            })
            .await
    }

    /// Forgets an unfinished sweep (its resume point no longer works).
    pub async fn clear_checkpoint(&self, key: &Key) -> Result<(), DbError> {
        let k = key.clone();
        self.db
            .write(move |c| sql::set_checkpoint(c, &k, None))
            .await
    }

    /// Raises the incremental watermark (never lowers it) and, after a complete full
    /// sweep, records when that sweep began.
    pub async fn advance_watermark(
        &self,
        key: &Key,
        watermark: Option<i64>,
        full_sweep_started: Option<DbTime>,
    ) -> Result<(), DbError> {
        let k = key.clone();
        self.db
            .write(move |c| sql::save_sweep_state(c, &k, watermark, full_sweep_started))
            .await
    }

    /// What a page of `run` commits with its rows: `counts` so far (this page's
    /// writes are added when they are known) and the position the sweep resumes from,
    /// if any.
    pub fn page_mark(
        &self,
        run: RunId,
        fence: Fence,
        resume_at: Option<(String, DbTime)>,
        counts: RunCounts,
    ) -> PageMark {
        PageMark {
            fence,
            run,
            resume_at,
            keep_checkpoint: false,
            counts,
        }
    }
}

/// Reads for `status`, `/readyz` and the metrics, and retention of run records.
impl Bookkeeping {
    /// Seconds since the last successful run of each (source, account, kind) that has
    /// one.
    pub async fn last_success_ages(&self) -> Result<Vec<SuccessAge>, DbError> {
        self.db.read(sql::last_success_ages).await
    }

    /// The kind's latest `limit` runs, newest first.
    pub async fn recent_runs(&self, key: &Key, limit: i64) -> Result<Vec<RunRow>, DbError> {
        let k = key.clone();
        self.db
            .read(move |c| sql::recent_runs(c, &k, false, limit))
            .await
    }

    /// The latest runs of `source`'s `kind` in any of its accounts, newest first.
    pub async fn recent_runs_of_every_account(
        &self,
        source: &str,
        kind: &str,
        limit: i64,
    ) -> Result<Vec<RunRow>, DbError> {
        let k = Key::new(source, kind);
        self.db
            .read(move |c| sql::recent_runs(c, &k, true, limit))
            .await
    }

    /// How many items the kind's last successful full sweep listed.
    pub async fn last_full_sweep_size(&self, key: &Key) -> Result<Option<i64>, DbError> {
        let k = key.clone();
        self.db
            .read(move |c| sql::last_full_sweep_size(c, &k))
            .await
    }

    /// The runs of `key` that were running at `at` (text of a stored time).
    pub async fn runs_at(&self, key: &Key, at: &str) -> Result<Vec<RunRow>, DbError> {
        let (k, at) = (key.clone(), at.to_string());
        self.db.read(move |c| sql::runs_at(c, &k, &at)).await
    }

    /// The last retention pass, if any.
    pub async fn last_prune(&self) -> Result<Option<PruneRow>, DbError> {
        self.db.read(sql::last_prune).await
    }

    /// Records the start of a retention pass.
    pub async fn start_prune(&self) -> Result<PruneId, DbError> {
        self.db.write(sql::start_prune).await.map(PruneId)
    }

    /// Records the end of a retention pass: what it deleted, and its error if any.
    pub async fn finish_prune(
        &self,
        id: PruneId,
        pruned: PruneCounts,
        error: Option<String>,
    ) -> Result<(), DbError> {
        self.db
            .write(move |c| {
                sql::finish_prune(
                    c,
                    id.0,
                    pruned.processed_events,
                    pruned.reconcile_runs,
                    pruned.dead_letters,
                    error.as_deref(),
                )
            })
            .await
    }

    /// Deletes at most `limit` finished reconcile runs and retention passes older than
    /// `age` (one bounded batch); returns how many.
    pub async fn prune_runs(&self, age: Duration, limit: i64) -> Result<usize, DbError> {
        self.db
            .write(move |c| sql::prune_runs(c, age.as_secs_f64(), limit))
            .await
    }
}

/// A retention pass's row in `prune_runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneId(i64);

/// What a retention pass deleted, as `prune_runs` records it.
#[derive(Debug, Clone, Copy, Default)]
pub struct PruneCounts {
    pub processed_events: i64,
    pub reconcile_runs: i64,
    pub dead_letters: i64,
}

/// `host:pid:start:random`: names the process in `status` and in "skipped" messages.
/// `start` (the process's start time, in clock ticks since boot) tells a reused pid
/// apart; `random` tells apart two reconcilers of one process (tests run several).
pub(crate) fn holder_id() -> String {
    format!(
        "{}:{}:{}:{:08x}",
        hostname(),
        std::process::id(),
        process_start(std::process::id()).unwrap_or(0),
        rand::random::<u32>()
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `holder` names a process of this host that no longer runs. A holder of
/// another host, or written in another format, is never declared gone: its lease
/// expires on its own.
pub(crate) fn holder_is_gone(holder: &str) -> bool {
    let parts: Vec<&str> = holder.split(':').collect();
    let [host, pid, start, _random] = parts[..] else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    if host != hostname() || start == 0 {
        return false;
    }
    process_start(pid) != Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_gone_only_when_its_process_on_this_host_is() {
        let me = holder_id();
        assert!(!holder_is_gone(&me), "this process runs: {me}");
        let parts: Vec<&str> = me.split(':').collect();
        let host = parts[0];
        // Same pid, another start time: the pid was reused.
        assert!(holder_is_gone(&format!(
            "{host}:{}:1:0",
            std::process::id()
        )));
        // A pid that cannot exist.
        assert!(holder_is_gone(&format!("{host}:4294967295:5:0")));
        // Another host, or an old-format holder: left to expire.
        assert!(!holder_is_gone("elsewhere.example:1:5:0"));
        assert!(!holder_is_gone(&format!("{host}:4294967295:abcdef12")));
    }
}

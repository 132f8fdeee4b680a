//! Reconcile bookkeeping behind typed methods: the lease on a kind, the run record, the
//! checkpoint of an unfinished sweep and the incremental watermark. The reconcile flow
//! calls these and `store`; it holds no database handle and runs no SQL.
//!
//! A page's write and its bookkeeping commit together: the flow hands `store` a
//! [`PageMark`] built here, and `store` records it in the transaction that writes the
//! page, so a checkpoint never runs ahead of (or behind) the rows it stands for.
//!
//! Invariant: every time here is the database's clock ([`DbTime`]), the one clock all
//! replicas share; none is ever used as a resource version.

use std::time::Duration;

use crate::db::sql::{self, Checkpoint, Mode, RunCounts, RunState, SweepState};
use crate::db::{Conn, Db, DbError, DbTime};

/// A run's row in `reconcile_runs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunId(i64);

/// Who holds a kind's lease after an attempt to take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// This process holds it now.
    Acquired,
    /// Another process holds it: its holder id.
    HeldBy(String),
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
    source: String,
    kind: String,
    run: RunId,
    /// `None` clears the checkpoint (last page, or a run not worth resuming).
    resume_at: Option<(String, DbTime)>,
    counts: RunCounts,
}

impl PageMark {
    /// Records the mark in the caller's transaction; `applied` rows were written by
    /// this page.
    pub(crate) fn record(&self, conn: &mut Conn, applied: usize) -> diesel::QueryResult<()> {
        sql::set_checkpoint(
            conn,
            &self.source,
            &self.kind,
            self.resume_at.as_ref().map(|(p, t)| (p.as_str(), *t)),
        )?;
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

    /// Takes the kind's lease for `ttl` if it is free, expired or already ours.
    pub async fn acquire_lease(
        &self,
        source: &str,
        kind: &str,
        ttl: Duration,
    ) -> Result<Lease, DbError> {
        let (s, k, me) = (source.to_string(), kind.to_string(), self.holder.clone());
        let holder = self
            .db
            .write(move |c| sql::acquire_lease(c, &s, &k, &me, ttl.as_secs_f64()))
            .await?;
        Ok(if holder == self.holder {
            Lease::Acquired
        } else {
            Lease::HeldBy(holder)
        })
    }

    /// Extends our lease by `ttl`; false when it is no longer ours.
    pub async fn renew_lease(
        &self,
        source: &str,
        kind: &str,
        ttl: Duration,
    ) -> Result<bool, DbError> {
        let (s, k, me) = (source.to_string(), kind.to_string(), self.holder.clone());
        self.db
            .write(move |c| sql::renew_lease(c, &s, &k, &me, ttl.as_secs_f64()))
            .await
    }

    /// Gives the lease up (if it is still ours).
    pub async fn release_lease(&self, source: &str, kind: &str) -> Result<(), DbError> {
        let (s, k, me) = (source.to_string(), kind.to_string(), self.holder.clone());
        self.db
            .write(move |c| sql::release_lease(c, &s, &k, &me))
            .await
    }

    /// Records a run's start (and marks runs of the kind whose process died
    /// `abandoned`; the caller holds the lease).
    pub async fn start_run(&self, source: &str, kind: &str, mode: Mode) -> Result<RunId, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db
            .write(move |c| sql::start_run(c, &s, &k, mode))
            .await
            .map(RunId)
    }

    /// Records a run's end.
    pub async fn finish_run(
        &self,
        run: RunId,
        status: RunState,
        counts: RunCounts,
        error: Option<String>,
    ) -> Result<(), DbError> {
        self.db
            .write(move |c| sql::update_run(c, run.0, status, &counts, error.as_deref()))
            .await
    }

    /// Where the kind's next run starts: its checkpoint, its incremental state (a full
    /// sweep is due when the last began more than `full_every` ago), and the clock.
    pub async fn sweep_position(
        &self,
        source: &str,
        kind: &str,
        full_every: Duration,
    ) -> Result<SweepPosition, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db
            .read(move |c| {
                Ok(SweepPosition {
                    checkpoint: sql::checkpoint(c, &s, &k)?,
                    state: sql::sweep_state(c, &s, &k, full_every.as_secs_f64())?,
                    now: sql::db_now(c)?,
                })
            })
            .await
    }

    /// Forgets an unfinished sweep (its resume point no longer works).
    pub async fn clear_checkpoint(&self, source: &str, kind: &str) -> Result<(), DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db
            .write(move |c| sql::set_checkpoint(c, &s, &k, None))
            .await
    }

    /// Raises the incremental watermark (never lowers it) and, after a complete full
    /// sweep, records when that sweep began.
    pub async fn advance_watermark(
        &self,
        source: &str,
        kind: &str,
        watermark: Option<i64>,
        full_sweep_started: Option<DbTime>,
    ) -> Result<(), DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db
            .write(move |c| sql::save_sweep_state(c, &s, &k, watermark, full_sweep_started))
            .await
    }

    /// What a page of `run` commits with its rows: `counts` so far (this page's
    /// writes are added when they are known) and the position the sweep resumes from,
    /// if any.
    pub fn page_mark(
        &self,
        run: RunId,
        source: &str,
        kind: &str,
        resume_at: Option<(String, DbTime)>,
        counts: RunCounts,
    ) -> PageMark {
        PageMark {
            source: source.to_string(),
            kind: kind.to_string(),
            run,
            resume_at,
            counts,
        }
    }
}

/// `host:pid:random`: names the process in `status` and in "skipped" messages.
fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

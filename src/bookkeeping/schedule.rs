//! The one schedule (`reconcile_due`): every reconcile of every (source, account,
//! kind) — a single-account source's kinds as account `''` — is due work in the
//! database. A kind's claim loop (`reconcile::schedule`) takes due rows, most overdue
//! first, one replica each; the kind's cron job (the clock) makes the kind's rows due
//! at each tick; a run's end is recorded here in the run's own commit.

use super::Bookkeeping;
use super::sql::due;
use crate::change::Key;
use crate::db::{DbError, DbTime};

pub use super::sql::due::{DueCount, Overdue};

/// How a run of an account-kind ended, as `reconcile_due.status` records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueStatus {
    Succeeded,
    Failed,
    /// Not run: another process held the lease, or the kind is paused.
    Skipped,
}

impl DueStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DueStatus::Succeeded => "succeeded",
            DueStatus::Failed => "failed",
            DueStatus::Skipped => "skipped",
        }
    }
}

impl Bookkeeping {
    /// The database's clock now: when a listing of the registry was taken, for
    /// [`Self::sync_schedule`].
    pub async fn clock(&self) -> Result<DbTime, DbError> {
        self.db.read(super::sql::db_now).await
    }

    /// Brings the schedule of `source`'s `kind` in line with `accounts` (the source's
    /// own `""` and its enabled accounts, as listed at `listed_at`), each with when it
    /// is first due if it has no row yet (`None`: now). Returns how many rows were
    /// added.
    pub async fn sync_schedule(
        &self,
        source: &str,
        kind: &str,
        accounts: Vec<(String, Option<DbTime>)>,
        listed_at: DbTime,
    ) -> Result<usize, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        let b = self.db.backend();
        let accounts: Vec<(String, Option<String>)> = accounts
            .into_iter()
            .map(|(a, t)| (a, t.map(|t| t.to_db(b))))
            .collect();
        let listed_at = listed_at.to_db(b);
        let (added, had) = self
            .db
            .write(move |c| due::sync(c, &s, &k, &accounts, &listed_at))
            .await?;
        // The table grew by a tenth or more (the first start with many accounts): its
        // statistics are made now, not left to autovacuum, which may be off.
        if added >= 100 && added * 10 >= had {
            if let Err(e) = self.db.read(due::analyze).await {
                tracing::debug!(error = %e, "could not analyze reconcile_due");
            }
        }
        Ok(added)
    }

    /// Makes `account`'s `kinds` due now (scheduled if they were not): its first sync
    /// within seconds, or a full run that repairs what a fetch could not.
    pub async fn due_now(
        &self,
        source: &str,
        account: &str,
        kinds: Vec<String>,
    ) -> Result<(), DbError> {
        let keys: Vec<Key> = kinds
            .into_iter()
            .map(|k| Key::new(source, k).in_account(account))
            .collect();
        self.db
            .write(move |c| keys.iter().try_for_each(|k| due::due_now(c, k)))
            .await
    }

    /// Makes one scheduled account-kind due now (a fetch for it gave up: a full run
    /// repairs it); whether it is scheduled.
    pub async fn make_due(&self, key: &Key) -> Result<bool, DbError> {
        let k = key.clone();
        self.db.write(move |c| due::make_due(c, &k)).await
    }

    /// The kind's tick: its account-kinds not running are due now.
    pub async fn tick(&self, source: &str, kind: &str) -> Result<usize, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db.write(move |c| due::tick(c, &s, &k)).await
    }

    /// Claims up to `limit` due account-kinds of `kind` (most overdue first, none while
    /// the kind is paused), each made due next at `next`; another replica's claims are
    /// skipped, never waited for. Returns the claimed accounts.
    pub async fn claim_due(
        &self,
        source: &str,
        kind: &str,
        next: DbTime,
        limit: usize,
    ) -> Result<Vec<String>, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        // Every kind's loop asks every second: on SQLite asked on a reader first, so an
        // idle schedule never takes the one writer from the deliveries. PostgreSQL's
        // claim that finds nothing writes nothing; asking first was one more round trip
        // per claim.
        if self.db.backend() == crate::config::Backend::Sqlite {
            let (s2, k2) = (s.clone(), k.clone());
            if !self.db.read(move |c| due::any_due(c, &s2, &k2)).await? {
                return Ok(Vec::new());
            }
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let next = next.to_db(self.db.backend());
        self.db
            .write(move |c| due::claim(c, &s, &k, &next, limit))
            .await
    }

    /// Records how a run that wrote no run record ended (skipped, paused, or failed
    /// before it started); a run with a record has its end recorded with it
    /// ([`Bookkeeping::finish_and_release`]).
    pub async fn finish_due(
        &self,
        key: &Key,
        status: DueStatus,
        error: Option<String>,
    ) -> Result<(), DbError> {
        let k = key.clone();
        self.db
            .write(move |c| due::finish(c, &k, status.as_str(), error.as_deref()))
            .await
    }

    /// Stops running `account` of `source` (disabled or removed).
    pub async fn unschedule_account(&self, source: &str, account: &str) -> Result<(), DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.write(move |c| due::unschedule(c, &s, &a)).await
    }

    /// Forgets a removed account: its schedule and its last successes (added again, it
    /// ages from then, not from a success before its removal).
    pub async fn forget_account(&self, source: &str, account: &str) -> Result<(), DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db
            .write(move |c| {
                due::unschedule(c, &s, &a)?;
                super::sql::forget_account(c, &s, &a)
            })
            .await
    }

    /// Account-kinds of registered accounts by source and state.
    pub async fn due_counts(&self) -> Result<Vec<DueCount>, DbError> {
        self.db.read(due::due_counts).await
    }

    /// The most overdue (and failed) account-kinds of registered accounts, by name.
    pub async fn most_overdue(&self, limit: i64) -> Result<Vec<Overdue>, DbError> {
        self.db.read(move |c| due::most_overdue(c, limit)).await
    }
}

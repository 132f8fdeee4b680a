//! The change feed: what the application acts on. Every write that changes a resource
//! records one change in its own transaction (a trigger fills `change_pending`); the
//! `outbox` numbers committed changes into `changes` so that `seq` grows in visibility
//! order, gap-free, without a lock any writer holds through its commit.
//! This module owns the feed's tables (`change_pending`, `changes`, `change_seq`,
//! `consumer_positions`, `consumer_skips`): `outbox` publishes, numbers, wakes and vacuums,
//! [`Feed`] reads for `GET /changes` and the `changes` command, advances positions and
//! prunes, and `push` delivers to the configured consumers.
//!
//! Invariant: only this module runs SQL on those tables; a consumer's position only
//! moves forward, fenced on the consumer's lease, and only past changes its
//! application answered 2xx (or that `on_failure = "skip"` recorded).

pub mod outbox;
pub mod push;
mod sql;

use serde::Serialize;
use serde_json::Value;

use crate::bookkeeping::{Fence, LeaseLost};
use crate::config::{ConsumerConfig, ConsumerStart};
use crate::db::{Db, DbError};
use sql::ChangeRow;
pub use sql::{ConsumerRow, Lag, ResourceChange};

/// The sequencer's pass on PostgreSQL as the product sends it, for benchmarks whose
/// baselines must do the same work: one statement (`BATCH`, the most changes it moves at
/// a time, bound as `$1`), sent in autocommit: its own transaction.
pub mod baseline {
    pub const PASS: &str = super::sql::PASS_SQL;
    pub const BATCH: i64 = super::sql::SEQUENCE_BATCH;
}

/// One change as the application sees it (pushed body, pulled item, printed line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeedChange {
    pub seq: i64,
    pub source: String,
    /// The account of a many-account source; `""` for a single-account one.
    pub account: String,
    pub kind: String,
    pub id: String,
    pub version: i64,
    pub deleted: bool,
    /// The resource's state after the change (JSON; null for a tombstone of a resource
    /// whose state was never seen).
    pub state: Value,
    /// `webhook` or `reconcile`.
    pub origin: String,
    /// The event that made the change (webhook path).
    pub event_id: Option<String>,
    pub changed_at: String,
}

impl TryFrom<ChangeRow> for FeedChange {
    type Error = DbError;

    /// A stored state that is not JSON is an error, never a silent `null`: the
    /// application would take it for a tombstone's missing state.
    fn try_from(r: ChangeRow) -> Result<Self, DbError> {
        let state = match r.state.as_deref() {
            None => Value::Null,
            Some(text) => serde_json::from_str(text).map_err(|e| {
                DbError::Task(format!(
                    "change {} ({}/{} {}): its stored state is not JSON ({e}); \
                     the row was changed outside webhook-reconciler",
                    r.seq, r.source, r.kind, r.id
                ))
            })?,
        };
        Ok(FeedChange {
            seq: r.seq,
            source: r.source,
            account: r.account,
            kind: r.kind,
            id: r.id,
            version: r.version,
            deleted: r.deleted,
            state,
            origin: r.origin,
            event_id: r.event_id,
            changed_at: r.changed_at,
        })
    }
}

/// A read of the feed.
#[derive(Debug, Clone, Default)]
pub struct FeedPage {
    pub changes: Vec<FeedChange>,
    /// More changes wait after this page (the read stopped at its row or byte bound).
    pub more: bool,
}

/// Which changes a reader wants.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub sources: Vec<String>,
    pub kinds: Vec<String>,
}

impl From<&ConsumerConfig> for Filter {
    fn from(c: &ConsumerConfig) -> Self {
        Filter {
            sources: c.sources.clone(),
            kinds: c.kinds.clone(),
        }
    }
}

/// Most changes one read returns.
/// Why a rewind was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rewind {
    #[error("seq {to} is past the feed's end ({last})")]
    PastTheEnd { to: i64, last: i64 },
    #[error("changes after seq {to} are no longer all kept: the oldest kept is {oldest}; rewind to {} or later", oldest - 1)]
    Pruned { to: i64, oldest: i64 },
}

pub const MAX_PAGE: i64 = 1000;
/// Most bytes of states one read returns, past its first change: a read of many large
/// states would hold them all in memory at once (and a push batch, all of them).
pub const MAX_READ_BYTES: i64 = 4 << 20;

/// Reads the feed. Cheap to clone.
#[derive(Clone)]
pub struct Feed {
    db: Db,
}

impl Feed {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Changes with seq > `after`, oldest first, at most `limit` (capped at [`MAX_PAGE`])
    /// and about [`MAX_READ_BYTES`] of states (at least one change).
    pub async fn after(
        &self,
        after: i64,
        limit: i64,
        filter: &Filter,
    ) -> Result<Vec<FeedChange>, DbError> {
        Ok(self.page(after, limit, filter).await?.changes)
    }

    /// [`Self::after`], saying whether more changes wait after the page: a page may be
    /// short because the feed ends there, or because its byte budget cut it.
    pub async fn page(&self, after: i64, limit: i64, filter: &Filter) -> Result<FeedPage, DbError> {
        let (filter, limit) = (filter.clone(), limit.clamp(1, MAX_PAGE));
        let rows = self
            .db
            .read(move |c| {
                sql::changes_after(
                    c,
                    after,
                    limit,
                    MAX_READ_BYTES,
                    &filter.sources,
                    &filter.kinds,
                )
            })
            .await?;
        let listed = rows.first().map_or(0, |r| r.listed);
        let more = listed >= limit || (rows.len() as i64) < listed;
        let changes = rows
            .into_iter()
            .map(FeedChange::try_from)
            .collect::<Result<_, _>>()?;
        Ok(FeedPage { changes, more })
    }

    /// The highest seq committed so far (every lower one is committed too).
    pub async fn last_seq(&self) -> Result<i64, DbError> {
        self.db.read(sql::last_seq).await
    }

    /// A consumer's position: every change up to it was delivered.
    pub async fn position(&self, consumer: &str) -> Result<i64, DbError> {
        let consumer = consumer.to_string();
        self.db
            .read(move |c| sql::consumer_position(c, &consumer))
            .await
    }

    /// A consumer's position, first set to the feed's current end when it has none
    /// and `start` says `now`.
    pub async fn position_or_start(
        &self,
        consumer: &str,
        start: ConsumerStart,
    ) -> Result<i64, DbError> {
        if start == ConsumerStart::Now {
            let name = consumer.to_string();
            self.db
                .write(move |c| sql::start_consumer_now(c, &name))
                .await?;
        }
        self.position(consumer).await
    }

    /// Moves `consumer`'s position to `position`, in a transaction fenced on the
    /// consumer's lease: when the lease is no longer ours, nothing moves.
    /// Ok(false): the position was moved by an operator meanwhile (it stays there).
    pub async fn advance(
        &self,
        consumer: &str,
        from: i64,
        position: i64,
        fence: Fence,
    ) -> Result<Result<bool, LeaseLost>, DbError> {
        let consumer = consumer.to_string();
        self.db
            .write(move |c| {
                if let Err(lost) = fence.check(c)? {
                    return Ok(Err(lost));
                }
                Ok(Ok(sql::advance_consumer(c, &consumer, from, position)?))
            })
            .await
    }

    /// A consumer's position, and whether an operator paused it.
    pub async fn state(&self, consumer: &str) -> Result<(i64, bool), DbError> {
        let consumer = consumer.to_string();
        self.db
            .read(move |c| sql::consumer_state(c, &consumer))
            .await
    }

    /// Every consumer the database has a position for.
    pub async fn consumer_rows(&self) -> Result<Vec<ConsumerRow>, DbError> {
        self.db.read(sql::consumer_rows).await
    }

    pub async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), DbError> {
        let consumer = consumer.to_string();
        self.db
            .write(move |c| sql::set_consumer_paused(c, &consumer, paused))
            .await
    }

    /// Moves `consumer` back to `to` (changes after it are pushed again), refused when
    /// a change it would need is no longer kept or `to` is past the feed's end; in one
    /// transaction with the check. Returns the position it had.
    pub async fn rewind(&self, consumer: &str, to: i64) -> Result<Result<i64, Rewind>, DbError> {
        let consumer = consumer.to_string();
        self.db
            .write(move |c| {
                let last = sql::last_seq(c)?;
                if to > last || to < 0 {
                    return Ok(Err(Rewind::PastTheEnd { to, last }));
                }
                // Changes after `to` must all be kept: the oldest kept is at most to + 1.
                let oldest = sql::oldest_seq(c)?.unwrap_or(last + 1);
                if to + 1 < oldest {
                    return Ok(Err(Rewind::Pruned { to, oldest }));
                }
                let from = sql::consumer_position(c, &consumer)?;
                sql::set_consumer_position(c, &consumer, to)?;
                Ok(Ok(from))
            })
            .await
    }

    /// The kept changes of one resource, in order.
    pub async fn changes_of(
        &self,
        key: &crate::change::ResourceKey,
        limit: i64,
    ) -> Result<Vec<ResourceChange>, DbError> {
        let key = key.clone();
        self.db.read(move |c| sql::changes_of(c, &key, limit)).await
    }

    /// Records that `consumer` skipped change `seq` after `attempts` (`on_failure =
    /// "skip"`), with the last error.
    pub async fn record_skip(
        &self,
        consumer: &str,
        seq: i64,
        attempts: u32,
        error: &str,
    ) -> Result<(), DbError> {
        let (name, error) = (consumer.to_string(), error.to_string());
        let attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
        self.db
            .write(move |c| sql::record_consumer_skip(c, &name, seq, attempts, &error))
            .await
    }

    /// How far `consumer` is behind.
    pub async fn lag(&self, consumer: &ConsumerConfig) -> Result<Lag, DbError> {
        let (name, filter) = (consumer.name.clone(), Filter::from(consumer));
        self.db
            .read(move |c| {
                let position = sql::consumer_position(c, &name)?;
                sql::consumer_lag(c, position, &filter.sources, &filter.kinds)
            })
            .await
    }

    /// Deletes changes older than `age` that every consumer in `consumers` has, in
    /// batches of `batch`; returns how many.
    pub async fn prune(
        &self,
        consumers: &[ConsumerConfig],
        age: std::time::Duration,
        batch: i64,
    ) -> Result<i64, DbError> {
        let names: Vec<String> = consumers.iter().map(|c| c.name.clone()).collect();
        let mut total = 0;
        loop {
            // What every consumer has is read in each batch's own transaction, so a
            // consumer rewound meanwhile keeps what it now needs.
            let names = names.clone();
            let n = self
                .db
                .write(move |c| {
                    let acknowledged = if names.is_empty() {
                        sql::last_seq(c)?
                    } else {
                        sql::lowest_position(c, &names)?
                    };
                    sql::prune_changes(c, age.as_secs_f64(), acknowledged, batch)
                })
                .await? as i64;
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
    }
}

//! The change feed: what the application acts on. Every write that changes a resource
//! appends one row to `changes` in its own transaction (a trigger fills
//! `change_pending`; `store` numbers them last, under a lock held to commit, so `seq`
//! grows in visibility order). This module reads the feed: for `GET /changes`, the
//! `changes` command, and `push`, which delivers it to the configured consumers.
//!
//! Invariant: only this module reads `changes` and writes `consumer_positions` and
//! `consumer_skips`; a consumer's position only moves forward, and only past changes
//! its application answered 2xx (or that `on_failure = "skip"` recorded).

pub mod push;

use serde::Serialize;
use serde_json::Value;

use crate::config::ConsumerConfig;
use crate::db::sql::{self, ChangeRow, Lag};
use crate::db::{Db, DbError};

/// One change as the application sees it (pushed body, pulled item, printed line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeedChange {
    pub seq: i64,
    pub source: String,
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

impl From<ChangeRow> for FeedChange {
    fn from(r: ChangeRow) -> Self {
        FeedChange {
            seq: r.seq,
            source: r.source,
            kind: r.kind,
            id: r.id,
            version: r.version,
            deleted: r.deleted,
            state: r
                .state
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok())
                .unwrap_or(Value::Null),
            origin: r.origin,
            event_id: r.event_id,
            changed_at: r.changed_at,
        }
    }
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
pub const MAX_PAGE: i64 = 1000;

/// Reads the feed. Cheap to clone.
#[derive(Clone)]
pub struct Feed {
    db: Db,
}

impl Feed {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Changes with seq > `after`, oldest first, at most `limit` (capped at [`MAX_PAGE`]).
    pub async fn after(
        &self,
        after: i64,
        limit: i64,
        filter: &Filter,
    ) -> Result<Vec<FeedChange>, DbError> {
        let (filter, limit) = (filter.clone(), limit.clamp(1, MAX_PAGE));
        let rows = self
            .db
            .read(move |c| sql::changes_after(c, after, limit, &filter.sources, &filter.kinds))
            .await?;
        Ok(rows.into_iter().map(FeedChange::from).collect())
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
        let acknowledged = self
            .db
            .read(move |c| {
                if names.is_empty() {
                    sql::last_seq(c)
                } else {
                    sql::lowest_position(c, &names)
                }
            })
            .await?;
        let mut total = 0;
        loop {
            let n = self
                .db
                .write(move |c| sql::prune_changes(c, age.as_secs_f64(), acknowledged, batch))
                .await? as i64;
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
    }
}

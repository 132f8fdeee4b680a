//! The guarded write: the one place that writes `processed_events` and `resources`.
//! Both flows end here — webhooks through [`Store::apply_event`], reconciliation through
//! [`Store::apply_batch`] — and both go through the same versioned upsert.
//!
//! Invariant: an event's claim and its effect commit in one transaction. There is no
//! "have I seen this id?" read anywhere: the primary key of `processed_events` decides.

pub mod guard;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::change::{Change, Origin};
use crate::db::sql::{self, Guard, MAX_BATCH_ROWS};
use crate::db::{Db, DbError};

/// What happened to one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Claimed, and the state written.
    Applied,
    /// The event id was claimed before: a retry of something done.
    Duplicate,
    /// Claimed; the stored version is newer (or equal with the same state).
    Stale,
    /// Claimed; equal version with a different state. Kept as is, resolved from the
    /// sender's current state.
    Conflict,
    /// Claimed; the event type is not mapped to any kind.
    Ignored,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Conflict => "conflict",
            Outcome::Ignored => "ignored",
        }
    }
}

/// One authentic webhook event, ready to apply.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    /// `None` when the event type is not mapped: the event is claimed as `ignored`.
    pub change: Option<Change>,
}

/// The guarded write over a database handle. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
}

impl Store {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Claims the event id and applies its change under the version guard, in one
    /// transaction.
    pub async fn apply_event(&self, delivery: Delivery) -> Result<Outcome, DbError> {
        self.db
            .write(move |conn| apply_event(conn, &delivery))
            .await
    }

    /// Applies many states (a reconcile page) in one transaction under the reconcile
    /// guard: newer versions, or equal versions whose state differs. Returns the ids
    /// written. For a repeated id only the highest version is considered.
    pub async fn apply_batch(&self, changes: Vec<Change>) -> Result<Vec<String>, DbError> {
        self.db.write(move |conn| apply_batch(conn, &changes)).await
    }

    /// Keeps an authentic delivery that could not be read, with the reason.
    pub async fn dead_letter(
        &self,
        source: String,
        event_id: String,
        event_type: String,
        reason: String,
        body: String,
    ) -> Result<(), DbError> {
        self.db
            .write(move |conn| {
                sql::record_dead_letter(conn, &source, &event_id, &event_type, &reason, &body)
            })
            .await
    }
}

fn apply_event(conn: &mut crate::db::Conn, d: &Delivery) -> diesel::QueryResult<Outcome> {
    // The common case is recorded up front as `applied`; the rare stale / conflict
    // corrects it below, which keeps the usual path at two statements.
    let provisional = if d.change.is_some() {
        Outcome::Applied
    } else {
        Outcome::Ignored
    };
    if !sql::claim_event(
        conn,
        &d.source,
        &d.event_id,
        &d.event_type,
        provisional.as_str(),
    )? {
        return Ok(Outcome::Duplicate);
    }
    let Some(change) = &d.change else {
        return Ok(Outcome::Ignored);
    };
    if sql::upsert_one(
        conn,
        change,
        Origin::Webhook,
        Some(&d.event_id),
        Guard::NewerOnly,
    )? {
        return Ok(Outcome::Applied);
    }
    // The upsert found the row and left it alone; it exists, and it is locked by the
    // upsert on PostgreSQL (SQLite holds the write lock), so this read is current.
    let outcome = match sql::stored_resource(conn, &change.source, &change.kind, &change.id)? {
        Some(stored) => guard::classify_unapplied(&stored, change),
        None => Outcome::Conflict,
    };
    sql::set_event_outcome(conn, &d.source, &d.event_id, outcome.as_str())?;
    Ok(outcome)
}

fn apply_batch(conn: &mut crate::db::Conn, changes: &[Change]) -> diesel::QueryResult<Vec<String>> {
    // One row per resource (PostgreSQL refuses to update a row twice in one statement),
    // in key order so that two batches lock rows in the same order and cannot deadlock.
    let mut latest: BTreeMap<(&str, &str, &str), &Change> = BTreeMap::new();
    for ch in changes {
        let key = (ch.source.as_str(), ch.kind.as_str(), ch.id.as_str());
        match latest.get(&key) {
            Some(prev) if prev.version >= ch.version => {}
            _ => {
                latest.insert(key, ch);
            }
        }
    }
    let rows: Vec<&Change> = latest.into_values().collect();
    let mut written = Vec::new();
    for chunk in rows.chunks(MAX_BATCH_ROWS) {
        written.extend(sql::upsert_many(
            conn,
            chunk,
            Origin::Reconcile,
            Guard::NewerOrDifferent,
        )?);
    }
    Ok(written)
}

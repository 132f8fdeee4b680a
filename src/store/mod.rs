//! The guarded write: the one place that writes `processed_events` and `resources`.
//! Both flows end here — webhooks through [`Store::apply_event`], reconciliation through
//! [`Store::apply_batch`] — and both go through the same versioned upsert
//! (`db::sql::upsert_sql`), differing only in the tie rule ([`Guard`]).
//!
//! Invariant: an event's claim and its effect commit in one transaction. There is no
//! "have I seen this id?" read anywhere: the primary key of `processed_events` decides.

mod group_commit;
pub mod guard;
pub mod retention;

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::change::{Change, Origin};
use crate::config::Backend;
use crate::db::sql::{self, Claim, Guard, Key, MAX_BATCH_ROWS};
use crate::db::{Conn, Db, DbError};
use group_commit::GroupCommit;

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

impl Delivery {
    fn event_key(&self) -> (&str, &str) {
        (&self.source, &self.event_id)
    }

    fn resource_key(&self) -> Option<(&str, &str, &str)> {
        self.change
            .as_ref()
            .map(|c| (c.source.as_str(), c.kind.as_str(), c.id.as_str()))
    }
}

/// The guarded write over a database handle. Cheap to clone; must be created inside a
/// tokio runtime (it starts the group-commit writers).
#[derive(Clone)]
pub struct Store {
    db: Db,
    commits: GroupCommit,
}

impl Store {
    pub fn new(db: Db) -> Self {
        let writers = match db.backend() {
            // SQLite has one writer anyway.
            Backend::Sqlite => 1,
            Backend::Postgres => group_commit::POSTGRES_WRITERS,
        };
        let commits = GroupCommit::start(db.clone(), writers);
        Self { db, commits }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Claims the event id and applies its change under the version guard, in one
    /// transaction. Deliveries arriving together share a transaction (group commit):
    /// see `group_commit`.
    pub async fn apply_event(&self, delivery: Delivery) -> Result<Outcome, DbError> {
        self.commits.submit(delivery).await
    }

    /// Applies many states (a reconcile page) in one transaction under the reconcile
    /// guard: newer versions, or equal versions whose state differs. Returns the keys
    /// written. For a repeated key only the highest version is considered.
    pub async fn apply_batch(&self, changes: Vec<Change>) -> Result<Vec<Key>, DbError> {
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

/// Applies deliveries in the caller's transaction and returns their outcomes in order.
/// The deliveries have distinct event ids and distinct resources (`group_commit`
/// guarantees it). Locks are taken claims first, then resources, each in key order, so
/// concurrent transactions cannot deadlock on each other.
fn apply_deliveries(conn: &mut Conn, deliveries: &[Delivery]) -> diesel::QueryResult<Vec<Outcome>> {
    let mut by_event: Vec<&Delivery> = deliveries.iter().collect();
    by_event.sort_by(|a, b| a.event_key().cmp(&b.event_key()));
    let claims: Vec<Claim<'_>> = by_event
        .iter()
        .map(|d| Claim {
            source: &d.source,
            event_id: &d.event_id,
            event_type: &d.event_type,
            // The common case, recorded up front; stale and conflict are corrected
            // below, in this same transaction.
            outcome: if d.change.is_some() {
                "applied"
            } else {
                "ignored"
            },
        })
        .collect();
    let taken = sql::claim_many(conn, &claims)?;
    let claimed: HashSet<(&str, &str)> = taken
        .iter()
        .map(|(s, e)| (s.as_str(), e.as_str()))
        .collect();
    let is_claimed = |d: &Delivery| claimed.contains(&d.event_key());

    let mut rows: Vec<(&Change, Option<&str>)> = deliveries
        .iter()
        .filter(|d| is_claimed(d))
        .filter_map(|d| d.change.as_ref().map(|c| (c, Some(d.event_id.as_str()))))
        .collect();
    rows.sort_by(|a, b| (&a.0.source, &a.0.kind, &a.0.id).cmp(&(&b.0.source, &b.0.kind, &b.0.id)));
    let mut upserted: Vec<Key> = Vec::new();
    for chunk in rows.chunks(MAX_BATCH_ROWS) {
        upserted.extend(sql::upsert_many(
            conn,
            chunk,
            Origin::Webhook,
            Guard::NewerOnly,
        )?);
    }
    let written: HashSet<(&str, &str, &str)> = upserted
        .iter()
        .map(|(s, k, i)| (s.as_str(), k.as_str(), i.as_str()))
        .collect();

    let mut outcomes = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let outcome = match (&d.change, is_claimed(d)) {
            (_, false) => Outcome::Duplicate,
            (None, true) => Outcome::Ignored,
            (Some(c), true)
                if written.contains(&(c.source.as_str(), c.kind.as_str(), c.id.as_str())) =>
            {
                Outcome::Applied
            }
            (Some(c), true) => {
                // The guard left the row alone, so it exists and this transaction holds
                // its lock (PostgreSQL) or the database's (SQLite): the read is current.
                let outcome = match sql::stored_resource(conn, &c.source, &c.kind, &c.id)? {
                    Some(stored) => guard::classify_unapplied(&stored, c),
                    None => Outcome::Conflict,
                };
                sql::set_event_outcome(conn, &d.source, &d.event_id, outcome.as_str())?;
                outcome
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

fn apply_batch(conn: &mut Conn, changes: &[Change]) -> diesel::QueryResult<Vec<Key>> {
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
    let rows: Vec<(&Change, Option<&str>)> = latest.into_values().map(|c| (c, None)).collect();
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

impl Store {
    /// Marks deleted the live rows of `ids` not written since `before` (deletion
    /// detection after a complete sweep). Returns how many were marked.
    pub async fn tombstone(
        &self,
        source: String,
        kind: String,
        ids: Vec<String>,
        before: String,
    ) -> Result<usize, DbError> {
        self.db
            .write(move |conn| {
                let mut n = 0;
                for chunk in ids.chunks(sql::MAX_IN_LIST) {
                    let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    n += sql::tombstone(conn, &source, &kind, &refs, &before)?;
                }
                Ok(n)
            })
            .await
    }
}

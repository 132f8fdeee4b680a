//! A webhook group's claim and guarded upsert in one PostgreSQL statement.
//!
//! The two-statement path (claim, then upsert the claimed, then read and relabel the
//! refused) costs a group four round trips and a second version of every stale event's
//! claim row. Here the claim records the outcome the stored version predicts, read in the
//! same statement's snapshot, and the upsert takes its rows from the claim's RETURNING:
//! one round trip, and the common outcomes (applied, stale by a newer stored version)
//! are right the first time. The caller relabels the rest under the rows' locks.
//!
//! Locks keep the order of the two-statement path: every claim (in event order, as the
//! caller passes them) before any resource row (the `ORDER BY` over the claim's output
//! cannot emit a row before the claim has run to the end; rows in resource key order,
//! by the rank the caller computed), so two groups cannot deadlock.

use diesel::RunQueryDsl;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};

use super::resources::{RESOURCE_COLUMNS, conflict_clause};
use crate::change::tie::Guard;
use crate::change::{Change, Origin, ResourceKey};
use crate::config::{Action, Backend};
use crate::db::sql::{prepared, query};
use crate::store::Outcome;

/// One event of the group: its claim and, if mapped, its change with the rank of its
/// resource in key order.
pub(crate) struct ClaimWrite<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub body_digest: Option<&'a str>,
    pub change: Option<(&'a Change, i32)>,
    /// A delivery whose state is fetched (claimed `fetching`): the resource it names.
    pub fetch: Option<ResourceKey<&'a str>>,
}

impl<'a> ClaimWrite<'a> {
    fn change(&self) -> Option<&'a Change> {
        self.change.map(|(c, _)| c)
    }

    /// The resource the claim names: the change's, or the one to fetch.
    fn resource(&self) -> Option<ResourceKey<&'a str>> {
        self.change().map(Change::key).or(self.fetch)
    }
}

/// A claim this statement took: the outcome it recorded, and whether its change was
/// written.
#[derive(diesel::QueryableByName)]
pub(crate) struct ClaimWritten {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub event_id: String,
    #[diesel(sql_type = Text)]
    pub outcome: String,
    #[diesel(sql_type = Bool)]
    pub written: bool,
}

impl ClaimWritten {
    pub fn recorded(&self) -> Outcome {
        match self.outcome.as_str() {
            "applied" => Outcome::Applied,
            "stale" => Outcome::Stale,
            "ignored" => Outcome::Ignored,
            "fetching" => Outcome::Fetching,
            _ => Outcome::Conflict,
        }
    }
}

/// Claims the events and upserts the claimed changes under [`Guard::NewerOnly`]. The
/// recorded outcome is `ignored` without a change or a resource to fetch, `fetching`
/// with only the latter; else `applied` when the snapshot has
/// no row or an older version, `stale` when it has a newer one, `conflict` when the
/// versions are equal (the caller decides those by the row it then holds locked).
/// Callers pass events sorted by `(source, event_id)`, distinct, with distinct resources.
pub(crate) fn claim_and_write(
    conn: &mut diesel::PgConnection,
    events: &[ClaimWrite<'_>],
) -> diesel::QueryResult<Vec<ClaimWritten>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let sources: Vec<&str> = events.iter().map(|e| e.source).collect();
    let ids: Vec<&str> = events.iter().map(|e| e.event_id).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type).collect();
    let body_digests: Vec<Option<&str>> = events.iter().map(|e| e.body_digest).collect();
    let accounts: Vec<&str> = events
        .iter()
        .map(|e| e.resource().map_or("", |r| r.account))
        .collect();
    let kinds: Vec<Option<&str>> = events
        .iter()
        .map(|e| e.resource().map(|r| r.kind))
        .collect();
    let resource_ids: Vec<Option<&str>> =
        events.iter().map(|e| e.resource().map(|r| r.id)).collect();
    let versions: Vec<Option<i64>> = events
        .iter()
        .map(|e| e.change().map(|c| c.version))
        .collect();
    let states: Vec<Option<&str>> = events
        .iter()
        .map(|e| e.change().and_then(|c| c.state.as_deref()))
        .collect();
    let deleted: Vec<Option<bool>> = events
        .iter()
        .map(|e| e.change().map(|c| c.action == Action::Delete))
        .collect();
    let digests: Vec<Option<i64>> = events
        .iter()
        .map(|e| {
            e.change()
                .and_then(|c| c.state.as_deref())
                .map(crate::change::state_digest)
        })
        .collect();
    let ranks: Vec<Option<i32>> = events.iter().map(|e| e.change.map(|(_, r)| r)).collect();
    prepared(
        query(Backend::Postgres, &statement())
            .bind::<Array<Text>, _>(sources)
            .bind::<Array<Text>, _>(ids)
            .bind::<Array<Text>, _>(types)
            .bind::<Array<Nullable<Text>>, _>(body_digests)
            .bind::<Array<Text>, _>(accounts)
            .bind::<Array<Nullable<Text>>, _>(kinds)
            .bind::<Array<Nullable<Text>>, _>(resource_ids)
            .bind::<Array<Nullable<BigInt>>, _>(versions)
            .bind::<Array<Nullable<Text>>, _>(states)
            .bind::<Array<Nullable<Bool>>, _>(deleted)
            .bind::<Array<Nullable<BigInt>>, _>(digests)
            .bind::<Array<Nullable<Integer>>, _>(ranks)
            .bind::<Text, _>(Origin::Webhook.as_str()),
    )
    .load(conn)
}

fn statement() -> String {
    format!(
        "WITH i AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::text[], $8::int8[], $9::text[], $10::bool[], $11::int8[], $12::int4[]) \
           WITH ORDINALITY AS i(source, event_id, event_type, body_digest, account, kind, id, version, \
           state, deleted, state_digest, rank, n)), \
         claimed AS (INSERT INTO processed_events (source, event_id, event_type, outcome, body_digest, account, kind, resource_id) \
           SELECT i.source, i.event_id, i.event_type, \
             CASE WHEN i.kind IS NULL THEN 'ignored' \
                  WHEN i.version IS NULL THEN 'fetching' \
                  WHEN r.version IS NULL OR r.version < i.version THEN 'applied' \
                  WHEN r.version > i.version THEN 'stale' \
                  ELSE 'conflict' END, \
             i.body_digest, i.account, i.kind, i.id \
           FROM i LEFT JOIN LATERAL (SELECT version FROM resources \
             WHERE source = i.source AND account = i.account AND kind = i.kind AND id = i.id LIMIT 1) r ON true \
           ORDER BY i.n \
           ON CONFLICT DO NOTHING RETURNING source, event_id, outcome), \
         written AS ({RESOURCE_COLUMNS} \
           SELECT i.source, i.account, i.kind, i.id, i.version, i.state::jsonb, i.deleted, $13, i.event_id, i.state_digest \
           FROM i JOIN claimed c ON c.source = i.source AND c.event_id = i.event_id \
           WHERE i.version IS NOT NULL ORDER BY i.rank{} \
           RETURNING source, account, kind, id) \
         SELECT c.source, c.event_id, c.outcome, w.id IS NOT NULL AS written \
         FROM claimed c JOIN i ON i.source = c.source AND i.event_id = c.event_id \
         LEFT JOIN written w ON w.source = i.source AND w.account = i.account AND w.kind = i.kind AND w.id = i.id",
        conflict_clause(Backend::Postgres, Guard::NewerOnly)
    )
}

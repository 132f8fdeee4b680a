//! The transactions' insides: a webhook group's claims and guarded write (one statement
//! on PostgreSQL, claim then upsert on SQLite, then the outcomes the guard decided) and
//! a reconcile batch's guarded upsert. Each runs in the caller's transaction.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::sql::fetches::{FetchReason, FetchRequest};
use super::sql::{self, Claim, MAX_BATCH_ROWS};
use super::{Delivery, Outcome, StoredRow, guard};
use crate::change::tie::Guard;
use crate::change::{Change, Key, Origin, ResourceKey};
use crate::db::Conn;
use crate::db::sql::MAX_IN_LIST;
use crate::feed::outbox::{self, Published};

/// Applies deliveries in the caller's transaction and returns their outcomes in order.
/// The deliveries have distinct event ids and distinct resources (`group_commit`
/// guarantees it). Locks are taken claims first, then resources, each in key order, so
/// concurrent transactions cannot deadlock on each other.
pub(super) fn apply_deliveries(
    conn: &mut Conn,
    deliveries: &[Delivery],
) -> diesel::QueryResult<(Vec<Outcome>, Published)> {
    let mut by_event: Vec<&Delivery> = deliveries.iter().collect();
    by_event.sort_by(|a, b| a.event_key().cmp(&b.event_key()));
    let (recorded, upserted) = match conn {
        Conn::Postgres(c) => claim_and_write(c, &by_event)?,
        Conn::Sqlite(_) => claim_then_write(conn, &by_event)?,
    };
    let written: HashSet<ResourceKey<&str>> = upserted.iter().map(ResourceKey::as_ref).collect();
    let recorded_of = |d: &Delivery| recorded.get(&d.event_key()).copied();

    // Claimed changes not written whose recorded label may be wrong: their rows exist
    // and this transaction holds their locks (PostgreSQL) or the database's (SQLite), so
    // one read per kind is current. A `stale` recorded from a newer stored version
    // stays true: the guard only lets versions rise, and a row gone would have been
    // written.
    let unsure: Vec<&Delivery> = deliveries
        .iter()
        .filter(|d| recorded_of(d).is_some_and(|o| o != Outcome::Stale))
        .filter(|d| {
            d.change
                .as_ref()
                .is_some_and(|c| !written.contains(&c.key()))
        })
        .collect();
    let mut by_kind: BTreeMap<Key, Vec<&str>> = BTreeMap::new();
    for d in &unsure {
        if let Some(c) = &d.change {
            let key = Key::new(c.source.as_str(), c.kind.as_str()).in_account(c.account.as_str());
            by_kind.entry(key).or_default().push(&c.id);
        }
    }
    let mut stored: HashMap<ResourceKey, StoredRow> = HashMap::new();
    for (key, ids) in by_kind {
        for chunk in ids.chunks(MAX_IN_LIST) {
            for row in sql::stored_rows(conn, &key, chunk)? {
                stored.insert(key.resource(row.id.clone()), row);
            }
        }
    }
    let mut labels: BTreeMap<(&str, &'static str), (Outcome, Vec<&str>)> = BTreeMap::new();
    let mut outcomes = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        let Some(recorded) = recorded_of(d) else {
            outcomes.push(Outcome::Duplicate);
            continue;
        };
        let outcome = match &d.change {
            None if d.fetch.is_some() => Outcome::Fetching,
            None => Outcome::Ignored,
            Some(c) if written.contains(&c.key()) => Outcome::Applied,
            Some(_) if recorded == Outcome::Stale => Outcome::Stale,
            Some(c) => {
                let row = stored.get(&c.key().to_owned());
                guard::classify_unapplied(row.map(|s| s.view()), c)
            }
        };
        if outcome != recorded {
            labels
                .entry((d.source.as_str(), outcome.as_str()))
                .or_insert_with(|| (outcome, Vec::new()))
                .1
                .push(&d.event_id);
        }
        outcomes.push(outcome);
    }
    for ((source, _), (outcome, ids)) in labels {
        for chunk in ids.chunks(MAX_IN_LIST) {
            sql::set_event_outcomes(conn, source, chunk, outcome)?;
        }
    }
    // What the 200 leaves to do, in the claim's transaction: after resources, in key
    // order (a fetch's write locks its resource, then its pending row).
    let mut fetches: Vec<FetchRequest<'_>> = deliveries
        .iter()
        .zip(&outcomes)
        .filter_map(|(d, outcome)| {
            let (key, reason) = match (outcome, &d.fetch, &d.change) {
                (Outcome::Fetching, Some(k), _) => (k.as_ref(), FetchReason::Fetching),
                (Outcome::Conflict, _, Some(c)) if d.settle_conflict => {
                    (c.key(), FetchReason::Conflict)
                }
                _ => return None,
            };
            Some(FetchRequest {
                key,
                event_id: Some(&d.event_id),
                reason,
            })
        })
        .collect();
    fetches.sort_by(|a, b| a.key.cmp(&b.key));
    sql::fetches::request(conn, &fetches)?;
    // Last in the transaction (on SQLite the feed's seqs are handed out here). A group of
    // duplicates and stale events wrote no row and has nothing to publish.
    let published = outbox::publish(conn, upserted.len())?;
    Ok((outcomes, published))
}

/// The outcome each claim taken recorded, by event key, and the resources written.
type Claimed<'d> = (HashMap<(&'d str, &'d str), Outcome>, Vec<ResourceKey>);

/// PostgreSQL: the claims and the guarded upsert in one statement (`sql::claim_and_write`).
fn claim_and_write<'d>(
    conn: &mut diesel::PgConnection,
    by_event: &[&'d Delivery],
) -> diesel::QueryResult<Claimed<'d>> {
    let mut by_resource: Vec<&Delivery> = by_event
        .iter()
        .copied()
        .filter(|d| d.change.is_some())
        .collect();
    by_resource.sort_by(|a, b| a.resource_key().cmp(&b.resource_key()));
    let rank: HashMap<(&str, &str), i32> = by_resource
        .iter()
        .enumerate()
        .map(|(i, d)| (d.event_key(), i as i32))
        .collect();
    let events: Vec<sql::ClaimWrite<'_>> = by_event
        .iter()
        .map(|d| sql::ClaimWrite {
            source: &d.source,
            event_id: &d.event_id,
            event_type: &d.event_type,
            body_digest: d.body_digest.as_deref(),
            change: d.change.as_ref().map(|c| (c, rank[&d.event_key()])),
            fetch: d.fetch.as_ref().map(ResourceKey::as_ref),
        })
        .collect();
    let taken = sql::claim_and_write(conn, &events)?;
    let by_key: HashMap<(&str, &str), &'d Delivery> =
        by_event.iter().map(|d| (d.event_key(), *d)).collect();
    let mut recorded = HashMap::with_capacity(taken.len());
    let mut upserted = Vec::new();
    for row in &taken {
        let Some(d) = by_key.get(&(row.source.as_str(), row.event_id.as_str())) else {
            continue;
        };
        recorded.insert(d.event_key(), row.recorded());
        if row.written {
            if let Some(c) = &d.change {
                upserted.push(c.key().to_owned());
            }
        }
    }
    Ok((recorded, upserted))
}

/// SQLite: the claims, then the claimed changes' guarded upsert. Each claim records the
/// common outcome (applied, or ignored without a change).
fn claim_then_write<'d>(
    conn: &mut Conn,
    by_event: &[&'d Delivery],
) -> diesel::QueryResult<Claimed<'d>> {
    let claims: Vec<Claim<'_>> = by_event
        .iter()
        .map(|d| Claim {
            source: &d.source,
            event_id: &d.event_id,
            event_type: &d.event_type,
            outcome: match (&d.change, &d.fetch) {
                (Some(_), _) => Outcome::Applied,
                (None, Some(_)) => Outcome::Fetching,
                (None, None) => Outcome::Ignored,
            },
            body_digest: d.body_digest.as_deref(),
            resource: d
                .change
                .as_ref()
                .map(|c| c.key())
                .or(d.fetch.as_ref().map(ResourceKey::as_ref)),
        })
        .collect();
    let taken = sql::claim_many(conn, &claims)?;
    let taken: HashSet<(&str, &str)> = taken
        .iter()
        .map(|(s, e)| (s.as_str(), e.as_str()))
        .collect();
    let (claimed, recorded): (Vec<&'d Delivery>, HashMap<_, _>) = by_event
        .iter()
        .zip(&claims)
        .filter(|(d, _)| taken.contains(&d.event_key()))
        .map(|(d, claim)| (*d, (d.event_key(), claim.outcome)))
        .unzip();
    let mut rows: Vec<(&Change, Option<&str>)> = claimed
        .iter()
        .filter_map(|d| d.change.as_ref().map(|c| (c, Some(d.event_id.as_str()))))
        .collect();
    rows.sort_by(|a, b| a.0.key().cmp(&b.0.key()));
    let mut upserted = Vec::new();
    for chunk in rows.chunks(MAX_BATCH_ROWS) {
        upserted.extend(sql::upsert_many(
            conn,
            chunk,
            Origin::Webhook,
            Guard::NewerOnly,
        )?);
    }
    Ok((recorded, upserted))
}

pub(super) fn apply_batch(
    conn: &mut Conn,
    changes: &[Change],
    guard: Guard,
) -> diesel::QueryResult<Vec<ResourceKey>> {
    // One row per resource (PostgreSQL refuses to update a row twice in one statement),
    // in key order so that two batches lock rows in the same order and cannot deadlock.
    let mut latest: BTreeMap<ResourceKey<&str>, &Change> = BTreeMap::new();
    for ch in changes {
        let key = ch.key();
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
        written.extend(sql::upsert_many(conn, chunk, Origin::Reconcile, guard)?);
    }
    Ok(written)
}

//! `processed_events` (the claim that makes a delivery idempotent) and `dead_letters`.

use diesel::RunQueryDsl;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text};

use crate::config::Backend;
use crate::db::sql::{minus_seconds, now, prepared, query};
use crate::db::{Conn, on_conn};
use crate::store::Outcome;

/// The claim statement for `rows` events: `(source, event_id, event_type, outcome,
/// body_digest, account, kind, resource_id)` per row; returns the `(source, event_id)` pairs this statement
/// claimed. No conflict target: an event id claimed before, or (github, shopify) a body
/// claimed before under another id, is a duplicate alike.
pub(crate) fn claim_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO processed_events (source, event_id, event_type, outcome, body_digest, account, kind, resource_id) VALUES ",
    );
    for r in 0..rows {
        if r > 0 {
            sql.push(',');
        }
        let p = r * CLAIM_COLUMNS;
        let row: Vec<String> = (1..=CLAIM_COLUMNS).map(|i| format!("${}", p + i)).collect();
        sql.push_str(&format!("({})", row.join(", ")));
    }
    sql.push_str(" ON CONFLICT DO NOTHING RETURNING source, event_id");
    sql
}

/// Values per claimed row.
pub(crate) const CLAIM_COLUMNS: usize = 8;

/// One event to claim, with the outcome recorded if the claim is taken.
pub struct Claim<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub outcome: Outcome,
    /// The signed body's SHA-256 (hex), for schemes that do not sign the id.
    pub body_digest: Option<&'a str>,
    /// The resource the event maps to (`explain` finds its claims by it).
    pub resource: Option<crate::change::ResourceKey<&'a str>>,
}

#[derive(diesel::QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

/// Claims event ids; returns the `(source, event_id)` pairs taken by this call (the
/// others were claimed before: duplicates). On PostgreSQL a concurrent claim of the same
/// id waits until the other transaction ends, then finds it taken (or takes it, if the
/// other rolled back). Callers pass distinct ids, sorted, so that two transactions
/// claiming overlapping sets wait on each other in the same order and cannot deadlock.
pub(crate) fn claim_many(
    conn: &mut Conn,
    claims: &[Claim<'_>],
) -> diesel::QueryResult<Vec<(String, String)>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<ClaimedRow> = match conn {
        // Four array parameters: one text for any number of claims, prepared once.
        // `unnest` yields the rows in array order, so the locks are taken in the
        // callers' order.
        Conn::Postgres(c) => {
            let sources: Vec<&str> = claims.iter().map(|c| c.source).collect();
            let ids: Vec<&str> = claims.iter().map(|c| c.event_id).collect();
            let types: Vec<&str> = claims.iter().map(|c| c.event_type).collect();
            let outcomes: Vec<&str> = claims.iter().map(|c| c.outcome.as_str()).collect();
            let digests: Vec<Option<&str>> = claims.iter().map(|c| c.body_digest).collect();
            let accounts: Vec<&str> = claims
                .iter()
                .map(|c| c.resource.as_ref().map_or("", |r| r.account))
                .collect();
            let kinds: Vec<Option<&str>> = claims
                .iter()
                .map(|c| c.resource.as_ref().map(|r| r.kind))
                .collect();
            let resource_ids: Vec<Option<&str>> = claims
                .iter()
                .map(|c| c.resource.as_ref().map(|r| r.id))
                .collect();
            prepared(
                query(
                    Backend::Postgres,
                    "INSERT INTO processed_events (source, event_id, event_type, outcome, body_digest, account, kind, resource_id) \
                     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[]) \
                     ON CONFLICT DO NOTHING RETURNING source, event_id",
                )
                .bind::<Array<Text>, _>(sources)
                .bind::<Array<Text>, _>(ids)
                .bind::<Array<Text>, _>(types)
                .bind::<Array<Text>, _>(outcomes)
                .bind::<Array<Nullable<Text>>, _>(digests)
                .bind::<Array<Text>, _>(accounts)
                .bind::<Array<Nullable<Text>>, _>(kinds)
                .bind::<Array<Nullable<Text>>, _>(resource_ids),
            )
            .load(c)?
        }
        Conn::Sqlite(c) => {
            let mut q = query(Backend::Sqlite, &claim_sql(claims.len())).into_boxed();
            for cl in claims {
                q = q
                    .bind::<Text, _>(cl.source)
                    .bind::<Text, _>(cl.event_id)
                    .bind::<Text, _>(cl.event_type)
                    .bind::<Text, _>(cl.outcome.as_str())
                    .bind::<Nullable<Text>, _>(cl.body_digest)
                    .bind::<Text, _>(cl.resource.as_ref().map_or("", |r| r.account))
                    .bind::<Nullable<Text>, _>(cl.resource.as_ref().map(|r| r.kind))
                    .bind::<Nullable<Text>, _>(cl.resource.as_ref().map(|r| r.id));
            }
            q.load(c)?
        }
    };
    Ok(rows.into_iter().map(|r| (r.source, r.event_id)).collect())
}

/// Records `outcome` for many claimed events of one source at once.
pub(crate) fn set_event_outcomes(
    conn: &mut Conn,
    source: &str,
    event_ids: &[&str],
    outcome: Outcome,
) -> diesel::QueryResult<()> {
    if event_ids.is_empty() {
        return Ok(());
    }
    match conn {
        Conn::Postgres(c) => prepared(
            query(
                Backend::Postgres,
                "UPDATE processed_events SET outcome = $1 WHERE source = $2 AND event_id = ANY($3::text[])",
            )
            .bind::<Text, _>(outcome.as_str())
            .bind::<Text, _>(source)
            .bind::<Array<Text>, _>(event_ids),
        )
        .execute(c)?,
        Conn::Sqlite(c) => {
            let sql = format!(
                "UPDATE processed_events SET outcome = $1 WHERE source = $2 AND event_id IN ({})",
                crate::db::sql::in_list(3, event_ids.len())
            );
            let mut q = query(Backend::Sqlite, &sql)
                .into_boxed()
                .bind::<Text, _>(outcome.as_str())
                .bind::<Text, _>(source);
            for id in event_ids {
                q = q.bind::<Text, _>(*id);
            }
            q.execute(c)?
        }
    };
    Ok(())
}

/// What became of a delivery to be kept as a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// A new row.
    New,
    /// Already kept (the same event id, or for a sender that signs only the body the
    /// same body): one more attempt and the new reason; the kept body stays as it was.
    Again,
    /// The source's dead letters hold `dead_letters.max_bytes`: not kept.
    Full,
}

/// Keeps an authentic delivery we could not read. A repeat (the same event id, or the
/// same `digest` of a body only the body's signature vouches for) updates the kept
/// row's attempts and reason and never its body; a new one is kept only while the
/// source's kept bodies stay within `max_bytes`.
#[expect(clippy::too_many_arguments, reason = "one row's columns")]
pub(crate) fn record_dead_letter(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
    event_type: &str,
    reason: &str,
    body: &str,
    account_hint: Option<&str>,
    digest: Option<&str>,
    max_bytes: i64,
) -> diesel::QueryResult<Kept> {
    let b = conn.backend();
    let again = query(
        b,
        &format!(
            "UPDATE dead_letters SET reason = $3, attempts = attempts + 1, last_seen_at = {} \
             WHERE source = $1 AND (event_id = $2 OR body_digest = $4)",
            now(b)
        ),
    );
    let n = on_conn!(conn, c => again
        .bind::<Text, _>(source)
        .bind::<Text, _>(event_id)
        .bind::<Text, _>(reason)
        .bind::<Nullable<Text>, _>(digest)
        .execute(c))?;
    if n > 0 {
        return Ok(Kept::Again);
    }
    let held = query(
        b,
        "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) AS count FROM dead_letters WHERE source = $1",
    );
    #[derive(diesel::QueryableByName)]
    struct Held {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    let held: Held = on_conn!(conn, c => held.bind::<Text, _>(source).get_result(c))?;
    let size = i64::try_from(body.len()).unwrap_or(i64::MAX);
    if held.count.saturating_add(size) > max_bytes {
        return Ok(Kept::Full);
    }
    let q = query(
        b,
        "INSERT INTO dead_letters (source, event_id, event_type, reason, body, account_hint, body_digest, size) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(event_id)
        .bind::<Text, _>(event_type)
        .bind::<Text, _>(reason)
        .bind::<Text, _>(body)
        .bind::<Nullable<Text>, _>(account_hint)
        .bind::<Nullable<Text>, _>(digest)
        .bind::<BigInt, _>(size)
        .execute(c))?;
    Ok(if n > 0 { Kept::New } else { Kept::Again })
}

/// A kept delivery with its body, for a retry.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct DeadLetter {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub event_id: String,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Text)]
    pub reason: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Text)]
    pub first_seen_at: String,
    #[diesel(sql_type = Text)]
    pub last_seen_at: String,
    #[serde(skip)]
    #[diesel(sql_type = Text)]
    pub body: String,
    #[serde(skip)]
    #[diesel(sql_type = Nullable<Text>)]
    pub account_hint: Option<String>,
}

/// A kept delivery as `dead-letters list` shows it: no body, its size.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct DeadLetterSummary {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// The account the delivery named (Shopify's shop header), if any.
    #[diesel(sql_type = Nullable<Text>)]
    pub account: Option<String>,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Text)]
    pub reason: String,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub attempts: i32,
    /// The kept body's bytes.
    #[diesel(sql_type = BigInt)]
    pub size: i64,
    #[diesel(sql_type = Text)]
    pub first_seen_at: String,
    #[diesel(sql_type = Text)]
    pub last_seen_at: String,
}

/// Dead letters without their bodies, oldest first (of `source`), at most `limit`.
pub(crate) fn dead_letter_summaries(
    conn: &mut Conn,
    source: Option<&str>,
    limit: i64,
) -> diesel::QueryResult<Vec<DeadLetterSummary>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, event_id, account_hint AS account, event_type, reason, attempts, size, {}, {} \
             FROM dead_letters WHERE ($1 = '' OR source = $1) \
             ORDER BY first_seen_at, source, event_id LIMIT $2",
            crate::db::sql::display_time(b, "first_seen_at") + " AS first_seen_at",
            crate::db::sql::display_time(b, "last_seen_at") + " AS last_seen_at",
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source.unwrap_or("")).bind::<BigInt, _>(limit).load(c))
}

/// Which dead letters a read with bodies is for.
pub(crate) enum Which<'a> {
    /// These event ids.
    Ids(&'a [String]),
    /// Every one after this (source, event id), in that order: a page.
    After(Option<(&'a str, &'a str)>),
}

/// Dead letters with their bodies (of `source`), by source and event id: those with
/// `ids`, or a page after a position; at most `limit`.
pub(crate) fn dead_letters(
    conn: &mut Conn,
    source: Option<&str>,
    which: Which<'_>,
    limit: i64,
) -> diesel::QueryResult<Vec<DeadLetter>> {
    let b = conn.backend();
    let mut sql = format!(
        "SELECT source, event_id, event_type, reason, attempts, {}, {}, body, account_hint \
         FROM dead_letters WHERE ($1 = '' OR source = $1)",
        crate::db::sql::display_time(b, "first_seen_at") + " AS first_seen_at",
        crate::db::sql::display_time(b, "last_seen_at") + " AS last_seen_at",
    );
    let (ids, after) = match which {
        Which::Ids(ids) => {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            sql.push_str(&format!(
                " AND event_id IN ({})",
                crate::db::sql::in_list(3, ids.len())
            ));
            (ids, None)
        }
        Which::After(after) => {
            if after.is_some() {
                sql.push_str(" AND (source > $3 OR (source = $3 AND event_id > $4))");
            }
            (&[][..], after)
        }
    };
    sql.push_str(" ORDER BY source, event_id LIMIT $2");
    let q = query(b, &sql);
    on_conn!(conn, c => {
        let mut q = q
            .into_boxed()
            .bind::<Text, _>(source.unwrap_or(""))
            .bind::<BigInt, _>(limit);
        for id in ids {
            q = q.bind::<Text, _>(id.as_str());
        }
        if let Some((s, e)) = after {
            q = q.bind::<Text, _>(s).bind::<Text, _>(e);
        }
        q.load(c)
    })
}

/// Gives one claim up (its effect could not be made, and nothing was written with it):
/// the sender's retry claims it again.
pub(crate) fn release_claim(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "DELETE FROM processed_events WHERE source = $1 AND event_id = $2",
    );
    Ok(on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(event_id).execute(c))? > 0)
}

/// Deletes one dead letter; whether it was there.
pub(crate) fn delete_dead_letter(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "DELETE FROM dead_letters WHERE source = $1 AND event_id = $2",
    );
    Ok(on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(event_id).execute(c))? > 0)
}

/// Deletes at most `limit` processed event ids of `source` older than `age_secs`,
/// walking the `processed_at` index, never the claims of lifecycle and erasure events
/// ([`crate::store::NEVER_PRUNED`]); returns how many.
pub(crate) fn prune_events(
    conn: &mut Conn,
    source: &str,
    age_secs: f64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "DELETE FROM processed_events WHERE (source, event_id) IN (\
             SELECT source, event_id FROM processed_events WHERE processed_at < {} AND source = $2 \
             AND event_type NOT IN ({}) LIMIT $3)",
            minus_seconds(b, 1),
            crate::store::NEVER_PRUNED
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    on_conn!(conn, c => q
        .bind::<Double, _>(age_secs)
        .bind::<Text, _>(source)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// Deletes at most `limit` dead letters last seen more than `age_secs` ago.
pub(crate) fn prune_dead_letters(
    conn: &mut Conn,
    age_secs: f64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "DELETE FROM dead_letters WHERE (source, event_id) IN (\
             SELECT source, event_id FROM dead_letters WHERE last_seen_at < {} LIMIT $2)",
            minus_seconds(b, 1)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Double, _>(age_secs)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct SourceCount {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

pub(crate) fn dead_letter_counts(conn: &mut Conn) -> diesel::QueryResult<Vec<SourceCount>> {
    let q = query(
        conn.backend(),
        "SELECT source, COUNT(*) AS count FROM dead_letters GROUP BY source",
    );
    on_conn!(conn, c => q.load(c))
}

/// A claimed event of one resource, as `explain` shows it.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct ClaimRow {
    #[diesel(sql_type = Text)]
    pub event_id: String,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Text)]
    pub outcome: String,
    #[diesel(sql_type = Text)]
    pub processed_at: String,
}

/// The claims that named `key`'s resource, oldest first, at most `limit` (through
/// `processed_events_resource_idx`).
pub(crate) fn claims_of(
    conn: &mut Conn,
    key: &crate::change::ResourceKey,
    limit: i64,
) -> diesel::QueryResult<Vec<ClaimRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT event_id, event_type, outcome, {} AS processed_at FROM processed_events \
             WHERE source = $1 AND account = $2 AND kind = $3 AND resource_id = $4 \
             ORDER BY processed_at, event_id LIMIT $5",
            crate::db::sql::ts_text(b, "processed_at")
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.id.as_str())
        .bind::<BigInt, _>(limit)
        .load(c))
}

/// Deletes the dead letters a header named one account for (the account's data is
/// erased).
pub(crate) fn forget_dead_letters_of_account(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "DELETE FROM dead_letters WHERE source = $1 AND account_hint = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))
}

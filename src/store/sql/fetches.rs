//! `pending_fetches`: what a 200 left to do, kept until it is done. Written in the
//! claim's transaction (a `fetching` delivery, a conflict to settle through `get`),
//! taken by any process, deleted in the transaction of the write the fetch made.

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Double, Integer, Nullable, Text};

use crate::change::ResourceKey;
use crate::config::Backend;
use crate::db::sql::{age_secs, display_time, now, plus_seconds, query};
use crate::db::{Conn, on_conn};

/// Why a resource is fetched: a delivery that carried no trusted state, or a conflict
/// (an equal version with another state) to settle from the sender's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchReason {
    Fetching,
    Conflict,
}

impl FetchReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FetchReason::Fetching => "fetching",
            FetchReason::Conflict => "conflict",
        }
    }
}

/// One request for a fetch: the resource, and the delivery that asked (none from the
/// reconcile flow).
#[derive(Debug, Clone)]
pub struct FetchRequest<'a> {
    pub key: ResourceKey<&'a str>,
    pub event_id: Option<&'a str>,
    pub reason: FetchReason,
}

/// Records fetch requests; a resource already pending gets one more request (due now,
/// its failed state and attempts cleared: a new delivery is new information). Callers
/// pass distinct keys sorted by key, so two transactions lock rows in one order.
pub(crate) fn request(conn: &mut Conn, rows: &[FetchRequest<'_>]) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let sql = format!(
        "INSERT INTO pending_fetches (source, account, kind, id, event_id, reason) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (source, account, kind, id) DO UPDATE SET requests = pending_fetches.requests + 1, \
           event_id = COALESCE(excluded.event_id, pending_fetches.event_id), reason = excluded.reason, \
           attempts = 0, failed_at = NULL, error = NULL, due_at = {now}",
        now = now(b)
    );
    for r in rows {
        let q = query(b, &sql)
            .bind::<Text, _>(r.key.source)
            .bind::<Text, _>(r.key.account)
            .bind::<Text, _>(r.key.kind)
            .bind::<Text, _>(r.key.id)
            .bind::<Nullable<Text>, _>(r.event_id)
            .bind::<Text, _>(r.reason.as_str());
        on_conn!(conn, c => q.execute(c))?;
    }
    Ok(())
}

/// A fetch a process took: it may fetch and write until its hold expires.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct TakenFetch {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub id: String,
    /// The latest delivery that asked for it: the write names it (`last_event_id`).
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    /// Requests when taken: the row is deleted after the write only if no request came
    /// meanwhile.
    #[diesel(sql_type = BigInt)]
    pub requests: i64,
    /// This attempt's number (1 for the first).
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
}

impl TakenFetch {
    pub fn key(&self) -> ResourceKey<&str> {
        ResourceKey::new(&self.source, &self.account, &self.kind, &self.id)
    }
}

#[derive(diesel::QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    account: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    id: String,
}

/// Takes at most `limit` due fetches for `holder`, held for `hold_secs`: the oldest due
/// of each account with no fetch in flight, accounts in order of their oldest due
/// fetch. So an account has at most one fetch in flight across every process, and one
/// account's thousand pending wait behind each other, not in front of another account's
/// one. On PostgreSQL rows another taker is taking are skipped (`SKIP LOCKED`); SQLite
/// has one writer.
pub(crate) fn take(
    conn: &mut Conn,
    holder: &str,
    limit: i64,
    hold_secs: f64,
) -> diesel::QueryResult<Vec<TakenFetch>> {
    let b = conn.backend();
    if b == Backend::Postgres {
        return take_postgres(conn, holder, limit, hold_secs);
    }
    let lock = "";
    let pick = format!(
        "WITH busy AS (SELECT DISTINCT source, account FROM pending_fetches WHERE taken_until > {now}), \
         firsts AS (SELECT source, account, kind, id, due_at FROM ( \
             SELECT w.source, w.account, w.kind, w.id, w.due_at, \
               row_number() OVER (PARTITION BY w.source, w.account ORDER BY w.due_at, w.kind, w.id) AS turn \
             FROM pending_fetches w \
             WHERE w.failed_at IS NULL AND w.due_at <= {now} \
               AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.source = w.source AND busy.account = w.account) \
           ) r WHERE turn = 1 ORDER BY due_at LIMIT $1) \
         SELECT f.source, f.account, f.kind, f.id FROM pending_fetches f \
         JOIN firsts ON f.source = firsts.source AND f.account = firsts.account AND f.kind = firsts.kind AND f.id = firsts.id{lock}",
        now = now(b)
    );
    let picked: Vec<KeyRow> =
        on_conn!(conn, c => query(b, &pick).bind::<BigInt, _>(limit).load(c))?;
    // Checked again on the row as it is now: the pick's snapshot may predate another
    // taker's commit (PostgreSQL locks the row once that commit is done, and the lock
    // alone would not say it was taken meanwhile).
    let hold = format!(
        "UPDATE pending_fetches SET taken_by = $1, taken_until = {until}, attempts = attempts + 1 \
         WHERE source = $3 AND account = $4 AND kind = $5 AND id = $6 \
           AND failed_at IS NULL AND due_at <= {now} AND (taken_until IS NULL OR taken_until <= {now}) \
         RETURNING source, account, kind, id, event_id, requests, attempts",
        until = plus_seconds(b, 2),
        now = now(b)
    );
    let mut taken = Vec::with_capacity(picked.len());
    for k in picked {
        let q = query(b, &hold)
            .bind::<Text, _>(holder)
            .bind::<Double, _>(hold_secs)
            .bind::<Text, _>(&k.source)
            .bind::<Text, _>(&k.account)
            .bind::<Text, _>(&k.kind)
            .bind::<Text, _>(&k.id);
        let mut rows: Vec<TakenFetch> = on_conn!(conn, c => q.load(c))?;
        taken.extend(rows.pop());
    }
    Ok(taken)
}

/// Takes for `holder` at most `limit` more due fetches of `first`'s account and kind,
/// to be fetched with it in one request (a kind's `get_many`): those never attempted
/// (a fetch that failed is retried alone), oldest due first. On PostgreSQL rows another
/// taker is taking are skipped.
pub(crate) fn take_batch_mates(
    conn: &mut Conn,
    holder: &str,
    first: &TakenFetch,
    limit: i64,
    hold_secs: f64,
) -> diesel::QueryResult<Vec<TakenFetch>> {
    let b = conn.backend();
    // The pick is a materialized CTE: as a subquery of the UPDATE, PostgreSQL may run
    // a `LIMIT .. SKIP LOCKED` pick more than once and take more rows than the limit
    // (seen here: 290 for a limit of 249).
    let sql = format!(
        "WITH picked AS {materialized}( \
             SELECT source, account, kind, id FROM pending_fetches \
             WHERE source = $3 AND account = $4 AND kind = $5 AND id <> $6 AND attempts = 0 \
               AND failed_at IS NULL AND due_at <= {now} AND (taken_until IS NULL OR taken_until <= {now}) \
             ORDER BY due_at, id LIMIT $7{lock}) \
         UPDATE pending_fetches SET taken_by = $1, taken_until = {until}, attempts = attempts + 1 \
         WHERE (source, account, kind, id) IN (SELECT source, account, kind, id FROM picked) \
           AND failed_at IS NULL AND (taken_until IS NULL OR taken_until <= {now}) \
         RETURNING source, account, kind, id, event_id, requests, attempts",
        until = plus_seconds(b, 2),
        now = now(b),
        lock = if b == Backend::Postgres {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        },
        materialized = if b == Backend::Postgres {
            "MATERIALIZED "
        } else {
            ""
        },
    );
    let q = query(b, &sql)
        .bind::<Text, _>(holder)
        .bind::<Double, _>(hold_secs)
        .bind::<Text, _>(&first.source)
        .bind::<Text, _>(&first.account)
        .bind::<Text, _>(&first.kind)
        .bind::<Text, _>(&first.id)
        .bind::<BigInt, _>(limit);
    on_conn!(conn, c => q.load(c))
}

/// [`take`] on PostgreSQL, two statements whatever the number taken. The pick costs two
/// index probes per account with fetches pending (`pending_fetches_turn_idx`: the
/// accounts are walked one by one, each account's first turn read from the index), not
/// a sort of every pending row; the hold is one statement over the picked keys.
fn take_postgres(
    conn: &mut Conn,
    holder: &str,
    limit: i64,
    hold_secs: f64,
) -> diesel::QueryResult<Vec<TakenFetch>> {
    use diesel::sql_types::Array;
    let b = Backend::Postgres;
    let Conn::Postgres(c) = conn else {
        return Ok(Vec::new());
    };
    let picked: Vec<KeyRow> = query(
        b,
        "WITH RECURSIVE accounts_due AS ( \
           (SELECT source, account FROM pending_fetches WHERE failed_at IS NULL ORDER BY source, account LIMIT 1) \
           UNION ALL \
           SELECT n.source, n.account FROM accounts_due a CROSS JOIN LATERAL ( \
             SELECT p.source, p.account FROM pending_fetches p \
             WHERE p.failed_at IS NULL AND (p.source, p.account) > (a.source, a.account) \
             ORDER BY p.source, p.account LIMIT 1) n), \
         busy AS (SELECT DISTINCT source, account FROM pending_fetches WHERE taken_until > now()), \
         firsts AS ( \
           SELECT w.source, w.account, w.kind, w.id, w.due_at FROM accounts_due a CROSS JOIN LATERAL ( \
             SELECT x.source, x.account, x.kind, x.id, x.due_at FROM pending_fetches x \
             WHERE x.source = a.source AND x.account = a.account AND x.failed_at IS NULL \
             ORDER BY x.due_at, x.kind, x.id LIMIT 1) w \
           WHERE w.due_at <= now() \
             AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.source = a.source AND busy.account = a.account) \
           ORDER BY w.due_at LIMIT $1) \
         SELECT f.source, f.account, f.kind, f.id FROM pending_fetches f \
         JOIN firsts ON f.source = firsts.source AND f.account = firsts.account AND f.kind = firsts.kind AND f.id = firsts.id \
         FOR UPDATE OF f SKIP LOCKED",
    )
    .bind::<BigInt, _>(limit)
    .load(c)?;
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let column = |f: fn(&KeyRow) -> &str| picked.iter().map(f).collect::<Vec<&str>>();
    // Checked again on each row as it is now, as in `take`.
    query(
        b,
        "UPDATE pending_fetches f SET taken_by = $1, taken_until = now() + make_interval(secs => $2), attempts = f.attempts + 1 \
         FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS k(source, account, kind, id) \
         WHERE f.source = k.source AND f.account = k.account AND f.kind = k.kind AND f.id = k.id \
           AND f.failed_at IS NULL AND f.due_at <= now() AND (f.taken_until IS NULL OR f.taken_until <= now()) \
         RETURNING f.source, f.account, f.kind, f.id, f.event_id, f.requests, f.attempts",
    )
    .bind::<Text, _>(holder)
    .bind::<Double, _>(hold_secs)
    .bind::<Array<Text>, _>(column(|k| &k.source))
    .bind::<Array<Text>, _>(column(|k| &k.account))
    .bind::<Array<Text>, _>(column(|k| &k.kind))
    .bind::<Array<Text>, _>(column(|k| &k.id))
    .load(c)
}

/// The fetch is done (its write, if any, is in this transaction): the row goes, unless
/// a request came while it ran; then it is released, due again. False when the row is
/// gone (the resource's data was erased, or its account removed, while it ran).
pub(crate) fn finish(conn: &mut Conn, f: &TakenFetch) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let deleted = on_conn!(conn, c => query(
        b,
        "DELETE FROM pending_fetches WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4 AND requests = $5",
    )
    .bind::<Text, _>(&f.source)
    .bind::<Text, _>(&f.account)
    .bind::<Text, _>(&f.kind)
    .bind::<Text, _>(&f.id)
    .bind::<BigInt, _>(f.requests)
    .execute(c))?;
    if deleted > 0 {
        return Ok(true);
    }
    let q = query(
        b,
        "UPDATE pending_fetches SET taken_by = NULL, taken_until = NULL \
         WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4",
    );
    let released = on_conn!(conn, c => q
        .bind::<Text, _>(&f.source)
        .bind::<Text, _>(&f.account)
        .bind::<Text, _>(&f.kind)
        .bind::<Text, _>(&f.id)
        .execute(c))?;
    Ok(released > 0)
}

/// The fetch failed: released, due again after `delay_secs`; with `give_up`, kept as
/// failed instead (unless a request came while it ran: that one starts afresh).
pub(crate) fn retry(
    conn: &mut Conn,
    f: &TakenFetch,
    error: &str,
    delay_secs: f64,
    give_up: bool,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let sql = format!(
        "UPDATE pending_fetches SET taken_by = NULL, taken_until = NULL, error = $6, \
           due_at = CASE WHEN requests = $5 THEN {later} ELSE due_at END, \
           failed_at = CASE WHEN requests = $5 AND $8 = 1 THEN {now} ELSE NULL END \
         WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4",
        later = plus_seconds(b, 7),
        now = now(b)
    );
    let q = query(b, &sql)
        .bind::<Text, _>(&f.source)
        .bind::<Text, _>(&f.account)
        .bind::<Text, _>(&f.kind)
        .bind::<Text, _>(&f.id)
        .bind::<BigInt, _>(f.requests)
        .bind::<Text, _>(error)
        .bind::<Double, _>(delay_secs)
        .bind::<Integer, _>(i32::from(give_up));
    on_conn!(conn, c => q.execute(c))?;
    Ok(())
}

/// Releases every fetch `holder` holds (it stops: shutdown, or its process is gone);
/// the attempt it was on does not count.
pub(crate) fn release(conn: &mut Conn, holder: &str) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "UPDATE pending_fetches SET taken_by = NULL, taken_until = NULL, \
           attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END \
         WHERE taken_by = $1",
    );
    on_conn!(conn, c => q.bind::<Text, _>(holder).execute(c))
}

#[derive(diesel::QueryableByName)]
struct Holder {
    #[diesel(sql_type = Text)]
    taken_by: String,
}

/// The processes holding fetches now.
pub(crate) fn holders(conn: &mut Conn) -> diesel::QueryResult<Vec<String>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT DISTINCT taken_by FROM pending_fetches WHERE taken_until > {} AND taken_by IS NOT NULL",
            now(b)
        ),
    );
    let rows: Vec<Holder> = on_conn!(conn, c => q.load(c))?;
    Ok(rows.into_iter().map(|h| h.taken_by).collect())
}

/// Deletes the pending fetches of one account (it was removed or purged).
pub(crate) fn forget_account(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "DELETE FROM pending_fetches WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))
}

/// Deletes the pending fetches of named resources of one account and kind (their data
/// is erased: a fetch would bring it back).
pub(crate) fn forget_resources(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
    ids: &[&str],
) -> diesel::QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let q = query(
        conn.backend(),
        &format!(
            "DELETE FROM pending_fetches WHERE source = $1 AND account = $2 AND kind = $3 AND id IN ({})",
            crate::db::sql::in_list(4, ids.len())
        ),
    );
    on_conn!(conn, c => {
        let mut q = q
            .into_boxed()
            .bind::<Text, _>(source)
            .bind::<Text, _>(account)
            .bind::<Text, _>(kind);
        for id in ids {
            q = q.bind::<Text, _>(*id);
        }
        q.execute(c)
    })
}

/// Pending fetches of one source: how many, how many failed, how long the oldest has
/// waited.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct FetchCount {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = BigInt)]
    pub pending: i64,
    #[diesel(sql_type = BigInt)]
    pub failed: i64,
    #[diesel(sql_type = Double)]
    pub oldest_seconds: f64,
}

pub(crate) fn counts(conn: &mut Conn) -> diesel::QueryResult<Vec<FetchCount>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, COUNT(*) AS pending, \
               CAST(SUM(CASE WHEN failed_at IS NULL THEN 0 ELSE 1 END) AS BIGINT) AS failed, \
               CAST(MAX({age}) AS DOUBLE PRECISION) AS oldest_seconds \
             FROM pending_fetches GROUP BY source ORDER BY source",
            age = age_secs(b, "requested_at")
        ),
    );
    on_conn!(conn, c => q.load(c))
}

/// One resource's pending fetch, as `explain` shows it.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct FetchRow {
    #[diesel(sql_type = Text)]
    pub reason: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub requests: i64,
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = Text)]
    pub requested_at: String,
    #[diesel(sql_type = Text)]
    pub due_at: String,
    /// Set after the last attempt failed: the account-kind was made due for a full run.
    #[diesel(sql_type = Nullable<Text>)]
    pub failed_at: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
}

pub(crate) fn of_resource(
    conn: &mut Conn,
    key: &ResourceKey,
) -> diesel::QueryResult<Option<FetchRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT reason, event_id, requests, attempts, {} AS requested_at, {} AS due_at, \
               {} AS failed_at, error FROM pending_fetches \
             WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4",
            display_time(b, "requested_at"),
            display_time(b, "due_at"),
            display_time(b, "failed_at"),
        ),
    );
    let mut rows: Vec<FetchRow> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.id.as_str())
        .load(c))?;
    Ok(rows.pop())
}

/// Whether any fetch is due and not taken (a read: taking, a write, is done only when
/// there is something to take).
pub(crate) fn any_due(conn: &mut Conn) -> diesel::QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        v: i64,
    }
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT COUNT(*) AS v FROM (SELECT 1 FROM pending_fetches \
             WHERE failed_at IS NULL AND due_at <= {now} AND (taken_until IS NULL OR taken_until <= {now}) LIMIT 1) d",
            now = now(b)
        ),
    );
    let r: Count = on_conn!(conn, c => q.get_result(c))?;
    Ok(r.v > 0)
}

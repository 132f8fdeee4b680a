//! `reconcile_due`: when each (source, account, kind) is next due and how its last run
//! ended — one row for every reconciled account-kind, a single-account source's own
//! kinds (account `''`) included. The registry (`accounts`) says which accounts there
//! are; this table says when each runs.

use std::collections::BTreeSet;

use diesel::RunQueryDsl;
use diesel::sql_types::{Array, BigInt, Double, Nullable, Text};

use crate::change::Key;
use crate::config::Backend;
use crate::db::sql::{TextValue, age_secs, now, prepared, query, ts_param};
use crate::db::{Conn, on_conn};

/// Brings the rows of `source`'s `kind` in line with `accounts`, the registry as read at
/// `listed_at` (ISO 8601, the database's clock): those missing are added, each due at
/// its time (`None`: now); those of accounts not listed are removed — unless they were
/// scheduled or started after the listing (an account added meanwhile: its row is new,
/// `never` run, or claimed since). Returns how many were added and how many there were.
pub(crate) fn sync(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    accounts: &[(String, Option<String>)],
    listed_at: &str,
) -> diesel::QueryResult<(usize, usize)> {
    let b = conn.backend();
    let have: Vec<TextValue> = on_conn!(conn, c => query(
        b,
        "SELECT account AS v FROM reconcile_due WHERE source = $1 AND kind = $2",
    )
    .bind::<Text, _>(source)
    .bind::<Text, _>(kind)
    .load(c))?;
    let have: BTreeSet<&str> = have.iter().map(|r| r.v.as_str()).collect();
    let want: BTreeSet<&str> = accounts.iter().map(|(a, _)| a.as_str()).collect();
    let missing: Vec<&(String, Option<String>)> = accounts
        .iter()
        .filter(|(a, _)| !have.contains(a.as_str()))
        .collect();
    let mut added = 0;
    match conn {
        // One statement for all of them: at 10,000 accounts a row a statement was 20,000
        // round trips per replica at each start.
        Conn::Postgres(c) => {
            for chunk in missing.chunks(10_000) {
                let names: Vec<&str> = chunk.iter().map(|(a, _)| a.as_str()).collect();
                let dues: Vec<Option<&str>> = chunk.iter().map(|(_, d)| d.as_deref()).collect();
                added += query(
                    b,
                    "INSERT INTO reconcile_due (source, account, kind, due_at) \
                     SELECT $1, m.account, $2, COALESCE(m.due::timestamptz, now()) \
                     FROM unnest($3::text[], $4::text[]) AS m(account, due) \
                     ON CONFLICT (source, account, kind) DO NOTHING",
                )
                .bind::<Text, _>(source)
                .bind::<Text, _>(kind)
                .bind::<Array<Text>, _>(names)
                .bind::<Array<Nullable<Text>>, _>(dues)
                .execute(c)?;
            }
        }
        Conn::Sqlite(c) => {
            let insert = format!(
                "INSERT INTO reconcile_due (source, account, kind, due_at) VALUES ($1, $2, $3, COALESCE({}, {})) \
                 ON CONFLICT (source, account, kind) DO NOTHING",
                ts_param(b, 4),
                now(b)
            );
            for (account, due) in &missing {
                added += query(b, &insert)
                    .bind::<Text, _>(source)
                    .bind::<Text, _>(account.as_str())
                    .bind::<Text, _>(kind)
                    .bind::<Nullable<Text>, _>(due.as_deref())
                    .execute(c)?;
            }
        }
    }
    let delete = format!(
        "DELETE FROM reconcile_due WHERE source = $1 AND account = $2 AND kind = $3 \
         AND status <> 'never' AND started_at < {}",
        ts_param(b, 4)
    );
    for account in have.difference(&want) {
        on_conn!(conn, c => query(b, &delete)
            .bind::<Text, _>(source)
            .bind::<Text, _>(*account)
            .bind::<Text, _>(kind)
            .bind::<Text, _>(listed_at)
            .execute(c))?;
    }
    Ok((added, have.len()))
}

/// `ANALYZE` of `reconcile_due` on PostgreSQL (SQLite: nothing). Without statistics
/// the planner reached a row by the due-time index and filtered the kind's every row
/// (750 pages a finished run at 10,000 accounts on a server without autovacuum); statistics
/// taken before a kind's rows were added can do the same for that kind. So
/// it waits for an analyze running now (another kind's, another replica's) rather than
/// skip: that one may not have seen these rows.
pub(crate) fn analyze(conn: &mut Conn) -> diesel::QueryResult<()> {
    use diesel::connection::SimpleConnection;
    match conn {
        Conn::Postgres(c) => c.batch_execute("ANALYZE reconcile_due"),
        Conn::Sqlite(_) => Ok(()),
    }
}

/// Makes one account-kind due now, scheduling it if it was not (an account added or
/// enabled: its first sync; a fetch that gave up: a full run repairs it).
pub(crate) fn due_now(conn: &mut Conn, key: &Key) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_due (source, account, kind) VALUES ($1, $2, $3) \
             ON CONFLICT (source, account, kind) DO UPDATE SET due_at = {}",
            now(b)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .execute(c))?;
    Ok(())
}

/// The clock's tick: every account-kind of `source`'s `kind` not running and due later
/// is due now.
pub(crate) fn tick(conn: &mut Conn, source: &str, kind: &str) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_due SET due_at = {now} \
             WHERE source = $1 AND kind = $2 AND due_at > {now} AND status <> 'running'",
            now = now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))
}

/// The largest claim limit written into the claim's text (see [`claim`]).
const CLAIM_LIMITS_IN_TEXT: i64 = 64;

/// Claims up to `limit` due account-kinds of `source`'s `kind` (most overdue first,
/// none of a paused kind), moving each one's `due_at` to `next` (the kind's next tick)
/// as it is claimed. On PostgreSQL rows another replica is claiming are skipped, not
/// waited for. The claim is a materialized CTE: as a plain `IN (subquery)` PostgreSQL
/// may run the SKIP LOCKED subquery more than once and claim more rows than `limit`.
pub(crate) fn claim(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    next: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<String>> {
    let b = conn.backend();
    // PostgreSQL: the claimed rows are locked, so their ctids are stable until commit and
    // the update reaches them by TID (joined by account instead, it scanned the whole
    // table: 1.5 ms a claim at 1,000 accounts).
    let (lock, pick, matched) = match b {
        Backend::Postgres => (
            " FOR UPDATE OF r SKIP LOCKED",
            "r.ctid AS tid",
            "ctid = ANY(ARRAY(SELECT tid FROM claimed))",
        ),
        Backend::Sqlite => (
            "",
            "r.account",
            "source = $1 AND kind = $2 AND account IN (SELECT account FROM claimed)",
        ),
    };
    // On PostgreSQL a limit up to CLAIM_LIMITS_IN_TEXT is written into the text (one
    // prepared text per limit): with `LIMIT $4` the generic plan assumes a tenth of the
    // due rows and costs about five times the custom one, so every claim was planned
    // anew (0.27 ms each at 1,000 accounts). Larger limits stay a parameter, so a
    // connection keeps at most that many texts of it.
    let limit_sql = match b {
        Backend::Postgres if (1..=CLAIM_LIMITS_IN_TEXT).contains(&limit) => limit.to_string(),
        _ => "$4".to_string(),
    };
    let q = query(
        b,
        &format!(
            "WITH claimed AS MATERIALIZED ( \
               SELECT {pick} FROM reconcile_due r \
               WHERE r.source = $1 AND r.kind = $2 AND r.due_at <= {now} \
                 AND NOT EXISTS (SELECT 1 FROM reconcile_paused p \
                   WHERE p.source = r.source AND (p.kind = r.kind OR p.kind = '')) \
               ORDER BY r.due_at LIMIT {limit_sql}{lock}) \
             UPDATE reconcile_due SET due_at = {next}, started_at = {now}, status = 'running', error = NULL \
             WHERE {matched} \
             RETURNING account AS v",
            next = ts_param(b, 3),
            now = now(b),
        ),
    );
    let rows: Vec<TextValue> = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(next)
        .bind::<BigInt, _>(limit)).load(c))?;
    Ok(rows.into_iter().map(|r| r.v).collect())
}

/// Records how an account-kind's run ended (`succeeded`, `failed` or `skipped`). An
/// account-kind with no schedule row (a dry run's, an account removed meanwhile) has
/// nothing to record.
pub(crate) fn finish(
    conn: &mut Conn,
    key: &Key,
    status: &str,
    error: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_due SET finished_at = {}, status = $4, error = $5 \
             WHERE source = $1 AND account = $2 AND kind = $3",
            now(b)
        ),
    );
    on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(status)
        .bind::<Nullable<Text>, _>(error)).execute(c))?;
    Ok(())
}

/// Removes an account's rows (it was disabled or removed): it is no longer run.
pub(crate) fn unschedule(conn: &mut Conn, source: &str, account: &str) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_due WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    Ok(())
}

/// How many account-kinds of registered accounts (account `''` left out: a source's
/// own) are in each state.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct DueCount {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Of them, how many are past their due time (waiting for a free slot).
    #[diesel(sql_type = BigInt)]
    pub overdue: i64,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

/// An account-kind past its due time, or whose last run failed.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct Overdue {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Seconds past its due time; negative: due in that many seconds (a failed run
    /// waiting for its next tick).
    #[diesel(sql_type = Double)]
    pub overdue_secs: f64,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
}

pub(crate) fn due_counts(conn: &mut Conn) -> diesel::QueryResult<Vec<DueCount>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT r.source, r.status, \
             CAST(SUM(CASE WHEN r.due_at < {now} THEN 1 ELSE 0 END) AS BIGINT) AS overdue, \
             COUNT(*) AS count FROM reconcile_due r \
             WHERE r.account <> '' GROUP BY r.source, r.status ORDER BY r.source, r.status",
            now = now(b)
        ),
    );
    on_conn!(conn, c => q.load(c))
}

/// The most overdue account-kinds of registered accounts (failed ones first).
pub(crate) fn most_overdue(conn: &mut Conn, limit: i64) -> diesel::QueryResult<Vec<Overdue>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT r.source, r.account, r.kind, r.status, {age} AS overdue_secs, r.error \
             FROM reconcile_due r \
             WHERE r.account <> '' AND (r.due_at < {now} OR r.status = 'failed') \
             ORDER BY CASE WHEN r.status = 'failed' THEN 0 ELSE 1 END, r.due_at LIMIT $1",
            age = age_secs(b, "r.due_at"),
            now = now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<BigInt, _>(limit).load(c))
}

/// Makes one scheduled account-kind due now; whether it is scheduled.
pub(crate) fn make_due(conn: &mut Conn, key: &Key) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_due SET due_at = {} WHERE source = $1 AND account = $2 AND kind = $3",
            now(b)
        ),
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .execute(c))?;
    Ok(n > 0)
}

/// Whether any account-kind of `source`'s `kind` is due (a read: the claim, a write,
/// is taken only when there is something to claim).
pub(crate) fn any_due(conn: &mut Conn, source: &str, kind: &str) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT COUNT(*) AS v FROM (SELECT 1 FROM reconcile_due \
             WHERE source = $1 AND kind = $2 AND due_at <= {} LIMIT 1) d",
            now(b)
        ),
    );
    let r: Count =
        on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).get_result(c))?;
    Ok(r.v > 0)
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    v: i64,
}

//! `accounts`: the registry of many-account sources. Only `accounts` calls these.

use diesel::RunQueryDsl;
use diesel::sql_types::{Bool, Nullable, Text};

use crate::db::sql::{TextValue, age_secs, display_time, now, query, ts_param};
use crate::db::{Conn, on_conn};

/// One registered account.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName, serde::Serialize)]
pub struct AccountRow {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// The account's own API base URL, if it has one.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub api_base: Option<String>,
    /// Whether a credential of its own is kept (never the credential).
    #[diesel(sql_type = Bool)]
    pub has_credential: bool,
    #[diesel(sql_type = Text)]
    pub created_at: String,
}

/// How the daemon reaches one account's API.
#[derive(diesel::QueryableByName)]
pub(crate) struct AccessRow {
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub api_base: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub credential: Option<String>,
}

/// Registers an account (enabled) with its API base and sealed credential; one already
/// registered is enabled again and takes the given base and credential (those not given
/// are kept).
pub(crate) fn add(
    conn: &mut Conn,
    source: &str,
    account: &str,
    api_base: Option<&str>,
    sealed: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        "INSERT INTO accounts (source, account, api_base, credential) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (source, account) DO UPDATE SET enabled = TRUE, \
             api_base = COALESCE(excluded.api_base, accounts.api_base), \
             credential = COALESCE(excluded.credential, accounts.credential)",
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Nullable<Text>, _>(api_base)
        .bind::<Nullable<Text>, _>(sealed)
        .execute(c))?;
    Ok(())
}

/// The account's API base and sealed credential, if registered.
pub(crate) fn access(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<Option<AccessRow>> {
    use diesel::OptionalExtension;
    let q = query(
        conn.backend(),
        "SELECT enabled, api_base, credential FROM accounts WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).get_result(c).optional())
}

/// The accounts of `source` (every source's with `""`), by source and account.
pub(crate) fn list(conn: &mut Conn, source: &str) -> diesel::QueryResult<Vec<AccountRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, enabled, api_base, credential IS NOT NULL AS has_credential, \
             {} AS created_at FROM accounts \
             WHERE $1 = '' OR source = $1 ORDER BY source, account",
            display_time(b, "created_at")
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).load(c))
}

/// Whether `account` of `source` is registered and enabled.
pub(crate) fn is_enabled(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let q = query(
        b,
        "SELECT COUNT(*) AS n FROM accounts WHERE source = $1 AND account = $2 AND enabled = TRUE",
    );
    let r: Count =
        on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).get_result(c))?;
    Ok(r.n > 0)
}

/// Enables or disables an account; false when it is not registered.
pub(crate) fn set_enabled(
    conn: &mut Conn,
    source: &str,
    account: &str,
    enabled: bool,
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "UPDATE accounts SET enabled = $3 WHERE source = $1 AND account = $2",
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Bool, _>(enabled)
        .execute(c))?;
    Ok(n == 1)
}

/// Removes an account from the registry; false when it was not registered.
pub(crate) fn remove(conn: &mut Conn, source: &str, account: &str) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "DELETE FROM accounts WHERE source = $1 AND account = $2",
    );
    let n = on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    Ok(n == 1)
}

/// The account-kinds of `source`'s `kind` not yet scheduled, scheduled due now: the
/// accounts registered while no process ran (an `accounts add` schedules its own).
pub(crate) fn seed_due(conn: &mut Conn, source: &str, kind: &str) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "INSERT INTO reconcile_due (source, account, kind) \
         SELECT source, account, $2 FROM accounts WHERE source = $1 \
         ON CONFLICT (source, account, kind) DO NOTHING",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))
}

/// Makes `account`'s kinds due now (its first sync, or a sync asked for).
pub(crate) fn due_now(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_due (source, account, kind) VALUES ($1, $2, $3) \
             ON CONFLICT (source, account, kind) DO UPDATE SET due_at = {}",
            now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).bind::<Text, _>(kind).execute(c))?;
    Ok(())
}

/// Claims up to `limit` due account-kinds of `source`'s `kind` (enabled accounts, most
/// overdue first), moving each one's `due_at` to `next` (the kind's next tick) as it is
/// claimed. On PostgreSQL rows another replica is claiming are skipped, not waited for.
/// The claim is a materialized CTE: as a plain `IN (subquery)` PostgreSQL may run the
/// SKIP LOCKED subquery more than once and claim more rows than `limit`.
pub(crate) fn claim_due(
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
        crate::config::Backend::Postgres => (
            " FOR UPDATE OF r SKIP LOCKED",
            "r.ctid AS tid",
            "ctid = ANY(ARRAY(SELECT tid FROM claimed))",
        ),
        crate::config::Backend::Sqlite => (
            "",
            "r.account",
            "source = $1 AND kind = $2 AND account IN (SELECT account FROM claimed)",
        ),
    };
    let q = query(
        b,
        &format!(
            "WITH claimed AS MATERIALIZED ( \
               SELECT {pick} FROM reconcile_due r \
               JOIN accounts a ON a.source = r.source AND a.account = r.account \
               WHERE r.source = $1 AND r.kind = $2 AND a.enabled = TRUE AND r.due_at <= {now} \
               ORDER BY r.due_at LIMIT $4{lock}) \
             UPDATE reconcile_due SET due_at = {next}, started_at = {now}, status = 'running', error = NULL \
             WHERE {matched} \
             RETURNING account AS v",
            next = ts_param(b, 3),
            now = now(b),
        ),
    );
    let rows: Vec<TextValue> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(next)
        .bind::<diesel::sql_types::BigInt, _>(limit)
        .load(c))?;
    Ok(rows.into_iter().map(|r| r.v).collect())
}

/// Records how an account-kind's run ended.
pub(crate) fn finish_due(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
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
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(status)
        .bind::<Nullable<Text>, _>(error)
        .execute(c))?;
    Ok(())
}

/// Makes an account-kind due now (a fetch for it gave up: a full run repairs it).
/// Whether it has a schedule row.
pub(crate) fn make_due(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_due SET due_at = {} WHERE source = $1 AND account = $2 AND kind = $3",
            now(b)
        ),
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Text, _>(kind)
        .execute(c))?;
    Ok(n > 0)
}

/// Forgets an account's schedule (it was removed).
pub(crate) fn forget_due(conn: &mut Conn, source: &str, account: &str) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_due WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    // Added again, it ages from then, not from a success before its removal.
    crate::bookkeeping::Bookkeeping::forget_account_in(conn, source, account)
}

/// How many account-kinds of enabled accounts are in each state.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct DueCount {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Of them, how many are past their due time (waiting for a free slot).
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub overdue: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub count: i64,
}

/// An account-kind past its due time.
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
    #[diesel(sql_type = diesel::sql_types::Double)]
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
             JOIN accounts a ON a.source = r.source AND a.account = r.account \
             WHERE a.enabled = TRUE GROUP BY r.source, r.status ORDER BY r.source, r.status",
            now = now(b)
        ),
    );
    on_conn!(conn, c => q.load(c))
}

/// The most overdue account-kinds of enabled accounts (failed ones first).
pub(crate) fn most_overdue(conn: &mut Conn, limit: i64) -> diesel::QueryResult<Vec<Overdue>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT r.source, r.account, r.kind, r.status, {age} AS overdue_secs, r.error \
             FROM reconcile_due r JOIN accounts a ON a.source = r.source AND a.account = r.account \
             WHERE a.enabled = TRUE AND (r.due_at < {now} OR r.status = 'failed') \
             ORDER BY CASE WHEN r.status = 'failed' THEN 0 ELSE 1 END, r.due_at LIMIT $1",
            age = age_secs(b, "r.due_at"),
            now = now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<diesel::sql_types::BigInt, _>(limit).load(c))
}

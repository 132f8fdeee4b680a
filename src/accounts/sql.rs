//! `accounts`: the registry of many-account sources. Only `accounts` calls these.

use diesel::RunQueryDsl;
use diesel::sql_types::{Bool, Nullable, Text};

use crate::db::sql::{age_secs, display_time, prepared, query};
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
    /// Why a disabled account is disabled (an operator, `app/uninstalled`, a
    /// suspension), and since when.
    #[diesel(sql_type = Nullable<Text>)]
    pub disabled_reason: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub disabled_since: Option<String>,
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
             disabled_reason = NULL, disabled_at = NULL, uninstalled_by = NULL, \
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
    on_conn!(conn, c => prepared(q.bind::<Text, _>(source).bind::<Text, _>(account)).get_result(c).optional())
}

/// Sets an account's base and sealed credential, only if they are still `was` (another
/// writer's change in between is not overwritten); whether it was.
pub(crate) fn replace_access(
    conn: &mut Conn,
    source: &str,
    account: &str,
    was: (Option<&str>, Option<&str>),
    now: (Option<&str>, Option<&str>),
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "UPDATE accounts SET api_base = $5, credential = $6 WHERE source = $1 AND account = $2 \
             AND COALESCE(api_base, '') = COALESCE($3, '') AND COALESCE(credential, '') = COALESCE($4, '')",
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Nullable<Text>, _>(was.0)
        .bind::<Nullable<Text>, _>(was.1)
        .bind::<Nullable<Text>, _>(now.0)
        .bind::<Nullable<Text>, _>(now.1)
        .execute(c))?;
    Ok(n == 1)
}

/// One account's kept credential (for re-sealing).
#[derive(diesel::QueryableByName)]
pub(crate) struct SealedRow {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub api_base: Option<String>,
    #[diesel(sql_type = Text)]
    pub credential: String,
}

/// Every kept credential, by source and account.
pub(crate) fn sealed_credentials(conn: &mut Conn) -> diesel::QueryResult<Vec<SealedRow>> {
    let q = query(
        conn.backend(),
        "SELECT source, account, api_base, credential FROM accounts \
             WHERE credential IS NOT NULL ORDER BY source, account",
    );
    on_conn!(conn, c => q.load(c))
}

/// The accounts of `source` (every source's with `""`), by source and account.
pub(crate) fn list(conn: &mut Conn, source: &str) -> diesel::QueryResult<Vec<AccountRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, enabled, api_base, credential IS NOT NULL AS has_credential, \
             {} AS created_at, disabled_reason, {} AS disabled_since FROM accounts \
             WHERE $1 = '' OR source = $1 ORDER BY source, account",
            display_time(b, "created_at"),
            display_time(b, "disabled_at")
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).load(c))
}

/// One registered account, if it is.
pub(crate) fn one(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<Option<AccountRow>> {
    use diesel::OptionalExtension;
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, enabled, api_base, credential IS NOT NULL AS has_credential, \
             {} AS created_at, disabled_reason, {} AS disabled_since FROM accounts \
             WHERE source = $1 AND account = $2",
            display_time(b, "created_at"),
            display_time(b, "disabled_at")
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).get_result(c).optional())
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

/// Enables an account (`reason` `None`) or disables it for `reason`, from now; false
/// when it is not registered.
pub(crate) fn set_enabled(
    conn: &mut Conn,
    source: &str,
    account: &str,
    reason: Option<&str>,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE accounts SET enabled = $3, disabled_reason = $4, \
             disabled_at = CASE WHEN $3 THEN NULL ELSE {} END \
             WHERE source = $1 AND account = $2",
            crate::db::sql::now(b)
        ),
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Bool, _>(reason.is_none())
        .bind::<Nullable<Text>, _>(reason)
        .execute(c))?;
    Ok(n == 1)
}

/// Disables an account because the platform said it uninstalled the app, and records
/// which delivery said so (the uninstall a later erasure follows); false when it is not
/// registered.
pub(crate) fn uninstall(
    conn: &mut Conn,
    source: &str,
    account: &str,
    reason: &str,
    event_id: &str,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE accounts SET enabled = FALSE, disabled_reason = $3, disabled_at = {}, \
             uninstalled_by = $4 WHERE source = $1 AND account = $2",
            crate::db::sql::now(b)
        ),
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .bind::<Text, _>(reason)
        .bind::<Text, _>(event_id)
        .execute(c))?;
    Ok(n == 1)
}

/// The delivery that uninstalled a registered account since its last registration:
/// `None` when not registered, `Some(None)` when installed.
pub(crate) fn uninstalled_by(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<Option<Option<String>>> {
    use diesel::OptionalExtension;
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Text>)]
        uninstalled_by: Option<String>,
    }
    let q = query(
        conn.backend(),
        "SELECT uninstalled_by FROM accounts WHERE source = $1 AND account = $2",
    );
    let row: Option<Row> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(account)
        .get_result(c)
        .optional())?;
    Ok(row.map(|r| r.uninstalled_by))
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

/// Seconds since each enabled registered account was added: how long an account that
/// never succeeded has gone without a run (read for freshness).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct AccountAge {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub age_seconds: f64,
}

pub(crate) fn enabled_account_ages(conn: &mut Conn) -> diesel::QueryResult<Vec<AccountAge>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, {} AS age_seconds FROM accounts WHERE enabled",
            age_secs(b, "created_at")
        ),
    );
    on_conn!(conn, c => q.load(c))
}

//! `accounts`: the registry of many-account sources. Only `accounts` calls these.

use diesel::RunQueryDsl;
use diesel::sql_types::{Bool, Text};

use crate::db::sql::{display_time, query};
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
    #[diesel(sql_type = Text)]
    pub created_at: String,
}

/// Registers an account (enabled); one already registered is enabled again.
pub(crate) fn add(conn: &mut Conn, source: &str, account: &str) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let t = if b == crate::config::Backend::Postgres {
        "true"
    } else {
        "1"
    };
    let q = query(
        b,
        &format!(
            "INSERT INTO accounts (source, account) VALUES ($1, $2) \
             ON CONFLICT (source, account) DO UPDATE SET enabled = {t}"
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    Ok(())
}

/// The accounts of `source` (every source's with `""`), by source and account.
pub(crate) fn list(conn: &mut Conn, source: &str) -> diesel::QueryResult<Vec<AccountRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, enabled, {} AS created_at FROM accounts \
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
    let t = if b == crate::config::Backend::Postgres {
        "true"
    } else {
        "1"
    };
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let q = query(
        b,
        &format!(
            "SELECT COUNT(*) AS n FROM accounts WHERE source = $1 AND account = $2 AND enabled = {t}"
        ),
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

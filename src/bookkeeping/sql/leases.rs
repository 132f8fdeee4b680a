//! `reconcile_leases`: who runs a (source, account, kind) now, and the fence a page's
//! write checks.

use super::*;

#[derive(diesel::QueryableByName)]
struct LeaseRow {
    #[diesel(sql_type = Text)]
    holder: String,
    #[diesel(sql_type = Text)]
    expires_at: String,
}

/// Takes the lease of a (source, kind) for `ttl_secs`, if it is free, expired, or ours.
/// Returns the holder after the call (`holder` when taken) and when its lease expires.
pub(crate) fn acquire_lease(
    conn: &mut Conn,
    key: &Key,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<(String, DbTime)> {
    let b = conn.backend();
    let take = format!(
        "INSERT INTO reconcile_leases (source, kind, holder, expires_at, account) VALUES ($1, $2, $3, {}, $5) \
         ON CONFLICT (source, account, kind) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
         WHERE reconcile_leases.expires_at < {} OR reconcile_leases.holder = excluded.holder",
        plus_seconds(b, 4),
        now(b)
    );
    let bind = |q: crate::db::sql::Sql| {
        prepared(
            q.bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Text, _>(holder)
                .bind::<Double, _>(ttl_secs)
                .bind::<Text, _>(key.account.stored()),
        )
    };
    if let Conn::Postgres(c) = conn {
        // One statement (`Db::write_statement`): the lease as taken, or as another
        // holds it. Empty only when another process's insert committed during it: then
        // asked again below.
        let mut rows: Vec<LeaseRow> = bind(query(
            b,
            &format!(
                "WITH taken AS ({take} RETURNING holder, expires_at) \
                 SELECT holder, {expires} AS expires_at FROM taken \
                 UNION ALL SELECT holder, {expires} AS expires_at FROM reconcile_leases \
                 WHERE source = $1 AND kind = $2 AND account = $5 AND NOT EXISTS (SELECT 1 FROM taken)",
                expires = ts_text(b, "expires_at")
            ),
        ))
        .load(c)?;
        if let Some(r) = rows.pop() {
            return Ok((r.holder, DbTime::parse(&r.expires_at)?));
        }
    } else {
        on_conn!(conn, c => bind(query(b, &take)).execute(c))?;
    }
    current_lease(conn, key)?.ok_or(diesel::result::Error::NotFound)
}

/// Who holds the lease of a (source, kind), and until when.
pub(crate) fn current_lease(
    conn: &mut Conn,
    key: &Key,
) -> diesel::QueryResult<Option<(String, DbTime)>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT holder, {} AS expires_at FROM reconcile_leases WHERE source = $1 AND kind = $2 AND account = $3",
            ts_text(b, "expires_at")
        ),
    );
    let mut rows: Vec<LeaseRow> = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.account.stored())).load(c))?;
    rows.pop()
        .map(|r| Ok((r.holder, DbTime::parse(&r.expires_at)?)))
        .transpose()
}

/// Gives `dead`'s lease to `holder` for `ttl_secs` (compare and swap on the holder;
/// `dead == holder` renews); false when the lease has meanwhile moved on.
pub(crate) fn take_over_lease(
    conn: &mut Conn,
    key: &Key,
    dead: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_leases SET holder = $4, expires_at = {} WHERE source = $1 AND kind = $2 AND holder = $3 AND account = $6",
            plus_seconds(b, 5)
        ),
    );
    // Prepared: a renewal fences every reconcile page.
    let n = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(dead)
        .bind::<Text, _>(holder)
        .bind::<Double, _>(ttl_secs)
        .bind::<Text, _>(key.account.stored()))
        .execute(c))?;
    Ok(n == 1)
}

/// On PostgreSQL, a page's lease renewal, checkpoint (`resume_at`, or `None`: cleared,
/// the last page) and run counts in one statement (one round trip where three followed
/// each other on every page, the first waiting for the previous page's commit): the
/// checkpoint and the counts are written only if the lease was still ours. Returns
/// whether it was. The lease row is locked first, as [`renew_lease`] then
/// [`set_checkpoint`] and [`update_run`] lock them.
pub(crate) fn renew_lease_and_record_page(
    c: &mut diesel::PgConnection,
    key: &Key,
    holder: &str,
    ttl_secs: f64,
    resume_at: Option<(&str, DbTime)>,
    run: i64,
    counts: &RunCounts,
) -> diesel::QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let b = crate::config::Backend::Postgres;
    // $1..$5: the lease; $6: the run; $7..$16: its counts; $17, $18: the position.
    let checkpoint = match resume_at {
        Some(_) => format!(
            "INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at, account) \
             SELECT $1, $2, $17, {}, $3 FROM lease \
             ON CONFLICT (source, account, kind) DO UPDATE SET position = excluded.position, \
             sweep_started_at = excluded.sweep_started_at, updated_at = now()",
            ts_param(b, 18)
        ),
        None => {
            "DELETE FROM reconcile_checkpoints WHERE source = $1 AND kind = $2 AND account = $3 \
                 AND EXISTS (SELECT 1 FROM lease)"
                .to_string()
        }
    };
    let q = query(
        b,
        &format!(
            "WITH lease AS (UPDATE reconcile_leases SET expires_at = {} \
             WHERE source = $1 AND kind = $2 AND holder = $4 AND account = $3 RETURNING 1), \
             checkpoint AS ({checkpoint}), \
             run AS (UPDATE reconcile_runs SET status = '{}', finished_at = NULL, error = NULL, {} \
             WHERE id = $6 AND EXISTS (SELECT 1 FROM lease)) \
             SELECT COUNT(*) AS n FROM lease",
            plus_seconds(b, 5),
            RunState::Running.as_str(),
            set_counts(7)
        ),
    );
    let q = bind_counts!(
        q.bind::<Text, _>(key.source.as_str())
            .bind::<Text, _>(key.kind.as_str())
            .bind::<Text, _>(key.account.stored())
            .bind::<Text, _>(holder)
            .bind::<Double, _>(ttl_secs)
            .bind::<BigInt, _>(run),
        counts
    );
    // Prepared: every reconcile page runs it.
    let renewed: Count = match resume_at {
        Some((position, sweep_started_at)) => prepared(
            q.bind::<Text, _>(position)
                .bind::<Text, _>(sweep_started_at.to_db(b)),
        )
        .get_result(c)?,
        None => prepared(q).get_result(c)?,
    };
    Ok(renewed.n == 1)
}

/// Extends our lease; false when it is no longer ours (it expired and was taken).
pub(crate) fn renew_lease(
    conn: &mut Conn,
    key: &Key,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<bool> {
    take_over_lease(conn, key, holder, holder, ttl_secs)
}

pub(crate) fn release_lease(conn: &mut Conn, key: &Key, holder: &str) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_leases WHERE source = $1 AND kind = $2 AND holder = $3 AND account = $4",
    );
    on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(holder)
        .bind::<Text, _>(key.account.stored())).execute(c))?;
    Ok(())
}

/// Revokes every lease of one account, whoever holds it: the account's data is being
/// erased, and a run in flight must not write another page (its next page finds the
/// lease gone and rolls back).
pub(crate) fn revoke_account_leases(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_leases WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))
}

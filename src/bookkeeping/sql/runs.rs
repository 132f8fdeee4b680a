//! `reconcile_runs` (a run's record: start, counts, end) and `reconcile_last_success`.

use super::*;

/// Records the start of a run; returns its id. Runs of the same kind still marked
/// `running` (their process died) become `abandoned`; the caller holds the lease, so
/// no live run of the kind can be among them.
pub(crate) fn start_run(conn: &mut Conn, key: &Key, mode: Mode) -> diesel::QueryResult<i64> {
    const ABANDONED: &str = "SET status = 'abandoned', finished_at = now(), error = 'the process running it stopped before it finished' \
         WHERE source = $1 AND kind = $2 AND account = $3 AND status = 'running'";
    const INSERT: &str = "INSERT INTO reconcile_runs (source, kind, mode, status, account) VALUES ($1, $2, $4, 'running', $3) RETURNING id";
    let b = conn.backend();
    let insert = |q: crate::db::sql::Sql| {
        prepared(
            q.bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Text, _>(key.account.stored())
                .bind::<Text, _>(mode.as_str()),
        )
    };
    let r: RunId = match conn {
        // One statement, committed by itself (`Db::write_statement`).
        Conn::Postgres(c) => insert(query(
            b,
            &format!("WITH abandoned AS (UPDATE reconcile_runs {ABANDONED}) {INSERT}"),
        ))
        .get_result(c)?,
        Conn::Sqlite(c) => {
            prepared(
                query(
                    b,
                    &format!(
                        "UPDATE reconcile_runs {}",
                        ABANDONED.replace("now()", now(b))
                    ),
                )
                .bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Text, _>(key.account.stored()),
            )
            .execute(c)?;
            insert(query(b, INSERT)).get_result(c)?
        }
    };
    Ok(r.id)
}

/// On PostgreSQL, a run's end in one statement: its record (and, if it succeeded, its
/// account-kind's last success), the lease released, the schedule row's end. Five
/// round trips (with `BEGIN` and `COMMIT`) became one. The statements lock different
/// rows than any other transaction waits for together, so their order inside does not
/// matter.
#[expect(
    clippy::too_many_arguments,
    reason = "one statement's parameters: the run, its end, its lease and its schedule row"
)]
pub(crate) fn finish_and_release(
    c: &mut diesel::PgConnection,
    id: i64,
    status: RunState,
    counts: &RunCounts,
    error: Option<&str>,
    key: &Key,
    holder: &str,
    due_status: &str,
) -> diesel::QueryResult<()> {
    let q = query(
        crate::config::Backend::Postgres,
        &format!(
            "WITH run AS (UPDATE reconcile_runs SET status = $1, finished_at = now(), error = $2, {} WHERE id = $3 \
               RETURNING source, account, kind, finished_at), \
             success AS ({}), \
             lease AS (DELETE FROM reconcile_leases WHERE source = $4 AND kind = $5 AND holder = $6 AND account = $7), \
             due AS (UPDATE reconcile_due SET finished_at = now(), status = $18, error = $2 \
               WHERE source = $4 AND account = $7 AND kind = $5) \
             SELECT 1",
            set_counts(8),
            last_success_from("run", &format!("$1 = '{}'", RunState::Succeeded.as_str())),
        ),
    );
    prepared(
        bind_counts!(
            q.bind::<Text, _>(status.as_str())
                .bind::<Nullable<Text>, _>(error)
                .bind::<BigInt, _>(id)
                .bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Text, _>(holder)
                .bind::<Text, _>(key.account.stored()),
            counts
        )
        .bind::<Text, _>(due_status),
    )
    .execute(c)?;
    Ok(())
}

/// The upsert of `reconcile_last_success` from the rows of `runs` (a run just ended)
/// that `condition` selects.
fn last_success_from(runs: &str, condition: &str) -> String {
    format!(
        "INSERT INTO reconcile_last_success (source, account, kind, succeeded_at) \
         SELECT source, account, kind, finished_at FROM {runs} WHERE {condition} \
         ON CONFLICT (source, account, kind) DO UPDATE SET succeeded_at = excluded.succeeded_at"
    )
}

/// Records a run's progress (`Running`) or end.
pub(crate) fn update_run(
    conn: &mut Conn,
    id: i64,
    status: RunState,
    counts: &RunCounts,
    error: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let finished = if status == RunState::Running {
        "NULL"
    } else {
        now(b)
    };
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_runs SET status = $1, finished_at = {finished}, error = $2, {} WHERE id = $3",
            set_counts(4)
        ),
    );
    // Prepared: every reconcile page records its counts.
    on_conn!(conn, c => prepared(bind_counts!(q
        .bind::<Text, _>(status.as_str())
        .bind::<Nullable<Text>, _>(error)
        .bind::<BigInt, _>(id), counts))
        .execute(c))?;
    if status == RunState::Succeeded {
        // Freshness reads this one row per account-kind, not the runs.
        let q = query(b, &last_success_from("reconcile_runs", "id = $1"));
        on_conn!(conn, c => prepared(q.bind::<BigInt, _>(id)).execute(c))?;
    }
    Ok(())
}

/// Age of the last successful run of each (source, account, kind) that has one.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct SuccessAge {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Double)]
    pub age_seconds: f64,
}

pub(crate) fn last_success_ages(conn: &mut Conn) -> diesel::QueryResult<Vec<SuccessAge>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, account, kind, {} AS age_seconds FROM reconcile_last_success",
            age_secs(b, "succeeded_at")
        ),
    );
    on_conn!(conn, c => q.load(c))
}

/// Forgets a removed account's last successes.
pub(crate) fn forget_account(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_last_success WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    Ok(())
}

/// One reconcile run, for `status`.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct RunRow {
    #[diesel(sql_type = Text)]
    pub mode: String,
    #[diesel(sql_type = Text)]
    pub status: String,
    #[diesel(sql_type = Text)]
    pub started_at: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub finished_at: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub scanned: i64,
    #[diesel(sql_type = BigInt)]
    pub missing: i64,
    #[diesel(sql_type = BigInt)]
    pub newer_remote: i64,
    #[diesel(sql_type = BigInt)]
    pub differing: i64,
    #[diesel(sql_type = BigInt)]
    pub newer_local: i64,
    #[diesel(sql_type = BigInt)]
    pub applied: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
}

pub(crate) fn recent_runs(
    conn: &mut Conn,
    key: &Key,
    any_account: bool,
    limit: i64,
) -> diesel::QueryResult<Vec<RunRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT mode, status, {} AS started_at, {} AS finished_at, scanned, missing, newer_remote, differing, newer_local, applied, error \
             FROM reconcile_runs WHERE source = $1 AND kind = $2 AND ($4 OR account = $5) ORDER BY id DESC LIMIT $3",
            display_time(b, "started_at"),
            display_time(b, "finished_at"),
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<BigInt, _>(limit)
        .bind::<diesel::sql_types::Bool, _>(any_account)
        .bind::<Text, _>(key.account.stored())
        .load(c))
}

/// How many items the kind's last successful full sweep listed (`None`: none yet).
pub(crate) fn last_full_sweep_size(conn: &mut Conn, key: &Key) -> diesel::QueryResult<Option<i64>> {
    let q = query(
        conn.backend(),
        "SELECT scanned AS n FROM reconcile_runs WHERE source = $1 AND account = $2 AND kind = $3 \
         AND mode = $4 AND status = $5 ORDER BY started_at DESC, id DESC LIMIT 1",
    );
    let mut rows: Vec<N> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(Mode::Full.as_str())
        .bind::<Text, _>(RunState::Succeeded.as_str())
        .load(c))?;
    Ok(rows.pop().map(|r| r.n))
}

/// The runs of `key` that were running at `at` (a change's time): the runs that wrote it.
pub(crate) fn runs_at(conn: &mut Conn, key: &Key, at: &str) -> diesel::QueryResult<Vec<RunRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT mode, status, {} AS started_at, {} AS finished_at, scanned, missing, newer_remote, differing, newer_local, applied, error \
             FROM reconcile_runs WHERE source = $1 AND account = $2 AND kind = $3 \
             AND started_at <= {at} AND (finished_at IS NULL OR finished_at >= {at}) ORDER BY id",
            display_time(b, "started_at"),
            display_time(b, "finished_at"),
            at = ts_param(b, 4),
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(at)
        .load(c))
}

//! Reconcile bookkeeping: `reconcile_runs`, `reconcile_leases`, `reconcile_checkpoints`,
//! `reconcile_state`, `reconcile_last_success`, `reconcile_paused`, `prune_runs`, and
//! `reconcile_due` (`due`: the schedule). Only `bookkeeping` calls these.

pub(crate) mod due;

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Bool, Double, Nullable, Text};

use super::{Mode, RunCounts, RunState};
use crate::change::Key;
use crate::db::sql::{
    RunId, TextValue, age_secs, display_time, minus_seconds, now, plus_seconds, prepared, query,
    ts_param, ts_text,
};
use crate::db::{Conn, DbTime, on_conn};

/// The database's clock: the one clock every replica agrees on, used for sweep starts
/// and leases (never for versions).
pub(crate) fn db_now(conn: &mut Conn) -> diesel::QueryResult<DbTime> {
    let b = conn.backend();
    let q = query(
        b,
        &format!("SELECT {} AS v", ts_text(b, crate::db::sql::now(b))),
    );
    let r: TextValue = on_conn!(conn, c => q.get_result(c))?;
    DbTime::parse(&r.v)
}

/// Records the start of a run; returns its id. Runs of the same kind still marked
/// `running` (their process died) become `abandoned`; the caller holds the lease, so
/// no live run of the kind can be among them.
pub(crate) fn start_run(conn: &mut Conn, key: &Key, mode: Mode) -> diesel::QueryResult<i64> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_runs SET status = 'abandoned', finished_at = {}, error = 'the process running it stopped before it finished' \
             WHERE source = $1 AND kind = $2 AND account = $3 AND status = 'running'",
            now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(key.source.as_str()).bind::<Text, _>(key.kind.as_str()).bind::<Text, _>(key.account.as_str()).execute(c))?;
    let q = query(
        b,
        "INSERT INTO reconcile_runs (source, kind, mode, status, account) VALUES ($1, $2, $3, 'running', $4) RETURNING id",
    );
    let r: RunId = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(mode.as_str())
        .bind::<Text, _>(key.account.as_str())
        .get_result(c))?;
    Ok(r.id)
}

/// A run's count columns, in the order `bind_counts!` binds them.
const COUNT_COLUMNS: [&str; 10] = [
    "pages",
    "scanned",
    "missing",
    "newer_remote",
    "differing",
    "newer_local",
    "equal",
    "applied",
    "tombstoned",
    "skipped",
];

/// `pages = $first, scanned = $first+1, ..`: [`COUNT_COLUMNS`] set from consecutive
/// parameters, bound by `bind_counts!` after the statement's others.
fn set_counts(first: usize) -> String {
    COUNT_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| format!("{column} = ${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds a [`RunCounts`] as [`set_counts`] numbers them.
macro_rules! bind_counts {
    ($q:expr, $counts:expr) => {{
        let c: &RunCounts = $counts;
        $q.bind::<BigInt, _>(c.pages)
            .bind::<BigInt, _>(c.scanned)
            .bind::<BigInt, _>(c.missing)
            .bind::<BigInt, _>(c.newer_remote)
            .bind::<BigInt, _>(c.differing)
            .bind::<BigInt, _>(c.newer_local)
            .bind::<BigInt, _>(c.equal)
            .bind::<BigInt, _>(c.applied)
            .bind::<BigInt, _>(c.tombstoned)
            .bind::<BigInt, _>(c.skipped)
    }};
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
        let q = query(
            b,
            "INSERT INTO reconcile_last_success (source, account, kind, succeeded_at) \
             SELECT source, account, kind, finished_at FROM reconcile_runs WHERE id = $1 \
             ON CONFLICT (source, account, kind) DO UPDATE SET succeeded_at = excluded.succeeded_at",
        );
        on_conn!(conn, c => q.bind::<BigInt, _>(id).execute(c))?;
    }
    Ok(())
}

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
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_leases (source, kind, holder, expires_at, account) VALUES ($1, $2, $3, {}, $5) \
             ON CONFLICT (source, account, kind) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE reconcile_leases.expires_at < {} OR reconcile_leases.holder = excluded.holder",
            plus_seconds(b, 4),
            now(b)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(holder)
        .bind::<Double, _>(ttl_secs)
        .bind::<Text, _>(key.account.as_str())
        .execute(c))?;
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
    let mut rows: Vec<LeaseRow> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.account.as_str())
        .load(c))?;
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
        .bind::<Text, _>(key.account.as_str()))
        .execute(c))?;
    Ok(n == 1)
}

/// On PostgreSQL, a page's lease renewal, checkpoint and run counts in one statement
/// (one round trip where three followed each other on every page, the first waiting
/// for the previous page's commit): the checkpoint and the counts are written only if
/// the lease was still ours. Returns whether it was. The lease row is locked first, as
/// [`renew_lease`] then [`set_checkpoint`] and [`update_run`] lock them.
#[expect(
    clippy::too_many_arguments,
    reason = "one statement's parameters: the lease, the page's position and the run's counts"
)]
pub(crate) fn renew_lease_and_record_page(
    c: &mut diesel::PgConnection,
    key: &Key,
    holder: &str,
    ttl_secs: f64,
    position: &str,
    sweep_started_at: DbTime,
    run: i64,
    counts: &RunCounts,
) -> diesel::QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let b = crate::config::Backend::Postgres;
    let q = query(
        b,
        &format!(
            "WITH lease AS (UPDATE reconcile_leases SET expires_at = {} \
             WHERE source = $1 AND kind = $2 AND holder = $4 AND account = $3 RETURNING 1), \
             checkpoint AS (INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at, account) \
             SELECT $1, $2, $6, {}, $3 FROM lease \
             ON CONFLICT (source, account, kind) DO UPDATE SET position = excluded.position, \
             sweep_started_at = excluded.sweep_started_at, updated_at = now()), \
             run AS (UPDATE reconcile_runs SET status = '{}', finished_at = NULL, error = NULL, {} \
             WHERE id = $8 AND EXISTS (SELECT 1 FROM lease)) \
             SELECT COUNT(*) AS n FROM lease",
            plus_seconds(b, 5),
            ts_param(b, 7),
            RunState::Running.as_str(),
            set_counts(9)
        ),
    );
    // Prepared: every reconcile page runs it.
    let renewed: Count = prepared(bind_counts!(
        q.bind::<Text, _>(key.source.as_str())
            .bind::<Text, _>(key.kind.as_str())
            .bind::<Text, _>(key.account.as_str())
            .bind::<Text, _>(holder)
            .bind::<Double, _>(ttl_secs)
            .bind::<Text, _>(position)
            .bind::<Text, _>(sweep_started_at.to_db(b))
            .bind::<BigInt, _>(run),
        counts
    ))
    .get_result(c)?;
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
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(holder)
        .bind::<Text, _>(key.account.as_str())
        .execute(c))?;
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct CheckpointRow {
    #[diesel(sql_type = Text)]
    position: String,
    #[diesel(sql_type = Text)]
    sweep_started_at: String,
}

/// Where an unfinished sweep stopped.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The sender's next position, encoded (`sender::Next::encode`).
    pub position: String,
    pub sweep_started_at: DbTime,
}

pub(crate) fn checkpoint(conn: &mut Conn, key: &Key) -> diesel::QueryResult<Option<Checkpoint>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT position, {} AS sweep_started_at FROM reconcile_checkpoints WHERE source = $1 AND kind = $2 AND account = $3",
            ts_text(b, "sweep_started_at")
        ),
    );
    let mut rows: Vec<CheckpointRow> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.account.as_str())
        .load(c))?;
    rows.pop()
        .map(|r| {
            Ok(Checkpoint {
                position: r.position,
                sweep_started_at: DbTime::parse(&r.sweep_started_at)?,
            })
        })
        .transpose()
}

/// Records (`Some`) or clears (`None`) where the current sweep is.
pub(crate) fn set_checkpoint(
    conn: &mut Conn,
    key: &Key,
    at: Option<(&str, DbTime)>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    match at {
        Some((position, sweep_started_at)) => {
            let q = query(
                b,
                &format!(
                    "INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at, account) VALUES ($1, $2, $3, {}, $5) \
                     ON CONFLICT (source, account, kind) DO UPDATE SET position = excluded.position, \
                     sweep_started_at = excluded.sweep_started_at, updated_at = {}",
                    ts_param(b, 4),
                    now(b)
                ),
            );
            // Prepared: every reconcile page moves its checkpoint.
            on_conn!(conn, c => prepared(q
                .bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Text, _>(position)
                .bind::<Text, _>(sweep_started_at.to_db(b))
                .bind::<Text, _>(key.account.as_str()))
                .execute(c))?;
        }
        None => {
            let q = query(
                b,
                "DELETE FROM reconcile_checkpoints WHERE source = $1 AND kind = $2 AND account = $3",
            );
            on_conn!(conn, c => q.bind::<Text, _>(key.source.as_str()).bind::<Text, _>(key.kind.as_str()).bind::<Text, _>(key.account.as_str()).execute(c))?;
        }
    }
    Ok(())
}

/// Incremental state of a kind: the watermark, and whether a full sweep is due
/// (none yet, or the last began more than `full_every_secs` ago).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct SweepState {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub watermark: Option<i64>,
    #[diesel(sql_type = Bool)]
    pub full_due: bool,
}

pub(crate) fn sweep_state(
    conn: &mut Conn,
    key: &Key,
    full_every_secs: f64,
) -> diesel::QueryResult<SweepState> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT watermark, (last_full_at IS NULL OR last_full_at < {}) AS full_due FROM reconcile_state WHERE source = $1 AND kind = $2 AND account = $4",
            crate::db::sql::minus_seconds(b, 3)
        ),
    );
    let mut rows: Vec<SweepState> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Double, _>(full_every_secs)
        .bind::<Text, _>(key.account.as_str())
        .load(c))?;
    Ok(rows.pop().unwrap_or(SweepState {
        watermark: None,
        full_due: true,
    }))
}

/// Raises the watermark (never lowers it) and, after a complete full sweep, records
/// when that sweep began.
pub(crate) fn save_sweep_state(
    conn: &mut Conn,
    key: &Key,
    watermark: Option<i64>,
    full_sweep_started: Option<DbTime>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_state (source, kind, watermark, last_full_at, account) VALUES ($1, $2, $3, {}, $5) \
             ON CONFLICT (source, account, kind) DO UPDATE SET \
             watermark = CASE WHEN reconcile_state.watermark IS NULL OR excluded.watermark > reconcile_state.watermark \
                              THEN COALESCE(excluded.watermark, reconcile_state.watermark) ELSE reconcile_state.watermark END, \
             last_full_at = COALESCE(excluded.last_full_at, reconcile_state.last_full_at)",
            ts_param(b, 4)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Nullable<BigInt>, _>(watermark)
        .bind::<Nullable<Text>, _>(full_sweep_started.map(|t| t.to_db(b)))
        .bind::<Text, _>(key.account.as_str())
        .execute(c))?;
    Ok(())
}

/// Deletes at most `limit` finished reconcile runs (and prune runs) older than `age_secs`.
pub(crate) fn prune_runs(conn: &mut Conn, age_secs: f64, limit: i64) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let mut n = 0;
    for table in ["reconcile_runs", "prune_runs"] {
        let q = query(
            b,
            &format!(
                "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE started_at < {} AND finished_at IS NOT NULL LIMIT $2)",
                minus_seconds(b, 1)
            ),
        );
        n += on_conn!(conn, c => q
            .bind::<Double, _>(age_secs)
            .bind::<BigInt, _>(limit)
            .execute(c))?;
    }
    Ok(n)
}

/// Records a retention pass; returns its id.
pub(crate) fn start_prune(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let q = query(
        conn.backend(),
        "INSERT INTO prune_runs (processed_events) VALUES (0) RETURNING id",
    );
    let r: RunId = on_conn!(conn, c => q.get_result(c))?;
    Ok(r.id)
}

pub(crate) fn finish_prune(
    conn: &mut Conn,
    id: i64,
    events: i64,
    runs: i64,
    dead: i64,
    error: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE prune_runs SET finished_at = {}, processed_events = $1, reconcile_runs = $2, dead_letters = $3, error = $4 WHERE id = $5",
            now(b)
        ),
    );
    on_conn!(conn, c => q
        .bind::<BigInt, _>(events)
        .bind::<BigInt, _>(runs)
        .bind::<BigInt, _>(dead)
        .bind::<Nullable<Text>, _>(error)
        .bind::<BigInt, _>(id)
        .execute(c))?;
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
    limit: i64,
) -> diesel::QueryResult<Vec<RunRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT mode, status, {} AS started_at, {} AS finished_at, scanned, missing, newer_remote, differing, newer_local, applied, error \
             FROM reconcile_runs WHERE source = $1 AND kind = $2 AND account = $4 ORDER BY id DESC LIMIT $3",
            display_time(b, "started_at"),
            display_time(b, "finished_at"),
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(key.account.as_str())
        .load(c))
}

/// A single count.
#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
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
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(Mode::Full.as_str())
        .bind::<Text, _>(RunState::Succeeded.as_str())
        .load(c))?;
    Ok(rows.pop().map(|r| r.n))
}

/// The last retention pass.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct PruneRow {
    #[diesel(sql_type = Text)]
    pub started_at: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub finished_at: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub processed_events: i64,
    #[diesel(sql_type = BigInt)]
    pub reconcile_runs: i64,
    #[diesel(sql_type = BigInt)]
    pub dead_letters: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
}

pub(crate) fn last_prune(conn: &mut Conn) -> diesel::QueryResult<Option<PruneRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT {} AS started_at, {} AS finished_at, processed_events, reconcile_runs, dead_letters, error FROM prune_runs ORDER BY id DESC LIMIT 1",
            display_time(b, "started_at"),
            display_time(b, "finished_at")
        ),
    );
    let mut rows: Vec<PruneRow> = on_conn!(conn, c => q.load(c))?;
    Ok(rows.pop())
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
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(at)
        .load(c))
}

/// Pauses (or resumes) reconciling `kind` of `source` (`""`: every kind of it);
/// whether anything changed.
pub(crate) fn set_reconcile_paused(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    paused: bool,
) -> diesel::QueryResult<bool> {
    let q = if paused {
        query(
            conn.backend(),
            "INSERT INTO reconcile_paused (source, kind) VALUES ($1, $2) ON CONFLICT (source, kind) DO NOTHING",
        )
    } else {
        query(
            conn.backend(),
            "DELETE FROM reconcile_paused WHERE source = $1 AND kind = $2",
        )
    };
    Ok(on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))? > 0)
}

/// Whether `kind` of `source` is paused, by itself or with its whole source.
pub(crate) fn reconcile_paused(
    conn: &mut Conn,
    source: &str,
    kind: &str,
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "SELECT COUNT(*) AS n FROM reconcile_paused WHERE source = $1 AND (kind = $2 OR kind = '')",
    );
    Ok(
        on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).get_result::<N>(c))?.n
            > 0,
    )
}

/// Every pause, as (source, kind) (`kind` `""`: the whole source).
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct PausedRow {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub paused_at: String,
}

pub(crate) fn paused_rows(conn: &mut Conn) -> diesel::QueryResult<Vec<PausedRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, kind, {} AS paused_at FROM reconcile_paused ORDER BY source, kind",
            display_time(b, "paused_at")
        ),
    );
    on_conn!(conn, c => q.load(c))
}

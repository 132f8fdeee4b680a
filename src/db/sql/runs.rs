//! Reconcile bookkeeping: `reconcile_runs`, `reconcile_leases`, `reconcile_checkpoints`
//! and `reconcile_state`. Only `bookkeeping` calls these.

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Bool, Double, Nullable, Text};

use super::{RunId, TextValue, now, plus_seconds, prepared, query, ts_param, ts_text};
use crate::db::{Conn, DbTime, on_conn};

/// `reconcile_runs.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    /// Its process stopped before it finished; set by the next run of the kind.
    Abandoned,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Abandoned => "abandoned",
        }
    }
}

/// `reconcile_runs.mode`: what a run lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Everything.
    Full,
    /// What changed since the watermark.
    Incremental,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Incremental => "incremental",
        }
    }
}

/// Counts of one run, as stored in `reconcile_runs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RunCounts {
    pub pages: i64,
    pub scanned: i64,
    /// Listed by the sender, absent here.
    pub missing: i64,
    /// Newer version at the sender.
    pub newer_remote: i64,
    /// Same version, different state (or a local tombstone of a listed item).
    pub differing: i64,
    /// Newer here (a webhook overtook the listing): never overwritten.
    pub newer_local: i64,
    pub equal: i64,
    /// Rows written (or, in a dry run, that would be).
    pub applied: i64,
    /// Live rows the complete sweep did not see, marked deleted.
    pub tombstoned: i64,
    /// Listed items that could not be read or stored: reported and skipped.
    pub skipped: i64,
}

/// The database's clock: the one clock every replica agrees on, used for sweep starts
/// and leases (never for versions).
pub fn db_now(conn: &mut Conn) -> diesel::QueryResult<DbTime> {
    let b = conn.backend();
    let q = query(b, &format!("SELECT {} AS v", ts_text(b, super::now(b))));
    let r: TextValue = on_conn!(conn, c => q.get_result(c))?;
    DbTime::parse(&r.v)
}

/// Records the start of a run; returns its id. Runs of the same kind still marked
/// `running` (their process died) become `abandoned`; the caller holds the lease, so
/// no live run of the kind can be among them.
pub fn start_run(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    mode: Mode,
) -> diesel::QueryResult<i64> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_runs SET status = 'abandoned', finished_at = {}, error = 'the process running it stopped before it finished' \
             WHERE source = $1 AND kind = $2 AND status = 'running'",
            now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))?;
    let q = query(
        b,
        "INSERT INTO reconcile_runs (source, kind, mode, status) VALUES ($1, $2, $3, 'running') RETURNING id",
    );
    let r: RunId = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(mode.as_str())
        .get_result(c))?;
    Ok(r.id)
}

/// Records a run's progress (`Running`) or end.
pub fn update_run(
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
            "UPDATE reconcile_runs SET status = $1, finished_at = {finished}, pages = $2, scanned = $3, missing = $4, \
             newer_remote = $5, differing = $6, newer_local = $7, equal = $8, applied = $9, tombstoned = $10, error = $11, \
             skipped = $13 WHERE id = $12"
        ),
    );
    // Prepared: every reconcile page records its counts.
    on_conn!(conn, c => prepared(q
        .bind::<Text, _>(status.as_str())
        .bind::<BigInt, _>(counts.pages)
        .bind::<BigInt, _>(counts.scanned)
        .bind::<BigInt, _>(counts.missing)
        .bind::<BigInt, _>(counts.newer_remote)
        .bind::<BigInt, _>(counts.differing)
        .bind::<BigInt, _>(counts.newer_local)
        .bind::<BigInt, _>(counts.equal)
        .bind::<BigInt, _>(counts.applied)
        .bind::<BigInt, _>(counts.tombstoned)
        .bind::<Nullable<Text>, _>(error)
        .bind::<BigInt, _>(id)
        .bind::<BigInt, _>(counts.skipped))
        .execute(c))?;
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
pub fn acquire_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<(String, DbTime)> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_leases (source, kind, holder, expires_at) VALUES ($1, $2, $3, {}) \
             ON CONFLICT (source, kind) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
             WHERE reconcile_leases.expires_at < {} OR reconcile_leases.holder = excluded.holder",
            plus_seconds(b, 4),
            now(b)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(holder)
        .bind::<Double, _>(ttl_secs)
        .execute(c))?;
    current_lease(conn, source, kind)?.ok_or(diesel::result::Error::NotFound)
}

/// Who holds the lease of a (source, kind), and until when.
pub fn current_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
) -> diesel::QueryResult<Option<(String, DbTime)>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT holder, {} AS expires_at FROM reconcile_leases WHERE source = $1 AND kind = $2",
            ts_text(b, "expires_at")
        ),
    );
    let mut rows: Vec<LeaseRow> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .load(c))?;
    rows.pop()
        .map(|r| Ok((r.holder, DbTime::parse(&r.expires_at)?)))
        .transpose()
}

/// Gives `dead`'s lease to `holder` for `ttl_secs` (compare and swap on the holder;
/// `dead == holder` renews); false when the lease has meanwhile moved on.
pub fn take_over_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    dead: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE reconcile_leases SET holder = $4, expires_at = {} WHERE source = $1 AND kind = $2 AND holder = $3",
            plus_seconds(b, 5)
        ),
    );
    // Prepared: a renewal fences every reconcile page.
    let n = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(dead)
        .bind::<Text, _>(holder)
        .bind::<Double, _>(ttl_secs))
        .execute(c))?;
    Ok(n == 1)
}

/// Extends our lease; false when it is no longer ours (it expired and was taken).
pub fn renew_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<bool> {
    take_over_lease(conn, source, kind, holder, holder, ttl_secs)
}

pub fn release_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "DELETE FROM reconcile_leases WHERE source = $1 AND kind = $2 AND holder = $3",
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(holder)
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

pub fn checkpoint(
    conn: &mut Conn,
    source: &str,
    kind: &str,
) -> diesel::QueryResult<Option<Checkpoint>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT position, {} AS sweep_started_at FROM reconcile_checkpoints WHERE source = $1 AND kind = $2",
            ts_text(b, "sweep_started_at")
        ),
    );
    let mut rows: Vec<CheckpointRow> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
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
pub fn set_checkpoint(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    at: Option<(&str, DbTime)>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    match at {
        Some((position, sweep_started_at)) => {
            let q = query(
                b,
                &format!(
                    "INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at) VALUES ($1, $2, $3, {}) \
                     ON CONFLICT (source, kind) DO UPDATE SET position = excluded.position, \
                     sweep_started_at = excluded.sweep_started_at, updated_at = {}",
                    ts_param(b, 4),
                    now(b)
                ),
            );
            // Prepared: every reconcile page moves its checkpoint.
            on_conn!(conn, c => prepared(q
                .bind::<Text, _>(source)
                .bind::<Text, _>(kind)
                .bind::<Text, _>(position)
                .bind::<Text, _>(sweep_started_at.to_db(b)))
                .execute(c))?;
        }
        None => {
            let q = query(
                b,
                "DELETE FROM reconcile_checkpoints WHERE source = $1 AND kind = $2",
            );
            on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))?;
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

pub fn sweep_state(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    full_every_secs: f64,
) -> diesel::QueryResult<SweepState> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT watermark, (last_full_at IS NULL OR last_full_at < {}) AS full_due FROM reconcile_state WHERE source = $1 AND kind = $2",
            super::minus_seconds(b, 3)
        ),
    );
    let mut rows: Vec<SweepState> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Double, _>(full_every_secs)
        .load(c))?;
    Ok(rows.pop().unwrap_or(SweepState {
        watermark: None,
        full_due: true,
    }))
}

/// Raises the watermark (never lowers it) and, after a complete full sweep, records
/// when that sweep began.
pub fn save_sweep_state(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    watermark: Option<i64>,
    full_sweep_started: Option<DbTime>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO reconcile_state (source, kind, watermark, last_full_at) VALUES ($1, $2, $3, {}) \
             ON CONFLICT (source, kind) DO UPDATE SET \
             watermark = CASE WHEN reconcile_state.watermark IS NULL OR excluded.watermark > reconcile_state.watermark \
                              THEN COALESCE(excluded.watermark, reconcile_state.watermark) ELSE reconcile_state.watermark END, \
             last_full_at = COALESCE(excluded.last_full_at, reconcile_state.last_full_at)",
            ts_param(b, 4)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Nullable<BigInt>, _>(watermark)
        .bind::<Nullable<Text>, _>(full_sweep_started.map(|t| t.to_db(b)))
        .execute(c))?;
    Ok(())
}

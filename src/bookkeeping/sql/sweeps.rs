//! `reconcile_checkpoints` (where an unfinished sweep resumes) and `reconcile_state`
//! (the incremental watermark, when the last full sweep began).

use super::*;

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
    let mut rows: Vec<CheckpointRow> = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.account.stored())).load(c))?;
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
                .bind::<Text, _>(key.account.stored()))
                .execute(c))?;
        }
        None => {
            let q = query(
                b,
                "DELETE FROM reconcile_checkpoints WHERE source = $1 AND kind = $2 AND account = $3",
            );
            on_conn!(conn, c => prepared(q.bind::<Text, _>(key.source.as_str()).bind::<Text, _>(key.kind.as_str()).bind::<Text, _>(key.account.stored())).execute(c))?;
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
    let mut rows: Vec<SweepState> = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Double, _>(full_every_secs)
        .bind::<Text, _>(key.account.stored())).load(c))?;
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
        .bind::<Text, _>(key.account.stored())
        .execute(c))?;
    Ok(())
}

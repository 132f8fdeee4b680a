//! `reconcile_checkpoints` (where an unfinished sweep resumes) and `reconcile_state`
//! (the incremental watermark, when the last full sweep began).

use super::*;

/// Where an unfinished sweep stopped.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The sender's next position, encoded (`sender::Next::encode`).
    pub position: String,
    pub sweep_started_at: DbTime,
}

/// Where a run of `key` starts, in one statement (three round trips before): its
/// checkpoint, its incremental state (a full sweep due when the last began more than
/// `full_every_secs` ago; no state: due), and the database's clock.
pub(crate) fn sweep_position(
    conn: &mut Conn,
    key: &Key,
    full_every_secs: f64,
) -> diesel::QueryResult<(Option<Checkpoint>, SweepState, DbTime)> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Text>)]
        position: Option<String>,
        #[diesel(sql_type = Nullable<Text>)]
        sweep_started_at: Option<String>,
        #[diesel(sql_type = Nullable<BigInt>)]
        watermark: Option<i64>,
        #[diesel(sql_type = Bool)]
        full_due: bool,
        #[diesel(sql_type = Text)]
        now: String,
    }
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT cp.position, {} AS sweep_started_at, st.watermark, COALESCE(st.full_due, TRUE) AS full_due, {} AS now \
             FROM (SELECT 1 AS one) o \
             LEFT JOIN reconcile_checkpoints cp ON cp.source = $1 AND cp.kind = $2 AND cp.account = $3 \
             LEFT JOIN (SELECT watermark, (last_full_at IS NULL OR last_full_at < {}) AS full_due \
               FROM reconcile_state WHERE source = $1 AND kind = $2 AND account = $3) st ON 1 = 1",
            ts_text(b, "cp.sweep_started_at"),
            ts_text(b, crate::db::sql::now(b)),
            minus_seconds(b, 4)
        ),
    );
    let r: Row = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Double, _>(full_every_secs))
        .get_result(c))?;
    let checkpoint = match (r.position, r.sweep_started_at) {
        (Some(position), Some(started)) => Some(Checkpoint {
            position,
            sweep_started_at: DbTime::parse(&started)?,
        }),
        _ => None,
    };
    let state = SweepState {
        watermark: r.watermark,
        full_due: r.full_due,
    };
    Ok((checkpoint, state, DbTime::parse(&r.now)?))
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
#[derive(Debug, Clone)]
pub struct SweepState {
    pub watermark: Option<i64>,
    pub full_due: bool,
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

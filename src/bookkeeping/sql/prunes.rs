//! `prune_runs`: each retention pass and what it deleted.

use super::*;

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

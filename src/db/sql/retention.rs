//! Retention: bounded deletes through the time indexes, and the `prune_runs` record.

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Double, Nullable, Text};

use super::{RunId, minus_seconds, now, query};
use crate::db::{Conn, on_conn};

/// Deletes at most `limit` processed event ids of `source` older than `age_secs`,
/// walking the `processed_at` index; returns how many.
pub fn prune_events(
    conn: &mut Conn,
    source: &str,
    age_secs: f64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "DELETE FROM processed_events WHERE (source, event_id) IN (\
             SELECT source, event_id FROM processed_events WHERE processed_at < {} AND source = $2 LIMIT $3)",
            minus_seconds(b, 1)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Double, _>(age_secs)
        .bind::<Text, _>(source)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// Deletes at most `limit` finished reconcile runs (and prune runs) older than `age_secs`.
pub fn prune_runs(conn: &mut Conn, age_secs: f64, limit: i64) -> diesel::QueryResult<usize> {
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

/// Deletes at most `limit` dead letters last seen more than `age_secs` ago.
pub fn prune_dead_letters(
    conn: &mut Conn,
    age_secs: f64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "DELETE FROM dead_letters WHERE (source, event_id) IN (\
             SELECT source, event_id FROM dead_letters WHERE last_seen_at < {} LIMIT $2)",
            minus_seconds(b, 1)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Double, _>(age_secs)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// Records a retention pass; returns its id.
pub fn start_prune(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let q = query(
        conn.backend(),
        "INSERT INTO prune_runs (processed_events) VALUES (0) RETURNING id",
    );
    let r: RunId = on_conn!(conn, c => q.get_result(c))?;
    Ok(r.id)
}

pub fn finish_prune(
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

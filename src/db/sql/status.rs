//! Read-only summaries for `status`, `/readyz` and metrics.

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Double, Nullable, Text};

use super::query;
use crate::config::Backend;
use crate::db::{Conn, on_conn};

/// A stored timestamp as display text (milliseconds) on both backends.
fn display_time(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
        }
        Backend::Sqlite => column.to_string(),
    }
}

fn age_secs(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("CAST(EXTRACT(EPOCH FROM now() - {column}) AS DOUBLE PRECISION)")
        }
        Backend::Sqlite => format!("((julianday('now') - julianday({column})) * 86400.0)"),
    }
}

/// Age of the last successful run of each (source, kind) that has one.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct SuccessAge {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Double)]
    pub age_seconds: f64,
}

pub fn last_success_ages(conn: &mut Conn) -> diesel::QueryResult<Vec<SuccessAge>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, kind, {} AS age_seconds FROM (SELECT source, kind, MAX(finished_at) AS last FROM reconcile_runs \
             WHERE status = 'succeeded' GROUP BY source, kind) t",
            age_secs(b, "last")
        ),
    );
    on_conn!(conn, c => q.load(c))
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

pub fn recent_runs(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<RunRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT mode, status, {} AS started_at, {} AS finished_at, scanned, missing, newer_remote, differing, newer_local, applied, error \
             FROM reconcile_runs WHERE source = $1 AND kind = $2 ORDER BY id DESC LIMIT $3",
            display_time(b, "started_at"),
            display_time(b, "finished_at"),
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<BigInt, _>(limit)
        .load(c))
}

#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct SourceCount {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

pub fn dead_letter_counts(conn: &mut Conn) -> diesel::QueryResult<Vec<SourceCount>> {
    let q = query(
        conn.backend(),
        "SELECT source, COUNT(*) AS count FROM dead_letters GROUP BY source",
    );
    on_conn!(conn, c => q.load(c))
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

pub fn last_prune(conn: &mut Conn) -> diesel::QueryResult<Option<PruneRow>> {
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

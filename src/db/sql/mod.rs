//! What the three table owners' SQL shares: placeholders, prepared statements, clock and
//! timestamp expressions. The statements themselves live with their tables' owners:
//! `store::sql` (`resources`, `processed_events`, `dead_letters`), `bookkeeping::sql`
//! (`reconcile_*`, `prune_runs`) and `feed::sql` (`change_pending`, `changes`,
//! `change_seq`, `consumer_*`). Nothing else names them (`tests/it/structure.rs`).
//!
//! Placeholders are written one way, PostgreSQL's `$n`, and [`query`] turns them into
//! SQLite's `?n` (which binds by the same number), so no statement is written twice
//! just for its placeholders. Where the backends really differ (JSONB casts,
//! `IS DISTINCT FROM`, clock functions) the statement says so with a `match`.
//! Statements never contain a literal `$`.

mod statement;

use diesel::sql_types::{BigInt, Text};

use crate::config::Backend;

pub(crate) use statement::{Sql, prepared, query};

/// The database clock's "now", as each backend stores timestamps.
pub(crate) fn now(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    }
}

/// `now + $n seconds`.
pub(crate) fn plus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() + make_interval(secs => ${n})"),
        Backend::Sqlite => {
            format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || ${n} || ' seconds')")
        }
    }
}

/// `now - $n seconds`.
pub(crate) fn minus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() - make_interval(secs => ${n})"),
        Backend::Sqlite => {
            format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ${n} || ' seconds')")
        }
    }
}

/// A bound timestamp parameter `$n` (ISO 8601 UTC text) compared with a stored one.
/// On PostgreSQL the cast is a scalar subquery, computed once per statement: a bare
/// `$n::timestamptz` in a filter is parsed again for every row it is compared with (the
/// text-to-timestamptz input is not folded into a constant), and the deletion scan's
/// `updated_at < $3::timestamptz` over 10,000 rows took 8.4 ms where the same scan with
/// the cast once took 4.9 ms (2026-12-05, 1M rows).
pub(crate) fn ts_param(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("(SELECT ${n}::timestamptz)"),
        Backend::Sqlite => format!("${n}"),
    }
}

/// A stored timestamp column as ISO 8601 UTC text with microseconds, the form
/// [`crate::db::DbTime`] parses on both backends.
pub(crate) fn ts_text(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
        }
        Backend::Sqlite => column.to_string(),
    }
}

/// `$first, $first+1, ..` for an `IN (..)` list of `n` values.
pub(crate) fn in_list(first: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most ids one `IN (..)` list carries.
pub(crate) const MAX_IN_LIST: usize = 1000;

#[derive(diesel::QueryableByName)]
pub(crate) struct TextValue {
    #[diesel(sql_type = Text)]
    pub(crate) v: String,
}

#[derive(diesel::QueryableByName)]
pub(crate) struct RunId {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

/// `v` = `yes` when diesel's migrations table exists: asked before diesel's own check,
/// which creates that table (a write no dry run may do).
pub(crate) fn migrations_table_exists(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "SELECT CASE WHEN to_regclass('__diesel_schema_migrations') IS NULL THEN 'no' ELSE 'yes' END AS v"
        }
        Backend::Sqlite => {
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM sqlite_master WHERE name = '__diesel_schema_migrations') THEN 'yes' ELSE 'no' END AS v"
        }
    }
}

/// A stored timestamp as display text (milliseconds) on both backends.
pub(crate) fn display_time(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
        }
        Backend::Sqlite => column.to_string(),
    }
}

pub(crate) fn age_secs(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("CAST(EXTRACT(EPOCH FROM now() - {column}) AS DOUBLE PRECISION)")
        }
        Backend::Sqlite => format!("((julianday('now') - julianday({column})) * 86400.0)"),
    }
}

/// The `state` column as JSON text on both backends (`resources` and `changes` alike).
pub(crate) fn state_text(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "state::text AS state",
        Backend::Sqlite => "state",
    }
}

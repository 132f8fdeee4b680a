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

use diesel::backend::Backend as DieselBackend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId, SqlQuery};
use diesel::sql_query;
use diesel::sql_types::{BigInt, Text};

use crate::config::Backend;

/// A statement written with `$n` placeholders, ready for `backend`.
pub(crate) fn query(backend: Backend, sql: &str) -> SqlQuery {
    match backend {
        Backend::Postgres => sql_query(sql),
        Backend::Sqlite => sql_query(sql.replace('$', "?")),
    }
}

/// Marks a statement built by [`query`] whose text never depends on its arguments
/// (arrays instead of lists of placeholders): each connection then prepares it once and
/// afterwards only binds and executes it. diesel never caches a `sql_query` (it cannot
/// know that the text is fixed), and parsing and planning the webhook path's ten
/// statements every time was much of PostgreSQL's work per delivery. A text built from
/// a number of rows must not come here: the cache is per connection and unbounded.
pub(crate) fn prepared<Q>(query: Q) -> Prepared<Q> {
    Prepared(query)
}

/// A query diesel keeps prepared on its connection, keyed by its text (see [`prepared`]).
pub(crate) struct Prepared<Q>(Q);

impl<Q: QueryFragment<DB>, DB: DieselBackend> QueryFragment<DB> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    // Keyed by its SQL text, not by its Rust type: one type serves many texts.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

impl<Q, C> diesel::RunQueryDsl<C> for Prepared<Q> {}

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

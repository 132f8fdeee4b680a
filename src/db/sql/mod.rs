//! Every SQL statement the product runs, one file per table family, each statement
//! showing both backends side by side.
//!
//! | file | tables |
//! | --- | --- |
//! | `events` | `processed_events` (the claim), `dead_letters` |
//! | `resources` | `resources`: the guarded upsert (the tie rule in SQL), local reads, tombstones |
//! | `runs` | reconcile bookkeeping: `reconcile_runs`, `reconcile_leases`, `reconcile_checkpoints`, `reconcile_state` |
//! | `retention` | bounded deletes, `prune_runs` |
//! | `status` | read-only summaries for `status`, `/readyz` and metrics |
//!
//! Placeholders are written one way, PostgreSQL's `$n`, and [`query`] turns them into
//! SQLite's `?n` (which binds by the same number), so no statement is written twice
//! just for its placeholders. Where the backends really differ (JSONB casts,
//! `IS DISTINCT FROM`, clock functions) the statement says so with a `match`.
//! Statements never contain a literal `$`.

mod changes;
mod events;
mod resources;
mod retention;
mod runs;
mod status;

pub use changes::*;
pub use events::*;
pub use resources::*;
pub use retention::*;
pub use runs::*;
pub use status::*;

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
fn now(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    }
}

/// `now + $n seconds`.
fn plus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() + make_interval(secs => ${n})"),
        Backend::Sqlite => {
            format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || ${n} || ' seconds')")
        }
    }
}

/// `now - $n seconds`.
fn minus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() - make_interval(secs => ${n})"),
        Backend::Sqlite => {
            format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ${n} || ' seconds')")
        }
    }
}

/// A bound timestamp parameter `$n` (ISO 8601 UTC text) compared with a stored one.
fn ts_param(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("${n}::timestamptz"),
        Backend::Sqlite => format!("${n}"),
    }
}

/// A stored timestamp column as ISO 8601 UTC text with microseconds, the form
/// [`crate::db::DbTime`] parses on both backends.
fn ts_text(backend: Backend, column: &str) -> String {
    match backend {
        Backend::Postgres => {
            format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
        }
        Backend::Sqlite => column.to_string(),
    }
}

/// `$first, $first+1, ..` for an `IN (..)` list of `n` values.
fn in_list(first: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most ids one `IN (..)` list carries.
pub const MAX_IN_LIST: usize = 1000;

#[derive(diesel::QueryableByName)]
struct TextValue {
    #[diesel(sql_type = Text)]
    v: String,
}

#[derive(diesel::QueryableByName)]
struct RunId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

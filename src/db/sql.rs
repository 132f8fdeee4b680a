//! Every SQL statement the product runs, next to each other for both backends.
//!
//! The two backends share the statements' shape; they differ where they must: PostgreSQL
//! stores state as JSONB (`$n::jsonb`) and uses `IS DISTINCT FROM`; SQLite stores
//! canonical JSON text and spells it `IS NOT`. Placeholders are `$n` / `?n`; both bind
//! by position, in the order the binds are pushed.

use diesel::RunQueryDsl;
use diesel::sql_query;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};

use super::{Conn, on_conn};
use crate::change::{Change, Origin};
use crate::config::{Action, Backend};

/// Which incoming states a resource row accepts at an equal version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Webhook path: strictly newer versions only. An equal version is a no-op here; the
    /// caller tells `stale` from `conflict`.
    NewerOnly,
    /// Reconcile path: the sender's listing is current state, so an equal version with a
    /// different state (or deletion flag) is applied too. Older versions never are.
    NewerOrDifferent,
}

const COLUMNS_PER_ROW: usize = 8;

fn placeholder(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("${n}"),
        Backend::Sqlite => format!("?{n}"),
    }
}

fn now(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    }
}

const RESOURCE_COLUMNS: &str =
    "INSERT INTO resources (source, kind, id, version, state, deleted, origin, last_event_id)";

/// `INSERT .. ON CONFLICT DO UPDATE .. WHERE <guard>` for `rows` resources.
/// The guard is evaluated against the row as it is when the statement locks it, so a
/// concurrent writer can never make an older version win.
pub fn upsert_sql(backend: Backend, rows: usize, guard: Guard, returning: bool) -> String {
    let mut sql = String::with_capacity(300 + rows * 60);
    sql.push_str(RESOURCE_COLUMNS);
    sql.push_str(" VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push(',');
        }
        let p = |i: usize| placeholder(backend, r * COLUMNS_PER_ROW + i);
        let state = match backend {
            Backend::Postgres => format!("{}::jsonb", p(5)),
            Backend::Sqlite => p(5),
        };
        sql.push_str(&format!(
            "({}, {}, {}, {}, {state}, {}, {}, {})",
            p(1),
            p(2),
            p(3),
            p(4),
            p(6),
            p(7),
            p(8)
        ));
    }
    sql.push_str(&conflict_clause(backend, guard));
    if returning {
        sql.push_str(" RETURNING source, kind, id");
    }
    sql
}

/// The version guard: `ON CONFLICT .. DO UPDATE .. WHERE`, shared by every resource write.
fn conflict_clause(backend: Backend, guard: Guard) -> String {
    let mut sql = format!(
        " ON CONFLICT (source, kind, id) DO UPDATE SET \
         version = excluded.version, \
         state = COALESCE(excluded.state, resources.state), \
         deleted = excluded.deleted, \
         origin = excluded.origin, \
         last_event_id = excluded.last_event_id, \
         updated_at = {} \
         WHERE resources.version < excluded.version",
        now(backend)
    );
    if guard == Guard::NewerOrDifferent {
        let distinct = match backend {
            Backend::Postgres => "IS DISTINCT FROM",
            Backend::Sqlite => "IS NOT",
        };
        sql.push_str(&format!(
            " OR (resources.version = excluded.version AND (resources.deleted <> excluded.deleted \
             OR (excluded.state IS NOT NULL AND resources.state {distinct} excluded.state)))"
        ));
    }
    sql
}

/// The claim statement for `rows` events: `(source, event_id, event_type, outcome)` per
/// row; returns the `(source, event_id)` pairs this statement claimed.
pub fn claim_sql(backend: Backend, rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO processed_events (source, event_id, event_type, outcome) VALUES ",
    );
    for r in 0..rows {
        if r > 0 {
            sql.push(',');
        }
        let p = |i: usize| placeholder(backend, r * 4 + i);
        sql.push_str(&format!("({}, {}, {}, {})", p(1), p(2), p(3), p(4)));
    }
    sql.push_str(" ON CONFLICT (source, event_id) DO NOTHING RETURNING source, event_id");
    sql
}

/// One event to claim, with the outcome recorded if the claim is taken.
pub struct Claim<'a> {
    pub source: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub outcome: &'a str,
}

#[derive(diesel::QueryableByName)]
struct ClaimedRow {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

/// Claims event ids; returns the `(source, event_id)` pairs taken by this call (the
/// others were claimed before: duplicates). On PostgreSQL a concurrent claim of the same
/// id waits until the other transaction ends, then finds it taken (or takes it, if the
/// other rolled back). Callers pass distinct ids, sorted, so that two transactions
/// claiming overlapping sets wait on each other in the same order and cannot deadlock.
pub fn claim_many(
    conn: &mut Conn,
    claims: &[Claim<'_>],
) -> diesel::QueryResult<Vec<(String, String)>> {
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let sql = claim_sql(conn.backend(), claims.len());
    let rows: Vec<ClaimedRow> = on_conn!(conn, c => {
        let mut q = sql_query(sql).into_boxed();
        for cl in claims {
            q = q
                .bind::<Text, _>(cl.source)
                .bind::<Text, _>(cl.event_id)
                .bind::<Text, _>(cl.event_type)
                .bind::<Text, _>(cl.outcome);
        }
        q.load(c)
    })?;
    Ok(rows.into_iter().map(|r| (r.source, r.event_id)).collect())
}

/// Records the final outcome of a claimed event when it was not `applied`.
pub fn set_event_outcome(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
    outcome: &str,
) -> diesel::QueryResult<()> {
    let sql = match conn.backend() {
        Backend::Postgres => {
            "UPDATE processed_events SET outcome = $3 WHERE source = $1 AND event_id = $2"
        }
        Backend::Sqlite => {
            "UPDATE processed_events SET outcome = ?3 WHERE source = ?1 AND event_id = ?2"
        }
    };
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(event_id)
        .bind::<Text, _>(outcome)
        .execute(c))?;
    Ok(())
}

#[derive(diesel::QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    id: String,
}

/// A resource's primary key.
pub type Key = (String, String, String);

/// Upserts resources in one statement under the guard; returns the keys written.
/// `rows` pairs each change with the event that carries it (none on the reconcile path).
/// Callers pass distinct keys (PostgreSQL refuses to touch one row twice in a statement)
/// sorted by key (so concurrent writers lock rows in one order), and at most
/// [`MAX_BATCH_ROWS`] of them.
pub fn upsert_many(
    conn: &mut Conn,
    rows: &[(&Change, Option<&str>)],
    origin: Origin,
    guard: Guard,
) -> diesel::QueryResult<Vec<Key>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let sql = upsert_sql(conn.backend(), rows.len(), guard, true);
    let written: Vec<KeyRow> = on_conn!(conn, c => {
        let mut q = sql_query(sql).into_boxed();
        for (ch, event_id) in rows {
            q = q
                .bind::<Text, _>(ch.source.as_str())
                .bind::<Text, _>(ch.kind.as_str())
                .bind::<Text, _>(ch.id.as_str())
                .bind::<BigInt, _>(ch.version)
                .bind::<Nullable<Text>, _>(ch.state.as_deref())
                .bind::<Bool, _>(ch.action == Action::Delete)
                .bind::<Text, _>(origin.as_str())
                .bind::<Nullable<Text>, _>(*event_id);
        }
        q.load(c)
    })?;
    Ok(written
        .into_iter()
        .map(|r| (r.source, r.kind, r.id))
        .collect())
}

/// Most rows [`upsert_many`] takes in one statement (8 binds a row; SQLite allows
/// 32 766 binds, PostgreSQL 65 535).
pub const MAX_BATCH_ROWS: usize = 1000;

/// A resource row as stored, for deciding stale / conflict.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct StoredRow {
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
}

pub fn stored_resource(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    id: &str,
) -> diesel::QueryResult<Option<StoredRow>> {
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT version, deleted, state::text AS state FROM resources WHERE source = $1 AND kind = $2 AND id = $3"
        }
        Backend::Sqlite => {
            "SELECT version, deleted, state FROM resources WHERE source = ?1 AND kind = ?2 AND id = ?3"
        }
    };
    let mut rows: Vec<StoredRow> = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(id)
        .load(c))?;
    Ok(rows.pop())
}

/// Keeps an authentic delivery we could not read. Repeats of the same event id update
/// the row (attempts, last reason) instead of piling up.
pub fn record_dead_letter(
    conn: &mut Conn,
    source: &str,
    event_id: &str,
    event_type: &str,
    reason: &str,
    body: &str,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let sql = format!(
        "INSERT INTO dead_letters (source, event_id, event_type, reason, body) VALUES ({}, {}, {}, {}, {}) \
         ON CONFLICT (source, event_id) DO UPDATE SET event_type = excluded.event_type, reason = excluded.reason, \
         body = excluded.body, attempts = dead_letters.attempts + 1, last_seen_at = {}",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        now(b)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(event_id)
        .bind::<Text, _>(event_type)
        .bind::<Text, _>(reason)
        .bind::<Text, _>(body)
        .execute(c))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_guard_compares_versions_strictly() {
        let sql = upsert_sql(Backend::Postgres, 1, Guard::NewerOnly, false);
        assert!(
            sql.ends_with("WHERE resources.version < excluded.version"),
            "{sql}"
        );
        assert!(sql.contains("$5::jsonb"));
    }

    #[test]
    fn the_reconcile_guard_adds_equal_version_with_other_state_and_nothing_else() {
        let pg = upsert_sql(Backend::Postgres, 2, Guard::NewerOrDifferent, true);
        assert!(pg.contains("WHERE resources.version < excluded.version OR (resources.version = excluded.version AND"));
        assert!(pg.contains("$16)"), "two rows use placeholders 1..16: {pg}");
        let lite = upsert_sql(Backend::Sqlite, 2, Guard::NewerOrDifferent, true);
        assert!(lite.contains("?16)") && lite.contains("IS NOT excluded.state"));
    }
}

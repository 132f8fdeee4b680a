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

// ---------------------------------------------------------------------------------------
// Reconciliation: local versions, runs, leases, checkpoints.
// ---------------------------------------------------------------------------------------

/// Most ids one `IN (..)` list carries.
pub const MAX_IN_LIST: usize = 1000;

fn in_list(backend: Backend, first: usize, n: usize) -> String {
    (0..n)
        .map(|i| placeholder(backend, first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A local row as the compare step needs it.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct LocalRow {
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
}

/// The stored rows of `ids` (one bulk read per call; at most [`MAX_IN_LIST`] ids).
pub fn local_rows(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    ids: &[&str],
) -> diesel::QueryResult<Vec<LocalRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let b = conn.backend();
    let state = match b {
        Backend::Postgres => "state::text AS state",
        Backend::Sqlite => "state",
    };
    let sql = format!(
        "SELECT id, version, deleted, {state} FROM resources WHERE source = {} AND kind = {} AND id IN ({})",
        placeholder(b, 1),
        placeholder(b, 2),
        in_list(b, 3, ids.len())
    );
    on_conn!(conn, c => {
        let mut q = sql_query(sql).into_boxed().bind::<Text, _>(source).bind::<Text, _>(kind);
        for id in ids {
            q = q.bind::<Text, _>(*id);
        }
        q.load(c)
    })
}

#[derive(diesel::QueryableByName)]
struct IdOnly {
    #[diesel(sql_type = Text)]
    id: String,
}

/// Live (not deleted) ids of a kind last written before `before` (a database
/// timestamp), in id order after `after`: the keyset scan of deletion detection.
pub fn live_ids_before(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    before: &str,
    after: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<String>> {
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT id FROM resources WHERE source = $1 AND kind = $2 AND NOT deleted AND updated_at < $3::timestamptz AND id > $4 ORDER BY id LIMIT $5"
        }
        Backend::Sqlite => {
            "SELECT id FROM resources WHERE source = ?1 AND kind = ?2 AND NOT deleted AND updated_at < ?3 AND id > ?4 ORDER BY id LIMIT ?5"
        }
    };
    let rows: Vec<IdOnly> = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(before)
        .bind::<Text, _>(after)
        .bind::<BigInt, _>(limit)
        .load(c))?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// Marks `ids` deleted (keeping version and state) unless they were written at or after
/// `before`: a row changed since the sweep began was seen by a webhook and stays.
pub fn tombstone(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    ids: &[&str],
    before: &str,
) -> diesel::QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let b = conn.backend();
    let cast = if b == Backend::Postgres {
        "::timestamptz"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE resources SET deleted = {t}, origin = 'reconcile', last_event_id = NULL, updated_at = {now} \
         WHERE source = {} AND kind = {} AND NOT deleted AND updated_at < {}{cast} AND id IN ({})",
        placeholder(b, 1),
        placeholder(b, 2),
        placeholder(b, 3),
        in_list(b, 4, ids.len()),
        t = if b == Backend::Postgres { "true" } else { "1" },
        now = now(b),
    );
    on_conn!(conn, c => {
        let mut q = sql_query(sql)
            .into_boxed()
            .bind::<Text, _>(source)
            .bind::<Text, _>(kind)
            .bind::<Text, _>(before);
        for id in ids {
            q = q.bind::<Text, _>(*id);
        }
        q.execute(c)
    })
}

#[derive(diesel::QueryableByName)]
struct TextValue {
    #[diesel(sql_type = Text)]
    v: String,
}

/// The database's clock as ISO 8601 UTC text: the one clock every replica agrees on,
/// used for sweep starts and leases (never for versions).
pub fn db_now(conn: &mut Conn) -> diesel::QueryResult<String> {
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS v"
        }
        Backend::Sqlite => "SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now') AS v",
    };
    let r: TextValue = on_conn!(conn, c => sql_query(sql).get_result(c))?;
    Ok(r.v)
}

#[derive(diesel::QueryableByName)]
struct RunId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Records the start of a run; returns its id. Runs of the same kind still marked
/// `running` (their process died) become `abandoned`; the caller holds the lease, so
/// no live run of the kind can be among them.
pub fn start_run(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    mode: &str,
) -> diesel::QueryResult<i64> {
    let b = conn.backend();
    let sql = format!(
        "UPDATE reconcile_runs SET status = 'abandoned', finished_at = {}, error = 'the process running it stopped before it finished' \
         WHERE source = {} AND kind = {} AND status = 'running'",
        now(b),
        placeholder(b, 1),
        placeholder(b, 2)
    );
    on_conn!(conn, c => sql_query(sql).bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))?;
    let sql = format!(
        "INSERT INTO reconcile_runs (source, kind, mode, status) VALUES ({}, {}, {}, 'running') RETURNING id",
        placeholder(b, 1),
        placeholder(b, 2),
        placeholder(b, 3)
    );
    let r: RunId = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(mode)
        .get_result(c))?;
    Ok(r.id)
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
}

/// Records a run's progress or end (`status` `running` while it goes on).
pub fn update_run(
    conn: &mut Conn,
    id: i64,
    status: &str,
    counts: &RunCounts,
    error: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let finished = if status == "running" {
        "NULL".to_string()
    } else {
        now(b).to_string()
    };
    let sql = format!(
        "UPDATE reconcile_runs SET status = {}, finished_at = {finished}, pages = {}, scanned = {}, missing = {}, \
         newer_remote = {}, differing = {}, newer_local = {}, equal = {}, applied = {}, tombstoned = {}, error = {} WHERE id = {}",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7),
        p(8),
        p(9),
        p(10),
        p(11),
        p(12)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(status)
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
        .execute(c))?;
    Ok(())
}

fn plus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() + make_interval(secs => {})", placeholder(backend, n)),
        Backend::Sqlite => format!(
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || {} || ' seconds')",
            placeholder(backend, n)
        ),
    }
}

/// Takes the lease of a (source, kind) for `ttl_secs`, if it is free, expired, or ours.
/// Returns the holder after the call: `holder` when taken.
pub fn acquire_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<String> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let sql = format!(
        "INSERT INTO reconcile_leases (source, kind, holder, expires_at) VALUES ({}, {}, {}, {}) \
         ON CONFLICT (source, kind) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
         WHERE reconcile_leases.expires_at < {} OR reconcile_leases.holder = excluded.holder",
        p(1),
        p(2),
        p(3),
        plus_seconds(b, 4),
        now(b)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(holder)
        .bind::<diesel::sql_types::Double, _>(ttl_secs)
        .execute(c))?;
    let sql = format!(
        "SELECT holder AS v FROM reconcile_leases WHERE source = {} AND kind = {}",
        p(1),
        p(2)
    );
    let r: TextValue = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .get_result(c))?;
    Ok(r.v)
}

/// Extends our lease; false when it is no longer ours (it expired and was taken).
pub fn renew_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
    ttl_secs: f64,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let sql = format!(
        "UPDATE reconcile_leases SET expires_at = {} WHERE source = {} AND kind = {} AND holder = {}",
        plus_seconds(b, 4),
        p(1),
        p(2),
        p(3)
    );
    let n = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(holder)
        .bind::<diesel::sql_types::Double, _>(ttl_secs)
        .execute(c))?;
    Ok(n == 1)
}

pub fn release_lease(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    holder: &str,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let sql = format!(
        "DELETE FROM reconcile_leases WHERE source = {} AND kind = {} AND holder = {}",
        p(1),
        p(2),
        p(3)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(holder)
        .execute(c))?;
    Ok(())
}

/// Where an unfinished sweep stopped: (position, sweep start).
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct Checkpoint {
    #[diesel(sql_type = Text)]
    pub position: String,
    #[diesel(sql_type = Text)]
    pub sweep_started_at: String,
}

pub fn checkpoint(
    conn: &mut Conn,
    source: &str,
    kind: &str,
) -> diesel::QueryResult<Option<Checkpoint>> {
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT position, to_char(sweep_started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS sweep_started_at FROM reconcile_checkpoints WHERE source = $1 AND kind = $2"
        }
        Backend::Sqlite => {
            "SELECT position, sweep_started_at FROM reconcile_checkpoints WHERE source = ?1 AND kind = ?2"
        }
    };
    let mut rows: Vec<Checkpoint> = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .load(c))?;
    Ok(rows.pop())
}

/// Records (`Some`) or clears (`None`) where the current sweep is.
pub fn set_checkpoint(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    at: Option<(&str, &str)>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    match at {
        Some((position, sweep_started_at)) => {
            let cast = if b == Backend::Postgres {
                "::timestamptz"
            } else {
                ""
            };
            let sql = format!(
                "INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at) VALUES ({}, {}, {}, {}{cast}) \
                 ON CONFLICT (source, kind) DO UPDATE SET position = excluded.position, \
                 sweep_started_at = excluded.sweep_started_at, updated_at = {}",
                p(1),
                p(2),
                p(3),
                p(4),
                now(b)
            );
            on_conn!(conn, c => sql_query(sql)
                .bind::<Text, _>(source)
                .bind::<Text, _>(kind)
                .bind::<Text, _>(position)
                .bind::<Text, _>(sweep_started_at)
                .execute(c))?;
        }
        None => {
            let sql = format!(
                "DELETE FROM reconcile_checkpoints WHERE source = {} AND kind = {}",
                p(1),
                p(2)
            );
            on_conn!(conn, c => sql_query(sql).bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))?;
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
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT watermark, (last_full_at IS NULL OR last_full_at < now() - make_interval(secs => $3)) AS full_due FROM reconcile_state WHERE source = $1 AND kind = $2"
        }
        Backend::Sqlite => {
            "SELECT watermark, (last_full_at IS NULL OR last_full_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?3 || ' seconds')) AS full_due FROM reconcile_state WHERE source = ?1 AND kind = ?2"
        }
    };
    let mut rows: Vec<SweepState> = on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<diesel::sql_types::Double, _>(full_every_secs)
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
    full_sweep_started: Option<&str>,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let p = |n| placeholder(b, n);
    let cast = if b == Backend::Postgres {
        "::timestamptz"
    } else {
        ""
    };
    let sql = format!(
        "INSERT INTO reconcile_state (source, kind, watermark, last_full_at) VALUES ({}, {}, {}, {}{cast}) \
         ON CONFLICT (source, kind) DO UPDATE SET \
         watermark = CASE WHEN reconcile_state.watermark IS NULL OR excluded.watermark > reconcile_state.watermark \
                          THEN COALESCE(excluded.watermark, reconcile_state.watermark) ELSE reconcile_state.watermark END, \
         last_full_at = COALESCE(excluded.last_full_at, reconcile_state.last_full_at)",
        p(1),
        p(2),
        p(3),
        p(4)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Nullable<BigInt>, _>(watermark)
        .bind::<Nullable<Text>, _>(full_sweep_started)
        .execute(c))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Retention.
// ---------------------------------------------------------------------------------------

fn minus_seconds(backend: Backend, n: usize) -> String {
    match backend {
        Backend::Postgres => format!("now() - make_interval(secs => {})", placeholder(backend, n)),
        Backend::Sqlite => format!(
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || {} || ' seconds')",
            placeholder(backend, n)
        ),
    }
}

/// Deletes at most `limit` processed event ids of `source` older than `age_secs`,
/// walking the `processed_at` index; returns how many.
pub fn prune_events(
    conn: &mut Conn,
    source: &str,
    age_secs: f64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let sql = format!(
        "DELETE FROM processed_events WHERE (source, event_id) IN (\
         SELECT source, event_id FROM processed_events WHERE processed_at < {} AND source = {} LIMIT {})",
        minus_seconds(b, 1),
        placeholder(b, 2),
        placeholder(b, 3)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<diesel::sql_types::Double, _>(age_secs)
        .bind::<Text, _>(source)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// Deletes at most `limit` finished reconcile runs (and prune runs) older than `age_secs`.
pub fn prune_runs(conn: &mut Conn, age_secs: f64, limit: i64) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let mut n = 0;
    for table in ["reconcile_runs", "prune_runs"] {
        let sql = format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE started_at < {} AND finished_at IS NOT NULL LIMIT {})",
            minus_seconds(b, 1),
            placeholder(b, 2)
        );
        n += on_conn!(conn, c => sql_query(sql)
            .bind::<diesel::sql_types::Double, _>(age_secs)
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
    let sql = format!(
        "DELETE FROM dead_letters WHERE (source, event_id) IN (\
         SELECT source, event_id FROM dead_letters WHERE last_seen_at < {} LIMIT {})",
        minus_seconds(b, 1),
        placeholder(b, 2)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<diesel::sql_types::Double, _>(age_secs)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// Records a retention pass; returns its id.
pub fn start_prune(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let r: RunId = on_conn!(conn, c => sql_query("INSERT INTO prune_runs (processed_events) VALUES (0) RETURNING id").get_result(c))?;
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
    let p = |n| placeholder(b, n);
    let sql = format!(
        "UPDATE prune_runs SET finished_at = {}, processed_events = {}, reconcile_runs = {}, dead_letters = {}, error = {} WHERE id = {}",
        now(b),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5)
    );
    on_conn!(conn, c => sql_query(sql)
        .bind::<BigInt, _>(events)
        .bind::<BigInt, _>(runs)
        .bind::<BigInt, _>(dead)
        .bind::<Nullable<Text>, _>(error)
        .bind::<BigInt, _>(id)
        .execute(c))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Status, readiness, metrics: read-only summaries.
// ---------------------------------------------------------------------------------------

fn ts_text(backend: Backend, column: &str) -> String {
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
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub age_seconds: f64,
}

pub fn last_success_ages(conn: &mut Conn) -> diesel::QueryResult<Vec<SuccessAge>> {
    let b = conn.backend();
    let sql = format!(
        "SELECT source, kind, {} AS age_seconds FROM (SELECT source, kind, MAX(finished_at) AS last FROM reconcile_runs \
         WHERE status = 'succeeded' GROUP BY source, kind) t",
        age_secs(b, "last")
    );
    on_conn!(conn, c => sql_query(sql).load(c))
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
    let p = |n| placeholder(b, n);
    let sql = format!(
        "SELECT mode, status, {} AS started_at, {} AS finished_at, scanned, missing, newer_remote, differing, newer_local, applied, error \
         FROM reconcile_runs WHERE source = {} AND kind = {} ORDER BY id DESC LIMIT {}",
        ts_text(b, "started_at"),
        ts_text(b, "finished_at"),
        p(1),
        p(2),
        p(3)
    );
    on_conn!(conn, c => sql_query(sql)
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
    on_conn!(conn, c => sql_query("SELECT source, COUNT(*) AS count FROM dead_letters GROUP BY source").load(c))
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
    let sql = format!(
        "SELECT {} AS started_at, {} AS finished_at, processed_events, reconcile_runs, dead_letters, error FROM prune_runs ORDER BY id DESC LIMIT 1",
        ts_text(b, "started_at"),
        ts_text(b, "finished_at")
    );
    let mut rows: Vec<PruneRow> = on_conn!(conn, c => sql_query(sql).load(c))?;
    Ok(rows.pop())
}

//! `resources`: the guarded upsert (the tie rule, in SQL), the reads the guard and the
//! compare step need, and deletion detection's scan and tombstones.

use diesel::RunQueryDsl;
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};

use crate::change::tie::Guard;
use crate::change::{Change, Key, Origin, ResourceKey};
use crate::config::{Action, Backend};
use crate::db::sql::{in_list, now, prepared, query, ts_param};
use crate::db::{Conn, DbTime, on_conn};

const COLUMNS_PER_ROW: usize = 10;

pub(super) const RESOURCE_COLUMNS: &str = "INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id, state_digest)";

/// `INSERT .. ON CONFLICT DO UPDATE .. WHERE <guard>` for `rows` resources.
/// The guard is evaluated against the row as it is when the statement locks it, so a
/// concurrent writer can never make an older version win.
pub(crate) fn upsert_sql(backend: Backend, rows: usize, guard: Guard, returning: bool) -> String {
    let mut sql = String::with_capacity(300 + rows * 60);
    sql.push_str(RESOURCE_COLUMNS);
    sql.push_str(" VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push(',');
        }
        let p = r * COLUMNS_PER_ROW;
        let state = match backend {
            Backend::Postgres => format!("${}::jsonb", p + 6),
            Backend::Sqlite => format!("${}", p + 6),
        };
        sql.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${}, {state}, ${}, ${}, ${}, ${})",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 7,
            p + 8,
            p + 9,
            p + 10
        ));
    }
    sql.push_str(&conflict_clause(backend, guard));
    if returning {
        sql.push_str(" RETURNING source, account, kind, id");
    }
    sql
}

/// The tie rule in SQL — the one SQL definition of [`Guard`], mirrored in Rust by
/// [`crate::change::tie::Relation`]; `tests/it/tie_rule.rs` runs one truth table
/// through both, on both backends.
///
/// The WHERE of `ON CONFLICT .. DO UPDATE`: strictly newer always; with
/// [`Guard::NewerOrDifferent`] also an equal version whose deletion flag or state
/// differs (a delete without state says nothing about the state).
pub(crate) fn guard_condition(backend: Backend, guard: Guard) -> String {
    let mut sql = "resources.version < excluded.version".to_string();
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

/// The version guard: `ON CONFLICT .. DO UPDATE .. WHERE`, shared by every resource write.
pub(super) fn conflict_clause(backend: Backend, guard: Guard) -> String {
    format!(
        " ON CONFLICT (source, account, kind, id) DO UPDATE SET \
         version = excluded.version, \
         state = COALESCE(excluded.state, resources.state), \
         state_digest = CASE WHEN excluded.state IS NULL THEN resources.state_digest ELSE excluded.state_digest END, \
         deleted = excluded.deleted, \
         origin = excluded.origin, \
         last_event_id = excluded.last_event_id, \
         updated_at = {} \
         WHERE {}",
        now(backend),
        guard_condition(backend, guard)
    )
}

#[derive(diesel::QueryableByName)]
struct KeyRow {
    #[diesel(sql_type = Text)]
    source: String,
    #[diesel(sql_type = Text)]
    account: String,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    id: String,
}

/// Upserts resources in one statement under the guard; returns the keys written.
/// `rows` pairs each change with the event that carries it (none on the reconcile path).
/// Callers pass distinct keys (PostgreSQL refuses to touch one row twice in a statement)
/// sorted by key (so concurrent writers lock rows in one order), and at most
/// [`MAX_BATCH_ROWS`] of them.
pub(crate) fn upsert_many(
    conn: &mut Conn,
    rows: &[(&Change, Option<&str>)],
    origin: Origin,
    guard: Guard,
) -> diesel::QueryResult<Vec<ResourceKey>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let written: Vec<KeyRow> = match conn {
        // One array per column: one text for any number of rows, prepared once per
        // connection. `unnest` keeps the array order, so rows are locked in key order.
        Conn::Postgres(c) => {
            let sources: Vec<&str> = rows.iter().map(|(ch, _)| ch.source.as_str()).collect();
            let accounts: Vec<&str> = rows.iter().map(|(ch, _)| ch.account.as_str()).collect();
            let kinds: Vec<&str> = rows.iter().map(|(ch, _)| ch.kind.as_str()).collect();
            let ids: Vec<&str> = rows.iter().map(|(ch, _)| ch.id.as_str()).collect();
            let versions: Vec<i64> = rows.iter().map(|(ch, _)| ch.version).collect();
            let states: Vec<Option<&str>> =
                rows.iter().map(|(ch, _)| ch.state.as_deref()).collect();
            let deleted: Vec<bool> = rows
                .iter()
                .map(|(ch, _)| ch.action == Action::Delete)
                .collect();
            let events: Vec<Option<&str>> = rows.iter().map(|(_, e)| *e).collect();
            let digests: Vec<Option<i64>> = rows
                .iter()
                .map(|(ch, _)| ch.state.as_deref().map(crate::change::state_digest))
                .collect();
            prepared(
                query(Backend::Postgres, &upsert_arrays_sql(guard))
                    .bind::<Array<Text>, _>(sources)
                    .bind::<Array<Text>, _>(accounts)
                    .bind::<Array<Text>, _>(kinds)
                    .bind::<Array<Text>, _>(ids)
                    .bind::<Array<BigInt>, _>(versions)
                    .bind::<Array<Nullable<Text>>, _>(states)
                    .bind::<Array<Bool>, _>(deleted)
                    .bind::<Text, _>(origin.as_str())
                    .bind::<Array<Nullable<Text>>, _>(events)
                    .bind::<Array<Nullable<BigInt>>, _>(digests),
            )
            .load(c)?
        }
        Conn::Sqlite(c) => {
            let b = Backend::Sqlite;
            let mut q = query(b, &upsert_sql(b, rows.len(), guard, true)).into_boxed();
            for (ch, event_id) in rows {
                q = q
                    .bind::<Text, _>(ch.source.as_str())
                    .bind::<Text, _>(ch.account.as_str())
                    .bind::<Text, _>(ch.kind.as_str())
                    .bind::<Text, _>(ch.id.as_str())
                    .bind::<BigInt, _>(ch.version)
                    .bind::<Nullable<Text>, _>(ch.state.as_deref())
                    .bind::<Bool, _>(ch.action == Action::Delete)
                    .bind::<Text, _>(origin.as_str())
                    .bind::<Nullable<Text>, _>(*event_id)
                    .bind::<Nullable<BigInt>, _>(
                        ch.state.as_deref().map(crate::change::state_digest),
                    );
            }
            q.load(c)?
        }
    };
    Ok(written
        .into_iter()
        .map(|r| ResourceKey::new(r.source, r.account, r.kind, r.id))
        .collect())
}

/// [`upsert_sql`] on PostgreSQL with one array parameter per column (the origin is one
/// value for the statement): the same text for any number of rows.
fn upsert_arrays_sql(guard: Guard) -> String {
    let b = Backend::Postgres;
    format!(
        "{RESOURCE_COLUMNS} SELECT source, account, kind, id, version, state::jsonb, deleted, $8, last_event_id, state_digest \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::text[], $7::bool[], $9::text[], $10::int8[]) \
         AS t(source, account, kind, id, version, state, deleted, last_event_id, state_digest){} RETURNING source, account, kind, id",
        conflict_clause(b, guard)
    )
}

/// Most rows [`upsert_many`] takes in one statement (10 binds a row; SQLite allows
/// 32 766 binds, PostgreSQL 65 535).
pub(crate) const MAX_BATCH_ROWS: usize = 1000;

/// A resource row as stored, as the tie rule needs it.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct StoredRow {
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    /// Read only when the row has no digest (written before digests existed), or for a
    /// single row the webhook path labels.
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub digest: Option<i64>,
}

/// The `state` column as JSON text, as an expression.
fn state_expr(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "state::text",
        Backend::Sqlite => "state",
    }
}

/// The stored rows of `ids` (one bulk read per call; at most [`MAX_IN_LIST`](crate::db::sql::MAX_IN_LIST) ids).
pub(crate) fn stored_rows(
    conn: &mut Conn,
    key: &Key,
    ids: &[&str],
) -> diesel::QueryResult<Vec<StoredRow>> {
    rows_by_id(conn, key, ids, false)
}

/// [`stored_rows`] with every state read (for checks that compare states themselves,
/// such as the demo's).
pub(crate) fn stored_rows_with_states(
    conn: &mut Conn,
    key: &Key,
    ids: &[&str],
) -> diesel::QueryResult<Vec<StoredRow>> {
    rows_by_id(conn, key, ids, true)
}

/// Whether `ids` are strictly in key order (byte order, as the primary key sorts them),
/// ascending or descending: a page listed in id order, which [`stored_rows_in_range`]
/// can read as one range of the primary key.
pub(crate) fn in_key_order(ids: &[&str]) -> bool {
    ids.windows(2).all(|w| w[0] < w[1]) || ids.windows(2).all(|w| w[0] > w[1])
}

/// [`stored_rows`] for ids in key order ([`in_key_order`]), read as the primary key's
/// range from the first to the last: one walk along the index instead of a probe per
/// id (on PostgreSQL a sixth of the probes' time for 1,000 ids of a 1M-row kind). The
/// range also holds local rows the page does not list (deleted at the sender, or
/// written since by a webhook); they are dropped here, so the caller gets exactly the
/// rows of `ids`, as from [`stored_rows`]. `None` when the range held more than a
/// quarter more rows than `ids` (a listing in id order that skips many local rows):
/// the caller then probes.
pub(crate) fn stored_rows_in_range(
    conn: &mut Conn,
    key: &Key,
    ids: &[&str],
) -> diesel::QueryResult<Option<Vec<StoredRow>>> {
    let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
        return Ok(Some(Vec::new()));
    };
    let (low, high) = if first <= last {
        (*first, *last)
    } else {
        (*last, *first)
    };
    let limit = ids.len() + ids.len() / 4 + 16;
    let b = conn.backend();
    let sql = format!(
        "SELECT id, version, deleted, state_digest AS digest, CASE WHEN state_digest IS NULL THEN {} END AS state \
         FROM resources WHERE source = $1 AND account = $2 AND kind = $3 AND id >= $4 AND id <= $5 ORDER BY id LIMIT $6",
        state_expr(b)
    );
    let q = query(b, &sql)
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(low)
        .bind::<Text, _>(high)
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX));
    let rows: Vec<StoredRow> = on_conn!(conn, c => prepared(q).load(c))?;
    if rows.len() >= limit {
        return Ok(None);
    }
    // Both in ascending key order: one merge walk keeps the rows whose id is listed.
    let ascending: Vec<&str> = if first > last {
        ids.iter().rev().copied().collect()
    } else {
        ids.to_vec()
    };
    let mut listed = ascending.into_iter().peekable();
    let mut kept = Vec::with_capacity(rows.len());
    for row in rows {
        while listed.next_if(|id| *id < row.id.as_str()).is_some() {}
        if listed.next_if_eq(&row.id.as_str()).is_some() {
            kept.push(row);
        }
    }
    Ok(Some(kept))
}

fn rows_by_id(
    conn: &mut Conn,
    key: &Key,
    ids: &[&str],
    states: bool,
) -> diesel::QueryResult<Vec<StoredRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let b = conn.backend();
    let state = if states {
        format!("{} AS state", state_expr(b))
    } else {
        format!(
            "CASE WHEN state_digest IS NULL THEN {} END AS state",
            state_expr(b)
        )
    };
    let columns = format!("id, version, deleted, state_digest AS digest, {state}");
    match conn {
        // One array parameter (parsed and planned in microseconds, where an IN list of a
        // thousand parameters costs milliseconds a page), looked up id by id: a LATERAL
        // with LIMIT 1 is always a primary-key probe per id. `id = ANY($3)` is planned
        // from statistics, and a table that grew since its last ANALYZE (a first sync
        // outruns autovacuum; some servers run without it) gets a bitmap scan of the
        // whole kind filtered by the array: 340 ms a page at 500k rows instead of 4.
        // The ids are made unique here, not by a DISTINCT in SQL (8% of the read's
        // time on a page of 1,000, measured with pgbench on a 1M-row table).
        Conn::Postgres(c) => {
            let mut seen = std::collections::HashSet::with_capacity(ids.len());
            let unique: Vec<&str> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
            prepared(
                query(Backend::Postgres, &format!(
                    "SELECT r.* FROM unnest($4::text[]) AS u(id) CROSS JOIN LATERAL \
                     (SELECT {columns} FROM resources WHERE source = $1 AND account = $2 AND kind = $3 AND id = u.id LIMIT 1) r"
                ))
                .bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.account.stored())
                .bind::<Text, _>(key.kind.as_str())
                .bind::<Array<Text>, _>(unique),
            )
            .load(c)
        }
        Conn::Sqlite(c) => {
            let sql = format!(
                "SELECT {columns} FROM resources WHERE source = $1 AND account = $2 AND kind = $3 AND id IN ({})",
                in_list(4, ids.len())
            );
            let mut q = query(b, &sql)
                .into_boxed()
                .bind::<Text, _>(key.source.as_str())
                .bind::<Text, _>(key.account.stored())
                .bind::<Text, _>(key.kind.as_str());
            for id in ids {
                q = q.bind::<Text, _>(*id);
            }
            q.load(c)
        }
    }
}

#[derive(diesel::QueryableByName)]
struct IdOnly {
    #[diesel(sql_type = Text)]
    id: String,
}

/// Live (not deleted) ids of a kind last written before `before`, in id order after
/// `after`: the keyset scan of deletion detection.
pub(crate) fn live_ids_before(
    conn: &mut Conn,
    key: &Key,
    before: DbTime,
    after: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<String>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT id FROM resources WHERE source = $1 AND account = $6 AND kind = $2 AND NOT deleted AND updated_at < {} AND id > $4 ORDER BY id LIMIT $5",
            ts_param(b, 3)
        ),
    );
    let rows: Vec<IdOnly> = on_conn!(conn, c => prepared(q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(before.to_db(b))
        .bind::<Text, _>(after)
        .bind::<BigInt, _>(limit)
        .bind::<Text, _>(key.account.stored()))
        .load(c))?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

/// Marks `ids` deleted (keeping version and state) unless they were written at or after
/// `before`: a row changed since the sweep began was seen by a webhook and stays.
pub(crate) fn tombstone(
    conn: &mut Conn,
    key: &Key,
    ids: &[&str],
    before: DbTime,
) -> diesel::QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE resources SET deleted = {t}, origin = 'reconcile', last_event_id = NULL, updated_at = {now} \
             WHERE source = $1 AND kind = $2 AND account = $4 AND NOT deleted AND updated_at < {before} AND id IN ({ids})",
            t = if b == Backend::Postgres { "true" } else { "1" },
            now = now(b),
            before = ts_param(b, 3),
            ids = in_list(5, ids.len()),
        ),
    );
    on_conn!(conn, c => {
        let mut q = q
            .into_boxed()
            .bind::<Text, _>(key.source.as_str())
            .bind::<Text, _>(key.kind.as_str())
            .bind::<Text, _>(before.to_db(b))
            .bind::<Text, _>(key.account.stored());
        for id in ids {
            q = q.bind::<Text, _>(*id);
        }
        q.execute(c)
    })
}

impl StoredRow {
    /// The row as the tie rule sees it.
    pub fn view(&self) -> crate::change::tie::Stored<'_> {
        crate::change::tie::Stored {
            version: self.version,
            deleted: self.deleted,
            state: self.state.as_deref(),
            digest: self.digest,
        }
    }
}

#[derive(diesel::QueryableByName)]
struct LiveCount {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// How many live (not deleted) rows a kind has.
pub(crate) fn count_live(conn: &mut Conn, key: &Key) -> diesel::QueryResult<i64> {
    let q = query(
        conn.backend(),
        "SELECT COUNT(*) AS n FROM resources WHERE source = $1 AND account = $2 AND kind = $3 AND NOT deleted",
    );
    let r: LiveCount = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.stored())
        .bind::<Text, _>(key.kind.as_str())
        .get_result(c))?;
    Ok(r.n)
}

/// Marks deleted every live row of one account, keeping its version, and its state
/// unless `erase` (its data must go: each becomes a change `deleted: true` with no
/// state). A row already tombstoned gets no second change.
pub(crate) fn tombstone_account(
    conn: &mut Conn,
    source: &str,
    account: &str,
    erase: bool,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "UPDATE resources SET deleted = {t}, {state}origin = {origin}, last_event_id = NULL, updated_at = {now} \
             WHERE source = $1 AND account = $2 AND NOT deleted",
            t = if b == Backend::Postgres { "true" } else { "1" },
            state = if erase {
                "state = NULL, state_digest = NULL, "
            } else {
                ""
            },
            origin = if erase {
                erasure_origin(b)
            } else {
                "'reconcile'"
            },
            now = now(b),
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))
}

/// What an erasure's tombstones set `origin` to: `erasure`. SQLite keeps the CHECK of
/// `resources.origin` as first made (widening it would rebuild the table), so there the
/// origin stays and the transaction's pending changes are labelled instead
/// (`feed::outbox::label_erasure`); an erasure deletes its rows in the same transaction,
/// so no row keeps either label.
fn erasure_origin(b: Backend) -> &'static str {
    match b {
        Backend::Postgres => "'erasure'",
        Backend::Sqlite => "origin",
    }
}

/// Erases named rows of one account and kind (a customer's redaction): each live one
/// becomes a change `deleted: true` without state, then every named row is deleted.
/// Returns (changes appended, rows deleted). The caller blanks their kept changes.
pub(crate) fn erase_rows(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
    ids: &[&str],
) -> diesel::QueryResult<(usize, usize)> {
    if ids.is_empty() {
        return Ok((0, 0));
    }
    let b = conn.backend();
    let tombstone = query(
        b,
        &format!(
            "UPDATE resources SET deleted = {t}, state = NULL, state_digest = NULL, origin = {origin}, \
             last_event_id = NULL, updated_at = {now} \
             WHERE source = $1 AND account = $2 AND kind = $3 AND NOT deleted AND id IN ({ids})",
            t = if b == Backend::Postgres { "true" } else { "1" },
            origin = erasure_origin(b),
            now = now(b),
            ids = in_list(4, ids.len()),
        ),
    );
    let delete = query(
        b,
        &format!(
            "DELETE FROM resources WHERE source = $1 AND account = $2 AND kind = $3 AND id IN ({})",
            in_list(4, ids.len())
        ),
    );
    let mut counts = [0; 2];
    for (n, q) in counts.iter_mut().zip([tombstone, delete]) {
        *n = on_conn!(conn, c => {
            let mut q = q
                .into_boxed()
                .bind::<Text, _>(source)
                .bind::<Text, _>(account)
                .bind::<Text, _>(kind);
            for id in ids {
                q = q.bind::<Text, _>(*id);
            }
            q.execute(c)
        })?;
    }
    Ok((counts[0], counts[1]))
}

/// Deletes every row of one account. The feed is `feed`'s: its changes stay there until
/// retention, unless the caller purges them too.
pub(crate) fn purge_account(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    let q = query(
        conn.backend(),
        "DELETE FROM resources WHERE source = $1 AND account = $2",
    );
    on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))
}

/// One resource row with its bookkeeping columns, as `explain` shows it.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct ResourceRow {
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    /// The state as JSON text.
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
    #[diesel(sql_type = Text)]
    pub origin: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_event_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub updated_at: String,
}

pub(crate) fn resource_row(
    conn: &mut Conn,
    key: &ResourceKey,
) -> diesel::QueryResult<Option<ResourceRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT version, deleted, {} AS state, origin, last_event_id, {} AS updated_at FROM resources \
             WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4",
            state_expr(b),
            crate::db::sql::ts_text(b, "updated_at")
        ),
    );
    let mut rows: Vec<ResourceRow> = on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.id.as_str())
        .load(c))?;
    Ok(rows.pop())
}

/// The accounts holding a row of `source`'s `kind` with `id`, at most `limit`.
pub(crate) fn accounts_with(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    id: &str,
    limit: i64,
) -> diesel::QueryResult<Vec<String>> {
    #[derive(diesel::QueryableByName)]
    struct A {
        #[diesel(sql_type = Text)]
        account: String,
    }
    let q = query(
        conn.backend(),
        "SELECT account FROM resources WHERE source = $1 AND kind = $2 AND id = $3 ORDER BY account LIMIT $4",
    );
    let rows: Vec<A> = on_conn!(conn, c => q
        .bind::<Text, _>(source)
        .bind::<Text, _>(kind)
        .bind::<Text, _>(id)
        .bind::<diesel::sql_types::BigInt, _>(limit)
        .load(c))?;
    Ok(rows.into_iter().map(|a| a.account).collect())
}

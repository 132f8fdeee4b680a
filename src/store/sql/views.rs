//! The typed views over `resources` (one per kind that declares `columns`) and
//! `typed_views`, the record of those this daemon made. Each column is read from the JSON
//! state by an expression that answers NULL for a value that does not convert, never an
//! error; the same expression indexes it, so a query through the view can use the index.
//!
//! What comes from the configuration reaches this SQL only as checked identifiers
//! (`config::validate::columns`), double-quoted, and as string literals, quoted here: a
//! pointer holding a quote or a semicolon only changes which key is read. The DDL
//! contains `$` (regular expressions, SQLite's JSON paths), so it is run as it is, never
//! through `db::sql::query`; the statements on `typed_views` go through it.

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use diesel::sql_types::Text;
use sha2::{Digest, Sha256};

use crate::config::{Backend, Column, ColumnType, TimeFormat, TypedView};
use crate::db::sql::{now, query};
use crate::db::{Conn, on_conn};

/// A view this daemon made, as `typed_views` recorded it.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct MadeView {
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Text)]
    pub definition: String,
    #[diesel(sql_type = Text)]
    pub indexes: String,
}

impl MadeView {
    pub fn index_names(&self) -> impl Iterator<Item = &str> {
        self.indexes.lines().filter(|l| !l.is_empty())
    }
}

/// A kind's view and indexes as statements.
#[derive(Debug, Clone)]
pub struct ViewSql {
    pub name: String,
    pub source: String,
    pub kind: String,
    pub definition: String,
    /// (index name, CREATE INDEX statement).
    pub indexes: Vec<(String, String)>,
}

pub fn view_sql(backend: Backend, source: &str, kind: &str, view: &TypedView) -> ViewSql {
    let rows = format!(
        "source = {} AND kind = {}",
        literal(backend, source),
        literal(backend, kind)
    );
    let mut select = vec!["account, id, version, deleted, updated_at".to_string()];
    for c in &view.columns {
        select.push(format!("{} AS \"{}\"", column_expr(backend, c), c.name));
    }
    let definition = format!(
        "CREATE VIEW \"{}\" AS SELECT {} FROM resources WHERE {rows}",
        view.name,
        select.join(", ")
    );
    let indexes = view
        .indexes
        .iter()
        .filter_map(|name| view.columns.iter().find(|c| &c.name == name))
        .map(|c| {
            let body = format!("ON resources (({})) WHERE {rows}", column_expr(backend, c));
            // The expression's digest in the name: an index whose column changed is a
            // new index, the old one is dropped.
            let digest = Sha256::digest(body.as_bytes());
            let mut stem = format!("{}_{}", view.name, c.name);
            stem.truncate(54);
            let name = format!(
                "{stem}_{:02x}{:02x}{:02x}{:02x}",
                digest[0], digest[1], digest[2], digest[3]
            );
            let sql = format!("CREATE INDEX IF NOT EXISTS \"{name}\" {body}");
            (name, sql)
        })
        .collect();
    ViewSql {
        name: view.name.clone(),
        source: source.to_string(),
        kind: kind.to_string(),
        definition,
        indexes,
    }
}

/// A string literal. On PostgreSQL an escape string (`E'..'`), whose meaning does not
/// depend on `standard_conforming_strings`.
fn literal(backend: Backend, s: &str) -> String {
    match backend {
        Backend::Postgres => format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''")),
        Backend::Sqlite => format!("'{}'", s.replace('\'', "''")),
    }
}

fn column_expr(backend: Backend, c: &Column) -> String {
    match backend {
        Backend::Postgres => pg_expr(c),
        Backend::Sqlite => sqlite_expr(c),
    }
}

/// `#>>` reads strings unquoted and numbers and booleans as their JSON text; the
/// patterns decide what converts (no `\` in them: an escape string is not needed).
fn pg_expr(c: &Column) -> String {
    let path: Vec<String> = c
        .path
        .iter()
        .map(|s| literal(Backend::Postgres, s))
        .collect();
    let v = format!("(state #>> ARRAY[{}]::text[])", path.join(", "));
    match c.ty {
        ColumnType::Text => v,
        ColumnType::Bigint => format!("CASE WHEN {v} ~ '^-?[0-9]{{1,18}}$' THEN {v}::bigint END"),
        ColumnType::Numeric => format!(
            "CASE WHEN {v} ~ '^-?[0-9]{{1,255}}([.][0-9]{{1,255}})?$' THEN {v}::numeric END"
        ),
        ColumnType::Boolean => {
            format!("CASE {v} WHEN 'true' THEN true WHEN 'false' THEN false END")
        }
        ColumnType::Timestamptz(TimeFormat::Unix) => format!(
            "CASE WHEN {v} ~ '^-?[0-9]{{1,11}}$' THEN to_timestamp({v}::double precision) END"
        ),
        ColumnType::Timestamptz(TimeFormat::UnixMs) => format!(
            "CASE WHEN {v} ~ '^-?[0-9]{{1,14}}$' THEN to_timestamp({v}::double precision / 1000) END"
        ),
        ColumnType::Timestamptz(TimeFormat::Rfc3339) => {
            format!("webhook_reconciler_timestamptz({v})")
        }
    }
}

/// SQLite: `json_type` says what the value is, `json_extract` reads it; GLOB patterns
/// stand in for PostgreSQL's regular expressions. No decimal type: numeric is REAL (or
/// INTEGER); timestamps are ISO 8601 UTC text like `updated_at`.
fn sqlite_expr(c: &Column) -> String {
    let mut path = String::from("$");
    for s in &c.path {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            path.push_str(&format!("[{s}]"));
        } else {
            path.push_str(&format!(".\"{s}\""));
        }
    }
    let p = literal(Backend::Sqlite, &path);
    let j = format!("json_extract(state, {p})");
    let t = format!("json_type(state, {p})");
    // The digits after an optional minus sign.
    let u = format!("(CASE WHEN substr({j}, 1, 1) = '-' THEN substr({j}, 2) ELSE {j} END)");
    let digits =
        |max: usize| format!("({u} <> '' AND {u} NOT GLOB '*[^0-9]*' AND length({u}) <= {max})");
    const ISO: &str = "'%Y-%m-%dT%H:%M:%fZ'";
    match c.ty {
        ColumnType::Text => format!(
            "CASE {t} WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE CAST({j} AS TEXT) END"
        ),
        ColumnType::Bigint => format!(
            "CASE {t} WHEN 'integer' THEN {j} WHEN 'text' THEN CASE WHEN {} THEN CAST({j} AS INTEGER) END END",
            digits(18)
        ),
        ColumnType::Numeric => format!(
            "CASE {t} WHEN 'integer' THEN {j} WHEN 'real' THEN {j} WHEN 'text' THEN CASE WHEN {u} GLOB '[0-9]*' \
             AND {u} NOT GLOB '*[^0-9.]*' AND {u} NOT GLOB '*.*.*' AND {u} NOT GLOB '*.' AND length({u}) <= 511 \
             THEN CAST({j} AS NUMERIC) END END"
        ),
        ColumnType::Boolean => format!(
            "CASE {t} WHEN 'true' THEN 1 WHEN 'false' THEN 0 WHEN 'text' THEN CASE {j} WHEN 'true' THEN 1 WHEN 'false' THEN 0 END END"
        ),
        ColumnType::Timestamptz(TimeFormat::Unix) => format!(
            "CASE WHEN {t} = 'integer' OR ({t} = 'text' AND {}) THEN strftime({ISO}, CAST({j} AS INTEGER), 'unixepoch') END",
            digits(11)
        ),
        ColumnType::Timestamptz(TimeFormat::UnixMs) => format!(
            "CASE WHEN {t} = 'integer' OR ({t} = 'text' AND {}) THEN strftime({ISO}, CAST({j} AS INTEGER) / 1000.0, 'unixepoch') END",
            digits(14)
        ),
        // A bare number would be read as a Julian day: a date comes first.
        ColumnType::Timestamptz(TimeFormat::Rfc3339) => format!(
            "CASE WHEN {t} = 'text' AND {j} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' THEN strftime({ISO}, {j}) END"
        ),
    }
}

pub fn made_views(conn: &mut Conn) -> diesel::QueryResult<Vec<MadeView>> {
    let q = query(
        conn.backend(),
        "SELECT name, definition, indexes FROM typed_views ORDER BY name",
    );
    on_conn!(conn, c => q.load(c))
}

/// Whether the database has a table, view, index or sequence of this name (another
/// one than a view this daemon made: the caller asks only for names it did not make).
pub fn name_taken(conn: &mut Conn, name: &str) -> diesel::QueryResult<bool> {
    #[derive(diesel::QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let sql = match conn.backend() {
        Backend::Postgres => {
            "SELECT count(*) AS n FROM pg_class WHERE relname = $1 AND relnamespace = current_schema()::regnamespace"
        }
        Backend::Sqlite => "SELECT count(*) AS n FROM sqlite_master WHERE name = $1",
    };
    let q = query(conn.backend(), sql).bind::<Text, _>(name);
    let found: Found = on_conn!(conn, c => q.get_result(c))?;
    Ok(found.n > 0)
}

/// Drops the view and its indexes but those in `keep` (a view made again keeps the
/// indexes whose expression did not change, rather than building them again).
pub fn drop_view(conn: &mut Conn, made: &MadeView, keep: &[&str]) -> diesel::QueryResult<()> {
    for index in made.index_names().filter(|i| !keep.contains(i)) {
        execute(conn, &format!("DROP INDEX IF EXISTS \"{index}\""))?;
    }
    execute(conn, &format!("DROP VIEW IF EXISTS \"{}\"", made.name))?;
    let q = query(conn.backend(), "DELETE FROM typed_views WHERE name = $1")
        .bind::<Text, _>(&made.name);
    on_conn!(conn, c => q.execute(c))?;
    Ok(())
}

/// Makes the view and its indexes where they are missing (someone may have dropped
/// one: `made` says only what was recorded), drops the indexes it no longer has, and
/// records it. An unchanged view costs a start no DDL, so no lock on `resources`. A
/// view whose definition changed is dropped first ([`drop_view`]).
pub fn make_view(
    conn: &mut Conn,
    view: &ViewSql,
    made: Option<&MadeView>,
) -> diesel::QueryResult<()> {
    if made.is_none() || !name_taken(conn, &view.name)? {
        execute(conn, &view.definition)?;
    }
    if let Some(made) = made {
        for old in made.index_names() {
            if !view.indexes.iter().any(|(name, _)| name == old) {
                execute(conn, &format!("DROP INDEX IF EXISTS \"{old}\""))?;
            }
        }
    }
    for (name, sql) in &view.indexes {
        if !name_taken(conn, name)? {
            execute(conn, sql)?;
        }
    }
    let names: Vec<&str> = view.indexes.iter().map(|(n, _)| n.as_str()).collect();
    if made.is_some_and(|m| m.index_names().eq(names.iter().copied())) {
        return Ok(());
    }
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO typed_views (name, source, kind, definition, indexes) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, indexes = excluded.indexes, made_at = {}",
            now(b)
        ),
    )
    .bind::<Text, _>(&view.name)
    .bind::<Text, _>(&view.source)
    .bind::<Text, _>(&view.kind)
    .bind::<Text, _>(&view.definition)
    .bind::<Text, _>(names.join("\n"));
    on_conn!(conn, c => q.execute(c))?;
    Ok(())
}

/// On PostgreSQL, waits for another process making views (or migrating) to finish.
pub fn lock(conn: &mut Conn) -> diesel::QueryResult<()> {
    if conn.backend() == Backend::Postgres {
        execute(
            conn,
            &format!(
                "SELECT pg_advisory_xact_lock({})",
                crate::db::MIGRATION_LOCK_KEY
            ),
        )?;
    }
    Ok(())
}

fn execute(conn: &mut Conn, sql: &str) -> diesel::QueryResult<()> {
    on_conn!(conn, c => c.batch_execute(sql))
}

//! The database: one connection type over PostgreSQL and SQLite, pools, transactions and
//! migrations. Only this module and the table owners' `sql` modules (`store::sql`,
//! `bookkeeping::sql`, `feed::sql`, sharing the helpers in `db::sql`) know diesel and SQL.
//!
//! Why our own two-variant enum instead of diesel's `MultiConnection`: the guarded write
//! needs `ON CONFLICT`, which diesel cannot express on a `MultiConnection`; the SQL
//! differs between the backends anyway (JSONB casts, timestamps); and
//! `MultiConnection::establish` hides the real connection error. A `match` on the
//! variant runs the same `sql_query` code on either backend.
//!
//! Invariant: every write runs in one transaction taken by [`Db::write`]; on SQLite it is
//! `BEGIN IMMEDIATE`, so the write lock is held from the first statement and concurrent
//! writers queue (busy timeout) instead of failing with "database is locked".

pub(crate) mod sql;
mod sqlite_memory;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::r2d2::{ManageConnection, Pool};
use diesel::{Connection, PgConnection, SqliteConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use secrecy::ExposeSecret;
use tokio::sync::Semaphore;

use crate::config::{Backend, DatabaseConfig, Synchronous};

const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");
const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// Serialises concurrent `migrate` runs of several replicas on one PostgreSQL database.
pub(crate) const MIGRATION_LOCK_KEY: i64 = 0x7765_6268_6f6f_6b31; // "webhook1"

/// A timestamp of the database's clock (UTC). Both backends hand it over as ISO 8601
/// text; SQLite stores it with milliseconds, PostgreSQL with microseconds, and a value
/// bound back must keep that form so that SQLite's text comparison stays a time
/// comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DbTime(pub chrono::DateTime<chrono::Utc>);

impl DbTime {
    /// Reads the text a statement returned (`sql::ts_text`).
    pub fn parse(text: &str) -> diesel::QueryResult<DbTime> {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| DbTime(t.with_timezone(&chrono::Utc)))
            .map_err(|e| {
                diesel::result::Error::DeserializationError(
                    format!("database timestamp {text:?}: {e}").into(),
                )
            })
    }

    /// The text bound as a parameter on `backend`.
    pub fn to_db(self, backend: Backend) -> String {
        let format = match backend {
            Backend::Postgres => "%Y-%m-%dT%H:%M:%S%.6fZ",
            Backend::Sqlite => "%Y-%m-%dT%H:%M:%S%.3fZ",
        };
        self.0.format(format).to_string()
    }
}

impl std::fmt::Display for DbTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }
}

/// A live connection to either backend.
pub enum Conn {
    Postgres(PgConnection),
    Sqlite(SqliteConnection),
}

/// Runs the same diesel code against whichever connection is inside a [`Conn`].
macro_rules! on_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            $crate::db::Conn::Postgres($c) => $body,
            $crate::db::Conn::Sqlite($c) => $body,
        }
    };
}
pub(crate) use on_conn;

impl Conn {
    pub fn backend(&self) -> Backend {
        match self {
            Conn::Postgres(_) => Backend::Postgres,
            Conn::Sqlite(_) => Backend::Sqlite,
        }
    }

    fn batch_execute(&mut self, sql: &str) -> diesel::QueryResult<()> {
        on_conn!(self, c => c.batch_execute(sql))
    }
}

/// Why the database could not do what was asked. Every variant means "try again later"
/// to a webhook sender (503); the message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    #[error("database task failed: {0}")]
    Task(String),
}

/// What a database error means for the work that hit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The database cannot take writes right now (connection lost, shutting down, a lock
    /// or statement timeout, a serialization failure, SQLite busy): the same work
    /// succeeds later. A webhook gets 503 + Retry-After.
    Unavailable,
    /// The database refused this work's data (a check or not-null violation, a value too
    /// long or out of range, invalid text): retrying can never succeed. A webhook gets
    /// 422 and a dead letter, never 503 (its sender would retry it for ever).
    Data,
    /// Neither is known: treated as unavailable (nothing is lost), and logged as an
    /// error so a new case is seen and classified.
    Unknown,
}

/// Message fragments (lower case) of errors that mean "not now", for the errors diesel
/// reports as `Unknown` (it exposes no SQLSTATE): PostgreSQL's 57014 statement timeout,
/// 55P03 lock not available, 40P01 deadlock, 57P0x shutdown, 53xxx resources; SQLite's
/// BUSY and LOCKED.
const UNAVAILABLE_MESSAGES: &[&str] = &[
    "canceling statement due to statement timeout",
    "canceling statement due to lock timeout",
    "could not obtain lock",
    "lock timeout",
    "deadlock detected",
    "could not serialize access",
    "terminating connection",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "server closed the connection",
    "no connection to the server",
    "too many connections",
    "out of memory",
    "no space left on device",
    "could not extend file",
    "database is locked",
    "database table is locked",
    "disk i/o error",
];

/// Message fragments of errors caused by one write's data: PostgreSQL's class 22 (data
/// exception: value too long, numeric out of range, invalid text, untranslatable
/// character) and 54000 (index row too large); SQLite's TOOBIG.
const DATA_MESSAGES: &[&str] = &[
    "value too long",
    "out of range",
    "value overflows numeric format",
    "numeric field overflow",
    "invalid input syntax",
    "invalid byte sequence",
    "unsupported unicode escape sequence",
    "has no equivalent in encoding",
    "index row size",
    "index row requires",
    "exceeds btree",
    "string or blob too big",
    "malformed json",
    "invalid json",
];

impl DbError {
    /// The error for each of `n` callers whose shared transaction failed: the first gets
    /// this one, the others its message (as `Unavailable` when it is that, else `Task`).
    pub fn shared(self, n: usize) -> Vec<DbError> {
        let message = self.to_string();
        let unavailable = self.is_unavailable();
        let mut errors = Vec::with_capacity(n);
        errors.push(self);
        errors.extend((1..n).map(|_| {
            if unavailable {
                DbError::Unavailable(message.clone())
            } else {
                DbError::Task(message.clone())
            }
        }));
        errors.truncate(n);
        errors
    }

    /// True when the database itself is out of reach (as opposed to one statement
    /// failing): retrying the same work elsewhere in this process would fail too.
    pub fn is_unavailable(&self) -> bool {
        use diesel::result::{DatabaseErrorKind, Error};
        match self {
            DbError::Unavailable(_) | DbError::Task(_) => true,
            DbError::Query(Error::DatabaseError(
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
                _,
            )) => true,
            DbError::Query(_) => false,
        }
    }

    /// Whether the error means "not now", "never with this data", or is unknown.
    pub fn class(&self) -> ErrorClass {
        use diesel::result::{DatabaseErrorKind as K, Error};
        let info = match self {
            DbError::Unavailable(_) | DbError::Task(_) => return ErrorClass::Unavailable,
            DbError::Query(Error::DatabaseError(kind, info)) => match kind {
                K::ClosedConnection
                | K::UnableToSendCommand
                | K::SerializationFailure
                | K::ReadOnlyTransaction => return ErrorClass::Unavailable,
                K::CheckViolation | K::NotNullViolation | K::ForeignKeyViolation => {
                    return ErrorClass::Data;
                }
                _ => info.message().to_lowercase(),
            },
            DbError::Query(other) => other.to_string().to_lowercase(),
        };
        if UNAVAILABLE_MESSAGES.iter().any(|m| info.contains(m)) {
            ErrorClass::Unavailable
        } else if DATA_MESSAGES.iter().any(|m| info.contains(m)) {
            ErrorClass::Data
        } else {
            ErrorClass::Unknown
        }
    }
}

/// A pooled connection that remembers whether it is broken. After a failed statement
/// the connection is kept only if it shows that it is usable and outside any
/// transaction (see `recover`); otherwise it is retired and the next checkout opens a
/// new one (PostgreSQL restarted, socket cut...).
pub struct PoolConn {
    conn: Conn,
    broken: bool,
}

/// Why a failure keeps the connection when it can: a refused value or a "database is
/// locked" retired it before, and each reconnect cost a PostgreSQL login (a backend
/// process, TLS) or, on SQLite, the connection's page cache (up to `cache_size`),
/// freed to the C allocator and filled again on another thread's arena: the soak saw
/// RSS step up by the size of one cache at every outage.
fn recover(conn: &mut Conn) -> bool {
    // Ends whatever transaction the failure left open; its own error (no transaction
    // open) tells nothing. Then `BEGIN; ROLLBACK` succeeds only on a live connection in
    // autocommit: SQLite refuses a nested BEGIN, and it takes no lock.
    let _ = conn.batch_execute("ROLLBACK");
    conn.batch_execute("BEGIN; ROLLBACK").is_ok()
}

struct Manager {
    url: String,
    backend: Backend,
    busy_timeout: Duration,
    synchronous: Synchronous,
    /// Connections this pool has opened since the start: with the open count, it
    /// tells a pool that reconnects (churn) from one that keeps its connections.
    opened: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(String);

impl ManageConnection for Manager {
    type Connection = PoolConn;
    type Error = ConnectError;

    fn connect(&self) -> Result<PoolConn, ConnectError> {
        let conn = connect(&self.url, self.backend, self.busy_timeout, self.synchronous)?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(PoolConn {
            conn,
            broken: false,
        })
    }

    fn is_valid(&self, conn: &mut PoolConn) -> Result<(), ConnectError> {
        conn.conn
            .batch_execute("SELECT 1")
            .map_err(|e| ConnectError(e.to_string()))
    }

    fn has_broken(&self, conn: &mut PoolConn) -> bool {
        conn.broken
    }
}

fn connect(
    url: &str,
    backend: Backend,
    busy_timeout: Duration,
    synchronous: Synchronous,
) -> Result<Conn, ConnectError> {
    match backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(url).map_err(|e| {
                ConnectError(format!(
                    "cannot connect to PostgreSQL: {}",
                    crate::config::redact_secrets_in(&e.to_string(), url)
                ))
            })?;
            // No JIT: every statement here touches a handful of rows, but the planner's
            // cost of one grows with the dead rows a table carries, and past
            // jit_above_cost each execution compiled itself first. With change_pending
            // bloated by a 10M first sync, that was 1.4 ms of LLVM per 10-row publish,
            // half of a reconcile page's time.
            c.batch_execute("SET jit = off")
                .map_err(|e| ConnectError(format!("cannot configure PostgreSQL session: {e}")))?;
            Ok(Conn::Postgres(c))
        }
        Backend::Sqlite => {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            let mut c = SqliteConnection::establish(path)
                .map_err(|e| ConnectError(format!("cannot open SQLite database {path:?}: {e}")))?;
            // WAL is set once, by Db::connect: it persists in the file, and switching to
            // it takes an exclusive lock that would race with the other connections.
            // synchronous = FULL by default: a 2xx is sent only after the write is
            // durable, and with NORMAL a power cut can lose commits already answered.
            c.batch_execute(&format!(
                "PRAGMA busy_timeout = {}; PRAGMA synchronous = {}; PRAGMA foreign_keys = ON;",
                busy_timeout.as_millis(),
                synchronous.pragma()
            ))
            .map_err(|e| ConnectError(format!("cannot configure SQLite database {path:?}: {e}")))?;
            Ok(Conn::Sqlite(c))
        }
    }
}

/// The database handle shared by the whole process. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    backend: Backend,
    writer: Pool<Manager>,
    reader: Pool<Manager>,
    /// Fair FIFO queue in front of the writer pool, so waiting requests park as async
    /// tasks instead of blocking threads, and in arrival order.
    write_permits: Arc<Semaphore>,
    acquire_timeout: Duration,
    writer_opened: Arc<AtomicU64>,
    reader_opened: Arc<AtomicU64>,
}

/// One pool's connections, for `/readyz` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    /// Open now.
    pub open: u32,
    /// Open and not checked out.
    pub idle: u32,
    /// Opened since the process started (every reconnect counts).
    pub opened_total: u64,
}

impl Db {
    /// Connects once (so a wrong URL or password fails now, with the real message), then
    /// builds the pools.
    ///
    /// SQLite gets a single writer connection: writers serialise on SQLite's lock anyway,
    /// and queueing them here is fair, whereas SQLite's busy handler retries with
    /// back-off and lets later writers overtake earlier ones.
    pub fn connect(cfg: &DatabaseConfig) -> Result<Db, DbError> {
        let url = cfg.url.expose_secret().to_string();
        let mut first = connect(&url, cfg.backend, cfg.busy_timeout, cfg.synchronous)
            .map_err(|e| DbError::Unavailable(e.0))?;
        if let Conn::Sqlite(c) = &mut first {
            // Readers and the writer then no longer block each other.
            c.batch_execute("PRAGMA journal_mode = WAL")?;
        }
        drop(first);
        let build = |size: u32| {
            let opened = Arc::new(AtomicU64::new(0));
            let builder = Pool::builder()
                .max_size(size)
                // No connections opened in the background: a one-shot command could
                // exit while one is half-way through its TLS handshake, and libpq/OpenSSL
                // do not survive being torn down under a running thread.
                .min_idle(Some(0))
                .connection_timeout(cfg.acquire_timeout)
                // Checked at checkout would cost a round trip per request; broken
                // connections are retired on error instead (see PoolConn).
                .test_on_check_out(false);
            // r2d2 closes a connection idle for 10 minutes and any connection 30
            // minutes old. On PostgreSQL that bounds a backend's own caches; a SQLite
            // connection has no server side, and each close and reopen only frees its
            // page cache to the C allocator and fills a new one (RSS that rose at every
            // reopen in the soak). Five connections, kept, are the bound instead.
            let builder = match cfg.backend {
                Backend::Postgres => builder,
                Backend::Sqlite => builder.idle_timeout(None).max_lifetime(None),
            };
            let pool = builder.build_unchecked(Manager {
                url: url.clone(),
                backend: cfg.backend,
                busy_timeout: cfg.busy_timeout,
                synchronous: cfg.synchronous,
                opened: opened.clone(),
            });
            (pool, opened)
        };
        let ((writer, writer_opened), (reader, reader_opened), permits) = match cfg.backend {
            Backend::Postgres => {
                let (pool, opened) = build(cfg.max_connections);
                (
                    (pool.clone(), opened.clone()),
                    (pool, opened),
                    cfg.max_connections,
                )
            }
            Backend::Sqlite => (build(1), build(cfg.max_connections.clamp(1, 4)), 1),
        };
        Ok(Db {
            backend: cfg.backend,
            writer,
            reader,
            write_permits: Arc::new(Semaphore::new(permits as usize)),
            acquire_timeout: cfg.acquire_timeout,
            writer_opened,
            reader_opened,
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// On SQLite, the bytes SQLite holds itself (its page caches are most of it: at
    /// most `cache_size` per connection); `None` on PostgreSQL.
    pub fn sqlite_memory_bytes(&self) -> Option<i64> {
        (self.backend == Backend::Sqlite).then(sqlite_memory::used_bytes)
    }

    /// Connections of each pool (for `/readyz` and metrics): `writer` and `reader` on
    /// SQLite, the one pool as `main` on PostgreSQL.
    pub fn pool_states(&self) -> Vec<(&'static str, PoolState)> {
        let state = |pool: &Pool<Manager>, opened: &AtomicU64| {
            let s = pool.state();
            PoolState {
                open: s.connections,
                idle: s.idle_connections,
                opened_total: opened.load(Ordering::Relaxed),
            }
        };
        match self.backend {
            Backend::Postgres => vec![("main", state(&self.writer, &self.writer_opened))],
            Backend::Sqlite => vec![
                ("writer", state(&self.writer, &self.writer_opened)),
                ("reader", state(&self.reader, &self.reader_opened)),
            ],
        }
    }

    /// Runs `f` in one write transaction on a blocking thread.
    pub async fn write<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Conn) -> diesel::QueryResult<T> + Send + 'static,
        T: Send + 'static,
    {
        self.on_writer(true, f).await
    }

    /// Like [`Db::write`], but on PostgreSQL `f`'s statements are sent without
    /// `BEGIN`/`COMMIT`, each committing by itself: for work that is one statement (a
    /// data-modifying `WITH` is atomic), or whose later statements only read. Two round
    /// trips fewer; a reconcile run at 10,000 accounts had five transactions. SQLite:
    /// exactly [`Db::write`].
    pub async fn write_statement<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Conn) -> diesel::QueryResult<T> + Send + 'static,
        T: Send + 'static,
    {
        self.on_writer(self.backend == Backend::Sqlite, f).await
    }

    /// `f` on a writer connection, in a write transaction if `in_transaction`.
    async fn on_writer<T, F>(&self, in_transaction: bool, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Conn) -> diesel::QueryResult<T> + Send + 'static,
        T: Send + 'static,
    {
        let permit = tokio::time::timeout(
            self.acquire_timeout,
            self.write_permits.clone().acquire_owned(),
        )
        .await
        .map_err(|_| {
            DbError::Unavailable(format!(
                "no database connection free within {:?}; the database is slow or overloaded",
                self.acquire_timeout
            ))
        })?
        .map_err(|e| DbError::Task(e.to_string()))?;
        let pool = self.writer.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut pc = checkout(&pool)?;
            let result = if in_transaction {
                write_tx(&mut pc.conn, f)
            } else {
                f(&mut pc.conn)
            };
            if result.is_err() {
                pc.broken = !recover(&mut pc.conn);
            }
            Ok(result?)
        })
        .await
        .map_err(|e| DbError::Task(e.to_string()))?
    }

    /// Runs `f` on a reader connection (no transaction).
    pub async fn read<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Conn) -> diesel::QueryResult<T> + Send + 'static,
        T: Send + 'static,
    {
        let pool = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let mut pc = checkout(&pool)?;
            let result = f(&mut pc.conn);
            if result.is_err() {
                pc.broken = !recover(&mut pc.conn);
            }
            Ok(result?)
        })
        .await
        .map_err(|e| DbError::Task(e.to_string()))?
    }

    /// Applies the embedded migrations that have not run yet; returns their versions.
    pub fn migrate(&self) -> Result<Vec<String>, DbError> {
        let mut pc = checkout(&self.writer)?;
        let result = migrate(&mut pc.conn);
        if result.is_err() {
            pc.broken = true;
        }
        result
    }

    /// Whether every embedded migration has been applied (readiness).
    pub async fn is_migrated(&self) -> Result<bool, DbError> {
        let pool = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            use diesel::RunQueryDsl;
            let mut pc = checkout(&pool)?;
            let backend = pc.conn.backend();
            let exists = match &mut pc.conn {
                Conn::Postgres(c) => sql::query(backend, sql::migrations_table_exists(backend))
                    .get_result::<sql::TextValue>(c),
                Conn::Sqlite(c) => sql::query(backend, sql::migrations_table_exists(backend))
                    .get_result::<sql::TextValue>(c),
            };
            match exists {
                Ok(v) if v.v == "no" => return Ok(false),
                Ok(_) => {}
                Err(e) => {
                    pc.broken = true;
                    return Err(DbError::Unavailable(e.to_string()));
                }
            }
            let pending = match &mut pc.conn {
                Conn::Postgres(c) => c.has_pending_migration(PG_MIGRATIONS),
                Conn::Sqlite(c) => c.has_pending_migration(SQLITE_MIGRATIONS),
            };
            match pending {
                Ok(p) => Ok(!p),
                Err(e) => {
                    pc.broken = true;
                    Err(DbError::Unavailable(e.to_string()))
                }
            }
        })
        .await
        .map_err(|e| DbError::Task(e.to_string()))?
    }
}

fn checkout(pool: &Pool<Manager>) -> Result<diesel::r2d2::PooledConnection<Manager>, DbError> {
    pool.get().map_err(|e| DbError::Unavailable(e.to_string()))
}

fn write_tx<T>(
    conn: &mut Conn,
    f: impl FnOnce(&mut Conn) -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T> {
    conn.batch_execute(match conn.backend() {
        Backend::Postgres => "BEGIN",
        Backend::Sqlite => "BEGIN IMMEDIATE",
    })?;
    // On failure the caller's `recover` rolls back.
    let v = f(conn)?;
    conn.batch_execute("COMMIT")?;
    Ok(v)
}

/// Inside [`Db::write`]'s transaction: marks where the rest of it can be undone
/// ([`rollback_to_savepoint`]).
pub(crate) fn savepoint(conn: &mut Conn) -> diesel::QueryResult<()> {
    conn.batch_execute("SAVEPOINT undo")
}

/// Undoes everything since [`savepoint`], its row locks included; the transaction
/// goes on.
pub(crate) fn rollback_to_savepoint(conn: &mut Conn) -> diesel::QueryResult<()> {
    conn.batch_execute("ROLLBACK TO SAVEPOINT undo")
}

fn migrate(conn: &mut Conn) -> Result<Vec<String>, DbError> {
    let fail = |e: Box<dyn std::error::Error + Send + Sync>| {
        DbError::Unavailable(format!("migration failed: {e}"))
    };
    let applied = match conn {
        Conn::Postgres(c) => {
            c.batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))?;
            let r = c
                .run_pending_migrations(PG_MIGRATIONS)
                .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>());
            c.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))?;
            r.map_err(fail)?
        }
        Conn::Sqlite(c) => c
            .run_pending_migrations(SQLITE_MIGRATIONS)
            .map(|v| v.iter().map(ToString::to_string).collect())
            .map_err(fail)?,
    };
    Ok(applied)
}

//! A fresh database per test, and read-only queries for assertions.

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl, SqliteConnection, sql_query};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Server URL for the PostgreSQL tests (no database name).
pub fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// The PostgreSQL server's socket address, for tests that put a proxy in front of it.
pub async fn pg_addr() -> std::net::SocketAddr {
    let url = reqwest::Url::parse(&pg_server()).unwrap();
    let host = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap_or(5432));
    tokio::net::lookup_host(host).await.unwrap().next().unwrap()
}

fn pg_admin() -> PgConnection {
    let url = format!("{}/test", pg_server());
    PgConnection::establish(&url).unwrap_or_else(|e| {
        panic!(
            "PostgreSQL is unreachable at {url} ({e}). The PostgreSQL tests never skip: start it with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` or set WR_TEST_PG"
        )
    })
}

/// One test's database, dropped (PostgreSQL) or deleted (SQLite) at the end.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pub pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => {
                let name = format!("wr_test_{:016x}", rand::random::<u64>());
                pg_admin()
                    .batch_execute(&format!("CREATE DATABASE {name}"))
                    .unwrap();
                TestDb {
                    backend,
                    url: format!("{}/{name}", pg_server()),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("test.db");
                TestDb {
                    backend,
                    url: format!("sqlite://{}", path.display()),
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    fn sqlite_path(&self) -> &str {
        self.url.strip_prefix("sqlite://").unwrap()
    }

    /// A reader that waits for the daemon's writer instead of failing.
    fn sqlite(&self) -> SqliteConnection {
        let mut c = SqliteConnection::establish(self.sqlite_path()).unwrap();
        c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
        c
    }

    /// Runs a query returning one BIGINT column named `n`.
    pub fn scalar(&self, sql: &str) -> i64 {
        #[derive(QueryableByName)]
        struct N {
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        let rows: Vec<N> = match self.backend {
            Backend::Postgres => sql_query(sql)
                .load(&mut PgConnection::establish(&self.url).unwrap())
                .unwrap(),
            Backend::Sqlite => sql_query(sql).load(&mut self.sqlite()).unwrap(),
        };
        rows[0].n
    }

    pub fn count(&self, table_and_where: &str) -> i64 {
        self.scalar(&format!("SELECT COUNT(*) AS n FROM {table_and_where}"))
    }

    /// The stored row of one resource.
    pub fn resource(&self, source: &str, kind: &str, id: &str) -> Option<Resource> {
        let sql = match self.backend {
            Backend::Postgres => {
                "SELECT id, version, state::text AS state, deleted, origin, last_event_id FROM resources WHERE source = $1 AND kind = $2 AND id = $3"
            }
            Backend::Sqlite => {
                "SELECT id, version, state, deleted, origin, last_event_id FROM resources WHERE source = ?1 AND kind = ?2 AND id = ?3"
            }
        };
        let q = sql_query(sql)
            .bind::<Text, _>(source)
            .bind::<Text, _>(kind)
            .bind::<Text, _>(id);
        let mut rows: Vec<Resource> = match self.backend {
            Backend::Postgres => q
                .load(&mut PgConnection::establish(&self.url).unwrap())
                .unwrap(),
            Backend::Sqlite => q.load(&mut self.sqlite()).unwrap(),
        };
        rows.pop()
    }

    /// The `outcome` recorded for an event id.
    pub fn event_outcome(&self, source: &str, event_id: &str) -> Option<String> {
        #[derive(QueryableByName)]
        struct O {
            #[diesel(sql_type = Text)]
            outcome: String,
        }
        let sql = match self.backend {
            Backend::Postgres => {
                "SELECT outcome FROM processed_events WHERE source = $1 AND event_id = $2"
            }
            Backend::Sqlite => {
                "SELECT outcome FROM processed_events WHERE source = ?1 AND event_id = ?2"
            }
        };
        let q = sql_query(sql)
            .bind::<Text, _>(source)
            .bind::<Text, _>(event_id);
        let mut rows: Vec<O> = match self.backend {
            Backend::Postgres => q
                .load(&mut PgConnection::establish(&self.url).unwrap())
                .unwrap(),
            Backend::Sqlite => q.load(&mut self.sqlite()).unwrap(),
        };
        rows.pop().map(|o| o.outcome)
    }

    /// Every dead letter as (event id, reason).
    pub fn dead_letter_reasons(&self) -> Vec<(String, String)> {
        #[derive(QueryableByName)]
        struct D {
            #[diesel(sql_type = Text)]
            event_id: String,
            #[diesel(sql_type = Text)]
            reason: String,
        }
        let q = sql_query("SELECT event_id, reason FROM dead_letters ORDER BY event_id");
        let rows: Vec<D> = match self.backend {
            Backend::Postgres => q
                .load(&mut PgConnection::establish(&self.url).unwrap())
                .unwrap(),
            Backend::Sqlite => q.load(&mut self.sqlite()).unwrap(),
        };
        rows.into_iter().map(|d| (d.event_id, d.reason)).collect()
    }

    /// Runs a statement (test setup: backdating rows and the like).
    pub fn execute(&self, sql: &str) {
        match self.backend {
            Backend::Postgres => PgConnection::establish(&self.url)
                .unwrap()
                .batch_execute(sql)
                .unwrap(),
            // Waits for the daemon's writer instead of failing with "database is locked".
            Backend::Sqlite => self.sqlite().batch_execute(sql).unwrap(),
        }
    }

    /// True once the database clock has moved past every row's `updated_at` (SQLite
    /// keeps milliseconds, so a fast test can start a sweep in the same millisecond).
    pub fn clock_past_writes(&self) -> bool {
        let now = match self.backend {
            Backend::Postgres => "clock_timestamp()",
            Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        };
        self.count(&format!("resources WHERE updated_at >= {now}")) == 0
    }

    /// Opens a SQLite connection that holds the write lock until dropped.
    pub fn lock_sqlite(&self) -> SqliteConnection {
        let mut c = self.sqlite();
        c.batch_execute("BEGIN EXCLUSIVE").unwrap();
        c
    }
}

#[derive(Debug, Clone, QueryableByName)]
pub struct Resource {
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    #[diesel(sql_type = Text)]
    pub origin: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub last_event_id: Option<String>,
}

impl Resource {
    pub fn state_json(&self) -> serde_json::Value {
        serde_json::from_str(self.state.as_deref().unwrap_or("null")).unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            // FORCE ends the app's pooled connections.
            let _ =
                pg_admin().batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
}

impl TestDb {
    /// The same database for a second app (another replica): it is dropped with
    /// `self`, not with the alias.
    pub fn alias(&self) -> TestDb {
        TestDb {
            backend: self.backend,
            url: self.url.clone(),
            pg_name: None,
            _dir: None,
        }
    }

    /// Applies the shipped migrations before the one named `first_left_out` (a database
    /// as an earlier release left it), through the migration files themselves.
    pub fn migrate_before(&self, first_left_out: &str) {
        let dir = format!("{}/migrations/postgres", env!("CARGO_MANIFEST_DIR"));
        let leave = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap() >= first_left_out)
            .count();
        assert!(leave > 0, "no migration {first_left_out}");
        self.migrate_all_but(leave);
    }

    /// Applies the shipped migrations but the last `leave`.
    fn migrate_all_but(&self, leave: usize) {
        use diesel_migrations::{FileBasedMigrations, MigrationHarness};
        let dir = |b: &str| format!("{}/migrations/{b}", env!("CARGO_MANIFEST_DIR"));
        match self.backend {
            Backend::Postgres => {
                let files = FileBasedMigrations::from_path(dir("postgres")).unwrap();
                let mut c = PgConnection::establish(&self.url).unwrap();
                while c.pending_migrations(files.clone()).unwrap().len() > leave {
                    c.run_next_migration(files.clone()).unwrap();
                }
            }
            Backend::Sqlite => {
                let files = FileBasedMigrations::from_path(dir("sqlite")).unwrap();
                let mut c = SqliteConnection::establish(self.sqlite_path()).unwrap();
                while c.pending_migrations(files.clone()).unwrap().len() > leave {
                    c.run_next_migration(files.clone()).unwrap();
                }
            }
        }
    }
}

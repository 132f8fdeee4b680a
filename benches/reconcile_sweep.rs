//! Reconcile benchmark, like with like. A listing of N orders of ~200 bytes each (id,
//! version, status, amount, currency, customer, lines, updated_at) is served by a
//! separate process (this benchmark re-run with `--serve-sender N`: the simulated
//! sender, items computed from their index), so the sender costs the reconciler neither
//! CPU nor memory. Per backend and size:
//!
//! The kind has `detect_deletes = true`, so each complete sweep also scans the table for
//! rows the listing lacks (none here).
//!
//! 1. initial load: the real binary's `reconcile --json` into an empty table (all
//!    missing) — the product writes every row, digests included;
//! 2. 1% drift: the sender bumps every 200th item (offset 100) to version 2 and the
//!    local table loses every 200th row;
//! 3. the measured run: `reconcile --json` again, under `/usr/bin/time` (its `%M` is
//!    `wait4`'s `ru_maxrss`: the peak RSS), then the database is checked: N rows, every
//!    version equal to the sender's;
//! 4. PostgreSQL alone doing the same per-page SQL work (read the page's 1,000 rows by
//!    id, then one transaction upserting its ~10 drifted rows) and the deletion scan
//!    with 1 and with 2 clients, over the same table, in the same invocation; the ratio
//!    is printed;
//! 5. a plain Node reconciler (`benches/node/reconcile.mjs`, when `node` and `npm` are
//!    here) over the same drift, the table put back as the measured run found it: the
//!    comparison the performance issue names.
//!
//!   cargo bench --bench reconcile_sweep                                   # 100k and 1M, both backends
//!   cargo bench --bench reconcile_sweep -- --sizes 10000000 --backend postgres   # 10M, opt-in
//!
//! PostgreSQL server: $WR_TEST_PG (default postgres://postgres@127.0.0.1:5432).
//! `WR_BENCH_BIN=path`: measure that binary (an earlier build) instead of this one.
//!
//! `--statements`: on a server that preloads `pg_stat_statements`, print the statements
//! that took PostgreSQL's time during the drift run (and the dead rows the tables carried
//! into it), to see where a size's time goes.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness, not the daemon"
)]

#[path = "node/install.rs"]
mod node_install;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, RunQueryDsl, SqliteConnection};
use webhook_reconciler::config::Backend;
use webhook_reconciler::simulator::{Generated, SimSender, Style};

const PAGE_SIZE: u64 = 1000;

// The sender process writes a thousand JSON items a page (the simulator's generated
// listing); it shares the machine's cores with the reconciler and PostgreSQL, so it
// runs on the daemon's allocator too.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn binary() -> std::path::PathBuf {
    // Cargo builds the binary for benchmarks, with the same profile; $WR_BENCH_BIN
    // measures another build (an earlier commit's) against the same baselines.
    std::env::var_os("WR_BENCH_BIN").map_or_else(
        || std::path::PathBuf::from(env!("CARGO_BIN_EXE_webhook-reconciler")),
        std::path::PathBuf::from,
    )
}

/// The sender process: serves N generated items until its stdin closes; the line
/// `drift` switches every 200th item (offset 100) to version 2.
fn serve_sender(n: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let drift = Arc::new(AtomicBool::new(false));
    let d = drift.clone();
    let sim = rt.block_on(SimSender::start()).unwrap();
    sim.add_generated_kind(
        "items",
        Style::Cursor,
        Generated {
            count: n,
            version_of: Arc::new(move |i| {
                if d.load(Ordering::Relaxed) && i % 200 == 100 {
                    2
                } else {
                    1
                }
            }),
        },
    );
    println!("{}", sim.base_url());
    std::io::stdout().flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap().trim() == "drift" {
            drift.store(true, Ordering::Relaxed);
            println!("ok");
            std::io::stdout().flush().unwrap();
        }
    }
    drop(sim);
}

struct SenderProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    base: String,
}

impl SenderProcess {
    fn start(n: u64) -> SenderProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--serve-sender", &n.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut base = String::new();
        stdout.read_line(&mut base).unwrap();
        SenderProcess {
            child,
            stdin,
            stdout,
            base: base.trim().to_string(),
        }
    }

    fn drift(&mut self) {
        writeln!(self.stdin, "drift").unwrap();
        let mut ok = String::new();
        self.stdout.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim(), "ok");
    }
}

impl Drop for SenderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(db_url: &str, base: &str) -> String {
    format!(
        r#"
[database]
url = "{db_url}"
[log]
level = "warn"
[sources.bench]
api_base = "{base}"
requests_per_second = 100000
[sources.bench.webhook]
secrets = ["unused"]
[sources.bench.reconcile]
page_size = {PAGE_SIZE}
[sources.bench.kinds.item]
list = "/items"
version = "/version"
# Deletion detection runs after every complete sweep (its memory is measured too).
detect_deletes = true
"#
    )
}

/// What one `reconcile --json` run did.
struct Run {
    scanned: u64,
    applied: u64,
    seconds: f64,
    peak_kib: Option<u64>,
    /// CPU seconds (user + system) of the `reconcile` process, from GNU time.
    cpu: Option<f64>,
    /// CPU seconds of the whole machine and of the sender process during the run.
    machine_cpu: f64,
    /// Of the machine's idle time, the part spent waiting for I/O.
    iowait: f64,
    sender_cpu: f64,
    wall: f64,
    ok: bool,
    /// `reconcile --json`'s per-stage seconds.
    stages: serde_json::Value,
}

/// Runs `reconcile --json`; the peak RSS comes from GNU time (`wait4`'s `ru_maxrss`)
/// when /usr/bin/time exists.
fn reconcile(cfg: &std::path::Path, dir: &std::path::Path, sender_pid: u32) -> Run {
    let rss_file = dir.join("rss.txt");
    let gnu_time = std::path::Path::new("/usr/bin/time").exists();
    let mut cmd = if gnu_time {
        let mut c = Command::new("/usr/bin/time");
        c.arg("-f")
            .arg("%M %U %S")
            .arg("-o")
            .arg(&rss_file)
            .arg(binary());
        c
    } else {
        Command::new(binary())
    };
    let before = (machine_cpu(), process_cpu_seconds(sender_pid));
    let started = Instant::now();
    let out = cmd
        .arg("--config")
        .arg(cfg)
        .args(["reconcile", "--json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let after = (machine_cpu(), process_cpu_seconds(sender_pid));
    let time: Vec<f64> = std::fs::read_to_string(&rss_file)
        .ok()
        .and_then(|s| s.trim().lines().last().map(str::to_string))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let r = &report[0];
    Run {
        scanned: r["counts"]["scanned"].as_u64().unwrap_or(0),
        applied: r["counts"]["applied"].as_u64().unwrap_or(0),
        seconds: r["seconds"].as_f64().unwrap_or(f64::NAN),
        peak_kib: time.first().map(|k| *k as u64),
        cpu: (time.len() == 3).then(|| time[1] + time[2]),
        machine_cpu: after.0.0 - before.0.0,
        iowait: after.0.1 - before.0.1,
        sender_cpu: after.1 - before.1,
        wall,
        ok: out.status.success(),
        stages: r["stages"].clone(),
    }
}

enum Db {
    Pg(PgConnection),
    Lite(SqliteConnection),
}

impl Db {
    fn open(backend: Backend, url: &str) -> Db {
        match backend {
            Backend::Postgres => Db::Pg(PgConnection::establish(url).unwrap()),
            Backend::Sqlite => {
                let mut c =
                    SqliteConnection::establish(url.trim_start_matches("sqlite://")).unwrap();
                c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
                Db::Lite(c)
            }
        }
    }

    fn execute(&mut self, sql: &str) {
        match self {
            Db::Pg(c) => c.batch_execute(sql).unwrap(),
            Db::Lite(c) => c.batch_execute(sql).unwrap(),
        }
    }

    /// Writes out what earlier phases left dirty (the load of millions of rows, the
    /// VACUUM), so that each timed phase starts alike instead of paying for the one
    /// before it.
    fn checkpoint(&mut self) {
        self.execute(match self {
            Db::Pg(_) => "CHECKPOINT",
            Db::Lite(_) => "PRAGMA wal_checkpoint(TRUNCATE)",
        });
    }

    fn scalar(&mut self, sql: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = BigInt)]
            v: i64,
        }
        let q = diesel::sql_query(sql);
        match self {
            Db::Pg(c) => q.get_result::<V>(c).unwrap().v,
            Db::Lite(c) => q.get_result::<V>(c).unwrap().v,
        }
    }
}

/// The sender's index of an id `g0000000042`, in SQL.
const INDEX: &str = "CAST(substr(id, 2) AS BIGINT)";

/// Rows that are not what the sender lists: missing, extra, or at another version.
fn wrong_rows(db: &mut Db, n: u64) -> i64 {
    let count = db.scalar("SELECT COUNT(*) AS v FROM resources WHERE source = 'bench' AND kind = 'item' AND NOT deleted");
    let wrong_version = db.scalar(&format!(
        "SELECT COUNT(*) AS v FROM resources WHERE source = 'bench' AND kind = 'item' \
         AND version <> CASE WHEN {INDEX} % 200 = 100 THEN 2 ELSE 1 END"
    ));
    (count - n as i64).abs() + wrong_version
}

/// The page's checkpoint, as the product moves it with every page.
const CHECKPOINT: &str = "INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at, account) \
     VALUES ('bench', 'item', $1, now(), '') ON CONFLICT (source, account, kind) DO UPDATE SET \
     position = excluded.position, sweep_started_at = excluded.sweep_started_at, updated_at = now()";

/// One transaction writing `ids` at `version` the way the product's guarded write does
/// (every column, the digest, the version guard; the trigger fills the feed) and the
/// page's checkpoint, then the feed's sequencer pass.
fn guarded_page_write(c: &mut PgConnection, ids: &[u64], version: i64, page: u64, feed: bool) {
    c.transaction::<_, diesel::result::Error, _>(|c| {
        let id: Vec<String> = ids.iter().map(|i| Generated::id_of(*i)).collect();
        let state: Vec<String> = ids
            .iter()
            .map(|i| Generated::item(*i, version).to_string())
            .collect();
        diesel::sql_query(
            "INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id, state_digest) \
             SELECT 'bench', '', 'item', i, $2, s::jsonb, false, 'reconcile', NULL, 42 FROM unnest($1::text[], $3::text[]) AS t(i, s) \
             ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version, state = excluded.state, \
             state_digest = excluded.state_digest, deleted = excluded.deleted, origin = excluded.origin, \
             last_event_id = excluded.last_event_id, updated_at = now() WHERE resources.version < excluded.version",
        )
        .bind::<diesel::sql_types::Array<Text>, _>(&id)
        .bind::<BigInt, _>(version)
        .bind::<diesel::sql_types::Array<Text>, _>(&state)
        .execute(c)?;
        diesel::sql_query(CHECKPOINT)
            .bind::<Text, _>(format!("page-{page}"))
            .execute(c)?;
        Ok(())
    })
    .unwrap();
    if feed {
        // The product's pass (`feed::sql::sequence_pending`: one statement in its own
        // transaction), after each commit that wrote `resources`.
        use webhook_reconciler::feed::baseline::{BATCH, PASS};
        diesel::sql_query(PASS)
            .bind::<diesel::sql_types::BigInt, _>(BATCH)
            .execute(c)
            .unwrap();
    }
}

/// PostgreSQL alone doing the least SQL that does a drift sweep's job over pages
/// `[0, n)` of 1,000, `clients` connections each taking every `clients`-th page: read
/// the versions and digests of the page's ids (what the compare needs: the product
/// reads no state since the digest column), as the primary key's range from the
/// page's first id to its last (the listing is in id order), then one transaction upserting the page's
/// drifted rows (every 100th) at `version`, publishing their changes and moving the
/// checkpoint; then, as the product does after a complete sweep of a kind with
/// `detect_deletes` (this benchmark's kind has it), the scan of the kind's live ids in
/// pages of 10,000 (one client: the product runs it once, after the sweep). Returns
/// items/s.
fn pg_alone(url: &str, n: u64, clients: u64, version: i64) -> f64 {
    #[derive(diesel::QueryableByName)]
    #[expect(dead_code, reason = "read by diesel, never by us")]
    struct Row {
        #[diesel(sql_type = Text)]
        id: String,
        #[diesel(sql_type = BigInt)]
        version: i64,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        deleted: bool,
        #[diesel(sql_type = diesel::sql_types::Nullable<BigInt>)]
        state_digest: Option<i64>,
    }
    let started = Instant::now();
    std::thread::scope(|s| {
        for client in 0..clients {
            s.spawn(move || {
                let mut c = PgConnection::establish(url).unwrap();
                for (page, first, last) in pages_of(n, clients, client) {
                    // The listing is in id order, so the page's rows are one range of
                    // the primary key (as the product reads such a page since
                    // 2026-12-05; a probe per id costs about six times as much).
                    let rows: Vec<Row> = diesel::sql_query(
                        "SELECT id, version, deleted, state_digest FROM resources \
                         WHERE source = 'bench' AND account = '' AND kind = 'item' AND id >= $1 AND id <= $2",
                    )
                    .bind::<Text, _>(Generated::id_of(first))
                    .bind::<Text, _>(Generated::id_of(last - 1))
                    .load(&mut c)
                    .unwrap();
                    assert!(rows.len() as u64 >= (last - first) * 99 / 100);
                    let drifted: Vec<u64> = (first..last).filter(|i| i % 100 == 0).collect();
                    guarded_page_write(&mut c, &drifted, version, page, true);
                }
            });
        }
    });
    let mut c = PgConnection::establish(url).unwrap();
    let mut after = String::new();
    let mut live = 0;
    loop {
        #[derive(diesel::QueryableByName)]
        struct Id {
            #[diesel(sql_type = Text)]
            id: String,
        }
        let ids: Vec<Id> = diesel::sql_query(
            "SELECT id FROM resources WHERE source = 'bench' AND account = '' AND kind = 'item' \
             AND NOT deleted AND updated_at < now() AND id > $1 ORDER BY id LIMIT 10000",
        )
        .bind::<Text, _>(&after)
        .load(&mut c)
        .unwrap();
        let Some(last) = ids.last() else { break };
        after.clone_from(&last.id);
        live += ids.len() as u64;
    }
    assert!(live >= n * 99 / 100, "{live} live rows scanned");
    n as f64 / started.elapsed().as_secs_f64()
}

/// PostgreSQL alone doing a first sync's job into the empty table: each page of 1,000
/// (every row missing: the read finds none) written in one transaction as
/// [`guarded_page_write`] does, feed included. Returns items/s.
fn pg_alone_load(url: &str, n: u64, clients: u64, feed: bool) -> f64 {
    let started = Instant::now();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // As the product does while its passes number changes: every numbered change
        // leaves a dead row in change_pending that the next pass's walk of the primary
        // key would pass over until a vacuum removes it.
        if feed {
            let done = &done;
            s.spawn(move || {
                let mut c = PgConnection::establish(url).unwrap();
                let mut last = Instant::now();
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    if last.elapsed() >= Duration::from_secs(10) {
                        c.batch_execute("VACUUM (SKIP_LOCKED) change_pending, change_seq")
                            .unwrap();
                        last = Instant::now();
                    }
                }
            });
        }
        let writers: Vec<_> = (0..clients)
            .map(|client| {
                s.spawn(move || {
                    let mut c = PgConnection::establish(url).unwrap();
                    for (page, first, last) in pages_of(n, clients, client) {
                        let ids: Vec<u64> = (first..last).collect();
                        guarded_page_write(&mut c, &ids, 1, page, feed);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    n as f64 / started.elapsed().as_secs_f64()
}

/// The pages of `[0, n)` that `client` of `clients` takes (every `clients`-th, from its
/// own number), each as (page, first index, end index).
fn pages_of(n: u64, clients: u64, client: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    (client..)
        .step_by(clients as usize)
        .take_while(move |page| page * PAGE_SIZE < n)
        .map(move |page| (page, page * PAGE_SIZE, ((page + 1) * PAGE_SIZE).min(n)))
}

/// Busy CPU seconds of the whole machine so far (all cores; /proc/stat, less idle and
/// iowait).
fn machine_cpu_seconds() -> f64 {
    machine_cpu().0
}

/// Busy CPU seconds of the whole machine so far, and the seconds its cores spent idle
/// waiting for I/O (one read of /proc/stat).
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = ticks.iter().take(8).sum();
    let iowait = ticks.get(4).copied().unwrap_or(0);
    let idle = ticks.get(3).copied().unwrap_or(0) + iowait;
    ((total - idle) as f64 / 100.0, iowait as f64 / 100.0)
}

/// CPU seconds (user + system) used so far by process `pid`.
fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .split_once(") ")
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (get(11) + get(12)) as f64 / 100.0
}

/// Where the machine's cores went during a run.
fn cpu_split(run: &Run) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let ours = run.cpu.unwrap_or(f64::NAN);
    format!(
        "CPU during it, of {cores:.0} cores x {:.2}s: reconcile {ours:.2}s, sender {:.2}s, the rest (PostgreSQL) {:.2}s, idle {:.2}s (waiting for I/O {:.2}s)",
        run.wall,
        run.sender_cpu,
        run.machine_cpu - ours - run.sender_cpu,
        cores * run.wall - run.machine_cpu,
        run.iowait,
    )
}

/// The one text column `t` of each row `sql` returns (PostgreSQL only; none on error).
fn text_rows(db: &mut Db, sql: &str) -> Vec<String> {
    #[derive(diesel::QueryableByName)]
    struct T {
        #[diesel(sql_type = Text)]
        t: String,
    }
    let Db::Pg(c) = db else { return Vec::new() };
    diesel::sql_query(sql)
        .load::<T>(c)
        .map(|rows| rows.into_iter().map(|r| r.t).collect())
        .unwrap_or_default()
}

/// Live and dead rows of the tables a sweep writes, as PostgreSQL's statistics have them.
fn print_dead_rows(db: &mut Db) {
    for t in text_rows(
        db,
        "SELECT format('%s: %s live, %s dead, %s, last autovacuum %s', relname, n_live_tup, n_dead_tup, \
         pg_size_pretty(pg_total_relation_size(relid)), coalesce(last_autovacuum::text, 'never')) AS t \
         FROM pg_stat_user_tables ORDER BY relname = 'change_seq' DESC, pg_total_relation_size(relid) DESC LIMIT 5",
    ) {
        println!("  before the drift run: {t}");
    }
}

/// The statements that took PostgreSQL's time since the reset (pg_stat_statements).
fn print_statements(db: &mut Db) {
    let rows = text_rows(
        db,
        "SELECT format('%8s ms %7s calls %8s ms/call %10s rows  %s', round(total_exec_time), calls, \
         round((total_exec_time / calls)::numeric, 3), rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 110)) AS t \
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         ORDER BY total_exec_time DESC LIMIT 14",
    );
    if rows.is_empty() {
        println!("  --statements: no pg_stat_statements (preload it: shared_preload_libraries)");
    }
    for t in rows {
        println!("  {t}");
    }
}

/// Where a run's time went, stage by stage (busy seconds; the stages overlap).
fn stage_split(run: &Run) -> String {
    let s = |k: &str| run.stages[k].as_f64().unwrap_or(f64::NAN);
    format!(
        "stages over {:.2}s (busy seconds, the three stages overlap): fetcher: sender {:.2}s + parse {:.2}s; reader: items {:.2}s + local rows {:.2}s ({} reads as a key range); writer: compare {:.2}s + write and commit {:.2}s + waiting for reads {:.2}s",
        run.seconds,
        s("fetch"),
        s("parse_page"),
        s("read_items"),
        s("local_read"),
        run.stages["local_read_ranges"].as_u64().unwrap_or(0),
        s("compare"),
        s("write"),
        s("writer_waiting"),
    )
}

/// Runs the plain Node reconciler (`benches/node/reconcile.mjs`) against the sender;
/// installs its one package (`pg`, pinned by its lockfile) first. Returns its items/s
/// and the rows it applied, or `None` without Node.
fn node_sweep(base: &str, url: &str) -> Option<(f64, u64)> {
    let dir = node_install::node_dir()?;
    let out = Command::new("node")
        .arg(dir.join("reconcile.mjs"))
        .args([base, url])
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((
        r["scanned"].as_f64()? / r["seconds"].as_f64()?,
        r["applied"].as_u64()?,
    ))
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if let Some(w) = argv.windows(2).find(|w| w[0] == "--serve-sender") {
        serve_sender(w[1].parse().unwrap());
        return;
    }
    let mut backends = vec![Backend::Postgres, Backend::Sqlite];
    let mut sizes = vec![100_000u64, 1_000_000];
    let statements = argv.iter().any(|a| a == "--statements");
    for w in argv.windows(2) {
        match w[0].as_str() {
            "--backend" => {
                backends = match w[1].as_str() {
                    "postgres" => vec![Backend::Postgres],
                    "sqlite" => vec![Backend::Sqlite],
                    _ => backends,
                }
            }
            "--sizes" => {
                sizes = w[1]
                    .split(',')
                    .map(|s| s.parse().expect("--sizes N,N"))
                    .collect()
            }
            _ => {}
        }
    }
    let bin = binary();
    assert!(
        bin.exists(),
        "{} not built; run `cargo build --release` first",
        bin.display()
    );
    println!(
        "reconcile sweep: items of ~{} bytes served by a separate process, page size {PAGE_SIZE}, 1% drift (0.5% missing here, 0.5% newer at the sender)",
        Generated::item(42, 1).to_string().len()
    );
    let mut ok = true;
    for backend in &backends {
        for &n in &sizes {
            let mut sender = SenderProcess::start(n);
            let dir = tempfile::tempdir().unwrap();
            let (url, pg_name) = match backend {
                Backend::Postgres => {
                    let name = format!("wr_bench_sweep_{:08x}", rand::random::<u32>());
                    let mut admin =
                        PgConnection::establish(&format!("{}/test", pg_server())).unwrap();
                    admin
                        .batch_execute(&format!("CREATE DATABASE {name}"))
                        .unwrap();
                    (format!("{}/{name}", pg_server()), Some(name))
                }
                Backend::Sqlite => (
                    format!("sqlite://{}", dir.path().join("bench.db").display()),
                    None,
                ),
            };
            let cfg = dir.path().join("config.toml");
            std::fs::write(&cfg, config(&url, &sender.base)).unwrap();
            let st = Command::new(&bin)
                .arg("--config")
                .arg(&cfg)
                .arg("migrate")
                .output()
                .unwrap();
            assert!(
                st.status.success(),
                "{}",
                String::from_utf8_lossy(&st.stderr)
            );
            let load = reconcile(&cfg, dir.path(), sender.child.id());
            let load_ok = load.ok && load.applied == n;
            // The drift: the sender moves on, the local table loses rows.
            sender.drift();
            let mut db = Db::open(*backend, &url);
            db.execute(&format!(
                "DELETE FROM resources WHERE source = 'bench' AND kind = 'item' AND {INDEX} % 200 = 0"
            ));
            db.execute(match backend {
                Backend::Postgres => "VACUUM ANALYZE resources",
                Backend::Sqlite => "ANALYZE",
            });
            db.checkpoint();
            if statements && pg_name.is_some() {
                print_dead_rows(&mut db);
                db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()");
            }
            let run = reconcile(&cfg, dir.path(), sender.child.id());
            if statements && pg_name.is_some() {
                print_statements(&mut db);
            }
            let expected = n / 100;
            let wrong = wrong_rows(&mut db, n);
            let right =
                load_ok && run.ok && run.scanned == n && run.applied == expected && wrong == 0;
            ok &= right;
            let ours = run.scanned as f64 / run.seconds;
            println!(
                "{:<9} {:>9} items: initial load {:>7.0} items/s (peak RSS {}); 1% drift {:>7.0} items/s ({:.2}s, peak RSS {}), applied {} of {expected}, rows not as the sender lists: {wrong}{}",
                format!("{backend:?}"),
                n,
                load.scanned as f64 / load.seconds,
                mib(load.peak_kib),
                ours,
                run.seconds,
                mib(run.peak_kib),
                run.applied,
                if right { "" } else { "  WRONG" },
            );
            println!(
                "{:<9} {:>9} items: initial load's {}",
                "",
                n,
                stage_split(&load)
            );
            println!(
                "{:<9} {:>9} items: initial load's {}",
                "",
                n,
                cpu_split(&load)
            );
            println!(
                "{:<9} {:>9} items: drift run's {}",
                "",
                n,
                stage_split(&run)
            );
            println!("{:<9} {:>9} items: drift run's {}", "", n, cpu_split(&run));
            if let Some(name) = &pg_name {
                db.checkpoint();
                let one = pg_alone(&url, n, 1, 3);
                db.checkpoint();
                let busy = machine_cpu_seconds();
                let started = Instant::now();
                let two = pg_alone(&url, n, 2, 4);
                let busy = (machine_cpu_seconds() - busy) / started.elapsed().as_secs_f64();
                println!(
                    "{:<9} {:>9} items: PostgreSQL alone, the least SQL of a drift sweep (versions and digests of each page's ids; the drifted rows' guarded upsert, feed publish and checkpoint; then the deletion scan of the live ids): {one:>7.0} items/s (1 client), {two:>7.0} items/s (2 clients); ours = {:.0}% of 1 client, {:.0}% of 2 clients (2 clients kept {busy:.2} cores busy)",
                    "",
                    n,
                    100.0 * ours / one,
                    100.0 * ours / two
                );
                // The plain Node reconciler over the same drift: the rows the baselines
                // rewrote are put back where the measured run found them.
                db.execute(&format!(
                    "DELETE FROM resources WHERE source = 'bench' AND kind = 'item' AND {INDEX} % 200 = 0; \
                     UPDATE resources SET version = 1 WHERE source = 'bench' AND kind = 'item' AND {INDEX} % 200 = 100"
                ));
                db.execute("VACUUM ANALYZE resources");
                db.checkpoint();
                match node_sweep(&sender.base, &url) {
                    Some((node, applied)) => {
                        let node_wrong = wrong_rows(&mut db, n);
                        let node_right = applied == expected && node_wrong == 0;
                        println!(
                            "{:<9} {:>9} items: a plain Node reconciler (benches/node/reconcile.mjs: page by page, versions read, batch upsert of the drift, then the deletion scan): {node:>7.0} items/s, applied {applied} of {expected}, rows not as the sender lists: {node_wrong}{}; ours = {:.2}x Node",
                            "",
                            n,
                            if node_right { "" } else { "  WRONG" },
                            ours / node
                        );
                    }
                    None => println!(
                        "{:<9} {:>9} items: the Node reconciler: skipped (no node and npm here, or `npm ci` in benches/node failed)",
                        "", n
                    ),
                }
                // The first sync's baseline, into the empty table again.
                db.execute("TRUNCATE resources, changes, change_pending, reconcile_checkpoints");
                db.checkpoint();
                let load_one = pg_alone_load(&url, n, 1, true);
                db.execute("TRUNCATE resources, changes, change_pending, reconcile_checkpoints");
                db.checkpoint();
                let load_two = pg_alone_load(&url, n, 2, true);
                let loaded = load.scanned as f64 / load.seconds;
                println!(
                    "{:<9} {:>9} items: PostgreSQL alone, a first sync's pages (1,000 missing rows a transaction: guarded upsert, feed publish, checkpoint): {load_one:>7.0} items/s (1 client), {load_two:>7.0} items/s (2 clients); our initial load = {:.0}% of 1 client, {:.0}% of 2 clients",
                    "",
                    n,
                    100.0 * loaded / load_one,
                    100.0 * loaded / load_two
                );
                // The change feed's own cost on a first sync, same build, same run: the
                // trigger on `resources` disabled (the publish step then finds nothing
                // to number and takes no lock), ours and PostgreSQL alone (which then
                // skips its publish statements too).
                let fresh = |db: &mut Db| {
                    db.execute("TRUNCATE resources, changes, change_pending, reconcile_checkpoints, reconcile_runs, reconcile_state");
                    db.checkpoint();
                };
                fresh(&mut db);
                db.execute("ALTER TABLE resources DISABLE TRIGGER resources_record_change");
                let bare = reconcile(&cfg, dir.path(), sender.child.id());
                fresh(&mut db);
                let bare_alone = pg_alone_load(&url, n, 1, false);
                db.execute("ALTER TABLE resources ENABLE TRIGGER resources_record_change");
                let bare_rate = bare.scanned as f64 / bare.seconds;
                println!(
                    "{:<9} {:>9} items: the change feed's cost on a first sync: ours {loaded:>7.0} items/s with it, {bare_rate:>7.0} without (the feed takes {:.0}% of the load's time){}; PostgreSQL alone (1 client) {load_one:>7.0} with, {bare_alone:>7.0} without ({:.0}%)",
                    "",
                    n,
                    100.0 * (1.0 - loaded / bare_rate),
                    if bare.ok && bare.applied == n {
                        ""
                    } else {
                        "  WRONG"
                    },
                    100.0 * (1.0 - load_one / bare_alone),
                );
                drop(db);
                if let Ok(mut admin) = PgConnection::establish(&format!("{}/test", pg_server())) {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
        }
    }
    if !ok {
        eprintln!(
            "reconcile benchmark: a run did not apply exactly the drift, or the table is not as the sender lists"
        );
        std::process::exit(1);
    }
}

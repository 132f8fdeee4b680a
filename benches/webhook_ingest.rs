//! Webhook ingest benchmark: the real HTTP server, signed deliveries at a fixed
//! concurrency, half of them duplicates; then a check in the database that every effect
//! landed exactly once (one claim per event, every row written by its own event); the
//! group sizes the receiver's group commit saw (from its /metrics) and, on PostgreSQL,
//! the CPU per delivery of PostgreSQL's processes and of the receiver (from /proc; the
//! load generator runs on threads of its own, counted apart, as the Node receiver's
//! figure counts its process only) and how often the receiver's threads were switched
//! out a delivery (its jemalloc is the daemon's); then `pgbench` running
//! the product's claim and guarded upsert (`store::baseline::claim_sql`, `upsert_sql`: per-row
//! VALUES lists with literals, planned every time, where the product binds arrays to
//! statements prepared once) with the same concurrency and mix, twice: one
//! delivery per transaction, and the same batches as the receiver's mean group, so each
//! ratio says how much of the database's capacity the receiver delivers. On PostgreSQL,
//! when `node` and `npm` are here, the same load also goes to a plain Node receiver
//! (`benches/node/receiver.mjs`: HMAC, JSON.parse, one transaction a delivery) on a
//! fresh database, checked exactly-once the same way, with its CPU per delivery.
//!
//!   cargo bench --bench webhook_ingest                      # both backends
//!   cargo bench --bench webhook_ingest -- --backend postgres --events 20000
//!
//! Options: --backend postgres|sqlite|both, --events N (each delivered twice),
//! --feed both (PostgreSQL: the same load again with the change feed's trigger disabled,
//! what the feed costs on ingest),
//! --orders K (the events are K orders' versions, reordered by the shuffle; default 0:
//! every event a fresh refund),
//! --concurrency C (default 32), --pool P (PostgreSQL connections, default 32),
//! --pgbench-seconds S (default 15), --synchronous full|normal|both (SQLite's durability,
//! default full as in the product; `both` measures what FULL costs). PostgreSQL server: $WR_TEST_PG
//! (default postgres://postgres@127.0.0.1:5432).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness, not the daemon"
)]

#[path = "node/install.rs"]
mod node_install;

use std::process::Command;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl, SqliteConnection, sql_query};
use rand::seq::SliceRandom;
use webhook_reconciler::app::Application;
use webhook_reconciler::change::tie::Guard;
use webhook_reconciler::config::{Backend, Config};
use webhook_reconciler::signature as sign;
use webhook_reconciler::store::baseline::{claim_sql, upsert_sql};

const SECRET: &str = "bench-secret";

// The product's allocator (src/main.rs): the receiver measured here is the daemon's,
// allocations included.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Args {
    backends: Vec<Backend>,
    events: usize,
    concurrency: usize,
    pool: u32,
    pgbench_seconds: u32,
    synchronous: Vec<&'static str>,
    /// 0: every event is a fresh refund; N: the events are versions of N orders.
    orders: usize,
    /// PostgreSQL: also run the same load with the change feed's trigger disabled, to
    /// measure what the feed costs on ingest (same build, same invocation).
    feed_both: bool,
}

fn args() -> Args {
    let mut a = Args {
        backends: vec![Backend::Postgres, Backend::Sqlite],
        events: 50_000,
        concurrency: 32,
        pool: 32,
        pgbench_seconds: 15,
        synchronous: vec!["full"],
        orders: 0,
        feed_both: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let val = || argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--backend" => {
                a.backends = match val().as_str() {
                    "postgres" => vec![Backend::Postgres],
                    "sqlite" => vec![Backend::Sqlite],
                    _ => vec![Backend::Postgres, Backend::Sqlite],
                };
                i += 1;
            }
            "--events" => {
                a.events = val().parse().expect("--events N");
                i += 1;
            }
            "--concurrency" => {
                a.concurrency = val().parse().expect("--concurrency C");
                i += 1;
            }
            "--pool" => {
                a.pool = val().parse().expect("--pool P");
                i += 1;
            }
            "--synchronous" => {
                a.synchronous = match val().as_str() {
                    "normal" => vec!["normal"],
                    "both" => vec!["full", "normal"],
                    _ => vec!["full"],
                };
                i += 1;
            }
            "--orders" => {
                a.orders = val().parse().expect("--orders N");
                i += 1;
            }
            "--feed" => {
                a.feed_both = val() == "both";
                i += 1;
            }
            "--pgbench-seconds" => {
                a.pgbench_seconds = val().parse().expect("--pgbench-seconds S");
                i += 1;
            }
            // cargo bench passes --bench; ignore what we do not know.
            _ => {}
        }
        i += 1;
    }
    a
}

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn fresh_pg_db(tag: &str) -> (String, String) {
    let name = format!("wr_bench_{tag}_{:08x}", rand::random::<u32>());
    let mut admin = PgConnection::establish(&format!("{}/test", pg_server()))
        .expect("PostgreSQL unreachable; run scripts/ensure-postgres.sh");
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    (format!("{}/{name}", pg_server()), name)
}

fn drop_pg_db(name: &str) {
    if let Ok(mut admin) = PgConnection::establish(&format!("{}/test", pg_server())) {
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn count(backend: Backend, url: &str, sql: &str) -> i64 {
    let rows: Vec<N> = match backend {
        Backend::Postgres => sql_query(sql)
            .load(&mut PgConnection::establish(url).unwrap())
            .unwrap(),
        Backend::Sqlite => {
            let mut c = SqliteConnection::establish(url.trim_start_matches("sqlite://")).unwrap();
            c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
            sql_query(sql).load(&mut c).unwrap()
        }
    };
    rows[0].n
}

fn config(url: &str, pool: u32, synchronous: &str) -> Config {
    Config::from_toml_str(&format!(
        r#"
[database]
url = "{url}"
synchronous = "{synchronous}"
max_connections = {pool}
acquire_timeout = "30s"
[http]
listen = "127.0.0.1:0"
[log]
level = "warn"
[sources.shop.webhook]
secrets = ["{SECRET}"]
[sources.shop.kinds.refund.events."refund.succeeded"]
id = "/data/refund_id"
[sources.shop.kinds.order.events."order.updated"]
id = "/data/order_id"
version = "/data/version"
"#
    ))
    .unwrap()
}

/// Event `i`: a fresh refund, or (with `orders` > 0) version `i / orders + 1` of order
/// `i % orders`, so the shuffled deliveries reorder each order's versions.
fn event_body(i: usize, orders: usize) -> String {
    if orders > 0 {
        let (order, version) = (i % orders, i / orders + 1);
        return serde_json::json!({
            "id": format!("evt_ord_{order:06}_v{version}"),
            "type": "order.updated",
            "data": {"order_id": format!("ord_{order:06}"), "version": version, "status": format!("s{version}"), "amount": 4200},
        })
        .to_string();
    }
    serde_json::json!({
        "id": format!("evt_{i:08}"),
        "type": "refund.succeeded",
        "created_at": "2026-07-29T10:00:00Z",
        "data": {"refund_id": format!("re_{i:08}"), "order_id": "ord_42", "amount": 4200, "currency": "EUR"},
    })
    .to_string()
}

struct Run {
    deliveries: usize,
    seconds: f64,
    p50_ms: f64,
    p99_ms: f64,
    applied: usize,
    duplicate: usize,
    /// An older version that arrived after a newer one (the orders mix).
    stale: usize,
    other: usize,
}

async fn drive(
    addr: std::net::SocketAddr,
    events: usize,
    orders: usize,
    concurrency: usize,
) -> Run {
    let mut bodies: Vec<Arc<String>> = (0..events)
        .map(|i| Arc::new(event_body(i, orders)))
        .collect();
    // Every event twice, shuffled: duplicates arrive both far apart and concurrently.
    bodies.extend(bodies.clone());
    bodies.shuffle(&mut rand::rng());
    let queue = Arc::new(std::sync::Mutex::new(bodies));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    let url = format!("http://{addr}/webhooks/shop");
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (queue, client, url) = (queue.clone(), client.clone(), url.clone());
            load_runtime().spawn(async move {
                let mut lat = Vec::new();
                let (mut applied, mut duplicate, mut stale, mut other) = (0, 0, 0, 0);
                loop {
                    let Some(body) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let ts = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap()
                        .as_secs() as i64;
                    let sig = sign::hmac_sha256(SECRET.as_bytes(), ts, body.as_bytes());
                    let t = Instant::now();
                    let r = client
                        .post(&url)
                        .header("X-Signature", sig)
                        .header("X-Signature-Timestamp", ts.to_string())
                        .body(body.as_str().to_owned())
                        .send()
                        .await
                        .unwrap();
                    let status = r.status();
                    let text = r.text().await.unwrap();
                    lat.push(t.elapsed());
                    match (status.as_u16(), text.as_str()) {
                        (200, r#"{"outcome":"applied"}"#) => applied += 1,
                        (200, r#"{"outcome":"duplicate"}"#) => duplicate += 1,
                        (200, r#"{"outcome":"stale"}"#) => stale += 1,
                        _ => {
                            other += 1;
                            eprintln!("unexpected answer {status}: {text}");
                        }
                    }
                }
                (lat, applied, duplicate, stale, other)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let (mut applied, mut duplicate, mut stale, mut other) = (0, 0, 0, 0);
    for w in workers {
        let (l, a, d, s, o) = w.await.unwrap();
        lat.extend(l);
        applied += a;
        duplicate += d;
        stale += s;
        other += o;
    }
    let seconds = started.elapsed().as_secs_f64();
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1000.0;
    Run {
        deliveries: lat.len(),
        seconds,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        applied,
        duplicate,
        stale,
        other,
    }
}

/// `sql` with `$1..$n` replaced by `values` (highest first, so `$1` never eats `$12`).
fn substitute(sql: &str, values: &[String]) -> String {
    let mut out = sql.to_string();
    for (i, v) in values.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), v);
    }
    out
}

const STATE: &str =
    r#"'{"amount": 4200, "currency": "EUR", "order_id": "ord_42", "refund_id": "x"}'"#;

/// The claim and guarded upsert of `group` deliveries in one transaction, taken from the
/// product's own SQL (`store::baseline`): half of them new events (claimed and written), half
/// duplicates (a claim that finds the id taken), like the HTTP run's mix. `group = 1`
/// alternates between a new and a duplicate delivery instead.
fn pgbench_scripts(dir: &std::path::Path, group: usize) -> Vec<(std::path::PathBuf, u32)> {
    let claim_row = |event_id: String| {
        vec![
            "'shop'".to_string(),
            event_id.clone(),
            "'refund.succeeded'".to_string(),
            "'applied'".to_string(),
            "NULL".to_string(),
            "''".to_string(),
            "'refund'".to_string(),
            format!("'re_' || {event_id}"),
        ]
    };
    let upsert_row = |k: usize| {
        vec![
            "'shop'".to_string(),
            "''".to_string(),
            "'refund'".to_string(),
            format!("('re_' || :client_id || '_' || :n || '_{k}')"),
            "0".to_string(),
            STATE.to_string(),
            "false".to_string(),
            "'webhook'".to_string(),
            format!("('evt_' || :client_id || '_' || :n || '_{k}')"),
            "42".to_string(),
        ]
    };
    let new_event = |k: usize| format!("('evt_' || :client_id || '_' || :n || '_{k}')");
    let script = |claims: Vec<String>, upserts: usize| {
        let claim = substitute(&claim_sql(claims.len() / 8), &claims);
        let mut body =
            format!("\\set n random(1, 2000000000)\n\\set d random(1, 1000)\nBEGIN;\n{claim};\n");
        if upserts > 0 {
            let values: Vec<String> = (0..upserts).flat_map(upsert_row).collect();
            let upsert = upsert_sql(Backend::Postgres, upserts, Guard::NewerOnly, true);
            body.push_str(&substitute(&upsert, &values));
            body.push_str(";\n");
        }
        body.push_str("COMMIT;\n");
        body
    };
    let mut files = Vec::new();
    if group <= 1 {
        let applied = dir.join("applied.sql");
        std::fs::write(&applied, script(claim_row(new_event(0)), 1)).unwrap();
        let dup = dir.join("duplicate.sql");
        std::fs::write(&dup, script(claim_row("('dup_' || :d)".into()), 0)).unwrap();
        files.push((applied, 1));
        files.push((dup, 1));
    } else {
        let new = group.div_ceil(2);
        let mut claims: Vec<String> = (0..new).flat_map(|k| claim_row(new_event(k))).collect();
        claims.extend(
            (0..group - new)
                .flat_map(|k| claim_row(format!("('dup_' || ((:d + {k}) % 1000 + 1))"))),
        );
        let batch = dir.join("batch.sql");
        std::fs::write(&batch, script(claims, new)).unwrap();
        files.push((batch, 1));
    }
    files
}

/// pgbench transactions per second running `group` deliveries per transaction.
fn pgbench(url: &str, concurrency: usize, seconds: u32, group: usize) -> Option<f64> {
    let dir = tempfile::tempdir().unwrap();
    let scripts = pgbench_scripts(dir.path(), group);
    let mut c = PgConnection::establish(url).unwrap();
    c.batch_execute(
        "INSERT INTO processed_events (source, event_id, event_type, outcome) \
         SELECT 'shop', 'dup_' || g, 'refund.succeeded', 'applied' FROM generate_series(1, 1000) g \
         ON CONFLICT DO NOTHING",
    )
    .unwrap();
    let out = Command::new("pgbench")
        .args([
            "-n",
            "-M",
            "extended",
            "-c",
            &concurrency.to_string(),
            "-j",
            "2",
        ])
        .args(["-T", &seconds.to_string()])
        .args(
            scripts
                .iter()
                .flat_map(|(f, w)| ["-f".to_string(), format!("{}@{w}", f.display())]),
        )
        .arg(url)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            println!("  pgbench not available ({e}); no comparison");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        println!("  pgbench failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    text.lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// At most once as well as at least once, in the database: one claim per event, and
/// every row written by its own event (orders: every row at its last version, written
/// by that version's event). Returns whether all holds, and the rows, claims and rows
/// not written by their own event.
fn exactly_once(backend: Backend, url: &str, run: &Run, a: &Args) -> (bool, i64, i64, i64) {
    let rows = count(backend, url, "SELECT COUNT(*) AS n FROM resources");
    let claims = count(backend, url, "SELECT COUNT(*) AS n FROM processed_events");
    let (expected_rows, own_event) = if let Some(last) = a.events.checked_div(a.orders) {
        (
            a.orders,
            format!(
                "version = {last} AND last_event_id = 'evt_' || id || '_v' || CAST(version AS TEXT)"
            ),
        )
    } else {
        (
            a.events,
            "last_event_id = 'evt_' || substr(id, 4)".to_string(),
        )
    };
    let foreign = count(
        backend,
        url,
        &format!(
            "SELECT COUNT(*) AS n FROM resources WHERE last_event_id IS NULL OR NOT ({own_event})"
        ),
    );
    let ok = run.applied + run.stale == a.events
        && run.duplicate == a.events
        && run.other == 0
        && rows == expected_rows as i64
        && claims == a.events as i64
        && foreign == 0;
    (ok, rows, claims, foreign)
}

/// The same load against the plain Node receiver (`benches/node/receiver.mjs`) on a
/// fresh database migrated by the product: its run and whether it was exactly once,
/// and the CPU seconds of PostgreSQL, of the Node process and of this process (the load
/// generator) during it. `None` without Node.
fn node_run(rt: &tokio::runtime::Runtime, a: &Args) -> Option<NodeRun> {
    use std::io::BufRead;
    let dir = node_install::node_dir()?;
    let (url, name) = fresh_pg_db("node");
    rt.block_on(async {
        drop(Application::build(config(&url, 1, "full")).await.unwrap());
    });
    let mut child = Command::new("node")
        .arg(dir.join("receiver.mjs"))
        .args([url.as_str(), SECRET, &a.pool.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    let port = serde_json::from_str::<serde_json::Value>(&line).ok()?["port"].as_u64()?;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().ok()?;
    let node_cpu = || {
        std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .ok()
            .and_then(|s| s.split_once(") ").map(|(_, r)| cpu_ticks(r) as f64 / 100.0))
            .unwrap_or(0.0)
    };
    let before = (postgres_cpu_seconds(), node_cpu(), own_cpu_seconds().1);
    let run = rt.block_on(drive(addr, a.events, a.orders, a.concurrency));
    let after = (postgres_cpu_seconds(), node_cpu(), own_cpu_seconds().1);
    let _ = child.kill();
    let _ = child.wait();
    let (ok, ..) = exactly_once(Backend::Postgres, &url, &run, a);
    drop_pg_db(&name);
    Some(NodeRun {
        run,
        exactly_once: ok,
        cpu: (after.0 - before.0, after.1 - before.1, after.2 - before.2),
    })
}

/// The Node receiver's run: the load's figures, whether the database shows it exactly
/// once, and the CPU seconds of PostgreSQL, Node and the load generator during it.
struct NodeRun {
    run: Run,
    exactly_once: bool,
    cpu: (f64, f64, f64),
}

/// CPU seconds (user + system) used so far by every running `postgres` process.
fn postgres_cpu_seconds() -> f64 {
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((comm, rest)) = stat.split_once(") ") {
            if comm.ends_with("(postgres") {
                ticks += cpu_ticks(rest);
            }
        }
    }
    ticks as f64 / 100.0
}

/// The load generator's own runtime: its threads are named, so that this process's CPU
/// splits into the receiver's and the load generator's (`own_cpu_seconds`).
fn load_runtime() -> &'static tokio::runtime::Runtime {
    static LOAD: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    LOAD.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(LOAD_THREAD)
            .enable_all()
            .build()
            .unwrap()
    })
}

const LOAD_THREAD: &str = "bench-load";

/// This process's threads, from /proc/self/task: each one's directory and whether it
/// is the load generator's (every other thread is the receiver's).
fn own_threads() -> impl Iterator<Item = (std::path::PathBuf, bool)> {
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let dir = entry.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            let load = comm.trim_end().ends_with(LOAD_THREAD);
            Some((dir, load))
        })
}

/// CPU seconds used so far by this process's threads: (the receiver's; the load
/// generator's).
fn own_cpu_seconds() -> (f64, f64) {
    let (mut receiver, mut load) = (0u64, 0u64);
    for (dir, is_load) in own_threads() {
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        if let Some((_, rest)) = stat.split_once(") ") {
            *if is_load { &mut load } else { &mut receiver } += cpu_ticks(rest);
        }
    }
    (receiver as f64 / 100.0, load as f64 / 100.0)
}

/// Context switches (voluntary + involuntary) so far of the receiver's threads: how
/// often they went to sleep and were woken (`perf` put about a quarter of the
/// receiver's CPU there).
fn own_switches() -> u64 {
    own_threads()
        .filter(|(_, is_load)| !is_load)
        .filter_map(|(dir, _)| std::fs::read_to_string(dir.join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// utime + stime from the fields after `comm` in /proc/PID/stat (fields 14 and 15,
/// in clock ticks of 1/100 s).
fn cpu_ticks(after_comm: &str) -> u64 {
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(11) + get(12)
}

/// (transactions, deliveries) of the receiver's group commits, from its own /metrics.
async fn group_sizes(addr: std::net::SocketAddr) -> (f64, f64) {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("webhook_group_commit_size_count"),
        value("webhook_group_commit_size_sum"),
    )
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "webhook ingest: {} events, each delivered twice ({} deliveries), concurrency {}",
        a.events,
        a.events * 2,
        a.concurrency
    );
    let mut ok = true;
    let runs: Vec<(Backend, &str)> = a
        .backends
        .iter()
        .flat_map(|b| match b {
            Backend::Postgres => vec![(*b, "full")],
            Backend::Sqlite => a.synchronous.iter().map(|s| (*b, *s)).collect(),
        })
        .collect();
    for (backend, synchronous) in runs {
        let (url, pg_name, _dir) = match backend {
            Backend::Postgres => {
                let (url, name) = fresh_pg_db("http");
                (url, Some(name), None)
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("bench.db").display());
                (url, None, Some(dir))
            }
        };
        let http_run = |url: &str, without_feed: bool| {
            rt.block_on(async {
                let app = Application::build(config(url, a.pool, synchronous))
                    .await
                    .unwrap();
                if without_feed {
                    // Migrated by the build; no delivery has come in yet.
                    PgConnection::establish(url)
                        .unwrap()
                        .batch_execute(
                            "ALTER TABLE resources DISABLE TRIGGER resources_record_change",
                        )
                        .unwrap();
                }
                let addr = app.local_addr();
                let server = tokio::spawn(app.run_until(std::future::pending()));
                let before = (postgres_cpu_seconds(), own_cpu_seconds(), own_switches());
                let run = drive(addr, a.events, a.orders, a.concurrency).await;
                let after = (postgres_cpu_seconds(), own_cpu_seconds(), own_switches());
                let groups = group_sizes(addr).await;
                server.abort();
                let cpu = (
                    after.0 - before.0,
                    after.1.0 - before.1.0,
                    after.1.1 - before.1.1,
                    after.2 - before.2,
                );
                (run, cpu, groups)
            })
        };
        let (run, cpu, groups) = http_run(&url, false);
        let (exactly_once, rows, claims, foreign) = exactly_once(backend, &url, &run, &a);
        ok &= exactly_once;
        let rate = run.deliveries as f64 / run.seconds;
        println!(
            "{:<9} {:>8.0} deliveries/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({} deliveries in {:.2}s)",
            match backend {
                Backend::Postgres => "Postgres".to_string(),
                Backend::Sqlite => format!("Sqlite({synchronous})"),
            },
            rate,
            run.p50_ms,
            run.p99_ms,
            run.deliveries,
            run.seconds
        );
        println!(
            "          exactly-once: {} (answers: applied {}, stale {}, duplicate {}, other {}; in the database: rows {}, claims {}, rows not at their last version or not written by its event {})",
            if exactly_once { "yes" } else { "NO" },
            run.applied,
            run.stale,
            run.duplicate,
            run.other,
            rows,
            claims,
            foreign
        );
        println!(
            "          group commit: {} deliveries in {} transactions, mean {:.1} per transaction",
            groups.1 as u64,
            groups.0 as u64,
            groups.1 / groups.0.max(1.0)
        );
        if backend == Backend::Postgres {
            println!(
                "          CPU per delivery: PostgreSQL {:.3} ms (all its processes, from /proc); the receiver {:.3} ms (this process's threads but the load generator's); the load generator {:.3} ms (its own runtime's threads); PostgreSQL + receiver {:.3} ms, with the load generator {:.3} ms",
                1000.0 * cpu.0 / run.deliveries as f64,
                1000.0 * cpu.1 / run.deliveries as f64,
                1000.0 * cpu.2 / run.deliveries as f64,
                1000.0 * (cpu.0 + cpu.1) / run.deliveries as f64,
                1000.0 * (cpu.0 + cpu.1 + cpu.2) / run.deliveries as f64
            );
            println!(
                "          the receiver's threads were switched out {:.2} times a delivery (voluntary + involuntary, /proc/self/task/*/status)",
                cpu.3 as f64 / run.deliveries as f64
            );
            if let Some(NodeRun {
                run: node_load,
                exactly_once: node_once,
                cpu: node_cpu,
            }) = node_run(&rt, &a)
            {
                let node = (node_load, node_once);
                let node_rate = node.0.deliveries as f64 / node.0.seconds;
                println!(
                    "          a plain Node receiver (benches/node/receiver.mjs: HMAC, JSON.parse, one transaction a delivery on a pool of {}): {node_rate:.0} deliveries/s, p50 {:.2} ms, p99 {:.2} ms, exactly-once: {}; CPU per delivery: PostgreSQL {:.3} ms, Node {:.3} ms + the load generator {:.3} ms; ours = {:.2}x Node's deliveries/s, {:.2}x less CPU per delivery (PostgreSQL's and the receiver's), {:.2}x with the load generator's",
                    a.pool,
                    node.0.p50_ms,
                    node.0.p99_ms,
                    if node.1 { "yes" } else { "NO" },
                    1000.0 * node_cpu.0 / node.0.deliveries as f64,
                    1000.0 * node_cpu.1 / node.0.deliveries as f64,
                    1000.0 * node_cpu.2 / node.0.deliveries as f64,
                    rate / node_rate,
                    ((node_cpu.0 + node_cpu.1) / node.0.deliveries as f64)
                        / ((cpu.0 + cpu.1) / run.deliveries as f64),
                    ((node_cpu.0 + node_cpu.1 + node_cpu.2) / node.0.deliveries as f64)
                        / ((cpu.0 + cpu.1 + cpu.2) / run.deliveries as f64),
                );
            } else {
                println!(
                    "          a plain Node receiver: skipped (no node and npm here, or `npm ci` in benches/node failed)"
                );
            }
            if a.feed_both {
                let (bare_url, bare_name) = fresh_pg_db("nofeed");
                let (bare, bare_cpu, _) = http_run(&bare_url, true);
                let changes = count(backend, &bare_url, "SELECT COUNT(*) AS n FROM changes");
                let bare_rate = bare.deliveries as f64 / bare.seconds;
                println!(
                    "          the change feed's cost on ingest (the same load, its trigger disabled: {changes} changes written): {bare_rate:.0} deliveries/s without it against {rate:.0} with it; CPU per delivery without it: PostgreSQL {:.3} ms, the receiver {:.3} ms",
                    1000.0 * bare_cpu.0 / bare.deliveries as f64,
                    1000.0 * bare_cpu.1 / bare.deliveries as f64
                );
                drop_pg_db(&bare_name);
            }
        }
        if let (Some(name), true) = (&pg_name, a.orders > 0) {
            // The pgbench scripts write fresh refunds; there is none for the orders mix.
            println!("          (pgbench comparison: run without --orders)");
            drop_pg_db(name);
        } else if let Some(name) = pg_name {
            drop_pg_db(&name);
            let (pg_url, pg_name) = fresh_pg_db("pgbench");
            // The same schema, from the product's own migrations.
            rt.block_on(async {
                let app = Application::build(config(&pg_url, 1, "full"))
                    .await
                    .unwrap();
                drop(app);
            });
            if let Some(tps) = pgbench(&pg_url, a.concurrency, a.pgbench_seconds, 1) {
                println!(
                    "          pgbench, one delivery per transaction (the product's SQL, same mix), {} clients, {}s: {:.0} deliveries/s; receiver = {:.0}% of it",
                    a.concurrency,
                    a.pgbench_seconds,
                    tps,
                    100.0 * rate / tps
                );
            }
            let group = (groups.1 / groups.0.max(1.0)).round().max(1.0) as usize;
            if group > 1 {
                if let Some(tps) = pgbench(&pg_url, a.concurrency, a.pgbench_seconds, group) {
                    let deliveries = tps * group as f64;
                    println!(
                        "          pgbench, the same batches ({group} deliveries per transaction, the receiver's mean group): {deliveries:.0} deliveries/s; receiver = {:.0}% of it",
                        100.0 * rate / deliveries
                    );
                }
            }
            drop_pg_db(&pg_name);
        }
    }
    if !ok {
        eprintln!("exactly-once check FAILED");
        std::process::exit(1);
    }
}

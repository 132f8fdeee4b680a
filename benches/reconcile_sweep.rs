//! Reconcile benchmark: a listing of N items served by the simulated sender (computed,
//! not stored, so the sender costs no memory), a local table already holding them but
//! for 1% drift (0.5% missing, 0.5% older), and the real binary running
//! `reconcile --json` against it. Prints items/s and the reconcile process's peak RSS,
//! and checks that exactly the drifted items were applied.
//!
//!   cargo bench --bench reconcile_sweep                              # 100k and 1M, both backends
//!   cargo bench --bench reconcile_sweep -- --sizes 100000 --backend postgres
//!
//! PostgreSQL server: $WR_TEST_PG (default postgres://postgres@127.0.0.1:5432).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark harness, not the daemon

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, SqliteConnection};
use webhook_reconciler::config::Backend;
use webhook_reconciler::simulator::{Generated, SimSender, Style};

const PAGE_SIZE: u32 = 1000;

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// Sender's version of item i: 2 for the 0.5% drifted "newer at the sender", else 1.
fn sender_version(i: u64) -> i64 {
    if i % 200 == 100 { 2 } else { 1 }
}

fn binary() -> std::path::PathBuf {
    // Cargo builds the binary for benchmarks, with the same profile.
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_webhook-reconciler"))
}

/// The local table: every item at version 1 with the sender's state, except every
/// 200th (missing). Items `i % 200 == 100` are version 2 at the sender: 1% drift.
fn seed(backend: Backend, url: &str, n: u64) {
    match backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(url).unwrap();
            c.batch_execute(&format!(
                "INSERT INTO resources (source, kind, id, version, state, origin) \
                 SELECT 'bench', 'item', 'g' || lpad(i::text, 10, '0'), 1, \
                        jsonb_build_object('amount', i % 10000, 'id', 'g' || lpad(i::text, 10, '0'), 'status', 'active', 'version', 1), 'reconcile' \
                 FROM generate_series(0, {}) AS i WHERE i % 200 <> 0; ANALYZE resources;",
                n - 1
            ))
            .unwrap();
        }
        Backend::Sqlite => {
            let mut c = SqliteConnection::establish(url.trim_start_matches("sqlite://")).unwrap();
            c.batch_execute(&format!(
                "PRAGMA busy_timeout = 10000; \
                 WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < {}) \
                 INSERT INTO resources (source, kind, id, version, state, origin) \
                 SELECT 'bench', 'item', printf('g%010d', i), 1, \
                        json_object('amount', i % 10000, 'id', printf('g%010d', i), 'status', 'active', 'version', 1), 'reconcile' \
                 FROM s WHERE i % 200 <> 0; ANALYZE;",
                n - 1
            ))
            .unwrap();
        }
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
"#
    )
}

/// Peak resident set of a running process, in KiB (VmHWM only grows, so the last
/// reading before exit is the peak).
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let mut backends = vec![Backend::Postgres, Backend::Sqlite];
    let mut sizes = vec![100_000u64, 1_000_000];
    let argv: Vec<String> = std::env::args().collect();
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "reconcile sweep: 1% drift (0.5% missing, 0.5% newer at the sender), page size {PAGE_SIZE}"
    );
    let mut ok = true;
    for backend in &backends {
        for &n in &sizes {
            let sim = rt.block_on(SimSender::start()).unwrap();
            sim.add_generated_kind(
                "items",
                Style::Cursor,
                Generated {
                    count: n,
                    version_of: Arc::new(sender_version),
                },
            );
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
            std::fs::write(&cfg, config(&url, &sim.base_url())).unwrap();
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
            let t = Instant::now();
            seed(*backend, &url, n);
            let seeded = t.elapsed();

            let started = Instant::now();
            let mut child = Command::new(&bin)
                .arg("--config")
                .arg(&cfg)
                .args(["reconcile", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap();
            let pid = child.id();
            let mut peak = 0;
            // Sample while it runs; the process's own stdout is read at the end.
            let status = loop {
                if let Some(kib) = vm_hwm_kib(pid) {
                    peak = peak.max(kib);
                }
                if let Some(s) = child.try_wait().unwrap() {
                    break s;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let wall = started.elapsed();
            let mut out = String::new();
            std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
            let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
            let r = &report[0];
            let scanned = r["counts"]["scanned"].as_u64().unwrap_or(0);
            let applied = r["counts"]["applied"].as_u64().unwrap_or(0);
            let seconds = r["seconds"].as_f64().unwrap_or(f64::NAN);
            let expected = n / 100;
            let right = status.success() && scanned == n && applied == expected;
            ok &= right;
            println!(
                "{:<9} {:>8} items: {:>8.0} items/s  ({:.2}s in the run, {:.2}s wall)  peak RSS {:>6.1} MiB  applied {} (expected {}){}  [seeding took {:.1}s]",
                format!("{backend:?}"),
                n,
                scanned as f64 / seconds,
                seconds,
                wall.as_secs_f64(),
                peak as f64 / 1024.0,
                applied,
                expected,
                if right { "" } else { "  WRONG" },
                seeded.as_secs_f64()
            );
            if let Some(name) = pg_name {
                if let Ok(mut admin) = PgConnection::establish(&format!("{}/test", pg_server())) {
                    let _ = admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            }
        }
    }
    if !ok {
        eprintln!("reconcile benchmark: a run did not apply exactly the drift");
        std::process::exit(1);
    }
}

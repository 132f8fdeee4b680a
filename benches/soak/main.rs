//! Soak benchmark: the release binary's `serve` for a while under a steady signed load,
//! sampled from outside as an operator would see it, with nobody scraping `/metrics`.
//!
//! The load: random orders of the simulated sender move to their next version; each
//! change is delivered signed, ~10% twice, ~5% held back and delivered later
//! (reordered), ~2% never (left to the reconcile that runs every 5 s against the
//! simulator). Every 5 s the daemon's RSS, open descriptors, threads and (PostgreSQL)
//! database connections are sampled; at the end their slope per hour after the warm-up
//! (the first quarter) is printed, then the database is checked: every delivered event
//! claimed exactly once, every order at the sender's version.
//!
//!   cargo bench --bench soak                                  # 20 minutes, PostgreSQL
//!   cargo bench --bench soak -- --seconds 120 --backend sqlite   # 2-minute smoke
//!
//! Options: --seconds S (default 1200), --backend postgres|sqlite, --rate R deliveries/s
//! (default 300). Not yet: scheduled faults (database restarts, a failing sender, bad
//! deliveries). PostgreSQL server: $WR_TEST_PG (default postgres://postgres@127.0.0.1:5432).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark harness, not the daemon

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, RunQueryDsl, SqliteConnection};
use rand::{Rng, SeedableRng};
use serde_json::json;
use webhook_reconciler::simulator::{SimSender, Style};
use webhook_reconciler::webhook::verify::sign;

const SECRET: &str = "soak-secret";
const ORDERS: usize = 2000;
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn arg(name: &str) -> Option<String> {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One sample of the daemon, read from /proc.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    rss_mib: f64,
    fds: f64,
    threads: f64,
    connections: f64,
}

fn status_field(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn fds(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(f64::NAN, |d| d.count() as f64)
}

fn scalar_pg(url: &str, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = BigInt)]
        v: i64,
    }
    let mut c = PgConnection::establish(url).unwrap();
    diesel::sql_query(sql).get_result::<V>(&mut c).unwrap().v
}

fn scalar(url: &str, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = BigInt)]
        v: i64,
    }
    if url.starts_with("sqlite://") {
        let mut c = SqliteConnection::establish(url.trim_start_matches("sqlite://")).unwrap();
        c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
        diesel::sql_query(sql).get_result::<V>(&mut c).unwrap().v
    } else {
        scalar_pg(url, sql)
    }
}

/// Every stored order's version, by id.
fn stored_versions(url: &str) -> std::collections::HashMap<String, i64> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
        #[diesel(sql_type = BigInt)]
        version: i64,
    }
    let q = diesel::sql_query("SELECT id, version FROM resources WHERE kind = 'order'");
    let rows: Vec<Row> = if url.starts_with("sqlite://") {
        let mut c = SqliteConnection::establish(url.trim_start_matches("sqlite://")).unwrap();
        c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
        q.load(&mut c).unwrap()
    } else {
        q.load(&mut PgConnection::establish(url).unwrap()).unwrap()
    };
    rows.into_iter().map(|r| (r.id, r.version)).collect()
}

/// Least-squares slope of `y` over `at` (seconds), per hour.
fn slope_per_hour(samples: &[Sample], y: fn(&Sample) -> f64) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let mx = samples.iter().map(|s| s.at).sum::<f64>() / n;
    let my = samples.iter().map(y).sum::<f64>() / n;
    let cov: f64 = samples.iter().map(|s| (s.at - mx) * (y(s) - my)).sum();
    let var: f64 = samples.iter().map(|s| (s.at - mx).powi(2)).sum();
    3600.0 * cov / var
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let seconds: u64 = arg("--seconds").map_or(1200, |s| s.parse().expect("--seconds S"));
    let rate: f64 = arg("--rate").map_or(300.0, |s| s.parse().expect("--rate R"));
    let sqlite = arg("--backend").as_deref() == Some("sqlite");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sim = rt.block_on(SimSender::start()).unwrap();
    sim.add_kind("orders", Style::Cursor);
    let dir = tempfile::tempdir().unwrap();
    let (url, pg_name) = if sqlite {
        (
            format!("sqlite://{}", dir.path().join("soak.db").display()),
            None,
        )
    } else {
        let name = format!("wr_soak_{:08x}", rand::random::<u32>());
        let mut admin = PgConnection::establish(&format!("{}/test", pg_server())).unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        (format!("{}/{name}", pg_server()), Some(name))
    };
    let port = free_port();
    let cfg = dir.path().join("soak.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[database]
url = "{url}"
[http]
listen = "127.0.0.1:{port}"
[log]
level = "warn"
[sources.shop]
api_base = "{base}"
requests_per_second = 1000
[sources.shop.webhook]
secrets = ["{SECRET}"]
[sources.shop.reconcile]
every = "5s"
jitter = "0s"
page_size = 500
[sources.shop.kinds.order]
list = "/orders"
get = "/orders/{{id}}"
version = "/version"
[sources.shop.kinds.order.events."order.updated"]
id = "/data/id"
version = "/data/version"
state = "/data"
"#,
            base = sim.base_url()
        ),
    )
    .unwrap();
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_webhook-reconciler"));
    let daemon = Daemon(
        Command::new(&bin)
            .arg("--config")
            .arg(&cfg)
            .arg("serve")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = daemon.0.id();
    let client = reqwest::Client::new();
    let health = format!("http://127.0.0.1:{port}/healthz");
    rt.block_on(async {
        for _ in 0..200 {
            if client.get(&health).send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("serve did not start");
    });
    println!(
        "soak: {} on {}, {rate:.0} changes/s for {seconds}s, reconcile every 5s, nobody scraping /metrics",
        bin.display(),
        if sqlite { "SQLite" } else { "PostgreSQL" }
    );

    let versions = Arc::new(Mutex::new(vec![0i64; ORDERS]));
    let delivered: Arc<Mutex<HashSet<String>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let url_hook = format!("http://127.0.0.1:{port}/webhooks/shop");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut samples: Vec<Sample> = Vec::new();
    rt.block_on(async {
        let load = {
            let (versions, delivered, latencies, client, sim_url) = (
                versions.clone(),
                delivered.clone(),
                latencies.clone(),
                client.clone(),
                url_hook.clone(),
            );
            let sim = &sim;
            async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(7);
                let mut held: Vec<String> = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                while Instant::now() < deadline {
                    tick.tick().await;
                    let order = rng.random_range(0..ORDERS);
                    let version = {
                        let mut v = versions.lock().unwrap();
                        v[order] += 1;
                        v[order]
                    };
                    let id = format!("ord_{order:05}");
                    let status = format!("s{}", version % 7);
                    sim.put("orders", &id, version, json!({"status": status}));
                    let body = json!({"id": format!("evt_{id}_{version}"), "type": "order.updated",
                        "data": {"id": id, "version": version, "status": status}})
                    .to_string();
                    let roll: f64 = rng.random();
                    let mut sends = Vec::new();
                    if roll < 0.02 {
                        continue; // lost: the reconcile repairs it
                    } else if roll < 0.07 {
                        held.push(body);
                    } else {
                        sends.push(body.clone());
                        if roll < 0.17 {
                            sends.push(body);
                        }
                    }
                    if held.len() > 20 {
                        sends.append(&mut held);
                    }
                    for body in sends {
                        let (client, url, delivered, latencies) = (
                            client.clone(),
                            sim_url.clone(),
                            delivered.clone(),
                            latencies.clone(),
                        );
                        tokio::spawn(async move {
                            let ts = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .unwrap()
                                .as_secs() as i64;
                            let sig = sign::hmac_sha256(SECRET.as_bytes(), ts, body.as_bytes());
                            let t = Instant::now();
                            let ok = client
                                .post(&url)
                                .header("X-Signature", sig)
                                .header("X-Signature-Timestamp", ts.to_string())
                                .body(body.clone())
                                .send()
                                .await
                                .is_ok_and(|r| r.status().is_success());
                            latencies
                                .lock()
                                .unwrap()
                                .push(t.elapsed().as_secs_f64() * 1000.0);
                            if ok {
                                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                                delivered
                                    .lock()
                                    .unwrap()
                                    .insert(v["id"].as_str().unwrap().to_string());
                            }
                        });
                    }
                }
            }
        };
        let sample = async {
            let mut every = tokio::time::interval(SAMPLE_EVERY);
            while Instant::now() < deadline {
                every.tick().await;
                let connections = match &pg_name {
                    Some(name) => scalar_pg(
                        &format!("{}/test", pg_server()),
                        &format!(
                            "SELECT COUNT(*) AS v FROM pg_stat_activity WHERE datname = '{name}'"
                        ),
                    ) as f64,
                    None => f64::NAN,
                };
                let s = Sample {
                    at: started.elapsed().as_secs_f64(),
                    rss_mib: status_field(pid, "VmRSS:") / 1024.0,
                    fds: fds(pid),
                    threads: status_field(pid, "Threads:"),
                    connections,
                };
                println!(
                    "  {:>6.0}s  RSS {:>6.1} MiB  fds {:>4}  threads {:>3}  db connections {}",
                    s.at, s.rss_mib, s.fds, s.threads, s.connections
                );
                samples.push(s);
            }
        };
        tokio::join!(load, sample);
    });
    let warm = samples.len() / 4;
    let after = &samples[warm..];
    println!(
        "slope per hour after the first quarter ({} samples): RSS {:+.2} MiB, fds {:+.1}, threads {:+.1}, db connections {:+.1}",
        after.len(),
        slope_per_hour(after, |s| s.rss_mib),
        slope_per_hour(after, |s| s.fds),
        slope_per_hour(after, |s| s.threads),
        slope_per_hour(after, |s| s.connections),
    );
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    if !lat.is_empty() {
        println!(
            "delivery latency: p50 {:.2} ms, p99 {:.2} ms ({} requests)",
            lat[lat.len() / 2],
            lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
            lat.len()
        );
    }
    // Exactly once: every delivered event claimed once, every order at the sender's
    // version once a reconcile has run after the load.
    let versions = versions.lock().unwrap().clone();
    let expected_orders = versions.iter().filter(|v| **v > 0).count() as i64;
    let converged = rt.block_on(async {
        let limit = Instant::now() + Duration::from_secs(60);
        while Instant::now() < limit {
            let stored = stored_versions(&url);
            let behind = versions
                .iter()
                .enumerate()
                .filter(|(o, v)| **v > 0 && stored.get(&format!("ord_{o:05}")) != Some(*v))
                .count();
            if behind == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        false
    });
    let delivered = delivered.lock().unwrap().len() as i64;
    let claims = scalar(&url, "SELECT COUNT(*) AS v FROM processed_events");
    let rows = scalar(&url, "SELECT COUNT(*) AS v FROM resources");
    let ok = converged && claims >= delivered && rows == expected_orders;
    println!(
        "exactly-once: {} (events delivered {delivered}, claimed {claims}; orders {expected_orders}, rows {rows}, every order at the sender's version: {converged})",
        if ok { "yes" } else { "NO" }
    );
    drop(daemon);
    if let Some(name) = pg_name {
        if let Ok(mut admin) = PgConnection::establish(&format!("{}/test", pg_server())) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
        }
    }
    if !ok {
        std::process::exit(1);
    }
}

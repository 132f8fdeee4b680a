//! Change-feed benchmark: the webhook ingest load (signed deliveries at concurrency 32,
//! each event delivered twice) run twice in one invocation on fresh databases — once
//! without a consumer, once with one that answers at once — then:
//! - ingest deliveries/s with and without the consumer (the feed's cost to ingest);
//! - changes pushed per second, and push lag from commit (`changed_at`) to the
//!   consumer's receipt, p50 / p99, measured while ingest runs at full speed;
//! - exactly-once checked: every change received, each `webhook-id` once (or counted).
//!
//!   cargo bench --bench change_feed -- --backend postgres --events 20000
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness, not the daemon"
)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::routing::post;
use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use rand::seq::SliceRandom;
use webhook_reconciler::app::Application;
use webhook_reconciler::config::Config;
use webhook_reconciler::signature as sign;

const SECRET: &str = "bench-secret";

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn fresh_db(backend: &str, dir: &std::path::Path, tag: &str) -> String {
    if backend == "sqlite" {
        return format!("sqlite://{}", dir.join(format!("{tag}.db")).display());
    }
    let name = format!("wr_feed_{tag}_{:08x}", rand::random::<u32>());
    PgConnection::establish(&format!("{}/test", pg_server()))
        .expect("PostgreSQL unreachable; run scripts/ensure-postgres.sh")
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    format!("{}/{name}", pg_server())
}

fn config(url: &str, consumer: Option<&str>) -> Config {
    let consumer = consumer
        .map(|u| format!("[consumers.bench]\nurl = \"{u}\"\nsecret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3\"\n"))
        .unwrap_or_default();
    Config::from_toml_str(&format!(
        r#"
[database]
url = "{url}"
max_connections = 32
acquire_timeout = "30s"
[http]
listen = "127.0.0.1:0"
[log]
level = "warn"
[sources.shop.webhook]
secrets = ["{SECRET}"]
[sources.shop.kinds.order]
version = "/version"
[sources.shop.kinds.order.events."order.updated"]
id = "/data/id"
version = "/data/version"
state = "/data"
{consumer}"#
    ))
    .unwrap()
}

/// `events` updates of `events / 10` orders (versions 1..=10 each, a ~200-byte state),
/// every one delivered twice, shuffled: duplicates, reordering, stale updates.
fn bodies(events: usize) -> Vec<Arc<String>> {
    let orders = (events / 10).max(1);
    let mut out: Vec<Arc<String>> = (0..events)
        .map(|i| {
            Arc::new(
                serde_json::json!({
                    "id": format!("evt_{i:08}"), "type": "order.updated",
                    "data": {"id": format!("ord_{:06}", i % orders), "version": i / orders + 1,
                             "status": "paid", "amount": 4200 + i, "currency": "EUR",
                             "customer": "cus_0123456789", "lines": [{"sku": "sku_1", "qty": 2}, {"sku": "sku_2", "qty": 1}],
                             "updated_at": "2026-07-29T10:00:00Z"}
                })
                .to_string(),
            )
        })
        .collect();
    out.extend(out.clone());
    out.shuffle(&mut rand::rng());
    out
}

async fn drive(addr: std::net::SocketAddr, bodies: Vec<Arc<String>>, concurrency: usize) -> f64 {
    let n = bodies.len();
    let queue = Arc::new(Mutex::new(bodies));
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/webhooks/shop");
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (queue, client, url) = (queue.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                loop {
                    let Some(body) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    let ts = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap()
                        .as_secs() as i64;
                    let r = client
                        .post(&url)
                        .header(
                            "X-Signature",
                            sign::hmac_sha256(SECRET.as_bytes(), ts, body.as_bytes()),
                        )
                        .header("X-Signature-Timestamp", ts.to_string())
                        .body(body.as_str().to_owned())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

#[derive(Default)]
struct Received {
    /// webhook-id -> times received.
    ids: HashMap<String, u32>,
    /// Seconds from commit to receipt.
    lags: Vec<f64>,
    first: Option<Instant>,
    last: Option<Instant>,
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let events: usize = arg("--events", "20000").parse().unwrap();
    let backends: Vec<String> = match arg("--backend", "both").as_str() {
        "both" => vec!["postgres".into(), "sqlite".into()],
        b => vec![b.to_string()],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "change feed: {events} events (updates of {} orders), each delivered twice, concurrency 32",
        events / 10
    );
    for backend in backends {
        let dir = tempfile::tempdir().unwrap();
        rt.block_on(async {
            // Without a consumer.
            let app = Application::build(config(&fresh_db(&backend, dir.path(), "plain"), None)).await.unwrap();
            let addr = app.local_addr();
            let server = tokio::spawn(app.run_until(std::future::pending()));
            let plain = drive(addr, bodies(events), 32).await;
            server.abort();

            // With a consumer answering at once.
            let received = Arc::new(Mutex::new(Received::default()));
            let r2 = received.clone();
            let consumer = axum::Router::new().route(
                "/feed",
                post(move |headers: axum::http::HeaderMap, body: Bytes| {
                    let received = r2.clone();
                    async move {
                        let now = chrono::Utc::now();
                        let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                        let change: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let at = chrono::DateTime::parse_from_rfc3339(change["changed_at"].as_str().unwrap()).unwrap();
                        let mut r = received.lock().unwrap();
                        *r.ids.entry(id).or_default() += 1;
                        r.lags.push((now - at.with_timezone(&chrono::Utc)).num_microseconds().unwrap() as f64 / 1e6);
                        let t = Instant::now();
                        r.first.get_or_insert(t);
                        r.last = Some(t);
                        axum::http::StatusCode::OK
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let consumer_url = format!("http://{}/feed", listener.local_addr().unwrap());
            let consumer_server = tokio::spawn(async move { axum::serve(listener, consumer).await });
            let url = fresh_db(&backend, dir.path(), "feed");
            let app = Application::build(config(&url, Some(&consumer_url))).await.unwrap();
            let (addr, db) = (app.local_addr(), app.db().clone());
            let server = tokio::spawn(app.run_until(std::future::pending()));
            let started = Instant::now();
            let with = drive(addr, bodies(events), 32).await;
            let ingest_done = started.elapsed().as_secs_f64();
            let changes = webhook_reconciler::feed::Feed::new(db.clone())
                .last_seq()
                .await
                .unwrap();
            let deadline = Instant::now() + std::time::Duration::from_secs(120);
            while received.lock().unwrap().ids.len() < changes as usize && Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            server.abort();
            consumer_server.abort();
            let r = received.lock().unwrap();
            let mut lags = r.lags.clone();
            lags.sort_by(|a, b| a.total_cmp(b));
            let pct = |p: f64| lags[((lags.len() as f64 * p) as usize).min(lags.len() - 1)] * 1000.0;
            let pushes: u32 = r.ids.values().sum();
            let span = r.last.zip(r.first).map_or(0.0, |(l, f)| (l - f).as_secs_f64());
            println!("{backend:<9} ingest without a consumer {plain:>8.0} deliveries/s");
            println!(
                "{:<9} ingest with a consumer    {with:>8.0} deliveries/s  ({:.0}% of without; ingest took {ingest_done:.1}s)",
                "", with / plain * 100.0
            );
            println!(
                "{:<9} changes {changes}, received {} distinct in {pushes} pushes; {:.0} changes/s pushed; lag p50 {:.1} ms p99 {:.1} ms",
                "",
                r.ids.len(),
                r.ids.len() as f64 / span.max(1e-9),
                pct(0.50),
                pct(0.99)
            );
            assert_eq!(r.ids.len() as i64, changes, "every change received");
        });
    }
}

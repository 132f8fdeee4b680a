//! Operating the daemon: systemd notifications, graceful shutdown with a request in
//! flight, retention, metrics, status, and secrets kept out of the logs.

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use webhook_reconciler::config::Config;
use webhook_reconciler::db::Db;
use webhook_reconciler::signature as sign;
use webhook_reconciler::simulator::{SimSender, Style};

use crate::helpers::process::{bin, free_port, signal};
use crate::helpers::{
    Backend, SHOP_SECRET, TestDb, both_backends, eventually, now, refund_event, spawn_app,
};
use crate::reconcile::reconcile_config;

/// A `serve` configuration on a fixed free port, SQLite, with the shop source.
fn serve_config(
    dir: &tempfile::TempDir,
    db_url: &str,
    port: u16,
    sim: Option<&SimSender>,
) -> std::path::PathBuf {
    let text = match sim {
        Some(sim) => reconcile_config(db_url, sim, Style::Cursor, "", "").replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        ),
        None => crate::helpers::config_toml(db_url, "").replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        ),
    };
    let p = dir.path().join("config.toml");
    std::fs::write(&p, text).unwrap();
    p
}

async fn wait_ready(port: u16) -> bool {
    let client = reqwest::Client::new();
    eventually(Duration::from_secs(20), || {
        let client = client.clone();
        async move {
            client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    })
    .await
}

/// `serve` on `config` as systemd starts it: notifications to a datagram socket in
/// `dir` (returned, bound), a watchdog of `watchdog_usec`.
fn serve_under_systemd(
    dir: &tempfile::TempDir,
    config: &std::path::Path,
    watchdog_usec: &str,
) -> (UnixDatagram, std::process::Child) {
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let child = bin()
        .arg("--config")
        .arg(config)
        .arg("serve")
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", watchdog_usec)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (socket, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_tells_systemd_it_is_ready_pings_the_watchdog_and_says_it_stops() {
    let db = TestDb::new(Backend::Sqlite);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = serve_config(&dir, &db.url, port, None);
    let (socket, mut child) = serve_under_systemd(&dir, &config, "1000000");
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !(seen.contains("READY=1") && seen.contains("WATCHDOG=1") && seen.contains("STATUS=")) {
        let n = socket.recv(&mut buf).expect("no notification within 20s");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // READY=1 comes once the listener answers.
    assert!(
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .unwrap()
            .status()
            == 200
    );
    signal(child.id(), "TERM");
    while !seen.contains("STOPPING=1") {
        let n = socket.recv(&mut buf).expect("no STOPPING=1");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_delivery_in_flight_finish_then_exits_0() {
    let db = TestDb::new(Backend::Sqlite);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = serve_config(&dir, &db.url, port, None);
    let mut child = bin()
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_ready(port).await);
    let pid = child.id();
    let body = refund_event("evt_in_flight", "re_1").to_string();
    let outcome = tokio::task::spawn_blocking(move || {
        let ts = now();
        let sig = sign::hmac_sha256(SHOP_SECRET.as_bytes(), ts, body.as_bytes());
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(
            s,
            "POST /webhooks/shop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             X-Signature: {sig}\r\nX-Signature-Timestamp: {ts}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        )
        .unwrap();
        // "100 Continue" proves the handler is reading this request's body: in flight.
        let mut cont = [0u8; 25];
        s.read_exact(&mut cont).unwrap();
        assert!(String::from_utf8_lossy(&cont).starts_with("HTTP/1.1 100 Continue"));
        signal(pid, "TERM");
        s.write_all(body.as_bytes()).unwrap();
        let mut response = String::new();
        let _ = s.read_to_string(&mut response);
        response
    })
    .await
    .unwrap();
    assert!(outcome.starts_with("HTTP/1.1 200"), "{outcome}");
    assert!(outcome.contains(r#"{"outcome":"applied"}"#), "{outcome}");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(db.count("resources"), 1);
}

both_backends!(retention_deletes_only_what_is_past_its_window_in_bounded_batches);

async fn retention_deletes_only_what_is_past_its_window_in_bounded_batches(b: Backend) {
    let db = TestDb::new(b);
    let text = crate::helpers::config_toml(&db.url, "")
        .replace(
            "[http]",
            "[retention]\nbatch = 3\nreconcile_runs = \"7d\"\ndead_letters = \"7d\"\n\n[http]",
        )
        .replace(
            "[sources.shop.webhook]",
            "[sources.shop]\nretry_window = \"24h\"\n\n[sources.shop.webhook]",
        );
    let config = Config::from_toml_str(&text).unwrap();
    let handle = Db::connect(&config.database).unwrap();
    let h = handle.clone();
    tokio::task::spawn_blocking(move || h.migrate())
        .await
        .unwrap()
        .unwrap();
    let ago = |days: u32| match b {
        Backend::Postgres => format!("now() - interval '{days} days'"),
        Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{days} days')"),
    };
    let mut sql = String::new();
    for i in 0..10 {
        // Ids kept for 2 × 24h: three days old goes, one day old stays.
        let when = if i < 7 { ago(3) } else { ago(1) };
        sql.push_str(&format!("INSERT INTO processed_events (source, event_id, event_type, outcome, processed_at) VALUES ('shop', 'e{i}', 't', 'applied', {when});"));
    }
    // Another source's ids are not this source's business... and use its own window.
    sql.push_str(&format!("INSERT INTO processed_events (source, event_id, event_type, outcome, processed_at) VALUES ('billing', 'b1', 't', 'applied', {});", ago(1)));
    sql.push_str(&format!("INSERT INTO reconcile_runs (source, kind, mode, status, started_at, finished_at) VALUES ('shop', 'order', 'full', 'succeeded', {0}, {0});", ago(10)));
    sql.push_str(&format!("INSERT INTO reconcile_runs (source, kind, mode, status, started_at) VALUES ('shop', 'order', 'full', 'running', {});", ago(10)));
    sql.push_str(&format!("INSERT INTO reconcile_runs (source, kind, mode, status, started_at, finished_at) VALUES ('shop', 'order', 'full', 'failed', {0}, {0});", ago(1)));
    sql.push_str(&format!("INSERT INTO dead_letters (source, event_id, event_type, reason, body, last_seen_at) VALUES ('shop', 'd1', 't', 'r', '{{}}', {});", ago(8)));
    sql.push_str(&format!("INSERT INTO dead_letters (source, event_id, event_type, reason, body, last_seen_at) VALUES ('shop', 'd2', 't', 'r', '{{}}', {});", ago(2)));
    db.execute(&sql);

    let report = webhook_reconciler::retention::prune(
        &webhook_reconciler::retention::Owners::new(handle.clone()),
        &config,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            report.processed_events,
            report.reconcile_runs,
            report.dead_letters
        ),
        (7, 1, 1),
        "{report:?}"
    );
    assert_eq!(db.count("processed_events WHERE source = 'shop'"), 3);
    assert_eq!(db.count("processed_events WHERE source = 'billing'"), 1);
    assert_eq!(
        db.count("reconcile_runs WHERE status = 'running'"),
        1,
        "a running run is never pruned"
    );
    assert_eq!(db.count("reconcile_runs"), 2);
    assert_eq!(db.count("dead_letters"), 1);
    assert_eq!(db.count("prune_runs WHERE finished_at IS NOT NULL"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_readiness_and_status_report_deliveries_runs_and_freshness() {
    let db = TestDb::new(Backend::Sqlite);
    let sim = SimSender::start().await.unwrap();
    sim.add_kind("orders", Style::Cursor);
    sim.add_kind("refunds", Style::Cursor);
    sim.put("orders", "o1", 1, json!({"status": "x"}));
    let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
        .replace("lease_ttl = \"3s\"", "lease_ttl = \"3s\"\nevery = \"1h\"");
    let config = Config::from_toml_str(&text).unwrap();
    let app = webhook_reconciler::app::Application::build(config)
        .await
        .unwrap();
    let addr = app.local_addr();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    // run_at_start reconciles both kinds once.
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.count("reconcile_runs WHERE status = 'succeeded'") == 2
        })
        .await
    );
    let client = reqwest::Client::new();
    let body = json!({"id": "evt_m", "type": "order.status_changed", "data": {"id": "o1", "version": 2, "status": "y"}}).to_string();
    let r = crate::helpers::post_signed(&client, addr, &body, SHOP_SECRET).await;
    assert_eq!(r.status(), 200);
    let r = client
        .post(format!("http://{addr}/webhooks/shop"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let metrics = client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        r#"webhook_deliveries_total{source="shop",result="applied"}"#,
        r#"webhook_deliveries_total{source="shop",result="unauthorized"}"#,
        "webhook_delivery_duration_seconds_bucket",
        r#"reconcile_runs_total{source="shop",kind="order",status="succeeded"}"#,
        r#"reconcile_drift_items{source="shop",kind="order",class="missing"}"#,
        r#"reconcile_seconds_since_success{source="shop",kind="order"}"#,
        "db_pool_connections",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from /metrics:\n{metrics}"
        );
    }

    let ready: Value = client
        .get(format!("http://{addr}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kinds = ready["reconcile"].as_array().unwrap();
    assert_eq!(kinds.len(), 2);
    assert_eq!(kinds[0]["overdue"], false);
    assert!(kinds[0]["last_success_age_seconds"].as_f64().unwrap() < 60.0);
    assert_eq!(kinds[0]["stale_after_seconds"], 3.0 * 3600.0);
    server.abort();

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, &text).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        bin()
            .arg("--config")
            .arg(&cfg)
            .args(["status", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["kinds"][0]["kind"], "order");
    assert_eq!(status["kinds"][0]["recent_runs"][0]["status"], "succeeded");
    assert_eq!(status["last_prune"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_appears_in_a_full_runs_logs() {
    let db = TestDb::new(Backend::Postgres);
    let sim = SimSender::start().await.unwrap();
    sim.add_kind("orders", Style::Cursor);
    sim.add_kind("refunds", Style::Cursor);
    sim.put("orders", "o1", 1, json!({"status": "x"}));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // trust authentication ignores the password, so it can be a marker here.
    let url = db
        .url
        .replace("postgres://postgres@", "postgres://postgres:db-pass-7f3a@");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "api-token-9c1e\n").unwrap();
    let text = reconcile_config(
        &url,
        &sim,
        Style::Cursor,
        &format!(
            "api_token = {{ file = {:?} }}",
            token_file.display().to_string()
        ),
        "",
    )
    .replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    )
    .replace(
        &format!("secrets = [\"{SHOP_SECRET}\"]"),
        "secrets = [{ env = \"WR_TEST_SHOP_SECRET\" }]",
    )
    .replace("lease_ttl = \"3s\"", "lease_ttl = \"3s\"\nevery = \"1h\"");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, &text).unwrap();
    // Files, not pipes: trace-level logs would fill a pipe nobody reads yet.
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("serve")
        .env("WR_TEST_SHOP_SECRET", "hook-secret-51d0")
        .env("RUST_LOG", "trace")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(wait_ready(port).await);
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.count("reconcile_runs WHERE status = 'succeeded'") == 2
        })
        .await
    );
    let client = reqwest::Client::new();
    let body = json!({"id": "e1", "type": "order.status_changed", "data": {"id": "o1", "version": 3, "status": "z"}}).to_string();
    let ts = now();
    for secret in ["hook-secret-51d0", "wrong"] {
        client
            .post(format!("http://127.0.0.1:{port}/webhooks/shop"))
            .header(
                "X-Signature",
                sign::hmac_sha256(secret.as_bytes(), ts, body.as_bytes()),
            )
            .header("X-Signature-Timestamp", ts.to_string())
            .body(body.clone())
            .send()
            .await
            .unwrap();
    }
    signal(child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        logs.contains("reconcile run succeeded") && logs.contains("delivery"),
        "the logs cover the run:\n{logs}"
    );
    for secret in ["hook-secret-51d0", "api-token-9c1e", "db-pass-7f3a"] {
        assert!(!logs.contains(secret), "{secret} leaked into the logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prune_command_reports_and_records_its_pass() {
    let app = spawn_app(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, crate::helpers::config_toml(&app.db.url, "")).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        bin()
            .arg("--config")
            .arg(&cfg)
            .arg("prune")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("pruned 0 event ids"));
    assert_eq!(app.db.count("prune_runs"), 1);
}

/// The attack from the listener issue, against the process systemd would run: 1,000
/// connections from other client addresses trickle request heads, a byte a second.
/// Throughout, WATCHDOG=1 keeps arriving at half of WatchdogSec (so systemd would not
/// restart the daemon), and a signed delivery is answered within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_a_thousand_trickling_connections_the_watchdog_keeps_being_pinged() {
    let db = TestDb::new(Backend::Sqlite);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = serve_config(&dir, &db.url, port, None);
    let (socket, mut child) = serve_under_systemd(&dir, &config, "2000000");
    socket.set_nonblocking(true).unwrap();
    assert!(wait_ready(port).await);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut attackers = Vec::new();
    for c in 0..1000u32 {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(std::net::SocketAddr::from((
            [127, 0, 0, 2 + (c % 4) as u8],
            0,
        )))
        .unwrap();
        attackers.push(s.connect(addr).await.unwrap());
    }
    let trickle: Vec<_> = attackers
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                for b in b"POST /webhooks/shop HTTP/1.1\r\nX-Pad: a".iter().take(8) {
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                s
            })
        })
        .collect();
    // Drain what came before the attack, then watch 8 s of it.
    let mut buf = [0u8; 4096];
    while socket.recv(&mut buf).is_ok() {}
    let client = reqwest::Client::new();
    let started = std::time::Instant::now();
    let mut last_ping = started;
    let mut longest_gap = Duration::ZERO;
    let mut pings = 0;
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(8) {
        while let Ok(len) = socket.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..len]).contains("WATCHDOG=1") {
                longest_gap = longest_gap.max(last_ping.elapsed());
                last_ping = std::time::Instant::now();
                pings += 1;
            }
        }
        if started.elapsed() >= Duration::from_millis(500 * n) {
            let body = refund_event(&format!("evt_probe_{n}"), &format!("re_{n}")).to_string();
            let ts = now();
            let sig = sign::hmac_sha256(SHOP_SECRET.as_bytes(), ts, body.as_bytes());
            let sent = std::time::Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(1),
                client
                    .post(format!("http://127.0.0.1:{port}/webhooks/shop"))
                    .header("content-type", "application/json")
                    .header("x-signature", sig)
                    .header("x-signature-timestamp", ts.to_string())
                    .body(body)
                    .send(),
            )
            .await
            .unwrap_or_else(|_| panic!("signed probe {n} not answered within a second"))
            .unwrap();
            assert_eq!(r.status(), 200);
            assert!(sent.elapsed() < Duration::from_secs(1));
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    longest_gap = longest_gap.max(last_ping.elapsed());
    assert!(
        pings >= 6,
        "only {pings} WATCHDOG=1 in 8 s (every 1 s expected)"
    );
    assert!(
        longest_gap < Duration::from_secs(2),
        "no WATCHDOG=1 for {longest_gap:?}: systemd (WatchdogSec=2s) would restart the daemon"
    );
    assert_eq!(db.count("processed_events"), n as i64);
    for t in trickle {
        t.abort();
    }
    signal(child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

both_backends!(a_kind_is_as_fresh_as_its_stalest_account_that_runs_now);

/// With many accounts, `reconcile_seconds_since_success` and `overdue` are the stalest
/// covered account's: not whichever account's run the database returned first, not a
/// disabled or removed account's, and a registered account that never succeeded ages
/// from when it was added.
async fn a_kind_is_as_fresh_as_its_stalest_account_that_runs_now(b: Backend) {
    let db = TestDb::new(b);
    let sim = SimSender::start().await.unwrap();
    sim.add_kind("orders", Style::Cursor);
    sim.add_kind("refunds", Style::Cursor);
    let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
        .replace("lease_ttl = \"3s\"", "lease_ttl = \"3s\"\nevery = \"1h\"")
        + "\n[sources.shop.accounts]\nfrom = \"/account\"\n";
    let config = Config::from_toml_str(&text).unwrap();
    let handle = crate::helpers::handle_on(&db).await;
    let book = webhook_reconciler::bookkeeping::Bookkeeping::new(handle.clone());
    let registry = webhook_reconciler::accounts::Accounts::new(handle);
    for account in ["acct_new", "acct_old", "acct_gone"] {
        registry.add("shop", account, None, None).await.unwrap();
    }
    let ago = |secs: u32| match b {
        Backend::Postgres => format!("now() - interval '{secs} seconds'"),
        Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{secs} seconds')"),
    };
    // A success as a run records it: its run, and the account-kind's last success.
    let run = |account: &str, secs: u32| {
        format!(
            "INSERT INTO reconcile_runs (source, account, kind, mode, status, started_at, finished_at) VALUES ('shop', '{account}', 'order', 'full', 'succeeded', {0}, {0}); \
             INSERT INTO reconcile_last_success (source, account, kind, succeeded_at) VALUES ('shop', '{account}', 'order', {0});",
            ago(secs)
        )
    };
    // The platform's own account a minute ago, one account now, one five hours ago (its
    // newer failure does not count), and one that was removed, ten hours ago.
    db.execute(
        &[
            run("", 60),
            run("acct_new", 0),
            run("acct_old", 5 * 3600),
            run("acct_gone", 10 * 3600),
        ]
        .concat(),
    );
    db.execute(&format!("INSERT INTO reconcile_runs (source, account, kind, mode, status, started_at, finished_at) VALUES ('shop', 'acct_old', 'order', 'full', 'failed', {0}, {0})", ago(5)));
    registry.remove("shop", "acct_gone").await.unwrap();
    let order = || async {
        let kinds = webhook_reconciler::health::freshness(&book, &config)
            .await
            .unwrap();
        let k = kinds.into_iter().find(|k| k.kind == "order").unwrap();
        assert_eq!(k.stale_after_seconds, Some(3.0 * 3600.0));
        (k.last_success_age_seconds, k.overdue)
    };
    let (age, overdue) = order().await;
    let age = age.unwrap();
    assert!(
        (5.0 * 3600.0..6.0 * 3600.0).contains(&age),
        "the stalest account is acct_old: {age}"
    );
    assert!(overdue);

    // Disabled, acct_old no longer runs: the platform's own run a minute ago is the
    // stalest.
    registry
        .set_enabled("shop", "acct_old", Some("test"))
        .await
        .unwrap();
    let (age, overdue) = order().await;
    assert!((60.0..3600.0).contains(&age.unwrap()), "{age:?}");
    assert!(!overdue);

    // An account added now that has not run yet is not overdue; one added four hours
    // ago that never succeeded is.
    registry
        .add("shop", "acct_fresh", None, None)
        .await
        .unwrap();
    let (age, overdue) = order().await;
    assert!((60.0..3600.0).contains(&age.unwrap()), "{age:?}");
    assert!(!overdue);
    db.execute(&format!(
        "UPDATE accounts SET created_at = {} WHERE account = 'acct_fresh'",
        ago(4 * 3600)
    ));
    let (age, overdue) = order().await;
    // SQLite's julianday arithmetic can land a few microseconds short of the 4 hours.
    assert!(
        (4.0 * 3600.0 - 1.0..5.0 * 3600.0).contains(&age.unwrap()),
        "{age:?}"
    );
    assert!(overdue);

    // The platform's own account never succeeded: never, and overdue.
    db.execute("DELETE FROM reconcile_runs WHERE account = ''; DELETE FROM reconcile_last_success WHERE account = ''");
    assert_eq!(order().await, (None, true));
}

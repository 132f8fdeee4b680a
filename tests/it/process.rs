//! The binary as a process: `reconcile` exit codes and output, a reconcile killed with
//! SIGKILL and rerun, and `serve`'s schedule surviving a SIGSTOP / SIGCONT pause.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use webhook_reconciler::simulator::{Fault, SimSender, Style};

use crate::helpers::process::{bin, signal, write_migrated_config};
use crate::helpers::{Backend, TestDb, eventually};
use crate::reconcile::reconcile_config;

async fn sim_with_orders(n: usize) -> SimSender {
    let sim = SimSender::start().await.unwrap();
    sim.add_kind("orders", Style::Cursor);
    sim.add_kind("refunds", Style::Cursor);
    for i in 0..n {
        sim.put(
            "orders",
            &format!("o{i:04}"),
            1 + (i as i64 % 3),
            json!({"status": "x"}),
        );
    }
    sim
}

/// Runs `reconcile --json` off the async runtime (the simulated sender lives on it).
async fn reconcile_json(
    config: std::path::PathBuf,
    extra: &'static [&'static str],
) -> (i32, Value, String) {
    tokio::task::spawn_blocking(move || {
        let out = bin()
            .env("RUST_LOG", "warn")
            .arg("--config")
            .arg(&config)
            .arg("reconcile")
            .arg("--json")
            .args(extra)
            .output()
            .unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code().unwrap_or(-1),
            json,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_prints_a_summary_per_kind_and_exits_by_outcome() {
    let db = TestDb::new(Backend::Sqlite);
    let sim = sim_with_orders(20).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_migrated_config(
        dir.path(),
        &reconcile_config(&db.url, &sim, Style::Cursor, "", ""),
    );

    let (code, json, stderr) = reconcile_json(config.clone(), &[]).await;
    assert_eq!(code, 0, "{stderr}");
    let kinds: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["order", "refund"]);
    assert_eq!(json[0]["status"], "succeeded");
    assert_eq!(json[0]["counts"]["applied"], 20);

    // The human table, off a terminal.
    let c2 = config.clone();
    let out = tokio::task::spawn_blocking(move || {
        bin()
            .env("RUST_LOG", "warn")
            .arg("--config")
            .arg(&c2)
            .args(["reconcile", "--kind", "order"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("KIND") && table.contains("shop/order") && table.contains("UNCHANGED"),
        "{table}"
    );

    // A kind that cannot be listed fails the command with exit 1, naming the URL.
    for n in 1..=20 {
        sim.fail_list_request(sim.list_requests() + n, Fault::Status(503, None));
    }
    let (code, json, _) = reconcile_json(config.clone(), &["--kind", "order"]).await;
    assert_eq!(code, 1);
    assert_eq!(json[0]["status"], "failed");
    assert!(
        json[0]["error"]
            .as_str()
            .unwrap()
            .contains("/orders?limit=7"),
        "{json}"
    );

    let (code, _, stderr) = reconcile_json(config, &["--kind", "nope"]).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("--kind nope"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_killed_midway_then_rerun_converges() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend);
        let sim = sim_with_orders(150).await;
        let dir = tempfile::tempdir().unwrap();
        // ~22 pages at 5 requests a second: slow enough to kill in the middle.
        let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
            .replace("requests_per_second = 1000", "requests_per_second = 5");
        let config = write_migrated_config(dir.path(), &text);
        let mut child = bin()
            .env("RUST_LOG", "warn")
            .arg("--config")
            .arg(&config)
            .args(["reconcile", "--kind", "order"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let midway = eventually(Duration::from_secs(20), || async {
            db.count("resources") >= 14
        })
        .await;
        assert!(midway, "{backend:?}: the first run never got going");
        signal(child.id(), "KILL");
        child.wait().unwrap();
        let applied_before = db.count("resources");
        assert!(
            applied_before < 150,
            "{backend:?}: killed too late to test anything"
        );

        // The dead run's lease expires (lease_ttl = 3s); until then a rerun is skipped.
        let last = std::sync::Arc::new(std::sync::Mutex::new(Value::Null));
        let converged = eventually(Duration::from_secs(20), || {
            let (config, last) = (config.clone(), last.clone());
            async move {
                let (code, json, stderr) = reconcile_json(config, &["--kind", "order"]).await;
                assert_eq!(code, 0, "{stderr}");
                let ok = json[0]["status"] == "succeeded";
                *last.lock().unwrap() = json;
                ok
            }
        })
        .await;
        let last = last.lock().unwrap().clone();
        assert!(converged, "{backend:?}: {last}");
        assert_eq!(
            last[0]["resumed"], true,
            "{backend:?}: the rerun resumes from the last committed page"
        );
        assert_eq!(db.count("resources"), 150);
        assert_eq!(
            db.count("reconcile_runs WHERE status = 'abandoned'"),
            1,
            "{backend:?}: the killed run is marked abandoned"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_keeps_running_after_the_process_is_paused_and_serve_stops_cleanly() {
    let db = TestDb::new(Backend::Sqlite);
    let sim = sim_with_orders(5).await;
    let dir = tempfile::tempdir().unwrap();
    let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "").replace(
        "lease_ttl = \"3s\"",
        "lease_ttl = \"3s\"\nevery = \"1s\"\njitter = \"0s\"",
    );
    let config = write_migrated_config(dir.path(), &text);
    let mut child = bin()
        .env("RUST_LOG", "warn")
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let runs = || db.count("reconcile_runs WHERE kind = 'order' AND status = 'succeeded'");
    assert!(
        eventually(Duration::from_secs(15), || async { runs() >= 2 }).await,
        "no scheduled runs"
    );

    signal(child.id(), "STOP");
    // The pause itself is what is tested: longer than the interval, as a VM pause or
    // an overloaded host would make it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal(child.id(), "CONT");
    let after_pause = runs();
    let resumed = eventually(Duration::from_secs(15), || async {
        runs() >= after_pause + 3
    })
    .await;
    assert!(
        resumed,
        "the schedule stopped after the pause ({} runs)",
        runs()
    );

    signal(child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "serve exits 0 on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_reconcile_finishes_the_page_exits_0_and_the_next_run_resumes() {
    let db = TestDb::new(Backend::Sqlite);
    let sim = sim_with_orders(150).await;
    let dir = tempfile::tempdir().unwrap();
    // 22 pages at 3 requests a second: a run that lasts several seconds.
    let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
        .replace("requests_per_second = 1000", "requests_per_second = 3")
        .replace(
            "lease_ttl = \"3s\"",
            "lease_ttl = \"3s\"\nevery = \"1h\"\njitter = \"0s\"",
        );
    let config = write_migrated_config(dir.path(), &text);
    let mut child = bin()
        .env("RUST_LOG", "warn")
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(20), || async {
        db.scalar("SELECT COALESCE(MAX(pages), 0) AS n FROM reconcile_runs WHERE kind = 'order'")
            >= 2
    })
    .await;
    assert!(started, "the scheduled run never got going");
    signal(child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(db.count("resources") < 150, "shut down mid-run");
    assert_eq!(db.count("reconcile_runs WHERE kind = 'order' AND status = 'failed' AND error LIKE '%stopped by shutdown%'"), 1);
    // Every page the run reported is in the table: it stopped between pages.
    assert_eq!(
        db.count("resources"),
        db.scalar("SELECT COALESCE(MAX(scanned), 0) AS n FROM reconcile_runs WHERE kind = 'order'")
    );
    let text2 = text.replace("requests_per_second = 3", "requests_per_second = 1000");
    std::fs::write(&config, text2).unwrap();
    let (code, json, stderr) = reconcile_json(config, &["--kind", "order"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json[0]["resumed"], true);
    assert_eq!(db.count("resources"), 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_killed_with_sigkill_is_replaced_at_once_by_the_next_run() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend);
        let sim = sim_with_orders(150).await;
        let dir = tempfile::tempdir().unwrap();
        // A long lease: the rerun must not wait for it to expire.
        let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
            .replace("requests_per_second = 1000", "requests_per_second = 5")
            .replace("lease_ttl = \"3s\"", "lease_ttl = \"10m\"");
        let config = write_migrated_config(dir.path(), &text);
        let mut child = bin()
            .env("RUST_LOG", "warn")
            .arg("--config")
            .arg(&config)
            .args(["reconcile", "--kind", "order"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let midway = eventually(Duration::from_secs(20), || async {
            db.count("resources") >= 14
        })
        .await;
        assert!(midway, "{backend:?}: the first run never got going");
        signal(child.id(), "KILL");
        child.wait().unwrap();
        assert_eq!(
            db.count("reconcile_leases"),
            1,
            "{backend:?}: the dead run's lease is left"
        );

        let (code, json, stderr) = reconcile_json(config, &["--kind", "order"]).await;
        assert_eq!(code, 0, "{backend:?}: {stderr}");
        assert_eq!(json[0]["status"], "succeeded", "{backend:?}: {json}");
        assert_eq!(json[0]["resumed"], true, "{backend:?}: {json}");
        assert_eq!(db.count("resources"), 150, "{backend:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_is_named_with_its_expiry_and_wait_waits_for_it() {
    let db = TestDb::new(Backend::Sqlite);
    let sim = sim_with_orders(20).await;
    let dir = tempfile::tempdir().unwrap();
    let text = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let config = write_migrated_config(dir.path(), &text);
    // A live process of another host holds the kind for two more seconds.
    db.execute(
        "INSERT INTO reconcile_leases (source, kind, holder, expires_at) VALUES \
         ('shop', 'order', 'other-host:4242:17:0', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+2 seconds'))",
    );
    let out = tokio::task::spawn_blocking({
        let config = config.clone();
        move || {
            bin()
                .env("RUST_LOG", "warn")
                .arg("--config")
                .arg(&config)
                .args(["reconcile", "--kind", "order"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("other-host:4242:17:0"), "{stdout}");
    assert!(stdout.contains("expires at"), "{stdout}");
    assert!(stdout.contains("--wait"), "{stdout}");
    assert_eq!(db.count("resources"), 0);

    let started = std::time::Instant::now();
    let (code, json, stderr) = reconcile_json(config, &["--kind", "order", "--wait"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json[0]["status"], "succeeded", "{json}");
    assert!(started.elapsed() >= Duration::from_millis(500), "it waited");
    assert_eq!(db.count("resources"), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_while_pushing_then_restarted_skips_no_change() {
    use crate::helpers::consumer::ConsumerApp;
    use crate::helpers::process::free_port;
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let consumer = ConsumerApp::start().await;
        consumer.answer_after(Duration::from_millis(30));
        let db = TestDb::new(backend);
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let text = crate::helpers::config_toml(&db.url, "").replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        ) + &consumer.config("app", "");
        let config = write_migrated_config(dir.path(), &text);
        let serve = || {
            bin()
                .env("RUST_LOG", "warn")
                .arg("--config")
                .arg(&config)
                .arg("serve")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut child = serve();
        let client = reqwest::Client::new();
        let up = eventually(Duration::from_secs(20), || async {
            client
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .send()
                .await
                .is_ok()
        })
        .await;
        assert!(up, "{backend:?}: serve did not come up");
        for i in 0..100 {
            let body = crate::helpers::order_event(&format!("e{i}"), &format!("o{i}"), 1, "paid")
                .to_string();
            let r = crate::helpers::post_signed(
                &client,
                format!("127.0.0.1:{port}"),
                &body,
                crate::helpers::SHOP_SECRET,
            )
            .await;
            assert_eq!(r.status(), 200);
        }
        let midway = eventually(Duration::from_secs(20), || async {
            consumer.delivered().len() >= 20
        })
        .await;
        assert!(midway, "{backend:?}: pushing never got going");
        signal(child.id(), "KILL");
        child.wait().unwrap();
        let before = consumer.delivered().len();
        assert!(
            before < 100,
            "{backend:?}: killed too late to test anything ({before})"
        );

        let mut child = serve();
        let all = eventually(Duration::from_secs(60), || async {
            let mut ids: Vec<String> = consumer
                .delivered()
                .into_iter()
                .map(|p| p.webhook_id)
                .collect();
            ids.sort();
            ids.dedup();
            ids.len() == 100
        })
        .await;
        signal(child.id(), "TERM");
        child.wait().unwrap();
        let delivered: Vec<String> = consumer
            .delivered()
            .into_iter()
            .map(|p| p.webhook_id)
            .collect();
        let mut distinct = delivered.clone();
        distinct.sort();
        distinct.dedup();
        assert!(
            all,
            "{backend:?}: {} of 100 changes delivered",
            distinct.len()
        );
        let expected: Vec<String> = {
            let mut v: Vec<String> = (1..=100).map(|s| format!("chg_{s}")).collect();
            v.sort();
            v
        };
        assert_eq!(distinct, expected, "{backend:?}: no change skipped");
        println!(
            "{backend:?}: {} pushes for 100 changes ({} resent after the crash)",
            delivered.len(),
            delivered.len() - 100
        );
    }
}

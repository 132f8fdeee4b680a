//! `prove` (the release binary's command) against our own `serve` (every case passes,
//! both backends, probes in SQL) and against a deliberately wrong receiver written here
//! — check-then-act outside any transaction, no version guard, a slow answer — which
//! fails exactly the concurrent, burst and order cases, with evidence (probes over
//! HTTP). A probe that errors is reported as such; bad arguments exit 2.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use webhook_reconciler::config::{Scheme, WebhookSecret};
use webhook_reconciler::webhook::verify::Verifier;

use crate::helpers::process::bin;
use crate::helpers::{Backend, TestDb, both_backends, config_toml, spawn_app_with};

const SECRET: &str = "prove-secret-0123456789";

both_backends!(
    every_case_passes_against_serve,
    a_probe_that_fails_is_reported_as_a_probe_error_not_a_pass,
);

/// Signed as Stripe signs, to `serve`'s Stripe-scheme source (`billing`): every case
/// with a count passes; without a version probe the order case is skipped, not passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stripe_signed_cases_pass_against_serve_and_the_order_case_is_skipped_without_a_version_probe()
 {
    let db = TestDb::new(Backend::Sqlite);
    let db_url = db.url.clone();
    let app = spawn_app_with(db, &toml(&db_url)).await;
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("invoice.json");
    std::fs::write(
        &template,
        r#"{"id": "{event_id}", "object": "event", "type": "invoice.updated", "created": {created_unix}, "data": {"object": {"id": "{resource_id}", "status": "open"}}}"#,
    )
    .unwrap();
    let secret = dir.path().join("whsec.txt");
    std::fs::write(&secret, crate::helpers::STRIPE_SECRET).unwrap();
    let out = bin()
        .args(["prove", "--json", "--scheme", "stripe", "--url", &app.url("/webhooks/billing")])
        .args(["--secret-file", secret.to_str().unwrap(), "--template", template.to_str().unwrap()])
        .args(["--probe-db", &db_url, "--probe-sql"])
        .arg("select count(*) from processed_events where outcome = 'applied' and event_id = :event_id")
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let v = verdicts(&doc);
    assert_eq!(
        v.iter().filter(|(_, verdict)| verdict == "passed").count(),
        6,
        "{doc:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v[2].1, "skipped", "{doc:#}");
    assert_eq!(out.status.code(), Some(0));
}

/// `serve`'s test configuration with a source for the guide's refund event, versioned.
fn toml(url: &str) -> String {
    format!(
        r#"{}
[sources.refunds.webhook]
secrets = ["{SECRET}"]
[sources.refunds.kinds.refund]
version = "/version"
[sources.refunds.kinds.refund.events."refund.succeeded"]
id = "/data/refund_id"
version = "/data/version"
state = "/data"
"#,
        config_toml(url, "")
    )
}

/// Runs `prove --json` with `args`; (exit code, the JSON, stderr).
fn prove(dir: &std::path::Path, args: &[&str]) -> (i32, Value, String) {
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let out = bin()
        .arg("prove")
        .args([
            "--secret-file",
            secret.to_str().unwrap(),
            "--json",
            "--timeout",
            "20s",
        ])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), doc, stderr)
}

fn verdicts(doc: &Value) -> Vec<(String, String)> {
    doc["cases"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["verdict"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

async fn every_case_passes_against_serve(b: Backend) {
    let db = TestDb::new(b);
    let db_url = db.url.clone();
    let app = spawn_app_with(db, &toml(&db_url)).await;
    let dir = tempfile::tempdir().unwrap();
    let url = app.url("/webhooks/refunds");
    let (code, doc, stderr) = prove(
        dir.path(),
        &[
            "--url",
            &url,
            "--scheme",
            "seed",
            "--probe-db",
            &db_url,
            "--probe-sql",
            "select count(*) from changes where event_id = :event_id",
            "--probe-version-sql",
            "select version from resources where source = 'refunds' and id = :resource_id",
        ],
    );
    let v = verdicts(&doc);
    assert_eq!(v.len(), 7, "{doc:#}\n{stderr}");
    assert!(v.iter().all(|(_, verdict)| verdict == "passed"), "{doc:#}");
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains(&url), "it says where it sends: {stderr}");
    assert!(!stderr.contains(SECRET) && !doc.to_string().contains(SECRET));
    // The burst's 100 events and one of each other applying case (repeated, concurrent,
    // the newer of the order case, abandoned) were applied once each; the older update
    // is stale; the refused deliveries and the duplicates left nothing.
    assert_eq!(
        app.db
            .count("processed_events WHERE source = 'refunds' AND outcome = 'applied'"),
        100 + 4
    );
    assert_eq!(app.db.count("changes WHERE source = 'refunds'"), 100 + 4);
}

async fn a_probe_that_fails_is_reported_as_a_probe_error_not_a_pass(b: Backend) {
    let db = TestDb::new(b);
    let db_url = db.url.clone();
    let app = spawn_app_with(db, &toml(&db_url)).await;
    let dir = tempfile::tempdir().unwrap();
    let (code, doc, stderr) = prove(
        dir.path(),
        &[
            "--url",
            &app.url("/webhooks/refunds"),
            "--scheme",
            "hmac-sha256",
            "--probe-db",
            &db_url,
            "--probe-sql",
            "select count(*) from no_such_table where event_id = :event_id",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    for c in doc["cases"].as_array().unwrap() {
        let verdict = c["verdict"].as_str().unwrap();
        assert!(verdict == "probe_error" || verdict == "skipped", "{c}");
        if verdict == "probe_error" {
            assert!(
                c["evidence"].as_str().unwrap().contains("no_such_table"),
                "the cause is named: {c}"
            );
        }
    }
    assert_eq!(doc["ok"], false);
}

/// The wrong receiver's state: what a check-then-act handler keeps.
#[derive(Default)]
struct Wrong {
    seen: HashSet<String>,
    applied: HashMap<String, i64>,
    versions: HashMap<String, i64>,
}

type Shared = Arc<Mutex<Wrong>>;

async fn wrong_receiver(State(s): State<Shared>, headers: HeaderMap, body: String) -> StatusCode {
    let scheme = Scheme::HmacSha256 {
        signature_header: "X-Signature".into(),
        timestamp_header: "X-Signature-Timestamp".into(),
    };
    let verifier = Verifier::new(
        scheme,
        vec![WebhookSecret::from_bytes(SECRET.as_bytes().to_vec())],
        Duration::from_secs(300),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    if verifier.verify(&headers, body.as_bytes(), now).is_err() {
        return StatusCode::UNAUTHORIZED;
    }
    let event: Value = serde_json::from_str(&body).unwrap();
    let id = event["id"].as_str().unwrap().to_string();
    // "Have I seen this?" — then the work, then the record: no transaction, no lock.
    if s.lock().unwrap().seen.contains(&id) {
        return StatusCode::OK;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    {
        let mut w = s.lock().unwrap();
        w.seen.insert(id.clone());
        *w.applied.entry(id).or_default() += 1;
        // No version guard: the last write wins.
        let resource = event["data"]["refund_id"].as_str().unwrap().to_string();
        w.versions
            .insert(resource, event["data"]["version"].as_i64().unwrap());
    }
    // A slow answer.
    tokio::time::sleep(Duration::from_millis(300)).await;
    StatusCode::OK
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_receiver_fails_exactly_the_concurrent_burst_and_order_cases_with_evidence() {
    let state: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/webhooks", axum::routing::post(wrong_receiver))
        .route(
            "/count",
            axum::routing::get(
                |State(s): State<Shared>, Query(q): Query<HashMap<String, String>>| async move {
                    let n = s
                        .lock()
                        .unwrap()
                        .applied
                        .get(&q["event"])
                        .copied()
                        .unwrap_or(0);
                    axum::Json(json!({"count": n}))
                },
            ),
        )
        .route(
            "/version",
            axum::routing::get(
                |State(s): State<Shared>, Query(q): Query<HashMap<String, String>>| async move {
                    let v = s.lock().unwrap().versions.get(&q["resource"]).copied();
                    axum::Json(json!({"version": v}))
                },
            ),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let (code, doc, stderr) = tokio::task::spawn_blocking(move || {
        prove(
            dir.path(),
            &[
                "--url",
                &format!("http://{addr}/webhooks"),
                "--scheme",
                "seed",
                "--probe-url",
                &format!("http://{addr}/count?event={{event_id}}"),
                "--probe-version-url",
                &format!("http://{addr}/version?resource={{resource_id}}"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    let v = verdicts(&doc);
    let failed: Vec<&str> = v
        .iter()
        .filter(|(_, verdict)| verdict == "failed")
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(failed.len(), 3, "{doc:#}");
    assert!(failed[0].contains("concurrent"), "{failed:?}");
    assert!(failed[1].contains("older update"), "{failed:?}");
    assert!(failed[2].contains("burst"), "{failed:?}");
    assert_eq!(
        v.iter().filter(|(_, verdict)| verdict == "passed").count(),
        4,
        "{doc:#}"
    );
    let evidence = |part: &str| {
        doc["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"].as_str().unwrap().contains(part))
            .unwrap()["evidence"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        evidence("concurrent").contains("applied 3 time(s)"),
        "{}",
        evidence("concurrent")
    );
    assert!(
        evidence("older update").contains("holds version 4"),
        "{}",
        evidence("older update")
    );
    assert!(
        evidence("burst").contains("applied more than once"),
        "{}",
        evidence("burst")
    );
}

#[test]
fn bad_arguments_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let count = "http://127.0.0.1:9/count?e={event_id}";
    for (args, says) in [
        (
            vec!["--scheme", "paypal", "--probe-url", count],
            "standard-webhooks",
        ),
        (vec!["--scheme", "seed"], "--probe"),
        (
            vec![
                "--scheme",
                "seed",
                "--probe-url",
                "http://127.0.0.1:9/count",
            ],
            "{event_id}",
        ),
        (
            vec![
                "--scheme",
                "seed",
                "--signature-header",
                "X Sig",
                "--probe-url",
                count,
            ],
            "is not an HTTP header name",
        ),
    ] {
        let mut all = vec!["--url", "http://127.0.0.1:9/webhooks"];
        all.extend(args);
        let (code, _, stderr) = prove(dir.path(), &all);
        assert_eq!(code, 2, "{all:?}: {stderr}");
        assert!(stderr.contains(says), "{all:?}: {stderr}");
    }
}

/// A probe URL that answers without end is cut off at 64 KiB and reported as a probe
/// error; so is a receiver's endless answer read no further.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_endless_answer_is_cut_off_and_a_probe_that_sends_one_is_a_probe_error() {
    let endless = || async { "1".repeat(1024 * 1024) };
    let app = axum::Router::new()
        .route("/webhooks", axum::routing::post(endless))
        .route("/count", axum::routing::get(endless));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let (code, doc, stderr) = tokio::task::spawn_blocking(move || {
        prove(
            dir.path(),
            &[
                "--url",
                &format!("http://{addr}/webhooks"),
                "--scheme",
                "github",
                "--probe-url",
                &format!("http://{addr}/count?event={{event_id}}"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    for c in doc["cases"].as_array().unwrap() {
        let verdict = c["verdict"].as_str().unwrap();
        assert!(verdict == "probe_error" || verdict == "skipped", "{c}");
        if verdict == "probe_error" {
            assert!(
                c["evidence"]
                    .as_str()
                    .unwrap()
                    .contains("more than 65536 bytes"),
                "{c}"
            );
        }
    }
}

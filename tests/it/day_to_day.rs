//! Operating it day to day (SPEC "Operating it day to day"): dead letters retried after
//! the configuration is fixed and discarded, one resource explained, consumers rewound
//! and paused while `serve` runs, kinds paused for the one-shot command and for every
//! replica, and each admin route with and without the token.

use std::time::Duration;

use serde_json::{Value, json};
use webhook_reconciler::simulator::{SimSender, Style};

use crate::helpers::consumer::ConsumerApp;
use crate::helpers::process::{bin, write_config};
use crate::helpers::{Backend, TestDb, both_backends, eventually, spawn_app_with};
use crate::reconcile::{order_fields, reconcile_config, sim_with};

const ADMIN_TOKEN: &str = "admin-token-day-to-day-0123";

both_backends!(
    dead_letters_are_retried_after_the_fix_and_discarded_by_id_and_all,
    explain_shows_the_claims_changes_and_run_of_one_resource,
    a_rewound_consumer_gets_the_same_ids_again_and_a_paused_one_waits,
    a_paused_kind_is_skipped_by_the_one_shot_and_by_serve_until_resumed,
    every_admin_route_needs_the_token_and_answers_json,
);

fn order(event_id: &str, id: &str, version: i64, status: &str) -> Value {
    json!({
        "id": event_id,
        "type": "order.status_changed",
        "data": {"id": id, "version": version, "status": status, "amount": 4200},
    })
}

fn config(db: &TestDb, sim: &SimSender, extra_source: &str) -> String {
    reconcile_config(&db.url, sim, Style::Cursor, extra_source, "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\nadmin_token = \"{ADMIN_TOKEN}\""),
    )
}

/// Runs the binary with `config` and `args`; (exit code, stdout, stderr).
fn cli(dir: &tempfile::TempDir, config: &str, args: &[&str]) -> (i32, String, String) {
    let path = write_config(dir.path(), config);
    let out = bin()
        .arg("--config")
        .arg(&path)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

async fn dead_letters_are_retried_after_the_fix_and_discarded_by_id_and_all(b: Backend) {
    let sim = sim_with(Style::Cursor).await;
    let db = TestDb::new(b);
    let fixed = config(&db, &sim, "");
    // The mapping points at the wrong field: every order delivery is a dead letter.
    let broken = fixed.replace("version = \"/data/version\"", "version = \"/data/versoin\"");
    assert_ne!(broken, fixed);
    let app = spawn_app_with(db, &broken).await;
    // The newer version of o1 arrives first.
    let events = [
        order("e1", "o1", 2, "paid"),
        order("e2", "o1", 1, "created"),
        order("e3", "o2", 1, "created"),
        order("e4", "o3", 1, "created"),
    ];
    for e in &events {
        assert_eq!(app.deliver(e).await.0, 422, "{e}");
    }
    // These carry no `version` at all: under the fixed mapping still unreadable.
    for mut e in [order("e5", "o4", 1, "created"), order("e0", "o0", 1, "x")] {
        e["data"].as_object_mut().unwrap().remove("version");
        assert_eq!(app.deliver(&e).await.0, 422);
    }
    assert_eq!(app.db.count("dead_letters"), 6);
    assert_eq!(app.db.count("resources"), 0);

    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = cli(&dir, &fixed, &["dead-letters", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let listed = json_of(&out);
    assert_eq!(listed.as_array().unwrap().len(), 6, "{listed}");
    assert!(listed[0]["reason"].as_str().unwrap().contains("version"));
    assert!(!out.contains("\"body\""), "the list shows no body: {out}");

    let (code, out, err) = cli(&dir, &fixed, &["dead-letters", "discard", "e0"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("e0: discarded"), "{out}");
    let (code, out, _) = cli(&dir, &fixed, &["dead-letters", "retry", "--all", "--json"]);
    assert_eq!(code, 1, "one is still failing: {out}");
    let results = json_of(&out);
    let outcome = |id: &str| {
        results
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["event_id"] == id)
            .map(|r| r["outcome"].as_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert_eq!(outcome("e1"), "applied", "{results}");
    assert_eq!(
        outcome("e2"),
        "stale",
        "older than e1, retried after it: {results}"
    );
    assert_eq!(outcome("e3"), "applied");
    assert_eq!(outcome("e4"), "applied");
    assert_eq!(outcome("e5"), "failed");
    // Applied through the guarded write, with changes appended; only e5 is kept, with
    // one more attempt.
    assert_eq!(app.db.count("resources WHERE kind = 'order'"), 3);
    assert_eq!(app.db.count("resources WHERE id = 'o1' AND version = 2"), 1);
    assert_eq!(app.db.count("changes"), 3);
    assert_eq!(
        app.db
            .count("processed_events WHERE event_id = 'e2' AND outcome = 'stale'"),
        1
    );
    assert_eq!(app.db.count("dead_letters"), 1);
    assert_eq!(
        app.db
            .count("dead_letters WHERE event_id = 'e5' AND attempts = 2"),
        1
    );

    // Retried again, an applied one is a duplicate, never applied twice.
    app.db.execute(&format!(
        "INSERT INTO dead_letters (source, event_id, event_type, reason, body) \
         VALUES ('shop', 'e3', 'order.status_changed', 'kept twice', '{}')",
        order("e3", "o2", 1, "created")
    ));
    let (_, out, _) = cli(&dir, &fixed, &["dead-letters", "retry", "e3", "--json"]);
    assert_eq!(json_of(&out)[0]["outcome"], "duplicate", "{out}");
    assert_eq!(app.db.count("changes"), 3);

    // An id not kept is reported, and the exit code says so.
    let (code, out, _) = cli(&dir, &fixed, &["dead-letters", "retry", "nope"]);
    assert_eq!(code, 1);
    assert!(out.contains("nope: not_found"), "{out}");
    // Discard the rest.
    let (code, out, err) = cli(&dir, &fixed, &["dead-letters", "discard", "--all"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(app.db.count("dead_letters"), 0);
    // Neither ids nor --all: a usage error.
    let (code, _, _) = cli(&dir, &fixed, &["dead-letters", "retry"]);
    assert_eq!(code, 2);
}

async fn explain_shows_the_claims_changes_and_run_of_one_resource(b: Backend) {
    let sim = sim_with(Style::Cursor).await;
    let db = TestDb::new(b);
    let toml = config(&db, &sim, "");
    let app = spawn_app_with(db, &toml).await;
    assert_eq!(app.deliver(&order("c1", "o1", 1, "created")).await.0, 200);
    assert_eq!(app.deliver(&order("c2", "o1", 2, "paid")).await.0, 200);
    let (_, dup) = app.deliver(&order("c2", "o1", 2, "paid")).await;
    assert_eq!(dup["outcome"], "duplicate");
    let (_, stale) = app.deliver(&order("c3", "o1", 1, "created")).await;
    assert_eq!(stale["outcome"], "stale");
    // The sender moved on and its webhook was lost: the reconcile repairs it.
    sim.put("orders", "o1", 3, order_fields("shipped"));
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = cli(&dir, &toml, &["reconcile", "--kind", "order"]);
    assert_eq!(code, 0, "{out}{err}");

    let (code, out, err) = cli(&dir, &toml, &["explain", "shop", "order", "o1", "--json"]);
    assert_eq!(code, 0, "{err}");
    let x = json_of(&out);
    assert_eq!(x["row"]["version"], 3, "{x}");
    assert_eq!(x["row"]["origin"], "reconcile");
    let claims: Vec<(String, String)> = x["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["event_id"].as_str().unwrap().to_string(),
                c["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        claims,
        [
            ("c1".into(), "applied".into()),
            ("c2".into(), "applied".into()),
            ("c3".into(), "stale".into())
        ],
        "the duplicate claimed nothing: {x}"
    );
    let changes: Vec<(i64, String)> = x["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["version"].as_i64().unwrap(),
                c["origin"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            (1, "webhook".into()),
            (2, "webhook".into()),
            (3, "reconcile".into())
        ]
    );
    let runs = x["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{x}");
    assert_eq!(runs[0]["status"], "succeeded");
    assert!(runs[0]["applied"].as_i64().unwrap() >= 1);

    let (code, human, _) = cli(&dir, &toml, &["explain", "shop", "order", "o1"]);
    assert_eq!(code, 0);
    assert!(human.contains("events claimed for it (3)"), "{human}");
    assert!(
        human.contains("reconcile runs that wrote it (1)"),
        "{human}"
    );
    // A kind the source does not have is named, exit 2.
    let (code, _, err) = cli(&dir, &toml, &["explain", "shop", "parcel", "o1"]);
    assert_eq!(code, 2);
    assert!(err.contains("parcel") && err.contains("order"), "{err}");
}

async fn a_rewound_consumer_gets_the_same_ids_again_and_a_paused_one_waits(b: Backend) {
    let sim = sim_with(Style::Cursor).await;
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let toml = config(&db, &sim, "") + &consumer.config("app", "");
    let app = spawn_app_with(db, &toml).await;
    for i in 1..=10 {
        let e = order(&format!("r{i}"), &format!("o{i}"), 1, "created");
        assert_eq!(app.deliver(&e).await.0, 200);
    }
    let ids = |c: &ConsumerApp| -> Vec<String> {
        c.delivered().into_iter().map(|p| p.webhook_id).collect()
    };
    assert!(
        eventually(Duration::from_secs(20), || async {
            ids(&consumer).len() == 10
        })
        .await
    );
    let dir = tempfile::tempdir().unwrap();
    let (code, out, err) = cli(&dir, &toml, &["consumers", "rewind", "app", "--to", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("10 -> 3"), "{out}");
    // The running serve pushes 4..10 again, under the same ids.
    assert!(
        eventually(Duration::from_secs(20), || async {
            ids(&consumer).len() == 17
        })
        .await,
        "{:?}",
        ids(&consumer)
    );
    let again: Vec<String> = ids(&consumer)[10..].to_vec();
    let want: Vec<String> = (4..=10).map(|s| format!("chg_{s}")).collect();
    let mut sorted = again.clone();
    sorted.sort_by_key(|s| s[4..].parse::<i64>().unwrap());
    assert_eq!(sorted, want);
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db
                .scalar("SELECT position AS n FROM consumer_positions")
                == 10
        })
        .await
    );

    // Pause: new changes wait, the position stays; resume: they arrive.
    let (code, _, _) = cli(&dir, &toml, &["consumers", "pause", "app"]);
    assert_eq!(code, 0);
    let (_, listed, _) = cli(&dir, &toml, &["consumers", "list", "--json"]);
    assert_eq!(json_of(&listed)[0]["paused"], true, "{listed}");
    // The pause shows where a stuck consumer's does (its alert and dashboard).
    let metrics = || async {
        app.client
            .get(app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert!(
        eventually(Duration::from_secs(5), || async {
            metrics()
                .await
                .contains("feed_consumer_paused{consumer=\"app\"} 1")
        })
        .await,
        "{}",
        metrics().await
    );
    let ready: serde_json::Value = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["consumers"]["app"]["paused"], true, "{ready}");
    for i in 11..=12 {
        let e = order(&format!("r{i}"), &format!("o{i}"), 1, "created");
        assert_eq!(app.deliver(&e).await.0, 200);
    }
    // Nothing to wait for when nothing should happen: a second is four of the
    // pusher's polls.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ids(&consumer).len(), 17, "pushed while paused");
    assert_eq!(
        app.db
            .scalar("SELECT position AS n FROM consumer_positions"),
        10
    );
    let (_, listed, _) = cli(&dir, &toml, &["consumers", "list", "--json"]);
    assert_eq!(json_of(&listed)[0]["lag"]["waiting"], 2, "{listed}");
    let (code, _, _) = cli(&dir, &toml, &["consumers", "resume", "app"]);
    assert_eq!(code, 0);
    assert!(
        eventually(Duration::from_secs(20), || async {
            ids(&consumer).len() == 19
        })
        .await
    );

    // A rewind below what retention kept is refused naming the oldest kept seq; one
    // past the end too; an unknown consumer is named.
    app.db.execute("DELETE FROM changes WHERE seq <= 5");
    let (code, _, err) = cli(&dir, &toml, &["consumers", "rewind", "app", "--to", "2"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("oldest kept is 6") && err.contains("rewind to 5"),
        "{err}"
    );
    let (code, _, err) = cli(&dir, &toml, &["consumers", "rewind", "app", "--to", "99"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = cli(&dir, &toml, &["consumers", "pause", "nobody"]);
    assert_eq!(code, 2);
    assert!(err.contains("nobody"), "{err}");
}

async fn a_paused_kind_is_skipped_by_the_one_shot_and_by_serve_until_resumed(b: Backend) {
    let sim = sim_with(Style::Cursor).await;
    for i in 0..5 {
        sim.put("orders", &format!("o{i}"), 1, order_fields("created"));
        sim.put("refunds", &format!("re{i}"), 0, json!({"amount": 100}));
    }
    let db = TestDb::new(b);
    let toml = config(&db, &sim, "");
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = cli(&dir, &toml, &["migrate"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = cli(&dir, &toml, &["reconcile", "pause", "shop", "order"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("shop/order: paused"), "{out}");
    let (_, shown, _) = cli(&dir, &toml, &["status"]);
    assert!(shown.contains("paused: shop/order since"), "{shown}");

    // The one-shot command: `paused` in its report, exit 0, nothing requested for it.
    let (code, out, err) = cli(&dir, &toml, &["reconcile", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let reports = json_of(&out);
    let status = |kind: &str| {
        reports
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == kind)
            .map(|r| r["status"].as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|| format!("{reports}"))
    };
    assert_eq!(status("order"), "paused", "{reports}");
    assert_eq!(status("refund"), "succeeded");
    assert_eq!(db.count("resources WHERE kind = 'order'"), 0);
    assert_eq!(db.count("resources WHERE kind = 'refund'"), 5);

    // serve (two replicas on PostgreSQL) on a one-second schedule.
    let scheduled = config(&db, &sim, "").replace(
        "[sources.shop.reconcile]",
        "[sources.shop.reconcile]\nevery = \"1s\"\nrun_at_start = true\njitter = \"0s\"",
    );
    let mut replicas = Vec::new();
    let n = if b == Backend::Postgres { 2 } else { 1 };
    for _ in 0..n {
        let config = webhook_reconciler::config::Config::from_toml_str(&scheduled).unwrap();
        let app = webhook_reconciler::app::Application::build(config)
            .await
            .unwrap();
        replicas.push(tokio::spawn(async move {
            let _ = app.run_until(std::future::pending()).await;
        }));
    }
    // A new refund shows the schedule running; the paused orders stay unreconciled.
    sim.put("refunds", "re9", 0, json!({"amount": 9}));
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count("resources WHERE kind = 'refund'") == 6
        })
        .await
    );
    let runs_of_refund = db.count("reconcile_runs WHERE kind = 'refund'");
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count("reconcile_runs WHERE kind = 'refund'") >= runs_of_refund + 2
        })
        .await
    );
    assert_eq!(db.count("resources WHERE kind = 'order'"), 0);
    assert_eq!(db.count("reconcile_runs WHERE kind = 'order'"), 0);

    let (code, out, _) = cli(&dir, &toml, &["reconcile", "resume", "shop", "order"]);
    assert_eq!(code, 0);
    assert!(out.contains("shop/order: resumed"), "{out}");
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count("resources WHERE kind = 'order'") == 5
        })
        .await
    );
    // Pausing a kind the source does not have is refused, naming it.
    let (code, _, err) = cli(&dir, &toml, &["reconcile", "pause", "shop", "parcel"]);
    assert_eq!(code, 2);
    assert!(err.contains("parcel"), "{err}");
    for r in replicas {
        r.abort();
    }
}

async fn every_admin_route_needs_the_token_and_answers_json(b: Backend) {
    let sim = sim_with(Style::Cursor).await;
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let toml = config(&db, &sim, "") + &consumer.config("app", "");
    let broken = toml.replace("version = \"/data/version\"", "version = \"/data/versoin\"");
    let app = spawn_app_with(db, &broken).await;
    assert_eq!(app.deliver(&order("a1", "o1", 1, "created")).await.0, 422);
    assert_eq!(app.deliver(&order("a2", "o2", 1, "created")).await.0, 422);

    let call = |method: &str, path: &str, body: Option<Value>, token: bool| {
        let mut req = app.client.request(method.parse().unwrap(), app.url(path));
        if token {
            req = req.bearer_auth(ADMIN_TOKEN);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let routes: Vec<(&str, &str, Option<Value>)> = vec![
        ("GET", "/admin/dead-letters", None),
        ("GET", "/admin/explain/shop/order/o1", None),
        ("GET", "/admin/consumers", None),
        ("POST", "/admin/consumers/app/pause", None),
        ("POST", "/admin/consumers/app/resume", None),
        (
            "POST",
            "/admin/consumers/app/rewind",
            Some(json!({"to": 0})),
        ),
        (
            "POST",
            "/admin/reconcile/pause",
            Some(json!({"source": "shop", "kind": "order"})),
        ),
        (
            "POST",
            "/admin/reconcile/resume",
            Some(json!({"source": "shop"})),
        ),
        (
            "POST",
            "/admin/dead-letters/discard",
            Some(json!({"ids": ["a2"]})),
        ),
        (
            "POST",
            "/admin/dead-letters/retry",
            Some(json!({"all": true})),
        ),
    ];
    for (method, path, body) in &routes {
        let (status, answer) = call(method, path, body.clone(), false).await;
        assert_eq!(status, 401, "{method} {path} without the token: {answer}");
    }
    assert_eq!(
        app.db.count("dead_letters"),
        2,
        "nothing happened without the token"
    );
    // The token is checked before anything of the request is read: a query string the
    // route cannot parse is a 401 without the token, a 400 with it.
    let (status, answer) = call("GET", "/admin/dead-letters?limit=many", None, false).await;
    assert_eq!(status, 401, "{answer}");
    assert!(answer["error"].is_string(), "{answer}");
    let (status, _) = call("GET", "/admin/dead-letters?limit=many", None, true).await;
    assert_eq!(status, 400);
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("admin_unauthorized_total"),
        "wrong tokens are counted"
    );
    for (method, path, body) in &routes {
        let (status, answer) = call(method, path, body.clone(), true).await;
        assert_eq!(status, 200, "{method} {path}: {answer}");
        assert!(answer.is_object(), "{method} {path}: {answer}");
    }
    // The retry ran a1 under the still-broken mapping: kept, with one more attempt.
    assert_eq!(
        app.db
            .count("dead_letters WHERE event_id = 'a1' AND attempts = 2"),
        1
    );
    assert_eq!(app.db.count("dead_letters WHERE event_id = 'a2'"), 0);
    assert_eq!(
        app.db.count("reconcile_paused"),
        1,
        "order paused; the source's resume is another row"
    );

    // Mistakes are 400/404 with a reason, never 500.
    let (status, answer) = call("POST", "/admin/consumers/nobody/pause", None, true).await;
    assert_eq!(status, 404, "{answer}");
    let (status, _) = call(
        "POST",
        "/admin/dead-letters/retry",
        Some(json!({"idz": []})),
        true,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call(
        "POST",
        "/admin/consumers/app/rewind",
        Some(json!({"to": 999})),
        true,
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call("GET", "/admin/explain/shop/parcel/o1", None, true).await;
    assert_eq!(status, 404);
}

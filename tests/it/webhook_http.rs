//! The webhook endpoint over real HTTP, on both backends: every row of SPEC's HTTP table.

use std::time::Duration;

use serde_json::{Value, json};
use webhook_reconciler::signature as sign;

use crate::helpers::proxy::Proxy;
use crate::helpers::{
    Backend, GITHUB_SECRET, SHOP_OLD_SECRET, STDWH_KEY, STRIPE_SECRET, TestApp, TestDb,
    both_backends, eventually, now, order_event, refund_event, spawn_app, spawn_app_on,
};

both_backends!(
    the_same_signed_body_posted_three_times_gives_one_row,
    three_concurrent_identical_deliveries_give_one_applied_and_two_duplicates,
    an_out_of_order_update_over_http_is_answered_stale_and_discarded,
    a_burst_of_200_concurrent_deliveries_half_duplicates_applies_exactly_100,
    unauthentic_deliveries_get_401_and_write_nothing,
    each_signature_scheme_is_accepted_end_to_end,
    bad_input_gets_a_clear_status_and_writes_nothing,
    a_mapped_field_missing_gets_422_and_a_dead_letter,
    an_unmapped_event_type_is_acknowledged_as_ignored,
    equal_version_with_another_state_is_answered_conflict,
    health_and_readiness_answer,
);

async fn the_same_signed_body_posted_three_times_gives_one_row(b: Backend) {
    let app = spawn_app(b).await;
    let body = refund_event("evt_9tX2mLq7Rk3vBn5cWd8pYs1a", "re_1")
        .to_string()
        .into_bytes();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let r = app.post_shop_raw(body.clone()).await;
        assert_eq!(r.status(), 200);
        outcomes.push(r.json::<Value>().await.unwrap()["outcome"].clone());
    }
    assert_eq!(
        outcomes,
        [json!("applied"), json!("duplicate"), json!("duplicate")]
    );
    assert_eq!(app.db.count("resources WHERE kind = 'refund'"), 1);
}

async fn three_concurrent_identical_deliveries_give_one_applied_and_two_duplicates(b: Backend) {
    let app = std::sync::Arc::new(spawn_app(b).await);
    let event = refund_event("evt_concurrent", "re_1");
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (app, event) = (app.clone(), event.clone());
            tokio::spawn(async move { app.deliver(&event).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200);
        outcomes.push(body["outcome"].as_str().unwrap().to_string());
    }
    outcomes.sort();
    assert_eq!(outcomes, ["applied", "duplicate", "duplicate"]);
    assert_eq!(app.db.count("resources"), 1);
}

async fn an_out_of_order_update_over_http_is_answered_stale_and_discarded(b: Backend) {
    let app = spawn_app(b).await;
    assert_eq!(
        app.deliver(&order_event("evt_b", "ord_42", 5, "delivered"))
            .await
            .1["outcome"],
        "applied"
    );
    assert_eq!(
        app.deliver(&order_event("evt_a", "ord_42", 4, "shipped"))
            .await
            .1["outcome"],
        "stale"
    );
    let row = app.db.resource("shop", "order", "ord_42").unwrap();
    assert_eq!(
        (row.version, row.state_json()["status"].clone()),
        (5, json!("delivered"))
    );
}

async fn a_burst_of_200_concurrent_deliveries_half_duplicates_applies_exactly_100(b: Backend) {
    use rand::seq::SliceRandom;
    let app = std::sync::Arc::new(spawn_app(b).await);
    let events: Vec<Value> = (0..100)
        .map(|i| refund_event(&format!("evt_{i}"), &format!("re_{i}")))
        .collect();
    let mut burst: Vec<Value> = events.iter().chain(events.iter()).cloned().collect();
    burst.shuffle(&mut rand::rng());
    let tasks: Vec<_> = burst
        .into_iter()
        .map(|e| {
            let app = app.clone();
            tokio::spawn(async move { app.deliver(&e).await })
        })
        .collect();
    let mut applied = 0;
    let mut duplicate = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert_eq!(status, 200, "{body}");
        match body["outcome"].as_str().unwrap() {
            "applied" => applied += 1,
            "duplicate" => duplicate += 1,
            other => panic!("unexpected outcome {other}"),
        }
    }
    assert_eq!((applied, duplicate), (100, 100));
    assert_eq!(app.db.count("resources WHERE kind = 'refund'"), 100);
    assert_eq!(app.db.count("processed_events"), 100);
}

async fn unauthentic_deliveries_get_401_and_write_nothing(b: Backend) {
    let app = spawn_app(b).await;
    let body = refund_event("evt_1", "re_1").to_string();
    let url = app.url("/webhooks/shop");
    let post = |sig: Option<String>, ts: Option<i64>| {
        let mut r = app.client.post(&url).body(body.clone());
        if let Some(sig) = sig {
            r = r.header("X-Signature", sig);
        }
        if let Some(ts) = ts {
            r = r.header("X-Signature-Timestamp", ts.to_string());
        }
        r.send()
    };
    let t = now();
    let cases = [
        (
            "wrong secret",
            Some(sign::hmac_sha256(b"not-the-secret", t, body.as_bytes())),
            Some(t),
        ),
        ("missing signature", None, Some(t)),
        (
            "missing timestamp",
            Some(sign::hmac_sha256(
                crate::helpers::SHOP_SECRET.as_bytes(),
                t,
                body.as_bytes(),
            )),
            None,
        ),
        (
            "timestamp too old",
            Some(sign::hmac_sha256(
                crate::helpers::SHOP_SECRET.as_bytes(),
                t - 600,
                body.as_bytes(),
            )),
            Some(t - 600),
        ),
        (
            "timestamp in the future",
            Some(sign::hmac_sha256(
                crate::helpers::SHOP_SECRET.as_bytes(),
                t + 600,
                body.as_bytes(),
            )),
            Some(t + 600),
        ),
        (
            "signature for another timestamp",
            Some(sign::hmac_sha256(
                crate::helpers::SHOP_SECRET.as_bytes(),
                t - 1,
                body.as_bytes(),
            )),
            Some(t),
        ),
    ];
    for (name, sig, ts) in cases {
        let r = post(sig, ts).await.unwrap();
        assert_eq!(r.status(), 401, "{name}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{name}: {body}"
        );
    }
    assert_eq!(app.db.count("processed_events"), 0);
    assert_eq!(app.db.count("resources"), 0);
    assert_eq!(app.db.count("dead_letters"), 0);
    // The previous secret still works while a rotation is under way.
    let r = post(
        Some(sign::hmac_sha256(
            SHOP_OLD_SECRET.as_bytes(),
            t,
            body.as_bytes(),
        )),
        Some(t),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
}

async fn each_signature_scheme_is_accepted_end_to_end(b: Backend) {
    let app = spawn_app(b).await;
    let t = now();

    let stripe = json!({"id": "evt_s1", "type": "invoice.updated", "created": 1785319200, "data": {"object": {"id": "in_1", "status": "paid"}}}).to_string();
    let r = app
        .client
        .post(app.url("/webhooks/billing"))
        .header(
            "Stripe-Signature",
            sign::stripe(STRIPE_SECRET.as_bytes(), t, stripe.as_bytes()),
        )
        .body(stripe.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let inv = app.db.resource("billing", "invoice", "in_1").unwrap();
    assert_eq!(
        inv.version, 1_785_319_200_000_000,
        "unix seconds become microseconds"
    );

    // Standard Webhooks: the event id may come from the webhook-id header alone.
    let std_body = json!({"type": "customer.updated", "data": {"id": "cus_1", "updated_at": "2026-07-29T10:00:00.250Z", "name": "Ada"}}).to_string();
    let r = app
        .client
        .post(app.url("/webhooks/crm"))
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", t.to_string())
        .header(
            "webhook-signature",
            sign::standard_webhooks(STDWH_KEY, "msg_1", t, std_body.as_bytes()),
        )
        .body(std_body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.db.resource("crm", "customer", "cus_1").unwrap().version,
        1_785_319_200_250_000
    );
    assert_eq!(
        app.db.event_outcome("crm", "msg_1").as_deref(),
        Some("applied")
    );

    // GitHub: no timestamp; id and type come from X-GitHub-Delivery / X-GitHub-Event.
    let gh = json!({"action": "opened", "issue": {"id": 1347, "updated_at": "2026-07-29T10:00:00Z", "title": "bug"}}).to_string();
    let r = app
        .client
        .post(app.url("/webhooks/gh"))
        .header("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
        .header("X-GitHub-Event", "issues")
        .header(
            "X-Hub-Signature-256",
            sign::github(GITHUB_SECRET.as_bytes(), gh.as_bytes()),
        )
        .body(gh.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        app.db.resource("gh", "issue", "1347").unwrap().state_json()["title"],
        "bug"
    );

    // Each scheme refuses a body signed with the wrong secret.
    let r = app
        .client
        .post(app.url("/webhooks/billing"))
        .header(
            "Stripe-Signature",
            sign::stripe(b"whsec_wrong", t, stripe.as_bytes()),
        )
        .body(stripe)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .client
        .post(app.url("/webhooks/crm"))
        .header("webhook-id", "msg_2")
        .header("webhook-timestamp", t.to_string())
        .header(
            "webhook-signature",
            sign::standard_webhooks(b"wrong key", "msg_2", t, std_body.as_bytes()),
        )
        .body(std_body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = app
        .client
        .post(app.url("/webhooks/gh"))
        .header("X-GitHub-Delivery", "d2")
        .header("X-GitHub-Event", "issues")
        .header("X-Hub-Signature-256", sign::github(b"wrong", gh.as_bytes()))
        .body(gh)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(app.db.count("processed_events"), 3);
}

async fn bad_input_gets_a_clear_status_and_writes_nothing(b: Backend) {
    let app = spawn_app(b).await;
    let cases: [(&str, Vec<u8>, u16); 6] = [
        ("not JSON", b"{not json".to_vec(), 400),
        ("JSON but not an object", b"[1,2]".to_vec(), 400),
        (
            "no id",
            br#"{"type":"order.status_changed","data":{}}"#.to_vec(),
            400,
        ),
        ("no type", br#"{"id":"e1","data":{}}"#.to_vec(), 400),
        ("empty body", Vec::new(), 400),
        (
            "over max_body (64KiB)",
            {
                let mut v = br#"{"id":"big","type":"x","pad":""#.to_vec();
                v.extend(std::iter::repeat_n(b'a', 70 * 1024));
                v.extend(b"\"}");
                v
            },
            413,
        ),
    ];
    for (name, body, want) in cases {
        let r = app.post_shop_raw(body).await;
        assert_eq!(r.status(), want, "{name}");
        let body: Value = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("{name}: error body is not JSON: {e}"));
        assert!(body["error"].is_string(), "{name}: {body}");
    }
    // Not POST, or a path nobody configured: JSON errors too. A client of their own:
    // the 413 above was answered before its body was read and that connection closed,
    // and the shared client's pool could hand it to the next request (a broken pipe,
    // seen once on SQLite).
    let client = reqwest::Client::new();
    let r = client.get(app.url("/webhooks/shop")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let r = client
        .post(app.url("/webhooks/nobody"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    assert_eq!(
        app.db.count("processed_events") + app.db.count("resources") + app.db.count("dead_letters"),
        0
    );
}

async fn a_mapped_field_missing_gets_422_and_a_dead_letter(b: Backend) {
    let app = spawn_app(b).await;
    let no_version = json!({"id": "evt_nv", "type": "order.status_changed", "data": {"order_id": "o1", "status": "paid"}});
    let bad_type = json!({"id": "evt_bt", "type": "order.status_changed", "data": {"order_id": {"x": 1}, "version": 1}});
    for (event, needle) in [(&no_version, "version"), (&bad_type, "id")] {
        let (status, body) = app.deliver(event).await;
        assert_eq!(status, 422, "{body}");
        assert!(body["error"].as_str().unwrap().contains(needle), "{body}");
    }
    // A retry of the same broken event updates its dead letter instead of adding one.
    assert_eq!(app.deliver(&no_version).await.0, 422);
    assert_eq!(app.db.count("dead_letters"), 2);
    assert_eq!(
        app.db.scalar(
            "SELECT CAST(attempts AS BIGINT) AS n FROM dead_letters WHERE event_id = 'evt_nv'"
        ),
        2
    );
    assert_eq!(
        app.db.count("processed_events") + app.db.count("resources"),
        0,
        "a dead letter is not claimed"
    );
}

async fn an_unmapped_event_type_is_acknowledged_as_ignored(b: Backend) {
    let app = spawn_app(b).await;
    let e = json!({"id": "evt_u", "type": "customer.created", "data": {}});
    assert_eq!(app.deliver(&e).await, (200, json!({"outcome": "ignored"})));
    assert_eq!(
        app.deliver(&e).await,
        (200, json!({"outcome": "duplicate"}))
    );
    assert_eq!(app.db.count("resources"), 0);
}

async fn equal_version_with_another_state_is_answered_conflict(b: Backend) {
    let app = spawn_app(b).await;
    app.deliver(&order_event("e1", "o1", 3, "paid")).await;
    assert_eq!(
        app.deliver(&order_event("e2", "o1", 3, "refunded")).await,
        (200, json!({"outcome": "conflict"}))
    );
    assert_eq!(
        app.db.resource("shop", "order", "o1").unwrap().state_json()["status"],
        "paid"
    );
}

async fn health_and_readiness_answer(b: Backend) {
    let app = spawn_app(b).await;
    let r = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.json::<Value>().await.unwrap();
    assert_eq!(body["database"], "ok");
    // Memory as the allocators count it: the Rust heap's figures, and on SQLite the
    // heap SQLite holds for its open connections (none on PostgreSQL).
    let memory = &body["memory"];
    assert!(memory["allocated_bytes"].is_u64() && memory["resident_bytes"].is_u64());
    match b {
        Backend::Sqlite => assert!(memory["sqlite_bytes"].as_i64().unwrap() > 0),
        Backend::Postgres => assert!(memory.get("sqlite_bytes").is_none()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_postgresql_gone_deliveries_get_503_and_apply_once_it_is_back_without_restart() {
    let db = TestDb::new(Backend::Postgres);
    let proxy = Proxy::start(crate::helpers::db::pg_addr().await).await;
    let name = db.pg_name.clone().unwrap();
    let via_proxy = format!("postgres://postgres@{}/{name}", proxy.addr);
    let app: TestApp = spawn_app_on(db, &via_proxy, "").await;

    assert_eq!(app.deliver(&refund_event("e_before", "re_0")).await.0, 200);
    proxy.down();
    let r = app.post_shop(&refund_event("e_down", "re_1")).await;
    assert_eq!(r.status(), 503);
    assert!(
        r.headers().get("retry-after").is_some(),
        "503 must carry Retry-After"
    );
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "not ready while the database is gone");
    let r = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "alive all the same");

    let opened_before = app.pools().await["main"]["opened_total"].as_u64().unwrap();
    proxy.up();
    // The sender's retry: the same event, applied once the database is back.
    let back = eventually(Duration::from_secs(20), || async {
        app.deliver(&refund_event("e_down", "re_1")).await.0 == 200
    })
    .await;
    assert!(
        back,
        "deliveries did not recover after the database came back"
    );
    assert_eq!(app.db.count("resources"), 2);
    assert_eq!(
        app.db.event_outcome("shop", "e_down").as_deref(),
        Some("applied")
    );
    // The connections the outage broke were retired, not kept: new ones were opened.
    let opened_after = app.pools().await["main"]["opened_total"].as_u64().unwrap();
    assert!(
        opened_after > opened_before,
        "{opened_before} -> {opened_after}"
    );
}

/// A sender's retry of an event this process claimed is answered `duplicate` from
/// memory (`webhook::recent`), so it is acknowledged even while the database is gone;
/// an id another replica claimed goes to the database, as does every new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_of_an_event_this_process_claimed_is_answered_without_the_database() {
    let db = TestDb::new(Backend::Postgres);
    let proxy = Proxy::start(crate::helpers::db::pg_addr().await).await;
    let via_proxy = format!(
        "postgres://postgres@{}/{}",
        proxy.addr,
        db.pg_name.clone().unwrap()
    );
    let other = db.alias();
    let a: TestApp = spawn_app_on(db, &via_proxy, "").await;
    let b: TestApp = spawn_app_on(other, &via_proxy, "").await;
    let e1 = refund_event("evt_claimed_by_a", "re_1");
    assert_eq!(a.deliver(&e1).await, (200, json!({"outcome": "applied"})));
    assert_eq!(
        b.deliver(&e1).await,
        (200, json!({"outcome": "duplicate"})),
        "the other replica learns it from the database"
    );

    proxy.down();
    assert_eq!(
        a.deliver(&e1).await,
        (200, json!({"outcome": "duplicate"})),
        "the replica that claimed it answers without the database"
    );
    let e2 = refund_event("evt_new", "re_2");
    assert_eq!(a.post_shop(&e2).await.status(), 503, "a new event needs it");
    assert_eq!(
        b.post_shop(&e1).await.status(),
        503,
        "an id the database called a duplicate is not kept: its claim may be old"
    );

    proxy.up();
    let back = eventually(Duration::from_secs(20), || async {
        a.deliver(&e2).await == (200, json!({"outcome": "applied"}))
    })
    .await;
    assert!(
        back,
        "the new event was not applied once the database was back"
    );
    assert_eq!(a.db.count("resources"), 2);
    assert_eq!(a.db.count("processed_events"), 2);
    assert_eq!(
        a.db.event_outcome("shop", "evt_claimed_by_a").as_deref(),
        Some("applied")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_sqlite_file_locked_by_another_writer_deliveries_get_503_then_apply() {
    let db = TestDb::new(Backend::Sqlite);
    let url = db.url.clone();
    let app = spawn_app_on(db, &url, "busy_timeout = \"200ms\"").await;
    assert_eq!(app.deliver(&refund_event("e0", "re_0")).await.0, 200);
    let lock = app.db.lock_sqlite();
    for _ in 0..3 {
        let r = app.post_shop(&refund_event("e1", "re_1")).await;
        assert_eq!(r.status(), 503);
        assert!(r.headers().get("retry-after").is_some());
    }
    // A retry of what this process claimed needs no write (`webhook::recent`).
    assert_eq!(
        app.deliver(&refund_event("e0", "re_0")).await,
        (200, json!({"outcome": "duplicate"}))
    );
    drop(lock);
    assert_eq!(
        app.deliver(&refund_event("e1", "re_1")).await,
        (200, json!({"outcome": "applied"}))
    );
    assert_eq!(app.db.count("resources"), 2);
    // A lock held elsewhere says nothing against the writer connection: it is kept
    // (reopening frees its page cache and fills another, and RSS stepped up each time).
    let writer = &app.pools().await["writer"];
    assert_eq!(
        (writer["open"].as_u64(), writer["opened_total"].as_u64()),
        (Some(1), Some(1)),
        "{writer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_max_in_flight_deliveries_get_503_at_once_and_apply_when_retried() {
    let app =
        crate::helpers::sqlite_app_with_http("busy_timeout = \"20s\"", "max_in_flight = 2").await;
    let lock = app.db.lock_sqlite();
    // Two deliveries wait on the locked file; they hold both places.
    let waiting: Vec<_> = (1..=2)
        .map(|i| {
            let body = refund_event(&format!("e{i}"), &format!("re_{i}")).to_string();
            let ts = now();
            let sig =
                sign::hmac_sha256(crate::helpers::SHOP_SECRET.as_bytes(), ts, body.as_bytes());
            let req = app
                .client
                .post(app.url("/webhooks/shop"))
                .header("X-Signature", sig)
                .header("X-Signature-Timestamp", ts.to_string())
                .body(body);
            tokio::spawn(req.send())
        })
        .collect();
    let full = eventually(Duration::from_secs(10), || async {
        let r = app.client.get(app.url("/readyz")).send().await.unwrap();
        r.json::<Value>().await.unwrap()["queues"]["writes_in_flight"] == 2
    })
    .await;
    assert!(full, "/readyz never showed the two deliveries in flight");
    let started = std::time::Instant::now();
    let r = app.post_shop(&refund_event("e3", "re_3")).await;
    assert_eq!(r.status(), 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not after the busy timeout"
    );
    assert!(r.headers().get("retry-after").is_some());
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("http.max_in_flight"),
        "{body}"
    );
    drop(lock);
    for w in waiting {
        assert_eq!(w.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(
        app.deliver(&refund_event("e3", "re_3")).await,
        (200, json!({"outcome": "applied"}))
    );
    assert_eq!(app.db.count("resources"), 3);
    assert_eq!(app.db.count("processed_events"), 3);
}

//! Signed deliveries that are hostile (SPEC "Input limits"): numbers that expand a
//! thousandfold once written out, versions pinned in the far future. Each is refused
//! the same way on both backends, stores nothing, and stalls nothing after it.

use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, TestDb, both_backends, config_toml, spawn_app_with};

both_backends!(
    a_number_bomb_is_a_422_stores_nothing_and_900_kb_states_keep_flowing,
    numbers_read_back_the_same_on_both_backends_as_postgresql_prints_them,
    a_timestamp_version_ten_years_ahead_is_a_422_and_the_next_legitimate_one_applies,
);

const TOKEN: &str = "pull-token-123";

async fn app_with_large_bodies(b: Backend) -> TestApp {
    let db = TestDb::new(b);
    let toml = config_toml(&db.url, "").replace(
        "max_body = \"64KiB\"",
        &format!("max_body = \"1MiB\"\nchanges_token = \"{TOKEN}\""),
    );
    spawn_app_with(db, &toml).await
}

fn order_with(event_id: &str, data: Value) -> Value {
    json!({"id": event_id, "type": "order.status_changed", "data": data})
}

/// Every change after `after`, page by page through `GET /changes`; the size of each
/// page as well.
async fn pull_all(app: &TestApp, mut after: i64) -> (Vec<Value>, Vec<usize>) {
    let (mut all, mut pages) = (Vec::new(), Vec::new());
    loop {
        let r = app
            .client
            .get(app.url(&format!("/changes?after={after}&limit=100")))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        let changes = body["changes"].as_array().unwrap().clone();
        if changes.is_empty() {
            return (all, pages);
        }
        pages.push(changes.len());
        after = body["next_after"].as_i64().unwrap();
        all.extend(changes);
    }
}

async fn a_number_bomb_is_a_422_stores_nothing_and_900_kb_states_keep_flowing(b: Backend) {
    let app = app_with_large_bodies(b).await;
    // 9 KB on the wire, 131 MB once written out.
    let bomb = format!(
        r#"{{"id":"evt-bomb","type":"order.status_changed","data":{{"order_id":"bomb","version":1,"n":[{}]}}}}"#,
        vec!["1e131071"; 1000].join(",")
    );
    let r = app.post_shop_raw(bomb.into_bytes()).await;
    assert_eq!(r.status(), 422);
    let reply: Value = r.json().await.unwrap();
    assert!(
        reply["error"].as_str().unwrap().contains("http.max_body"),
        "{reply}"
    );
    assert_eq!(app.db.count("resources"), 0);
    assert_eq!(app.db.count("changes"), 0);
    assert_eq!(app.db.count("dead_letters"), 1);

    // Ten states of 900 KB each: every one is pulled, a few per read.
    for i in 0..10 {
        let (status, reply) = app
            .deliver(&order_with(
                &format!("evt-big-{i}"),
                json!({"order_id": format!("big-{i}"), "version": 1, "blob": "x".repeat(900_000)}),
            ))
            .await;
        assert_eq!((status, reply["outcome"].as_str()), (200, Some("applied")));
    }
    let (all, pages) = pull_all(&app, 0).await;
    let ids: Vec<&str> = all.iter().map(|c| c["id"].as_str().unwrap()).collect();
    let expected: Vec<String> = (0..10).map(|i| format!("big-{i}")).collect();
    assert_eq!(ids, expected);
    assert!(
        pages.len() > 1 && pages.iter().all(|n| *n <= 5),
        "reads bounded in bytes: {pages:?}"
    );
}

async fn numbers_read_back_the_same_on_both_backends_as_postgresql_prints_them(b: Backend) {
    let app = app_with_large_bodies(b).await;
    let body = r#"{"id":"evt-n","type":"order.status_changed","data":{"order_id":"n1","version":1,"a":1e3,"b":-0.0,"c":1.50,"d":-12.340e1}}"#;
    let r = app.post_shop_raw(body.as_bytes().to_vec()).await;
    assert_eq!(r.status(), 200);
    let (all, _) = pull_all(&app, 0).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        serde_json::to_string(&all[0]["state"]).unwrap(),
        r#"{"a":1000,"b":0.0,"c":1.50,"d":-123.40,"order_id":"n1","version":1}"#
    );
}

async fn a_timestamp_version_ten_years_ahead_is_a_422_and_the_next_legitimate_one_applies(
    b: Backend,
) {
    let app = app_with_large_bodies(b).await;
    let shipment = |event_id: &str, at: chrono::DateTime<chrono::Utc>| {
        json!({"id": event_id, "type": "shipment.updated",
               "data": {"shipment_id": "sh_1", "updated_at": at.to_rfc3339(), "status": "sent"}})
    };
    let ahead = chrono::Utc::now() + chrono::Duration::days(3650);
    let (status, reply) = app.deliver(&shipment("evt-future", ahead)).await;
    assert_eq!(status, 422, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("max_version_ahead"),
        "{reply}"
    );
    assert_eq!(app.db.count("resources"), 0);
    let (status, reply) = app.deliver(&shipment("evt-now", chrono::Utc::now())).await;
    assert_eq!((status, reply["outcome"].as_str()), (200, Some("applied")));
    assert_eq!(app.db.count("resources"), 1);
}

both_backends!(
    a_signed_shopify_product_resent_as_an_order_is_a_422_and_writes_no_order,
    a_github_and_a_shopify_body_replayed_300_times_with_fresh_ids_are_duplicates,
);

use webhook_reconciler::simulator::providers::{Provider, Webhook};

/// `hook` with its header `name` set to `value`.
fn with_header(hook: &Webhook, name: &str, value: &str) -> Webhook {
    let mut forged = hook.clone();
    forged
        .headers
        .retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    forged.headers.push((name.to_string(), value.to_string()));
    forged
}

async fn a_signed_shopify_product_resent_as_an_order_is_a_422_and_writes_no_order(b: Backend) {
    let (app, _reconciler, sim) = crate::senders::setup(b, "shop", Provider::Shopify, 50).await;
    let product = sim.change("products", "7", json!({"title": "Mug"}), "products/update");
    // Captured and resent: same signed body, another topic, a fresh id.
    let forged = with_header(
        &with_header(&product, "X-Shopify-Topic", "orders/paid"),
        "X-Shopify-Webhook-Id",
        "forged-1",
    );
    assert_eq!(
        crate::senders::post(&app, "/webhooks/shop", &forged).await,
        422
    );
    assert_eq!(
        app.db.count("resources"),
        0,
        "no order row, no customer row"
    );
    assert_eq!(
        app.db.count("changes"),
        0,
        "nothing pushed to the application"
    );
    assert_eq!(app.db.count("dead_letters"), 1);
    let reason = &app.db.dead_letter_reasons()[0].1;
    assert!(reason.contains("gid://shopify/Order/"), "{reason}");
    // The real delivery still applies.
    assert_eq!(
        crate::senders::post(&app, "/webhooks/shop", &product).await,
        200
    );
    assert_eq!(app.db.count("resources WHERE kind = 'product'"), 1);
}

async fn a_github_and_a_shopify_body_replayed_300_times_with_fresh_ids_are_duplicates(b: Backend) {
    for (provider, collection, what, id_header) in [
        (Provider::Github, "issues", "edited", "X-GitHub-Delivery"),
        (
            Provider::Shopify,
            "orders",
            "orders/updated",
            "X-Shopify-Webhook-Id",
        ),
    ] {
        let (app, _reconciler, sim) = crate::senders::setup(b, "src", provider, 50).await;
        let hook = sim.change(collection, "42", json!({"note": "first"}), what);
        assert_eq!(
            crate::senders::post(&app, "/webhooks/src", &hook).await,
            200
        );
        let mut replies = Vec::new();
        for i in 0..300 {
            let replay = with_header(&hook, id_header, &format!("fresh-{i}"));
            let r = app
                .client
                .post(app.url("/webhooks/src"))
                .header("Content-Type", "application/json");
            let r = replay
                .headers
                .iter()
                .fold(r, |r, (k, v)| r.header(k, v))
                .body(replay.body.clone())
                .send()
                .await
                .unwrap();
            replies.push((r.status().as_u16(), r.json::<Value>().await.unwrap()));
        }
        assert!(
            replies
                .iter()
                .all(|(s, body)| *s == 200 && body["outcome"] == "duplicate"),
            "{provider:?}: {:?}",
            replies
                .iter()
                .find(|(s, b)| *s != 200 || b["outcome"] != "duplicate")
        );
        assert_eq!(
            app.db.count("processed_events"),
            1,
            "{provider:?}: one claim row for one body"
        );
    }
}

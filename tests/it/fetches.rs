//! A 200 promises what follows it: a Shopify delivery answered `fetching` is kept in
//! `pending_fetches` in its claim's transaction and fetched from the shop's own API by
//! any process, fairly across shops, retried until the shop answers, and never lost to
//! a full buffer, SIGTERM or `kill -9`. Against simulated Shopify shops (real HTTP
//! servers, one per shop) and the real binary where a process must die.

use std::time::{Duration, Instant};

use secrecy::SecretString;
use serde_json::{Value, json};
use webhook_reconciler::simulator::providers::{Provider, ProviderSim, Webhook};

use crate::helpers::process::{bin, signal, write_migrated_config};
use crate::helpers::{Backend, TestApp, TestDb, both_backends, eventually, spawn_app_with};

const SHOPIFY_SECRET: &str = "shpss_one_app_many_shops";
/// 32 bytes in base64: the test's accounts.key.
const ACCOUNTS_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const NEVER: &str = "0 0 0 1 1 *";

fn shop(n: usize) -> String {
    format!("shop-{n}.myshopify.com")
}

/// A Shopify app source; `rps` is each shop's request budget (`None`: the preset's, 2).
fn shopify_config(db_url: &str, rps: Option<u32>) -> String {
    let rps = rps.map_or(String::new(), |r| format!("requests_per_second = {r}"));
    format!(
        r#"
[database]
url = "{db_url}"
max_connections = 8

[http]
listen = "127.0.0.1:0"

[accounts]
key = "{ACCOUNTS_KEY}"

[sources.shopify]
preset = "shopify"
{rps}

[sources.shopify.webhook]
secrets = ["{SHOPIFY_SECRET}"]

[sources.shopify.reconcile]
cron = "{NEVER}"
run_at_start = false
# A failing shop's request is not retried within one fetch: the fetch's own backoff is
# what the tests watch.
max_attempts = 1

[sources.shopify.accounts]
# The shops are simulators on this machine.
api_bases = ["http://127.0.0.1:*/"]

# These tests watch fetches one at a time (a restart between them, fairness, exactly
# one request each); fetches in batches (get_many) are tests/it/tenants.rs's.
[sources.shopify.kinds.order]
get_many_size = 1
"#
    )
}

async fn register(app: &TestApp, toml: &str, shops: &[(&str, &ProviderSim)]) {
    let life = webhook_reconciler::operations::Operations::new(
        std::sync::Arc::new(webhook_reconciler::config::Config::from_toml_str(toml).unwrap()),
        crate::helpers::store_on(&app.db).await,
    );
    for (name, sim) in shops {
        life.add_account(
            "shopify",
            name,
            Some(sim.api_base()),
            Some(SecretString::from(format!("shpat_{name}"))),
        )
        .await
        .unwrap();
    }
}

/// The delivery `hook` as the shop `name` sends it (its webhook id made unique across
/// the simulated shops, as Shopify's are).
fn from_shop(hook: &Webhook, name: &str) -> Webhook {
    let mut hook = hook.clone();
    hook.event_id = format!("{name}-{}", hook.event_id);
    hook.headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case("X-Shopify-Shop-Domain")
            && !k.eq_ignore_ascii_case("X-Shopify-Webhook-Id")
    });
    hook.headers
        .push(("X-Shopify-Shop-Domain".into(), name.to_string()));
    hook.headers
        .push(("X-Shopify-Webhook-Id".into(), hook.event_id.clone()));
    hook
}

/// Waits until every registered shop's first sync (started by `accounts add`) is done,
/// so that what the tests see written was fetched, not listed.
async fn first_syncs_done(db: &TestDb) {
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count("reconcile_due") > 0
                && db.count("reconcile_due WHERE status <> 'succeeded'") == 0
        })
        .await,
        "first syncs did not finish"
    );
}

async fn post(client: &reqwest::Client, url: &str, hook: &Webhook) -> (u16, Value) {
    let mut req = client.post(url).header("Content-Type", "application/json");
    for (k, v) in &hook.headers {
        req = req.header(k, v);
    }
    let r = req.body(hook.body.clone()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn order(note: &str) -> Value {
    json!({"note": note, "financial_status": "paid"})
}

/// The order's note as stored under `account`, if the row exists.
fn stored_note(db: &TestDb, account: &str, id: &str) -> Option<String> {
    let expr = match db.backend {
        Backend::Postgres => "state->>'note'",
        Backend::Sqlite => "json_extract(state, '$.note')",
    };
    let row = format!("resources WHERE account = '{account}' AND kind = 'order' AND id = '{id}'");
    if db.count(&row) == 0 {
        return None;
    }
    for candidate in ["first", "second", "third"] {
        if db.count(&format!(
            "resources WHERE account = '{account}' AND kind = 'order' AND id = '{id}' AND {expr} = '{candidate}'"
        )) == 1
        {
            return Some(candidate.into());
        }
    }
    Some("(other)".into())
}

both_backends!(
    a_fetching_delivery_is_claimed_with_its_resource_and_kept_until_the_shop_answers,
    one_shop_with_a_thousand_pending_delays_another_shops_delivery_by_at_most_one_fetch,
);

/// The claim records `fetching` with the account, kind and resource; the fetch is kept
/// in `pending_fetches` while the shop fails (its attempts and error visible), is
/// retried with backoff, and once the shop answers the write names the delivery and
/// the pending row is gone.
async fn a_fetching_delivery_is_claimed_with_its_resource_and_kept_until_the_shop_answers(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = shopify_config(&db.url, Some(100));
    let app = spawn_app_with(db, &toml).await;
    let name = shop(1);
    register(&app, &toml, &[(&name, &sim)]).await;
    first_syncs_done(&app.db).await;
    sim.fail_account("", true);
    let hook = from_shop(
        &sim.change("orders", "1001", order("first"), "orders/updated"),
        &name,
    );
    let (status, body) = post(&app.client, &app.url("/webhooks/shopify"), &hook).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("fetching")));
    let claim = format!(
        "processed_events WHERE event_id = '{}' AND outcome = 'fetching' AND account = '{name}' \
         AND kind = 'order' AND resource_id = '1001'",
        hook.event_id
    );
    assert_eq!(app.db.count(&claim), 1, "the claim names its resource");
    // The shop fails: the fetch stays pending, retried with backoff (1 s, then 2 s).
    assert!(
        eventually(Duration::from_secs(15), || async {
            app.db.count(
                "pending_fetches WHERE kind = 'order' AND id = '1001' AND attempts >= 2 \
                 AND error IS NOT NULL AND failed_at IS NULL",
            ) == 1
        })
        .await,
        "a failing fetch is retried and kept"
    );
    assert_eq!(stored_note(&app.db, &name, "1001"), None);
    // `explain` tells the story so far: the claim, then the fetch still to do.
    let dir = tempfile::tempdir().unwrap();
    let config = crate::helpers::process::write_config(dir.path(), &toml);
    let explain = |id: &str| {
        let out = bin()
            .arg("--config")
            .arg(&config)
            .args([
                "explain",
                "shopify",
                "order",
                id,
                "--account",
                &name,
                "--json",
            ])
            .output()
            .unwrap();
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), json)
    };
    let (code, story) = explain("1001");
    assert_eq!(code, Some(0), "{story}");
    assert_eq!(story["claims"][0]["outcome"], "fetching", "{story}");
    assert_eq!(story["pending_fetch"]["reason"], "fetching", "{story}");
    assert_eq!(
        story["pending_fetch"]["event_id"],
        hook.event_id.as_str(),
        "{story}"
    );
    assert!(story["pending_fetch"]["error"].is_string(), "{story}");
    assert!(story["row"].is_null(), "{story}");
    let (code, story) = explain("9999");
    assert_eq!(code, Some(1), "nothing known of it: {story}");
    let status = bin()
        .arg("--config")
        .arg(&config)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["fetches"][0]["source"], "shopify", "{status}");
    assert_eq!(status["fetches"][0]["pending"], 1, "{status}");
    assert_eq!(status["fetches"][0]["failed"], 0, "{status}");
    let readyz: Value = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(readyz["fetches"][0]["source"], "shopify", "{readyz}");
    assert_eq!(readyz["fetches"][0]["pending"], 1, "{readyz}");
    // The shop recovers: the order is written, naming the delivery, and the row goes.
    sim.fail_account("", false);
    assert!(
        eventually(Duration::from_secs(15), || async {
            stored_note(&app.db, &name, "1001").is_some()
        })
        .await,
        "fetched once the shop answers"
    );
    assert_eq!(
        stored_note(&app.db, &name, "1001").as_deref(),
        Some("first")
    );
    assert_eq!(
        app.db.count(&format!(
            "resources WHERE id = '1001' AND origin = 'webhook' AND last_event_id = '{}'",
            hook.event_id
        )),
        1,
        "the write names the delivery that asked"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            app.db.count("pending_fetches") == 0
        })
        .await
    );
    assert_eq!(
        app.db.count(&format!(
            "changes WHERE id = '1001' AND account = '{name}' AND origin = 'webhook' AND event_id = '{}'",
            hook.event_id
        )),
        1,
        "the change names the delivery too"
    );
    let (code, story) = explain("1001");
    assert_eq!(code, Some(0), "{story}");
    assert!(story["pending_fetch"].is_null(), "{story}");
    assert_eq!(
        story["changes"][0]["event_id"],
        hook.event_id.as_str(),
        "{story}"
    );
}

/// With a thousand fetches pending for one shop (a bulk edit) at the preset's budget
/// of 2 requests a second, another shop's single delivery is fetched within 2 s: the
/// database hands out one fetch per shop at a time, shops in turn.
async fn one_shop_with_a_thousand_pending_delays_another_shops_delivery_by_at_most_one_fetch(
    b: Backend,
) {
    let busy = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let quiet = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = shopify_config(&db.url, None);
    let app = spawn_app_with(db, &toml).await;
    let (busy_name, quiet_name) = (shop(1), shop(2));
    register(&app, &toml, &[(&busy_name, &busy), (&quiet_name, &quiet)]).await;
    first_syncs_done(&app.db).await;
    let url = app.url("/webhooks/shopify");
    let hooks: Vec<Webhook> = (0..1000)
        .map(|i| {
            from_shop(
                &busy.change(
                    "orders",
                    &format!("{}", 5000 + i),
                    order("first"),
                    "orders/updated",
                ),
                &busy_name,
            )
        })
        .collect();
    // Delivered by 8 clients at once, as a sender's workers would.
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in hooks.chunks(125) {
        let (client, url, chunk) = (app.client.clone(), url.clone(), chunk.to_vec());
        tasks.spawn(async move {
            for h in &chunk {
                let (status, body) = post(&client, &url, h).await;
                assert_eq!((status, body["outcome"].as_str()), (200, Some("fetching")));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(app.db.count("pending_fetches") > 900);
    let hook = from_shop(
        &quiet.change("orders", "1", order("first"), "orders/updated"),
        &quiet_name,
    );
    let sent = Instant::now();
    let (status, _) = post(&app.client, &url, &hook).await;
    assert_eq!(status, 200);
    assert!(
        eventually(Duration::from_secs(2), || async {
            stored_note(&app.db, &quiet_name, "1").is_some()
        })
        .await,
        "the quiet shop's order was not fetched within 2 s of its delivery"
    );
    let took = sent.elapsed();
    let waiting = app
        .db
        .count(&format!("pending_fetches WHERE account = '{busy_name}'"));
    assert!(
        waiting > 900,
        "the busy shop still had {waiting} waiting when the quiet shop's order was written"
    );
    // At most one fetch of the busy shop is in flight at any moment.
    assert!(
        app.db.count(&format!(
            "pending_fetches WHERE account = '{busy_name}' AND taken_by IS NOT NULL"
        )) <= 1
    );
    eprintln!(
        "quiet shop's order written {took:?} after its delivery, {waiting} of the busy shop's waiting"
    );
}

/// Two replicas share the pending fetches of three shops: every order is written and
/// fetched exactly once (never by both replicas).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_pending_fetches_and_fetch_each_once() {
    let sims = [
        ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
            .await
            .unwrap(),
        ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
            .await
            .unwrap(),
        ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
            .await
            .unwrap(),
    ];
    let db = TestDb::new(Backend::Postgres);
    let toml = shopify_config(&db.url, Some(200));
    let other = db.alias();
    let one = spawn_app_with(db, &toml).await;
    let two = spawn_app_with(other, &toml).await;
    let names: Vec<String> = (1..=3).map(shop).collect();
    register(
        &one,
        &toml,
        &[
            (&names[0], &sims[0]),
            (&names[1], &sims[1]),
            (&names[2], &sims[2]),
        ],
    )
    .await;
    first_syncs_done(&one.db).await;
    let gets_before: Vec<u64> = sims.iter().map(ProviderSim::get_requests).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (s, (sim, name)) in sims.iter().zip(&names).enumerate() {
        for i in 0..30 {
            let hook = from_shop(
                &sim.change(
                    "orders",
                    &format!("{i}"),
                    json!({"note": "first", "shop": name}),
                    "orders/updated",
                ),
                name,
            );
            // Deliveries alternate between the replicas.
            let app = if (s + i) % 2 == 0 { &one } else { &two };
            let (client, url) = (app.client.clone(), app.url("/webhooks/shopify"));
            tasks.spawn(async move { post(&client, &url, &hook).await });
        }
    }
    while let Some(r) = tasks.join_next().await {
        let (status, body) = r.unwrap();
        assert_eq!((status, body["outcome"].as_str()), (200, Some("fetching")));
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            one.db.count("resources WHERE kind = 'order'") == 90
                && one.db.count("pending_fetches") == 0
        })
        .await,
        "every order written: {} rows, {} pending",
        one.db.count("resources WHERE kind = 'order'"),
        one.db.count("pending_fetches")
    );
    for (sim, before) in sims.iter().zip(gets_before) {
        assert_eq!(
            sim.get_requests() - before,
            30,
            "each order fetched exactly once"
        );
    }
}

/// `serve` stopped (SIGTERM or `kill -9`) one second after 20 deliveries, at the
/// preset's 2 requests a second: most fetches are still pending. Restarted with the
/// sweep far away, every order is equal to the shop's within 30 s.
async fn fetches_survive_the_process(b: Backend, sig: &str) {
    let sim = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let dir = tempfile::tempdir().unwrap();
    let port = crate::helpers::process::free_port();
    let toml = shopify_config(&db.url, None).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config = write_migrated_config(dir.path(), &toml);
    let name = shop(1);
    let added = bin()
        .arg("--config")
        .arg(&config)
        .args([
            "accounts",
            "add",
            "shopify",
            &name,
            "--api-base",
            &sim.api_base(),
            "--token-env",
            "SHOP_TOKEN",
        ])
        .env("SHOP_TOKEN", "shpat_one")
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let start = || {
        bin()
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(crate::helpers::process::Running)
            .unwrap()
    };
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/webhooks/shopify");
    let up = |client: reqwest::Client| async move {
        eventually(Duration::from_secs(20), || {
            let client = client.clone();
            async move {
                client
                    .get(format!("http://127.0.0.1:{port}/healthz"))
                    .send()
                    .await
                    .is_ok()
            }
        })
        .await
    };
    let mut child = start();
    assert!(up(client.clone()).await, "serve did not start");
    first_syncs_done(&db).await;
    let hooks: Vec<Webhook> = (0..20)
        .map(|i| {
            from_shop(
                &sim.change("orders", &format!("{i}"), order("first"), "orders/updated"),
                &name,
            )
        })
        .collect();
    // The shop changed each order again since these deliveries were signed: the fetch,
    // not the body, is the truth.
    for i in 0..20 {
        sim.change("orders", &format!("{i}"), order("second"), "orders/updated");
    }
    for h in &hooks {
        let (status, body) = post(&client, &url, h).await;
        assert_eq!((status, body["outcome"].as_str()), (200, Some("fetching")));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(child.id(), sig);
    let status = child.wait().unwrap();
    if sig == "TERM" {
        assert!(status.success(), "SIGTERM exits 0: {status:?}");
    }
    let pending = db.count("pending_fetches");
    assert!(
        pending >= 10,
        "only {pending} fetches were left for the restart"
    );
    if sig == "TERM" {
        assert_eq!(
            db.count("pending_fetches WHERE taken_by IS NOT NULL"),
            0,
            "SIGTERM releases what it had taken"
        );
    }
    let restarted = Instant::now();
    let mut child = start();
    let all_equal = eventually(Duration::from_secs(30), || async {
        (0..20).all(|i| stored_note(&db, &name, &i.to_string()).as_deref() == Some("second"))
    })
    .await;
    let took = restarted.elapsed();
    signal(child.id(), "TERM");
    let _ = child.wait();
    assert!(
        all_equal,
        "after {took:?}: {} of 20 orders equal to the shop's, {} fetches pending",
        (0..20)
            .filter(|i| stored_note(&db, &name, &i.to_string()).as_deref() == Some("second"))
            .count(),
        db.count("pending_fetches")
    );
    assert_eq!(db.count("pending_fetches"), 0);
    eprintln!(
        "{sig}: {pending} fetches pending at the stop, all 20 orders equal {took:?} after the restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_pending_at_sigterm_are_done_after_the_restart_on_postgres() {
    fetches_survive_the_process(Backend::Postgres, "TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_pending_at_sigterm_are_done_after_the_restart_on_sqlite() {
    fetches_survive_the_process(Backend::Sqlite, "TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_pending_at_kill_9_are_done_after_the_restart_on_postgres() {
    fetches_survive_the_process(Backend::Postgres, "KILL").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_pending_at_kill_9_are_done_after_the_restart_on_sqlite() {
    fetches_survive_the_process(Backend::Sqlite, "KILL").await;
}

/// Fetches finishing together share one transaction; one whose state the database
/// refuses (PostgreSQL's jsonb refuses `\u0000`) fails alone and stays pending, and the
/// others are written, each with its change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_fetched_state_the_database_refuses_fails_alone_in_its_group() {
    use webhook_reconciler::change::{Change, ResourceKey};
    use webhook_reconciler::config::Action;
    use webhook_reconciler::store::{FetchReason, Guard};
    let db = TestDb::new(Backend::Postgres);
    let store = crate::helpers::store_on(&db).await;
    let keys: Vec<ResourceKey> = (0..8)
        .map(|i| ResourceKey::new("shop", &format!("acct_{i}"), "order", "o1").to_owned())
        .collect();
    store
        .request_fetches(keys, FetchReason::Fetching)
        .await
        .unwrap();
    let taken = store
        .take_fetches("test-holder", 100, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(taken.len(), 8, "one per account");
    let writes: Vec<_> = taken
        .into_iter()
        .map(|f| {
            let store = store.clone();
            let bad = f.account == "acct_3";
            let state = if bad {
                r#"{"note":"\u0000"}"#.to_string()
            } else {
                json!({"note": "fine"}).to_string()
            };
            let change = Change {
                source: f.source.clone(),
                account: f.account.clone(),
                kind: f.kind.clone(),
                id: f.id.clone(),
                version: 1,
                state: Some(state),
                action: Action::Upsert,
            };
            tokio::spawn(async move {
                let written = store
                    .apply_fetched(f, Some(change), Guard::NewerOrDifferent)
                    .await;
                (bad, written)
            })
        })
        .collect();
    for w in writes {
        match w.await.unwrap() {
            (true, written) => assert!(written.is_err(), "{written:?}"),
            (false, written) => assert!(written.unwrap(), "written"),
        }
    }
    assert_eq!(db.count("resources"), 7);
    assert_eq!(db.count("changes"), 7);
    assert_eq!(
        db.count("pending_fetches WHERE account = 'acct_3'"),
        1,
        "the refused fetch is kept"
    );
    assert_eq!(db.count("pending_fetches"), 1);
}

//! Real senders through their presets, against simulated Stripe, GitHub and Shopify
//! APIs (real HTTP servers in the test, `simulator::providers`): webhooks with loss,
//! duplicates and reordering, then reconcile (and Stripe's catch-up) converge; fetch-time
//! versions; the providers' rate limits honoured before they refuse.
//!
//! Longer than 500 lines on purpose: one scenario per provider behaviour, all sharing the
//! fixtures at the top (configuration, delivery with faults, the convergence check).

use std::sync::Arc;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use webhook_reconciler::reconcile::{KindReport, Reconciler, RunOptions, RunStatus};
use webhook_reconciler::simulator::providers::{Provider, ProviderSim, Webhook};

use crate::helpers::{Backend, TestApp, TestDb, both_backends, eventually, spawn_app_with};
use crate::reconcile::reconciler_for;

const STRIPE_WHSEC: &str = "whsec_c3RyaXBlLXNpbXVsYXRvci1zZWNyZXQ";
const GITHUB_HOOK_SECRET: &str = "github-hook-secret";
const SHOPIFY_HOOK_SECRET: &str = "shpss_simulated";
/// Writing `cron` drops the preset's `every`; January 1st keeps the schedule out of the
/// test's way (runs are started by the test).
const NEVER: &str = "0 0 0 1 1 *";

fn config(db_url: &str, name: &str, preset: &str, sim: &ProviderSim, page_size: u32) -> String {
    let secret = match preset {
        "stripe" => STRIPE_WHSEC,
        "github" => GITHUB_HOOK_SECRET,
        _ => SHOPIFY_HOOK_SECRET,
    };
    let catchup = if preset == "stripe" {
        format!("[sources.{name}.catchup]\ncron = \"{NEVER}\"\n")
    } else {
        String::new()
    };
    format!(
        r#"
[database]
url = "{db_url}"
max_connections = 8

[http]
listen = "127.0.0.1:0"

[sources.{name}]
preset = "{preset}"
api_base = "{base}"
api_token = "tok_{preset}_secret"
requests_per_second = 200

[sources.{name}.webhook]
secrets = ["{secret}"]

[sources.{name}.reconcile]
cron = "{NEVER}"
run_at_start = false
lease_ttl = "10s"
page_size = {page_size}
{catchup}"#,
        base = sim.api_base(),
    )
}

pub(crate) async fn setup(
    b: Backend,
    name: &str,
    provider: Provider,
    page_size: u32,
) -> (TestApp, Reconciler, ProviderSim) {
    let secret = match provider {
        Provider::Stripe => STRIPE_WHSEC,
        Provider::Github => GITHUB_HOOK_SECRET,
        Provider::Shopify => SHOPIFY_HOOK_SECRET,
    };
    let preset = match provider {
        Provider::Stripe => "stripe",
        Provider::Github => "github",
        Provider::Shopify => "shopify",
    };
    let sim = ProviderSim::start(provider, secret).await.unwrap();
    let db = TestDb::new(b);
    let toml = config(&db.url, name, preset, &sim, page_size);
    let reconciler = reconciler_for(&toml).await;
    let app = spawn_app_with(db, &toml).await;
    (app, reconciler, sim)
}

pub(crate) async fn run(r: &Reconciler, source: &str, kind: &str) -> KindReport {
    let (s, k) = r
        .kinds(Some(source), Some(kind))
        .into_iter()
        .next()
        .map(|(s, k)| (s.clone(), k.clone()))
        .unwrap_or_else(|| panic!("no kind {source}/{kind}"));
    r.run_kind(
        &s,
        &k,
        &RunOptions::default(),
        &CancellationToken::new(),
        &|_| {},
    )
    .await
}

fn succeeded(report: &KindReport) {
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
}

pub(crate) async fn post(app: &TestApp, path: &str, hook: &Webhook) -> u16 {
    let mut req = app
        .client
        .post(app.url(path))
        .header("Content-Type", "application/json");
    for (k, v) in &hook.headers {
        req = req.header(k, v);
    }
    req.body(hook.body.clone())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Delivers `hooks` the way senders do: about a fifth lost, a fifth sent twice, all
/// reordered, eight at a time. Returns the event ids never delivered.
async fn deliver_with_faults(
    app: &TestApp,
    path: &str,
    hooks: &[Webhook],
    seed: u64,
) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut sends = Vec::new();
    let mut lost = Vec::new();
    for h in hooks {
        if rng.random_bool(0.2) {
            lost.push(h.event_id.clone());
            continue;
        }
        sends.push(h.clone());
        if rng.random_bool(0.2) {
            sends.push(h.clone());
        }
    }
    sends.shuffle(&mut rng);
    let app_url = app.url(path);
    for chunk in sends.chunks(8) {
        let mut set = JoinSet::new();
        for h in chunk.iter().cloned() {
            let client = app.client.clone();
            let url = app_url.clone();
            set.spawn(async move {
                let mut req = client.post(url).header("Content-Type", "application/json");
                for (k, v) in &h.headers {
                    req = req.header(k, v);
                }
                req.body(h.body).send().await.unwrap().status().as_u16()
            });
        }
        while let Some(status) = set.join_next().await {
            assert_eq!(status.unwrap(), 200, "every delivery is answered 200");
        }
    }
    lost
}

/// Asserts the live local rows of `kind` are exactly the sender's objects.
fn assert_converged(
    db: &TestDb,
    source: &str,
    kind: &str,
    objects: &std::collections::BTreeMap<String, Value>,
) {
    assert_eq!(
        db.count(&format!(
            "resources WHERE source = '{source}' AND kind = '{kind}' AND NOT deleted"
        )),
        objects.len() as i64,
        "{kind}: live rows"
    );
    for (id, object) in objects {
        let row = db
            .resource(source, kind, id)
            .unwrap_or_else(|| panic!("{kind}/{id} missing locally"));
        assert!(!row.deleted, "{kind}/{id} deleted");
        assert_eq!(&row.state_json(), object, "{kind}/{id} state");
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

both_backends!(
    stripe_webhooks_with_faults_then_reconcile_and_catch_up_converge,
    a_missed_customer_updated_is_repaired_by_the_next_reconcile,
    a_listing_fetched_in_the_same_second_as_an_event_is_settled_through_get,
    catch_up_of_a_delivered_event_is_a_duplicate_and_of_a_lost_one_applies_it,
    github_converges_and_parallel_kinds_share_its_quota_without_being_refused,
    shopify_converges_within_its_call_bucket_and_finds_deletions_by_sweeping,
);

/// The Stripe history of the first test: customers and payment intents created and
/// updated, one sender second per change.
fn stripe_history(sim: &ProviderSim, start: i64) -> (Vec<Webhook>, i64) {
    let mut hooks = Vec::new();
    let mut t = start;
    let mut tick = |sim: &ProviderSim| {
        t += 1;
        sim.set_clock(Some(t));
    };
    for i in 0..12 {
        tick(sim);
        let id = format!("cus_{i:04}");
        hooks.push(sim.change(
            "customers",
            &id,
            json!({"email": format!("c{i}@example.com"), "balance": 0}),
            "customer.created",
        ));
    }
    for i in 0..6 {
        tick(sim);
        let id = format!("pi_{i:04}");
        hooks.push(sim.change(
            "payment_intents",
            &id,
            json!({"amount": 1000 + i, "currency": "eur", "status": "requires_payment_method"}),
            "payment_intent.created",
        ));
    }
    for round in 1..=3 {
        for i in (0..12).filter(|i| i % round == 0) {
            tick(sim);
            hooks.push(sim.change(
                "customers",
                &format!("cus_{i:04}"),
                json!({"balance": round * 100}),
                "customer.updated",
            ));
        }
        for i in 0..6 {
            tick(sim);
            let status = ["processing", "requires_capture", "succeeded"][round as usize - 1];
            hooks.push(
                sim.change(
                    "payment_intents",
                    &format!("pi_{i:04}"),
                    json!({"status": status}),
                    format!(
                        "payment_intent.{}",
                        if round == 3 {
                            "succeeded"
                        } else {
                            "processing"
                        }
                    )
                    .as_str(),
                ),
            );
        }
    }
    (hooks, t)
}

async fn stripe_webhooks_with_faults_then_reconcile_and_catch_up_converge(b: Backend) {
    let (app, r, sim) = setup(b, "stripe", Provider::Stripe, 5).await;
    let (hooks, last) = stripe_history(&sim, now() - 600);
    let lost = deliver_with_faults(&app, "/webhooks/stripe", &hooks, 11).await;
    assert!(!lost.is_empty(), "the seed loses some deliveries");
    // The listing is read seconds after the last change.
    sim.set_clock(Some(last + 5));
    for kind in [
        "customer",
        "payment_intent",
        "subscription",
        "invoice",
        "charge",
        "refund",
        "product",
        "price",
    ] {
        succeeded(&run(&r, "stripe", kind).await);
    }
    assert_converged(&app.db, "stripe", "customer", &sim.objects("customers"));
    assert_converged(
        &app.db,
        "stripe",
        "payment_intent",
        &sim.objects("payment_intents"),
    );
    // An unchanged account: a later fetch time alone is no change.
    sim.set_clock(Some(last + 60));
    let again = run(&r, "stripe", "customer").await;
    succeeded(&again);
    assert_eq!(
        (again.counts.scanned, again.counts.applied),
        (12, 0),
        "{again:?}"
    );
    // Catch-up: every event listed; those delivered are duplicates, the lost ones are
    // stale (the reconcile already wrote a later state).
    let catchup = run(&r, "stripe", "$catchup").await;
    succeeded(&catchup);
    assert_eq!(catchup.counts.scanned, hooks.len() as i64);
    assert_eq!(
        catchup.counts.equal,
        (hooks.len() - lost.len()) as i64,
        "{catchup:?}"
    );
    assert_eq!(catchup.counts.newer_local, lost.len() as i64, "{catchup:?}");
    assert_eq!(catchup.counts.applied, 0);
    assert_eq!(
        app.db.count("processed_events WHERE source = 'stripe'"),
        hooks.len() as i64,
        "every event claimed exactly once"
    );
    assert_converged(&app.db, "stripe", "customer", &sim.objects("customers"));
    // The token went to the sender on every request, as a bearer token.
    assert!(
        sim.credentials()
            .iter()
            .all(|c| c.as_deref() == Some("Bearer tok_stripe_secret"))
    );
}

async fn a_missed_customer_updated_is_repaired_by_the_next_reconcile(b: Backend) {
    let (app, r, sim) = setup(b, "stripe", Provider::Stripe, 5).await;
    let t = now() - 100;
    sim.set_clock(Some(t));
    let created = sim.change(
        "customers",
        "cus_A",
        json!({"email": "a@example.com"}),
        "customer.created",
    );
    assert_eq!(post(&app, "/webhooks/stripe", &created).await, 200);
    // Reconciled once: the listing agrees.
    sim.set_clock(Some(t + 2));
    succeeded(&run(&r, "stripe", "customer").await);
    sim.set_clock(Some(t + 10));
    let _lost = sim.change(
        "customers",
        "cus_A",
        json!({"email": "new@example.com"}),
        "customer.updated",
    );
    let before = app.db.resource("stripe", "customer", "cus_A").unwrap();
    assert_eq!(before.state_json()["email"], "a@example.com");
    sim.set_clock(Some(t + 20));
    let report = run(&r, "stripe", "customer").await;
    succeeded(&report);
    assert_eq!(report.counts.applied, 1, "{report:?}");
    let row = app.db.resource("stripe", "customer", "cus_A").unwrap();
    assert_eq!(row.state_json()["email"], "new@example.com");
    assert_eq!(
        row.version,
        (t + 20) * 1_000_000,
        "versioned by the listing's Date"
    );
    // A late retry of the created event is stale, never a regression.
    assert_eq!(post(&app, "/webhooks/stripe", &created).await, 200);
    let row = app.db.resource("stripe", "customer", "cus_A").unwrap();
    assert_eq!(row.state_json()["email"], "new@example.com");
}

async fn a_listing_fetched_in_the_same_second_as_an_event_is_settled_through_get(b: Backend) {
    let (app, r, sim) = setup(b, "stripe", Provider::Stripe, 5).await;
    let t = now() - 100;
    sim.set_clock(Some(t - 10));
    let created = sim.change(
        "customers",
        "cus_B",
        json!({"plan": "free"}),
        "customer.created",
    );
    assert_eq!(post(&app, "/webhooks/stripe", &created).await, 200);
    // Second t: one update delivered, a second one in the same second lost.
    sim.set_clock(Some(t));
    let delivered = sim.change(
        "customers",
        "cus_B",
        json!({"plan": "pro"}),
        "customer.updated",
    );
    assert_eq!(post(&app, "/webhooks/stripe", &delivered).await, 200);
    let _lost = sim.change(
        "customers",
        "cus_B",
        json!({"plan": "enterprise"}),
        "customer.updated",
    );
    // The listing is fetched in that same second: "enterprise" at t against "pro" at t
    // is ambiguous, so it is not written from the page but fetched; the fetch is still
    // in second t until the sender's clock moves on.
    let sim = Arc::new(sim);
    let clock = {
        let sim = sim.clone();
        tokio::spawn(async move {
            assert!(
                eventually(Duration::from_secs(10), || async {
                    sim.get_requests() >= 1
                })
                .await
            );
            sim.set_clock(Some(t + 1));
        })
    };
    let report = run(&r, "stripe", "customer").await;
    succeeded(&report);
    assert_eq!(report.counts.differing, 1, "{report:?}");
    // The run recorded the fetch; `serve`'s fetcher does it.
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count("pending_fetches") == 0
                && app
                    .db
                    .resource("stripe", "customer", "cus_B")
                    .unwrap()
                    .state_json()["plan"]
                    == "enterprise"
        })
        .await,
        "the conflict was settled through get"
    );
    clock.await.unwrap();
    assert!(
        sim.get_requests() >= 2,
        "fetched again once the second had passed"
    );
    let row = app.db.resource("stripe", "customer", "cus_B").unwrap();
    assert_eq!(row.state_json()["plan"], "enterprise");
    assert_eq!(row.version, (t + 1) * 1_000_000);
}

async fn catch_up_of_a_delivered_event_is_a_duplicate_and_of_a_lost_one_applies_it(b: Backend) {
    let (app, r, sim) = setup(b, "stripe", Provider::Stripe, 5).await;
    let t = now() - 100;
    sim.set_clock(Some(t));
    let delivered = sim.change(
        "refunds",
        "re_1",
        json!({"amount": 500, "status": "succeeded"}),
        "refund.created",
    );
    assert_eq!(post(&app, "/webhooks/stripe", &delivered).await, 200);
    sim.set_clock(Some(t + 1));
    let lost = sim.change(
        "products",
        "prod_1",
        json!({"name": "Tea", "active": true}),
        "product.created",
    );
    sim.set_clock(Some(t + 30));
    let report = run(&r, "stripe", "$catchup").await;
    succeeded(&report);
    assert_eq!(
        (
            report.counts.scanned,
            report.counts.equal,
            report.counts.applied
        ),
        (2, 1, 1),
        "{report:?}"
    );
    assert_eq!(
        app.db
            .event_outcome("stripe", &delivered.event_id)
            .as_deref(),
        Some("applied")
    );
    assert_eq!(
        app.db.event_outcome("stripe", &lost.event_id).as_deref(),
        Some("applied")
    );
    let row = app.db.resource("stripe", "product", "prod_1").unwrap();
    assert_eq!(row.state_json()["name"], "Tea");
    assert_eq!(
        row.version,
        (t + 1) * 1_000_000,
        "versioned by the event's created"
    );
    // A webhook of the caught-up event arriving late is a duplicate.
    let v: Value = app
        .client
        .post(app.url("/webhooks/stripe"))
        .header(lost.headers[0].0.as_str(), lost.headers[0].1.as_str())
        .body(lost.body.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["outcome"], "duplicate", "{v}");
    // The next run starts from the watermark minus the overlap: nothing new.
    let again = run(&r, "stripe", "$catchup").await;
    succeeded(&again);
    assert_eq!(again.counts.applied, 0);
}

async fn github_converges_and_parallel_kinds_share_its_quota_without_being_refused(b: Backend) {
    let (app, r, sim) = setup(b, "github", Provider::Github, 4).await;
    let mut t = now() - 900;
    let mut hooks = Vec::new();
    for n in 1..=14 {
        t += 1;
        sim.set_clock(Some(t));
        hooks.push(sim.change(
            "issues",
            &n.to_string(),
            json!({"title": format!("Issue {n}"), "state": "open"}),
            "opened",
        ));
    }
    for n in 15..=22 {
        t += 1;
        sim.set_clock(Some(t));
        hooks.push(sim.change(
            "pulls",
            &n.to_string(),
            json!({"title": format!("PR {n}"), "state": "open", "draft": false}),
            "opened",
        ));
    }
    for n in (1..=14).step_by(3) {
        t += 1;
        sim.set_clock(Some(t));
        hooks.push(sim.change(
            "issues",
            &n.to_string(),
            json!({"state": "closed", "state_reason": "completed"}),
            "closed",
        ));
    }
    // Issue 2 is deleted: GitHub says so with action "deleted", mapped as `issues.deleted`.
    t += 1;
    sim.set_clock(Some(t));
    let deleted = sim.change("issues", "2", json!({}), "deleted");
    sim.remove("issues", "2");
    deliver_with_faults(&app, "/webhooks/github", &hooks, 5).await;
    assert_eq!(post(&app, "/webhooks/github", &deleted).await, 200);
    let row = app.db.resource("github", "issue", "2").unwrap();
    assert!(row.deleted, "issues.deleted tombstones the issue");
    sim.set_clock(None);
    // 5 requests per 2-second window; the two kinds together need more than that.
    sim.set_quota(5, 2);
    let (issues, pulls) = tokio::join!(
        run(&r, "github", "issue"),
        run(&r, "github", "pull_request")
    );
    succeeded(&issues);
    succeeded(&pulls);
    assert_eq!(
        sim.refused(),
        0,
        "the quota headers were honoured before GitHub refused"
    );
    assert!(
        sim.list_requests() > 5,
        "the runs did need more than one window"
    );
    assert_converged(&app.db, "github", "issue", &sim.objects("issues"));
    assert_converged(&app.db, "github", "pull_request", &sim.objects("pulls"));
    let row = app.db.resource("github", "issue", "2").unwrap();
    assert!(row.deleted, "a deleted issue stays deleted");
}

async fn shopify_converges_within_its_call_bucket_and_finds_deletions_by_sweeping(b: Backend) {
    let (app, r, sim) = setup(b, "shop", Provider::Shopify, 5).await;
    let mut t = now() - 900;
    let mut hooks = Vec::new();
    for (collection, topic, n) in [
        ("orders", "orders/create", 30),
        ("products", "products/create", 12),
        ("customers", "customers/create", 12),
    ] {
        for i in 1..=n {
            t += 1;
            sim.set_clock(Some(t));
            let id = (450_789_469_000u64 + i).to_string();
            hooks.push(sim.change(
                collection,
                &id,
                json!({"name": format!("#{i}"), "total_price": format!("{i}.00")}),
                topic,
            ));
        }
    }
    for i in (1..=30).step_by(4) {
        t += 1;
        sim.set_clock(Some(t));
        let id = (450_789_469_000u64 + i).to_string();
        hooks.push(sim.change(
            "orders",
            &id,
            json!({"financial_status": "paid"}),
            "orders/paid",
        ));
    }
    deliver_with_faults(&app, "/webhooks/shop", &hooks, 9).await;
    // An order deleted at Shopify: its webhook carries no version, so the sweep finds it.
    sim.remove("orders", "450789469007");
    sim.set_clock(None);
    // A bucket of 10 calls draining 4 a second; the three kinds together need more.
    sim.set_bucket(10, 4.0);
    let (orders, products, customers) = tokio::join!(
        run(&r, "shop", "order"),
        run(&r, "shop", "product"),
        run(&r, "shop", "customer")
    );
    for report in [&orders, &products, &customers] {
        succeeded(report);
    }
    assert_eq!(orders.counts.tombstoned, 1, "{orders:?}");
    assert_eq!(
        sim.refused(),
        0,
        "the call-limit header was honoured before Shopify refused"
    );
    assert_converged(&app.db, "shop", "order", &sim.objects("orders"));
    assert_converged(&app.db, "shop", "product", &sim.objects("products"));
    assert_converged(&app.db, "shop", "customer", &sim.objects("customers"));
    assert!(
        app.db
            .resource("shop", "order", "450789469007")
            .unwrap()
            .deleted
    );
    // Shopify's token travels in its own header, never as a bearer token.
    assert!(
        sim.credentials()
            .iter()
            .all(|c| c.as_deref() == Some("tok_shopify_secret"))
    );
}

/// The simulated Stripe serves Connect accounts as Stripe does: `Stripe-Account` picks
/// the account whose objects and events a request sees (the same id in two accounts is
/// two objects), and a connected account's event names it in its signed body.
#[tokio::test]
async fn the_simulated_stripe_scopes_objects_and_events_by_connect_account() {
    let sim = ProviderSim::start(Provider::Stripe, "whsec_x")
        .await
        .unwrap();
    let a = sim.change_in(
        "acct_1",
        "customers",
        "cus_1",
        json!({"name": "in one"}),
        "customer.created",
    );
    sim.change_in(
        "acct_2",
        "customers",
        "cus_1",
        json!({"name": "in two"}),
        "customer.created",
    );
    let own = sim.change(
        "customers",
        "cus_P",
        json!({"name": "platform"}),
        "customer.created",
    );
    let body: Value = serde_json::from_str(&a.body).unwrap();
    assert_eq!(body["account"], "acct_1");
    assert!(
        serde_json::from_str::<Value>(&own.body)
            .unwrap()
            .get("account")
            .is_none()
    );
    let client = reqwest::Client::new();
    let get = |path: &str, account: Option<&str>| {
        let mut r = client.get(format!("{}{path}", sim.api_base()));
        if let Some(a) = account {
            r = r.header("Stripe-Account", a);
        }
        async move { r.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let names = |page: Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        names(get("/v1/customers", Some("acct_1")).await),
        ["in one"]
    );
    assert_eq!(
        names(get("/v1/customers", Some("acct_2")).await),
        ["in two"]
    );
    assert_eq!(names(get("/v1/customers", None).await), ["platform"]);
    assert_eq!(
        get("/v1/customers/cus_1", Some("acct_2")).await["name"],
        "in two"
    );
    let events = get("/v1/events", Some("acct_2")).await;
    assert_eq!(events["data"].as_array().unwrap().len(), 1);
    assert_eq!(events["data"][0]["account"], "acct_2");
    assert_eq!(sim.objects_in("acct_1", "customers").len(), 1);
}

//! Reconciliation against the simulated sender (a real HTTP server in the test), on
//! both backends.
//!
//! Longer than 500 lines on purpose: one test per behaviour of the reconcile flow, all
//! sharing the fixtures at the top (`reconcile_config`, the simulated sender's setup),
//! which other test files import from here.

use std::sync::Arc;
use std::time::{Duration, Instant};
use webhook_reconciler::bookkeeping::Bookkeeping;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webhook_reconciler::app::Application;
use webhook_reconciler::config::Config;
use webhook_reconciler::db::Db;
use webhook_reconciler::reconcile::{KindReport, Reconciler, RunOptions, RunStatus};
use webhook_reconciler::simulator::{Fault, SimSender, Style};
use webhook_reconciler::store::Store;

use crate::helpers::{Backend, SHOP_SECRET, TestDb, both_backends, eventually};

pub fn style_name(style: Style) -> &'static str {
    match style {
        Style::Cursor => "cursor",
        Style::Link => "link",
        Style::Stripe => "stripe",
    }
}

/// A source `shop` whose kinds are listed by `sim`: `order` (versioned, with a get
/// endpoint) and `refund` (insert-once).
pub fn reconcile_config(
    db_url: &str,
    sim: &SimSender,
    style: Style,
    extra_source: &str,
    extra_order: &str,
) -> String {
    let base = sim.base_url();
    let style = style_name(style);
    format!(
        r#"
[database]
url = "{db_url}"
max_connections = 8
acquire_timeout = "5s"

[http]
listen = "127.0.0.1:0"

[sources.shop]
api_base = "{base}"
requests_per_second = 1000
{extra_source}

[sources.shop.webhook]
secrets = ["{SHOP_SECRET}"]

[sources.shop.reconcile]
page_size = 7
max_attempts = 3
lease_ttl = "3s"

[sources.shop.kinds.order]
list = "/orders"
get = "/orders/{{id}}"
pagination = "{style}"
version = "/version"
{extra_order}
[sources.shop.kinds.order.events."order.status_changed"]
id = "/data/id"
version = "/data/version"
state = "/data"

[sources.shop.kinds.refund]
list = "/refunds"
pagination = "{style}"
[sources.shop.kinds.refund.events."refund.succeeded"]
id = "/data/id"
state = "/data"
"#
    )
}

pub async fn sim_with(style: Style) -> SimSender {
    let sim = SimSender::start().await.unwrap();
    sim.add_kind("orders", style);
    sim.add_kind("refunds", style);
    sim
}

pub fn order_fields(status: &str) -> Value {
    json!({"status": status, "amount": 4200})
}

pub async fn reconciler_for(config: &str) -> Reconciler {
    let config = Config::from_toml_str(config).unwrap();
    let db = Db::connect(&config.database).unwrap();
    let d = db.clone();
    tokio::task::spawn_blocking(move || d.migrate())
        .await
        .unwrap()
        .unwrap();
    Reconciler::new(
        Arc::new(config),
        Store::new(db.clone()),
        Bookkeeping::new(db),
    )
    .unwrap()
}

pub async fn run(r: &Reconciler, kind: &str, dry_run: bool) -> KindReport {
    run_with(
        r,
        kind,
        RunOptions {
            dry_run,
            ..Default::default()
        },
    )
    .await
}

pub async fn run_with(r: &Reconciler, kind: &str, opts: RunOptions) -> KindReport {
    let (s, k) = r
        .kinds(Some("shop"), Some(kind))
        .into_iter()
        .next()
        .map(|(s, k)| (s.clone(), k.clone()))
        .unwrap();
    r.run_kind(&s, &k, &opts, &CancellationToken::new(), &|_| {})
        .await
}

/// Asserts the local rows of `kind` equal the sender's items (version and state).
pub fn assert_converged(db: &TestDb, sim: &SimSender, sim_kind: &str, kind: &str) {
    let items = sim.items(sim_kind);
    assert_eq!(
        db.count(&format!("resources WHERE kind = '{kind}' AND NOT deleted")),
        items.len() as i64,
        "{kind}: row count"
    );
    for (id, item) in items {
        let row = db
            .resource("shop", kind, &id)
            .unwrap_or_else(|| panic!("{kind}/{id} missing locally"));
        if kind == "order" {
            assert_eq!(
                row.version,
                item["version"].as_i64().unwrap(),
                "{kind}/{id} version"
            );
        }
        assert_eq!(row.state_json(), item, "{kind}/{id} state");
        assert!(!row.deleted);
    }
}

both_backends!(
    reconcile_converges_after_partial_duplicated_reordered_webhooks_and_a_second_run_applies_nothing,
    a_dry_run_reports_the_drift_and_writes_nothing,
    a_row_newer_locally_is_never_overwritten,
    every_pagination_style_converges,
    a_500_then_success_and_a_429_with_retry_after_still_complete_the_run,
    a_malformed_page_fails_the_run_keeps_earlier_pages_and_the_next_run_converges,
    a_webhook_racing_a_reconcile_never_regresses_a_version,
    two_concurrent_reconciles_of_one_kind_run_once_and_report_the_lease,
    a_same_second_conflict_is_resolved_from_the_senders_current_state,
    a_complete_sweep_tombstones_rows_the_sender_no_longer_lists,
    deletions_on_either_side_of_the_deletion_scans_pages_are_all_found,
    incremental_runs_list_only_what_changed_since_the_watermark_between_full_sweeps,
    a_resume_point_the_sender_refuses_starts_the_sweep_over,
);

async fn reconcile_converges_after_partial_duplicated_reordered_webhooks_and_a_second_run_applies_nothing(
    b: Backend,
) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // The sender's history: 40 orders, each through several versions; 15 refunds.
    let mut events = Vec::new();
    for i in 0..40 {
        let id = format!("ord_{i:03}");
        let last = rng.random_range(1..5);
        for v in 1..=last {
            let status = ["new", "paid", "shipped", "delivered", "done"][v as usize - 1];
            events.push(
                json!({"id": format!("evt_{id}_{v}"), "type": "order.status_changed",
                "data": {"id": id, "version": v, "status": status, "amount": 4200}}),
            );
            sim.put("orders", &id, v, order_fields(status));
        }
    }
    for i in 0..15 {
        let id = format!("re_{i:03}");
        sim.put("refunds", &id, 0, json!({"amount": i}));
        events.push(json!({"id": format!("evt_{id}"), "type": "refund.succeeded", "data": {"id": id, "version": 0, "amount": i}}));
    }
    // Deliver a random half, some twice, in random order, concurrently.
    events.shuffle(&mut rng);
    let mut deliveries: Vec<Value> = events.iter().take(events.len() / 2).cloned().collect();
    let dups: Vec<Value> = deliveries.iter().step_by(3).cloned().collect();
    deliveries.extend(dups);
    deliveries.shuffle(&mut rng);
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let app = Application::build(Config::from_toml_str(&config).unwrap())
        .await
        .unwrap();
    let addr = app.local_addr();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    let client = reqwest::Client::new();
    let tasks: Vec<_> = deliveries
        .into_iter()
        .map(|e| {
            let client = client.clone();
            tokio::spawn(async move {
                let body = e.to_string();
                let r = crate::helpers::post_signed(&client, addr, &body, SHOP_SECRET).await;
                assert_eq!(r.status(), 200);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    server.abort();

    let r = reconciler_for(&config).await;
    let orders = run(&r, "order", false).await;
    let refunds = run(&r, "refund", false).await;
    assert_eq!(orders.status, RunStatus::Succeeded, "{orders:?}");
    assert_eq!(refunds.status, RunStatus::Succeeded, "{refunds:?}");
    assert!(
        orders.counts.applied > 0,
        "the webhooks missed something: {orders:?}"
    );
    assert_eq!(orders.counts.scanned, 40);
    assert_eq!(orders.counts.pages, 6, "40 items in pages of 7");
    assert_converged(&db, &sim, "orders", "order");
    assert_converged(&db, &sim, "refunds", "refund");
    assert_eq!(db.count("reconcile_runs WHERE status = 'succeeded'"), 2);

    let again = run(&r, "order", false).await;
    assert_eq!(
        (again.counts.applied, again.counts.equal),
        (0, 40),
        "{again:?}"
    );
}

async fn a_dry_run_reports_the_drift_and_writes_nothing(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..10 {
        sim.put("orders", &format!("o{i}"), 1, order_fields("new"));
    }
    let r = reconciler_for(&reconcile_config(&db.url, &sim, Style::Cursor, "", "")).await;
    let report = run(&r, "order", true).await;
    assert_eq!(report.status, RunStatus::Succeeded);
    assert_eq!((report.counts.missing, report.counts.applied), (10, 10));
    assert_eq!(report.would_change.len(), 10);
    assert_eq!(db.count("resources"), 0);
    assert_eq!(
        db.count("reconcile_runs"),
        0,
        "a dry run writes nothing, not even its run"
    );
    assert_eq!(
        db.count("reconcile_leases") + db.count("reconcile_checkpoints"),
        0
    );
}

async fn a_row_newer_locally_is_never_overwritten(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    sim.put("orders", "o1", 5, order_fields("paid"));
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let r = reconciler_for(&config).await;
    // A webhook already brought version 9.
    let store = Store::new(Db::connect(&Config::from_toml_str(&config).unwrap().database).unwrap());
    store
        .apply_event(webhook_reconciler::store::Delivery {
            body_digest: None,
            fetch: None,
            settle_conflict: false,
            source: "shop".into(),
            event_id: "e9".into(),
            event_type: "order.status_changed".into(),
            change: Some(webhook_reconciler::change::Change {
                source: "shop".into(),
                account: String::new(),
                kind: "order".into(),
                id: "o1".into(),
                version: 9,
                state: Some(r#"{"status":"refunded"}"#.into()),
                action: webhook_reconciler::config::Action::Upsert,
            }),
        })
        .await
        .unwrap();
    let report = run(&r, "order", false).await;
    assert_eq!((report.counts.newer_local, report.counts.applied), (1, 0));
    let row = db.resource("shop", "order", "o1").unwrap();
    assert_eq!(
        (row.version, row.state_json()["status"].clone()),
        (9, json!("refunded"))
    );
}

async fn every_pagination_style_converges(b: Backend) {
    for style in [Style::Cursor, Style::Link, Style::Stripe] {
        let db = TestDb::new(b);
        let sim = sim_with(style).await;
        for i in 0..23 {
            sim.put("orders", &format!("o{i:02}"), i, order_fields("x"));
        }
        let r = reconciler_for(&reconcile_config(&db.url, &sim, style, "", "")).await;
        let report = run(&r, "order", false).await;
        assert_eq!(report.status, RunStatus::Succeeded, "{style:?}: {report:?}");
        assert_eq!(
            (report.counts.pages, report.counts.applied),
            (4, 23),
            "{style:?}"
        );
        assert_converged(&db, &sim, "orders", "order");
    }
}

async fn a_500_then_success_and_a_429_with_retry_after_still_complete_the_run(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..20 {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("x"));
    }
    sim.fail_list_request(2, Fault::Status(500, None));
    sim.fail_list_request(4, Fault::Status(429, Some(1)));
    let r = reconciler_for(&reconcile_config(&db.url, &sim, Style::Cursor, "", "")).await;
    let started = Instant::now();
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
    assert_eq!(sim.list_requests(), 5, "3 pages + 2 retried requests");
    assert_converged(&db, &sim, "orders", "order");
}

async fn a_malformed_page_fails_the_run_keeps_earlier_pages_and_the_next_run_converges(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..30 {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("x"));
    }
    sim.fail_list_request(3, Fault::Malformed);
    let r = reconciler_for(&reconcile_config(&db.url, &sim, Style::Cursor, "", "")).await;
    let report = run(&r, "order", false).await;
    let RunStatus::Failed { error } = &report.status else {
        panic!("{report:?}")
    };
    assert!(
        error.contains("/orders?limit=7&cursor=o13") && error.contains("not JSON"),
        "{error}"
    );
    assert_eq!(
        db.count("resources"),
        14,
        "the two pages before the bad one stay applied"
    );
    assert_eq!(db.count("reconcile_runs WHERE status = 'failed'"), 1);
    let again = run(&r, "order", false).await;
    assert_eq!(again.status, RunStatus::Succeeded, "{again:?}");
    assert!(
        again.resumed,
        "the second run resumes from the last committed page"
    );
    assert_eq!(again.counts.scanned, 16);
    assert_converged(&db, &sim, "orders", "order");
}

async fn a_webhook_racing_a_reconcile_never_regresses_a_version(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..60 {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("listed"));
    }
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let r = reconciler_for(&config).await;
    let store = Store::new(Db::connect(&Config::from_toml_str(&config).unwrap().database).unwrap());
    // Webhooks bring versions 2..=4 of every order while the listing still says 1.
    let webhooks = tokio::spawn(async move {
        for v in 2..=4 {
            for i in 0..60 {
                let id = format!("o{i:02}");
                store
                    .apply_event(webhook_reconciler::store::Delivery {
                        body_digest: None,
                        fetch: None,
                        settle_conflict: false,
                        source: "shop".into(),
                        event_id: format!("e_{id}_{v}"),
                        event_type: "order.status_changed".into(),
                        change: Some(webhook_reconciler::change::Change {
                            source: "shop".into(),
                            account: String::new(),
                            kind: "order".into(),
                            id,
                            version: v,
                            state: Some(format!(r#"{{"status":"v{v}"}}"#)),
                            action: webhook_reconciler::config::Action::Upsert,
                        }),
                    })
                    .await
                    .unwrap();
            }
        }
    });
    let reconciles = async {
        for _ in 0..3 {
            run(&r, "order", false).await;
        }
    };
    let (w, ()) = tokio::join!(webhooks, reconciles);
    w.unwrap();
    assert_eq!(
        db.count("resources WHERE kind = 'order' AND version = 4"),
        60,
        "every order ends at the webhooks' version 4"
    );
}

async fn two_concurrent_reconciles_of_one_kind_run_once_and_report_the_lease(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..40 {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("x"));
    }
    // Two processes' worth: separate reconcilers, separate pools and holder ids. The
    // first is slowed by its rate budget (6 pages at 2 requests a second).
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "")
        .replace("requests_per_second = 1000", "requests_per_second = 2");
    let (a, b2) = (reconciler_for(&config).await, reconciler_for(&config).await);
    let first = tokio::spawn(async move { run(&a, "order", false).await });
    assert!(
        eventually(Duration::from_secs(5), || async {
            db.count("reconcile_leases") == 1
        })
        .await,
        "the first run never took the lease"
    );
    let second = run(&b2, "order", false).await;
    assert!(
        matches!(second.status, RunStatus::Skipped { .. }),
        "{second:?}"
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, RunStatus::Succeeded, "{first:?}");
    assert_eq!(db.count("reconcile_runs"), 1);
    assert_converged(&db, &sim, "orders", "order");
}

async fn a_same_second_conflict_is_resolved_from_the_senders_current_state(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    // Two states within one version (a whole-second timestamp, say); the sender's
    // current one is "shipped".
    sim.put("orders", "o1", 1700000000, order_fields("shipped"));
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let app = Application::build(Config::from_toml_str(&config).unwrap())
        .await
        .unwrap();
    let addr = app.local_addr();
    let server = tokio::spawn(app.run_until(std::future::pending()));
    let client = reqwest::Client::new();
    let mut outcomes = Vec::new();
    for (eid, status) in [("e1", "paid"), ("e2", "shipped")] {
        let body = json!({"id": eid, "type": "order.status_changed", "data": {"id": "o1", "version": 1700000000, "status": status, "amount": 4200}}).to_string();
        let r = crate::helpers::post_signed(&client, addr, &body, SHOP_SECRET).await;
        outcomes.push(r.json::<Value>().await.unwrap()["outcome"].clone());
    }
    assert_eq!(outcomes, [json!("applied"), json!("conflict")]);
    let resolved = eventually(Duration::from_secs(10), || async {
        db.resource("shop", "order", "o1").unwrap().state_json()["status"] == "shipped"
    })
    .await;
    assert!(
        resolved,
        "the conflict was not resolved from GET /orders/o1"
    );
    assert!(sim.get_requests() >= 1);
    server.abort();
}

async fn a_complete_sweep_tombstones_rows_the_sender_no_longer_lists(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..10 {
        sim.put("orders", &format!("o{i}"), 1, order_fields("x"));
    }
    let r = reconciler_for(&reconcile_config(
        &db.url,
        &sim,
        Style::Cursor,
        "",
        // 2 of 10 is above the default max_delete_fraction (0.1).
        "detect_deletes = true\nmax_delete_fraction = 0.5",
    ))
    .await;
    run(&r, "order", false).await;
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    sim.remove("orders", "o3");
    sim.remove("orders", "o7");
    let report = run(&r, "order", false).await;
    assert_eq!(report.counts.tombstoned, 2, "{report:?}");
    for id in ["o3", "o7"] {
        let row = db.resource("shop", "order", id).unwrap();
        assert!(
            row.deleted && row.version == 1,
            "{id} is a tombstone at its last version"
        );
    }
    assert_eq!(db.count("resources WHERE NOT deleted"), 8);

    // The next sweep sizes its seen ids by the last complete full sweep's listing: a
    // kind listed past the exact set's bound starts with the Bloom filter, which never
    // misses a seen id (it may keep a deleted row one more sweep, at 0.1%).
    let key = webhook_reconciler::change::Key::new("shop", "order");
    assert_eq!(r.book().last_full_sweep_size(&key).await.unwrap(), Some(8));
    db.execute("UPDATE reconcile_runs SET scanned = 2000000 WHERE kind = 'order'");
    assert_eq!(
        r.book().last_full_sweep_size(&key).await.unwrap(),
        Some(2_000_000)
    );
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    sim.remove("orders", "o5");
    let report = run(&r, "order", false).await;
    assert!(report.counts.tombstoned <= 1, "{report:?}");
    assert_eq!(
        db.count("resources WHERE NOT deleted"),
        8 - report.counts.tombstoned,
        "only o5 may be tombstoned"
    );
    for i in [0, 1, 2, 4, 6, 8, 9] {
        assert!(
            !db.resource("shop", "order", &format!("o{i}"))
                .unwrap()
                .deleted
        );
    }
    assert_eq!(r.book().last_full_sweep_size(&key).await.unwrap(), Some(7));
}

/// The deletion scan reads a kind's live ids 10,000 at a time, reading the next page
/// while it checks one: rows gone at the sender on either side of its page boundaries
/// are all found, in both of its passes (count, then tombstone), and a kind of exactly
/// two full scan pages ends the scan.
async fn deletions_on_either_side_of_the_deletion_scans_pages_are_all_found(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    let id = |i: usize| format!("o{i:05}");
    for i in 0..20_000 {
        sim.put("orders", &id(i), 1, order_fields("x"));
    }
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "detect_deletes = true")
        .replace("page_size = 7", "page_size = 1000");
    let r = reconciler_for(&config).await;
    let first = run(&r, "order", false).await;
    assert_eq!(first.counts.applied, 20_000, "{first:?}");
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    let gone = [0, 9_999, 10_000, 19_999];
    for i in gone {
        sim.remove("orders", &id(i));
    }
    let report = run(&r, "order", false).await;
    assert_eq!(report.counts.tombstoned, 4, "{report:?}");
    for i in gone {
        assert!(
            db.resource("shop", "order", &id(i)).unwrap().deleted,
            "{}",
            id(i)
        );
    }
    for i in [1, 9_998, 10_001, 19_998] {
        assert!(
            !db.resource("shop", "order", &id(i)).unwrap().deleted,
            "{}",
            id(i)
        );
    }
    assert_eq!(db.count("resources WHERE NOT deleted"), 19_996);
}

async fn incremental_runs_list_only_what_changed_since_the_watermark_between_full_sweeps(
    b: Backend,
) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    let at = |day: u32, hour: u32| format!("2026-01-{day:02}T{hour:02}:00:00Z");
    for h in 0..24 {
        sim.put(
            "orders",
            &format!("o{h:02}"),
            1,
            json!({"status": "new", "updated_at": at(1, h)}),
        );
    }
    let incremental = "[sources.shop.kinds.order.incremental]\nparam = \"updated_since\"\nfield = \"/updated_at\"\noverlap = \"1m\"\nfull_every = \"24h\"";
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "") + incremental;
    let r = reconciler_for(&config).await;

    let first = run(&r, "order", false).await;
    assert_eq!(
        (first.mode, first.counts.scanned),
        (webhook_reconciler::reconcile::Mode::Full, 24),
        "no watermark yet: a full sweep"
    );

    // Two orders change and one appears, all later than the watermark (01-01 23:00).
    sim.put(
        "orders",
        "o03",
        2,
        json!({"status": "paid", "updated_at": at(2, 8)}),
    );
    sim.put(
        "orders",
        "o07",
        2,
        json!({"status": "paid", "updated_at": at(2, 9)}),
    );
    sim.put(
        "orders",
        "o99",
        1,
        json!({"status": "new", "updated_at": at(2, 10)}),
    );
    let second = run(&r, "order", false).await;
    assert_eq!(
        second.mode,
        webhook_reconciler::reconcile::Mode::Incremental,
        "{second:?}"
    );
    // The three changes, plus o23, inside the 1m overlap before the watermark.
    assert_eq!(
        (second.counts.scanned, second.counts.applied),
        (4, 3),
        "{second:?}"
    );
    assert_converged(&db, &sim, "orders", "order");

    // Once the last full sweep is older than full_every, the next run is full again.
    let old = match b {
        Backend::Postgres => "now() - interval '2 days'",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days')",
    };
    assert_eq!(
        db.count("reconcile_state WHERE last_full_at IS NOT NULL"),
        1
    );
    db.execute(&format!("UPDATE reconcile_state SET last_full_at = {old}"));
    let third = run(&r, "order", false).await;
    assert_eq!(
        (third.mode, third.counts.scanned),
        (webhook_reconciler::reconcile::Mode::Full, 25)
    );
}

async fn a_resume_point_the_sender_refuses_starts_the_sweep_over(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..30 {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("x"));
    }
    sim.fail_list_request(3, Fault::Malformed);
    let r = reconciler_for(&reconcile_config(
        &db.url,
        &sim,
        Style::Cursor,
        "",
        "detect_deletes = true",
    ))
    .await;
    let failed = run(&r, "order", false).await;
    assert!(matches!(failed.status, RunStatus::Failed { .. }));
    // The checkpoint's cursor (the last id of page 2) disappears: the sender refuses it.
    sim.remove("orders", "o13");
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    let again = run(&r, "order", false).await;
    assert_eq!(again.status, RunStatus::Succeeded, "{again:?}");
    assert_eq!(
        again.counts.scanned, 29,
        "the sweep started over from the first page"
    );
    assert_converged(&db, &sim, "orders", "order");
}

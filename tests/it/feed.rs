//! The change feed: exactly one change per write that changes a resource, none for
//! no-ops; seqs in visibility order; pushes to a consumer in per-resource order with a
//! stable idempotency key, surviving failures, replicas and filters; the pull endpoint
//! and its token; retention that keeps what a consumer has not acknowledged.
//!
//! Longer than 500 lines on purpose: one test per promise of SPEC's "The change feed",
//! sharing the helpers at the top.

use std::time::Duration;

use serde_json::json;
use webhook_reconciler::change::Change;
use webhook_reconciler::config::Action;
use webhook_reconciler::feed::Filter;
use webhook_reconciler::reconcile::RunStatus;
use webhook_reconciler::simulator::Style;
use webhook_reconciler::store::{Delivery, Outcome, Store};

use crate::helpers::consumer::ConsumerApp;
use crate::helpers::{
    Backend, TestDb, both_backends, config_toml, eventually, feed_on, handle_on, order_event,
    refund_event, spawn_app_with, store_on,
};
use crate::reconcile::{order_fields, reconcile_config, reconciler_for, run, sim_with};

both_backends!(
    every_write_that_changes_a_resource_appends_one_change_and_no_op_none,
    a_transaction_held_open_never_lets_a_reader_skip_its_change,
    concurrent_writers_never_let_a_reader_skip_a_seq,
    writes_that_only_request_their_pass_are_each_numbered_once_by_the_flush,
    a_consumer_that_fails_for_a_while_gets_every_change_in_per_resource_order,
    two_replicas_push_each_change_once_through_one_pusher,
    a_consumer_gets_only_the_sources_and_kinds_it_asked_for,
    the_pull_endpoint_pages_the_feed_behind_its_token,
    retention_keeps_changes_a_consumer_has_not_acknowledged,
    a_reconcile_that_repairs_a_lost_webhook_reaches_the_consumer,
    a_new_consumer_gets_the_retained_history_unless_it_starts_now,
);

fn order(id: &str, version: i64, status: &str) -> Change {
    Change {
        source: "shop".into(),
        account: String::new(),
        kind: "order".into(),
        id: id.into(),
        version,
        state: Some(json!({"status": status}).to_string()),
        action: Action::Upsert,
    }
}

async fn deliver(store: &Store, event_id: &str, change: Option<Change>) -> Outcome {
    store
        .apply_event(Delivery {
            body_digest: None,
            fetch: None,
            settle_conflict: false,
            source: "shop".into(),
            event_id: event_id.into(),
            event_type: "order.status_changed".into(),
            change,
        })
        .await
        .unwrap()
}

async fn every_write_that_changes_a_resource_appends_one_change_and_no_op_none(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let changes = || db.count("changes");
    assert_eq!(
        deliver(&store, "e1", Some(order("o1", 1, "paid"))).await,
        Outcome::Applied
    );
    assert_eq!(changes(), 1, "applied");
    assert_eq!(
        deliver(&store, "e1", Some(order("o1", 1, "paid"))).await,
        Outcome::Duplicate
    );
    assert_eq!(
        deliver(&store, "e2", Some(order("o1", 1, "paid"))).await,
        Outcome::Stale
    );
    assert_eq!(
        deliver(&store, "e3", Some(order("o1", 0, "new"))).await,
        Outcome::Stale
    );
    assert_eq!(
        deliver(&store, "e4", Some(order("o1", 1, "refunded"))).await,
        Outcome::Conflict
    );
    assert_eq!(deliver(&store, "e5", None).await, Outcome::Ignored);
    assert_eq!(
        changes(),
        1,
        "duplicate, stale, conflict and ignored append nothing"
    );
    let mut delete = order("o1", 2, "paid");
    delete.action = Action::Delete;
    delete.state = None;
    assert_eq!(deliver(&store, "e6", Some(delete)).await, Outcome::Applied);
    assert_eq!(changes(), 2, "a delete event's tombstone");
    // Reconcile path: applied, equal, newer version with the same state. Its writes
    // only request their pass; a flush waits for it.
    assert_eq!(
        store
            .apply_batch(vec![order("o2", 1, "paid")])
            .await
            .unwrap()
            .len(),
        1
    );
    store.outbox().flush().await.unwrap();
    assert_eq!(changes(), 3);
    store
        .apply_batch(vec![order("o2", 1, "paid")])
        .await
        .unwrap();
    assert_eq!(
        store
            .apply_batch(vec![order("o2", 2, "paid")])
            .await
            .unwrap()
            .len(),
        1
    );
    store.outbox().flush().await.unwrap();
    assert_eq!(
        changes(),
        3,
        "a newer version with the same state changes nothing"
    );

    let feed = feed_on(&db).await;
    let all = feed.after(0, 100, &Filter::default()).await.unwrap();
    let seqs: Vec<i64> = all.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(
        (all[0].origin.as_str(), all[0].event_id.as_deref()),
        ("webhook", Some("e1"))
    );
    assert_eq!(all[0].state, json!({"status": "paid"}));
    assert!(all[1].deleted && all[1].version == 2, "{:?}", all[1]);
    assert_eq!(
        all[1].state,
        json!({"status": "paid"}),
        "a tombstone keeps the last state"
    );
    assert_eq!(
        (all[2].origin.as_str(), all[2].event_id.as_deref()),
        ("reconcile", None)
    );

    // Detected deletes and conflicts resolved through `get` append one change each.
    let sim = sim_with(Style::Cursor).await;
    for i in 0..20 {
        sim.put("orders", &format!("s{i:02}"), 1, order_fields("paid"));
    }
    let r = reconciler_for(&reconcile_config(
        &db.url,
        &sim,
        Style::Cursor,
        "",
        "detect_deletes = true",
    ))
    .await;
    assert_eq!(run(&r, "order", false).await.status, RunStatus::Succeeded);
    assert_eq!(
        changes(),
        3 + 20 + 1,
        "20 rows listed, o2 no longer listed: tombstoned"
    );
    sim.put("orders", "s00", 1, order_fields("shipped"));
    let mut conflicting = order("s00", 1, "refunded");
    conflicting.state = Some(order_fields("refunded").to_string());
    assert_eq!(
        deliver(&store, "e7", Some(conflicting)).await,
        Outcome::Conflict
    );
    assert_eq!(changes(), 24);
    assert_eq!(r.resolve("shop", "order", "s00").await, Ok(true));
    assert_eq!(changes(), 25, "the conflict resolved through get");
    let last = feed.after(24, 10, &Filter::default()).await.unwrap();
    assert_eq!(last[0].state["status"], "shipped");
}

/// Opens a writing transaction on its own connection that changes a resource and takes
/// its seq, and keeps it open.
fn hold_open_write(db: &TestDb) -> webhook_reconciler::db::Conn {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    use webhook_reconciler::db::Conn;
    let mut conn = match db.backend {
        Backend::Postgres => Conn::Postgres(diesel::PgConnection::establish(&db.url).unwrap()),
        Backend::Sqlite => {
            let mut c = diesel::SqliteConnection::establish(db.url.trim_start_matches("sqlite://"))
                .unwrap();
            c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
            Conn::Sqlite(c)
        }
    };
    let begin = match db.backend {
        Backend::Postgres => "BEGIN",
        Backend::Sqlite => "BEGIN IMMEDIATE",
    };
    let insert = "INSERT INTO resources (source, kind, id, version, state, deleted, origin) \
                  VALUES ('shop', 'order', 'held', 1, NULL, false, 'webhook')";
    match &mut conn {
        Conn::Postgres(c) => c.batch_execute(&format!("{begin}; {insert}")).unwrap(),
        Conn::Sqlite(c) => c
            .batch_execute(&format!("{begin}; {}", insert.replace("false", "0")))
            .unwrap(),
    }
    assert!(
        webhook_reconciler::feed::outbox::publish(&mut conn, 1)
            .unwrap()
            .anything(),
        "the held transaction published its change"
    );
    conn
}

async fn a_transaction_held_open_never_lets_a_reader_skip_its_change(b: Backend) {
    use diesel::connection::SimpleConnection;
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let feed = feed_on(&db).await;
    let mut held = hold_open_write(&db);
    // Five more writers commit meanwhile, or try to.
    let mut writers: Vec<_> = (0..5)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                deliver(
                    &store,
                    &format!("w{i}"),
                    Some(order(&format!("w{i}"), 1, "paid")),
                )
                .await
            })
        })
        .collect();
    let read_all = || async { feed.after(0, 100, &Filter::default()).await.unwrap() };
    match b {
        // No writer waits for another's commit: the five commit and are numbered
        // while the first transaction is open; its change is not among them.
        Backend::Postgres => {
            for w in writers.drain(..) {
                assert_eq!(w.await.unwrap(), Outcome::Applied);
            }
            let seen = read_all().await;
            assert_eq!(
                seen.iter().map(|c| c.seq).collect::<Vec<_>>(),
                vec![1, 2, 3, 4, 5],
                "the committed writers' changes, numbered while the other was open"
            );
            assert!(seen.iter().all(|c| c.id != "held"));
        }
        // One writer at a time: the later writers wait, and a reader sees nothing.
        Backend::Sqlite => {
            let saw_any = eventually(Duration::from_millis(800), || async {
                !read_all().await.is_empty()
            })
            .await;
            assert!(
                !saw_any,
                "a reader saw a change while a lower seq was still in flight"
            );
            assert!(
                writers.iter().all(|w| !w.is_finished()),
                "the later writers wait"
            );
        }
    }
    match &mut held {
        webhook_reconciler::db::Conn::Postgres(c) => c.batch_execute("COMMIT").unwrap(),
        webhook_reconciler::db::Conn::Sqlite(c) => c.batch_execute("COMMIT").unwrap(),
    }
    for w in writers {
        assert_eq!(w.await.unwrap(), Outcome::Applied);
    }
    // The held transaction committed outside the store, as a process killed before its
    // pass would: the next pass numbers its change (serve runs one every second).
    store.outbox().sequence_leftovers().await.unwrap();
    let all = read_all().await;
    assert_eq!(all.len(), 6);
    let held_at = all.iter().find(|c| c.id == "held").unwrap().seq;
    assert_eq!(
        held_at,
        match b {
            Backend::Postgres => 6,
            Backend::Sqlite => 1,
        },
        "numbered in visibility order: after what a reader had already seen"
    );
    assert!(all.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert_eq!(db.count("change_pending"), 0);
}

/// A reconcile write returns before its pass (`Outbox::request`): 8 writers side by
/// side, then one flush, and every change is numbered once, gap-free, none left pending.
async fn writes_that_only_request_their_pass_are_each_numbered_once_by_the_flush(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..60 {
                    let id = format!("r{w}-{}", i % 7);
                    let written = store
                        .apply_batch(vec![order(&id, i + 1, &format!("s{i}"))])
                        .await
                        .unwrap();
                    assert_eq!(written.len(), 1);
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    store.outbox().flush().await.unwrap();
    assert_eq!(db.count("changes"), 480);
    assert_eq!(db.scalar("SELECT MAX(seq) AS n FROM changes"), 480);
    assert_eq!(db.count("change_pending"), 0);
}

async fn concurrent_writers_never_let_a_reader_skip_a_seq(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let feed = feed_on(&db).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..60 {
                    let id = format!("r{w}-{}", i % 7);
                    deliver(
                        &store,
                        &format!("e{w}-{i}"),
                        Some(order(&id, i + 1, &format!("s{i}"))),
                    )
                    .await;
                }
            })
        })
        .collect();
    let reader = {
        let feed = feed.clone();
        tokio::spawn(async move {
            let (mut last, mut seen) = (0i64, Vec::new());
            for _ in 0..20_000 {
                let page = feed.after(last, 50, &Filter::default()).await.unwrap();
                for c in page {
                    seen.push(c.seq);
                    last = c.seq;
                }
                if last == 480 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            seen
        })
    };
    for w in writers {
        w.await.unwrap();
    }
    let seen = reader.await.unwrap();
    assert_eq!(db.count("changes"), 480);
    // Reading after the last seen seq, the reader got every seq, in order, none skipped.
    assert_eq!(seen, (1..=480).collect::<Vec<i64>>());
}

async fn a_consumer_that_fails_for_a_while_gets_every_change_in_per_resource_order(b: Backend) {
    let consumer = ConsumerApp::start().await;
    consumer.fail_next(3);
    let db = TestDb::new(b);
    let url = db.url.clone();
    let app = spawn_app_with(db, &(config_toml(&url, "") + &consumer.config("app", ""))).await;
    for v in 1..=3 {
        for r in 0..8 {
            let (status, _) = app
                .deliver(&order_event(
                    &format!("e{r}-{v}"),
                    &format!("o{r}"),
                    v,
                    "paid",
                ))
                .await;
            assert_eq!(status, 200);
        }
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            consumer.delivered().len() >= 24
        })
        .await,
        "{:?}",
        consumer.pushes().len()
    );
    let delivered = consumer.delivered();
    let mut ids: Vec<&str> = delivered.iter().map(|p| p.webhook_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 24, "every change delivered");
    for p in &delivered {
        assert_eq!(
            p.webhook_id,
            format!("chg_{}", p.body["seq"]),
            "the key is the seq"
        );
    }
    // Each failed push was retried under the same key.
    for failed in consumer.pushes().iter().filter(|p| p.status != 200) {
        assert!(
            ids.contains(&failed.webhook_id.as_str()),
            "{}",
            failed.webhook_id
        );
    }
    // Per resource, versions arrive in order.
    for r in 0..8 {
        let versions: Vec<i64> = delivered
            .iter()
            .filter(|p| p.body["id"] == format!("o{r}"))
            .map(|p| p.body["version"].as_i64().unwrap())
            .collect();
        assert_eq!(versions, vec![1, 2, 3], "o{r}");
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            app.db
                .scalar("SELECT COALESCE(MAX(position), 0) AS n FROM consumer_positions")
                == 24
        })
        .await
    );
}

async fn two_replicas_push_each_change_once_through_one_pusher(b: Backend) {
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let url = db.url.clone();
    let toml = config_toml(&url, "") + &consumer.config("app", "");
    let first = spawn_app_with(db, &toml).await;
    let config = webhook_reconciler::config::Config::from_toml_str(&toml).unwrap();
    let second = webhook_reconciler::app::Application::build(config)
        .await
        .unwrap();
    let second_addr = second.local_addr();
    let server = tokio::spawn(async move { second.run_until(std::future::pending()).await });
    let client = reqwest::Client::new();
    for i in 0..40 {
        let addr = if i % 2 == 0 { first.addr } else { second_addr };
        let r = crate::helpers::post_signed(
            &client,
            addr,
            &order_event(&format!("e{i}"), &format!("o{i}"), 1, "paid").to_string(),
            crate::helpers::SHOP_SECRET,
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            consumer.delivered().len() >= 40
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = consumer.delivered();
    let mut ids: Vec<&str> = delivered.iter().map(|p| p.webhook_id.as_str()).collect();
    ids.sort();
    let total = ids.len();
    ids.dedup();
    assert_eq!(
        (ids.len(), total),
        (40, 40),
        "each change pushed once: one pusher"
    );
    assert_eq!(
        first
            .db
            .count("reconcile_leases WHERE source = '$consumer'"),
        1
    );
    server.abort();
}

async fn a_consumer_gets_only_the_sources_and_kinds_it_asked_for(b: Backend) {
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let url = db.url.clone();
    let app = spawn_app_with(
        db,
        &(config_toml(&url, "") + &consumer.config("refunds", "kinds = [\"refund\"]")),
    )
    .await;
    assert_eq!(
        app.deliver(&order_event("e1", "o1", 1, "paid")).await.0,
        200
    );
    assert_eq!(app.deliver(&refund_event("e2", "re1")).await.0, 200);
    assert_eq!(
        app.deliver(&order_event("e3", "o1", 2, "shipped")).await.0,
        200
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            !consumer.delivered().is_empty()
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            app.db
                .scalar("SELECT COALESCE(MAX(position), 0) AS n FROM consumer_positions")
                == 3
        })
        .await,
        "the position moves past what the filter leaves out"
    );
    let delivered = consumer.delivered();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert_eq!(delivered[0].body["kind"], "refund");
}

async fn the_pull_endpoint_pages_the_feed_behind_its_token(b: Backend) {
    let db = TestDb::new(b);
    let url = db.url.clone();
    let toml = config_toml(&url, "").replace(
        "max_body = \"64KiB\"",
        "max_body = \"64KiB\"\nchanges_token = \"pull-token-123\"",
    );
    let app = spawn_app_with(db, &toml).await;
    for i in 0..5 {
        assert_eq!(
            app.deliver(&order_event(&format!("e{i}"), &format!("o{i}"), 1, "paid"))
                .await
                .0,
            200
        );
    }
    let get = |auth: Option<&str>, q: &str| {
        let mut r = app.client.get(app.url(&format!("/changes{q}")));
        if let Some(a) = auth {
            r = r.header("Authorization", a);
        }
        r.send()
    };
    assert_eq!(get(None, "").await.unwrap().status(), 401);
    assert_eq!(get(Some("Bearer nope"), "").await.unwrap().status(), 401);
    assert_eq!(
        get(Some("Bearer pull-token-123"), "?after=x")
            .await
            .unwrap()
            .status(),
        400
    );
    let page: serde_json::Value = get(Some("Bearer pull-token-123"), "?after=0&limit=3")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["changes"].as_array().unwrap().len(), 3);
    assert_eq!(page["next_after"], 3);
    let page: serde_json::Value = get(Some("Bearer pull-token-123"), "?after=3&limit=3")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seqs: Vec<i64> = page["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_i64().unwrap())
        .collect();
    assert_eq!((seqs, page["next_after"].as_i64()), (vec![4, 5], Some(5)));

    // Without a token, the endpoint does not exist.
    let other = crate::helpers::spawn_app(b).await;
    let r = other
        .client
        .get(other.url("/changes"))
        .header("Authorization", "Bearer pull-token-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

async fn retention_keeps_changes_a_consumer_has_not_acknowledged(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    for i in 0..6 {
        deliver(
            &store,
            &format!("e{i}"),
            Some(order(&format!("o{i}"), 1, "paid")),
        )
        .await;
    }
    db.execute("UPDATE changes SET changed_at = '2000-01-01T00:00:00.000Z'");
    // A consumer that has acknowledged the first two.
    db.execute("INSERT INTO consumer_positions (consumer, position) VALUES ('app', 2)");
    let config = webhook_reconciler::config::Config::from_toml_str(
        &(config_toml(&db.url, "")
            + "\n[consumers.app]\nurl = \"http://127.0.0.1:9/feed\"\nsecret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"\n"),
    )
    .unwrap();
    let report = webhook_reconciler::retention::prune(
        &webhook_reconciler::retention::Owners::new(handle_on(&db).await),
        &config,
        &tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(report.changes, 2);
    assert_eq!(db.count("changes"), 4, "the unacknowledged changes stay");
    assert_eq!(db.scalar("SELECT MIN(seq) AS n FROM changes"), 3);
}

async fn a_reconcile_that_repairs_a_lost_webhook_reaches_the_consumer(b: Backend) {
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    sim.put("orders", "lost", 4, order_fields("paid"));
    let toml = reconcile_config(&db.url, &sim, Style::Cursor, "", "").replace(
        "lease_ttl = \"3s\"",
        "lease_ttl = \"3s\"\nevery = \"1h\"\njitter = \"0s\"",
    ) + &consumer.config("app", "");
    let config = webhook_reconciler::config::Config::from_toml_str(&toml).unwrap();
    let app = webhook_reconciler::app::Application::build(config)
        .await
        .unwrap();
    let server = tokio::spawn(async move { app.run_until(std::future::pending()).await });
    // `run_at_start`: the daemon's first reconcile repairs the order whose webhook was lost.
    assert!(
        eventually(Duration::from_secs(20), || async {
            !consumer.delivered().is_empty()
        })
        .await
    );
    let p = &consumer.delivered()[0];
    assert_eq!(
        (
            p.body["id"].as_str(),
            p.body["version"].as_i64(),
            p.body["origin"].as_str()
        ),
        (Some("lost"), Some(4), Some("reconcile"))
    );
    assert_eq!(p.body["state"]["status"], "paid");
    server.abort();
}

/// Every row of change_pending dies in the pass that numbers it. On a server whose
/// autovacuum is off or busy, only the daemon's own vacuum keeps the table from growing
/// by every change ever made (4.2 GB after a 10M first sync) and the planner's costs of
/// the publish with it; product connections also run without JIT, which those costs
/// made compile every publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_reconcile_that_wrote_vacuums_change_pending_and_sessions_run_without_jit() {
    let db = TestDb::new(Backend::Postgres);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..50 {
        sim.put("orders", &format!("v{i:02}"), 1, order_fields("paid"));
    }
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let r = reconciler_for(&config).await;
    let vacuums = || {
        db.scalar(
            "SELECT vacuum_count AS n FROM pg_stat_user_tables WHERE relname = 'change_pending'",
        )
    };
    assert_eq!(vacuums(), 0);
    let report = run(&r, "order", false).await;
    assert_eq!(
        (report.status, report.counts.applied),
        (RunStatus::Succeeded, 50)
    );
    assert_eq!(db.count("changes"), 50);
    assert_eq!(db.count("change_pending"), 0);
    assert!(
        eventually(Duration::from_secs(10), || async { vacuums() >= 1 }).await,
        "no VACUUM of change_pending after a run that wrote 50 changes"
    );

    let handle = webhook_reconciler::db::Db::connect(
        &webhook_reconciler::config::Config::from_toml_str(&config)
            .unwrap()
            .database,
    )
    .unwrap();
    let jit = handle
        .read(|c| {
            #[derive(diesel::QueryableByName)]
            struct S {
                #[diesel(sql_type = diesel::sql_types::Text)]
                s: String,
            }
            match c {
                webhook_reconciler::db::Conn::Postgres(pg) => diesel::RunQueryDsl::get_result::<S>(
                    diesel::sql_query("SELECT current_setting('jit') AS s"),
                    pg,
                ),
                webhook_reconciler::db::Conn::Sqlite(_) => unreachable!(),
            }
        })
        .await
        .unwrap();
    assert_eq!(jit.s, "off");
}

/// SQLite stores a state as text, so a row changed by hand can hold anything: the feed
/// must say so, never hand the application `null` (which reads as "no state").
#[tokio::test]
async fn an_unreadable_stored_state_is_an_error_never_a_null() {
    let db = TestDb::new(Backend::Sqlite);
    let store = store_on(&db).await;
    assert_eq!(
        deliver(&store, "e1", Some(order("o1", 1, "paid"))).await,
        Outcome::Applied
    );
    db.execute("UPDATE changes SET state = 'not json {'");
    let err = feed_on(&db)
        .await
        .after(0, 10, &Filter::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("change 1") && err.contains("not JSON"),
        "the error names the change and the problem: {err}"
    );
}

/// A new consumer gets every change still kept, unless `start = "now"`: then only what
/// is committed after it first runs. A consumer that already has a position keeps it.
async fn a_new_consumer_gets_the_retained_history_unless_it_starts_now(b: Backend) {
    for (start, expected) in [
        ("", vec!["o1", "o2", "o3"]),
        ("start = \"now\"", vec!["o3"]),
    ] {
        let consumer = ConsumerApp::start().await;
        let db = TestDb::new(b);
        let store = store_on(&db).await;
        assert_eq!(
            deliver(&store, "e1", Some(order("o1", 1, "paid"))).await,
            Outcome::Applied
        );
        assert_eq!(
            deliver(&store, "e2", Some(order("o2", 1, "paid"))).await,
            Outcome::Applied
        );
        let url = db.url.clone();
        let app = spawn_app_with(
            db,
            &(config_toml(&url, "") + &consumer.config("app", start)),
        )
        .await;
        // The pusher has taken its place once the position row exists (start = "now"
        // writes it at the feed's end; from the beginning it appears with the first push).
        if !start.is_empty() {
            assert!(
                eventually(Duration::from_secs(10), || async {
                    app.db.count("consumer_positions WHERE position = 2") == 1
                })
                .await
            );
        }
        assert_eq!(
            app.deliver(&order_event("e3", "o3", 1, "paid")).await.0,
            200
        );
        assert!(
            eventually(Duration::from_secs(10), || async {
                app.db.count("consumer_positions WHERE position = 3") == 1
            })
            .await
        );
        // Different resources are pushed in parallel: compared as a set.
        let mut ids: Vec<String> = consumer
            .delivered()
            .iter()
            .map(|d| d.body["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        assert_eq!(ids, expected, "start: {start:?}");
    }
}

/// A process killed between its commit and its sequencer pass leaves committed changes
/// in `change_pending` (written here by SQL outside any process, which is what such a
/// process leaves): the next `serve` numbers them at start, gap-free, without a write of
/// its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_changes_a_killed_process_left_pending_are_numbered_by_the_next_serve() {
    let db = TestDb::new(Backend::Postgres);
    let url = db.url.clone();
    let feed = feed_on(&db).await;
    db.execute(
        "INSERT INTO resources (source, kind, id, version, state, deleted, origin) \
         VALUES ('shop', 'order', 'left1', 1, '{\"status\":\"paid\"}', false, 'webhook'), \
                ('shop', 'order', 'left2', 1, '{\"status\":\"paid\"}', false, 'webhook')",
    );
    assert_eq!(db.count("change_pending"), 2);
    assert!(
        feed.after(0, 10, &Filter::default())
            .await
            .unwrap()
            .is_empty()
    );
    let app = spawn_app_with(db, &config_toml(&url, "")).await;
    let numbered = eventually(Duration::from_secs(5), || async {
        feed.after(0, 10, &Filter::default()).await.unwrap().len() == 2
    })
    .await;
    assert!(numbered, "serve did not number the changes left pending");
    let all = feed.after(0, 10, &Filter::default()).await.unwrap();
    assert_eq!(
        all.iter()
            .map(|c| (c.seq, c.id.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "left1"), (2, "left2")]
    );
    assert_eq!(app.db.count("change_pending"), 0);
}

/// An account erased while a change of it waits to be numbered (committed by a process
/// killed before its pass): the change reaches the feed without its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_an_erased_account_leaves_no_state_in_changes_still_waiting_for_a_seq() {
    let db = TestDb::new(Backend::Postgres);
    let store = store_on(&db).await;
    db.execute(
        "INSERT INTO resources (source, account, kind, id, version, state, deleted, origin) \
         VALUES ('shop', 'acct_x', 'order', 'o1', 1, '{\"email\":\"x@example.com\"}', false, 'webhook'), \
                ('shop', 'acct_y', 'order', 'o1', 1, '{\"email\":\"y@example.com\"}', false, 'webhook')",
    );
    assert_eq!(db.count("change_pending WHERE state IS NOT NULL"), 2);
    assert_eq!(store.purge_account("shop", "acct_x").await.unwrap(), 1);
    assert_eq!(db.count("change_pending"), 0, "all numbered");
    assert_eq!(
        db.count("changes WHERE account = 'acct_x'"),
        2,
        "the waiting change and the erasure's tombstone"
    );
    assert_eq!(
        db.count("changes WHERE account = 'acct_x' AND state IS NOT NULL"),
        0
    );
    assert_eq!(
        db.count("changes WHERE account = 'acct_y' AND state IS NOT NULL"),
        1,
        "another account's change keeps its state"
    );
    assert_eq!(db.scalar("SELECT MAX(seq) AS n FROM changes"), 3);
}

/// Replicas share one vacuum clock, the server's record of change_pending's last
/// vacuum: each vacuuming on its own clock was three vacuums where one did (a tenth of
/// the database's work with three replicas at 10,000 accounts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_replicas_vacuum_change_pending_once_an_interval_between_them() {
    use webhook_reconciler::feed::outbox::Outbox;
    let db = TestDb::new(Backend::Postgres);
    let first = Outbox::new(crate::helpers::handle_on(&db).await);
    let second = Outbox::new(crate::helpers::handle_on(&db).await);
    db.execute("ALTER TABLE change_pending SET (autovacuum_enabled = false)");
    let vacuums = || {
        db.scalar(
            "SELECT vacuum_count AS n FROM pg_stat_user_tables WHERE relname = 'change_pending'",
        )
    };
    assert_eq!(vacuums(), 0);
    first.vacuum().await;
    assert!(
        eventually(Duration::from_secs(5), || async { vacuums() == 1 }).await,
        "the first replica's vacuum ran"
    );
    second.vacuum().await;
    first.vacuum().await;
    assert_eq!(vacuums(), 1, "vacuumed again within the interval");
}

/// The sequencer's pass (one call of `feed_sequence_pass`): one that finds nothing
/// pending takes no lock and writes nothing, so its commit waits for no flush; one that
/// finds changes numbers them gap-free, and waits while another transaction holds the
/// lock of `change_seq`; and under REPEATABLE READ, where its move would
/// see a snapshot older than its lock, it refuses with a message naming the setting.
#[tokio::test]
async fn on_postgres_the_pass_writes_nothing_idle_waits_its_turn_and_refuses_repeatable_read() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl, sql_query};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let scalar = |c: &mut PgConnection, sql: &str| sql_query(sql).get_result::<Row>(c).unwrap().n;
    // A pass that fails: its error's text.
    let failed_pass = |c: &mut PgConnection| {
        sql_query("SELECT feed_sequence_pass(10) AS n")
            .get_result::<Row>(c)
            .err()
            .map(|e| e.to_string())
    };

    let db = TestDb::new(Backend::Postgres);
    let _store = store_on(&db).await;
    let mut c = PgConnection::establish(&db.url).unwrap();

    c.batch_execute("BEGIN").unwrap();
    assert_eq!(scalar(&mut c, "SELECT feed_sequence_pass(10) AS n"), 0);
    assert_eq!(
        scalar(
            &mut c,
            "SELECT COUNT(*) AS n FROM (SELECT pg_current_xact_id_if_assigned() AS x) t WHERE x IS NOT NULL"
        ),
        0,
        "an empty pass took a transaction id: it locked or wrote something"
    );
    c.batch_execute("COMMIT").unwrap();

    db.execute(
        "INSERT INTO resources (source, kind, id, version, state, deleted, origin) \
         VALUES ('shop', 'order', 'p1', 1, '{\"status\":\"paid\"}', false, 'webhook'), \
                ('shop', 'order', 'p2', 1, '{\"status\":\"paid\"}', false, 'webhook'), \
                ('shop', 'order', 'p3', 1, '{\"status\":\"paid\"}', false, 'webhook')",
    );
    // A batch of 2: the pass moves 2, then 1, in one call.
    assert_eq!(scalar(&mut c, "SELECT feed_sequence_pass(2) AS n"), 3);
    assert_eq!(db.count("change_pending"), 0);
    assert_eq!(
        db.count("changes WHERE (seq, id) IN ((1, 'p1'), (2, 'p2'), (3, 'p3'))"),
        3
    );
    assert_eq!(db.scalar("SELECT last AS n FROM change_seq"), 3);

    // Passes take turns on the row lock of `change_seq`, as an erasure does: held by
    // another transaction, a pass with something to number waits for it.
    db.execute(
        "INSERT INTO resources (source, kind, id, version, state, deleted, origin) \
         VALUES ('shop', 'order', 'p4', 1, '{\"status\":\"paid\"}', false, 'webhook')",
    );
    let mut holder = PgConnection::establish(&db.url).unwrap();
    holder
        .batch_execute("BEGIN; SELECT last FROM change_seq FOR UPDATE")
        .unwrap();
    c.batch_execute("SET lock_timeout = '300ms'").unwrap();
    let waited = failed_pass(&mut c)
        .expect("a pass numbered while another transaction held the lock of change_seq");
    assert!(
        waited.contains("lock timeout"),
        "the pass failed otherwise than by waiting for the lock: {waited}"
    );
    assert_eq!(
        db.count("change_pending"),
        1,
        "the waiting pass moved something"
    );
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(scalar(&mut c, "SELECT feed_sequence_pass(10) AS n"), 1);
    assert_eq!(db.count("changes WHERE seq = 4 AND id = 'p4'"), 1);
    c.batch_execute("RESET lock_timeout").unwrap();

    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .unwrap();
    let refused = failed_pass(&mut c).expect("a pass under REPEATABLE READ ran");
    assert!(
        refused.contains("READ COMMITTED"),
        "the refusal does not name the isolation it needs: {refused}"
    );
}

/// A write that only requests its pass returns while the pass cannot run (another
/// transaction holds the lock of `change_seq`), and `flush` returns only once that pass
/// has numbered the change: what a one-shot `reconcile` relies on before it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_write_returns_before_its_pass_and_flush_waits_for_it() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, PgConnection};
    let db = TestDb::new(Backend::Postgres);
    let store = store_on(&db).await;
    let mut holder = PgConnection::establish(&db.url).unwrap();
    holder
        .batch_execute("BEGIN; SELECT last FROM change_seq FOR UPDATE")
        .unwrap();
    let written = tokio::time::timeout(
        Duration::from_secs(10),
        store.apply_batch(vec![order("w1", 1, "paid")]),
    )
    .await
    .expect("the write waited for a pass that cannot run")
    .unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(db.count("change_pending"), 1);
    let flush = {
        let outbox = store.outbox().clone();
        tokio::spawn(async move { outbox.flush().await })
    };
    // The flush's pass (or the write's) is waiting for the lock.
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.count(
                "pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND query LIKE '%feed_sequence_pass%'",
            ) >= 1
        })
        .await,
        "no pass waits for the lock of change_seq"
    );
    assert!(
        !flush.is_finished(),
        "flush returned before the change was numbered"
    );
    assert_eq!(db.count("changes"), 0);
    holder.batch_execute("COMMIT").unwrap();
    tokio::time::timeout(Duration::from_secs(10), flush)
        .await
        .expect("flush did not return after the lock was released")
        .unwrap()
        .unwrap();
    assert_eq!(db.count("change_pending"), 0);
    assert_eq!(db.count("changes WHERE seq = 1 AND id = 'w1'"), 1);
}

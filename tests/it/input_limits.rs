//! Every input gets a defined answer, the same on both backends (SPEC "Input limits"):
//! what PostgreSQL cannot store is refused before the database on SQLite too; an error
//! caused by one delivery's data is a 422 and a dead letter, never a 503; and after each
//! bad delivery a good one is still applied.

use serde_json::{Value, json};
use webhook_reconciler::reconcile::RunStatus;
use webhook_reconciler::simulator::Style;

use crate::helpers::{
    Backend, SHOP_SECRET, TestApp, TestDb, both_backends, order_event, post_signed, spawn_app,
};
use crate::reconcile::{
    assert_converged, order_fields, reconcile_config, reconciler_for, run, sim_with,
};

both_backends!(
    an_over_long_event_id_or_type_is_a_400_and_writes_nothing,
    an_over_long_resource_id_is_a_422_with_a_dead_letter,
    a_number_postgresql_cannot_store_is_a_422_on_both_backends,
    a_timestamp_version_before_1970_is_a_422_not_a_503,
    a_database_refusal_of_one_deliverys_data_is_a_422_and_only_that_one_fails,
    an_unclassified_database_error_is_a_503_so_nothing_is_lost,
    a_listing_item_that_cannot_be_read_or_stored_is_skipped_and_reported,
);

/// A good delivery after a bad one is still applied.
async fn still_applies(app: &TestApp, n: u32) {
    let (status, body) = app
        .deliver(&order_event(
            &format!("evt-good-{n}"),
            &format!("ord-good-{n}"),
            1,
            "paid",
        ))
        .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
}

fn dead_letter_reason(db: &TestDb, event_id: &str) -> String {
    let reasons = db.dead_letter_reasons();
    reasons
        .iter()
        .find(|(id, _)| id == event_id)
        .map(|(_, r)| r.clone())
        .unwrap_or_else(|| panic!("no dead letter for {event_id}: {reasons:?}"))
}

async fn an_over_long_event_id_or_type_is_a_400_and_writes_nothing(b: Backend) {
    let app = spawn_app(b).await;
    let long = "e".repeat(10_000);
    for body in [
        json!({"id": long, "type": "order.status_changed", "data": {"order_id": "o1", "version": 1}}),
        json!({"id": "evt-1", "type": long, "data": {}}),
        json!({"id": "evt\u{0}1", "type": "order.status_changed", "data": {}}),
    ] {
        let (status, reply) = app.deliver(&body).await;
        assert_eq!(status, 400, "{reply}");
        assert!(
            reply["error"].as_str().unwrap().contains("refused"),
            "{reply}"
        );
        assert!(
            !reply["error"].as_str().unwrap().contains(&long),
            "the reply does not echo it"
        );
    }
    assert_eq!(app.db.count("processed_events"), 0);
    assert_eq!(app.db.count("dead_letters"), 0);
    still_applies(&app, 1).await;
}

async fn an_over_long_resource_id_is_a_422_with_a_dead_letter(b: Backend) {
    let app = spawn_app(b).await;
    let (status, reply) = app
        .deliver(&order_event("evt-long-id", &"r".repeat(6_000), 1, "paid"))
        .await;
    assert_eq!(status, 422, "{reply}");
    let reason = dead_letter_reason(&app.db, "evt-long-id");
    assert!(reason.contains("6000 bytes long"), "{reason}");
    assert!(
        reason.len() < 600,
        "the reason does not carry the id: {}",
        reason.len()
    );
    assert_eq!(app.db.count("resources"), 0);
    still_applies(&app, 1).await;
}

async fn a_number_postgresql_cannot_store_is_a_422_on_both_backends(b: Backend) {
    let app = spawn_app(b).await;
    for (n, amount) in ["1e1000000", "1e-16384", "1e131072"]
        .into_iter()
        .enumerate()
    {
        let body = format!(
            r#"{{"id":"evt-num-{n}","type":"order.status_changed","data":{{"order_id":"o{n}","version":1,"amount":{amount}}}}}"#
        );
        let r = app.post_shop_raw(body.into_bytes()).await;
        assert_eq!(r.status().as_u16(), 422, "{amount}");
        let reason = dead_letter_reason(&app.db, &format!("evt-num-{n}"));
        assert!(reason.contains("outside the range"), "{reason}");
    }
    // The largest numbers PostgreSQL stores are stored, digit for digit, on both.
    let body = r#"{"id":"evt-big","type":"order.status_changed","data":{"order_id":"big","version":1,"amount":1e1000}}"#;
    assert_eq!(
        app.post_shop_raw(body.as_bytes().to_vec()).await.status(),
        200
    );
    still_applies(&app, 1).await;
}

async fn a_timestamp_version_before_1970_is_a_422_not_a_503(b: Backend) {
    let app = spawn_app(b).await;
    for (n, at) in ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z"]
        .into_iter()
        .enumerate()
    {
        let event = json!({"id": format!("evt-ship-{n}"), "type": "shipment.updated",
            "data": {"shipment_id": "s1", "updated_at": at}});
        let (status, reply) = app.deliver(&event).await;
        assert_eq!(status, 422, "{at}: {reply}");
        assert!(dead_letter_reason(&app.db, &format!("evt-ship-{n}")).contains("before 1970"));
    }
    let ok = json!({"id": "evt-ship-ok", "type": "shipment.updated",
        "data": {"shipment_id": "s1", "updated_at": "1970-01-01T00:00:01Z"}});
    assert_eq!(app.deliver(&ok).await.0, 200);
    still_applies(&app, 1).await;
}

/// Makes the database refuse resource `evil` by its own rule (a CHECK constraint on
/// PostgreSQL, a trigger with a data error's message on SQLite) and fail resource `odd`
/// with an error nobody classified.
fn install_refusals(db: &TestDb) {
    match db.backend {
        Backend::Postgres => db.execute(
            "ALTER TABLE resources ADD CONSTRAINT test_refuses_evil CHECK (id <> 'evil');
             CREATE FUNCTION test_odd() RETURNS trigger AS $$
             BEGIN IF NEW.id = 'odd' THEN RAISE EXCEPTION 'something nobody classified'; END IF; RETURN NEW; END
             $$ LANGUAGE plpgsql;
             CREATE TRIGGER test_odd BEFORE INSERT ON resources FOR EACH ROW EXECUTE FUNCTION test_odd();",
        ),
        Backend::Sqlite => db.execute(
            "CREATE TRIGGER test_refuses_evil BEFORE INSERT ON resources WHEN NEW.id = 'evil'
             BEGIN SELECT RAISE(ABORT, 'value too long for this test'); END;
             CREATE TRIGGER test_odd BEFORE INSERT ON resources WHEN NEW.id = 'odd'
             BEGIN SELECT RAISE(ABORT, 'something nobody classified'); END;",
        ),
    }
}

async fn a_database_refusal_of_one_deliverys_data_is_a_422_and_only_that_one_fails(b: Backend) {
    let app = spawn_app(b).await;
    install_refusals(&app.db);
    // Concurrent deliveries share group-commit transactions: only the bad one fails.
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (client, url) = (app.client.clone(), app.url("/webhooks/shop"));
        let id = if i == 11 {
            "evil".to_string()
        } else {
            format!("ord-{i}")
        };
        let body = order_event(&format!("evt-{i}"), &id, 1, "paid").to_string();
        tasks.push(tokio::spawn(async move {
            let addr = url
                .trim_start_matches("http://")
                .trim_end_matches("/webhooks/shop")
                .to_string();
            post_signed(&client, addr, &body, SHOP_SECRET)
                .await
                .status()
                .as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(statuses[11], 422, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .enumerate()
            .all(|(i, s)| i == 11 || *s == 200),
        "{statuses:?}"
    );
    assert_eq!(app.db.count("resources"), 23);
    assert!(dead_letter_reason(&app.db, "evt-11").contains("database refused"));
    // Its retries are answered the same, never 503, and cost no connection: a refused
    // value leaves the connection as good as it was.
    let connections = |pools: Value| {
        let pools = pools.as_object().unwrap().clone();
        pools
            .into_iter()
            .map(|(name, p)| (name, p["open"].clone(), p["opened_total"].clone()))
            .collect::<Vec<_>>()
    };
    let before = connections(app.pools().await);
    for _ in 0..3 {
        let (status, _) = app.deliver(&order_event("evt-11", "evil", 1, "paid")).await;
        assert_eq!(status, 422);
    }
    still_applies(&app, 1).await;
    assert_eq!(
        connections(app.pools().await),
        before,
        "connections retired or opened"
    );
}

async fn an_unclassified_database_error_is_a_503_so_nothing_is_lost(b: Backend) {
    let app = spawn_app(b).await;
    install_refusals(&app.db);
    let r = app
        .post_shop(&order_event("evt-odd", "odd", 1, "paid"))
        .await;
    assert_eq!(r.status().as_u16(), 503);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(
        app.db.count("processed_events WHERE event_id = 'evt-odd'"),
        0,
        "not claimed"
    );
    still_applies(&app, 1).await;
}

async fn a_listing_item_that_cannot_be_read_or_stored_is_skipped_and_reported(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    for i in 0..20 {
        sim.put("orders", &format!("o{i:02}"), 2, order_fields("paid"));
    }
    // Item 3 of page 2 (page_size 7) has a version nobody can read; "evil" is refused
    // by the database; both are reported, the rest applied.
    sim.put("orders", "o09", 2, json!({"status": "paid"}));
    sim.put("orders", "o10", 2, json!({"status": "paid"}));
    let r = reconciler_for(&reconcile_config(&db.url, &sim, Style::Cursor, "", "")).await;
    install_refusals(&db);
    sim.put("orders", "evil", 1, order_fields("paid"));
    sim.put_raw(
        "orders",
        "o10",
        json!({"id": "o10", "version": "not-a-number", "status": "paid"}),
    );
    let report = run(&r, "order", false).await;
    let RunStatus::Failed { error } = &report.status else {
        panic!("{report:?}");
    };
    assert!(error.contains("2 listed item(s)"), "{error}");
    assert_eq!(report.counts.skipped, 2, "{report:?}");
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("/orders?") && s.contains("\"o10\"") && s.contains("version")),
        "{:?}",
        report.skipped
    );
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("\"evil\"") && s.contains("database refused")),
        "{:?}",
        report.skipped
    );
    assert_eq!(db.count("resources"), 19, "everything else was applied");
    assert_eq!(
        db.count("reconcile_runs WHERE status = 'failed' AND skipped = 2"),
        1
    );
    assert_eq!(
        db.count("reconcile_checkpoints"),
        0,
        "the sweep went to its end"
    );

    // The sender fixes its items: the next run converges.
    sim.remove("orders", "evil");
    sim.put("orders", "o10", 2, json!({"status": "paid"}));
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_converged(&db, &sim, "orders", "order");
}

both_backends!(a_mapped_github_event_type_whose_body_lacks_its_fields_is_a_422);

/// GitHub's event type comes from a header its signature does not cover: a type that is
/// mapped but whose body lacks the mapped fields is a clear 422, never a silent success.
async fn a_mapped_github_event_type_whose_body_lacks_its_fields_is_a_422(b: Backend) {
    use webhook_reconciler::signature as sign;
    let app = spawn_app(b).await;
    let body = json!({"action": "created", "comment": {"id": 5}}).to_string();
    let r = app
        .client
        .post(app.url("/webhooks/gh"))
        .header("X-GitHub-Delivery", "d-1")
        .header("X-GitHub-Event", "issues")
        .header(
            "X-Hub-Signature-256",
            sign::github(crate::helpers::GITHUB_SECRET.as_bytes(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    assert!(dead_letter_reason(&app.db, "d-1").contains("/issue/id"));
    assert_eq!(app.db.count("resources"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_daemon_writes_sqlite_with_synchronous_full() {
    use diesel::RunQueryDsl;
    use webhook_reconciler::app::Application;
    use webhook_reconciler::config::Config;
    use webhook_reconciler::db::Conn;

    #[derive(diesel::QueryableByName)]
    struct Sync {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        synchronous: i32,
    }
    fn pragma(c: &mut Conn) -> diesel::QueryResult<i32> {
        let Conn::Sqlite(c) = c else {
            unreachable!("a SQLite test")
        };
        let r: Sync = diesel::sql_query("PRAGMA synchronous").get_result(c)?;
        Ok(r.synchronous)
    }
    let db = TestDb::new(Backend::Sqlite);
    let config = Config::from_toml_str(&crate::helpers::config_toml(&db.url, "")).unwrap();
    let app = Application::build(config).await.unwrap();
    let handle = app.db().clone();
    let server = tokio::spawn(async move { app.run_until(std::future::pending()).await });
    // 2 = FULL: every commit is on disk before the 200 is sent.
    assert_eq!(handle.write(pragma).await.unwrap(), 2, "the writer");
    assert_eq!(handle.read(pragma).await.unwrap(), 2, "a reader");
    server.abort();

    let config = Config::from_toml_str(&crate::helpers::config_toml(
        &db.url,
        "synchronous = \"normal\"",
    ))
    .unwrap();
    let handle = webhook_reconciler::db::Db::connect(&config.database).unwrap();
    assert_eq!(
        handle.write(pragma).await.unwrap(),
        1,
        "NORMAL when asked for"
    );
}

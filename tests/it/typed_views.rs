//! Typed views (SPEC "Typed tables per kind"), on both backends: every column type's
//! conversion, a value that does not convert read as NULL, tombstones, the index used
//! through the view, the presets' views filled from the simulated senders' objects, and
//! views following the configuration across restarts.

use diesel::prelude::*;
use diesel::sql_query;
use diesel::sql_types::{Nullable, Text};
use serde_json::{Value, json};
use webhook_reconciler::app::Application;
use webhook_reconciler::config::Config;
use webhook_reconciler::simulator::providers::Provider;

use crate::helpers::{Backend, TestDb, both_backends, config_toml, spawn_app_with};

both_backends!(
    every_type_converts_and_a_value_that_does_not_reads_as_null,
    a_query_through_the_view_by_an_indexed_column_uses_the_index,
    the_presets_views_are_filled_from_the_senders_objects,
    a_column_added_appears_after_a_restart_and_one_removed_disappears,
    a_name_taken_by_a_table_of_someone_elses_is_refused_and_nothing_changes,
);

/// The `shop` source's orders with one column of each type (and each timestamp format),
/// a nested pointer and one whose key holds a quote and a semicolon.
const COLUMNS: &str = r#"
[sources.shop.kinds.order.columns]
status = "/status"
email = "/customer/email"
amount = { pointer = "/amount", type = "bigint" }
price = { pointer = "/price", type = "numeric" }
paid = { pointer = "/paid", type = "boolean" }
at_unix = { pointer = "/at_unix", type = "timestamptz", format = "unix" }
at_ms = { pointer = "/at_ms", type = "timestamptz", format = "unix_ms" }
at_rfc = { pointer = "/at_rfc", type = "timestamptz", format = "rfc3339" }
odd = "/it's; DROP TABLE resources; --"
"#;

/// The test configuration with `indexes` on the shop's orders and `more` after it.
fn config(url: &str, indexes: &str, more: &str) -> String {
    let base = config_toml(url, "");
    let order = "[sources.shop.kinds.order]\nversion = \"/version\"\n";
    assert!(base.contains(order));
    let with = base.replace(order, &format!("{order}indexes = [{indexes}]\n"));
    format!("{with}\n{more}")
}

fn order(event_id: &str, order_id: &str, data: Value) -> Value {
    let mut data = data;
    data["order_id"] = json!(order_id);
    data["version"] = json!(1);
    json!({"id": event_id, "type": "order.status_changed", "data": data})
}

/// One row's column as text: timestamps as ISO 8601 UTC with milliseconds (SQLite's
/// form), booleans as `true`/`false`, numbers as the backend writes them.
fn cell(db: &TestDb, view: &str, id: &str, column: &str) -> Option<String> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Nullable<Text>)]
        v: Option<String>,
    }
    let expr = match (db.backend, column) {
        (Backend::Postgres, "at_unix" | "at_ms" | "at_rfc") => {
            format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
        }
        (Backend::Sqlite, "paid" | "deleted") => {
            format!("CASE {column} WHEN 1 THEN 'true' WHEN 0 THEN 'false' END")
        }
        _ => format!("CAST({column} AS TEXT)"),
    };
    let sql = format!("SELECT {expr} AS v FROM {view} WHERE id = '{id}'");
    let rows: Vec<Row> = match db.backend {
        Backend::Postgres => sql_query(sql)
            .load(&mut PgConnection::establish(&db.url).unwrap())
            .unwrap(),
        Backend::Sqlite => sql_query(sql).load(&mut sqlite(db)).unwrap(),
    };
    assert_eq!(rows.len(), 1, "{view} has no row {id}");
    rows.into_iter().next().unwrap().v
}

/// A reader that waits for the daemon's writer.
fn sqlite(db: &TestDb) -> SqliteConnection {
    use diesel::connection::SimpleConnection;
    let mut c = SqliteConnection::establish(db.url.strip_prefix("sqlite://").unwrap()).unwrap();
    c.batch_execute("PRAGMA busy_timeout = 10000").unwrap();
    c
}

/// The plan of `query` (PostgreSQL with sequential scans off: the test's tables are
/// small, and the question is whether the index can be used at all).
fn plan(db: &TestDb, query: &str) -> String {
    #[derive(QueryableByName)]
    struct PgLine {
        #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
        line: String,
    }
    #[derive(QueryableByName)]
    struct SqliteLine {
        #[diesel(sql_type = Text)]
        detail: String,
    }
    match db.backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(&db.url).unwrap();
            sql_query("SET enable_seqscan = off")
                .execute(&mut c)
                .unwrap();
            let lines: Vec<PgLine> = sql_query(format!("EXPLAIN {query}")).load(&mut c).unwrap();
            lines
                .into_iter()
                .map(|l| l.line)
                .collect::<Vec<_>>()
                .join("\n")
        }
        Backend::Sqlite => {
            let mut c = sqlite(db);
            let lines: Vec<SqliteLine> = sql_query(format!("EXPLAIN QUERY PLAN {query}"))
                .load(&mut c)
                .unwrap();
            lines
                .into_iter()
                .map(|l| l.detail)
                .collect::<Vec<_>>()
                .join("\n")
        }
    }
}

async fn every_type_converts_and_a_value_that_does_not_reads_as_null(b: Backend) {
    let db = TestDb::new(b);
    let toml = config(&db.url, "\"email\", \"amount\"", COLUMNS);
    let app = spawn_app_with(db, &toml).await;
    let good = order(
        "evt_good",
        "ord_good",
        json!({
            "status": "open", "customer": {"email": "a@example.com"}, "amount": 1200,
            "price": "12.50", "paid": true, "at_unix": 1700000000, "at_ms": 1700000000250i64,
            "at_rfc": "2023-11-14T23:13:20+01:00", "it's; DROP TABLE resources; --": "read",
        }),
    );
    // Every value of the wrong shape: text where a number is, a number too long, a
    // boolean spelled otherwise, times that are not times.
    let bad = order(
        "evt_bad",
        "ord_bad",
        json!({
            "status": 7, "customer": "not an object", "amount": "12x", "price": "1.2.3",
            "paid": "maybe", "at_unix": "soon", "at_ms": 1.5, "at_rfc": "yesterday",
        }),
    );
    let strings = order(
        "evt_strings",
        "ord_strings",
        json!({"amount": "-42", "price": 3, "paid": "false", "at_unix": "1700000000"}),
    );
    for body in [&good, &bad, &strings] {
        assert_eq!(app.deliver(body).await.0, 200);
    }
    let deleted = json!({"id": "evt_del", "type": "order.deleted", "data": {"order_id": "ord_good", "version": 2}});
    assert_eq!(app.deliver(&deleted).await.0, 200);

    let db = &app.db;
    let v = |id: &str, col: &str| cell(db, "shop_order", id, col);
    let s = |x: &str| Some(x.to_string());
    assert_eq!(v("ord_bad", "status"), s("7"), "a number reads as its text");
    assert_eq!(
        v("ord_strings", "status"),
        None,
        "a missing key reads as NULL"
    );
    for col in [
        "email", "amount", "price", "paid", "at_unix", "at_ms", "at_rfc", "odd",
    ] {
        assert_eq!(
            v("ord_bad", col),
            None,
            "{col} of the wrong shape reads as NULL"
        );
    }
    assert_eq!(
        v("ord_strings", "amount"),
        s("-42"),
        "a string of digits is a bigint"
    );
    assert_eq!(v("ord_strings", "paid"), s("false"));
    assert_eq!(v("ord_strings", "at_unix"), s("2023-11-14T22:13:20.000Z"));
    let price = v("ord_strings", "price").unwrap();
    assert!(price == "3" || price == "3.0", "{price}");
    // The tombstone keeps its row, marked; its last state is still read.
    assert_eq!(v("ord_good", "deleted"), s("true"));
    assert_eq!(v("ord_bad", "deleted"), s("false"));
    assert_eq!(db.count("shop_order"), 3);
    // The good order's values, through a second order (the first is a tombstone now).
    let again = order("evt_good2", "ord_good2", good["data"].clone());
    assert_eq!(app.deliver(&again).await.0, 200);
    assert_eq!(v("ord_good2", "status"), s("open"));
    assert_eq!(v("ord_good2", "email"), s("a@example.com"));
    assert_eq!(v("ord_good2", "amount"), s("1200"));
    let price = v("ord_good2", "price").unwrap();
    assert!(price == "12.50" || price == "12.5", "{price}");
    assert_eq!(v("ord_good2", "paid"), s("true"));
    assert_eq!(v("ord_good2", "at_unix"), s("2023-11-14T22:13:20.000Z"));
    assert_eq!(v("ord_good2", "at_ms"), s("2023-11-14T22:13:20.250Z"));
    assert_eq!(
        v("ord_good2", "at_rfc"),
        s("2023-11-14T22:13:20.000Z"),
        "the offset is applied"
    );
    assert_eq!(
        v("ord_good2", "odd"),
        s("read"),
        "the quoted key is read, nothing else"
    );
    assert_eq!(
        db.count("resources"),
        4,
        "the pointer's SQL-looking key changed nothing"
    );
    // Comparisons through typed columns never fail on the rows that did not convert.
    assert_eq!(db.count("shop_order WHERE amount > 100 AND NOT deleted"), 1);
    assert_eq!(db.count("shop_order WHERE paid AND NOT deleted"), 1);
    assert_eq!(
        db.count("shop_order WHERE at_unix < at_ms AND NOT deleted"),
        1
    );
}

async fn a_query_through_the_view_by_an_indexed_column_uses_the_index(b: Backend) {
    let db = TestDb::new(b);
    let toml = config(&db.url, "\"email\", \"amount\"", COLUMNS);
    let app = spawn_app_with(db, &toml).await;
    for i in 0..20 {
        let body = order(
            &format!("evt_{i}"),
            &format!("ord_{i}"),
            json!({"customer": {"email": format!("c{i}@example.com")}, "amount": i}),
        );
        assert_eq!(app.deliver(&body).await.0, 200);
    }
    let db = &app.db;
    assert_eq!(db.count("shop_order WHERE email = 'c7@example.com'"), 1);
    for (query, index) in [
        (
            "SELECT id FROM shop_order WHERE email = 'c7@example.com'",
            "shop_order_email_",
        ),
        (
            "SELECT id FROM shop_order WHERE amount = 7",
            "shop_order_amount_",
        ),
    ] {
        let p = plan(db, query);
        assert!(p.contains(index), "{query} does not use {index}*:\n{p}");
        // Searched by the column's value, not only read through.
        let searched = match db.backend {
            Backend::Postgres => p.contains("Index Cond"),
            Backend::Sqlite => p.contains("SEARCH") && p.contains("<expr>="),
        };
        assert!(searched, "{query}:\n{p}");
    }
}

async fn the_presets_views_are_filled_from_the_senders_objects(b: Backend) {
    // Stripe: invoices.
    let (app, r, sim) = crate::senders::setup(b, "stripe", Provider::Stripe, 10).await;
    sim.change(
        "invoices",
        "in_1",
        json!({"customer": "cus_1", "status": "open", "amount_due": 1200}),
        "invoice.created",
    );
    sim.change(
        "invoices",
        "in_2",
        json!({"customer": "cus_2", "status": "paid", "amount_due": 0}),
        "invoice.created",
    );
    crate::senders::run(&r, "stripe", "invoice").await;
    let db = &app.db;
    assert_eq!(
        db.count("stripe_invoice WHERE customer = 'cus_1' AND status = 'open' AND amount_due = 1200 AND NOT deleted"),
        1
    );
    assert_eq!(
        db.count("stripe_invoice WHERE amount_due = 0 AND status = 'paid'"),
        1
    );
    assert_eq!(
        db.count("stripe_customer"),
        0,
        "a kind with columns has its view"
    );
    drop(app);

    // Shopify: orders, the price a decimal string.
    let (app, r, sim) = crate::senders::setup(b, "shop", Provider::Shopify, 10).await;
    sim.change(
        "orders",
        "450789469001",
        json!({"email": "bob@example.com", "financial_status": "paid", "fulfillment_status": null, "total_price": "12.50"}),
        "orders/create",
    );
    crate::senders::run(&r, "shop", "order").await;
    let db = &app.db;
    assert_eq!(
        db.count("shop_order WHERE email = 'bob@example.com' AND financial_status = 'paid' AND total_price = 12.5 AND fulfillment_status IS NULL"),
        1
    );
    drop(app);

    // GitHub: issues, the author's login from a nested object.
    let (app, r, sim) = crate::senders::setup(b, "github", Provider::Github, 10).await;
    sim.change("issues", "3", json!({"title": "Broken link"}), "opened");
    sim.change(
        "issues",
        "4",
        json!({"title": "Typo", "state": "closed"}),
        "closed",
    );
    crate::senders::run(&r, "github", "issue").await;
    let db = &app.db;
    assert_eq!(
        db.count("github_issue WHERE number = 3 AND state = 'open' AND title = 'Broken link' AND user_login = 'octocat'"),
        1
    );
    assert_eq!(db.count("github_issue WHERE state = 'closed'"), 1);
}

/// `serve`'s start (migrations and views), then its end.
async fn start_and_stop(toml: &str) {
    drop(
        Application::build(Config::from_toml_str(toml).unwrap())
            .await
            .unwrap(),
    );
}

/// The view's column names, in order.
fn view_columns(db: &TestDb, view: &str) -> Vec<String> {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        name: String,
    }
    let names: Vec<Name> = match db.backend {
        Backend::Postgres => sql_query(format!(
            "SELECT column_name::text AS name FROM information_schema.columns WHERE table_name = '{view}' ORDER BY ordinal_position"
        ))
        .load(&mut PgConnection::establish(&db.url).unwrap())
        .unwrap(),
        Backend::Sqlite => sql_query(format!("SELECT name FROM pragma_table_info('{view}') ORDER BY cid"))
            .load(&mut sqlite(db))
            .unwrap(),
    };
    names.into_iter().map(|n| n.name).collect()
}

fn index_count(db: &TestDb, prefix: &str) -> i64 {
    match db.backend {
        Backend::Postgres => db.count(&format!("pg_indexes WHERE indexname LIKE '{prefix}%'")),
        Backend::Sqlite => db.count(&format!(
            "sqlite_master WHERE type = 'index' AND name LIKE '{prefix}%'"
        )),
    }
}

async fn a_column_added_appears_after_a_restart_and_one_removed_disappears(b: Backend) {
    let db = TestDb::new(b);
    let first = config(
        &db.url,
        "\"status\"",
        "[sources.shop.kinds.order.columns]\nstatus = \"/status\"\nversion_text = \"/version\"\n\
         [sources.billing.kinds.invoice.columns]\ncustomer = \"/customer\"\n",
    );
    start_and_stop(&first).await;
    assert_eq!(
        view_columns(&db, "shop_order"),
        [
            "account",
            "id",
            "version",
            "deleted",
            "updated_at",
            "status",
            "version_text"
        ]
    );
    assert_eq!(view_columns(&db, "billing_invoice").len(), 6);
    assert_eq!(index_count(&db, "shop_order_status_"), 1);

    // `status` out, `amount` in (indexed instead), billing's columns gone: its view too.
    let second = config(
        &db.url,
        "\"amount\"",
        "[sources.shop.kinds.order.columns]\nversion_text = \"/version\"\namount = { pointer = \"/amount\", type = \"bigint\" }\n",
    );
    start_and_stop(&second).await;
    assert_eq!(
        view_columns(&db, "shop_order"),
        [
            "account",
            "id",
            "version",
            "deleted",
            "updated_at",
            "amount",
            "version_text"
        ]
    );
    assert!(
        view_columns(&db, "billing_invoice").is_empty(),
        "the undeclared view is dropped"
    );
    assert_eq!(
        index_count(&db, "shop_order_status_"),
        0,
        "its index with it"
    );
    assert_eq!(index_count(&db, "shop_order_amount_"), 1);
    assert_eq!(db.count("typed_views"), 1);

    // The same configuration again changes nothing, and `migrate` says so.
    let dir = tempfile::tempdir().unwrap();
    let path = crate::helpers::process::write_config(dir.path(), &second);
    let out = crate::helpers::process::bin()
        .args(["--config", path.to_str().unwrap(), "migrate"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("typed views unchanged: shop_order"),
        "{stdout}"
    );
}

async fn a_name_taken_by_a_table_of_someone_elses_is_refused_and_nothing_changes(b: Backend) {
    let db = TestDb::new(b);
    let base = config_toml(&db.url, "");
    let first = format!("{base}\n[sources.shop.kinds.order.columns]\nstatus = \"/status\"\n");
    start_and_stop(&first).await;
    db.execute("CREATE TABLE billing_invoice (x INTEGER)");
    let second =
        format!("{first}\n[sources.billing.kinds.invoice.columns]\ncustomer = \"/customer\"\n");
    let err = match Application::build(Config::from_toml_str(&second).unwrap()).await {
        Ok(_) => panic!("a view over someone's table was made"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("\"billing_invoice\"") && err.contains("view = "),
        "{err}"
    );
    assert_eq!(db.count("billing_invoice"), 0, "their table is untouched");
    assert_eq!(
        view_columns(&db, "shop_order").len(),
        6,
        "our view is untouched"
    );
}

/// Replicas starting together on one PostgreSQL database: one makes the views, the
/// others wait for it (the migration lock) and find them made; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_at_once_make_the_views_once() {
    let db = TestDb::new(Backend::Postgres);
    let toml = config(&db.url, "\"email\", \"amount\"", COLUMNS);
    let build = || async { Application::build(Config::from_toml_str(&toml).unwrap()).await };
    let (a, b, c) = tokio::join!(build(), build(), build());
    for r in [&a, &b, &c] {
        assert!(r.is_ok(), "{:?}", r.as_ref().err());
    }
    assert_eq!(db.count("typed_views"), 1);
    assert_eq!(index_count(&db, "shop_order_"), 2);
}

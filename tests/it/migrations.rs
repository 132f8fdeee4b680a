//! Databases an earlier release left, with data in them, migrate in place.

use serde_json::json;
use webhook_reconciler::feed::{Feed, Filter};

use crate::helpers::{
    Backend, TestDb, both_backends, config_toml, handle_on, order_event, spawn_app_with,
};

both_backends!(the_account_columns_arrive_empty_on_every_existing_row_and_the_feed_carries_them,);

/// The schema before the account columns (2026-12-02), with a resource, its change, a
/// claim, a run, a lease, a checkpoint and a watermark in it: after `migrate` every row
/// is still there under account `''`, the old change reads back, and new writes flow.
async fn the_account_columns_arrive_empty_on_every_existing_row_and_the_feed_carries_them(
    b: Backend,
) {
    let db = TestDb::new(b);
    db.migrate_before("2026-12-03-000009");
    let (now, state) = match b {
        Backend::Postgres => ("now()", "'{\"status\":\"paid\"}'::jsonb"),
        Backend::Sqlite => ("'2026-12-02T10:00:00.000Z'", "'{\"status\":\"paid\"}'"),
    };
    db.execute(&format!(
        "INSERT INTO resources (source, kind, id, version, state, deleted, origin, last_event_id) \
         VALUES ('shop', 'order', 'o_old', 3, {state}, false, 'webhook', 'e_old');
         DELETE FROM change_pending;
         INSERT INTO changes (seq, source, kind, id, version, deleted, state, origin, event_id) \
         VALUES (1, 'shop', 'order', 'o_old', 3, false, {state}, 'webhook', 'e_old');
         UPDATE change_seq SET last = 1;
         INSERT INTO processed_events (source, event_id, event_type, outcome) \
         VALUES ('shop', 'e_old', 'order.status_changed', 'applied');
         INSERT INTO reconcile_runs (source, kind, mode, status, finished_at) \
         VALUES ('shop', 'order', 'full', 'succeeded', {now});
         INSERT INTO reconcile_leases (source, kind, holder, expires_at) VALUES ('shop', 'order', 'h', {now});
         INSERT INTO reconcile_checkpoints (source, kind, position, sweep_started_at) \
         VALUES ('shop', 'order', 'cursor-7', {now});
         INSERT INTO reconcile_state (source, kind, watermark) VALUES ('shop', 'order', 42);"
    ));
    // The release's own migrate step brings it up to date.
    let handle = handle_on(&db).await;
    for table in [
        "resources",
        "changes",
        "reconcile_runs",
        "reconcile_leases",
        "reconcile_checkpoints",
        "reconcile_state",
    ] {
        assert_eq!(db.count(table), 1, "{table}");
        assert_eq!(
            db.count(&format!("{table} WHERE account = ''")),
            1,
            "{table}"
        );
    }
    assert_eq!(db.count("processed_events"), 1);
    // The claims' table, rebuilt on SQLite for its wider check (2026-12-06), kept its
    // row and columns, and takes `fetching` now; its unique body digest still holds.
    assert_eq!(
        db.count(
            "processed_events WHERE event_id = 'e_old' AND outcome = 'applied' AND account = ''"
        ),
        1
    );
    db.execute(
        "INSERT INTO processed_events (source, event_id, event_type, outcome, body_digest, account, kind, resource_id) \
         VALUES ('shop', 'e_fetch', 'orders/updated', 'fetching', 'd1', 's', 'order', '1')",
    );
    let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        db.execute(
            "INSERT INTO processed_events (source, event_id, event_type, outcome, body_digest) \
             VALUES ('shop', 'e_other', 'orders/updated', 'applied', 'd1')",
        )
    }));
    assert!(again.is_err(), "the body digest is still unique per source");
    db.execute("DELETE FROM processed_events WHERE event_id = 'e_fetch'");
    // The run's success is its account-kind's last success (2026-12-05).
    assert_eq!(
        db.count(
            "reconcile_last_success WHERE source = 'shop' AND account = '' AND kind = 'order'"
        ),
        1
    );
    // The keys now include the account: the same id in another account is another row.
    db.execute(&format!(
        "INSERT INTO resources (source, account, kind, id, version, state, deleted, origin) \
         VALUES ('shop', 'acct_x', 'order', 'o_old', 1, {state}, false, 'reconcile');
         INSERT INTO reconcile_leases (source, account, kind, holder, expires_at) VALUES ('shop', 'acct_x', 'order', 'h', {now});"
    ));
    assert_eq!(db.count("resources WHERE id = 'o_old'"), 2);
    assert_eq!(db.count("reconcile_leases"), 2);
    db.execute("DELETE FROM resources WHERE account = 'acct_x'; DELETE FROM change_pending; DELETE FROM reconcile_leases WHERE account = 'acct_x';");
    let feed = Feed::new(handle);
    let page = feed.page(0, 10, &Filter::default()).await.unwrap();
    assert_eq!(page.changes.len(), 1);
    assert_eq!(page.changes[0].account, "");
    assert_eq!(page.changes[0].state, json!({"status": "paid"}));
    // New deliveries go on from there; their changes carry the account too.
    let url = db.url.clone();
    let app = spawn_app_with(db, &config_toml(&url, "")).await;
    assert_eq!(
        app.deliver(&order_event("e_new", "o_old", 4, "shipped"))
            .await
            .0,
        200
    );
    let body: serde_json::Value = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(app.db.count("changes WHERE seq = 2 AND account = ''"), 1);
    assert_eq!(
        app.db.count("resources WHERE id = 'o_old' AND version = 4"),
        1
    );
}

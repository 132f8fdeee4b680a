//! Many accounts behind one source: a delivery is applied to the account its signed
//! body names when that account is registered and enabled, and answered `ignored`
//! otherwise; the registry through the command line.

use std::process::Output;

use serde_json::Value;

use crate::helpers::process::{bin, write_migrated_config};
use crate::helpers::{Backend, TestDb, both_backends, config_toml, order_event, spawn_app_with};

const MANY: &str = "\n[sources.shop.accounts]\nfrom = \"/account\"\n";

fn in_account(event_id: &str, account: &str, version: i64, status: &str) -> Value {
    let mut e = order_event(event_id, "o1", version, status);
    e["account"] = Value::from(account);
    e
}

both_backends!(
    deliveries_go_to_the_account_their_signed_body_names_when_it_is_registered,
    the_accounts_command_adds_lists_disables_and_removes,
);

async fn deliveries_go_to_the_account_their_signed_body_names_when_it_is_registered(b: Backend) {
    let db = TestDb::new(b);
    let url = db.url.clone();
    let app = spawn_app_with(db, &(config_toml(&url, "") + MANY)).await;
    let registry =
        webhook_reconciler::accounts::Accounts::new(crate::helpers::handle_on(&app.db).await);
    registry.add("shop", "acct_1", None, None).await.unwrap();
    registry.add("shop", "acct_2", None, None).await.unwrap();
    let outcome = |(status, body): (u16, Value)| {
        assert_eq!(status, 200, "{body}");
        body["outcome"].as_str().unwrap().to_string()
    };
    // The same order id in two accounts, and in the platform's own ('': no account named).
    assert_eq!(
        outcome(app.deliver(&in_account("e1", "acct_1", 2, "paid")).await),
        "applied"
    );
    assert_eq!(
        outcome(app.deliver(&in_account("e2", "acct_2", 1, "new")).await),
        "applied"
    );
    assert_eq!(
        outcome(app.deliver(&order_event("e3", "o1", 1, "new")).await),
        "applied"
    );
    // An older version in acct_1 is stale there only.
    assert_eq!(
        outcome(app.deliver(&in_account("e4", "acct_1", 1, "new")).await),
        "stale"
    );
    // An account nobody registered: nothing written.
    assert_eq!(
        outcome(app.deliver(&in_account("e5", "acct_9", 5, "paid")).await),
        "ignored"
    );
    assert_eq!(app.db.count("resources WHERE id = 'o1'"), 3);
    assert_eq!(app.db.count("resources WHERE account = 'acct_9'"), 0);
    // Disabled: ignored, its row stays as it was.
    assert!(
        registry
            .set_enabled("shop", "acct_2", Some("test"))
            .await
            .unwrap()
    );
    assert_eq!(
        outcome(app.deliver(&in_account("e6", "acct_2", 3, "shipped")).await),
        "ignored"
    );
    assert_eq!(
        app.db
            .count("resources WHERE account = 'acct_2' AND version = 1"),
        1
    );
    // An account named by something that is not an id is a dead letter, not a guess.
    let mut odd = in_account("e7", "acct_1", 9, "paid");
    odd["account"] = serde_json::json!({"id": "acct_1"});
    assert_eq!(app.deliver(&odd).await.0, 422);
    assert_eq!(app.db.count("dead_letters"), 1);
    // The feed names each change's account.
    let accounts: Vec<String> = {
        let mut a = Vec::new();
        for account in ["acct_1", "acct_2", ""] {
            a.push(
                app.db
                    .count(&format!("changes WHERE account = '{account}'"))
                    .to_string(),
            );
        }
        a
    };
    assert_eq!(accounts, ["1", "1", "1"]);
}

fn run(cfg: &std::path::Path, args: &[&str]) -> Output {
    bin()
        .arg("--config")
        .arg(cfg)
        .arg("accounts")
        .args(args)
        .output()
        .unwrap()
}

async fn the_accounts_command_adds_lists_disables_and_removes(b: Backend) {
    let db = TestDb::new(b);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_migrated_config(dir.path(), &(config_toml(&db.url, "") + MANY));
    for account in ["acct_1", "acct_2"] {
        let out = run(&cfg, &["add", "shop", account]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        run(&cfg, &["disable", "shop", "acct_2"]).status.code(),
        Some(0)
    );
    let listed = run(&cfg, &["list", "shop", "--json"]);
    let rows: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[0]["account"], "acct_1");
    assert_eq!(rows[0]["enabled"], true);
    assert_eq!(rows[1]["enabled"], false);
    // Rows of the accounts, as deliveries or a reconcile would have left them.
    let state = match b {
        Backend::Postgres => "'{}'::jsonb",
        Backend::Sqlite => "'{}'",
    };
    db.execute(&format!(
        "INSERT INTO resources (source, account, kind, id, version, state, deleted, origin) VALUES \
         ('shop', 'acct_1', 'order', 'o1', 1, {state}, false, 'webhook'), \
         ('shop', 'acct_1', 'order', 'o2', 1, {state}, false, 'webhook'), \
         ('shop', 'acct_2', 'order', 'o1', 1, {state}, false, 'webhook');
         DELETE FROM change_pending;"
    ));
    // Remove tombstones (each a change); --purge deletes.
    let out = run(&cfg, &["remove", "shop", "acct_1"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 rows tombstoned"));
    assert_eq!(
        db.count("resources WHERE account = 'acct_1' AND deleted"),
        2
    );
    assert_eq!(db.count("changes WHERE account = 'acct_1' AND deleted"), 2);
    let out = run(&cfg, &["remove", "shop", "acct_2", "--purge"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(db.count("resources WHERE account = 'acct_2'"), 0);
    assert_eq!(db.count("accounts"), 0);
    // Not registered: exit 1, named. A source of one account, or none: exit 2, named.
    let out = run(&cfg, &["disable", "shop", "acct_2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not registered"));
    let out = run(&cfg, &["add", "billing", "acct_1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[sources.billing.accounts]"));
    assert_eq!(run(&cfg, &["add", "nope", "acct_1"]).status.code(), Some(2));
}

//! Tenants as the platforms run them (SPEC "Tenants as the platforms run them"): a
//! Shopify app on two shops, each its own simulated API, driven by the lifecycle and
//! privacy webhooks Shopify sends, signed as Shopify signs them. Erasure cannot be
//! replayed or forged: a redact of an installed shop, a customer's body under the shop's
//! topic and a replay after a reinstall erase nothing; an uninstall then a redact
//! erases, and so does a genuine second one after a reinstall and a second uninstall.

use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use webhook_reconciler::operations::Operations;
use webhook_reconciler::simulator::providers::{Provider, ProviderSim, Webhook};

use crate::connect::{
    ACCOUNTS_KEY, NEVER, PLATFORM_TOKEN, SHOPIFY_SECRET, STRIPE_WHSEC, answered, lifecycle,
    post_to, with_header,
};
use crate::helpers::{Backend, TestApp, TestDb, both_backends, eventually, spawn_app_with};

const SHOP_A: &str = "shop-a.myshopify.com";
const SHOP_B: &str = "shop-b.myshopify.com";

/// A delivery of `topic` for `shop`, signed as Shopify signs it (the body only).
fn shopify_hook(topic: &str, id: &str, shop: &str, body: &Value) -> Webhook {
    let body = body.to_string();
    Webhook {
        event_id: id.into(),
        headers: vec![
            ("X-Shopify-Topic".into(), topic.into()),
            ("X-Shopify-Webhook-Id".into(), id.into()),
            ("X-Shopify-Shop-Domain".into(), shop.into()),
            (
                "X-Shopify-Hmac-Sha256".into(),
                webhook_reconciler::signature::shopify(SHOPIFY_SECRET.as_bytes(), body.as_bytes()),
            ),
        ],
        body,
    }
}

fn uninstalled(shop: &str, updated_at: &str) -> Value {
    json!({"id": 1, "name": "Shop", "domain": shop, "myshopify_domain": shop, "updated_at": updated_at})
}

fn config(db_url: &str) -> String {
    format!(
        r#"
[database]
url = "{db_url}"

[http]
listen = "127.0.0.1:0"

[accounts]
key = "{ACCOUNTS_KEY}"

[sources.shopify]
preset = "shopify"
requests_per_second = 100

[sources.shopify.webhook]
secrets = ["{SHOPIFY_SECRET}"]

[sources.shopify.reconcile]
cron = "{NEVER}"
run_at_start = false

[sources.shopify.accounts]
# The shops are simulators on this machine.
api_bases = ["http://127.0.0.1:*/"]
"#
    )
}

/// The app on shops A and B (each its own simulated API and token), once their first
/// syncs (due at `accounts add`) are done: a sync listing the simulators later would
/// bring back what a test erases, as Shopify's own listing would. `toml` adjusts the
/// configuration.
async fn two_shops(
    b: Backend,
    toml: impl FnOnce(String) -> String,
) -> (TestApp, Operations, ProviderSim, ProviderSim) {
    let sim_a = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let sim_b = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = toml(config(&db.url));
    let app = spawn_app_with(db, &toml).await;
    let ops = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    for (shop, sim, token) in [(SHOP_A, &sim_a, "shpat_a"), (SHOP_B, &sim_b, "shpat_b")] {
        ops.add_account(
            "shopify",
            shop,
            Some(sim.api_base()),
            Some(SecretString::from(token)),
        )
        .await
        .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db.count("reconcile_runs WHERE status = 'succeeded'") == 6
        })
        .await,
        "the first syncs did not finish"
    );
    (app, ops, sim_a, sim_b)
}

/// Delivers `hook` for `shop` and waits until its row of `kind` `id` is stored (the
/// state is fetched from the shop's API).
async fn deliver_and_wait(app: &TestApp, shop: &str, hook: &Webhook, kind: &str, id: &str) {
    // Two simulators number their deliveries alike: the id names the shop too.
    let hook = with_header(
        &with_header(hook, "X-Shopify-Shop-Domain", shop),
        "X-Shopify-Webhook-Id",
        &format!("{shop}-{}", hook.event_id),
    );
    assert_eq!(answered(app, "/webhooks/shopify", &hook).await, "fetching");
    let row = format!(
        "resources WHERE account = '{shop}' AND kind = '{kind}' AND id = '{id}' AND NOT deleted"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count(&row) == 1
        })
        .await,
        "{shop} {kind} {id} was not stored"
    );
}

both_backends!(
    shopify_lifecycle_webhooks_drive_the_registry_and_erasure_cannot_be_replayed_or_forged
);

async fn shopify_lifecycle_webhooks_drive_the_registry_and_erasure_cannot_be_replayed_or_forged(
    b: Backend,
) {
    let (app, ops, sim_a, sim_b) = two_shops(b, |toml| toml).await;
    let buyer = |n: &str| json!({"email": "buyer@example.com", "note": n});
    // Shop A: orders 1001 and 1002 of customer 7, and the customer; shop B: its own 1001.
    let o1 = sim_a.change("orders", "1001", buyer("a1"), "orders/updated");
    deliver_and_wait(&app, SHOP_A, &o1, "order", "1001").await;
    let o2 = sim_a.change("orders", "1002", buyer("a2"), "orders/updated");
    deliver_and_wait(&app, SHOP_A, &o2, "order", "1002").await;
    let c7 = sim_a.change("customers", "7", buyer("c"), "customers/update");
    deliver_and_wait(&app, SHOP_A, &c7, "customer", "7").await;
    let b1 = sim_b.change("orders", "1001", buyer("b1"), "orders/updated");
    deliver_and_wait(&app, SHOP_B, &b1, "order", "1001").await;
    let rows_of = |shop: &str| app.db.count(&format!("resources WHERE account = '{shop}'"));
    let states_kept = |shop: &str| {
        app.db.count(&format!(
            "changes WHERE account = '{shop}' AND state IS NOT NULL"
        ))
    };
    assert_eq!(rows_of(SHOP_A), 3);

    // customers/redact erases exactly the named order and the customer: rows gone, their
    // kept changes blanked, one erasure change each.
    let customer = json!({"id": 7, "email": "buyer@example.com", "phone": "555-0100"});
    let redact_customer = json!({
        "shop_id": 1, "shop_domain": SHOP_A, "customer": customer, "orders_to_redact": [1001]
    });
    let hook = shopify_hook("customers/redact", "cr-1", SHOP_A, &redact_customer);
    assert_eq!(answered(&app, "/webhooks/shopify", &hook).await, "applied");
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count("change_pending") == 0
        })
        .await
    );
    assert_eq!(
        app.db.count(&format!("resources WHERE account = '{SHOP_A}' AND ((kind = 'order' AND id = '1001') OR (kind = 'customer' AND id = '7'))")),
        0
    );
    assert_eq!(
        app.db.count(&format!("resources WHERE account = '{SHOP_A}' AND kind = 'order' AND id = '1002' AND NOT deleted")),
        1
    );
    assert_eq!(
        app.db.count(&format!(
            "resources WHERE account = '{SHOP_B}' AND id = '1001' AND NOT deleted"
        )),
        1
    );
    assert_eq!(
        app.db.count(&format!("changes WHERE account = '{SHOP_A}' AND ((kind = 'order' AND id = '1001') OR (kind = 'customer' AND id = '7')) AND state IS NOT NULL")),
        0
    );
    assert_eq!(
        app.db.count(&format!(
            "changes WHERE account = '{SHOP_A}' AND deleted AND origin = 'erasure'"
        )),
        2
    );
    assert_eq!(
        app.db
            .count("changes WHERE origin = 'erasure' AND state IS NOT NULL"),
        0
    );
    // The same body again: a duplicate, nothing more appended.
    let again = with_header(&hook, "X-Shopify-Webhook-Id", "cr-1-again");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &again).await,
        "duplicate"
    );

    // customers/data_request reaches the application as a change.
    let request = json!({
        "shop_id": 1, "shop_domain": SHOP_A, "orders_requested": [1002],
        "customer": {"id": 8, "email": "other@example.com"}, "data_request": {"id": 99}
    });
    let hook = shopify_hook("customers/data_request", "dr-1", SHOP_A, &request);
    assert_eq!(answered(&app, "/webhooks/shopify", &hook).await, "applied");
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count(&format!(
                "changes WHERE account = '{SHOP_A}' AND kind = 'customer_data_request' AND id = '99' AND origin = 'webhook'"
            )) == 1
        })
        .await
    );

    // shop/redact of an installed shop erases nothing; nor does a signed customer's
    // redaction sent under the shop's topic.
    let redact_shop = json!({"shop_id": 1, "shop_domain": SHOP_A});
    let redact = shopify_hook("shop/redact", "sr-1", SHOP_A, &redact_shop);
    assert_eq!(
        answered(&app, "/webhooks/shopify", &redact).await,
        "ignored"
    );
    let forged = shopify_hook("shop/redact", "sr-forged", SHOP_A, &redact_customer);
    assert_eq!(
        answered(&app, "/webhooks/shopify", &forged).await,
        "ignored"
    );
    assert_eq!(rows_of(SHOP_A), 2, "order 1002 and the data request");
    assert_eq!(
        app.db
            .count(&format!("accounts WHERE account = '{SHOP_A}' AND enabled")),
        1
    );

    // app/uninstalled disables the shop (why and since when are kept); its rows stay.
    let gone = shopify_hook(
        "app/uninstalled",
        "un-1",
        SHOP_A,
        &uninstalled(SHOP_A, "2026-12-01T00:00:00Z"),
    );
    assert_eq!(answered(&app, "/webhooks/shopify", &gone).await, "applied");
    assert_eq!(
        app.db.count(&format!(
            "accounts WHERE account = '{SHOP_A}' AND NOT enabled AND disabled_reason = 'app/uninstalled' AND disabled_at IS NOT NULL AND uninstalled_by = 'un-1'"
        )),
        1
    );
    assert_eq!(
        app.db
            .count(&format!("reconcile_due WHERE account = '{SHOP_A}'")),
        0
    );
    assert_eq!(rows_of(SHOP_A), 2);
    let listed = ops.accounts(Some("shopify")).await.unwrap();
    let a = listed.iter().find(|r| r.account == SHOP_A).unwrap();
    assert_eq!(a.disabled_reason.as_deref(), Some("app/uninstalled"));
    assert!(a.disabled_since.is_some());
    // `explain` of one of its orders says so too.
    let x = ops
        .explain("shopify", "order", "1002", Some(SHOP_A))
        .await
        .unwrap();
    let registered = x.registered.expect("the shop is registered");
    assert!(!registered.enabled);
    assert_eq!(
        registered.disabled_reason.as_deref(),
        Some("app/uninstalled")
    );
    // The same uninstall body replayed under a fresh id is a duplicate.
    let replayed = with_header(&gone, "X-Shopify-Webhook-Id", "un-1-replayed");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &replayed).await,
        "duplicate"
    );

    // Now the redact erases: every row of the shop, every kept state, the registration;
    // each live row one change with origin `erasure`. Shop B is untouched.
    let erasures_before = app.db.count("changes WHERE origin = 'erasure'");
    let redact = with_header(&redact, "X-Shopify-Webhook-Id", "sr-2");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &redact).await,
        "applied"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count("change_pending") == 0
        })
        .await
    );
    assert_eq!(rows_of(SHOP_A), 0);
    assert_eq!(states_kept(SHOP_A), 0);
    assert_eq!(
        app.db
            .count(&format!("accounts WHERE account = '{SHOP_A}'")),
        0
    );
    assert_eq!(
        app.db.count("changes WHERE origin = 'erasure'"),
        erasures_before + 2
    );
    assert_eq!(rows_of(SHOP_B), 1);
    assert!(states_kept(SHOP_B) > 0);
    // A replay finds no shop to erase.
    let replay = with_header(&redact, "X-Shopify-Webhook-Id", "sr-3");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &replay).await,
        "ignored"
    );

    // Reinstalled (the app's install callback registers it again) with new data: the
    // captured redact replayed erases nothing. (Shopify keeps nothing of the first
    // installation's orders here, so the reinstall's first sync lists only the new one.)
    for (collection, id) in [("orders", "1001"), ("orders", "1002"), ("customers", "7")] {
        sim_a.remove(collection, id);
    }
    ops.add_account(
        "shopify",
        SHOP_A,
        Some(sim_a.api_base()),
        Some(SecretString::from("shpat_a2")),
    )
    .await
    .unwrap();
    let o3 = sim_a.change("orders", "1003", buyer("a3"), "orders/updated");
    deliver_and_wait(&app, SHOP_A, &o3, "order", "1003").await;
    let replay = with_header(&redact, "X-Shopify-Webhook-Id", "sr-4");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &replay).await,
        "ignored"
    );
    assert_eq!(rows_of(SHOP_A), 1);
    assert_eq!(
        app.db
            .count(&format!("accounts WHERE account = '{SHOP_A}' AND enabled")),
        1
    );

    // Uninstalled again: the genuine second redact (the same body Shopify always sends
    // for this shop) erases the second installation's data.
    let gone = shopify_hook(
        "app/uninstalled",
        "un-2",
        SHOP_A,
        &uninstalled(SHOP_A, "2026-12-05T00:00:00Z"),
    );
    assert_eq!(answered(&app, "/webhooks/shopify", &gone).await, "applied");
    let second = with_header(&redact, "X-Shopify-Webhook-Id", "sr-5");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &second).await,
        "applied"
    );
    assert_eq!(rows_of(SHOP_A), 0);
    assert_eq!(
        app.db
            .count(&format!("accounts WHERE account = '{SHOP_A}'")),
        0
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count("change_pending") == 0
                && app.db.count(&format!(
                    "changes WHERE account = '{SHOP_A}' AND state IS NOT NULL"
                )) == 0
        })
        .await,
        "pending {}, states kept {}",
        app.db.count("change_pending"),
        app.db.count(&format!(
            "changes WHERE account = '{SHOP_A}' AND state IS NOT NULL"
        ))
    );
    assert_eq!(rows_of(SHOP_B), 1);

    // The claims of lifecycle and erasure events outlive retention: a prune with age
    // zero removes every other claim and keeps them.
    let store = crate::helpers::store_on(&app.db).await;
    store
        .prune_events("shopify", Duration::ZERO, 10_000)
        .await
        .unwrap();
    assert_eq!(
        app.db
            .count("processed_events WHERE event_type = 'orders/updated'"),
        0
    );
    for t in [
        "customers/redact",
        "customers/data_request",
        "app/uninstalled",
        "shop/redact",
    ] {
        assert!(
            app.db
                .count(&format!("processed_events WHERE event_type = '{t}'"))
                > 0,
            "{t}'s claims were pruned"
        );
    }
    // A body that is not a JSON object is refused as any delivery is (400), never a 500.
    let (status, _) = post_to(
        &app,
        "/webhooks/shopify",
        &shopify_hook("shop/redact", "sr-x", SHOP_B, &json!([1])),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(rows_of(SHOP_B), 1);
}

/// A Stripe event of `event_type` for the connected account `account`, signed as Stripe
/// signs it.
fn stripe_event(id: &str, event_type: &str, account: &str) -> Webhook {
    let body = json!({
        "id": id, "object": "event", "type": event_type, "account": account,
        "created": 1_765_000_000, "livemode": false,
        "data": {"object": {"id": "ca_platform", "object": "application", "name": "Platform"}},
    })
    .to_string();
    let now = chrono::Utc::now().timestamp();
    Webhook {
        event_id: id.into(),
        headers: vec![(
            "Stripe-Signature".into(),
            webhook_reconciler::signature::stripe(STRIPE_WHSEC.as_bytes(), now, body.as_bytes()),
        )],
        body,
    }
}

both_backends!(stripe_connect_authorizations_register_and_deauthorizations_disable_accounts);

/// `account.application.authorized` registers a connected account and starts its first
/// sync (no operator call); a replay is a duplicate; `deauthorized` disables it, says why
/// in the registry, and its deliveries are then ignored.
async fn stripe_connect_authorizations_register_and_deauthorizations_disable_accounts(b: Backend) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = crate::connect::config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let app = spawn_app_with(db, &toml).await;
    sim.change_in(
        "acct_A1",
        "customers",
        "cus_1",
        json!({"name": "A's"}),
        "customer.updated",
    );
    assert_eq!(app.db.count("accounts"), 0);
    let authorized = stripe_event("evt_auth_1", "account.application.authorized", "acct_A1");
    // The registry refuses the write once (a trigger stands for a database that
    // cannot take it): answered 503 and the claim given up, so the retry registers.
    match b {
        Backend::Postgres => app.db.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT ON accounts FOR EACH ROW EXECUTE FUNCTION refuse()",
        ),
        Backend::Sqlite => app.db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON accounts BEGIN SELECT RAISE(ABORT, 'refused'); END",
        ),
    }
    let (status, _) = post_to(&app, "/webhooks/stripe", &authorized).await;
    assert_eq!(status, 503);
    assert_eq!(
        app.db
            .count("processed_events WHERE event_id = 'evt_auth_1'"),
        0
    );
    app.db.execute(match b {
        Backend::Postgres => "DROP TRIGGER refuse ON accounts",
        Backend::Sqlite => "DROP TRIGGER refuse",
    });
    assert_eq!(
        answered(&app, "/webhooks/stripe", &authorized).await,
        "applied"
    );
    assert_eq!(
        app.db
            .count("accounts WHERE account = 'acct_A1' AND enabled"),
        1
    );
    // Its first sync runs under `serve` with no operator call.
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db
                .count("resources WHERE account = 'acct_A1' AND id = 'cus_1'")
                == 1
        })
        .await,
        "the authorized account was not synced"
    );
    assert_eq!(
        answered(&app, "/webhooks/stripe", &authorized).await,
        "duplicate"
    );

    let deauthorized = stripe_event(
        "evt_deauth_1",
        "account.application.deauthorized",
        "acct_A1",
    );
    assert_eq!(
        answered(&app, "/webhooks/stripe", &deauthorized).await,
        "applied"
    );
    assert_eq!(
        app.db.count("accounts WHERE account = 'acct_A1' AND NOT enabled AND disabled_reason = 'account.application.deauthorized' AND disabled_at IS NOT NULL"),
        1
    );
    assert_eq!(app.db.count("reconcile_due WHERE account = 'acct_A1'"), 0);
    assert_eq!(
        app.db
            .count("resources WHERE account = 'acct_A1' AND NOT deleted"),
        1,
        "rows are kept"
    );
    let update = sim.change_in(
        "acct_A1",
        "customers",
        "cus_1",
        json!({"name": "A's, later"}),
        "customer.updated",
    );
    assert_eq!(answered(&app, "/webhooks/stripe", &update).await, "ignored");
    // An account id of the wrong shape is never registered: a dead letter, not a row.
    let misshapen = stripe_event(
        "evt_auth_2",
        "account.application.authorized",
        "not-an-account",
    );
    let (status, _) = post_to(&app, "/webhooks/stripe", &misshapen).await;
    assert_eq!(status, 422);
    assert_eq!(app.db.count("accounts WHERE account = 'not-an-account'"), 0);
}

/// A GitHub delivery of `event` for installation `installation`, signed as GitHub signs
/// it (the body only).
fn github_hook(event: &str, delivery: &str, body: &Value) -> Webhook {
    let body = body.to_string();
    Webhook {
        event_id: delivery.into(),
        headers: vec![
            ("X-GitHub-Event".into(), event.into()),
            ("X-GitHub-Delivery".into(), delivery.into()),
            (
                "X-Hub-Signature-256".into(),
                webhook_reconciler::signature::github(GITHUB_SECRET.as_bytes(), body.as_bytes()),
            ),
        ],
        body,
    }
}

const GITHUB_SECRET: &str = "hook-secret-0123456789";

fn issue_event(
    installation: u64,
    repository: &str,
    number: u64,
    title: &str,
    updated: &str,
) -> Value {
    json!({
        "action": "edited",
        "issue": {"id": 1_347_000_000 + number, "number": number, "title": title, "state": "open",
                  "created_at": "2026-12-01T00:00:00Z", "updated_at": updated, "user": {"login": "octocat", "id": 1}},
        "repository": {"id": 1, "full_name": repository},
        "installation": {"id": installation},
        "sender": {"login": "octocat", "id": 1},
    })
}

both_backends!(github_installation_webhooks_drive_the_registry_and_another_repositorys_issue_never_overwrites_a_row);

/// A GitHub App: `installation` `created` registers the installation and starts its first
/// sync (its issues listed with its own minted token); a delivery for the repository its
/// base lists is applied, one for another repository of the same installation with the
/// same number is `ignored` (never overwrites); `suspend` / `unsuspend` disable and
/// enable it; `deleted` unregisters it and tombstones its rows; a replay of the captured
/// `created` registers nothing.
async fn github_installation_webhooks_drive_the_registry_and_another_repositorys_issue_never_overwrites_a_row(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Github, GITHUB_SECRET)
        .await
        .unwrap();
    let (private, public) = crate::github_app::app_key();
    sim.enable_app("123456", &public, &["4711"], 3600).unwrap();
    sim.change("issues", "7", json!({"title": "shop seven"}), "opened");
    // GitHub's issues listing holds pull requests too, marked by `pull_request`.
    sim.change(
        "issues",
        "8",
        json!({"title": "a pull request", "pull_request": {"url": "https://api.github.com/repos/acme/shop/pulls/8"}}),
        "opened",
    );
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("app.pem");
    std::fs::write(&key_file, secrecy::ExposeSecret::expose_secret(&private)).unwrap();
    let db = TestDb::new(b);
    let toml = format!(
        r#"
[database]
url = "{}"

[http]
listen = "127.0.0.1:0"

[sources.github]
preset = "github"
api_base = "{}"
requests_per_second = 100

[sources.github.webhook]
secrets = ["{GITHUB_SECRET}"]

[sources.github.reconcile]
cron = "{NEVER}"
run_at_start = false

[sources.github.kinds]
pull_request = false

[sources.github.accounts]
app_id = "123456"
app_key = {{ file = "{}" }}
"#,
        db.url,
        sim.api_base(),
        key_file.display()
    );
    let app = spawn_app_with(db, &toml).await;
    let installation = |action: &str| {
        json!({"action": action, "installation": {"id": 4711, "account": {"login": "acme"}},
               "repositories": [{"full_name": "acme/shop"}], "sender": {"login": "octocat"}})
    };
    let created = github_hook("installation", "d-created", &installation("created"));
    assert_eq!(
        answered(&app, "/webhooks/github", &created).await,
        "applied"
    );
    assert_eq!(
        app.db
            .count("accounts WHERE source = 'github' AND account = '4711' AND enabled"),
        1
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db
                .count("resources WHERE account = '4711' AND kind = 'issue' AND id = '7'")
                == 1
        })
        .await,
        "the new installation was not synced"
    );
    let title = |b: Backend| match b {
        Backend::Postgres => "state->>'title'",
        Backend::Sqlite => "json_extract(state, '$.title')",
    };
    let seven_is = |t: &str| {
        app.db.count(&format!(
            "resources WHERE account = '4711' AND id = '7' AND {} = '{t}'",
            title(b)
        )) == 1
    };
    assert!(seven_is("shop seven"));
    // The pull request listed among the issues is not an issue row; the typed view
    // tells legacy ones apart.
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db.count(
                "reconcile_runs WHERE account = '4711' AND kind = 'issue' AND status = 'succeeded'",
            ) == 1
        })
        .await
    );
    assert_eq!(
        app.db
            .count("resources WHERE account = '4711' AND kind = 'issue' AND id = '8'"),
        0
    );
    assert_eq!(
        app.db
            .count("github_issue WHERE account = '4711' AND pull_request_url IS NULL"),
        1
    );
    // Newer than the listed #7 (the simulator's clock is the real one).
    let later = (chrono::Utc::now() + chrono::Duration::seconds(30))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    // The same installation, another repository's #7: ignored, the row stays.
    let other = github_hook(
        "issues",
        "d-other-7",
        &issue_event(4711, "acme/other", 7, "other seven", &later),
    );
    assert_eq!(answered(&app, "/webhooks/github", &other).await, "ignored");
    assert!(seven_is("shop seven"));
    // Its own repository's #7 (any case of the name): applied.
    let own = github_hook(
        "issues",
        "d-own-7",
        &issue_event(4711, "Acme/Shop", 7, "shop seven edited", &later),
    );
    assert_eq!(answered(&app, "/webhooks/github", &own).await, "applied");
    assert!(seven_is("shop seven edited"));

    let suspend = github_hook("installation", "d-suspend", &installation("suspend"));
    assert_eq!(
        answered(&app, "/webhooks/github", &suspend).await,
        "applied"
    );
    assert_eq!(
        app.db.count("accounts WHERE account = '4711' AND NOT enabled AND disabled_reason = 'installation suspended'"),
        1
    );
    let unsuspend = github_hook("installation", "d-unsuspend", &installation("unsuspend"));
    assert_eq!(
        answered(&app, "/webhooks/github", &unsuspend).await,
        "applied"
    );
    assert_eq!(
        app.db
            .count("accounts WHERE account = '4711' AND enabled AND disabled_reason IS NULL"),
        1
    );

    // The repository its base lists removed from the installation: its rows tombstoned
    // (a change each), the installation kept.
    let removed = github_hook(
        "installation_repositories",
        "d-removed",
        &json!({"action": "removed", "installation": {"id": 4711},
                "repository_selection": "selected", "repositories_added": [],
                "repositories_removed": [{"id": 1, "full_name": "acme/shop"}]}),
    );
    assert_eq!(
        answered(&app, "/webhooks/github", &removed).await,
        "applied"
    );
    assert_eq!(
        app.db
            .count("resources WHERE account = '4711' AND NOT deleted"),
        0
    );
    assert_eq!(app.db.count("accounts WHERE account = '4711'"), 1);
    let deleted = github_hook("installation", "d-deleted", &installation("deleted"));
    assert_eq!(
        answered(&app, "/webhooks/github", &deleted).await,
        "applied"
    );
    assert_eq!(app.db.count("accounts WHERE account = '4711'"), 0);
    assert_eq!(
        app.db
            .count("resources WHERE account = '4711' AND NOT deleted"),
        0
    );
    assert_eq!(
        app.db.count("resources WHERE account = '4711' AND deleted"),
        1
    );
    // The captured `created` replayed under a fresh delivery id registers nothing.
    let replay = with_header(&created, "X-GitHub-Delivery", "d-created-again");
    assert_eq!(
        answered(&app, "/webhooks/github", &replay).await,
        "duplicate"
    );
    assert_eq!(app.db.count("accounts WHERE account = '4711'"), 0);
}

both_backends!(
    a_flash_sales_pending_fetches_are_fetched_many_at_a_time_and_a_quiet_shop_still_lands_at_once
);

/// 500 updates of one shop acknowledged at once, at the Shopify preset's budget (2
/// requests a second per shop): fetched in a few `orders.json?ids=` requests, all
/// landed within 10 s, while another shop's one delivery lands within 2 s. An order the
/// shop no longer has is left out of the answer: fetched alone, it deletes nothing.
async fn a_flash_sales_pending_fetches_are_fetched_many_at_a_time_and_a_quiet_shop_still_lands_at_once(
    b: Backend,
) {
    // The preset's budget: no requests_per_second of the test's own.
    let (app, _ops, sim_a, sim_b) =
        two_shops(b, |toml| toml.replace("requests_per_second = 100\n", "")).await;
    // An order stored earlier, then gone at the shop, then named by a late delivery.
    let gone = sim_a.change("orders", "9999", json!({"note": "kept"}), "orders/updated");
    deliver_and_wait(&app, SHOP_A, &gone, "order", "9999").await;
    let late = sim_a.change("orders", "9999", json!({"note": "later"}), "orders/updated");
    sim_a.remove("orders", "9999");
    let before = sim_a.get_requests();

    let hooks: Vec<Webhook> = (0..500)
        .map(|i| {
            let hook = sim_a.change(
                "orders",
                &format!("{}", 10_000 + i),
                json!({"note": "sale"}),
                "orders/paid",
            );
            let hook = with_header(&hook, "X-Shopify-Shop-Domain", SHOP_A);
            with_header(&hook, "X-Shopify-Webhook-Id", &format!("sale-{i}"))
        })
        .collect();
    let started = std::time::Instant::now();
    let late = with_header(
        &with_header(&late, "X-Shopify-Shop-Domain", SHOP_A),
        "X-Shopify-Webhook-Id",
        "late-9999",
    );
    assert_eq!(answered(&app, "/webhooks/shopify", &late).await, "fetching");
    for chunk in hooks.chunks(25) {
        let answers = futures_util::future::join_all(
            chunk.iter().map(|h| answered(&app, "/webhooks/shopify", h)),
        )
        .await;
        assert!(answers.iter().all(|a| a == "fetching"), "{answers:?}");
    }
    // The quiet shop's one delivery lands within 2 s of its answer.
    let quiet = sim_b.change("orders", "5", json!({"note": "quiet"}), "orders/updated");
    let quiet = with_header(
        &with_header(&quiet, "X-Shopify-Shop-Domain", SHOP_B),
        "X-Shopify-Webhook-Id",
        "quiet-5",
    );
    let asked = std::time::Instant::now();
    assert_eq!(
        answered(&app, "/webhooks/shopify", &quiet).await,
        "fetching"
    );
    assert!(
        eventually(Duration::from_secs(2), || async {
            app.db.count(&format!(
                "resources WHERE account = '{SHOP_B}' AND id = '5'"
            )) == 1
        })
        .await,
        "the quiet shop's delivery did not land within 2 s ({:?})",
        asked.elapsed()
    );
    let sale = format!(
        "resources WHERE account = '{SHOP_A}' AND kind = 'order' AND id <> '9999' AND NOT deleted"
    );
    let landed = eventually(
        Duration::from_secs(10).saturating_sub(started.elapsed()),
        || async { app.db.count(&sale) == 500 },
    )
    .await;
    if !landed {
        eprintln!(
            "errors: left out {}, erased {}, rate {}, other {}",
            app.db.count("pending_fetches WHERE error LIKE '%left it out%'"),
            app.db.count("pending_fetches WHERE error LIKE '%erased%'"),
            app.db.count("pending_fetches WHERE error LIKE '%ate%limit%' OR error LIKE '%429%'"),
            app.db.count("pending_fetches WHERE error IS NOT NULL AND error NOT LIKE '%left it out%' AND error NOT LIKE '%erased%'"),
        );
    }
    assert!(
        landed,
        "{} of 500 landed in {:?}; {} requests for many, {} gets; pending {} ({} with an error, {} attempted more than once)",
        app.db.count(&sale),
        started.elapsed(),
        sim_a.get_many_requests(),
        sim_a.get_requests(),
        app.db.count("pending_fetches"),
        app.db.count("pending_fetches WHERE error IS NOT NULL"),
        app.db.count("pending_fetches WHERE attempts > 1"),
    );
    let many = sim_a.get_many_requests();
    eprintln!(
        "500 pending fetches of one shop landed in {:?}, in {many} get_many requests",
        started.elapsed()
    );
    assert!((1..=10).contains(&many), "{many} get_many requests");
    assert!(
        eventually(Duration::from_secs(10), || async {
            app.db.count("pending_fetches") == 0
        })
        .await,
        "{} fetches still pending: {} taken, {} failed, {} with an error, {} attempted once, {} due later",
        app.db.count("pending_fetches"),
        app.db.count("pending_fetches WHERE taken_by IS NOT NULL"),
        app.db.count("pending_fetches WHERE failed_at IS NOT NULL"),
        app.db.count("pending_fetches WHERE error IS NOT NULL"),
        app.db.count("pending_fetches WHERE attempts = 1"),
        app.db.count(&format!(
            "pending_fetches WHERE due_at > {}",
            if b == Backend::Postgres {
                "now()"
            } else {
                "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
            }
        )),
    );
    // Left out of the answer, fetched alone (404): the stored row stays as it was.
    assert!(sim_a.get_requests() - before - many >= 1);
    assert_eq!(
        app.db.count(&format!(
            "resources WHERE account = '{SHOP_A}' AND id = '9999' AND NOT deleted"
        )),
        1
    );
}

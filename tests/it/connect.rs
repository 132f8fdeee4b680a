//! Many accounts behind one sender, end to end against the simulated Stripe Connect API
//! (a real HTTP server scoping objects by the `Stripe-Account` header): each account
//! reconciled through its own requests and credential, an account added under `serve`
//! synced within seconds, a failing account holding back no other, replicas sharing the
//! accounts without running one twice at once, and the admin API.

use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webhook_reconciler::change::Account;
use webhook_reconciler::config::Config;
use webhook_reconciler::operations::Operations;
use webhook_reconciler::reconcile::{RunOptions, RunStatus};
use webhook_reconciler::simulator::providers::{Provider, ProviderSim, Webhook};
use webhook_reconciler::store::Store;

use crate::helpers::{Backend, TestApp, TestDb, both_backends, eventually, spawn_app_with};
use crate::reconcile::reconciler_for;

pub(crate) const STRIPE_WHSEC: &str = "whsec_c3RyaXBlLXNpbXVsYXRvci1zZWNyZXQ";
/// 32 bytes in base64: the test's accounts.key.
pub(crate) const ACCOUNTS_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
pub(crate) const NEVER: &str = "0 0 0 1 1 *";
pub(crate) const PLATFORM_TOKEN: &str = "sk_platform_secret_1";

/// A Stripe Connect source (the preset fills `from = "/account"` and the
/// `Stripe-Account` header); `schedule` is its reconcile schedule line.
pub(crate) fn config(db_url: &str, sim: &ProviderSim, schedule: &str, api_token: &str) -> String {
    format!(
        r#"
[database]
url = "{db_url}"
max_connections = 8

[http]
listen = "127.0.0.1:0"
admin_token = "{ADMIN_TOKEN}"

[accounts]
key = "{ACCOUNTS_KEY}"

[sources.stripe]
preset = "stripe"
api_base = "{base}"
api_token = "{api_token}"
requests_per_second = 500

[sources.stripe.webhook]
secrets = ["{STRIPE_WHSEC}"]

[sources.stripe.reconcile]
{schedule}
run_at_start = false
lease_ttl = "10s"
page_size = 10
# A failing account gives up after one retry (the test waits for its failure).
max_attempts = 2

[sources.stripe.catchup]
cron = "{NEVER}"

# Customers only: each account's other kinds are the same code with other paths.
[sources.stripe.kinds]
subscription = false
invoice = false
payment_intent = false
charge = false
refund = false
product = false
price = false

[sources.stripe.accounts]
concurrency = 4
"#,
        base = sim.api_base(),
    )
}

pub(crate) fn lifecycle(toml: &str, store: Store) -> Operations {
    Operations::new(Arc::new(Config::from_toml_str(toml).unwrap()), store)
}

/// The customers of `account` in the database as (id, name), by id.
fn names(db: &TestDb, account: &str) -> Vec<(String, String)> {
    let name = match db.backend {
        Backend::Postgres => "state->>'name'",
        Backend::Sqlite => "json_extract(state, '$.name')",
    };
    let ids = ["cus_0", "cus_1", "cus_2", "cus_3"];
    let mut out = Vec::new();
    for id in ids {
        for candidate in ["A's", "B's", "B's other", "platform's"] {
            let n = db.count(&format!(
                "resources WHERE kind = 'customer' AND account = '{account}' AND id = '{id}' AND {name} = '{}'",
                candidate.replace('\'', "''")
            ));
            if n == 1 {
                out.push((id.to_string(), candidate.to_string()));
            }
        }
    }
    assert_eq!(
        db.count(&format!(
            "resources WHERE kind = 'customer' AND account = '{account}'"
        )),
        out.len() as i64,
        "rows of {account:?} with other ids or names"
    );
    out
}

both_backends!(
    each_accounts_reconcile_sends_its_stripe_account_and_credential_and_never_mixes_objects,
    an_account_added_under_serve_is_synced_within_seconds_and_a_failing_one_holds_back_no_other,
    the_admin_api_adds_lists_and_removes_accounts_and_never_returns_a_credential,
);

async fn each_accounts_reconcile_sends_its_stripe_account_and_credential_and_never_mixes_objects(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let r = reconciler_for(&toml).await;
    let life = lifecycle(&toml, crate::helpers::store_on(&db).await);
    life.add_account("stripe", "acct_a", None, None)
        .await
        .unwrap();
    life.add_account(
        "stripe",
        "acct_b",
        None,
        Some(SecretString::from("sk_acct_b_own_secret")),
    )
    .await
    .unwrap();
    // The same customer id in two accounts, and one of the platform's own.
    sim.change_in(
        "acct_a",
        "customers",
        "cus_1",
        json!({"name": "A's"}),
        "customer.created",
    );
    sim.change_in(
        "acct_b",
        "customers",
        "cus_1",
        json!({"name": "B's"}),
        "customer.created",
    );
    sim.change_in(
        "acct_b",
        "customers",
        "cus_3",
        json!({"name": "B's other"}),
        "customer.created",
    );
    sim.change_in(
        "",
        "customers",
        "cus_2",
        json!({"name": "platform's"}),
        "customer.created",
    );

    let (s, k) = r
        .kinds(Some("stripe"), Some("customer"))
        .into_iter()
        .next()
        .map(|(s, k)| (s.clone(), k.clone()))
        .unwrap();
    let accounts = r.accounts_of(&s).await.unwrap();
    assert_eq!(
        accounts,
        [
            Account::Own,
            Account::Named("acct_a".into()),
            Account::Named("acct_b".into())
        ]
    );
    for account in &accounts {
        let report = r
            .run_account_kind(
                &s,
                &k,
                account,
                &RunOptions::default(),
                &CancellationToken::new(),
                &|_| {},
            )
            .await;
        assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
        assert_eq!(report.account, account.stored());
    }
    assert_eq!(names(&db, "acct_a"), [("cus_1".into(), "A's".into())]);
    assert_eq!(
        names(&db, "acct_b"),
        [
            ("cus_1".into(), "B's".into()),
            ("cus_3".into(), "B's other".into())
        ]
    );
    assert_eq!(names(&db, ""), [("cus_2".into(), "platform's".into())]);
    // `explain` without an account on a many-account source names the accounts that
    // hold the id (the platform's own has no cus_1).
    let x = life
        .explain("stripe", "customer", "cus_1", None)
        .await
        .unwrap();
    assert!(x.is_unknown());
    assert_eq!(x.in_accounts, ["acct_a", "acct_b"]);
    // Each request named its account, with that account's credential or the platform's.
    let headers = sim.account_headers();
    let credentials = sim.credentials();
    assert_eq!(headers.len(), credentials.len());
    for account in ["", "acct_a", "acct_b"] {
        assert!(
            headers.iter().any(|h| h == account),
            "{account}: {headers:?}"
        );
    }
    for (account, credential) in headers.iter().zip(&credentials) {
        let want = if account == "acct_b" {
            "Bearer sk_acct_b_own_secret"
        } else {
            "Bearer sk_platform_secret_1"
        };
        assert_eq!(credential.as_deref(), Some(want), "request for {account:?}");
    }
    // Kept sealed: the database never holds the credential in the clear.
    assert_eq!(db.count("accounts WHERE credential IS NOT NULL"), 1);
    assert_eq!(db.count("accounts WHERE credential LIKE '%sk_acct_b%'"), 0);
    let listed = serde_json::to_string(&life.accounts(Some("stripe")).await.unwrap()).unwrap();
    assert!(!listed.contains("sk_acct_b"), "{listed}");
    assert!(listed.contains("\"has_credential\":true"), "{listed}");
    // An account's conflict is settled through its own API too.
    assert_eq!(
        r.resolve_in("stripe", "acct_b", "customer", "cus_1").await,
        Ok(false),
        "nothing newer to apply"
    );
}

async fn an_account_added_under_serve_is_synced_within_seconds_and_a_failing_one_holds_back_no_other(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = config(&db.url, &sim, "every = \"2s\"", PLATFORM_TOKEN);
    let app = spawn_app_with(db, &toml).await;
    let accounts = ["acct_1", "acct_2", "acct_3", "acct_bad"];
    for a in accounts {
        for i in 0..3 {
            sim.change_in(
                a,
                "customers",
                &format!("cus_{i}"),
                json!({"name": a}),
                "customer.created",
            );
        }
    }
    sim.fail_account("acct_bad", true);
    // A delivery for an account nobody registered: ignored, nothing written.
    let hook = sim.change_in(
        "acct_1",
        "customers",
        "cus_9",
        json!({"name": "acct_1"}),
        "customer.created",
    );
    assert_eq!(answered(&app, "/webhooks/stripe", &hook).await, "ignored");
    assert_eq!(app.db.count("resources WHERE account = 'acct_1'"), 0);

    let life = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    for a in accounts {
        life.add_account("stripe", a, None, None).await.unwrap();
    }
    // The first syncs start at once (not at the next tick), and the failing account
    // holds back none of the others.
    assert!(
        eventually(Duration::from_secs(20), || async {
            // acct_1 has the customer of the ignored delivery too.
            [("acct_1", 4), ("acct_2", 3), ("acct_3", 3)]
                .iter()
                .all(|(a, n)| {
                    app.db.count(&format!(
                        "resources WHERE kind = 'customer' AND account = '{a}'"
                    )) == *n
                })
        })
        .await,
        "the healthy accounts' customers: {}",
        app.db.count("resources WHERE kind = 'customer'")
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db.count(
                "reconcile_due WHERE account = 'acct_bad' AND kind = 'customer' AND status = 'failed'",
            ) == 1
        })
        .await
    );
    assert_eq!(app.db.count("resources WHERE account = 'acct_bad'"), 0);
    assert_eq!(
        app.db.count(
            "reconcile_due WHERE kind = 'customer' AND account <> 'acct_bad' AND error IS NOT NULL"
        ),
        0
    );
    // `status` names the failing account.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, &toml).unwrap();
    let out = crate::helpers::process::bin()
        .arg("--config")
        .arg(&cfg)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("accounts of stripe:"), "{text}");
    assert!(text.contains("stripe[acct_bad]/customer: failed"), "{text}");
    assert!(!text.contains(PLATFORM_TOKEN), "{text}");
    // The kind's LAST RUN is its latest in any account, not "never" beside a success.
    let row = text
        .lines()
        .find(|l| l.starts_with("stripe/customer "))
        .unwrap_or_else(|| panic!("{text}"));
    assert_ne!(row.split_whitespace().nth(1), Some("never"), "{text}");
    // Repaired at the sender: its next tick converges it.
    sim.fail_account("acct_bad", false);
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db
                .count("resources WHERE kind = 'customer' AND account = 'acct_bad'")
                == 3
        })
        .await
    );
}

async fn the_admin_api_adds_lists_and_removes_accounts_and_never_returns_a_credential(b: Backend) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = config(&db.url, &sim, "every = \"2s\"", PLATFORM_TOKEN);
    let app = spawn_app_with(db, &toml).await;
    sim.change_in(
        "acct_x",
        "customers",
        "cus_1",
        json!({"name": "x"}),
        "customer.created",
    );
    let c = &app.client;
    let add = json!({"source": "stripe", "account": "acct_x", "credential": "sk_acct_x_secret_9"});
    // Without the token, and with a wrong one: refused, nothing registered.
    let r = c
        .post(app.url("/admin/accounts"))
        .json(&add)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(app.url("/admin/accounts"))
        .bearer_auth("wrong-token-0123456789")
        .json(&add)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(app.db.count("accounts"), 0);
    let r = c
        .post(app.url("/admin/accounts"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&add)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let body = r.text().await.unwrap();
    assert!(!body.contains("sk_acct_x"), "{body}");
    // Its first sync, with its own credential.
    assert!(
        eventually(Duration::from_secs(20), || async {
            app.db
                .count("resources WHERE account = 'acct_x' AND kind = 'customer'")
                == 1
        })
        .await
    );
    assert!(
        sim.credentials()
            .iter()
            .any(|c| c.as_deref() == Some("Bearer sk_acct_x_secret_9"))
    );
    // Mistakes are 400 / 404 with a reason, never 500.
    for (bad, want) in [
        (json!({"source": "nope", "account": "a"}), 404),
        (json!({"source": "stripe", "account": ""}), 400),
        (
            json!({"source": "stripe", "account": "a", "api_base": "ftp://x"}),
            400,
        ),
        (json!({"source": "stripe"}), 400),
    ] {
        let r = c
            .post(app.url("/admin/accounts"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{bad}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
    }
    let r = c
        .get(app.url("/admin/accounts?source=stripe"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let listed: Value = r.json().await.unwrap();
    assert_eq!(listed["accounts"][0]["account"], "acct_x");
    assert_eq!(listed["accounts"][0]["has_credential"], true);
    assert!(!listed.to_string().contains("sk_acct_x"), "{listed}");
    let r = c.get(app.url("/admin/accounts")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Remove: its row tombstoned (a change appended), the account unregistered.
    let r = c
        .delete(app.url("/admin/accounts/stripe/acct_x"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let removed: Value = r.json().await.unwrap();
    assert_eq!(removed["removed"]["rows"], 1, "{removed}");
    assert_eq!(app.db.count("accounts"), 0);
    assert_eq!(
        app.db
            .count("resources WHERE account = 'acct_x' AND deleted"),
        1
    );
    assert_eq!(app.db.count("reconcile_due WHERE account = 'acct_x'"), 0);
    let r = c
        .delete(app.url("/admin/accounts/stripe/acct_x?purge=true"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// Two `serve` replicas on one PostgreSQL share 40 accounts on a 1s schedule: every
/// account converges, no account-kind has two runs at once, and both replicas work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_forty_accounts_and_never_run_one_twice_at_once() {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(Backend::Postgres);
    let first = config(&db.url, &sim, "every = \"1s\"", "sk_replica_one_1");
    let second = config(&db.url, &sim, "every = \"1s\"", "sk_replica_two_2");
    let accounts: Vec<String> = (0..40).map(|i| format!("acct_{i:02}")).collect();
    for a in &accounts {
        for i in 0..2 {
            sim.change_in(
                a,
                "customers",
                &format!("cus_{i}"),
                json!({"name": a}),
                "customer.created",
            );
        }
    }
    let app = spawn_app_with(db, &first).await;
    let other =
        webhook_reconciler::app::Application::build(Config::from_toml_str(&second).unwrap())
            .await
            .unwrap();
    let _other = tokio::spawn(async move { other.run_until(std::future::pending()).await });
    let life = lifecycle(&first, crate::helpers::store_on(&app.db).await);
    for a in &accounts {
        life.add_account("stripe", a, None, None).await.unwrap();
    }
    // Every account-kind has run at least three times (first sync and two ticks).
    assert!(
        eventually(Duration::from_secs(60), || async {
            app.db.scalar(
                "SELECT COUNT(*) AS n FROM (SELECT account FROM reconcile_runs WHERE kind = 'customer' \
                 AND status = 'succeeded' AND account <> '' GROUP BY account HAVING COUNT(*) >= 3) t",
            ) == 40
        })
        .await,
        "runs: {} ({} customer succeeded, {} failed), fewest per account {}, accounts {}; due rows {}, overdue {}, running {}, skipped {}, far {}",
        app.db.count("reconcile_runs"),
        app.db.count("reconcile_runs WHERE kind = 'customer' AND status = 'succeeded'"),
        app.db.count("reconcile_runs WHERE status = 'failed'"),
        app.db.scalar("SELECT MIN(c) AS n FROM (SELECT COUNT(*) AS c FROM reconcile_runs WHERE kind = 'customer' AND account <> '' GROUP BY account) t"),
        app.db.scalar("SELECT COUNT(DISTINCT account) AS n FROM reconcile_runs WHERE kind = 'customer'"),
        app.db.count("reconcile_due WHERE kind = 'customer'"),
        app.db.count("reconcile_due WHERE kind = 'customer' AND due_at < now() - interval '5 seconds'"),
        app.db.count("reconcile_due WHERE kind = 'customer' AND status = 'skipped' AND error IS NOT NULL"),
        app.db.count("reconcile_due WHERE kind = 'customer' AND status = 'skipped'"),
        app.db.count("reconcile_due WHERE kind = 'customer' AND due_at > now() + interval '5 seconds'")
    );
    assert_eq!(
        app.db
            .count("resources WHERE kind = 'customer' AND account <> ''"),
        80
    );
    let overlapping = app.db.scalar(
        "SELECT COUNT(*) AS n FROM reconcile_runs a JOIN reconcile_runs b \
         ON a.source = b.source AND a.account = b.account AND a.kind = b.kind AND a.id < b.id \
         AND a.started_at < COALESCE(b.finished_at, now()) AND b.started_at < COALESCE(a.finished_at, now())",
    );
    assert_eq!(overlapping, 0, "account-kind runs overlapped");
    // Each success was recorded as its account-kind's last, in the run's own commit (one
    // statement: one snapshot, whatever the replicas commit meanwhile).
    assert_eq!(
        app.db.scalar(
            "SELECT COUNT(*) AS n FROM reconcile_last_success l WHERE kind = 'customer' AND account <> '' \
             AND succeeded_at = (SELECT MAX(finished_at) FROM reconcile_runs r WHERE r.source = l.source \
             AND r.account = l.account AND r.kind = l.kind AND r.status = 'succeeded')"
        ),
        40
    );
    let credentials = sim.credentials();
    for replica in ["sk_replica_one_1", "sk_replica_two_2"] {
        let n = credentials
            .iter()
            .filter(|c| c.as_deref() == Some(&format!("Bearer {replica}")))
            .count();
        assert!(n > 0, "replica {replica} made no request");
    }
}

both_backends!(a_forged_shop_header_cannot_write_another_shops_rows,);

pub(crate) const SHOPIFY_SECRET: &str = "shpss_one_app_many_shops";

/// A Shopify app installed in two shops (each its own simulated API, registered with
/// its own base URL and token). Shopify signs the body but names the shop only in a
/// header: the state written is fetched from the named shop's API, so a signed body of
/// shop A resent under shop B's name brings shop B its own state, never A's
/// (`shop/redact` and the other lifecycle topics: `tenants.rs`).
async fn a_forged_shop_header_cannot_write_another_shops_rows(b: Backend) {
    let shop_a = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let shop_b = ProviderSim::start(Provider::Shopify, SHOPIFY_SECRET)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = format!(
        r#"
[database]
url = "{}"

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
"#,
        db.url
    );
    let app = spawn_app_with(db, &toml).await;
    let life = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    for (shop, sim, token) in [
        ("shop-a.myshopify.com", &shop_a, "shpat_a_token"),
        ("shop-b.myshopify.com", &shop_b, "shpat_b_token"),
    ] {
        life.add_account(
            "shopify",
            shop,
            Some(sim.api_base()),
            Some(SecretString::from(token)),
        )
        .await
        .unwrap();
    }
    let order = |note: &str| json!({"note": note, "financial_status": "paid"});
    // Order 1001 exists in both shops, 1002 only in shop A.
    let a_1001 = shop_a.change("orders", "1001", order("A's order"), "orders/updated");
    shop_b.change("orders", "1001", order("B's order"), "orders/updated");
    let a_1002 = shop_a.change("orders", "1002", order("A only"), "orders/updated");
    let under = |hook: &Webhook, shop: &str| with_header(hook, "X-Shopify-Shop-Domain", shop);
    let note = |shop: &str, id: &str| -> Option<String> {
        let expr = match b {
            Backend::Postgres => "state->>'note'",
            Backend::Sqlite => "json_extract(state, '$.note')",
        };
        ["A's order", "B's order", "A only"]
            .into_iter()
            .find(|n| {
                app.db.count(&format!(
                    "resources WHERE account = '{shop}' AND id = '{id}' AND {expr} = '{}'",
                    n.replace('\'', "''")
                )) == 1
            })
            .map(String::from)
    };
    // Shop A's own delivery: its state fetched from shop A, with shop A's token.
    assert_eq!(
        answered(
            &app,
            "/webhooks/shopify",
            &under(&a_1001, "shop-a.myshopify.com"),
        )
        .await,
        "fetching"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            note("shop-a.myshopify.com", "1001").is_some()
        })
        .await
    );
    assert_eq!(
        note("shop-a.myshopify.com", "1001").as_deref(),
        Some("A's order")
    );
    // The same signed bodies under shop B's name (new delivery ids, so not duplicates).
    let id = "X-Shopify-Webhook-Id";
    let forged_1001 = with_header(&under(&a_1001, "shop-b.myshopify.com"), id, "forged-f1");
    let forged_1002 = with_header(&under(&a_1002, "shop-b.myshopify.com"), id, "forged-f2");
    // The body digest is claimed with the id: a signed body replayed is a duplicate
    // even under another shop's name, and nothing is fetched for it.
    assert_eq!(
        answered(&app, "/webhooks/shopify", &forged_1001).await,
        "duplicate"
    );
    // A body not yet delivered, under shop B's name: fetched from shop B, which has no
    // order 1002, so nothing is written under shop B.
    assert_eq!(
        answered(&app, "/webhooks/shopify", &forged_1002).await,
        "fetching"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            shop_b.get_requests() >= 1
        })
        .await,
        "shop B was asked for the order"
    );
    // A fresh delivery of order 1001 under B's name brings B its own state, never A's.
    let a_1001_again = shop_a.change(
        "orders",
        "1001",
        order("A's order, again"),
        "orders/updated",
    );
    let forged = under(&a_1001_again, "shop-b.myshopify.com");
    assert_eq!(
        answered(&app, "/webhooks/shopify", &forged).await,
        "fetching"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            note("shop-b.myshopify.com", "1001").is_some()
        })
        .await
    );
    assert_eq!(
        note("shop-b.myshopify.com", "1001").as_deref(),
        Some("B's order")
    );
    assert_eq!(
        app.db
            .count("resources WHERE account = 'shop-b.myshopify.com' AND id = '1002'"),
        0
    );
    assert_eq!(app.db.count("resources WHERE account = ''"), 0);
    // Each shop's API saw only its own token.
    assert!(
        shop_a
            .credentials()
            .iter()
            .all(|c| c.as_deref() == Some("shpat_a_token"))
    );
    assert!(
        shop_b
            .credentials()
            .iter()
            .all(|c| c.as_deref() == Some("shpat_b_token"))
    );
    // A shop nobody registered: ignored, nothing fetched.
    let before = shop_a.get_requests() + shop_b.get_requests();
    let stranger = shop_a.change("orders", "1003", order("A only"), "orders/updated");
    assert_eq!(
        answered(
            &app,
            "/webhooks/shopify",
            &under(&stranger, "evil.myshopify.com"),
        )
        .await,
        "ignored"
    );
    assert_eq!(shop_a.get_requests() + shop_b.get_requests(), before);
}

pub(crate) async fn post_to(app: &TestApp, path: &str, hook: &Webhook) -> (u16, Value) {
    let mut req = app
        .client
        .post(app.url(path))
        .header("Content-Type", "application/json");
    for (k, v) in &hook.headers {
        req = req.header(k, v);
    }
    let r = req.body(hook.body.clone()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The answer to a delivery: 200 and its outcome.
pub(crate) async fn answered(app: &TestApp, path: &str, hook: &Webhook) -> String {
    let (status, body) = post_to(app, path, hook).await;
    assert_eq!(status, 200, "{body}");
    body["outcome"].as_str().unwrap_or_default().to_string()
}

/// `hook` with header `name` set to `value` (a replay under another name or id).
pub(crate) fn with_header(hook: &Webhook, name: &str, value: &str) -> Webhook {
    let mut h = hook.clone();
    for (k, v) in &mut h.headers {
        if k == name {
            *v = value.to_string();
        }
    }
    h
}

both_backends!(a_key_that_cannot_open_a_stored_credential_fails_that_account_only_and_a_malformed_key_is_refused);

/// `accounts.key` replaced by another valid key: the account whose credential was sealed
/// with the old one fails loudly, by name; the other accounts and the platform's own are
/// reconciled; the credential shows nowhere. A key that is not 32 bytes of base64 is a
/// configuration error naming `accounts.key`.
async fn a_key_that_cannot_open_a_stored_credential_fails_that_account_only_and_a_malformed_key_is_refused(
    b: Backend,
) {
    use crate::helpers::process::{bin, write_config};
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let life = lifecycle(&toml, crate::helpers::store_on(&db).await);
    life.add_account("stripe", "acct_open", None, None)
        .await
        .unwrap();
    life.add_account(
        "stripe",
        "acct_sealed",
        None,
        Some(SecretString::from("sk_sealed_secret_77")),
    )
    .await
    .unwrap();
    for a in ["acct_open", "acct_sealed"] {
        sim.change_in(
            a,
            "customers",
            "cus_1",
            json!({"name": a}),
            "customer.created",
        );
    }

    let dir = tempfile::tempdir().unwrap();
    // Another valid key (32 bytes): it cannot open acct_sealed's credential.
    let other_key = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";
    let path = write_config(dir.path(), &toml.replace(ACCOUNTS_KEY, other_key));
    let out = bin()
        .args([
            "--config",
            path.to_str().unwrap(),
            "reconcile",
            "--source",
            "stripe",
            "--kind",
            "customer",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("acct_sealed"), "{printed}");
    assert!(
        printed.contains("accounts.key"),
        "the reason names the key: {printed}"
    );
    assert!(!printed.contains("sk_sealed_secret_77"), "{printed}");
    assert_eq!(
        db.count("resources WHERE kind = 'customer' AND account = 'acct_open'"),
        1
    );
    assert_eq!(
        db.count("resources WHERE kind = 'customer' AND account = 'acct_sealed'"),
        0
    );
    // No request of acct_sealed went out with another credential.
    assert!(!sim.account_headers().iter().any(|a| a == "acct_sealed"));

    // `status` names the failing account and why.
    let status = bin()
        .args(["--config", path.to_str().unwrap(), "status"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(shown.contains("acct_sealed"), "{shown}");

    // A key that is not 32 bytes: exit 2, naming the key, never showing it.
    let path = write_config(dir.path(), &toml.replace(ACCOUNTS_KEY, "c2hvcnQta2V5"));
    let out = bin()
        .args(["--config", path.to_str().unwrap(), "check-config"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("accounts.key"), "{err}");
    assert!(!err.contains("c2hvcnQta2V5"), "{err}");
}

both_backends!(
    a_github_app_delivery_names_its_installation_by_a_number_as_github_sends_it,
    an_erased_account_reaches_the_consumer_as_tombstones_and_leaves_no_state_behind,
);

/// GitHub names the installation as a number (`"installation": {"id": 4711}`): the
/// number's decimal text is the account. A fraction or an object is refused (422).
async fn a_github_app_delivery_names_its_installation_by_a_number_as_github_sends_it(b: Backend) {
    const SECRET: &str = "github-app-hook-secret";
    let db = TestDb::new(b);
    let toml = format!(
        r#"
[database]
url = "{}"

[http]
listen = "127.0.0.1:0"

[sources.github]
preset = "github"
api_base = "http://127.0.0.1:9/repos/octocat/Hello-World"
api_token = "ghs_unused"

[sources.github.webhook]
secrets = ["{SECRET}"]

[sources.github.reconcile]
cron = "{NEVER}"
run_at_start = false

[sources.github.accounts]
"#,
        db.url
    );
    let app = spawn_app_with(db, &toml).await;
    webhook_reconciler::accounts::Accounts::new(crate::helpers::handle_on(&app.db).await)
        .add("github", "4711", None, None)
        .await
        .unwrap();
    // GitHub's payload shape for `issues` from an App installation.
    let issue = |delivery: &str, installation: Value| {
        let body = json!({
            "action": "edited",
            "issue": {"number": 7, "title": "Crash on start", "state": "open",
                      "updated_at": "2026-12-01T10:00:00Z", "user": {"login": "octocat"}},
            "repository": {"id": 1296269, "full_name": "octocat/Hello-World"},
            "sender": {"login": "octocat"},
            "installation": installation,
        })
        .to_string();
        Webhook {
            event_id: delivery.into(),
            headers: vec![
                ("X-GitHub-Event".into(), "issues".into()),
                ("X-GitHub-Delivery".into(), delivery.into()),
                (
                    "X-Hub-Signature-256".into(),
                    webhook_reconciler::signature::github(SECRET.as_bytes(), body.as_bytes()),
                ),
            ],
            body,
        }
    };
    let numbered = issue(
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        json!({"id": 4711, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNDcxMQ=="}),
    );
    let (status, body) = post_to(&app, "/webhooks/github", &numbered).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("applied")),
        "{body}"
    );
    assert_eq!(
        app.db.count(
            "resources WHERE source = 'github' AND account = '4711' AND kind = 'issue' AND id = '7'"
        ),
        1
    );
    assert_eq!(app.db.count("dead_letters"), 0);
    // An installation that is not registered: ignored, nothing written.
    let stranger = issue("72d3162e-cc78-11e3-81ab-4c9367dc0959", json!({"id": 4712}));
    let (status, body) = post_to(&app, "/webhooks/github", &stranger).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("ignored")),
        "{body}"
    );
    // Not an id: kept as a dead letter with the reason.
    let odd = issue("72d3162e-cc78-11e3-81ab-4c9367dc0960", json!({"id": 47.5}));
    let (status, _) = post_to(&app, "/webhooks/github", &odd).await;
    assert_eq!(status, 422);
    assert_eq!(app.db.count("resources WHERE kind = 'issue'"), 1);
}

/// `accounts remove --purge`: every live row of the account reaches the consumer as a
/// change `deleted: true` without state (one per row; a row already tombstoned gets
/// none), the states of the account's earlier changes are blanked (seqs kept, no gap),
/// and nothing of the account is left in resources, pending fetches or dead letters.
async fn an_erased_account_reaches_the_consumer_as_tombstones_and_leaves_no_state_behind(
    b: Backend,
) {
    use crate::helpers::consumer::ConsumerApp;
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let consumer = ConsumerApp::start().await;
    let db = TestDb::new(b);
    let toml = format!(
        "{}\n{}",
        config(
            &db.url,
            &sim,
            &format!("cron = \"{NEVER}\""),
            PLATFORM_TOKEN
        ),
        consumer.config("app", "")
    );
    let app = spawn_app_with(db, &toml).await;
    let life = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    for acct in ["acct_a", "acct_b"] {
        life.add_account("stripe", acct, None, None).await.unwrap();
    }
    let t = chrono::Utc::now().timestamp() - 100;
    sim.set_clock(Some(t));
    for (acct, id) in [
        ("acct_a", "cus_1"),
        ("acct_a", "cus_2"),
        ("acct_b", "cus_1"),
    ] {
        let hook = sim.change_in(
            acct,
            "customers",
            id,
            json!({"email": format!("{id}@{acct}.example")}),
            "customer.created",
        );
        assert_eq!(answered(&app, "/webhooks/stripe", &hook).await, "applied");
    }
    // cus_2 of A deleted at the sender before the purge: already a tombstone.
    sim.set_clock(Some(t + 1));
    let deleted = sim.change_in(
        "acct_a",
        "customers",
        "cus_2",
        json!({}),
        "customer.deleted",
    );
    assert_eq!(
        answered(&app, "/webhooks/stripe", &deleted).await,
        "applied"
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            consumer.delivered().len() == 4
        })
        .await,
        "{:?}",
        consumer.delivered()
    );
    let removed = life.remove_account("stripe", "acct_a", true).await.unwrap();
    assert_eq!(removed.rows, 2);
    // One more change: cus_1 of A, deleted, no state (cus_2 was a tombstone already).
    assert!(
        eventually(Duration::from_secs(10), || async {
            consumer.delivered().len() == 5
        })
        .await,
        "{:?}",
        consumer.delivered()
    );
    let erased = consumer.delivered().last().unwrap().body.clone();
    assert_eq!(erased["account"], "acct_a", "{erased}");
    assert_eq!(erased["id"], "cus_1", "{erased}");
    assert_eq!(erased["deleted"], true, "{erased}");
    assert!(erased["state"].is_null(), "{erased}");
    // Nothing of A's data is left; B's is untouched; the feed has no gap.
    assert_eq!(app.db.count("resources WHERE account = 'acct_a'"), 0);
    assert_eq!(
        app.db
            .count("changes WHERE account = 'acct_a' AND state IS NOT NULL"),
        0
    );
    assert_eq!(app.db.count("changes WHERE account = 'acct_a'"), 4);
    assert_eq!(
        app.db
            .count("changes WHERE account = 'acct_b' AND state IS NOT NULL"),
        1
    );
    assert_eq!(app.db.scalar("SELECT MAX(seq) AS n FROM changes"), 5);
    assert_eq!(app.db.count("changes"), 5);
    assert_eq!(app.db.count("pending_fetches WHERE account = 'acct_a'"), 0);
}

both_backends!(
    one_schedule_holds_the_platforms_own_kinds_and_what_fell_due_while_no_process_ran_runs_at_start,
    a_one_shot_runs_failure_is_recorded_in_its_account_kinds_schedule_like_a_scheduled_ones,
);

/// Every reconcile is due work in `reconcile_due`, the source's own account-kinds (the
/// platform's, account `''`) included. One that fell due while no process ran (its tick
/// passed during a deploy) is claimed as soon as `serve` starts, though the next tick
/// is months away.
async fn one_schedule_holds_the_platforms_own_kinds_and_what_fell_due_while_no_process_ran_runs_at_start(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    sim.change(
        "customers",
        "cus_0",
        json!({"name": "platform's"}),
        "customer.created",
    );
    let db = TestDb::new(b);
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::helpers::process::write_migrated_config(dir.path(), &toml);
    let serve = || {
        crate::helpers::process::bin()
            .arg("--config")
            .arg(&cfg)
            .arg("serve")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(crate::helpers::process::Running)
            .unwrap()
    };
    let scheduled = "reconcile_due WHERE source = 'stripe' AND account = '' AND kind = 'customer'";
    let mut child = serve();
    assert!(
        eventually(Duration::from_secs(20), || async {
            db.count(&format!("{scheduled} AND status = 'never'")) == 1
        })
        .await,
        "the platform's own kind is scheduled"
    );
    crate::helpers::process::signal(child.id(), "TERM");
    assert!(child.wait().unwrap().success());
    assert_eq!(db.count("reconcile_runs"), 0, "not due before its tick");
    // The tick passed while no process ran.
    db.execute(
        "UPDATE reconcile_due SET due_at = '2026-01-01T00:00:00.000Z' WHERE account = '' AND kind = 'customer'",
    );
    let mut child = serve();
    let ran = eventually(Duration::from_secs(20), || async {
        db.count(&format!("{scheduled} AND status = 'succeeded'")) == 1
    })
    .await;
    crate::helpers::process::signal(child.id(), "TERM");
    let _ = child.wait();
    assert!(ran, "the overdue run was claimed at start");
    assert_eq!(
        names(&db, ""),
        [("cus_0".to_string(), "platform's".to_string())]
    );
    // Claimed, it is due again at its next tick, not now.
    assert_eq!(
        db.count(&format!("{scheduled} AND due_at > '2026-12-31'")),
        1
    );
}

/// `reconcile --source S --account A` (what the shipped timer runs) records its end in
/// the account-kind's schedule row, so `status` shows a one-shot failure (a revoked
/// key) as it shows a scheduled one, and its success clears it.
async fn a_one_shot_runs_failure_is_recorded_in_its_account_kinds_schedule_like_a_scheduled_ones(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let r = reconciler_for(&toml).await;
    let life = lifecycle(&toml, crate::helpers::store_on(&db).await);
    life.add_account("stripe", "acct_a", None, None)
        .await
        .unwrap();
    let run = || customers_once(&r, "acct_a");
    sim.fail_account("acct_a", true);
    assert!(matches!(run().await.status, RunStatus::Failed { .. }));
    assert_eq!(
        db.count(
            "reconcile_due WHERE account = 'acct_a' AND kind = 'customer' AND status = 'failed' AND error IS NOT NULL"
        ),
        1
    );
    sim.fail_account("acct_a", false);
    assert_eq!(run().await.status, RunStatus::Succeeded);
    assert_eq!(
        db.count(
            "reconcile_due WHERE account = 'acct_a' AND kind = 'customer' AND status = 'succeeded' AND error IS NULL"
        ),
        1
    );
}

both_backends!(
    an_account_id_that_could_steer_a_url_is_refused_and_the_sources_token_never_leaves_its_origin,
);

/// Credentials stay where the operator allowed: an account id that could steer a URL
/// (`evil.com/x?` as a Shopify shop, `acct_../x` for Stripe) is refused by the CLI (exit
/// 2) and the admin API (400) before anything is stored; an account whose base URL is on
/// another origin than the source's, with no credential of its own, fails its own run
/// with the fix named — and that origin never receives a request, so never the
/// platform's key. With its own credential it gets that credential only.
async fn an_account_id_that_could_steer_a_url_is_refused_and_the_sources_token_never_leaves_its_origin(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let elsewhere = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    // Both simulators are allowed bases (another origin than the source's own).
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    )
    .replace(
        "[sources.stripe.accounts]\n",
        "[sources.stripe.accounts]\napi_bases = [\"http://127.0.0.1:*/\"]\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::helpers::process::write_migrated_config(dir.path(), &toml);
    for bad in ["acct_../x", "evil.com/x?", "acct 1", "a"] {
        let out = crate::helpers::process::bin()
            .arg("--config")
            .arg(&cfg)
            .args(["accounts", "add", "stripe", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains(bad), "{bad}: {err}");
    }
    let app = spawn_app_with(db, &toml).await;
    let (status, body) = {
        let r = app
            .client
            .post(app.url("/admin/accounts"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"source": "stripe", "account": "acct_x/../../v1"}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("acct_"), "{body}");
    assert_eq!(app.db.count("accounts"), 0);

    // A base on another origin and no credential of its own: its run fails, naming
    // the fix, and nothing is sent there.
    let life = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    life.add_account("stripe", "acct_away", Some(elsewhere.api_base()), None)
        .await
        .unwrap();
    // A second `add` never moves a registered account's base (its credential would go
    // along), whatever it is moved to.
    let moved = life
        .add_account("stripe", "acct_away", Some(sim.api_base()), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(moved.contains("never changes"), "{moved}");
    let r = reconciler_for(&toml).await;
    let report = customers_once(&r, "acct_away").await;
    match &report.status {
        RunStatus::Failed { error } => {
            assert!(error.contains("its own credential"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(report.counts.pages, 0);
    assert!(
        elsewhere.credentials().is_empty(),
        "the other origin was asked: {:?}",
        elsewhere.credentials()
    );
    // Given its own credential, it is asked with that one only.
    life.add_account(
        "stripe",
        "acct_away",
        Some(elsewhere.api_base()),
        Some(SecretString::from("sk_away_own")),
    )
    .await
    .unwrap();
    let report = customers_once(&r, "acct_away").await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    let seen = elsewhere.credentials();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|c| c
            .as_deref()
            .is_some_and(|c| c.contains("sk_away_own") && !c.contains(PLATFORM_TOKEN))),
        "{seen:?}"
    );
}

/// One run of the Stripe source's customers for `account`, as the one-shot command
/// runs it.
async fn customers_once(
    r: &webhook_reconciler::reconcile::Reconciler,
    account: &str,
) -> webhook_reconciler::reconcile::KindReport {
    let (s, k) = r
        .kinds(Some("stripe"), Some("customer"))
        .into_iter()
        .next()
        .map(|(s, k)| (s.clone(), k.clone()))
        .unwrap();
    r.run_account_kind(
        &s,
        &k,
        &Account::Named(account.to_string()),
        &RunOptions::default(),
        &CancellationToken::new(),
        &|_| {},
    )
    .await
}

/// A second `accounts.key`, 32 bytes in base64.
const ACCOUNTS_KEY_2: &str = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY=";

both_backends!(a_leaked_admin_token_or_a_database_writer_cannot_steer_a_credential_to_another_host);
/// The audit's attack, as an attacker with the admin token or write access to the
/// database would make it: an account's base moved to their server (by the admin API,
/// or by `UPDATE accounts SET api_base`), a new account on it with no credential. The
/// attacker's server receives no request at all, so never a credential; the operator's
/// deliberate change (a new base with its credential) works.
async fn a_leaked_admin_token_or_a_database_writer_cannot_steer_a_credential_to_another_host(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let attacker = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    // The allowed bases are the default: the source's own (the simulator's origin).
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let app = spawn_app_with(db, &toml).await;
    let admin = |method: reqwest::Method, path: &str, body: Value| {
        let r = app
            .client
            .request(method, app.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body);
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    // A new account on the attacker's server: refused before anything is stored.
    let (status, body) = admin(
        reqwest::Method::POST,
        "/admin/accounts",
        json!({"source": "stripe", "account": "acct_evil", "api_base": attacker.api_base()}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("api_bases"),
        "{body}"
    );
    assert_eq!(app.db.count("accounts"), 0);
    // An account with its own credential on the allowed base.
    let (status, body) = admin(
        reqwest::Method::POST,
        "/admin/accounts",
        json!({"source": "stripe", "account": "acct_own", "api_base": sim.api_base(), "credential": "sk_own_1"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    // Its base moved by the admin API: to the attacker, refused; to another allowed
    // base without the credential, refused too (the credential was given for the old).
    let path = "/admin/accounts/stripe/acct_own";
    let (status, body) = admin(
        reqwest::Method::PATCH,
        path,
        json!({"api_base": attacker.api_base()}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin(
        reqwest::Method::PATCH,
        path,
        json!({"api_base": format!("{}/elsewhere", sim.api_base())}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("given again"),
        "{body}"
    );
    let (status, body) = admin(reqwest::Method::PATCH, path, json!({})).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = admin(
        reqwest::Method::PATCH,
        "/admin/accounts/stripe/acct_unknown",
        json!({"credential": "sk_x"}),
    )
    .await;
    assert_eq!(status, 404);

    // A database writer moves both accounts' bases to the attacker: the one with its
    // own credential cannot open it there, the other's base is outside the prefixes.
    let ops = lifecycle(&toml, crate::helpers::store_on(&app.db).await);
    ops.add_account("stripe", "acct_plain", None, None)
        .await
        .unwrap();
    app.db.execute(&format!(
        "UPDATE accounts SET api_base = '{}'",
        attacker.api_base()
    ));
    let r = reconciler_for(&toml).await;
    for (account, why) in [
        ("acct_own", "api_base"),
        ("acct_plain", "not under the source's allowed prefixes"),
    ] {
        let report = customers_once(&r, account).await;
        match &report.status {
            RunStatus::Failed { error } => assert!(error.contains(why), "{account}: {error}"),
            other => panic!("{account}: {other:?}"),
        }
    }
    // The operator's deliberate change: the allowed base, with the credential again.
    let (status, body) = admin(
        reqwest::Method::PATCH,
        path,
        json!({"api_base": sim.api_base(), "credential": "sk_own_2"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let report = customers_once(&r, "acct_own").await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert!(
        sim.credentials()
            .iter()
            .any(|c| c.as_deref().is_some_and(|c| c.contains("sk_own_2"))),
        "{:?}",
        sim.credentials()
    );
    assert!(
        attacker.credentials().is_empty(),
        "the attacker's server was asked: {:?}",
        attacker.credentials()
    );
    // `accounts rekey` over HTTP: the one kept credential re-sealed, none left behind.
    let (status, body) = admin(reqwest::Method::POST, "/admin/accounts/rekey", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rekeyed"]["resealed"], 1, "{body}");
    assert_eq!(body["rekeyed"]["failed"], json!([]), "{body}");
}

both_backends!(rekey_reseals_every_credential_under_the_new_key_and_none_is_unreadable_meanwhile);
/// `accounts.key` rotated: with the new key and `previous_key` the old one, every
/// account still opens (before and after the rekey); after `accounts rekey`, the new key
/// alone opens them all.
async fn rekey_reseals_every_credential_under_the_new_key_and_none_is_unreadable_meanwhile(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    let db = TestDb::new(b);
    let old = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let during = old.replace(
        &format!("key = \"{ACCOUNTS_KEY}\""),
        &format!("key = \"{ACCOUNTS_KEY_2}\"\nprevious_key = \"{ACCOUNTS_KEY}\""),
    );
    let after = old.replace(ACCOUNTS_KEY, ACCOUNTS_KEY_2);
    let store = crate::helpers::store_on(&db).await;
    let ops = lifecycle(&old, store.clone());
    for a in ["acct_r1", "acct_r2"] {
        ops.add_account(
            "stripe",
            a,
            None,
            Some(SecretString::from(format!("sk_{a}"))),
        )
        .await
        .unwrap();
    }
    let runs = |toml: String| async move {
        let r = reconciler_for(&toml).await;
        let mut out = Vec::new();
        for a in ["acct_r1", "acct_r2"] {
            out.push(customers_once(&r, a).await.status);
        }
        out
    };
    assert_eq!(
        runs(during.clone()).await,
        [RunStatus::Succeeded, RunStatus::Succeeded]
    );
    // The new key alone cannot open what the old one sealed.
    assert!(
        runs(after.clone())
            .await
            .iter()
            .all(|s| matches!(s, RunStatus::Failed { .. }))
    );
    let done = lifecycle(&during, store.clone())
        .rekey_accounts()
        .await
        .unwrap();
    assert_eq!((done.resealed, done.failed.len()), (2, 0), "{done:?}");
    assert_eq!(
        runs(during).await,
        [RunStatus::Succeeded, RunStatus::Succeeded]
    );
    assert_eq!(
        runs(after).await,
        [RunStatus::Succeeded, RunStatus::Succeeded]
    );
    assert!(
        sim.credentials()
            .iter()
            .any(|c| c.as_deref().is_some_and(|c| c.contains("sk_acct_r2")))
    );
}

/// A server without autovacuum (the machine's own has it off) never gave a schedule
/// written at once for thousands of accounts statistics: finishing a run then reached
/// its row through the due-time index and read every row of its kind (750 pages a run
/// at 10,000 accounts). The sync that adds them analyzes the table, for each kind,
/// though the two kinds' syncs run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_a_schedule_of_many_accounts_gets_statistics_and_a_finish_reads_one_row() {
    use webhook_reconciler::bookkeeping::Bookkeeping;
    let db = TestDb::new(Backend::Postgres);
    let book = Bookkeeping::new(crate::helpers::handle_on(&db).await);
    db.execute("ALTER TABLE reconcile_due SET (autovacuum_enabled = false)");
    let accounts: Vec<(String, Option<webhook_reconciler::db::DbTime>)> =
        (0..2000).map(|i| (format!("acct_{i:05}"), None)).collect();
    let listed_at = book.clock().await.unwrap();
    let (customers, invoices) = tokio::join!(
        book.sync_schedule("api", "customer", accounts.clone(), listed_at),
        book.sync_schedule("api", "invoice", accounts.clone(), listed_at),
    );
    assert_eq!((customers.unwrap(), invoices.unwrap()), (2000, 2000));
    assert_eq!(
        db.count("reconcile_due WHERE status = 'never' AND due_at <= now()"),
        4000
    );
    let handle = crate::helpers::handle_on(&db).await;
    for kind in ["customer", "invoice"] {
        let sql = format!(
            "EXPLAIN (FORMAT JSON) UPDATE reconcile_due SET finished_at = now(), status = 'succeeded', error = NULL \
             WHERE source = 'api' AND account = 'acct_01234' AND kind = '{kind}'"
        );
        let plan = handle
            .read(move |c| {
                #[derive(diesel::QueryableByName)]
                struct Plan {
                    #[diesel(sql_type = diesel::sql_types::Text, column_name = "QUERY PLAN")]
                    plan: String,
                }
                match c {
                    webhook_reconciler::db::Conn::Postgres(pg) => {
                        diesel::RunQueryDsl::get_result::<Plan>(diesel::sql_query(sql), pg)
                    }
                    webhook_reconciler::db::Conn::Sqlite(_) => unreachable!(),
                }
            })
            .await
            .unwrap()
            .plan;
        assert!(
            plan.contains("\"Index Name\": \"reconcile_due_pkey\""),
            "{kind}: the finish reaches its row by the primary key: {plan}"
        );
    }
}

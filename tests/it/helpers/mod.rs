//! Shared test fixtures: databases, a running app on port 0, signing, a TCP proxy that
//! can cut the database off.

pub mod consumer;
pub mod db;
pub mod process;
pub mod proxy;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use webhook_reconciler::app::Application;
use webhook_reconciler::config::Config;
use webhook_reconciler::signature as sign;

pub use db::{Backend, TestDb};

/// A migrated database behind the store API, configured like [`config_toml`].
pub async fn store_on(db: &TestDb) -> webhook_reconciler::store::Store {
    webhook_reconciler::store::Store::new(handle_on(db).await)
}

/// A migrated database handle of the product's own, on `db`.
pub async fn handle_on(db: &TestDb) -> webhook_reconciler::db::Db {
    let config = Config::from_toml_str(&config_toml(&db.url, "")).unwrap();
    let handle = webhook_reconciler::db::Db::connect(&config.database).unwrap();
    let h2 = handle.clone();
    tokio::task::spawn_blocking(move || h2.migrate())
        .await
        .unwrap()
        .unwrap();
    handle
}

/// The change feed's reader on `db` (its own pool, like another replica's).
pub async fn feed_on(db: &TestDb) -> webhook_reconciler::feed::Feed {
    webhook_reconciler::feed::Feed::new(handle_on(db).await)
}

/// Declares one `#[tokio::test]` per backend for an `async fn name(backend: Backend)`.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn on_postgres() {
                    super::$name($crate::helpers::Backend::Postgres).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn on_sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await;
                }
            }
        )*
    };
}
pub(crate) use both_backends;

pub const SHOP_SECRET: &str = "shop-secret-current";
pub const SHOP_OLD_SECRET: &str = "shop-secret-previous";
pub const STRIPE_SECRET: &str = "whsec_stripe_test_secret";
/// A Standard Webhooks secret: `whsec_` + base64 of the 16 bytes below.
pub const STDWH_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZg==";
pub const STDWH_KEY: &[u8] = b"0123456789abcdef";
pub const GITHUB_SECRET: &str = "github-secret";

/// The test configuration: one source per signature scheme; `shop` has a versioned kind
/// (`order`, with a delete event) and an insert-once kind (`refund`).
pub fn config_toml(database_url: &str, extra_database: &str) -> String {
    format!(
        r#"
[database]
url = "{database_url}"
max_connections = 8
acquire_timeout = "1s"
{extra_database}

[http]
listen = "127.0.0.1:0"
max_body = "64KiB"

[sources.shop.webhook]
secrets = ["{SHOP_SECRET}", "{SHOP_OLD_SECRET}"]

[sources.shop.kinds.order]
version = "/version"
[sources.shop.kinds.order.events."order.status_changed"]
id = "/data/order_id"
version = "/data/version"
state = "/data"
[sources.shop.kinds.order.events."order.deleted"]
id = "/data/order_id"
version = "/data/version"
action = "delete"

[sources.shop.kinds.refund.events."refund.succeeded"]
id = "/data/refund_id"
state = "/data"

[sources.shop.kinds.shipment]
version = "/updated_at"
version_format = "rfc3339"
[sources.shop.kinds.shipment.events."shipment.updated"]
id = "/data/shipment_id"
version = "/data/updated_at"
state = "/data"

[sources.billing.webhook]
scheme = "stripe"
secrets = ["{STRIPE_SECRET}"]
[sources.billing.kinds.invoice.events."invoice.updated"]
id = "/data/object/id"
version = "/created"
state = "/data/object"
[sources.billing.kinds.invoice]
version = "/created"
version_format = "unix"

[sources.crm.webhook]
scheme = "standard-webhooks"
secrets = ["{STDWH_SECRET}"]
[sources.crm.kinds.customer]
version = "/updated_at"
version_format = "rfc3339"
[sources.crm.kinds.customer.events."customer.updated"]
id = "/data/id"
version = "/data/updated_at"

[sources.gh.webhook]
scheme = "github"
secrets = ["{GITHUB_SECRET}"]
[sources.gh.kinds.issue]
version = "/updated_at"
version_format = "rfc3339"
[sources.gh.kinds.issue.events.issues]
id = "/issue/id"
version = "/issue/updated_at"
state = "/issue"
"#
    )
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An order status event as the `shop` source sends it.
pub fn order_event(event_id: &str, order_id: &str, version: i64, status: &str) -> Value {
    json!({
        "id": event_id,
        "type": "order.status_changed",
        "created_at": "2026-07-29T10:00:00Z",
        "data": {"order_id": order_id, "version": version, "status": status},
    })
}

/// A refund event (insert-once kind), as in the guide.
pub fn refund_event(event_id: &str, refund_id: &str) -> Value {
    json!({
        "id": event_id,
        "type": "refund.succeeded",
        "created_at": "2026-07-29T10:00:00Z",
        "api_version": "2026-07-01",
        "data": {"refund_id": refund_id, "order_id": "ord_42", "amount": 4200, "currency": "EUR"},
    })
}

/// POSTs `body` to `http://{addr}/webhooks/shop`, signed with `secret` for the
/// hmac-sha256 scheme at the current time.
pub async fn post_signed(
    client: &reqwest::Client,
    addr: impl std::fmt::Display,
    body: &str,
    secret: &str,
) -> reqwest::Response {
    let ts = now();
    client
        .post(format!("http://{addr}/webhooks/shop"))
        .header(
            "X-Signature",
            sign::hmac_sha256(secret.as_bytes(), ts, body.as_bytes()),
        )
        .header("X-Signature-Timestamp", ts.to_string())
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// A daemon serving on 127.0.0.1:port 0 against its own database.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The operators' listener, when `http.admin_listen` is set.
    pub admin: Option<String>,
    pub db: TestDb,
    pub client: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    let db = TestDb::new(backend);
    let url = db.url.clone();
    spawn_app_on(db, &url, "").await
}

/// Starts the app with `app_url` as its database URL (e.g. through a proxy) and extra
/// `[database]` lines.
pub async fn spawn_app_on(db: TestDb, app_url: &str, extra_database: &str) -> TestApp {
    let toml = config_toml(app_url, extra_database);
    spawn_app_with(db, &toml).await
}

/// Starts the app with a whole configuration (`config_toml` plus sections).
pub async fn spawn_app_with(db: TestDb, toml: &str) -> TestApp {
    let config = Config::from_toml_str(toml).unwrap();
    let app = Application::build(config).await.unwrap();
    let addr = app.local_addr();
    let admin = app.admin_addr();
    let server = tokio::spawn(async move {
        app.run_until(std::future::pending()).await.unwrap();
    });
    TestApp {
        addr,
        admin,
        db,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        server,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs `body` to the shop source, signed with the current secret.
    pub async fn post_shop(&self, body: &Value) -> reqwest::Response {
        self.post_shop_raw(body.to_string().into_bytes()).await
    }

    pub async fn post_shop_raw(&self, body: Vec<u8>) -> reqwest::Response {
        let ts = now();
        let sig = sign::hmac_sha256(SHOP_SECRET.as_bytes(), ts, &body);
        self.client
            .post(self.url("/webhooks/shop"))
            .header("X-Signature", sig)
            .header("X-Signature-Timestamp", ts.to_string())
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// POSTs to the shop source and returns (status, JSON body).
    pub async fn deliver(&self, body: &Value) -> (u16, Value) {
        let r = self.post_shop(body).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `/readyz`'s `pools`: each pool's connections open now and opened since the start.
    pub async fn pools(&self) -> Value {
        let r = self.client.get(self.url("/readyz")).send().await.unwrap();
        r.json::<Value>().await.unwrap()["pools"].clone()
    }
}

/// Waits for `cond` to hold, polling, for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// An app on SQLite with `database_extra` in `[database]` and `http_extra` (lines of TOML,
/// `\n`-separated) in `[http]`.
pub async fn sqlite_app_with_http(database_extra: &str, http_extra: &str) -> TestApp {
    let db = TestDb::new(Backend::Sqlite);
    let toml = config_toml(&db.url, database_extra).replace(
        "max_body = \"64KiB\"",
        &format!("max_body = \"64KiB\"\n{http_extra}"),
    );
    spawn_app_with(db, &toml).await
}

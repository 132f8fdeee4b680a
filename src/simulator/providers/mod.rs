//! Simulated real senders: Stripe-, GitHub- and Shopify-shaped APIs on 127.0.0.1, as
//! their public API references describe them — payloads (Stripe's event envelope with
//! `data.object`, `created`, `livemode`; GitHub's `issue.updated_at`; Shopify's bare
//! resources and topics), pagination (Stripe `has_more` / `starting_after`, GitHub and
//! Shopify `Link` with `page` / `page_info`), a `Date` header from a clock the test
//! controls, and their rate-limit headers and refusals. Each change also yields the
//! webhook the provider would send for it, signed its way.
//!
//! Like `simulator`, this is the sender's side (its own axum server), not ours.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::signature as sign;

mod github;
mod objects;
mod shopify;
mod stripe;
use github::github;
use objects::{http_date, new_object, rfc3339};
use shopify::shopify;
use stripe::stripe;

/// Which provider's API is simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Stripe,
    Github,
    Shopify,
}

/// GitHub's repository path and Shopify's API version prefix, as served.
pub const GITHUB_REPO: &str = "/repos/acme/shop";
pub const SHOPIFY_PREFIX: &str = "/admin/api/2024-10";

/// A webhook as the provider sends it: headers (signature included) and raw body.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub event_id: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// GitHub's request quota: `limit` requests per `window` seconds.
#[derive(Debug, Clone, Copy)]
struct Quota {
    limit: u64,
    window: u64,
    used: u64,
    reset: u64,
}

/// Shopify's leaky bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    size: f64,
    leak_per_second: f64,
    level: f64,
    at: Instant,
}

struct World {
    provider: Provider,
    secret: Vec<u8>,
    /// Collection (`customers`, `issues`, `orders`) -> sort key -> object.
    objects: BTreeMap<String, BTreeMap<String, Value>>,
    /// Stripe's events, oldest first.
    events: Vec<Value>,
    /// The sender's clock, frozen at this unix second when set.
    clock: Option<i64>,
    counter: u64,
    quota: Option<Quota>,
    bucket: Option<Bucket>,
    list_requests: u64,
    get_requests: u64,
    /// Of them, requests for many objects by id (Shopify `orders.json?ids=`).
    get_many_requests: u64,
    /// Requests refused for the rate limit (403 / 429).
    refused: u64,
    /// The credential header of every request.
    credentials: Vec<Option<String>>,
    /// GitHub: the App whose installations may exchange a JWT for a token.
    app: Option<github::App>,
    /// Stripe Connect: accounts whose every request is answered 500.
    failing_accounts: std::collections::HashSet<String>,
    /// The `Stripe-Account` of every request (`""` when absent).
    account_headers: Vec<String>,
    /// How long each request waits before it is answered (a real API's pace).
    latency: std::time::Duration,
    in_flight: usize,
    /// The most requests ever waiting at once.
    max_in_flight: usize,
}

/// The running simulated provider. Dropping it stops the server.
pub struct ProviderSim {
    pub addr: SocketAddr,
    world: Arc<Mutex<World>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ProviderSim {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn lock(world: &Mutex<World>) -> std::sync::MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|e| e.into_inner())
}

fn real_now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl World {
    fn now(&self) -> i64 {
        self.clock.unwrap_or_else(real_now)
    }

    /// Objects are paged in key order; numeric ids are padded so that order is theirs.
    fn key(&self, id: &str) -> String {
        match self.provider {
            Provider::Stripe => id.to_string(),
            _ => format!("{id:0>20}"),
        }
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }
}

/// The collection of `account` (Stripe Connect) as the world keeps it: the platform's
/// own under its name, a connected account's under `acct_..:name`.
fn scoped(account: &str, collection: &str) -> String {
    if account.is_empty() {
        collection.to_string()
    } else {
        format!("{account}:{collection}")
    }
}

impl ProviderSim {
    /// Starts serving `provider` on 127.0.0.1; webhooks are signed with `secret`.
    pub async fn start(provider: Provider, secret: &str) -> std::io::Result<ProviderSim> {
        let world = Arc::new(Mutex::new(World {
            provider,
            secret: secret.as_bytes().to_vec(),
            objects: BTreeMap::new(),
            events: Vec::new(),
            clock: None,
            counter: 0,
            quota: None,
            bucket: None,
            list_requests: 0,
            get_requests: 0,
            get_many_requests: 0,
            refused: 0,
            credentials: Vec::new(),
            app: None,
            failing_accounts: Default::default(),
            account_headers: Vec::new(),
            latency: std::time::Duration::ZERO,
            in_flight: 0,
            max_in_flight: 0,
        }));
        let app = Router::new().fallback(serve).with_state(world.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ProviderSim {
            addr,
            world,
            server,
        })
    }

    /// GitHub: an App (its id and public key, PEM) with these installations; its
    /// tokens live `token_lifetime` seconds.
    pub fn enable_app(
        &self,
        app_id: &str,
        public_key_pem: &str,
        installations: &[&str],
        token_lifetime: i64,
    ) -> Result<(), String> {
        let app = github::App::new(app_id, public_key_pem, installations, token_lifetime)?;
        lock(&self.world).app = Some(app);
        Ok(())
    }

    /// GitHub: the installation tokens minted so far, as (installation, token).
    pub fn minted_tokens(&self) -> Vec<(String, String)> {
        lock(&self.world)
            .app
            .as_ref()
            .map(|a| a.minted.clone())
            .unwrap_or_default()
    }

    /// The `api_base` to configure.
    pub fn api_base(&self) -> String {
        let prefix = match lock(&self.world).provider {
            Provider::Stripe => "",
            Provider::Github => GITHUB_REPO,
            Provider::Shopify => SHOPIFY_PREFIX,
        };
        format!("http://{}{prefix}", self.addr)
    }

    /// Freezes the sender's clock at `secs` (its `Date` headers, event times), or lets
    /// it follow real time (`None`).
    pub fn set_clock(&self, secs: Option<i64>) {
        lock(&self.world).clock = secs;
    }

    /// GitHub: `limit` requests per `window_secs`, then 403 until the reset.
    pub fn set_quota(&self, limit: u64, window_secs: u64) {
        lock(&self.world).quota = Some(Quota {
            limit,
            window: window_secs,
            used: 0,
            reset: real_now() as u64 + window_secs,
        });
    }

    /// Shopify: a bucket of `size` calls draining `leak_per_second`, then 429.
    pub fn set_bucket(&self, size: u64, leak_per_second: f64) {
        lock(&self.world).bucket = Some(Bucket {
            size: size as f64,
            leak_per_second,
            level: 0.0,
            at: Instant::now(),
        });
    }

    /// Creates or changes an object and returns the webhook the provider sends for it.
    /// `what` is Stripe's event type (`customer.updated`), GitHub's action (`edited`)
    /// or Shopify's topic (`orders/updated`).
    pub fn change(&self, collection: &str, id: &str, fields: Value, what: &str) -> Webhook {
        self.change_in("", collection, id, fields, what)
    }

    /// [`ProviderSim::change`] in a Stripe Connect account (`acct_..`; `""` is the
    /// platform's own): the object lives in that account's collection, served to
    /// requests with `Stripe-Account: acct_..`, and its event names the account in its
    /// top-level `account` (inside the signed body), as Stripe's Connect events do. The
    /// other providers have one account: `account` must be `""` for them.
    pub fn change_in(
        &self,
        account: &str,
        collection: &str,
        id: &str,
        fields: Value,
        what: &str,
    ) -> Webhook {
        let stored = scoped(account, collection);
        let mut w = lock(&self.world);
        let now = w.now();
        let key = w.key(id);
        let mut object = w
            .objects
            .get(&stored)
            .and_then(|c| c.get(&key))
            .cloned()
            .unwrap_or_else(|| new_object(w.provider, collection, id, now));
        if let (Some(o), Some(f)) = (object.as_object_mut(), fields.as_object()) {
            for (k, v) in f {
                o.insert(k.clone(), v.clone());
            }
        }
        match w.provider {
            Provider::Stripe => {}
            Provider::Github => object["updated_at"] = json!(rfc3339(now)),
            Provider::Shopify => object["updated_at"] = json!(rfc3339(now)),
        }
        w.objects
            .entry(stored)
            .or_default()
            .insert(key, object.clone());
        let n = w.next();
        let secret = w.secret.clone();
        match w.provider {
            Provider::Stripe => {
                let event = json!({
                    "id": format!("evt_{n:024}"),
                    "object": "event",
                    "api_version": "2024-06-20",
                    "created": now,
                    "data": {"object": object},
                    "livemode": false,
                    "pending_webhooks": 1,
                    "request": {"id": format!("req_{n}"), "idempotency_key": null},
                    "type": what,
                });
                let mut event = event;
                if !account.is_empty() {
                    event["account"] = json!(account);
                }
                w.events.push(event.clone());
                let body = event.to_string();
                let signature = sign::stripe(&secret, real_now(), body.as_bytes());
                Webhook {
                    event_id: format!("evt_{n:024}"),
                    headers: vec![("Stripe-Signature".into(), signature)],
                    body,
                }
            }
            Provider::Github => {
                let (event, field) = match collection {
                    "pulls" => ("pull_request", "pull_request"),
                    _ => ("issues", "issue"),
                };
                let body = json!({
                    "action": what,
                    field: object,
                    "repository": {"id": 1296269, "full_name": "acme/shop"},
                    "sender": {"login": "octocat", "id": 1},
                })
                .to_string();
                let delivery = format!("72d3162e-cc78-11e3-81ab-{n:012x}");
                Webhook {
                    event_id: delivery.clone(),
                    headers: vec![
                        ("X-GitHub-Event".into(), event.into()),
                        ("X-GitHub-Delivery".into(), delivery),
                        (
                            "X-Hub-Signature-256".into(),
                            sign::github(&secret, body.as_bytes()),
                        ),
                    ],
                    body,
                }
            }
            Provider::Shopify => {
                let body = object.to_string();
                let webhook_id = format!("b54557e4-bdd9-4b37-8a5f-{n:012x}");
                Webhook {
                    event_id: webhook_id.clone(),
                    headers: vec![
                        ("X-Shopify-Topic".into(), what.into()),
                        ("X-Shopify-Webhook-Id".into(), webhook_id),
                        ("X-Shopify-Shop-Domain".into(), "acme.myshopify.com".into()),
                        ("X-Shopify-API-Version".into(), "2024-10".into()),
                        (
                            "X-Shopify-Hmac-Sha256".into(),
                            sign::shopify(&secret, body.as_bytes()),
                        ),
                    ],
                    body,
                }
            }
        }
    }

    /// Removes an object (deleted at the sender), without a webhook.
    pub fn remove(&self, collection: &str, id: &str) {
        self.remove_in("", collection, id);
    }

    /// Removes an object of a Stripe Connect account.
    pub fn remove_in(&self, account: &str, collection: &str, id: &str) {
        let collection = &scoped(account, collection);
        let mut w = lock(&self.world);
        let key = w.key(id);
        if let Some(c) = w.objects.get_mut(collection) {
            c.remove(&key);
        }
    }

    /// A collection's objects as served, by id.
    pub fn objects(&self, collection: &str) -> BTreeMap<String, Value> {
        self.objects_in("", collection)
    }

    /// A Stripe Connect account's objects of a collection, by id.
    pub fn objects_in(&self, account: &str, collection: &str) -> BTreeMap<String, Value> {
        let collection = &scoped(account, collection);
        let w = lock(&self.world);
        let id_of = |o: &Value| match w.provider {
            Provider::Github => o["number"].to_string(),
            _ => match &o["id"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        };
        w.objects
            .get(collection)
            .map(|c| c.values().map(|o| (id_of(o), o.clone())).collect())
            .unwrap_or_default()
    }

    /// Answers every request of a Stripe Connect account with 500 (or stops doing so).
    pub fn fail_account(&self, account: &str, failing: bool) {
        let mut w = lock(&self.world);
        if failing {
            w.failing_accounts.insert(account.to_string());
        } else {
            w.failing_accounts.remove(account);
        }
    }

    /// The `Stripe-Account` header of every request so far (`""`: none).
    pub fn account_headers(&self) -> Vec<String> {
        lock(&self.world).account_headers.clone()
    }

    pub fn list_requests(&self) -> u64 {
        lock(&self.world).list_requests
    }

    /// Requests for many objects by id in one (`orders.json?ids=`).
    pub fn get_many_requests(&self) -> u64 {
        lock(&self.world).get_many_requests
    }

    pub fn get_requests(&self) -> u64 {
        lock(&self.world).get_requests
    }

    /// Each request is answered after `latency` (requests wait side by side).
    pub fn set_latency(&self, latency: std::time::Duration) {
        lock(&self.world).latency = latency;
    }

    /// The most requests that were ever in flight at once.
    pub fn max_in_flight(&self) -> usize {
        lock(&self.world).max_in_flight
    }

    /// Requests the simulated provider refused for its rate limit.
    pub fn refused(&self) -> u64 {
        lock(&self.world).refused
    }

    /// The credential header (`Authorization`, or Shopify's access token) of every
    /// request.
    pub fn credentials(&self) -> Vec<Option<String>> {
        lock(&self.world).credentials.clone()
    }
}

async fn serve(
    State(world): State<Arc<Mutex<World>>>,
    method: Method,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    /// Counts the request out however it ends (a client may hang up while it waits).
    struct InFlight(Arc<Mutex<World>>);
    impl Drop for InFlight {
        fn drop(&mut self) {
            lock(&self.0).in_flight -= 1;
        }
    }
    let latency = {
        let mut w = lock(&world);
        w.in_flight += 1;
        w.max_in_flight = w.max_in_flight.max(w.in_flight);
        w.latency
    };
    let _counted = InFlight(world.clone());
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    answer(&world, method, uri, q, headers)
}

fn answer(
    world: &Mutex<World>,
    method: Method,
    uri: Uri,
    q: HashMap<String, String>,
    headers: HeaderMap,
) -> Response {
    let mut w = lock(world);
    if method == Method::POST {
        if let (Provider::Github, Some(installation)) = (
            w.provider,
            uri.path()
                .strip_prefix("/app/installations/")
                .and_then(|r| r.strip_suffix("/access_tokens")),
        ) {
            let now = w.now();
            let counter = w.next();
            let answer = github::mint(&mut w.app, installation, &headers, now, counter);
            return with_headers(answer, &w, &[]);
        }
        return (StatusCode::METHOD_NOT_ALLOWED, "").into_response();
    }
    let credential = match w.provider {
        Provider::Shopify => headers.get("X-Shopify-Access-Token"),
        _ => headers.get(header::AUTHORIZATION),
    }
    .and_then(|v| v.to_str().ok())
    .map(String::from);
    w.credentials.push(credential);
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let mut extra: Vec<(&'static str, String)> = Vec::new();
    if let Some(refusal) = rate_limit(&mut w, &mut extra) {
        return with_headers(refusal, &w, &extra);
    }
    let path = uri.path().to_string();
    let account = headers
        .get("Stripe-Account")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    w.account_headers.push(account.clone());
    if w.failing_accounts.contains(&account) {
        return with_headers(
            (StatusCode::INTERNAL_SERVER_ERROR, "account unavailable").into_response(),
            &w,
            &extra,
        );
    }
    let response = match w.provider {
        Provider::Stripe => stripe(&mut w, &path, &q, &account),
        Provider::Github => github(&mut w, &path, &q, &host),
        Provider::Shopify => shopify(&mut w, &path, &q, &host),
    };
    with_headers(response, &w, &extra)
}

fn with_headers(mut r: Response, w: &World, extra: &[(&'static str, String)]) -> Response {
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&http_date(w.now())) {
        h.insert(header::DATE, v);
    }
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(*k, v);
        }
    }
    r
}

/// Counts the request against the provider's limit; a refusal when it is spent.
fn rate_limit(w: &mut World, extra: &mut Vec<(&'static str, String)>) -> Option<Response> {
    if let Some(q) = &mut w.quota {
        let now = real_now() as u64;
        if now >= q.reset {
            q.used = 0;
            q.reset = now + q.window;
        }
        let refused = q.used >= q.limit;
        if !refused {
            q.used += 1;
        }
        extra.push(("x-ratelimit-limit", q.limit.to_string()));
        extra.push(("x-ratelimit-remaining", (q.limit - q.used).to_string()));
        extra.push(("x-ratelimit-reset", q.reset.to_string()));
        extra.push(("x-ratelimit-used", q.used.to_string()));
        extra.push(("x-ratelimit-resource", "core".into()));
        if refused {
            w.refused += 1;
            return Some(
                (
                    StatusCode::FORBIDDEN,
                    axum::Json(json!({"message": "API rate limit exceeded for installation ID 1.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"})),
                )
                    .into_response(),
            );
        }
    }
    if let Some(b) = &mut w.bucket {
        let elapsed = b.at.elapsed().as_secs_f64();
        b.level = (b.level - elapsed * b.leak_per_second).max(0.0);
        b.at = Instant::now();
        if b.level + 1.0 > b.size {
            w.refused += 1;
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                axum::Json(json!({"errors": "Exceeded 2 calls per second for api client. Reduce request rates to resume uninterrupted service."})),
            )
                .into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("2.0"));
            return Some(r);
        }
        b.level += 1.0;
        extra.push((
            "x-shopify-shop-api-call-limit",
            format!("{}/{}", b.level.ceil() as u64, b.size as u64),
        ));
    }
    None
}

fn not_found(body: Value) -> Response {
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn limit(q: &HashMap<String, String>, name: &str, default: usize, max: usize) -> usize {
    q.get(name)
        .and_then(|l| l.parse().ok())
        .unwrap_or(default)
        .clamp(1, max)
}

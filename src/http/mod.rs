//! The HTTP interface: webhook endpoints, `/healthz`, `/readyz`. Only this module knows
//! axum. Handlers are thin: read the body within the limit, hand it to
//! `webhook::Receiver`, and let `reply` turn the result into a status.
//!
//! Invariant: no input makes a handler answer 500; every error body is JSON
//! `{"error": "..."}`.

mod listener;
mod operations;
mod reply;

pub use listener::serve;

/// The routes [`router`] builds, for [`serve`].
pub type Routes = Router;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use axum::extract::Query;
use secrecy::{ExposeSecret, SecretString};

use crate::bookkeeping::Bookkeeping;
use crate::config::Config;
use crate::db::Db;
use crate::feed::{Feed, Filter};
use crate::webhook::Receiver;
use reply::{error_reply, json_reply, unavailable};

/// Everything the routes need.
pub struct HttpState {
    pub receivers: Vec<(String, Receiver)>,
    pub db: Db,
    pub book: Bookkeeping,
    pub config: Arc<Config>,
    /// The store deliveries write through (account removals tombstone through it).
    pub store: crate::store::Store,
}

/// The routes of the public listener, and of the operators' one when
/// `http.admin_listen` is set.
pub struct Routers {
    pub public: Routes,
    pub admin: Option<Routes>,
}

/// Builds the routers: one POST route per source and `/healthz` on the public listener;
/// `/readyz`, `/metrics`, `/changes` and `/admin/*` there too, or only on the admin
/// listener when `http.admin_listen` is set.
pub fn router(state: HttpState) -> Routers {
    let limits = Limits {
        max_body: state.config.http.max_body,
        body_timeout: state.config.http.body_timeout,
        max_in_flight: state.config.http.max_in_flight,
        in_flight: Arc::new(tokio::sync::Semaphore::new(state.config.http.max_in_flight)),
        bodies: Arc::new(BodyBudget::new(state.config.http.max_body_bytes_in_flight)),
    };
    let operations = crate::operations::Operations::new(state.config.clone(), state.store);
    let mut webhooks = Router::new();
    for (path, receiver) in state.receivers {
        let (receiver, limits) = (Arc::new(receiver), limits.clone());
        webhooks = webhooks.route(
            &path,
            post(move |headers: HeaderMap, body: Body| {
                let (receiver, limits) = (receiver.clone(), limits.clone());
                async move { receive(&receiver, &limits, headers, body).await }
            }),
        );
    }
    let health = Health {
        db: state.db,
        book: state.book,
        config: state.config,
    };
    let config = health.config.clone();
    let admin_apart = config.http.admin_listen.is_some();
    let mut router = Router::new();
    // Without a token the endpoint does not exist: the webhook listener may face the
    // internet, and the feed carries every state.
    if let Some(token) = config.http.changes_token.clone() {
        let feed = Feed::new(health.db.clone());
        router = router.route(
            "/changes",
            get(
                move |headers: HeaderMap, query: Query<Vec<(String, String)>>| {
                    let (feed, token) = (feed.clone(), token.clone());
                    async move { changes(&feed, &token, &headers, query.0).await }
                },
            ),
        );
    }
    let reports = Router::new()
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health.clone());
    // Every `/admin/*` route behind one check of the token, made before the route's own
    // extractors read anything (a bad query string of a caller without the token is
    // answered 401, not 400).
    let admin_routes = operations::routes(operations)
        .merge(
            Router::new()
                .route("/admin/status", get(readyz))
                .with_state(health),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            config.http.admin_token.clone(),
            require_admin,
        ));
    let ops = router.merge(admin_routes).merge(reports);
    let finish = |r: Router| {
        r.route(
            "/healthz",
            get(|| async { json_reply(StatusCode::OK, json!({"status": "ok"})) }),
        )
        .fallback(|| async { error_reply(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error_reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this path",
            )
        })
        // The limit is ours (413 with a JSON body), not axum's default 2 MB.
        .layer(DefaultBodyLimit::disable())
    };
    if admin_apart {
        Routers {
            public: finish(webhooks),
            admin: Some(finish(ops)),
        }
    } else {
        Routers {
            public: finish(webhooks.merge(ops)),
            admin: None,
        }
    }
}

/// Whether `headers` carry `Authorization: Bearer {expected}`; compared in constant time.
fn bearer_matches(headers: &HeaderMap, expected: &SecretString) -> bool {
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let expected = expected.expose_secret().as_bytes();
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The layer in front of every `/admin/*` route.
async fn require_admin(
    axum::extract::State(token): axum::extract::State<Option<SecretString>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match admin_refusal(token.as_ref(), req.headers()) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// The answer to an `/admin/*` request that may not proceed: 404 when no
/// `http.admin_token` is configured (the routes do not exist), 401 without the token.
fn admin_refusal(token: Option<&SecretString>, headers: &HeaderMap) -> Option<Response> {
    match token {
        None => Some(error_reply(StatusCode::NOT_FOUND, "no such endpoint")),
        Some(t) if !bearer_matches(headers, t) => Some(reply::admin_unauthorized()),
        Some(_) => None,
    }
}

/// The operators' listener (`http.admin_listen`), bound at start so that a bad address
/// fails `serve` at once.
pub enum AdminListener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl AdminListener {
    pub async fn bind(at: &crate::config::AdminListen) -> std::io::Result<Self> {
        match at {
            crate::config::AdminListen::Tcp(addr) => {
                Ok(Self::Tcp(tokio::net::TcpListener::bind(addr).await?))
            }
            crate::config::AdminListen::Unix(path) => {
                // A socket left by a previous run would make bind fail.
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    std::fs::remove_file(path)?;
                }
                Ok(Self::Unix(tokio::net::UnixListener::bind(path)?))
            }
        }
    }

    /// The bound address, as `http.admin_listen` writes it.
    pub fn local_addr(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string()),
            Self::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display())))
                .unwrap_or_else(|| "unix:?".into()),
        }
    }

    /// Serves `routes` until `shutdown`. Operators only: no caps or deadlines beyond
    /// axum's own.
    pub async fn serve(
        self,
        routes: Routes,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        match self {
            Self::Tcp(l) => {
                axum::serve(l, routes)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            Self::Unix(l) => {
                axum::serve(l, routes)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
        }
    }
}

/// What bounds a delivery: its body's size, and how many are handled at once (shared by
/// every source).
#[derive(Clone)]
struct Limits {
    max_body: usize,
    body_timeout: std::time::Duration,
    max_in_flight: usize,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// The bytes of the bodies being received (`http.max_body_bytes_in_flight`).
    bodies: Arc<BodyBudget>,
}

/// The bytes all bodies being received may take together: unsigned bodies cost memory
/// before any signature is checked, so their sum is bounded, not only each one.
struct BodyBudget {
    max: usize,
    taken: std::sync::atomic::AtomicUsize,
}

impl BodyBudget {
    fn new(max: usize) -> Self {
        Self {
            max,
            taken: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Room for a body of at most `bytes`, given back when the reservation drops;
    /// `None` when the budget cannot hold it now.
    fn reserve(self: &Arc<Self>, bytes: usize) -> Option<BodyReservation> {
        use std::sync::atomic::Ordering;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                t.checked_add(bytes).filter(|n| *n <= self.max)
            })
            .ok()?;
        Some(BodyReservation {
            budget: self.clone(),
            bytes,
        })
    }
}

struct BodyReservation {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        self.budget
            .taken
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

async fn receive(receiver: &Receiver, limits: &Limits, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let max_body = limits.max_body;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return reply::too_large(receiver.source(), max_body);
    }
    // Its room among the bodies being received, before a byte of it is read: at its
    // declared length, or the most it may be.
    let room = declared.map_or(max_body, |n| n as usize);
    let Some(reserved) = limits.bodies.reserve(room) else {
        return reply::bodies_full(receiver.source(), limits.bodies.max);
    };
    // The body within its deadline: a client trickling bytes holds its own connection,
    // never an in-flight place.
    let bytes =
        match tokio::time::timeout(limits.body_timeout, axum::body::to_bytes(body, max_body)).await
        {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => return reply::too_large(receiver.source(), max_body),
            Err(_) => return reply::too_slow(receiver.source(), limits.body_timeout),
        };
    // The body is read: the rest of the request holds it in `bytes`, bounded by the
    // in-flight deliveries below.
    drop(reserved);
    // Counted once the body is here: when the database is slow or gone, deliveries would
    // otherwise pile up by the thousand, each holding a connection and a body.
    let Ok(_permit) = limits.in_flight.try_acquire() else {
        return reply::overloaded(receiver.source(), limits.max_in_flight);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let span = tracing::info_span!("delivery", source = receiver.source());
    crate::telemetry::continue_trace(&span, &headers);
    let result =
        tracing::Instrument::instrument(receiver.receive(&headers, &bytes, now), span).await;
    reply::delivery(receiver.source(), result, started.elapsed())
}

/// Default page of `GET /changes`.
const CHANGES_PAGE: i64 = 100;

/// `GET /changes?after=SEQ&limit=N` behind `Authorization: Bearer {http.changes_token}`.
async fn changes(
    feed: &Feed,
    token: &SecretString,
    headers: &HeaderMap,
    query: Vec<(String, String)>,
) -> Response {
    if !bearer_matches(headers, token) {
        return error_reply(
            StatusCode::UNAUTHORIZED,
            "missing or wrong `Authorization: Bearer` token (http.changes_token)",
        );
    }
    let param = |name: &str, default: i64| -> Result<i64, String> {
        match query.iter().find(|(k, _)| k == name) {
            None => Ok(default),
            Some((_, v)) => v
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("`{name}` must be a whole number, 0 or more")),
        }
    };
    let (after, limit) = match (param("after", 0), param("limit", CHANGES_PAGE)) {
        (Ok(a), Ok(l)) => (a, l.clamp(1, crate::feed::MAX_PAGE)),
        (Err(e), _) | (_, Err(e)) => return error_reply(StatusCode::BAD_REQUEST, e),
    };
    match feed.after(after, limit, &Filter::default()).await {
        Ok(changes) => {
            let next_after = changes.last().map_or(after, |c| c.seq);
            json_reply(
                StatusCode::OK,
                json!({"changes": changes, "next_after": next_after}),
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "GET /changes: cannot read the change feed");
            unavailable("the change feed cannot be read now; retry later")
        }
    }
}

/// What `/readyz`, `/admin/status` and `/metrics` read.
#[derive(Clone)]
struct Health {
    db: Db,
    book: Bookkeeping,
    config: Arc<Config>,
}

/// `/metrics`: Prometheus' text format.
async fn metrics(axum::extract::State(h): axum::extract::State<Health>) -> Response {
    let body = crate::health::render(&h.db, &h.book, &h.config).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        body,
    )
        .into_response()
}

/// Ready when the database is reachable and migrated. The body also reports each
/// kind's reconcile freshness; an overdue kind is reported, not made unready (a sender
/// outage must not take the webhook receiver out of a load balancer).
async fn readyz(axum::extract::State(h): axum::extract::State<Health>) -> Response {
    let (db, book, config) = (&h.db, &h.book, &*h.config);
    match db.is_migrated().await {
        Ok(true) => {
            let kinds = crate::health::freshness(book, config)
                .await
                .unwrap_or_default();
            let feed = Feed::new(db.clone());
            let fetches = crate::store::fetch_counts(db).await.unwrap_or_default();
            let mut consumers = serde_json::Map::new();
            for c in &config.consumers {
                if let Ok(lag) = feed.lag(c).await {
                    let mut entry = json!(lag);
                    // A paused consumer's lag grows by design; say why.
                    if let (Ok((_, paused)), Some(map)) =
                        (feed.state(&c.name).await, entry.as_object_mut())
                    {
                        map.insert("paused".into(), json!(paused));
                    }
                    consumers.insert(c.name.clone(), entry);
                }
            }
            json_reply(
                StatusCode::OK,
                json!({"status": "ready", "database": "ok", "reconcile": kinds, "consumers": consumers,
                    "fetches": fetches, "queues": crate::observability::queues(), "memory": crate::observability::memory(db),
                    "pools": crate::observability::pools(db)}),
            )
        }
        Ok(false) => json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "not ready", "database": "migrations pending; run `webhook-reconciler migrate`"}),
        ),
        Err(e) => {
            // The error's text stays in the log: it may name hosts and users.
            tracing::warn!(error = %e, "/readyz: the database cannot be reached");
            json_reply(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "database": "unreachable; the daemon's log has the error",
                    "queues": crate::observability::queues(), "pools": crate::observability::pools(db)}),
            )
        }
    }
}

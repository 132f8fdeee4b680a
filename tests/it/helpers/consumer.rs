//! A test application receiving the change feed: a real HTTP server on 127.0.0.1 that
//! checks each push's Standard Webhooks signature, records it, and can be told to fail.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::Value;
use webhook_reconciler::signature as sign;

/// `whsec_` + base64 of these bytes: the consumers' secret in the tests.
pub const CONSUMER_KEY: &[u8] = b"consumer-key-0123456789abcdef!!";

pub fn consumer_secret() -> String {
    use base64::Engine;
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(CONSUMER_KEY)
    )
}

/// One push as received.
#[derive(Debug, Clone)]
pub struct Push {
    pub webhook_id: String,
    pub body: Value,
    /// The status this application answered.
    pub status: u16,
}

#[derive(Default)]
struct Inner {
    pushes: Vec<Push>,
    /// Answer 500 to this many more pushes.
    fail_next: usize,
    /// Take this long to answer each push.
    delay: std::time::Duration,
}

pub struct ConsumerApp {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ConsumerApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, ts) = (h("webhook-id"), h("webhook-timestamp"));
    let expected = sign::standard_webhooks(CONSUMER_KEY, &id, ts.parse().unwrap_or(0), &body);
    if h("webhook-signature") != expected {
        return StatusCode::UNAUTHORIZED;
    }
    let delay = inner.lock().unwrap().delay;
    tokio::time::sleep(delay).await;
    let mut inner = inner.lock().unwrap();
    let status = if inner.fail_next > 0 {
        inner.fail_next -= 1;
        500
    } else {
        200
    };
    inner.pushes.push(Push {
        webhook_id: id,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        status,
    });
    StatusCode::from_u16(status).unwrap()
}

impl ConsumerApp {
    pub async fn start() -> ConsumerApp {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/feed", post(receive))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ConsumerApp {
            addr,
            inner,
            server,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/feed", self.addr)
    }

    /// A `[consumers.NAME]` section pointing here, plus `extra` lines.
    pub fn config(&self, name: &str, extra: &str) -> String {
        format!(
            "\n[consumers.{name}]\nurl = \"{}\"\nsecret = \"{}\"\n{extra}\n",
            self.url(),
            consumer_secret()
        )
    }

    pub fn answer_after(&self, delay: std::time::Duration) {
        self.inner.lock().unwrap().delay = delay;
    }

    pub fn fail_next(&self, n: usize) {
        self.inner.lock().unwrap().fail_next = n;
    }

    pub fn pushes(&self) -> Vec<Push> {
        self.inner.lock().unwrap().pushes.clone()
    }

    /// The pushes answered 2xx.
    pub fn delivered(&self) -> Vec<Push> {
        self.pushes()
            .into_iter()
            .filter(|p| p.status == 200)
            .collect()
    }
}

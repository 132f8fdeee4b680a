//! The demo's application: a small HTTP endpoint that receives the change feed and
//! performs one "effect" per change (it would ship the order, email the customer),
//! deduplicating by `webhook-id` — the idempotency key the daemon sends, identical on
//! every retry. Like the simulator, it is the other party's side: it runs its own server.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use crate::config::Scheme;
use crate::webhook::verify::Verifier;

#[derive(Default)]
struct Effects {
    done: HashSet<String>,
    from_reconcile: usize,
    redelivered: usize,
}

/// The running application; dropping it stops the server.
pub struct Application {
    pub addr: SocketAddr,
    effects: Arc<Mutex<Effects>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Application {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// What the application did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct EffectCounts {
    /// Effects performed: one per distinct change.
    pub performed: usize,
    /// Of which for changes that reconciliation made (a lost webhook repaired).
    pub from_reconcile: usize,
    /// Pushes of a change already handled (a retry): acknowledged, not performed again.
    pub redelivered: usize,
}

fn lock(m: &Mutex<Effects>) -> std::sync::MutexGuard<'_, Effects> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn receive(
    State((effects, verifier)): State<(Arc<Mutex<Effects>>, Arc<Verifier>)>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let now = chrono::Utc::now().timestamp();
    if verifier.verify(&headers, &body, now).is_err() {
        return StatusCode::UNAUTHORIZED;
    }
    let Some(key) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) else {
        return StatusCode::BAD_REQUEST;
    };
    let change: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let mut e = lock(&effects);
    if e.done.insert(key.to_string()) {
        // The effect itself: here, counting it.
        if change["origin"] == "reconcile" {
            e.from_reconcile += 1;
        }
    } else {
        e.redelivered += 1;
    }
    StatusCode::OK
}

impl Application {
    /// Starts on 127.0.0.1, checking pushes against `key` (Standard Webhooks).
    pub async fn start(key: &[u8]) -> std::io::Result<Application> {
        let effects = Arc::new(Mutex::new(Effects::default()));
        let verifier = Arc::new(Verifier::new(
            Scheme::StandardWebhooks,
            vec![crate::config::WebhookSecret::from_bytes(key.to_vec())],
            std::time::Duration::from_secs(300),
        ));
        let app = Router::new()
            .route("/changes", post(receive))
            .with_state((effects.clone(), verifier));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Application {
            addr,
            effects,
            server,
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/changes", self.addr)
    }

    pub fn counts(&self) -> EffectCounts {
        let e = lock(&self.effects);
        EffectCounts {
            performed: e.done.len(),
            from_reconcile: e.from_reconcile,
            redelivered: e.redelivered,
        }
    }
}

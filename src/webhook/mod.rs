//! The webhook flow for one source: verify (`verify`) -> parse (`ingest::envelope`) ->
//! a retry of an id this process claimed answered from memory (`recent`) -> ingest
//! (mapping, claim, guarded write, dead letter: `crate::ingest`, shared with catch-up and
//! dead letters retried). Independent of the HTTP framework: `http` turns
//! [`Rejection`]s into status codes.

pub mod recent;
pub mod verify;

use std::sync::Arc;

use http::HeaderMap;

use crate::config::{Scheme, SourceConfig};
use crate::ingest::envelope::{self, EnvelopeError, HeaderIds};
use crate::ingest::{Ingest, Refusal};
use crate::store::{Outcome, Store};
use recent::RecentClaims;
use verify::{Verifier, VerifyError};

const SHOPIFY_ID: &str = "X-Shopify-Webhook-Id";
/// The shop a Shopify delivery is for: a header, outside what Shopify signs.
const SHOPIFY_SHOP: &str = "X-Shopify-Shop-Domain";
const SHOPIFY_TOPIC: &str = "X-Shopify-Topic";

/// Why a delivery was not applied; each maps to one status in SPEC's HTTP table.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// 401: not authentic; nothing written.
    #[error(transparent)]
    Unauthorized(#[from] VerifyError),
    /// 400: not an envelope; nothing written.
    #[error(transparent)]
    BadRequest(#[from] EnvelopeError),
    /// 422 (kept in `dead_letters`) or 503 (the database cannot take it now): the ingest
    /// step's refusal, the same for a delivery, a caught-up event and a retried dead
    /// letter.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// Receives the deliveries of one configured source.
#[derive(Clone)]
pub struct Receiver {
    scheme: Scheme,
    verifier: Verifier,
    ingest: Ingest,
    /// Ids this process claimed: their retries are answered without the database.
    recent: Arc<RecentClaims>,
}

impl Receiver {
    pub fn new(source: &SourceConfig, store: Store) -> Self {
        Self {
            scheme: source.webhook.scheme.clone(),
            verifier: Verifier::new(
                source.webhook.scheme.clone(),
                source.webhook.secrets.clone(),
                source.webhook.tolerance,
            ),
            ingest: Ingest::new(source, store),
            recent: Arc::new(RecentClaims::new(recent::GENERATION, source.retention)),
        }
    }

    fn header_ids<'a>(&self, headers: &'a HeaderMap) -> HeaderIds<'a> {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        match self.scheme {
            Scheme::Github => HeaderIds {
                id: get("X-GitHub-Delivery"),
                event_type: get("X-GitHub-Event"),
                only: None,
            },
            Scheme::StandardWebhooks => HeaderIds {
                id: get("webhook-id"),
                event_type: None,
                only: None,
            },
            Scheme::Shopify => HeaderIds {
                id: get(SHOPIFY_ID),
                event_type: get(SHOPIFY_TOPIC),
                only: Some((SHOPIFY_ID, SHOPIFY_TOPIC)),
            },
            _ => HeaderIds::default(),
        }
    }

    pub fn source(&self) -> &str {
        self.ingest.source()
    }

    /// Verifies, parses and applies one delivery at time `now` (unix seconds).
    pub async fn receive(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(Outcome, String), Rejection> {
        self.verifier.verify(headers, body, now)?;
        let mut env = envelope::parse(body, self.header_ids(headers))?;
        if self.scheme == Scheme::Shopify {
            env.account_hint = headers
                .get(SHOPIFY_SHOP)
                .and_then(|v| v.to_str().ok())
                .map(String::from);
        }
        if self.recent.contains(&env.id) {
            metrics::counter!("webhook_duplicates_from_memory_total", "source" => self.source().to_string())
                .increment(1);
            return Ok((Outcome::Duplicate, env.id));
        }
        let id = env.id.clone();
        let outcome = self.ingest(env, body).await?;
        if outcome != Outcome::Duplicate {
            self.recent.insert(&id);
        }
        Ok((outcome, id))
    }

    /// Ingest (see `ingest::Ingest::delivery`: the body's digest, the fetch a 200
    /// leaves, all there).
    async fn ingest(&self, env: envelope::Envelope, body: &[u8]) -> Result<Outcome, Refusal> {
        let (outcome, _) = self.ingest.delivery(env, body).await?;
        Ok(outcome)
    }
}

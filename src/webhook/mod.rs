//! The webhook flow for one source: verify -> parse -> guarded write.
//! Independent of the HTTP framework: `http` turns [`Rejection`]s into status codes.

pub mod envelope;
pub mod verify;

use std::collections::HashMap;

use http::HeaderMap;

use crate::change::ResourceKey;
use crate::config::{Scheme, SourceConfig};
use crate::db::{DbError, ErrorClass};

const SHOPIFY_ID: &str = "X-Shopify-Webhook-Id";
const SHOPIFY_TOPIC: &str = "X-Shopify-Topic";

/// Longest reason kept with a dead letter.
const MAX_REASON_BYTES: usize = 500;
use crate::store::{Delivery, Outcome, Store};
use envelope::{EnvelopeError, HeaderIds, KindMapping};
use verify::{Verifier, VerifyError};

/// Why a delivery was not applied; each maps to one status in SPEC's HTTP table.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    /// 401: not authentic; nothing written.
    #[error(transparent)]
    Unauthorized(#[from] VerifyError),
    /// 400: not an envelope; nothing written.
    #[error(transparent)]
    BadRequest(#[from] EnvelopeError),
    /// 422: authentic, but the mapped pointers cannot be read; kept in `dead_letters`.
    #[error("event {event_id} ({event_type}): {reason}; kept in dead_letters")]
    Unprocessable {
        event_id: String,
        event_type: String,
        reason: String,
    },
    /// 503: the database cannot take it now; the sender's retry will succeed later.
    #[error(transparent)]
    Unavailable(#[from] DbError),
}

/// Receives the deliveries of one configured source.
#[derive(Clone)]
pub struct Receiver {
    source: String,
    scheme: Scheme,
    verifier: Verifier,
    /// Event type -> kind and pointers.
    mappings: HashMap<String, KindMapping>,
    store: Store,
    /// Where conflicts go to be resolved from the sender (see `reconcile::resolve`).
    conflicts: Option<tokio::sync::mpsc::Sender<ConflictKey>>,
}

/// A resource whose webhook ended in `conflict`.
pub type ConflictKey = ResourceKey;

impl Receiver {
    pub fn new(source: &SourceConfig, store: Store) -> Self {
        let mut mappings = HashMap::new();
        for kind in &source.kinds {
            for (event_type, mapping) in &kind.events {
                mappings.insert(
                    event_type.clone(),
                    KindMapping {
                        kind: kind.name.clone(),
                        mapping: mapping.clone(),
                        version_format: kind.version_format,
                    },
                );
            }
        }
        Self {
            source: source.name.clone(),
            scheme: source.webhook.scheme.clone(),
            verifier: Verifier::new(
                source.webhook.scheme.clone(),
                source.webhook.secrets.clone(),
                source.webhook.tolerance,
            ),
            mappings,
            store,
            conflicts: None,
        }
    }

    /// Sends the resources of `conflict` outcomes to `tx` for resolution.
    pub fn with_conflicts(mut self, tx: tokio::sync::mpsc::Sender<ConflictKey>) -> Self {
        self.conflicts = Some(tx);
        self
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

    /// The mapping of an event: GitHub names the change in the body's `action`
    /// (`issues` + `"action": "deleted"`), so `issues.deleted` is looked up before
    /// `issues`.
    fn mapping(&self, env: &envelope::Envelope) -> Option<&KindMapping> {
        if self.scheme == Scheme::Github {
            if let Some(action) = env.doc.get("action").and_then(|a| a.as_str()) {
                let specific = format!("{}.{action}", env.event_type);
                if let Some(m) = self.mappings.get(&specific) {
                    return Some(m);
                }
            }
        }
        self.mappings.get(&env.event_type)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// What to answer when the guarded write failed: "not now" is 503 (the sender's
    /// retry succeeds later); an error caused by this delivery's data is 422 and a dead
    /// letter (a 503 would make the sender retry it for its whole retry window); an
    /// unknown error is 503 too, so nothing is lost, and logged as an error.
    async fn database_refused(
        &self,
        e: DbError,
        env: envelope::Envelope,
        body: &[u8],
    ) -> Rejection {
        match e.class() {
            ErrorClass::Unavailable => Rejection::Unavailable(e),
            ErrorClass::Unknown => {
                tracing::error!(source = self.source, event_id = env.id, error = %e, "unclassified database error; answered 503 so that nothing is lost. Please report it");
                Rejection::Unavailable(e)
            }
            ErrorClass::Data => {
                let mut reason = format!("the database refused this delivery's data: {e}");
                if reason.len() > MAX_REASON_BYTES {
                    let cut = (0..=MAX_REASON_BYTES)
                        .rev()
                        .find(|i| reason.is_char_boundary(*i))
                        .unwrap_or(0);
                    reason.truncate(cut);
                    reason.push_str("...");
                }
                self.dead_letter(env, reason, body).await
            }
        }
    }

    /// Keeps an authentic delivery that cannot be applied, with the reason: 422 (or
    /// 503 if even the dead letter cannot be written).
    async fn dead_letter(&self, env: envelope::Envelope, reason: String, body: &[u8]) -> Rejection {
        let kept = self
            .store
            .dead_letter(
                self.source.clone(),
                env.id.clone(),
                env.event_type.clone(),
                reason.clone(),
                String::from_utf8_lossy(body).into_owned(),
            )
            .await;
        match kept {
            Ok(()) => Rejection::Unprocessable {
                event_id: env.id,
                event_type: env.event_type,
                reason,
            },
            Err(e) => Rejection::Unavailable(e),
        }
    }

    /// Verifies, parses and applies one delivery at time `now` (unix seconds).
    pub async fn receive(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(Outcome, String), Rejection> {
        self.verifier.verify(headers, body, now)?;
        let env = envelope::parse(body, self.header_ids(headers))?;
        let id = env.id.clone();
        let (outcome, key) = self.accept(env, body).await?;
        if let (Outcome::Conflict, Some(tx), Some(key)) = (outcome, &self.conflicts, key) {
            // A full queue drops the request: the next reconcile resolves it anyway.
            if tx.try_send(key).is_ok() {
                crate::observability::conflicts_waiting(1);
            }
        }
        Ok((outcome, id))
    }

    /// Applies an authentic event (a verified delivery, or one listed by the sender's
    /// events API): mapping, claim, guarded write; an event that cannot be read or
    /// stored is kept as a dead letter. Returns the outcome and the resource, if mapped.
    pub async fn accept(
        &self,
        env: envelope::Envelope,
        body: &[u8],
    ) -> Result<(Outcome, Option<ResourceKey>), Rejection> {
        let change = match self.mapping(&env) {
            None => None,
            Some(m) => match m.change(&self.source, &env) {
                Ok(c) => Some(c),
                Err(e) => return Err(self.dead_letter(env, e.to_string(), body).await),
            },
        };
        let key = change.as_ref().map(|c| c.key().to_owned());
        let applied = self
            .store
            .apply_event(Delivery {
                source: self.source.clone(),
                event_id: env.id.clone(),
                event_type: env.event_type.clone(),
                change,
            })
            .await;
        match applied {
            Ok(outcome) => Ok((outcome, key)),
            Err(e) => Err(self.database_refused(e, env, body).await),
        }
    }
}

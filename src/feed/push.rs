//! Pushing the change feed to a consumer (the application): each change POSTed as JSON,
//! signed with Standard Webhooks headers, `webhook-id: chg_<seq>` — the application's
//! idempotency key, the same on every retry.
//!
//! Per batch of changes after the consumer's position: the changes of one resource go
//! one after the other, each only after the previous was answered 2xx; different
//! resources go in parallel (at most [`PARALLEL`]). The position advances past the batch
//! once every change of it was delivered (or skipped), in a transaction fenced on the
//! consumer's lease, so one process pushes for a consumer at a time and a crash or a
//! restart resends at most one batch (at least once; the key makes that harmless).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Feed, FeedChange, FeedPage, Filter};
use crate::bookkeeping::{Bookkeeping, Lease, LeaseLost};
use crate::change::Key;
use crate::config::{ConsumerConfig, OnFailure};
use crate::db::{Db, DbError};
use crate::signature as sign;

/// Changes read per batch.
const BATCH: i64 = 500;
/// Resources pushed to at the same time.
pub const PARALLEL: usize = 8;
/// How often the feed is read when nothing wakes the pusher (other replicas' writes).
const POLL: Duration = Duration::from_millis(250);
/// The consumer's lease: one pushing process at a time.
const LEASE_TTL: Duration = Duration::from_secs(30);
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
enum PushError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
}

/// What became of one change.
enum Delivered {
    Ok,
    Skipped,
    /// Shutdown: the batch is abandoned, the position stays.
    Cancelled,
}

/// Pushes the feed to one consumer until cancelled.
pub struct Pusher {
    consumer: ConsumerConfig,
    feed: Feed,
    book: Bookkeeping,
    /// Shared by the delivery tasks of every batch.
    endpoint: Arc<Endpoint>,
    published: Arc<Notify>,
}

impl Pusher {
    pub fn new(
        consumer: ConsumerConfig,
        db: Db,
        book: Bookkeeping,
        published: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(consumer.timeout)
            .connect_timeout(consumer.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("webhook-reconciler/", env!("CARGO_PKG_VERSION")))
            // The application's endpoint is configured; a redirect is not followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            feed: Feed::new(db.clone()),
            endpoint: Arc::new(Endpoint {
                consumer: consumer.clone(),
                client,
                feed: Feed::new(db.clone()),
            }),
            consumer,
            book,
            published,
        })
    }

    /// Takes the consumer's lease (waiting while another process holds it) and pushes
    /// while it holds it, until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let name = self.consumer.name.clone();
        let lease = Key::consumer(name.as_str());
        let span = tracing::info_span!("push", consumer = name);
        tracing::Instrument::instrument(
            async move {
                while !cancel.is_cancelled() {
                    match self
                        .book
                        .acquire_lease(&lease, LEASE_TTL)
                        .await
                    {
                        Ok(Lease::Acquired) => {
                            let heartbeat = self.book.keep_alive(&lease, LEASE_TTL);
                            let result = self.push_while_holding(&cancel).await;
                            drop(heartbeat);
                            if let Err(e) = self.book.release_lease(&lease).await {
                                tracing::warn!(error = %e, "could not release the consumer's lease; it expires by itself");
                            }
                            if let Err(e) = result {
                                tracing::warn!(error = %e, "pushing stopped; retrying");
                            }
                        }
                        Ok(Lease::HeldBy { .. }) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot take the consumer's lease; retrying")
                        }
                    }
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            },
            span,
        )
        .await;
    }

    async fn push_while_holding(&self, cancel: &CancellationToken) -> Result<(), PushError> {
        let name = &self.consumer.name;
        let filter = Filter::from(&self.consumer);
        self.feed
            .position_or_start(name, self.consumer.start)
            .await?;
        let mut operator_paused = false;
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            // Read every round: an operator may pause the consumer or rewind it (from
            // any replica); each takes effect at the next batch.
            let (position, paused) = self.feed.state(name).await?;
            if paused != operator_paused {
                // An operator's pause shows like a stuck consumer's, so the same alert
                // and dashboard see it.
                operator_paused = paused;
                metrics::gauge!("feed_consumer_paused", "consumer" => name.to_string())
                    .set(if paused { 1.0 } else { 0.0 });
            }
            if paused {
                tokio::select! {
                    () = tokio::time::sleep(POLL) => {}
                    () = cancel.cancelled() => return Ok(()),
                }
                continue;
            }
            // Registered before the read, so a commit between the read and the wait
            // still wakes us.
            let woken = self.published.notified();
            // Read first: every seq up to it is committed (visibility order), so once
            // the filtered read below has everything after `position`, the position may
            // move up to it, past changes this consumer does not want.
            let committed = self.feed.last_seq().await?;
            let FeedPage {
                changes: batch,
                more,
            } = self.feed.page(position, BATCH, &filter).await?;
            let complete = !more;
            let last = match (batch.last().map(|c| c.seq), complete) {
                (Some(seq), false) => seq,
                (Some(seq), true) => seq.max(committed),
                (None, _) => committed,
            };
            if last <= position {
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep(POLL) => {}
                    () = cancel.cancelled() => return Ok(()),
                }
                continue;
            }
            if !self.deliver_batch(batch, cancel).await {
                return Ok(());
            }
            let fence = self.book.fence(&Key::consumer(name.as_str()), LEASE_TTL);
            if !self.feed.advance(name, position, last, fence).await?? {
                tracing::info!(
                    consumer = name,
                    "the consumer's position was moved by an operator; pushing from there"
                );
            }
        }
    }

    /// Delivers a batch: per resource in order, resources in parallel. False when
    /// cancelled (the position must not move).
    async fn deliver_batch(&self, batch: Vec<FeedChange>, cancel: &CancellationToken) -> bool {
        let mut by_resource: BTreeMap<(String, String, String), Vec<FeedChange>> = BTreeMap::new();
        for c in batch {
            by_resource
                .entry((c.source.clone(), c.kind.clone(), c.id.clone()))
                .or_default()
                .push(c);
        }
        let permits = Arc::new(Semaphore::new(PARALLEL));
        let mut tasks = tokio::task::JoinSet::new();
        for (_, changes) in by_resource {
            let (this, permits, cancel) = (self.endpoint.clone(), permits.clone(), cancel.clone());
            tasks.spawn(async move {
                let Ok(_permit) = permits.acquire_owned().await else {
                    return false;
                };
                for change in changes {
                    if let Delivered::Cancelled = this.deliver(&change, &cancel).await {
                        return false;
                    }
                }
                true
            });
        }
        let mut complete = true;
        while let Some(done) = tasks.join_next().await {
            complete &= done.unwrap_or(false);
        }
        complete
    }
}

/// The consumer's endpoint, as each delivery task needs it.
struct Endpoint {
    consumer: ConsumerConfig,
    client: reqwest::Client,
    feed: Feed,
}

impl Endpoint {
    /// POSTs one change until it is answered 2xx (or skipped, or cancelled).
    async fn deliver(&self, change: &FeedChange, cancel: &CancellationToken) -> Delivered {
        let c = &self.consumer;
        let id = format!("chg_{}", change.seq);
        let body = match serde_json::to_vec(change) {
            Ok(b) => b,
            // Cannot happen for this struct; if it did, the batch is retried, loudly,
            // rather than the change skipped in silence.
            Err(e) => {
                tracing::error!(consumer = c.name, seq = change.seq, error = %e, "cannot serialize the change; retrying the batch");
                return Delivered::Cancelled;
            }
        };
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let ts = chrono::Utc::now().timestamp();
            let sent = self
                .client
                .post(&c.url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", ts.to_string())
                .header(
                    "webhook-signature",
                    sign::standard_webhooks(c.secret.expose(), &id, ts, &body),
                )
                .body(body.clone())
                .send()
                .await;
            let error = match sent {
                Ok(r) if r.status().is_success() => {
                    metrics::counter!("feed_pushes_total", "consumer" => c.name.clone(), "result" => "delivered").increment(1);
                    metrics::gauge!("feed_consumer_paused", "consumer" => c.name.clone()).set(0.0);
                    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(&change.changed_at) {
                        let lag = chrono::Utc::now().signed_duration_since(at);
                        metrics::histogram!("feed_push_lag_seconds", "consumer" => c.name.clone())
                            .record(lag.num_microseconds().unwrap_or(0) as f64 / 1e6);
                    }
                    return Delivered::Ok;
                }
                Ok(r) => format!("HTTP {}", r.status()),
                Err(e) if e.is_timeout() => format!("timed out after {:?}", c.timeout),
                Err(e) if e.is_connect() => "cannot connect".to_string(),
                Err(e) => format!("request failed: {e}"),
            };
            metrics::counter!("feed_pushes_total", "consumer" => c.name.clone(), "result" => "failed").increment(1);
            if c.max_attempts > 0 && attempt >= c.max_attempts {
                match c.on_failure {
                    OnFailure::Skip => {
                        tracing::error!(
                            consumer = c.name,
                            seq = change.seq,
                            attempts = attempt,
                            error,
                            "change skipped after max_attempts (on_failure = \"skip\")"
                        );
                        let recorded = self
                            .feed
                            .record_skip(&c.name, change.seq, attempt, &error)
                            .await;
                        if recorded.is_ok() {
                            metrics::counter!("feed_pushes_total", "consumer" => c.name.clone(), "result" => "skipped").increment(1);
                            return Delivered::Skipped;
                        }
                    }
                    OnFailure::Pause => {
                        if attempt == c.max_attempts {
                            tracing::error!(
                                consumer = c.name,
                                seq = change.seq,
                                attempts = attempt,
                                error,
                                "consumer paused: this change keeps failing; retrying until it is answered 2xx"
                            );
                        }
                        metrics::gauge!("feed_consumer_paused", "consumer" => c.name.clone())
                            .set(1.0);
                    }
                }
            } else if attempt == 1 || attempt % 10 == 0 {
                tracing::warn!(
                    consumer = c.name,
                    seq = change.seq,
                    attempt,
                    error,
                    "push failed; retrying with back-off"
                );
            }
            let exp = FIRST_RETRY.saturating_mul(1u32 << attempt.min(16).saturating_sub(1));
            let wait = exp.min(MAX_RETRY).mul_f64(rand::random_range(0.8..1.2));
            tokio::select! {
                () = cancel.cancelled() => return Delivered::Cancelled,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}

//! The sender's delivery engine: sends signed webhooks to a receiver with the faults
//! real senders have. Which event suffers which fault is decided up front from a seed,
//! and one resource's deliveries are sent by one worker in that order; only the
//! interleaving of different resources is left to the machine.
//!
//! - loss: the event is never sent;
//! - duplicate: sent again later;
//! - concurrent duplicate: sent twice at the same moment;
//! - reorder: sent out of order with a neighbour;
//! - slow acknowledgement: the first attempt's answer comes after the sender's timeout,
//!   so the sender retries a delivery that was in fact applied.
//!
//! Failed attempts (timeouts, 5xx) are retried, as every sender does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::signature as sign;

/// Fault rates, each a probability per event.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    pub concurrent_duplicate: f64,
    pub reorder: f64,
    pub slow_ack: f64,
}

/// What the sender did and what the receiver answered.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DeliveryStats {
    pub events: u64,
    pub lost: u64,
    /// HTTP requests made, retries included.
    pub requests: u64,
    pub duplicates_sent: u64,
    pub concurrent_duplicates_sent: u64,
    pub reordered: u64,
    /// Retries of deliveries whose answer came after the sender's timeout.
    pub retried_after_slow_ack: u64,
    /// Other retries (5xx, connection errors).
    pub retried_after_error: u64,
    /// The receiver's answers, by outcome (or status code when not 200).
    pub answers: BTreeMap<String, u64>,
    /// Deliveries the sender gave up on.
    pub abandoned: u64,
}

enum Planned {
    One { event: Arc<Value>, slow_ack: bool },
    Pair { event: Arc<Value> },
}

/// Longest an attempt waits for its answer.
const SENDER_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_ATTEMPTS: u32 = 5;

/// Delivers `events` (envelopes with an `id`) to `url`, signed for the hmac-sha256
/// scheme with `secret`, `concurrency` requests at a time.
pub async fn deliver(
    events: &[Value],
    url: &str,
    secret: &[u8],
    faults: Faults,
    seed: u64,
    concurrency: usize,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> DeliveryStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut stats = DeliveryStats {
        events: events.len() as u64,
        ..DeliveryStats::default()
    };
    let mut plan: Vec<Planned> = Vec::new();
    let mut later: Vec<(usize, Arc<Value>)> = Vec::new();
    for e in events {
        let event = Arc::new(e.clone());
        if rng.random_bool(faults.loss) {
            stats.lost += 1;
            continue;
        }
        if rng.random_bool(faults.concurrent_duplicate) {
            stats.concurrent_duplicates_sent += 1;
            plan.push(Planned::Pair {
                event: event.clone(),
            });
        } else {
            let slow_ack = rng.random_bool(faults.slow_ack);
            plan.push(Planned::One {
                event: event.clone(),
                slow_ack,
            });
        }
        if rng.random_bool(faults.duplicate) {
            stats.duplicates_sent += 1;
            later.push((plan.len() + rng.random_range(1..50), event));
        }
    }
    for (at, event) in later {
        let at = at.min(plan.len());
        plan.insert(
            at,
            Planned::One {
                event,
                slow_ack: false,
            },
        );
    }
    for i in 1..plan.len() {
        if rng.random_bool(faults.reorder) {
            let j = i.saturating_sub(rng.random_range(1..=5));
            plan.swap(i, j);
            stats.reordered += 1;
        }
    }
    let total = plan.len() as u64;
    // Each resource's deliveries go through one worker, in the plan's order, so what
    // reaches the receiver for one resource (reordered, duplicated, a concurrent pair)
    // is the seed's doing, not the scheduler's: the outcomes then are too.
    let workers_n = concurrency.max(1);
    let mut queues: Vec<Vec<Planned>> = (0..workers_n).map(|_| Vec::new()).collect();
    for job in plan {
        let event = match &job {
            Planned::One { event, .. } | Planned::Pair { event } => event,
        };
        let resource = event
            .pointer("/data/id")
            .or_else(|| event.get("id"))
            .map(Value::to_string)
            .unwrap_or_default();
        let shard = resource
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        queues[(shard % workers_n as u64) as usize].push(job);
    }
    let stats = Arc::new(Mutex::new(stats));
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let client = reqwest::Client::new();
    let workers: Vec<_> = queues
        .into_iter()
        .map(|jobs| {
            let (stats, client, done) = (stats.clone(), client.clone(), done.clone());
            let (url, secret) = (url.to_string(), secret.to_vec());
            tokio::spawn(async move {
                for job in jobs {
                    match job {
                        Planned::One { event, slow_ack } => {
                            attempt_until_acked(&client, &url, &secret, &event, slow_ack, &stats)
                                .await;
                        }
                        Planned::Pair { event } => {
                            let a =
                                attempt_until_acked(&client, &url, &secret, &event, false, &stats);
                            let b =
                                attempt_until_acked(&client, &url, &secret, &event, false, &stats);
                            tokio::join!(a, b);
                        }
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    let ticker = {
        let done = done.clone();
        async move {
            loop {
                let d = done.load(std::sync::atomic::Ordering::Relaxed);
                progress(d, total);
                if d >= total {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    tokio::join!(ticker, futures_all(workers));
    stats.lock().await.clone()
}

async fn futures_all(handles: Vec<tokio::task::JoinHandle<()>>) {
    for h in handles {
        let _ = h.await;
    }
}

async fn attempt_until_acked(
    client: &reqwest::Client,
    url: &str,
    secret: &[u8],
    event: &Value,
    slow_ack: bool,
    stats: &Mutex<DeliveryStats>,
) {
    let body = event.to_string();
    for attempt in 1..=MAX_ATTEMPTS {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        stats.lock().await.requests += 1;
        let result = client
            .post(url)
            .timeout(SENDER_TIMEOUT)
            .header(
                "X-Signature",
                sign::hmac_sha256(secret, ts, body.as_bytes()),
            )
            .header("X-Signature-Timestamp", ts.to_string())
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await;
        // A slow acknowledgement: the receiver applied the delivery and answered, but
        // after the sender's timeout, so the sender never saw the answer and retries.
        let answer = match result {
            Ok(_) if slow_ack && attempt == 1 => None,
            Ok(r) if r.status().is_success() => {
                let v: Value = r.json().await.unwrap_or_default();
                Some(v["outcome"].as_str().unwrap_or("unknown").to_string())
            }
            Ok(r) if r.status().is_client_error() => Some(format!("http {}", r.status().as_u16())),
            Ok(_) | Err(_) => None,
        };
        match answer {
            Some(a) => {
                *stats.lock().await.answers.entry(a).or_default() += 1;
                return;
            }
            None => {
                let mut s = stats.lock().await;
                if slow_ack && attempt == 1 {
                    s.retried_after_slow_ack += 1;
                } else {
                    s.retried_after_error += 1;
                }
                drop(s);
                // Senders back off; a short one keeps the demo quick.
                tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
            }
        }
    }
    stats.lock().await.abandoned += 1;
}

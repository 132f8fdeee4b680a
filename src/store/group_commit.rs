//! Group commit for webhook deliveries: deliveries that arrive while a transaction is
//! under way are applied together in the next one, so a burst costs a few transactions
//! (and a few fsyncs) instead of one per delivery. Nothing waits on a timer: a lone
//! delivery is written at once, in a transaction of its own.
//!
//! Each transaction still claims every event and writes its effect atomically; a
//! transaction that fails fails all its deliveries (503, the senders retry), except that
//! a failure that is not the database being gone is retried one delivery at a time, so
//! one unreadable delivery cannot fail the others.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Mutex, Notify, mpsc, oneshot};

use super::{Delivery, Outcome, apply_deliveries};
use crate::change::ResourceKey;
use crate::db::{Db, DbError};

/// Concurrent writer transactions on PostgreSQL: enough to overlap one transaction's
/// commit with the next one's statements, few enough to keep batches large.
pub const POSTGRES_WRITERS: usize = 4;
/// Most deliveries in one transaction.
const MAX_GROUP: usize = 256;
/// Deliveries waiting for a writer before new ones wait for room.
const QUEUE: usize = 4096;

struct Job {
    delivery: Delivery,
    reply: oneshot::Sender<Result<Outcome, DbError>>,
}

#[derive(Clone)]
pub(super) struct GroupCommit {
    queue: mpsc::Sender<Job>,
}

impl GroupCommit {
    /// Starts `writers` writer tasks; they stop when the last handle is dropped.
    /// `published` is woken after every commit that applied something (the change feed's
    /// pushers wait on it).
    pub fn start(db: Db, writers: usize, published: Arc<Notify>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer(db.clone(), rx.clone(), published.clone()));
        }
        Self { queue: tx }
    }

    pub async fn submit(&self, delivery: Delivery) -> Result<Outcome, DbError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job { delivery, reply })
            .await
            .map_err(|_| DbError::Task("the store is shutting down".into()))?;
        answer
            .await
            .map_err(|_| DbError::Task("the writer stopped before answering".into()))?
    }
}

async fn writer(db: Db, rx: Arc<Mutex<mpsc::Receiver<Job>>>, published: Arc<Notify>) {
    loop {
        let mut jobs = Vec::new();
        {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            jobs.push(first);
            while jobs.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
        }
        for round in rounds(jobs) {
            commit(&db, round, &published).await;
        }
    }
}

/// Splits jobs into rounds in which no event id and no resource appears twice (one
/// statement cannot claim an id or update a row twice), keeping arrival order per key.
fn rounds(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut rounds: Vec<Vec<Job>> = Vec::new();
    let mut last_round: HashMap<RoundKey, usize> = HashMap::new();
    for job in jobs {
        let keys = keys(&job.delivery);
        let round = keys
            .iter()
            .filter_map(|k| last_round.get(k).map(|r| r + 1))
            .max()
            .unwrap_or(0);
        for k in keys {
            last_round.insert(k, round);
        }
        if rounds.len() <= round {
            rounds.push(Vec::new());
        }
        rounds[round].push(job);
    }
    rounds
}

/// What one transaction may touch only once: an event id, a resource.
#[derive(PartialEq, Eq, Hash)]
enum RoundKey {
    Event(String, String),
    Resource(ResourceKey),
}

fn keys(d: &Delivery) -> Vec<RoundKey> {
    let mut keys = vec![RoundKey::Event(d.source.clone(), d.event_id.clone())];
    if let Some(key) = d.resource_key() {
        keys.push(RoundKey::Resource(key.to_owned()));
    }
    keys
}

async fn commit(db: &Db, jobs: Vec<Job>, published: &Notify) {
    let deliveries: Arc<Vec<Delivery>> =
        Arc::new(jobs.iter().map(|j| j.delivery.clone()).collect());
    let input = deliveries.clone();
    match db.write(move |conn| apply_deliveries(conn, &input)).await {
        Ok(outcomes) => {
            if outcomes.contains(&Outcome::Applied) {
                published.notify_waiters();
            }
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                let _ = job.reply.send(Ok(outcome));
            }
        }
        Err(e) if jobs.len() > 1 && !e.is_unavailable() => {
            tracing::warn!(error = %e, deliveries = jobs.len(), "group transaction failed; retrying its deliveries one by one");
            for job in jobs {
                Box::pin(commit(db, vec![job], published)).await;
            }
        }
        Err(e) => {
            let message = e.to_string();
            let unavailable = e.is_unavailable();
            let mut first = Some(e);
            for job in jobs {
                let err = first.take().unwrap_or_else(|| {
                    if unavailable {
                        DbError::Unavailable(message.clone())
                    } else {
                        DbError::Task(message.clone())
                    }
                });
                let _ = job.reply.send(Err(err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Change;
    use crate::config::Action;

    fn job(event_id: &str, resource: Option<&str>) -> Job {
        let (reply, _) = oneshot::channel();
        Job {
            delivery: Delivery {
                source: "s".into(),
                event_id: event_id.into(),
                event_type: "t".into(),
                change: resource.map(|id| Change {
                    source: "s".into(),
                    kind: "k".into(),
                    id: id.into(),
                    version: 1,
                    state: None,
                    action: Action::Upsert,
                }),
            },
            reply,
        }
    }

    fn ids(rounds: &[Vec<Job>]) -> Vec<Vec<&str>> {
        rounds
            .iter()
            .map(|r| r.iter().map(|j| j.delivery.event_id.as_str()).collect())
            .collect()
    }

    #[test]
    fn a_round_never_holds_an_event_id_or_a_resource_twice_and_order_per_key_is_kept() {
        let jobs = vec![
            job("e1", Some("r1")),
            job("e2", Some("r2")),
            job("e1", Some("r1")), // duplicate delivery
            job("e3", Some("r1")), // same resource, later event
            job("e4", None),
            job("e5", Some("r3")),
        ];
        let r = rounds(jobs);
        assert_eq!(
            ids(&r),
            vec![vec!["e1", "e2", "e4", "e5"], vec!["e1"], vec!["e3"]]
        );
    }
}

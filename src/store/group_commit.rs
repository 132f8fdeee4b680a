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

use tokio::sync::{Mutex, mpsc, oneshot};

use super::write::apply_deliveries;
use super::{Delivery, Outcome};
use crate::change::ResourceKey;
use crate::db::{Db, DbError};
use crate::feed::outbox::Outbox;

/// Concurrent writer transactions on PostgreSQL: two overlap one transaction's commit
/// with the next one's statements (which matters with a distant database), and keep
/// groups large. Measured by `benches/webhook_ingest` (2 cores, local PostgreSQL, 32
/// concurrent senders): 4 writers made groups of 4.4 and cost PostgreSQL 0.13 ms of CPU
/// a delivery; 2 made groups of 8.3 and 0.074 ms, at 1.5 times the throughput. One
/// writer makes groups of 14 and costs 8-23% less CPU a delivery (PostgreSQL's and
/// ours), but answered 3-22% fewer deliveries a second in the same runs (1,000 orders
/// reordered, 20k events): it waits for each commit before the next group starts.
pub const POSTGRES_WRITERS: usize = 2;
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
    /// `outbox` numbers each commit's changes before its deliveries are answered.
    pub fn start(db: Db, writers: usize, outbox: Outbox) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer(db.clone(), rx.clone(), outbox.clone()));
        }
        Self { queue: tx }
    }

    pub async fn submit(&self, delivery: Delivery) -> Result<Outcome, DbError> {
        let _in_flight = crate::observability::InFlightWrite::start();
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

async fn writer(db: Db, rx: Arc<Mutex<mpsc::Receiver<Job>>>, outbox: Outbox) {
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
            commit(&db, round, &outbox).await;
        }
    }
}

/// One transaction's deliveries: `jobs` are written; each of `copies` repeats the event
/// id of a job of this round (a sender's retry arriving together with the original), so
/// it is a `duplicate` exactly when this transaction commits, and costs it nothing.
#[derive(Default)]
struct Round {
    jobs: Vec<Job>,
    copies: Vec<Job>,
}

/// Splits jobs into rounds in which no event id and no resource is written twice (one
/// statement cannot claim an id or update a row twice), keeping arrival order per key.
/// A repeated event id rides along as a copy in its first delivery's round.
fn rounds(jobs: Vec<Job>) -> Vec<Round> {
    let mut rounds: Vec<Round> = Vec::new();
    let mut event_round: HashMap<(String, String), usize> = HashMap::new();
    let mut resource_round: HashMap<ResourceKey, usize> = HashMap::new();
    for job in jobs {
        let event = (job.delivery.source.clone(), job.delivery.event_id.clone());
        if let Some(&r) = event_round.get(&event) {
            rounds[r].copies.push(job);
            continue;
        }
        let resource = job.delivery.resource_key().map(|k| k.to_owned());
        let round = resource
            .as_ref()
            .and_then(|k| resource_round.get(k).map(|r| r + 1))
            .unwrap_or(0);
        event_round.insert(event, round);
        if let Some(k) = resource {
            resource_round.insert(k, round);
        }
        if rounds.len() <= round {
            rounds.resize_with(round + 1, Round::default);
        }
        rounds[round].jobs.push(job);
    }
    rounds
}

async fn commit(db: &Db, round: Round, outbox: &Outbox) {
    let Round { jobs, copies } = round;
    // How much a group saves is only known by watching it: deliveries per transaction.
    metrics::histogram!("webhook_group_commit_size").record((jobs.len() + copies.len()) as f64);
    let deliveries: Arc<Vec<Delivery>> =
        Arc::new(jobs.iter().map(|j| j.delivery.clone()).collect());
    let input = deliveries.clone();
    match db.write(move |conn| apply_deliveries(conn, &input)).await {
        Ok((outcomes, published)) => {
            // The deliveries are answered once their changes are numbered (a 200 means
            // the change is in the feed), while this writer goes on to the next group.
            let outbox = outbox.clone();
            tokio::spawn(async move {
                outbox.settle(published).await;
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    let _ = job.reply.send(Ok(outcome));
                }
                for copy in copies {
                    let _ = copy.reply.send(Ok(Outcome::Duplicate));
                }
            });
        }
        Err(e) if jobs.len() + copies.len() > 1 && !e.is_unavailable() => {
            tracing::warn!(error = %e, deliveries = jobs.len() + copies.len(), "group transaction failed; retrying its deliveries one by one");
            for job in jobs.into_iter().chain(copies) {
                let alone = Round {
                    jobs: vec![job],
                    copies: Vec::new(),
                };
                Box::pin(commit(db, alone, outbox)).await;
            }
        }
        Err(e) => {
            let errors = e.shared(jobs.len() + copies.len());
            for (job, err) in jobs.into_iter().chain(copies).zip(errors) {
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
                body_digest: None,
                fetch: None,
                settle_conflict: false,
                source: "s".into(),
                event_id: event_id.into(),
                event_type: "t".into(),
                change: resource.map(|id| Change {
                    source: "s".into(),
                    account: String::new(),
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

    fn names(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|j| j.delivery.event_id.as_str()).collect()
    }

    fn ids(rounds: &[Round]) -> Vec<(Vec<&str>, Vec<&str>)> {
        rounds
            .iter()
            .map(|r| (names(&r.jobs), names(&r.copies)))
            .collect()
    }

    #[test]
    fn a_round_never_writes_an_event_id_or_a_resource_twice_and_order_per_key_is_kept() {
        let jobs = vec![
            job("e1", Some("r1")),
            job("e2", Some("r2")),
            job("e1", Some("r1")), // a retry of e1, arriving with it
            job("e3", Some("r1")), // same resource, later event
            job("e4", None),
            job("e5", Some("r3")),
            job("e4", None), // a retry of an unmapped event
        ];
        let r = rounds(jobs);
        assert_eq!(
            ids(&r),
            vec![
                (vec!["e1", "e2", "e4", "e5"], vec!["e1", "e4"]),
                (vec!["e3"], vec![]),
            ]
        );
    }
}

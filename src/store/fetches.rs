//! Pending fetches: what a 200 (or a reconcile page) left to fetch from the sender,
//! kept in the database until the write it makes commits. Requested in the claim's
//! transaction ([`super::Delivery::fetch`], [`super::Delivery::settle_conflict`]) or by
//! the reconcile flow ([`Store::request_fetches`]); taken, fetched and written by
//! `reconcile::fetches` through [`Store::take_fetches`] and [`Store::apply_fetched`].

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::sql::fetches::{self, FetchRequest};
use super::{Store, sql};
use crate::change::tie::Guard;
use crate::change::{Change, Origin, ResourceKey};
use crate::db::{Conn, Db, DbError};
use crate::feed::outbox::{self, Outbox};

pub use super::sql::fetches::{FetchCount, FetchReason, FetchRow, TakenFetch};

/// Pending fetches per source (count, failed, oldest age), for readers that hold no
/// [`Store`] (`/metrics`, `/readyz`, `status`).
pub async fn fetch_counts(db: &crate::db::Db) -> Result<Vec<FetchCount>, DbError> {
    db.read(fetches::counts).await
}

impl Store {
    /// Wakes this process's fetcher: call after a commit that requested fetches.
    pub fn fetches_requested(&self) {
        self.fetches_due.notify_one();
    }

    /// Woken by [`Self::fetches_requested`].
    pub fn fetches_due(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.fetches_due.clone()
    }

    /// Records fetches the reconcile flow asks for (no delivery asked for them).
    pub async fn request_fetches(
        &self,
        mut keys: Vec<ResourceKey>,
        reason: FetchReason,
    ) -> Result<(), DbError> {
        if keys.is_empty() {
            return Ok(());
        }
        keys.sort();
        keys.dedup();
        self.db
            .write(move |conn| {
                let rows: Vec<FetchRequest<'_>> = keys
                    .iter()
                    .map(|k| FetchRequest {
                        key: k.as_ref(),
                        event_id: None,
                        reason,
                    })
                    .collect();
                fetches::request(conn, &rows)
            })
            .await?;
        self.fetches_requested();
        Ok(())
    }

    /// Takes at most `limit` due fetches for `holder`, for at most `hold` (see
    /// `sql::fetches::take`: one in flight per account, accounts in turn).
    pub async fn take_fetches(
        &self,
        holder: &str,
        limit: usize,
        hold: Duration,
    ) -> Result<Vec<TakenFetch>, DbError> {
        // Asked twice a second by every process: on a reader first, so an idle fetcher
        // never takes the writer (SQLite has one) from the deliveries.
        if !self.db.read(fetches::any_due).await? {
            return Ok(Vec::new());
        }
        let holder = holder.to_string();
        self.db
            .write(move |conn| fetches::take(conn, &holder, limit as i64, hold.as_secs_f64()))
            .await
    }

    /// Takes at most `limit` more due fetches of `first`'s account and kind, never
    /// attempted, to fetch with it in one request (see `take_batch_mates`).
    pub async fn take_batch_mates(
        &self,
        holder: &str,
        first: &TakenFetch,
        limit: usize,
        hold: Duration,
    ) -> Result<Vec<TakenFetch>, DbError> {
        let (holder, first) = (holder.to_string(), first.clone());
        self.db
            .write(move |conn| {
                fetches::take_batch_mates(conn, &holder, &first, limit as i64, hold.as_secs_f64())
            })
            .await
    }

    /// Writes what a fetch brought (none: the sender has nothing newer, or not the
    /// resource) through the guarded write, naming the delivery that asked, and ends
    /// the pending fetch in the same transaction. Returns whether a row was written.
    /// Fetches finishing together share one transaction (see `FetchedWrites`).
    pub async fn apply_fetched(
        &self,
        fetch: TakenFetch,
        change: Option<Change>,
        guard: Guard,
    ) -> Result<bool, DbError> {
        let (reply, answer) = oneshot::channel();
        let job = FetchedJob {
            fetch,
            change,
            guard,
            reply,
        };
        if self.fetched.tx.send(job).await.is_err() {
            return Err(DbError::Task("the fetched-writes task stopped".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(DbError::Task("the fetched-writes task stopped".into())))
    }

    /// A fetch failed: due again after `delay`, or, with `give_up`, kept as failed.
    pub async fn retry_fetch(
        &self,
        fetch: TakenFetch,
        error: String,
        delay: Duration,
        give_up: bool,
    ) -> Result<(), DbError> {
        self.db
            .write(move |conn| fetches::retry(conn, &fetch, &error, delay.as_secs_f64(), give_up))
            .await
    }

    /// Releases what `holder` took and did not finish (it stops, or its process is gone).
    pub async fn release_fetches(&self, holder: &str) -> Result<usize, DbError> {
        let holder = holder.to_string();
        self.db
            .write(move |conn| fetches::release(conn, &holder))
            .await
    }

    /// The processes holding fetches now.
    pub async fn fetch_holders(&self) -> Result<Vec<String>, DbError> {
        self.db.read(fetches::holders).await
    }

    /// Pending fetches per source (count, failed, oldest age).
    pub async fn fetch_counts(&self) -> Result<Vec<FetchCount>, DbError> {
        fetch_counts(&self.db).await
    }

    /// One resource's pending fetch (`explain`).
    pub async fn pending_fetch(&self, key: &ResourceKey) -> Result<Option<FetchRow>, DbError> {
        let key = key.clone();
        self.db.read(move |c| fetches::of_resource(c, &key)).await
    }
}

/// The most finished fetches one transaction writes.
const MAX_GROUP: usize = 64;

/// Writes what finished fetches brought: those that finish while a transaction runs
/// share the next one (each its guarded write and the end of its pending fetch), so a
/// drain of thousands of fetches pays a commit per group, not per fetch. One writer
/// task; it stops when the last handle is dropped.
#[derive(Clone)]
pub(super) struct FetchedWrites {
    tx: mpsc::Sender<FetchedJob>,
}

struct FetchedJob {
    fetch: TakenFetch,
    change: Option<Change>,
    guard: Guard,
    reply: oneshot::Sender<Result<bool, DbError>>,
}

impl FetchedWrites {
    pub(super) fn start(db: Db, outbox: Outbox) -> Self {
        let (tx, mut rx) = mpsc::channel::<FetchedJob>(4 * MAX_GROUP);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut jobs = vec![first];
                while jobs.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(job) => jobs.push(job),
                        Err(_) => break,
                    }
                }
                write_group(&db, &outbox, jobs).await;
            }
        });
        Self { tx }
    }
}

/// One transaction for the group; when it fails for a reason other than the database
/// being unavailable, each fetch is written alone, so one bad item fails only itself.
async fn write_group(db: &Db, outbox: &Outbox, mut jobs: Vec<FetchedJob>) {
    // Rows locked in key order, as every writer does: no deadlock with another.
    jobs.sort_by(|a, b| a.fetch.key().cmp(&b.fetch.key()));
    let inputs: Vec<(TakenFetch, Option<Change>, Guard)> = jobs
        .iter()
        .map(|j| (j.fetch.clone(), j.change.clone(), j.guard))
        .collect();
    let result = db
        .write(move |conn| {
            let written = write_fetched(conn, &inputs)?;
            let rows = written.iter().filter(|w| **w).count();
            let published = outbox::publish(conn, rows)?;
            Ok((written, published))
        })
        .await;
    match result {
        Ok((written, published)) => {
            outbox.settle(published).await;
            for (job, w) in jobs.into_iter().zip(written) {
                let _ = job.reply.send(Ok(w));
            }
        }
        Err(e) if jobs.len() > 1 && !e.is_unavailable() => {
            tracing::warn!(error = %e, fetches = jobs.len(), "a group of fetched writes failed; writing them one by one");
            for job in jobs {
                Box::pin(write_group(db, outbox, vec![job])).await;
            }
        }
        Err(e) => {
            let errors = e.shared(jobs.len());
            for (job, err) in jobs.into_iter().zip(errors) {
                let _ = job.reply.send(Err(err));
            }
        }
    }
}

/// The fetches' writes (none for a fetch whose sender has nothing newer) and the end of
/// their pending fetches, in the caller's transaction: one upsert per guard and origin
/// (rows in key order, as given). Returns, per fetch, whether a row was written.
fn write_fetched(
    conn: &mut Conn,
    fetched: &[(TakenFetch, Option<Change>, Guard)],
) -> diesel::QueryResult<Vec<bool>> {
    let origin_of = |f: &TakenFetch| {
        if f.event_id.is_some() {
            Origin::Webhook
        } else {
            Origin::Reconcile
        }
    };
    let mut written = std::collections::HashSet::new();
    for guard in [Guard::NewerOnly, Guard::NewerOrDifferent] {
        for origin in [Origin::Webhook, Origin::Reconcile] {
            let rows: Vec<(&Change, Option<&str>)> = fetched
                .iter()
                .filter(|(f, _, g)| *g == guard && origin_of(f) == origin)
                .filter_map(|(f, c, _)| c.as_ref().map(|c| (c, f.event_id.as_deref())))
                .collect();
            written.extend(sql::upsert_many(conn, &rows, origin, guard)?);
        }
    }
    fetched
        .iter()
        .map(|(f, c, _)| {
            let pending = fetches::finish(conn, f)?;
            let wrote = c
                .as_ref()
                .is_some_and(|c| written.contains(&c.key().to_owned()));
            if wrote && !pending {
                // Erased (or its account removed) while it ran: the write would bring
                // the erased data back. The group rolls back; alone, this fetch ends.
                return Err(diesel::result::Error::QueryBuilderError(
                    format!(
                        "the pending fetch of {}/{} {} {} was erased while it ran; its write is dropped",
                        f.source, f.account, f.kind, f.id
                    )
                    .into(),
                ));
            }
            Ok(wrote)
        })
        .collect()
}

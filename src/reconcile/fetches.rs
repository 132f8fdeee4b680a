//! The fetcher: takes due pending fetches from the database (`store`'s
//! `pending_fetches`), fetches each resource through its kind's `get` with the
//! account's client and budget, and writes it through the guarded write, ending the
//! pending fetch in that write's transaction.
//!
//! Nothing lives only here: a fetch is taken for [`HOLD`] at most, and released when
//! this process stops (SIGTERM) or found released at the next start when it died
//! (`kill -9`: its holder names a process that is gone), so the next start or another
//! replica does it. The database hands out one fetch per account at a time, accounts
//! in turn, so one busy account never delays another's fetch by more than the one it
//! has in flight.

use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Reconciler;
use super::resolve::{FetchError, Judged, NEXT_SECOND};
use crate::store::TakenFetch;

/// Fetches in flight in one process (each account has at most one).
const SLOTS: usize = 256;
/// A finished fetch refills the slots once no more than this many are in flight.
const REFILL_BELOW: usize = SLOTS / 2;
/// How often a process looks for due fetches without being woken (another replica's
/// deliveries, retries coming due).
const POLL: Duration = Duration::from_millis(500);
/// How long a taker holds a fetch: a process that stalls longer (or dies on another
/// host) loses it to another taker. Longer than a fetch's retries at the sender take.
pub const HOLD: Duration = Duration::from_secs(120);
/// Attempts before a fetch is kept as failed and its account-kind made due.
pub const MAX_ATTEMPTS: i32 = 8;
/// The first retry's delay; doubled per attempt up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(300);

/// Takes and does pending fetches for one process.
pub struct Fetcher {
    reconciler: Reconciler,
    holder: String,
}

impl Fetcher {
    pub fn new(reconciler: Reconciler) -> Self {
        Self {
            reconciler,
            holder: crate::bookkeeping::holder_id(),
        }
    }

    /// Runs until `cancel`: then takes no more, stops what it took and releases it.
    pub async fn run(self, cancel: CancellationToken) {
        self.release_gone_holders().await;
        let due = self.reconciler.store.fetches_due();
        let mut running = JoinSet::new();
        let mut take = true;
        while !cancel.is_cancelled() {
            if take {
                self.take_into(&mut running, None).await;
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = due.notified() => take = true,
                () = tokio::time::sleep(POLL) => take = true,
                Some(_) = running.join_next(), if !running.is_empty() => {
                    // Slots are refilled a batch at a time: a take reads every account's
                    // next turn, so one per finished fetch would cost that read per fetch.
                    while running.try_join_next().is_some() {}
                    take = running.len() <= REFILL_BELOW;
                }
            }
        }
        running.abort_all();
        while running.join_next().await.is_some() {}
        self.release().await;
    }

    /// The one-shot command's share: does the fetches due now (and those that come due
    /// within `within`, such as a same-second conflict's next try), then releases what
    /// it still holds. Returns how many it finished.
    pub async fn drain(self, within: Duration) -> usize {
        self.release_gone_holders().await;
        let deadline = Instant::now() + within;
        let mut running = JoinSet::new();
        let mut done = 0;
        loop {
            let taken = self.take_into(&mut running, Some(deadline)).await;
            if taken == 0 && running.is_empty() {
                // Nothing due now. When something was fetched, one more look after the
                // next second (a same-second conflict's retry), unless the deadline is
                // nearer; when nothing was, the command ends at once.
                if done == 0 || Instant::now() + NEXT_SECOND >= deadline {
                    break;
                }
                tokio::time::sleep(NEXT_SECOND).await;
                if self.take_into(&mut running, Some(deadline)).await == 0 {
                    break;
                }
            }
            match tokio::time::timeout_at(deadline.into(), running.join_next()).await {
                Ok(Some(_)) => done += 1,
                Ok(None) => {}
                Err(_) => break,
            }
        }
        running.abort_all();
        while running.join_next().await.is_some() {}
        self.release().await;
        done
    }

    /// Takes due fetches into free slots; returns how many.
    async fn take_into(&self, running: &mut JoinSet<()>, deadline: Option<Instant>) -> usize {
        let free = SLOTS.saturating_sub(running.len());
        if free == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        match self
            .reconciler
            .store
            .take_fetches(&self.holder, free, HOLD)
            .await
        {
            Ok(taken) => {
                let n = taken.len();
                for f in taken {
                    let (r, holder) = (self.reconciler.clone(), self.holder.clone());
                    running.spawn(async move { r.do_fetches(f, &holder).await });
                }
                n
            }
            Err(e) => {
                if let Some(not_logged) = crate::observability::log_line_now("fetches", "take") {
                    tracing::warn!(error = %e, not_logged, "could not take pending fetches; trying again");
                }
                0
            }
        }
    }

    /// Fetches held by a process of this host that is gone (`kill -9`) are released at
    /// once instead of waiting out their hold.
    async fn release_gone_holders(&self) {
        let store = &self.reconciler.store;
        let Ok(holders) = store.fetch_holders().await else {
            return;
        };
        for h in holders
            .iter()
            .filter(|h| crate::bookkeeping::holder_is_gone(h))
        {
            match store.release_fetches(h).await {
                Ok(n) => {
                    tracing::info!(
                        holder = h,
                        fetches = n,
                        "released the fetches of a process that is gone"
                    )
                }
                Err(e) => {
                    tracing::warn!(holder = h, error = %e, "could not release the fetches of a process that is gone")
                }
            }
        }
    }

    async fn release(&self) {
        match self.reconciler.store.release_fetches(&self.holder).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                fetches = n,
                "stopping: released the fetches in flight; the next start or another replica does them"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "stopping: could not release the fetches in flight; they are taken again when their hold expires")
            }
        }
    }
}

impl Reconciler {
    /// Does one taken fetch, and when its kind fetches many by id in one request
    /// (`get_many`) and this is its first attempt, the due fetches of its account and
    /// kind never attempted, up to the batch size: one request for them all, still one
    /// request in flight for the account. A fetch that failed is retried alone.
    async fn do_fetches(&self, f: TakenFetch, holder: &str) {
        let size = self
            .config
            .source(&f.source)
            .and_then(|s| s.kinds.iter().find(|k| k.name == f.kind))
            .and_then(|k| k.get_many.as_ref())
            .map_or(1, |m| m.size);
        if size > 1 && f.attempts == 1 {
            match self
                .store
                .take_batch_mates(holder, &f, size - 1, HOLD)
                .await
            {
                Ok(mates) if !mates.is_empty() => {
                    let mut batch = Vec::with_capacity(mates.len() + 1);
                    batch.push(f);
                    batch.extend(mates);
                    return self.do_fetch_many(batch).await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(source = f.source, error = %e, "could not take a fetch's batch mates; fetching it alone");
                }
            }
        }
        self.do_fetch(f).await;
    }

    /// Fetches a batch of one account and kind in one request, then ends each fetch
    /// as if fetched alone; one the answer left out is retried alone (through `get`).
    async fn do_fetch_many(&self, batch: Vec<TakenFetch>) {
        let ids: Vec<&str> = batch.iter().map(|f| f.id.as_str()).collect();
        let first = &batch[0];
        let judged = self
            .fetch_many_and_judge(&first.source, &first.account, &first.kind, &ids)
            .await;
        metrics::counter!("fetch_batches_total", "source" => first.source.clone()).increment(1);
        match judged {
            Err(e) => {
                futures_util::future::join_all(
                    batch
                        .into_iter()
                        .map(|f| self.settle_fetch(f, Err(e.clone()))),
                )
                .await;
            }
            Ok(mut judged) => {
                let each: Vec<_> = batch
                    .into_iter()
                    .map(|f| {
                        let j = judged.remove(&f.id).ok_or_else(|| {
                            FetchError::Transient(
                                "the get_many answer left it out; it is fetched alone next".into(),
                            )
                        });
                        (f, j)
                    })
                    .collect();
                futures_util::future::join_all(
                    each.into_iter().map(|(f, j)| self.settle_fetch(f, j)),
                )
                .await;
            }
        }
    }

    /// Does one taken fetch: fetch, judge, write and end it; or schedule its retry.
    async fn do_fetch(&self, f: TakenFetch) {
        let judged = self
            .fetch_and_judge(&f.source, &f.account, &f.kind, &f.id)
            .await;
        self.settle_fetch(f, judged).await;
    }

    /// Ends one fetch with what its fetch found: written, unchanged, or retried.
    async fn settle_fetch(&self, f: TakenFetch, judged: Result<Judged, FetchError>) {
        let source = f.source.clone();
        let (result, failure) = match judged {
            Ok(Judged::Write(change, guard)) => {
                match self
                    .store
                    .apply_fetched(f.clone(), Some(change), guard)
                    .await
                {
                    Ok(true) => ("written", None),
                    Ok(false) => ("unchanged", None),
                    Err(e) => ("failed", Some((FetchError::Transient(e.to_string()), None))),
                }
            }
            Ok(Judged::Nothing) => match self
                .store
                .apply_fetched(f.clone(), None, crate::change::tie::Guard::NewerOnly)
                .await
            {
                Ok(_) => ("unchanged", None),
                Err(e) => ("failed", Some((FetchError::Transient(e.to_string()), None))),
            },
            Ok(Judged::SameSecond) => (
                "same_second",
                Some((
                    FetchError::Transient(
                        "fetched in the second of the local row; fetched again in the next second"
                            .into(),
                    ),
                    Some(NEXT_SECOND),
                )),
            ),
            Err(e) => ("failed", Some((e, None))),
        };
        metrics::counter!("fetches_total", "source" => source, "result" => result).increment(1);
        if let Some((error, delay)) = failure {
            self.fetch_failed(f, error, delay).await;
        }
    }

    /// A failed fetch: due again after a backoff, or after its last attempt (or an
    /// error retrying cannot help) kept as failed, its account-kind made due for a full
    /// run.
    async fn fetch_failed(&self, f: TakenFetch, error: FetchError, delay: Option<Duration>) {
        let give_up = f.attempts >= MAX_ATTEMPTS
            || matches!(error, FetchError::Permanent(_) | FetchError::NoGet(_));
        let delay = delay.unwrap_or_else(|| backoff(f.attempts));
        let (source, account, kind, id, attempts) = (
            f.source.clone(),
            f.account.clone(),
            f.kind.clone(),
            f.id.clone(),
            f.attempts,
        );
        let text = error.to_string();
        if let Err(e) = self
            .store
            .retry_fetch(f, text.clone(), delay, give_up)
            .await
        {
            tracing::warn!(source, account, kind, id, error = %e, "could not record a failed fetch; it is taken again when its hold expires");
            return;
        }
        if !give_up {
            tracing::debug!(
                source,
                account,
                kind,
                id,
                attempts,
                error = text,
                ?delay,
                "fetch failed; retried later"
            );
            return;
        }
        let due = self
            .book
            .make_due(
                &crate::change::Key::new(source.as_str(), kind.as_str())
                    .in_account(account.as_str()),
            )
            .await;
        if let Some(not_logged) = crate::observability::log_line_now(&source, "fetch_gave_up") {
            let then = match due {
                Ok(true) => "its account-kind runs a full reconcile now",
                _ => "the next reconcile repairs it",
            };
            tracing::warn!(
                source,
                account,
                kind,
                id,
                attempts,
                error = text,
                not_logged,
                "fetch gave up and is kept as failed; {then}"
            );
        }
    }
}

/// The delay before attempt `attempts + 1`: doubling from [`FIRST_DELAY`], at most
/// [`MAX_DELAY`], with up to 25% jitter so many failed fetches do not retry together.
fn backoff(attempts: i32) -> Duration {
    let exp = attempts.clamp(1, 20) as u32 - 1;
    let base = FIRST_DELAY.saturating_mul(1 << exp.min(16)).min(MAX_DELAY);
    base + base.mul_f64(rand::random_range(0.0..0.25))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_second_to_five_minutes_with_a_quarter_of_jitter() {
        for (attempts, base) in [
            (1, 1),
            (2, 2),
            (3, 4),
            (8, 128),
            (9, 256),
            (10, 300),
            (40, 300),
        ] {
            let d = backoff(attempts);
            let base = Duration::from_secs(base);
            assert!(d >= base && d <= base.mul_f64(1.25), "{attempts}: {d:?}");
        }
    }
}

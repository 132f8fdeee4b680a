//! One resource fetched from the sender's current state through the kind's `get`,
//! compared with the local row and judged: what to write, if anything. Used by the
//! durable fetcher (`reconcile::fetches`: a delivery answered `fetching`, a conflict
//! from either flow) and by [`Reconciler::resolve_in`] (fetch and write now).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::{Reconciler, RunCounts, RunError, compare, item_pointers};
use crate::change::tie::Guard;
use crate::change::{Account, Change, Key};
use crate::config::{KindConfig, SourceConfig};
use crate::sender::Sender;

/// How often [`Reconciler::resolve_in`] fetches a resource versioned by fetch time
/// while the sender's clock is still in the second of the local row.
const SAME_SECOND_ATTEMPTS: u32 = 4;
/// The wait between those fetches: the sender's clock has whole seconds.
pub(super) const NEXT_SECOND: Duration = Duration::from_millis(1000);

/// What a fetch of one resource found.
#[derive(Debug)]
pub(super) enum Judged {
    /// Newer than the local row (or different at an equal version): write it.
    Write(Change, Guard),
    /// Nothing to write: the local row is as new, or the sender does not have it (its
    /// deletion is the reconcile's to detect, after a complete sweep).
    Nothing,
    /// Fetched in the second of the local row (a kind versioned by the sender's
    /// clock): ambiguous again; fetch once the sender's clock has moved on.
    SameSecond,
}

/// Why a fetch did not get an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum FetchError {
    /// The kind has no `get`: only a reconcile can repair the resource.
    #[error("kind {0} has no get endpoint; the next reconcile repairs it")]
    NoGet(String),
    /// Retrying cannot help (no such kind or `get`, an account not served, an answer
    /// that cannot be read): kept as failed at once.
    #[error("{0}")]
    Permanent(String),
    /// The sender or the database may answer later.
    #[error("{0}")]
    Transient(String),
}

impl Reconciler {
    /// Fetches one resource and writes it under the guard. `Ok(false)`: the kind has no
    /// `get`, the sender does not have it, or it changed nothing.
    pub async fn resolve(&self, source: &str, kind: &str, id: &str) -> Result<bool, String> {
        self.resolve_in(source, "", kind, id).await
    }

    /// [`Reconciler::resolve`] in `account` of a many-account source, through that
    /// account's API. Waits for the sender's next second a few times when the answer
    /// is ambiguous.
    pub async fn resolve_in(
        &self,
        source: &str,
        account: &str,
        kind: &str,
        id: &str,
    ) -> Result<bool, String> {
        for attempt in 1..=SAME_SECOND_ATTEMPTS {
            match self.fetch_and_judge(source, account, kind, id).await {
                Err(FetchError::NoGet(_)) => return Ok(false),
                Err(e) => return Err(e.to_string()),
                Ok(Judged::Nothing) => return Ok(false),
                Ok(Judged::SameSecond) if attempt < SAME_SECOND_ATTEMPTS => {
                    tokio::time::sleep(NEXT_SECOND).await;
                }
                Ok(Judged::SameSecond) => {
                    return Err(format!(
                        "GET {id}: the sender's Date is still the second of the local row after {attempt} fetches; left for the next reconcile"
                    ));
                }
                Ok(Judged::Write(change, guard)) => {
                    let written = self
                        .store
                        .apply_batch_with(vec![change], guard)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Ok(!written.is_empty());
                }
            }
        }
        Ok(false)
    }

    /// Fetches one resource through its kind's `get` with the account's client, and
    /// judges it against the local row.
    pub(super) async fn fetch_and_judge(
        &self,
        source: &str,
        account: &str,
        kind: &str,
        id: &str,
    ) -> Result<Judged, FetchError> {
        let (s, k, sender) = self.fetch_client(source, account, kind).await?;
        let fetched = sender
            .get_one(k, id)
            .await
            .map_err(|e| FetchError::Transient(e.to_string()))?;
        let Some(fetched) = fetched else {
            return Ok(Judged::Nothing);
        };
        let fetch_time = k.by_fetch_time();
        let mut change = item_pointers(k, chrono::Utc::now().timestamp_micros())
            .read(&fetched.item, &s.name, &k.name)
            .map_err(|e| FetchError::Permanent(format!("GET {id}: {e}")))?;
        change.account = account.to_string();
        if let Some(date) = fetched.date {
            change.version = date;
        }
        let local = self
            .store
            .stored_rows(
                &Key::new(source, kind).in_account(account),
                vec![change.id.clone()],
            )
            .await
            .map_err(|e| FetchError::Transient(e.to_string()))?;
        let verdicts = compare::compare_page(
            std::slice::from_ref(&change),
            &local,
            fetch_time,
            &mut RunCounts::default(),
        );
        if !verdicts.ambiguous.is_empty() {
            return Ok(Judged::SameSecond);
        }
        if verdicts.write.is_empty() {
            return Ok(Judged::Nothing);
        }
        Ok(Judged::Write(change, compare::guard_for(fetch_time)))
    }

    /// The kind's configuration and the account's client, for a fetch.
    async fn fetch_client(
        &self,
        source: &str,
        account: &str,
        kind: &str,
    ) -> Result<(&SourceConfig, &KindConfig, Sender), FetchError> {
        let Some((s, k)) = self
            .config
            .sources
            .iter()
            .filter(|s| s.name == source)
            .flat_map(|s| s.kinds.iter().map(move |k| (s, k)))
            .find(|(_, k)| k.name == kind)
        else {
            return Err(FetchError::Permanent(format!(
                "kind {source}/{kind} is no longer configured"
            )));
        };
        if k.get.is_none() {
            return Err(FetchError::NoGet(format!("{source}/{kind}")));
        }
        let sender = self
            .sender_for(source, &Account::from_stored(account))
            .await
            .map_err(|e| match e {
                RunError::Account { .. } | RunError::NoSender(_) => {
                    FetchError::Permanent(e.to_string())
                }
                e => FetchError::Transient(e.to_string()),
            })?;
        Ok((s, k, sender))
    }

    /// Fetches many resources of one account and kind in one request through the kind's
    /// `get_many`, and judges each against its local row. An id the answer leaves out
    /// (or whose item cannot be read) is absent from the result: the caller fetches it
    /// alone, through `get`, which says why. Items the sender sent but nobody asked for
    /// are dropped.
    pub(super) async fn fetch_many_and_judge(
        &self,
        source: &str,
        account: &str,
        kind: &str,
        ids: &[&str],
    ) -> Result<HashMap<String, Judged>, FetchError> {
        let (s, k, sender) = self.fetch_client(source, account, kind).await?;
        let fetched = sender
            .get_many(k, ids)
            .await
            .map_err(|e| FetchError::Transient(e.to_string()))?;
        // Each asked id taken once: an item not asked for, or sent twice, is dropped.
        let mut asked: HashSet<&str> = ids.iter().copied().collect();
        let pointers = item_pointers(k, chrono::Utc::now().timestamp_micros());
        let mut changes: Vec<Change> = Vec::with_capacity(fetched.items.len());
        for item in &fetched.items {
            let Ok(mut change) = pointers.read(item, &s.name, &k.name) else {
                continue;
            };
            if !asked.remove(change.id.as_str()) {
                continue;
            }
            change.account = account.to_string();
            if let Some(date) = fetched.date {
                change.version = date;
            }
            changes.push(change);
        }
        let local = self
            .store
            .stored_rows(
                &Key::new(source, kind).in_account(account),
                changes.iter().map(|c| c.id.clone()).collect(),
            )
            .await
            .map_err(|e| FetchError::Transient(e.to_string()))?;
        let fetch_time = k.by_fetch_time();
        let verdicts =
            compare::compare_page(&changes, &local, fetch_time, &mut RunCounts::default());
        let mut judged: HashMap<String, Judged> = HashMap::with_capacity(changes.len());
        let (write, ambiguous): (HashSet<usize>, HashSet<usize>) = (
            verdicts.write.into_iter().collect(),
            verdicts.ambiguous.into_iter().collect(),
        );
        for (i, change) in changes.into_iter().enumerate() {
            let verdict = if ambiguous.contains(&i) {
                Judged::SameSecond
            } else if write.contains(&i) {
                Judged::Write(change.clone(), compare::guard_for(fetch_time))
            } else {
                Judged::Nothing
            };
            judged.insert(change.id, verdict);
        }
        Ok(judged)
    }
}

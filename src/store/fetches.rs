//! Pending fetches: what a 200 (or a reconcile page) left to fetch from the sender,
//! kept in the database until the write it makes commits. Requested in the claim's
//! transaction ([`super::Delivery::fetch`], [`super::Delivery::settle_conflict`]) or by
//! the reconcile flow ([`Store::request_fetches`]); taken, fetched and written by
//! `reconcile::fetches` through [`Store::take_fetches`] and [`Store::apply_fetched`].

use std::time::Duration;

use super::sql::fetches::{self, FetchRequest};
use super::{Store, sql};
use crate::change::tie::Guard;
use crate::change::{Change, Origin, ResourceKey};
use crate::db::DbError;

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

    /// Writes what a fetch brought (none: the sender has nothing newer, or not the
    /// resource) through the guarded write, naming the delivery that asked, and ends
    /// the pending fetch in the same transaction. Returns whether a row was written.
    pub async fn apply_fetched(
        &self,
        fetch: TakenFetch,
        change: Option<Change>,
        guard: Guard,
    ) -> Result<bool, DbError> {
        let written = self
            .write_changes(move |conn| {
                let origin = if fetch.event_id.is_some() {
                    Origin::Webhook
                } else {
                    Origin::Reconcile
                };
                let written = match &change {
                    Some(c) => {
                        sql::upsert_many(conn, &[(c, fetch.event_id.as_deref())], origin, guard)?
                    }
                    None => Vec::new(),
                };
                fetches::finish(conn, &fetch)?;
                Ok(written)
            })
            .await?;
        Ok(!written.is_empty())
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

//! The guarded write: the one place that writes `processed_events` and `resources`
//! (and `dead_letters`, `pending_fetches`). Both flows end here — webhooks through
//! [`Store::apply_event`], reconciliation through [`Store::apply_page`], a pending fetch
//! through [`Store::apply_fetched`] — and all go through the same versioned upsert
//! (`store::sql::upsert_sql`), differing only in the tie rule ([`Guard`]). What a
//! delivery leaves to fetch is recorded in its claim's transaction (`fetches`).
//!
//! Invariant: an event's claim and its effect commit in one transaction. The database is
//! never asked "have I seen this id?" before a claim: the primary key of
//! `processed_events` decides (`webhook::recent` answers a retry of an id this process
//! claimed from memory, without a transaction).

mod fetches;
mod group_commit;
pub mod guard;
mod sql;
mod views;
mod write;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::bookkeeping::{Fence, LeaseLost, PageMark};
pub use crate::change::tie::Guard;
use crate::change::{Change, Key, ResourceKey};
use crate::config::Backend;
use crate::db::sql::MAX_IN_LIST;
use crate::db::{Conn, Db, DbError, DbTime};
use crate::feed::outbox::{self, Outbox};
pub use fetches::{FetchCount, FetchReason, FetchRow, TakenFetch, fetch_counts};
use group_commit::GroupCommit;
pub use sql::{ClaimRow, DeadLetter, DeadLetterSummary, Kept, ResourceRow, SourceCount, StoredRow};
pub use views::{ViewsError, ViewsReport};

/// A delivery to keep as a dead letter.
#[derive(Debug, Clone)]
pub struct NewDeadLetter {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub reason: String,
    pub body: String,
    pub account_hint: Option<String>,
    /// The body's SHA-256, for a sender that signs only the body: one row per body.
    pub digest: Option<String>,
}

pub use crate::change::Outcome;

/// One authentic webhook event, ready to apply.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    /// `None` when the event type is not mapped: the event is claimed as `ignored`
    /// (or as `fetching`, with `fetch`).
    pub change: Option<Change>,
    /// The resource to fetch from the sender instead of writing a state from the body
    /// (the sender does not sign the account: Shopify). The claim records `fetching`
    /// and a pending fetch in the same transaction.
    pub fetch: Option<ResourceKey>,
    /// A `conflict` (equal version, other state) is settled through the kind's `get`:
    /// recorded as a pending fetch in the claim's transaction.
    pub settle_conflict: bool,
    /// The signed body's SHA-256 (hex) for schemes that sign only the body (github,
    /// shopify): the claim covers it too, so a replay under a fresh id is a duplicate.
    pub body_digest: Option<String>,
}

impl Delivery {
    fn event_key(&self) -> (&str, &str) {
        (&self.source, &self.event_id)
    }

    fn resource_key(&self) -> Option<ResourceKey<&str>> {
        self.change.as_ref().map(Change::key)
    }
}

/// The guarded write over a database handle. Cheap to clone; must be created inside a
/// tokio runtime (it starts the group-commit writers).
#[derive(Clone)]
pub struct Store {
    db: Db,
    commits: GroupCommit,
    /// Publishes each write's changes to the feed and wakes its readers.
    outbox: Outbox,
    /// Writes what finished fetches brought, in groups.
    fetched: fetches::FetchedWrites,
    /// Woken after a commit that recorded pending fetches (this process's fetcher;
    /// other replicas poll).
    fetches_due: Arc<tokio::sync::Notify>,
}

impl Store {
    /// The database this store writes (owners of other tables on the same database are
    /// built from it).
    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn new(db: Db) -> Self {
        let writers = match db.backend() {
            // SQLite has one writer anyway.
            Backend::Sqlite => 1,
            Backend::Postgres => group_commit::POSTGRES_WRITERS,
        };
        let outbox = Outbox::new(db.clone());
        let commits = GroupCommit::start(db.clone(), writers, outbox.clone());
        let fetched = fetches::FetchedWrites::start(db.clone(), outbox.clone());
        Self {
            db,
            commits,
            fetched,
            outbox,
            fetches_due: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The change feed's outbox every write of this store publishes to: the pushers
    /// wait on it, the reconcile flow vacuums it after a run that wrote.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Runs a write that may change resources; the changes it made are recorded in its
    /// transaction, and a pass that numbers them is requested: it runs after this
    /// returns (`Outbox::request`; `Outbox::flush` waits for it).
    async fn write_changes<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Conn) -> diesel::QueryResult<T> + Send + 'static,
        T: Written + Send + 'static,
    {
        let (value, published) = self
            .db
            .write(move |conn| {
                let value = f(conn)?;
                let published = outbox::publish(conn, value.rows())?;
                Ok((value, published))
            })
            .await?;
        self.outbox.request(published);
        Ok(value)
    }

    /// Claims the event id and applies its change under the version guard, in one
    /// transaction. Deliveries arriving together share a transaction (group commit):
    /// see `group_commit`.
    pub async fn apply_event(&self, delivery: Delivery) -> Result<Outcome, DbError> {
        self.commits.submit(delivery).await
    }

    /// Applies many states in one transaction under the reconcile guard: newer
    /// versions, or equal versions whose state differs. Returns the keys written. For a
    /// repeated key only the highest version is considered.
    pub async fn apply_batch(&self, changes: Vec<Change>) -> Result<Vec<ResourceKey>, DbError> {
        self.apply_batch_with(changes, Guard::NewerOrDifferent)
            .await
    }

    /// [`Self::apply_batch`] under `guard` (a kind versioned by fetch time writes only
    /// strictly newer versions).
    pub async fn apply_batch_with(
        &self,
        changes: Vec<Change>,
        guard: Guard,
    ) -> Result<Vec<ResourceKey>, DbError> {
        self.write_changes(move |conn| write::apply_batch(conn, &changes, guard))
            .await
    }

    /// A reconcile page: [`Self::apply_batch`], the run's lease check and the run's
    /// bookkeeping for the page (`mark`), in one transaction. Returns how many rows were
    /// written, or, when the lease is no longer the run's, writes nothing.
    ///
    /// The lease check comes after the rows: it locks the lease row until the commit,
    /// and taken first it would make a run's next page wait there for this page's
    /// commit before writing anything. Taken after, the next page's rows are written
    /// while this page commits. A lost lease undoes the rows (to the savepoint).
    pub async fn apply_page(
        &self,
        changes: Arc<[Change]>,
        guard: Guard,
        mark: PageMark,
    ) -> Result<Result<usize, LeaseLost>, DbError> {
        self.write_changes(move |conn| {
            // The rows first, under a savepoint that a lost lease rolls back; an empty
            // page has nothing to undo.
            let rows = !changes.is_empty();
            let mut written = 0;
            if rows {
                crate::db::savepoint(conn)?;
                written = write::apply_batch(conn, &changes, guard)?.len();
            }
            if let Err(lost) = mark.check_and_record(conn, written)? {
                if rows {
                    crate::db::rollback_to_savepoint(conn)?;
                }
                return Ok(Err(lost));
            }
            Ok(Ok(written))
        })
        .await
    }

    /// The stored rows of `ids` of one kind (one bulk read per 1,000 ids).
    pub async fn stored_rows(
        &self,
        key: &Key,
        ids: Vec<String>,
    ) -> Result<Vec<StoredRow>, DbError> {
        self.rows_of(key, ids, None).await
    }

    /// [`Self::stored_rows`] for a listed page: when its ids are in key order (a
    /// listing sorted by id, either way) they are read as one range of the primary
    /// key, else id by id. A run shares one [`RangeReads`] across its pages: after a few
    /// ranges that held too many rows the listing is taken as not in id order and its
    /// pages are probed, so a range is tried at most [`RangeReads::TRIES`] times in vain.
    pub async fn stored_rows_of_page(
        &self,
        key: &Key,
        ids: Vec<String>,
        ranges: Arc<RangeReads>,
    ) -> Result<Vec<StoredRow>, DbError> {
        self.rows_of(key, ids, Some(ranges)).await
    }

    /// The rows of `ids`, in reads of up to 1,000 ids: probed, or with `ranges` as
    /// [`Self::stored_rows_of_page`] reads them.
    async fn rows_of(
        &self,
        key: &Key,
        ids: Vec<String>,
        ranges: Option<Arc<RangeReads>>,
    ) -> Result<Vec<StoredRow>, DbError> {
        let key = key.clone();
        self.db
            .read(move |c| {
                let mut rows = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(MAX_IN_LIST) {
                    let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    if let Some(ranges) = ranges
                        .as_ref()
                        .filter(|r| refs.len() > 1 && r.worth_trying() && sql::in_key_order(&refs))
                    {
                        if let Some(found) = sql::stored_rows_in_range(c, &key, &refs)? {
                            ranges.read.fetch_add(1, Ordering::Relaxed);
                            rows.extend(found);
                            continue;
                        }
                        ranges.in_vain.fetch_add(1, Ordering::Relaxed);
                    }
                    rows.extend(sql::stored_rows(c, &key, &refs)?);
                }
                Ok(rows)
            })
            .await
    }

    /// [`Self::stored_rows`] with each row's state (the demo's comparison with the
    /// sender).
    pub async fn stored_rows_with_states(
        &self,
        key: &Key,
        ids: Vec<String>,
    ) -> Result<Vec<StoredRow>, DbError> {
        let key = key.clone();
        self.db
            .read(move |c| {
                let mut rows = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(MAX_IN_LIST) {
                    let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    rows.extend(sql::stored_rows_with_states(c, &key, &refs)?);
                }
                Ok(rows)
            })
            .await
    }

    /// Dead letters kept, per source.
    pub async fn dead_letter_counts(&self) -> Result<Vec<SourceCount>, DbError> {
        self.db.read(sql::dead_letter_counts).await
    }

    /// Deletes at most `limit` claims of `source` older than `age` (one bounded batch
    /// through the time index); returns how many.
    pub async fn prune_events(
        &self,
        source: &str,
        age: std::time::Duration,
        limit: i64,
    ) -> Result<usize, DbError> {
        let s = source.to_string();
        self.db
            .write(move |c| sql::prune_events(c, &s, age.as_secs_f64(), limit))
            .await
    }

    /// Gives up the claim of an event whose effect (outside the claim's transaction:
    /// a lifecycle event's change of the registry) failed, so that the sender's retry,
    /// answered 503, claims and makes it again; whether it was there.
    pub async fn release_claim(&self, source: &str, event_id: &str) -> Result<bool, DbError> {
        let (s, e) = (source.to_string(), event_id.to_string());
        self.db.write(move |c| sql::release_claim(c, &s, &e)).await
    }

    /// Deletes at most `limit` dead letters last seen more than `age` ago.
    pub async fn prune_dead_letters(
        &self,
        age: std::time::Duration,
        limit: i64,
    ) -> Result<usize, DbError> {
        self.db
            .write(move |c| sql::prune_dead_letters(c, age.as_secs_f64(), limit))
            .await
    }

    /// How many live rows a kind has.
    pub async fn count_live(&self, key: &Key) -> Result<i64, DbError> {
        let key = key.clone();
        self.db.read(move |c| sql::count_live(c, &key)).await
    }

    /// Live ids of a kind last written before `before`, in id order after `after`, at
    /// most `limit` (the keyset scan of deletion detection).
    pub async fn live_ids_before(
        &self,
        key: &Key,
        before: DbTime,
        after: String,
        limit: i64,
    ) -> Result<Vec<String>, DbError> {
        let key = key.clone();
        self.db
            .read(move |c| sql::live_ids_before(c, &key, before, &after, limit))
            .await
    }

    /// Keeps an authentic delivery that could not be read, with the reason: once (a
    /// repeat adds an attempt, its body stays), and only while the source's kept bodies
    /// stay within `max_bytes`.
    pub async fn dead_letter(
        &self,
        letter: NewDeadLetter,
        max_bytes: u64,
    ) -> Result<Kept, DbError> {
        let max = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        self.db
            .write(move |conn| {
                sql::record_dead_letter(
                    conn,
                    &letter.source,
                    &letter.event_id,
                    &letter.event_type,
                    &letter.reason,
                    &letter.body,
                    letter.account_hint.as_deref(),
                    letter.digest.as_deref(),
                    max,
                )
            })
            .await
    }

    /// Dead letters without their bodies, oldest first (of `source`), at most `limit`.
    pub async fn dead_letter_summaries(
        &self,
        source: Option<String>,
        limit: i64,
    ) -> Result<Vec<DeadLetterSummary>, DbError> {
        self.db
            .read(move |c| sql::dead_letter_summaries(c, source.as_deref(), limit))
            .await
    }

    /// The dead letters with `ids` (of `source`), with their bodies.
    pub async fn dead_letters_with_ids(
        &self,
        source: Option<String>,
        ids: Vec<String>,
    ) -> Result<Vec<DeadLetter>, DbError> {
        let limit = i64::try_from(ids.len())
            .unwrap_or(i64::MAX)
            .saturating_mul(4);
        self.db
            .read(move |c| sql::dead_letters(c, source.as_deref(), sql::Which::Ids(&ids), limit))
            .await
    }

    /// A page of dead letters with their bodies (of `source`), by source and event id,
    /// after `after`.
    pub async fn dead_letters_after(
        &self,
        source: Option<String>,
        after: Option<(String, String)>,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, DbError> {
        self.db
            .read(move |c| {
                let after = after.as_ref().map(|(s, e)| (s.as_str(), e.as_str()));
                sql::dead_letters(c, source.as_deref(), sql::Which::After(after), limit)
            })
            .await
    }

    /// The accounts holding a resource of `source`'s `kind` with `id` (`explain` without
    /// an account), at most `limit`.
    pub async fn accounts_with(
        &self,
        source: &str,
        kind: &str,
        id: &str,
        limit: i64,
    ) -> Result<Vec<String>, DbError> {
        let (s, k, i) = (source.to_string(), kind.to_string(), id.to_string());
        self.db
            .read(move |c| sql::accounts_with(c, &s, &k, &i, limit))
            .await
    }

    /// One resource's row with its bookkeeping columns (`explain`).
    pub async fn resource_row(&self, key: &ResourceKey) -> Result<Option<ResourceRow>, DbError> {
        let key = key.clone();
        self.db.read(move |c| sql::resource_row(c, &key)).await
    }

    /// The claims that named one resource, oldest first (`explain`).
    pub async fn claims_of(&self, key: &ResourceKey, limit: i64) -> Result<Vec<ClaimRow>, DbError> {
        let key = key.clone();
        self.db.read(move |c| sql::claims_of(c, &key, limit)).await
    }

    /// Deletes a dead letter (applied at last, or discarded); whether it was there.
    pub async fn delete_dead_letter(&self, source: &str, event_id: &str) -> Result<bool, DbError> {
        let (s, e) = (source.to_string(), event_id.to_string());
        self.db
            .write(move |c| sql::delete_dead_letter(c, &s, &e))
            .await
    }
}

impl Store {
    /// Marks deleted the live rows of `ids` not written since `before` (deletion
    /// detection after a complete sweep). Returns how many were marked.
    pub async fn tombstone(
        &self,
        key: &Key,
        ids: Vec<String>,
        before: DbTime,
        fence: Fence,
    ) -> Result<Result<usize, LeaseLost>, DbError> {
        let key = key.clone();
        self.write_changes(move |conn| {
            if let Err(lost) = fence.check(conn)? {
                return Ok(Err(lost));
            }
            let mut n = 0;
            for chunk in ids.chunks(MAX_IN_LIST) {
                let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                n += sql::tombstone(conn, &key, &refs, before)?;
            }
            Ok(Ok(n))
        })
        .await
    }
}

/// Event types whose claims retention never prunes: the lifecycle and erasure events
/// (SPEC "Erasure that cannot be replayed or forged"). Their bodies are the same every
/// time for an account, so a claim pruned would let a captured body act again. A
/// constant list, written into the prune's text (no value from a row or a request).
pub const NEVER_PRUNED: &[&str] = &[
    "app/uninstalled",
    "shop/redact",
    "customers/redact",
    "customers/data_request",
    "installation",
    "installation_repositories",
    "account.application.authorized",
    "account.application.deauthorized",
];

impl Store {
    /// Marks deleted every live row of `account` of `source` (the account was removed):
    /// each becomes a change in the feed. Its pending fetches go. Returns how many rows.
    pub async fn tombstone_account(&self, source: &str, account: &str) -> Result<usize, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        let n = self
            .write_changes(move |conn| {
                let n = sql::tombstone_account(conn, &s, &a, false)?;
                sql::fetches::forget_account(conn, &s, &a)?;
                Ok(n)
            })
            .await?;
        // An operator's command (`accounts remove`) exits after this: its tombstones are
        // in the feed by then, not at another process's next pass.
        if let Err(e) = self.outbox.flush().await {
            tracing::warn!(error = %e, "could not number the account's tombstones; they are kept and the next pass of any process numbers them");
        }
        Ok(n)
    }

    /// Erases `account` of `source` (its data must go), in one transaction: each live row
    /// becomes a change `deleted: true` without state (`origin = "erasure"`), so every
    /// consumer learns what to erase; its rows, pending fetches and the dead letters kept
    /// for it are deleted; last, the states of the account's changes still kept are
    /// blanked (seqs stay). Returns how many rows were deleted.
    pub async fn purge_account(&self, source: &str, account: &str) -> Result<usize, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        let (rows, published) = self
            .db
            .write(move |conn| {
                let erased = sql::tombstone_account(conn, &s, &a, true)?;
                let rows = sql::purge_account(conn, &s, &a)?;
                sql::fetches::forget_account(conn, &s, &a)?;
                sql::forget_dead_letters_of_account(conn, &s, &a)?;
                // After the rows are locked and gone: a writer that committed a change
                // of the account before this transaction took its rows is blanked too.
                outbox::erase_account_states(conn, &s, &a)?;
                outbox::label_erasure(conn)?;
                // Last, as in every write of `resources`.
                let published = outbox::publish(conn, erased)?;
                Ok((rows, published))
            })
            .await?;
        self.outbox.settle(published).await;
        Ok(rows)
    }

    /// Erases named resources of one account (a customer's redaction), in one
    /// transaction, as [`Self::purge_account`] erases an account: the states of their
    /// kept changes blanked, each live row a change `deleted: true` without state
    /// (`origin = "erasure"`), then the rows and their pending fetches deleted.
    /// `targets` is (kind, ids). Returns how many rows were deleted.
    pub async fn erase_resources(
        &self,
        source: &str,
        account: &str,
        targets: Vec<(String, Vec<String>)>,
    ) -> Result<usize, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        let (rows, published) = self
            .db
            .write(move |conn| {
                let (mut erased, mut rows) = (0, 0);
                for (kind, ids) in &targets {
                    for chunk in ids.chunks(MAX_IN_LIST) {
                        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                        let (changed, deleted) = sql::erase_rows(conn, &s, &a, kind, &refs)?;
                        sql::fetches::forget_resources(conn, &s, &a, kind, &refs)?;
                        // After the rows are locked and gone, as for an account.
                        outbox::erase_resource_states(conn, &s, &a, kind, &refs)?;
                        erased += changed;
                        rows += deleted;
                    }
                }
                outbox::label_erasure(conn)?;
                let published = outbox::publish(conn, erased)?;
                Ok((rows, published))
            })
            .await?;
        self.outbox.settle(published).await;
        Ok(rows)
    }
}

/// How many resource rows a write touched: a write that touched none has no change to
/// publish.
trait Written {
    fn rows(&self) -> usize;
}

impl Written for usize {
    fn rows(&self) -> usize {
        *self
    }
}

impl Written for Vec<ResourceKey> {
    fn rows(&self) -> usize {
        self.len()
    }
}

impl Written for Result<usize, LeaseLost> {
    fn rows(&self) -> usize {
        self.as_ref().map_or(0, |n| *n)
    }
}

/// How one run's pages were read by [`Store::stored_rows_of_page`]: how many as a key
/// range, and how many ranges held too many rows to use.
#[derive(Debug, Default)]
pub struct RangeReads {
    read: AtomicU32,
    in_vain: AtomicU32,
}

impl RangeReads {
    /// Ranges tried in vain before a run stops trying them: a listing in id order
    /// that skips many local rows costs at most this many wasted range reads.
    pub const TRIES: u32 = 3;

    fn worth_trying(&self) -> bool {
        self.in_vain.load(Ordering::Relaxed) < Self::TRIES
    }

    /// Pages (of up to 1,000 ids) read as a key range.
    pub fn read(&self) -> u32 {
        self.read.load(Ordering::Relaxed)
    }

    /// Ranges that held too many rows (those pages were then probed id by id).
    pub fn in_vain(&self) -> u32 {
        self.in_vain.load(Ordering::Relaxed)
    }
}

/// The product's claim and guarded-upsert statements, for the benchmarks' baseline
/// (`benches/webhook_ingest` runs the same SQL without the product around it). Not an
/// API: nothing but the benchmarks may run SQL on the store's tables.
#[doc(hidden)]
pub mod baseline {
    use crate::change::tie::Guard;
    use crate::config::Backend;

    pub fn claim_sql(rows: usize) -> String {
        super::sql::claim_sql(rows)
    }

    pub fn upsert_sql(backend: Backend, rows: usize, guard: Guard, returning: bool) -> String {
        super::sql::upsert_sql(backend, rows, guard, returning)
    }

    /// [`super::Store::apply_batch`]'s transaction without the change feed's part after
    /// it: nothing published, no pass awaited (`benches/feed_commits` runs it with the
    /// `resources` trigger disabled). Returns how many resource rows were written.
    pub async fn apply_batch_without_feed(
        db: &crate::db::Db,
        changes: Vec<crate::change::Change>,
    ) -> Result<usize, crate::db::DbError> {
        db.write(move |conn| {
            super::write::apply_batch(conn, &changes, Guard::NewerOrDifferent).map(|k| k.len())
        })
        .await
    }
}

//! The reconcile flow for one kind: tick -> list pages -> compare -> guarded write.
//!
//! A run never learns why it runs (schedule, command, start-up): it takes the kind's
//! lease, plans where to start (`plan`), pages through the sender's listing and per
//! page does one bulk read of the local rows, a pure compare and one transaction
//! writing what differs together with the page's bookkeeping (`sweep`), then after a
//! complete full sweep detects deletions (`deletes`). `resolve` fetches single
//! resources and judges them; `fetches` does the pending fetches a 200 or a page left
//! in the database (a delivery answered `fetching`, a conflict to settle).
//!
//! The flow talks to `bookkeeping` (lease, run record, checkpoint, watermark), `store`
//! (the rows; its outbox is vacuumed after a run that wrote) and, for catch-up's
//! events, `ingest`; it runs no SQL and holds no database handle.
//!
//! Invariant: reconciliation writes resources only through `store` (the same guard as
//! webhooks), and never overwrites a row that is newer locally. A run that cannot
//! finish is `failed`, never `succeeded`.

mod catchup;
pub mod compare;
mod deletes;
pub mod fetches;
mod plan;
mod progress;
mod resolve;
mod run;
pub mod schedule;
mod stages;
mod sweep;
mod write_order;

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::{Bookkeeping, LeaseLost};
pub use crate::bookkeeping::{Mode, RunCounts};
use crate::change::{Account, Pointers};
use crate::config::{Action, Config, KindConfig, SourceConfig};
use crate::db::DbError;
use crate::ingest::Ingest;
use crate::sender::{Sender, SenderError};
use crate::store::Store;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum RunStatus {
    Succeeded,
    Failed {
        error: String,
    },
    /// Another process holds the lease: it is reconciling this kind now.
    Skipped {
        lease_holder: String,
        /// When that lease expires unless its holder renews it (RFC 3339, UTC).
        lease_expires_at: String,
    },
    /// An operator paused the kind (`reconcile pause`): nothing was requested or written.
    Paused,
}

/// What one run of one kind did.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub source: String,
    /// The account of a many-account source (absent for a single-account one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub account: String,
    pub kind: String,
    #[serde(flatten)]
    pub status: RunStatus,
    pub dry_run: bool,
    pub mode: Mode,
    pub resumed: bool,
    pub counts: RunCounts,
    pub seconds: f64,
    /// Dry run: the first ids that would be written.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_change: Vec<String>,
    /// Dry run: the first ids deletion detection would tombstone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_tombstone: Vec<String>,
    /// The first listed items that were skipped: URL, index, id and reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Where the run's time went, stage by stage.
    pub stages: StageSeconds,
    /// The run's end was recorded in its account-kind's schedule row, with its run
    /// record (`Bookkeeping::finish_and_release`).
    #[serde(skip)]
    pub due_recorded: bool,
}

/// Seconds each stage of a sweep was busy. The stages overlap (the fetcher, the reader
/// and the writer run side by side), so they add up to more than the run's time; the
/// writer's waiting is the time it had nothing to write (fetch or read behind).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StageSeconds {
    /// Requests to the sender, until the whole page was received (retries included).
    pub fetch: f64,
    /// The page's JSON into items.
    pub parse_page: f64,
    /// Items into changes (ids, versions, states, digests).
    pub read_items: f64,
    /// The local rows of a page's ids.
    pub local_read: f64,
    /// Reads of local rows (of up to 1,000 ids) done as one range of the primary key,
    /// for pages listed in id order (`store::Store::stored_rows_of_page`); a count,
    /// not seconds.
    pub local_read_ranges: u32,
    /// Listed against local, page by page.
    pub compare: f64,
    /// The drift's guarded write with the page's bookkeeping, commit included.
    pub write: f64,
    /// The writer waiting for the next read page.
    pub writer_waiting: f64,
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Write nothing; report what would change (and what would be tombstoned).
    pub dry_run: bool,
    /// Wait for another process's lease instead of skipping the kind.
    pub wait: bool,
    /// Let deletion detection tombstone more than the kind's `max_delete_fraction`.
    pub allow_mass_delete: bool,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Sender(#[from] SenderError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("stopped by shutdown after {pages} pages; the next run resumes from there")]
    Stopped { pages: i64 },
    #[error(
        "{0} (this process stalled longer than lease_ttl and another process took the kind over); \
         nothing more was written by this run"
    )]
    LeaseLost(#[from] LeaseLost),
    #[error(
        "no progress at {at}: {why}; the run stops here and does not save that position. \
         The sender's pagination is stuck; the next run starts again"
    )]
    NoProgress { at: String, why: &'static str },
    #[error(
        "this complete sweep would tombstone {would} of {live} live rows of {sender}/{kind}, more than \
         max_delete_fraction ({fraction}); nothing was tombstoned. If the sender really deleted them, list them with \
         `webhook-reconciler reconcile --source {sender} --kind {kind} --dry-run`, then run \
         `webhook-reconciler reconcile --source {sender} --kind {kind} --allow-mass-delete`"
    )]
    MassDelete {
        /// The source's name (`source` would be taken for the error's cause).
        sender: String,
        kind: String,
        would: usize,
        live: usize,
        fraction: f64,
    },
    #[error(
        "{count} listed item(s) could not be read or stored and were skipped (first: {first}); \
         the rest of the run was applied and its position saved, so the next run goes past them. \
         Fix the kind's pointers if the listing changed shape, or report the item to the sender"
    )]
    SkippedItems { count: i64, first: String },
    #[error("a reconcile page task failed: {0}")]
    FetchTask(String),
    #[error("no sender for source {0}")]
    NoSender(String),
    #[error("account {account:?}: {why}")]
    Account { account: String, why: String },
}

/// Reconciles the kinds of the configured sources.
#[derive(Clone)]
pub struct Reconciler {
    config: Arc<Config>,
    store: Store,
    book: Bookkeeping,
    /// The accounts of many-account sources: which a run covers, and how to reach each.
    registry: crate::accounts::Accounts,
    senders: Arc<Vec<Sender>>,
    /// Per source: the ingest step (mapping, claim, guarded write, dead letter) that
    /// webhooks go through too, for catch-up events.
    ingests: Arc<Vec<Ingest>>,
}

impl Reconciler {
    /// A reconciler writing rows through `store` and its records through `book`.
    pub fn new(config: Arc<Config>, store: Store, book: Bookkeeping) -> anyhow::Result<Self> {
        let senders = config
            .sources
            .iter()
            .map(Sender::new)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ingests = config
            .sources
            .iter()
            .map(|s| Ingest::new(s, store.clone()))
            .collect();
        Ok(Self {
            config,
            registry: crate::accounts::Accounts::new(store.db().clone()),
            store,
            book,
            senders: Arc::new(senders),
            ingests: Arc::new(ingests),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The (source, kind) pairs that have a list endpoint, filtered by name; a source's
    /// catch-up is one of them (its listing is `Listing::Events`, its name
    /// `config::CATCHUP_KIND`).
    pub fn kinds(
        &self,
        source: Option<&str>,
        kind: Option<&str>,
    ) -> Vec<(&SourceConfig, &KindConfig)> {
        self.config
            .sources
            .iter()
            .filter(|s| source.is_none_or(|n| n == s.name))
            .flat_map(|s| s.reconciled_kinds().map(move |k| (s, k)))
            .filter(|(_, k)| kind.is_none_or(|n| n == k.name))
            .collect()
    }

    /// The accounts a run of `source` covers: its own (see
    /// [`SourceConfig::reconciles_own_account`]), then its enabled registered accounts.
    pub async fn accounts_of(&self, source: &SourceConfig) -> Result<Vec<Account>, DbError> {
        let mut out = Vec::new();
        if source.reconciles_own_account() {
            out.push(Account::Own);
        }
        if source.accounts.is_some() {
            out.extend(
                self.registry
                    .list(Some(&source.name))
                    .await?
                    .into_iter()
                    .filter(|a| a.enabled)
                    .map(|a| Account::Named(a.account)),
            );
        }
        Ok(out)
    }

    /// The bookkeeping runs, leases and pauses are kept in.
    pub fn book(&self) -> &Bookkeeping {
        &self.book
    }

    fn sender(&self, source: &str) -> Option<&Sender> {
        self.senders.iter().find(|s| s.source() == source)
    }

    /// The client for `account` of `source`: the source's own, or a named account's
    /// base URL, credential and budget from the registry. An account whose credential
    /// cannot be opened fails its own runs, nobody else's.
    async fn sender_for(&self, source: &str, account: &Account) -> Result<Sender, RunError> {
        let sender = self
            .sender(source)
            .ok_or_else(|| RunError::NoSender(source.to_string()))?;
        let Account::Named(account) = account else {
            return Ok(sender.clone());
        };
        let fail = |why: String| RunError::Account {
            account: account.to_string(),
            why,
        };
        let access = self
            .registry
            .access(source, account, self.config.account_keys())
            .await
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail("not registered (accounts add)".into()))?;
        if !access.enabled {
            return Err(fail("disabled (accounts enable)".into()));
        }
        sender
            .for_account(account, access.api_base, access.credential)
            .map_err(RunError::from)
    }

    /// Runs one kind to the end (or to `cancel`, between pages). `progress` is called
    /// after every page with the counts so far.
    pub async fn run_kind(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        opts: &RunOptions,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> KindReport {
        self.run_account_kind(source, kind, &Account::Own, opts, cancel, progress)
            .await
    }

    /// [`Reconciler::run_kind`] for one account of a many-account source, under that
    /// account-kind's own lease, with the account's client.
    pub async fn run_account_kind(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        account: &Account,
        opts: &RunOptions,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> KindReport {
        let span = tracing::info_span!(
            "reconcile",
            source = source.name,
            account = account.stored(),
            kind = kind.name,
            dry_run = opts.dry_run
        );
        let run = async {
            let started = Instant::now();
            let mut report = KindReport {
                source: source.name.clone(),
                account: account.stored().to_string(),
                kind: kind.name.clone(),
                status: RunStatus::Succeeded,
                dry_run: opts.dry_run,
                mode: Mode::Full,
                resumed: false,
                counts: RunCounts::default(),
                seconds: 0.0,
                would_change: Vec::new(),
                would_tombstone: Vec::new(),
                skipped: Vec::new(),
                stages: StageSeconds::default(),
                due_recorded: false,
            };
            let run = run::Run {
                source,
                account,
                kind,
                opts,
                report: &mut report,
                cancel,
                progress,
            };
            let result = match self.book.is_paused(&source.name, &kind.name).await {
                Ok(true) => {
                    run.report.status = RunStatus::Paused;
                    Ok(())
                }
                Ok(false) if opts.dry_run => self.dry_run(run).await,
                Ok(false) => self.leased_run(run).await,
                Err(e) => Err(RunError::from(e)),
            };
            if let Err(e) = result {
                report.status = RunStatus::Failed {
                    error: e.to_string(),
                };
            }
            // A run that failed before its run record (its account's credential, the
            // database) ends its schedule row here; one with a record ended it in the
            // record's commit. Scheduled or one-shot alike, so `status` shows both.
            if let (RunStatus::Failed { error }, false, false) =
                (&report.status, opts.dry_run, report.due_recorded)
            {
                let key = crate::change::Key {
                    account: account.clone(),
                    ..crate::change::Key::new(source.name.as_str(), kind.name.as_str())
                };
                if let Err(e) = self
                    .book
                    .finish_due(
                        &key,
                        crate::bookkeeping::DueStatus::Failed,
                        Some(error.clone()),
                    )
                    .await
                {
                    tracing::debug!(error = %e, "could not record a failed run in its schedule row");
                }
            }
            // Inside the run's time: it is work the run's writes made.
            if report.counts.applied + report.counts.tombstoned > 0 && !opts.dry_run {
                self.store.outbox().vacuum().await;
            }
            report.seconds = started.elapsed().as_secs_f64();
            let recorded = match &report.status {
                RunStatus::Succeeded => Some("succeeded"),
                RunStatus::Failed { .. } => Some("failed"),
                RunStatus::Skipped { .. } | RunStatus::Paused => None,
            };
            if let (Some(status), false) = (recorded, opts.dry_run) {
                crate::observability::record_run(
                    &source.name,
                    &kind.name,
                    status,
                    &report.counts,
                    started.elapsed(),
                );
            }
            match &report.status {
                RunStatus::Succeeded => {
                    tracing::info!(source = source.name, kind = kind.name, dry_run = opts.dry_run, counts = ?report.counts, seconds = report.seconds, "reconcile run succeeded")
                }
                RunStatus::Failed { error } => {
                    tracing::error!(source = source.name, kind = kind.name, error, counts = ?report.counts, "reconcile run failed; pages already applied stay applied")
                }
                RunStatus::Paused => tracing::info!(
                    source = source.name,
                    kind = kind.name,
                    "reconcile run not started: the kind is paused (`reconcile resume` ends it)"
                ),
                RunStatus::Skipped {
                    lease_holder,
                    lease_expires_at,
                } => tracing::info!(
                    source = source.name,
                    kind = kind.name,
                    lease_holder,
                    lease_expires_at,
                    "reconcile run skipped: another process holds the lease"
                ),
            }
            report
        };
        tracing::Instrument::instrument(run, span).await
    }
}

/// How a list item of `kind` reads as a change at `now_micros`.
fn item_pointers(kind: &KindConfig, now_micros: i64) -> Pointers<'_> {
    Pointers {
        id: &kind.id,
        version: kind.version.as_deref(),
        state: Some(&kind.state),
        version_format: kind.version_format,
        action: Action::Upsert,
        max_state_bytes: kind.max_state_bytes,
        latest_version: kind.latest_version(now_micros),
    }
}

//! The reconcile flow for one kind: tick -> list pages -> compare -> guarded write.
//!
//! A run never learns why it runs (schedule, command, start-up): it takes the kind's
//! lease, pages through the sender's listing, and per page does one bulk read of the
//! local rows, a pure compare, and one batched guarded write of what differs — one
//! transaction per page, so a failed run keeps the pages it applied. A run that cannot
//! finish is `failed`, never `succeeded`; an unfinished sweep resumes from its last
//! committed page while the sender's cursor still works.
//!
//! Invariant: reconciliation writes resources only through `store` (the same guard as
//! webhooks), and never overwrites a row that is newer locally.

pub mod compare;
pub mod schedule;

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::change::{Change, Pointers};
use crate::config::{Action, Config, KindConfig, SourceConfig};
use crate::db::DbError;
use crate::db::sql::{self, RunCounts};
use crate::sender::{Next, Sender, SenderError};
use crate::store::Store;

/// How many ids a dry run lists as examples.
const DRY_RUN_EXAMPLES: usize = 10;
/// Ids per page of the local scan of deletion detection.
const DELETE_SCAN_PAGE: i64 = 1000;

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
    },
}

/// What one run of one kind did.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub source: String,
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
}

/// What a run lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Everything.
    Full,
    /// What changed since the watermark.
    Incremental,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Full => "full",
            Mode::Incremental => "incremental",
        }
    }
}

/// Where a run starts.
struct Plan {
    mode: Mode,
    at: Option<Next>,
    /// The database's clock when the sweep began (of the original run, if resumed).
    sweep_started: String,
    resumed: bool,
    /// Incremental: the filter value.
    since: Option<String>,
}

/// An incremental run's filter value: `micros` as the sender's timestamp format.
fn format_since(micros: i64, format: crate::config::VersionFormat) -> String {
    match format {
        crate::config::VersionFormat::Unix => (micros.div_euclid(1_000_000)).to_string(),
        _ => chrono::DateTime::from_timestamp_micros(micros)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            .unwrap_or_default(),
    }
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub dry_run: bool,
}

/// Reconciles the kinds of the configured sources.
#[derive(Clone)]
pub struct Reconciler {
    config: Arc<Config>,
    store: Store,
    senders: Arc<Vec<Sender>>,
    holder: String,
}

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Sender(#[from] SenderError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("{0}")]
    Other(String),
}

impl Reconciler {
    pub fn new(config: Arc<Config>, store: Store) -> anyhow::Result<Self> {
        let senders = config
            .sources
            .iter()
            .map(Sender::new)
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            config,
            store,
            senders: Arc::new(senders),
            holder: holder_id(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The (source, kind) pairs that have a list endpoint, filtered by name.
    pub fn kinds(
        &self,
        source: Option<&str>,
        kind: Option<&str>,
    ) -> Vec<(&SourceConfig, &KindConfig)> {
        self.config
            .sources
            .iter()
            .filter(|s| source.is_none_or(|n| n == s.name))
            .flat_map(|s| s.kinds.iter().map(move |k| (s, k)))
            .filter(|(_, k)| kind.is_none_or(|n| n == k.name))
            .filter(|(_, k)| k.list.is_some())
            .collect()
    }

    fn sender(&self, source: &str) -> Option<&Sender> {
        self.senders.iter().find(|s| s.source() == source)
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
        let span = tracing::info_span!(
            "reconcile",
            source = source.name,
            kind = kind.name,
            dry_run = opts.dry_run
        );
        tracing::Instrument::instrument(
            self.run_kind_inner(source, kind, opts, cancel, progress),
            span,
        )
        .await
    }

    async fn run_kind_inner(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        opts: &RunOptions,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> KindReport {
        let started = Instant::now();
        let mut report = KindReport {
            source: source.name.clone(),
            kind: kind.name.clone(),
            status: RunStatus::Succeeded,
            dry_run: opts.dry_run,
            mode: Mode::Full,
            resumed: false,
            counts: RunCounts::default(),
            seconds: 0.0,
            would_change: Vec::new(),
        };
        let result = if opts.dry_run {
            match self.plan(source, kind, true).await {
                Ok(plan) => {
                    self.sweep(source, kind, plan, None, &mut report, cancel, progress)
                        .await
                }
                Err(e) => Err(e),
            }
        } else {
            self.leased_run(source, kind, &mut report, cancel, progress)
                .await
        };
        if let Err(e) = result {
            report.status = RunStatus::Failed {
                error: e.to_string(),
            };
        }
        report.seconds = started.elapsed().as_secs_f64();
        match &report.status {
            RunStatus::Succeeded if !opts.dry_run => crate::observability::record_run(
                &source.name,
                &kind.name,
                "succeeded",
                &report.counts,
                started.elapsed(),
            ),
            RunStatus::Failed { .. } if !opts.dry_run => crate::observability::record_run(
                &source.name,
                &kind.name,
                "failed",
                &report.counts,
                started.elapsed(),
            ),
            _ => {}
        }
        match &report.status {
            RunStatus::Succeeded => {
                tracing::info!(source = source.name, kind = kind.name, dry_run = opts.dry_run, counts = ?report.counts, seconds = report.seconds, "reconcile run succeeded")
            }
            RunStatus::Failed { error } => {
                tracing::error!(source = source.name, kind = kind.name, error, counts = ?report.counts, "reconcile run failed; pages already applied stay applied")
            }
            RunStatus::Skipped { lease_holder } => tracing::info!(
                source = source.name,
                kind = kind.name,
                lease_holder,
                "reconcile run skipped: another process holds the lease"
            ),
        }
        report
    }

    async fn leased_run(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        report: &mut KindReport,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> Result<(), RunError> {
        let (s, k, me) = (source.name.clone(), kind.name.clone(), self.holder.clone());
        let ttl = source.reconcile.lease_ttl.as_secs_f64();
        let holder = self
            .store
            .db()
            .write(move |c| sql::acquire_lease(c, &s, &k, &me, ttl))
            .await?;
        if holder != self.holder {
            report.status = RunStatus::Skipped {
                lease_holder: holder,
            };
            return Ok(());
        }
        let result = self
            .planned_run(source, kind, report, cancel, progress)
            .await;
        let (s, k, me) = (source.name.clone(), kind.name.clone(), self.holder.clone());
        // Best effort: if the database is gone the lease expires by itself.
        if let Err(e) = self
            .store
            .db()
            .write(move |c| sql::release_lease(c, &s, &k, &me))
            .await
        {
            tracing::warn!(error = %e, "could not release the reconcile lease");
        }
        result
    }

    async fn planned_run(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        report: &mut KindReport,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> Result<(), RunError> {
        let plan = self.plan(source, kind, false).await?;
        let (s, k, mode) = (source.name.clone(), kind.name.clone(), plan.mode.as_str());
        let run_id = self
            .store
            .db()
            .write(move |c| sql::start_run(c, &s, &k, mode))
            .await?;
        let mut result = self
            .sweep(source, kind, plan, Some(run_id), report, cancel, progress)
            .await;
        // A resume point the sender no longer accepts (an expired cursor) must not
        // wedge the kind: start the sweep over from the first page, in this same run.
        if let Err(RunError::Sender(
            e @ (SenderError::Refused { .. } | SenderError::BadPage { .. }),
        )) = &result
        {
            if report.resumed && report.counts.pages == 0 {
                tracing::warn!(source = source.name, kind = kind.name, error = %e, "the sender refused the resume point; starting the sweep over");
                let (s, k) = (source.name.clone(), kind.name.clone());
                self.store
                    .db()
                    .write(move |c| sql::set_checkpoint(c, &s, &k, None))
                    .await?;
                let plan = self.plan(source, kind, false).await?;
                result = self
                    .sweep(source, kind, plan, Some(run_id), report, cancel, progress)
                    .await;
            }
        }
        let (status, error) = match &result {
            Ok(()) => ("succeeded", None),
            Err(e) => ("failed", Some(e.to_string())),
        };
        let counts = report.counts;
        // Best effort: if the database is gone, the run stays `running` and the next
        // run of the kind marks it abandoned.
        let end = self
            .store
            .db()
            .write(move |c| sql::update_run(c, run_id, status, &counts, error.as_deref()))
            .await;
        if let Err(e) = end {
            tracing::warn!(error = %e, "could not record the end of the reconcile run");
        }
        result
    }

    /// Pages through the listing; `run_id` is `None` for a dry run (which writes
    /// nothing, not even its run).
    /// Decides what this run lists: a full sweep (resumed from a checkpoint when one
    /// is left), or, for an incremental kind whose full sweep is not due, what changed
    /// since the watermark minus the overlap.
    async fn plan(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        dry_run: bool,
    ) -> Result<Plan, RunError> {
        let (s, k) = (source.name.clone(), kind.name.clone());
        let full_every = kind
            .incremental
            .as_ref()
            .map_or(0.0, |i| i.full_every.as_secs_f64());
        let (checkpoint, state, now) = self
            .store
            .db()
            .read(move |c| {
                Ok((
                    sql::checkpoint(c, &s, &k)?,
                    sql::sweep_state(c, &s, &k, full_every)?,
                    sql::db_now(c)?,
                ))
            })
            .await?;
        if let (Some(inc), false, Some(watermark)) =
            (&kind.incremental, state.full_due, state.watermark)
        {
            let overlap = i64::try_from(inc.overlap.as_micros()).unwrap_or(i64::MAX);
            return Ok(Plan {
                mode: Mode::Incremental,
                at: None,
                sweep_started: now,
                resumed: false,
                since: Some(format_since(watermark.saturating_sub(overlap), inc.format)),
            });
        }
        // Resume an unfinished sweep where it stopped; its start still bounds deletion
        // detection, but a resumed sweep did not see the earlier pages, so it detects
        // no deletions. A dry run always starts from the beginning.
        let resume = checkpoint
            .as_ref()
            .and_then(|c| Next::decode(&c.position).map(|n| (n, c.sweep_started_at.clone())))
            .filter(|_| !dry_run);
        Ok(match resume {
            Some((next, started)) => Plan {
                mode: Mode::Full,
                at: Some(next),
                sweep_started: started,
                resumed: true,
                since: None,
            },
            None => Plan {
                mode: Mode::Full,
                at: None,
                sweep_started: now,
                resumed: false,
                since: None,
            },
        })
    }

    /// Pages through the listing as planned; `run_id` is `None` for a dry run (which
    /// writes nothing, not even its run).
    #[allow(clippy::too_many_arguments)] // the run's context, passed down once
    async fn sweep(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        plan: Plan,
        run_id: Option<i64>,
        report: &mut KindReport,
        cancel: &CancellationToken,
        progress: &(dyn Fn(&RunCounts) + Send + Sync),
    ) -> Result<(), RunError> {
        let sender = self
            .sender(&source.name)
            .ok_or_else(|| RunError::Other(format!("no sender for source {}", source.name)))?;
        let db = self.store.db().clone();
        let Plan {
            mode,
            mut at,
            sweep_started,
            resumed,
            since,
        } = plan;
        report.resumed = resumed;
        report.mode = mode;
        let detect = kind.detect_deletes && mode == Mode::Full && !resumed && run_id.is_some();
        let mut seen = SeenIds::default();
        let mut watermark: Option<i64> = None;
        let pointers = item_pointers(kind);
        let filter: Option<(String, String)> = match (&kind.incremental, since) {
            (Some(inc), Some(since)) => Some((inc.param.clone(), since)),
            _ => None,
        };
        // The next page is fetched while the current one is compared and written, so
        // the sender's latency and our database work overlap; two pages at most are in
        // memory.
        let fetch = |at: Option<Next>| {
            let (sender, kind, filter) = (sender.clone(), kind.clone(), filter.clone());
            AbortOnDropHandle::new(tokio::spawn(async move {
                let f = filter.as_ref().map(|(p, v)| (p.as_str(), v.as_str()));
                sender.list_page(&kind, at.as_ref(), f).await
            }))
        };
        let mut pending = Some(fetch(at.clone()));
        loop {
            if cancel.is_cancelled() {
                return Err(RunError::Other(format!(
                    "stopped by shutdown after {} pages; the next run resumes from there",
                    report.counts.pages
                )));
            }
            if run_id.is_some() {
                self.renew_lease(source, kind).await?;
            }
            let Some(fetching) = pending.take() else {
                break;
            };
            let page = fetching
                .await
                .map_err(|e| RunError::Other(format!("page fetch task: {e}")))??;
            if page.next.is_some() {
                pending = Some(fetch(page.next.clone()));
            }
            let bad = |i: usize, e: crate::change::ExtractError| {
                RunError::Sender(SenderError::BadPage {
                    url: page.url.clone(),
                    reason: format!("item {i}: {e}"),
                })
            };
            let mut changes: Vec<Change> = Vec::with_capacity(page.items.len());
            for (i, item) in page.items.iter().enumerate() {
                changes.push(
                    pointers
                        .read(item, &source.name, &kind.name)
                        .map_err(|e| bad(i, e))?,
                );
                if let Some(inc) = &kind.incremental {
                    let t = crate::change::read_version(item, &inc.field, inc.format)
                        .map_err(|e| bad(i, e))?;
                    watermark = Some(watermark.map_or(t, |w| w.max(t)));
                }
            }
            drop(page.items);
            if detect {
                for c in &changes {
                    seen.insert(&c.id);
                }
            }
            self.apply_page(source, kind, changes, run_id.is_none(), report)
                .await?;
            report.counts.pages += 1;
            progress(&report.counts);
            at = page.next;
            if let Some(run_id) = run_id {
                let (s, k, counts) = (source.name.clone(), kind.name.clone(), report.counts);
                // Only full sweeps are worth resuming; an incremental run restarts from
                // its watermark.
                let position = at.as_ref().filter(|_| mode == Mode::Full).map(Next::encode);
                let started = sweep_started.clone();
                db.write(move |c| {
                    sql::set_checkpoint(
                        c,
                        &s,
                        &k,
                        position.as_deref().map(|p| (p, started.as_str())),
                    )?;
                    sql::update_run(c, run_id, "running", &counts, None)
                })
                .await?;
            }
            if at.is_none() {
                break;
            }
        }
        if detect {
            report.counts.tombstoned = self
                .detect_deletes(source, kind, &seen, &sweep_started)
                .await? as i64;
        }
        if run_id.is_some() && kind.incremental.is_some() {
            let (s, k) = (source.name.clone(), kind.name.clone());
            let full_started = (mode == Mode::Full).then_some(sweep_started);
            db.write(move |c| sql::save_sweep_state(c, &s, &k, watermark, full_started.as_deref()))
                .await?;
        }
        Ok(())
    }

    async fn apply_page(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        changes: Vec<Change>,
        dry_run: bool,
        report: &mut KindReport,
    ) -> Result<(), RunError> {
        let ids: Vec<String> = changes.iter().map(|c| c.id.clone()).collect();
        let (s, k) = (source.name.clone(), kind.name.clone());
        let local = self
            .store
            .db()
            .read(move |c| {
                let mut rows = Vec::with_capacity(ids.len());
                for chunk in ids.chunks(sql::MAX_IN_LIST) {
                    let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    rows.extend(sql::local_rows(c, &s, &k, &refs)?);
                }
                Ok(rows)
            })
            .await?;
        let write = compare::compare_page(&changes, &local, &mut report.counts);
        if write.is_empty() {
            return Ok(());
        }
        if dry_run {
            report.counts.applied += write.len() as i64;
            for i in write {
                if report.would_change.len() < DRY_RUN_EXAMPLES {
                    report.would_change.push(changes[i].id.clone());
                }
            }
            return Ok(());
        }
        let mut changes = changes;
        let batch: Vec<Change> = write
            .into_iter()
            .rev()
            .map(|i| changes.swap_remove(i))
            .collect();
        let written = self.store.apply_batch(batch).await?;
        report.counts.applied += written.len() as i64;
        Ok(())
    }

    async fn renew_lease(&self, source: &SourceConfig, kind: &KindConfig) -> Result<(), RunError> {
        let (s, k, me) = (source.name.clone(), kind.name.clone(), self.holder.clone());
        let ttl = source.reconcile.lease_ttl.as_secs_f64();
        let ours = self
            .store
            .db()
            .write(move |c| sql::renew_lease(c, &s, &k, &me, ttl))
            .await?;
        if ours {
            Ok(())
        } else {
            Err(RunError::Other(
                "lost the lease (this process stalled longer than its lease); another replica took over".into(),
            ))
        }
    }

    /// After a complete sweep: live rows not seen and not written since the sweep began
    /// are gone at the sender.
    async fn detect_deletes(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        seen: &SeenIds,
        sweep_started: &str,
    ) -> Result<usize, RunError> {
        let mut after = String::new();
        let mut total = 0;
        loop {
            let (s, k, b, a) = (
                source.name.clone(),
                kind.name.clone(),
                sweep_started.to_string(),
                after.clone(),
            );
            let ids = self
                .store
                .db()
                .read(move |c| sql::live_ids_before(c, &s, &k, &b, &a, DELETE_SCAN_PAGE))
                .await?;
            let Some(last) = ids.last().cloned() else {
                break;
            };
            let gone: Vec<String> = ids.into_iter().filter(|id| !seen.contains(id)).collect();
            if !gone.is_empty() {
                total += self
                    .store
                    .tombstone(
                        source.name.clone(),
                        kind.name.clone(),
                        gone,
                        sweep_started.to_string(),
                    )
                    .await?;
            }
            after = last;
        }
        Ok(total)
    }

    /// Fetches one resource from the sender and applies it (conflict resolution).
    pub async fn resolve(&self, source: &str, kind: &str, id: &str) -> Result<bool, String> {
        let Some((s, k)) = self
            .config
            .sources
            .iter()
            .filter(|s| s.name == source)
            .flat_map(|s| s.kinds.iter().map(move |k| (s, k)))
            .find(|(_, k)| k.name == kind)
        else {
            return Err(format!("unknown kind {source}/{kind}"));
        };
        if k.get.is_none() {
            return Ok(false);
        }
        let sender = self.sender(source).ok_or("no sender")?;
        let Some(item) = sender.get_one(k, id).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        let change = item_pointers(k)
            .read(&item, &s.name, &k.name)
            .map_err(|e| format!("GET {id}: {e}"))?;
        let written = self
            .store
            .apply_batch(vec![change])
            .await
            .map_err(|e| e.to_string())?;
        Ok(!written.is_empty())
    }
}

/// How a list item of `kind` reads as a change.
fn item_pointers(kind: &KindConfig) -> Pointers<'_> {
    Pointers {
        id: &kind.id,
        version: kind.version.as_deref(),
        state: Some(&kind.state),
        version_format: kind.version_format,
        action: Action::Upsert,
    }
}

/// The ids seen by a sweep, as 64-bit hashes: 8 bytes an item whatever the id's length.
/// A collision can only make a deleted row look seen, which keeps it (the safe side).
#[derive(Default)]
struct SeenIds {
    hashes: HashSet<u64>,
    state: std::collections::hash_map::RandomState,
}

impl SeenIds {
    fn hash(&self, id: &str) -> u64 {
        self.state.hash_one(id)
    }

    fn insert(&mut self, id: &str) {
        let h = self.hash(id);
        self.hashes.insert(h);
    }

    fn contains(&self, id: &str) -> bool {
        self.hashes.contains(&self.hash(id))
    }
}

fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

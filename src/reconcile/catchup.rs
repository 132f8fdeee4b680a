//! Catch-up from the sender's events API: a page of listed events goes through the
//! same ingest step as authentic deliveries — mapping, claim and guarded write
//! (`crate::ingest`) — so an event that also arrived by webhook is a `duplicate`, and
//! an old one is `stale`.
//!
//! The run around it is a kind's (`sweep`): lease, run record, incremental listing
//! filtered by `since_param` from the watermark (`plan::plan_catchup`), progress guard,
//! metrics. Counts of a catch-up run: `applied` events written, `equal` duplicates and
//! unmapped types, `newer_local` stale events, `differing` conflicts (each settled
//! through the kind's `get`).

use serde_json::Value;
use tokio::task::JoinSet;

use super::progress::ProgressGuard;
use super::run::Run;
use super::{Reconciler, RunError};
use crate::bookkeeping::RunId;
use crate::change::Outcome;
use crate::ingest::Refusal;
use crate::ingest::envelope::{self, HeaderIds};
use crate::sender::SenderError;
use crate::store::Guard;

impl Reconciler {
    /// A page of events (catch-up): each through the ingest step.
    pub(super) async fn events_page(
        &self,
        run: &mut Run<'_>,
        guard: &mut ProgressGuard,
        page: crate::sender::Page,
        run_id: Option<RunId>,
        watermark: &mut Option<i64>,
    ) -> Result<(), RunError> {
        let events =
            serde_json::from_str::<Vec<serde_json::Value>>(page.items.get()).map_err(|e| {
                SenderError::BadPage {
                    url: page.url.clone(),
                    reason: format!("an event is not JSON: {e}"),
                }
            })?;
        let ids = events.iter().filter_map(|i| i.get("id")?.as_str());
        guard.same_items_as_before(&page.url, ids)?;
        self.catchup_page(run, &page.url, events, run_id, watermark)
            .await
    }

    /// Applies one page of listed events and records it (counts, fenced on the lease).
    /// `watermark` is raised to the newest event time seen. A dry run (`run_id` None)
    /// only reads the page: without claiming an event its outcome is unknown.
    async fn catchup_page(
        &self,
        run: &mut Run<'_>,
        url: &str,
        items: Vec<Value>,
        run_id: Option<RunId>,
        watermark: &mut Option<i64>,
    ) -> Result<(), RunError> {
        let source = run.source.name.clone();
        let ingest = self
            .ingests
            .iter()
            .find(|i| i.source() == source)
            .cloned()
            .ok_or_else(|| RunError::NoSender(source.clone()))?;
        let inc = run.kind.incremental.clone();
        run.report.counts.scanned += items.len() as i64;
        let mut events = JoinSet::new();
        for (index, item) in items.into_iter().enumerate() {
            if let Some(inc) = &inc {
                match crate::change::read_version(&item, &inc.field, inc.format) {
                    Ok(t) => *watermark = Some(watermark.map_or(t, |w| w.max(t))),
                    Err(e) => {
                        run.skip(url, index, None, &e.to_string());
                        continue;
                    }
                }
            }
            let body = item.to_string();
            let env = match envelope::from_value(item, HeaderIds::default()) {
                Ok(env) => env,
                Err(e) => {
                    run.skip(url, index, None, &format!("not an event: {e}"));
                    continue;
                }
            };
            if run_id.is_none() {
                continue;
            }
            // All at once: deliveries waiting together share one transaction (the
            // store's group commit), as a burst of webhooks does.
            let ingest = ingest.clone();
            events.spawn(async move {
                let id = env.id.clone();
                (index, id, ingest.event(env, body.as_bytes(), None).await)
            });
        }
        let mut failure = None;
        while let Some(joined) = events.join_next().await {
            let (index, event_id, result) =
                joined.map_err(|e| RunError::FetchTask(e.to_string()))?;
            let counts = &mut run.report.counts;
            match result {
                Ok((Outcome::Applied, _)) => counts.applied += 1,
                Ok((Outcome::Duplicate | Outcome::Ignored | Outcome::Fetching, _)) => {
                    counts.equal += 1
                }
                Ok((Outcome::Stale, _)) => counts.newer_local += 1,
                // Its settling through `get` was recorded with its claim.
                Ok((Outcome::Conflict, _)) => counts.differing += 1,
                Err(Refusal::Unavailable(e)) => failure = Some(e),
                Err(e) => run.skip(url, index, Some(&event_id), &e.to_string()),
            }
        }
        if let Some(e) = failure {
            return Err(e.into());
        }
        run.report.counts.pages += 1;
        let Some(run_id) = run_id else {
            return Ok(());
        };
        let fence = self.book.fence(&run.key(), run.source.reconcile.lease_ttl);
        let mark = self.book.page_mark(run_id, fence, None, run.report.counts);
        self.store
            .apply_page(std::sync::Arc::new([]), Guard::NewerOnly, mark)
            .await??;
        Ok(())
    }
}

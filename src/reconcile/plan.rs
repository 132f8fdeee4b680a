//! Where a run starts: a full sweep (resumed from the kind's checkpoint when one is
//! left), or, for an incremental kind whose full sweep is not due, what changed since
//! the watermark minus the overlap.

use std::time::Duration;

use super::{Mode, Reconciler, RunError};
use crate::change::Key;
use crate::config::{CatchupConfig, KindConfig, Listing, SourceConfig, VersionFormat};
use crate::db::DbTime;
use crate::sender::Next;

/// Where a run starts.
pub(super) struct Plan {
    pub mode: Mode,
    pub at: Option<Next>,
    /// The database's clock when the sweep began (of the original run, if resumed).
    pub sweep_started: DbTime,
    pub resumed: bool,
    /// Incremental: the filter value.
    pub since: Option<String>,
}

impl Reconciler {
    /// Decides what this run lists. A dry run always starts from the beginning.
    pub(super) async fn plan(
        &self,
        source: &SourceConfig,
        kind: &KindConfig,
        key: &Key,
        dry_run: bool,
    ) -> Result<Plan, RunError> {
        if let (Some(catchup), Listing::Events) = (&source.catchup, kind.listing) {
            return self.plan_catchup(key, catchup).await;
        }
        let full_every = kind
            .incremental
            .as_ref()
            .map_or(Duration::ZERO, |i| i.full_every);
        let position = self.book.sweep_position(key, full_every).await?;
        let now = position.now;
        if let (Some(inc), false, Some(watermark)) = (
            &kind.incremental,
            position.state.full_due,
            position.state.watermark,
        ) {
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
        // no deletions.
        let resume = position
            .checkpoint
            .as_ref()
            .and_then(|c| Next::decode(&c.position).map(|n| (n, c.sweep_started_at)))
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
}

impl Reconciler {
    /// Catch-up lists the events created since the watermark minus the overlap, never
    /// further back than the sender keeps them (`window`): the whole window the first
    /// time, and after a stop longer than the window.
    async fn plan_catchup(&self, key: &Key, catchup: &CatchupConfig) -> Result<Plan, RunError> {
        let position = self.book.sweep_position(key, Duration::ZERO).await?;
        let now = position.now;
        let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
        let oldest = now
            .0
            .timestamp_micros()
            .saturating_sub(micros(catchup.window));
        let since = position.state.watermark.map_or(oldest, |w| {
            w.saturating_sub(micros(catchup.overlap)).max(oldest)
        });
        Ok(Plan {
            mode: Mode::Incremental,
            at: None,
            sweep_started: now,
            resumed: false,
            since: Some(format_since(since, catchup.format)),
        })
    }
}

/// An incremental run's filter value: `micros` as the sender's timestamp format.
fn format_since(micros: i64, format: VersionFormat) -> String {
    match format {
        VersionFormat::Unix => (micros.div_euclid(1_000_000)).to_string(),
        _ => chrono::DateTime::from_timestamp_micros(micros)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            .unwrap_or_default(),
    }
}

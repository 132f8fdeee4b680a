//! Where a run starts: a full sweep (resumed from the kind's checkpoint when one is
//! left), or, for an incremental kind whose full sweep is not due, what changed since
//! the watermark minus the overlap.

use std::time::Duration;

use super::{Mode, Reconciler, RunError};
use crate::config::{KindConfig, SourceConfig, VersionFormat};
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
        dry_run: bool,
    ) -> Result<Plan, RunError> {
        let full_every = kind
            .incremental
            .as_ref()
            .map_or(Duration::ZERO, |i| i.full_every);
        let position = self
            .book
            .sweep_position(&source.name, &kind.name, full_every)
            .await?;
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

/// An incremental run's filter value: `micros` as the sender's timestamp format.
fn format_since(micros: i64, format: VersionFormat) -> String {
    match format {
        VersionFormat::Unix => (micros.div_euclid(1_000_000)).to_string(),
        _ => chrono::DateTime::from_timestamp_micros(micros)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            .unwrap_or_default(),
    }
}

//! Dead letters: listed, retried through the ingest step after a fix, discarded.

use serde::Serialize;

use super::{OpError, Operations};
use crate::ingest::Refusal;
use crate::store::DeadLetter;

/// Most dead letters one list, retry or discard reads at once.
const BATCH: i64 = 500;
/// Most dead letters one `--all` covers (run it again for more).
const MAX_ALL: i64 = 100_000;

/// Which dead letters an operation is for.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub all: bool,
    pub source: Option<String>,
}

/// What became of one retried (or discarded) dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct Retried {
    pub source: String,
    pub event_id: String,
    /// `applied`, `duplicate`, `stale`, `conflict`, `ignored`, `fetching`; `failed` (kept,
    /// with the new reason); `discarded`; `not_found`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Operations {
    /// Dead letters, oldest first (of `source`), at most `limit`.
    pub async fn dead_letters(
        &self,
        source: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, OpError> {
        if let Some(s) = source {
            self.check_source(s)?;
        }
        Ok(self
            .store
            .dead_letters(source.map(String::from), None, limit)
            .await?)
    }

    /// The selected dead letters, each named once by (source, event id); an id kept for
    /// two sources without `source` is refused; an id not kept is reported `not_found`.
    async fn selected(&self, sel: &Selection) -> Result<(Vec<DeadLetter>, Vec<Retried>), OpError> {
        if let Some(s) = &sel.source {
            self.check_source(s)?;
        }
        if sel.all {
            let letters = self
                .store
                .dead_letters(sel.source.clone(), None, MAX_ALL)
                .await?;
            return Ok((letters, Vec::new()));
        }
        if sel.ids.is_empty() {
            return Err(OpError::NothingSelected);
        }
        let mut ids = sel.ids.clone();
        ids.sort();
        ids.dedup();
        let mut letters = Vec::new();
        for chunk in ids.chunks(BATCH as usize) {
            letters.extend(
                self.store
                    .dead_letters(sel.source.clone(), Some(chunk.to_vec()), BATCH * 4)
                    .await?,
            );
        }
        let mut missing = Vec::new();
        for id in &ids {
            let sources: Vec<&str> = letters
                .iter()
                .filter(|l| &l.event_id == id)
                .map(|l| l.source.as_str())
                .collect();
            match sources.len() {
                0 => missing.push(Retried {
                    source: sel.source.clone().unwrap_or_default(),
                    event_id: id.clone(),
                    outcome: "not_found".into(),
                    reason: None,
                }),
                1 => {}
                _ => {
                    return Err(OpError::Ambiguous {
                        event_id: id.clone(),
                        sources: sources.join(", "),
                    });
                }
            }
        }
        Ok((letters, missing))
    }

    /// Runs each selected dead letter again through mapping, claim and guarded write (no
    /// second signature check: it was authenticated when it arrived). One that now goes
    /// through leaves the list with its outcome; one that fails again stays, with the
    /// new reason and one more attempt.
    pub async fn retry_dead_letters(&self, sel: &Selection) -> Result<Vec<Retried>, OpError> {
        let (letters, mut out) = self.selected(sel).await?;
        for letter in letters {
            let Some(ingest) = self.ingests.get(&letter.source) else {
                out.push(Retried {
                    outcome: "failed".into(),
                    reason: Some(format!(
                        "source {:?} is no longer configured; kept",
                        letter.source
                    )),
                    source: letter.source,
                    event_id: letter.event_id,
                });
                continue;
            };
            match ingest.replay(&letter).await {
                Ok(outcome) => {
                    self.store
                        .delete_dead_letter(&letter.source, &letter.event_id)
                        .await?;
                    tracing::info!(
                        source = letter.source,
                        event_id = letter.event_id,
                        outcome = outcome.as_str(),
                        "dead letter retried"
                    );
                    out.push(Retried {
                        source: letter.source,
                        event_id: letter.event_id,
                        outcome: outcome.as_str().to_string(),
                        reason: None,
                    });
                }
                Err(Refusal::Unprocessable { reason, .. }) => out.push(Retried {
                    source: letter.source,
                    event_id: letter.event_id,
                    outcome: "failed".into(),
                    reason: Some(reason),
                }),
                Err(Refusal::Unavailable(e)) => return Err(OpError::Db(e)),
            }
        }
        Ok(out)
    }

    /// Deletes the selected dead letters without applying them.
    pub async fn discard_dead_letters(&self, sel: &Selection) -> Result<Vec<Retried>, OpError> {
        let (letters, mut out) = self.selected(sel).await?;
        for letter in letters {
            let gone = self
                .store
                .delete_dead_letter(&letter.source, &letter.event_id)
                .await?;
            out.push(Retried {
                source: letter.source,
                event_id: letter.event_id,
                outcome: if gone { "discarded" } else { "not_found" }.into(),
                reason: None,
            });
        }
        Ok(out)
    }
}

//! Dead letters: listed, retried through the ingest step after a fix, discarded.

use serde::Serialize;

use super::{OpError, Operations};
use crate::ingest::Refusal;
use crate::store::{DeadLetter, DeadLetterSummary};

/// Most dead letters (with their bodies) one retry or discard reads at once.
const BATCH: i64 = 100;
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

/// The selected dead letters, a page at a time (bodies of one page in memory at once).
struct Pages<'a> {
    sel: &'a Selection,
    /// `--all`: the last (source, event id) read; ids: how many chunks were read.
    after: Option<(String, String)>,
    chunk: usize,
    read: i64,
    done: bool,
}

impl Operations {
    /// Dead letters without their bodies, oldest first (of `source`), at most `limit`.
    pub async fn dead_letters(
        &self,
        source: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadLetterSummary>, OpError> {
        if let Some(s) = source {
            self.check_source(s)?;
        }
        Ok(self
            .store
            .dead_letter_summaries(source.map(String::from), limit)
            .await?)
    }

    fn pages<'a>(&self, sel: &'a Selection) -> Result<Pages<'a>, OpError> {
        if let Some(s) = &sel.source {
            self.check_source(s)?;
        }
        if !sel.all && sel.ids.is_empty() {
            return Err(OpError::NothingSelected);
        }
        Ok(Pages {
            sel,
            after: None,
            chunk: 0,
            read: 0,
            done: false,
        })
    }

    /// The next page of selected dead letters, each named once by (source, event id),
    /// and the ids of it that are not kept (`not_found`); `None` at the end. An id kept
    /// for two sources without `source` is refused.
    async fn next_page(
        &self,
        pages: &mut Pages<'_>,
    ) -> Result<Option<(Vec<DeadLetter>, Vec<Retried>)>, OpError> {
        if pages.done {
            return Ok(None);
        }
        let sel = pages.sel;
        if sel.all {
            let page = self
                .store
                .dead_letters_after(sel.source.clone(), pages.after.clone(), BATCH)
                .await?;
            pages.read += page.len() as i64;
            pages.done = (page.len() as i64) < BATCH || pages.read >= MAX_ALL;
            pages.after = page.last().map(|l| (l.source.clone(), l.event_id.clone()));
            return Ok((!page.is_empty()).then_some((page, Vec::new())));
        }
        let mut ids = sel.ids.clone();
        ids.sort();
        ids.dedup();
        let Some(chunk) = ids.chunks(BATCH as usize).nth(pages.chunk) else {
            pages.done = true;
            return Ok(None);
        };
        pages.chunk += 1;
        let letters = self
            .store
            .dead_letters_with_ids(sel.source.clone(), chunk.to_vec())
            .await?;
        let mut missing = Vec::new();
        for id in chunk {
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
        Ok(Some((letters, missing)))
    }

    /// Runs each selected dead letter again through mapping, claim and guarded write (no
    /// second signature check: it was authenticated when it arrived). One that now goes
    /// through leaves the list with its outcome; one that fails again stays, with the
    /// new reason and one more attempt.
    pub async fn retry_dead_letters(&self, sel: &Selection) -> Result<Vec<Retried>, OpError> {
        let mut pages = self.pages(sel)?;
        let mut out = Vec::new();
        while let Some((letters, missing)) = self.next_page(&mut pages).await? {
            out.extend(missing);
            self.retry_page(letters, &mut out).await?;
        }
        Ok(out)
    }

    async fn retry_page(
        &self,
        letters: Vec<DeadLetter>,
        out: &mut Vec<Retried>,
    ) -> Result<(), OpError> {
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
                Err(e @ Refusal::DeadLettersFull { .. }) => out.push(Retried {
                    source: letter.source,
                    event_id: letter.event_id,
                    outcome: "failed".into(),
                    reason: Some(e.to_string()),
                }),
                Err(Refusal::Unavailable(e)) => return Err(OpError::Db(e)),
            }
        }
        Ok(())
    }

    /// Deletes the selected dead letters without applying them.
    pub async fn discard_dead_letters(&self, sel: &Selection) -> Result<Vec<Retried>, OpError> {
        let mut pages = self.pages(sel)?;
        let mut out = Vec::new();
        while let Some((letters, missing)) = self.next_page(&mut pages).await? {
            out.extend(missing);
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
        }
        Ok(out)
    }
}

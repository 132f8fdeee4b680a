//! What an operator paused (`reconcile_paused`): one kind of a source, or all of it,
//! honoured by every replica's schedule and by the one-shot command.

use super::{Bookkeeping, PausedRow, sql};
use crate::change::PauseKey;
use crate::db::DbError;

impl Bookkeeping {
    /// Pauses or resumes reconciling one kind or every kind of a source, for every
    /// replica and the one-shot command; whether anything changed.
    pub async fn set_paused(&self, key: &PauseKey, paused: bool) -> Result<bool, DbError> {
        let (s, k) = (key.source.clone(), key.kinds.stored().to_string());
        self.db
            .write(move |c| sql::set_reconcile_paused(c, &s, &k, paused))
            .await
    }

    /// Whether `kind` of `source` is paused (by itself or with its source).
    pub async fn is_paused(&self, source: &str, kind: &str) -> Result<bool, DbError> {
        let (s, k) = (source.to_string(), kind.to_string());
        self.db
            .read(move |c| sql::reconcile_paused(c, &s, &k))
            .await
    }

    /// Every pause in force.
    pub async fn pauses(&self) -> Result<Vec<PausedRow>, DbError> {
        self.db.read(sql::paused_rows).await
    }
}

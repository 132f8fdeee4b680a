//! What an operator does by hand after a week in production, one implementation for the
//! command line and the admin API: dead letters retried or discarded, one resource
//! explained, consumers listed, rewound, paused and resumed, kinds paused and resumed,
//! accounts added, listed, switched and removed (`accounts`).
//! Each operation names what was wrong when it refuses ([`OpError::caller_error`]).

mod accounts;
mod dead_letters;
mod explain;

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use crate::bookkeeping::{Bookkeeping, PausedRow};
use crate::config::Config;
use crate::db::{Db, DbError};
use crate::feed::{Feed, Lag, Rewind};
use crate::ingest::Ingest;
use crate::store::Store;

pub use dead_letters::{Retried, Selection};
pub use explain::Explanation;

/// Why an operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("no source {0:?} in the configuration")]
    UnknownSource(String),
    #[error("source {in_source:?} has no kind {kind:?} (its kinds: {known})")]
    UnknownKind {
        in_source: String,
        kind: String,
        known: String,
    },
    #[error("no consumer {0:?} in the configuration ([consumers.NAME])")]
    UnknownConsumer(String),
    #[error(
        "event id {event_id:?} is kept for several sources ({sources}); name one with --source"
    )]
    Ambiguous { event_id: String, sources: String },
    #[error("say which: event ids, or --all")]
    NothingSelected,
    #[error("nothing to change: give a credential, an api_base, or clear the api_base")]
    NothingToChange,
    #[error("cannot rewind consumer {consumer:?}: {why}")]
    Rewind { consumer: String, why: Rewind },
    #[error(
        "source {0:?} serves one account; add [sources.{0}.accounts] (with `from`, where a delivery's signed body names its account) to serve many"
    )]
    SingleAccount(String),
    #[error("account {account:?}: {why}")]
    BadAccount { account: String, why: String },
    #[error("api_base {0:?} is not an http(s) URL")]
    BadApiBase(String),
    #[error(
        "api_base {base:?} is not under source {source_name:?}'s allowed prefixes ({allowed}); an account's requests and credential go only there. Add a prefix to sources.{source_name}.accounts.api_bases if this base is right"
    )]
    BaseNotAllowed {
        source_name: String,
        base: String,
        allowed: String,
    },
    /// The change of an account's base or credential was refused.
    #[error(transparent)]
    Set(#[from] crate::accounts::SetError),
    #[error(
        "a credential is kept encrypted with accounts.key, which is not set; make one with `webhook-reconciler secret new --raw` and set accounts.key"
    )]
    NoAccountsKey,
    #[error("account {account:?} of {of:?} is not registered")]
    NotRegistered { of: String, account: String },
    /// The registry refused (another base) or could not seal the credential.
    #[error(transparent)]
    Add(#[from] crate::accounts::AddError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl OpError {
    /// The request's mistake (exit 2, HTTP 400/404), not the database's.
    pub fn caller_error(&self) -> bool {
        use crate::accounts::AddError;
        use crate::accounts::SetError;
        !matches!(
            self,
            OpError::Db(_)
                | OpError::Add(AddError::Seal(_) | AddError::Db(_))
                | OpError::Set(SetError::Seal(_) | SetError::Db(_) | SetError::Concurrent)
        )
    }

    /// Something named does not exist (HTTP 404).
    pub fn not_found(&self) -> bool {
        matches!(
            self,
            OpError::UnknownSource(_)
                | OpError::UnknownKind { .. }
                | OpError::UnknownConsumer(_)
                | OpError::NotRegistered { .. }
        )
    }
}

/// A consumer as `consumers list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumerView {
    pub name: String,
    /// Every change up to this seq was answered 2xx.
    pub position: i64,
    pub paused: bool,
    /// Changes waiting (of its sources and kinds) and the oldest one's age.
    pub lag: Lag,
    /// Changes given up on (`on_failure = "skip"`).
    pub skipped: i64,
}

/// The operations over one configuration and database. Cheap to clone.
#[derive(Clone)]
pub struct Operations {
    config: Arc<Config>,
    store: Store,
    book: Bookkeeping,
    feed: Feed,
    /// By source: the ingest step retried dead letters go through (on the store of
    /// `serve`, when under it, so what a retry leaves to fetch wakes its fetcher).
    ingests: Arc<HashMap<String, Ingest>>,
}

impl Operations {
    pub fn new(config: Arc<Config>, store: Store) -> Self {
        Self {
            book: Bookkeeping::new(store.db().clone()),
            feed: Feed::new(store.db().clone()),
            ingests: Arc::new(
                config
                    .sources
                    .iter()
                    .map(|s| (s.name.clone(), Ingest::new(s, store.clone())))
                    .collect(),
            ),
            config,
            store,
        }
    }

    /// On a store of its own (the command line).
    pub fn standalone(config: Arc<Config>, db: Db) -> Self {
        Self::new(config, Store::new(db))
    }

    fn check_source(&self, source: &str) -> Result<&crate::config::SourceConfig, OpError> {
        self.config
            .source(source)
            .ok_or_else(|| OpError::UnknownSource(source.to_string()))
    }

    /// The kinds a source reconciles: its kinds and its catch-up listing.
    fn kinds_of(source: &crate::config::SourceConfig) -> Vec<String> {
        source.kinds_and_catchup().map(|k| k.name.clone()).collect()
    }

    fn check_kind(&self, source: &str, kind: &str) -> Result<(), OpError> {
        let s = self.check_source(source)?;
        let kinds = Self::kinds_of(s);
        if kinds.iter().any(|k| k == kind) {
            Ok(())
        } else {
            Err(OpError::UnknownKind {
                in_source: source.to_string(),
                kind: kind.to_string(),
                known: kinds.join(", "),
            })
        }
    }

    fn check_consumer(&self, name: &str) -> Result<&crate::config::ConsumerConfig, OpError> {
        self.config
            .consumers
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| OpError::UnknownConsumer(name.to_string()))
    }

    /// Every configured consumer: its position, pause, lag and skips.
    pub async fn consumers(&self) -> Result<Vec<ConsumerView>, OpError> {
        let rows: HashMap<String, crate::feed::ConsumerRow> = self
            .feed
            .consumer_rows()
            .await?
            .into_iter()
            .map(|r| (r.consumer.clone(), r))
            .collect();
        let mut out = Vec::new();
        for c in &self.config.consumers {
            let row = rows.get(&c.name);
            out.push(ConsumerView {
                name: c.name.clone(),
                position: row.map_or(0, |r| r.position),
                paused: row.is_some_and(|r| r.paused),
                lag: self.feed.lag(c).await?,
                skipped: row.map_or(0, |r| r.skipped),
            });
        }
        Ok(out)
    }

    /// Moves a consumer back to `to`: the changes after it are pushed again with the
    /// same `chg_<seq>` ids. Returns the position it had.
    pub async fn rewind(&self, consumer: &str, to: i64) -> Result<i64, OpError> {
        self.check_consumer(consumer)?;
        self.feed
            .rewind(consumer, to)
            .await?
            .map_err(|why| OpError::Rewind {
                consumer: consumer.to_string(),
                why,
            })
    }

    /// Pauses or resumes pushing to a consumer (every replica, within a second).
    pub async fn set_consumer_paused(&self, consumer: &str, paused: bool) -> Result<(), OpError> {
        self.check_consumer(consumer)?;
        Ok(self.feed.set_paused(consumer, paused).await?)
    }

    /// Pauses or resumes reconciling `kind` of `source` (`None`: every kind of it).
    /// Returns whether anything changed.
    pub async fn set_reconcile_paused(
        &self,
        source: &str,
        kind: Option<&str>,
        paused: bool,
    ) -> Result<bool, OpError> {
        match kind {
            Some(k) => self.check_kind(source, k)?,
            None => {
                self.check_source(source)?;
            }
        }
        Ok(self
            .book
            .set_paused(
                &crate::change::PauseKey {
                    source: source.to_string(),
                    kinds: kind.map_or(crate::change::KindScope::Every, |k| {
                        crate::change::KindScope::One(k.to_string())
                    }),
                },
                paused,
            )
            .await?)
    }

    /// Every pause in force (`PausedRow::key`: a kind or the whole source).
    pub async fn reconcile_pauses(&self) -> Result<Vec<PausedRow>, OpError> {
        Ok(self.book.pauses().await?)
    }
}

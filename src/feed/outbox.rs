//! The change feed's outbox: the one place that publishes, wakes and vacuums.
//!
//! Every transaction that writes `resources` fills `change_pending` through a trigger;
//! [`publish`] (called by `store`, last in that transaction) numbers those rows and
//! moves them to `changes` under the lock of `change_seq`, held to commit, so `seq`
//! grows in visibility order. After the commit the writer hands the [`Published`] it
//! got to [`Outbox::wake`], which wakes the pushers when something was published.

use std::sync::Arc;

use tokio::sync::Notify;

use super::sql;
use crate::config::Backend;
use crate::db::{Conn, Db};

/// Whether a transaction published changes: the one condition for waking the feed's
/// readers. Returned by [`publish`], consumed by [`Outbox::wake`] after the commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use = "hand it to Outbox::wake after the commit"]
pub struct Published(bool);

impl Published {
    /// Whether anything was published.
    pub fn anything(self) -> bool {
        self.0
    }
}

/// Publishes this transaction's pending changes. `rows_written` is how many resource
/// rows the transaction wrote: with none there is nothing pending, and no statement
/// runs (and no lock is taken). Call it last in every transaction that writes
/// `resources`.
pub fn publish(conn: &mut Conn, rows_written: usize) -> diesel::QueryResult<Published> {
    if rows_written == 0 {
        return Ok(Published(false));
    }
    Ok(Published(sql::publish_changes(conn)? > 0))
}

/// Blanks the states of one account's kept changes, in the caller's transaction (the
/// account's data is erased; its tombstone changes are published as usual).
pub fn erase_account_states(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    sql::erase_account_states(conn, source, account)
}

/// Wakes the feed's readers after commits that published. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    db: Db,
    published: Arc<Notify>,
    /// When this process last vacuumed `change_pending`.
    vacuumed: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// At most one vacuum of `change_pending` per this interval and process: a many-account
/// source ends thousands of small runs a minute, and a vacuum after each was most of the
/// database's cost of an account-kind run (benches/accounts_scale).
const VACUUM_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Outbox {
    pub fn new(db: Db) -> Self {
        Self {
            db,
            published: Arc::new(Notify::new()),
            vacuumed: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// Call after the commit of a transaction that called [`publish`].
    pub fn wake(&self, published: Published) {
        if published.0 {
            self.published.notify_waiters();
        }
    }

    /// Woken (`notify_waiters`) after every commit that published changes.
    pub fn published(&self) -> Arc<Notify> {
        self.published.clone()
    }

    /// On PostgreSQL, vacuums `change_pending` (and `change_seq`). Every row of the
    /// first dies in the transaction that wrote it: without a vacuum the table only
    /// grows (a 10M first sync left 4.2 GB of dead rows, and a server with autovacuum
    /// off, or one busy with large tables, never gets to it). Cheap when there is
    /// little to do; never waits for another vacuum of it (SKIP_LOCKED). A failure is
    /// logged, not returned: nothing depends on it but disk space and statement costs.
    pub async fn vacuum(&self) {
        if self.db.backend() != Backend::Postgres {
            return;
        }
        {
            let mut last = self.vacuumed.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < VACUUM_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let started = std::time::Instant::now();
        match self.db.read(sql::vacuum_change_pending).await {
            Ok(()) => tracing::debug!(
                seconds = started.elapsed().as_secs_f64(),
                "vacuumed change_pending"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not vacuum change_pending; its dead rows stay until autovacuum gets to them")
            }
        }
    }
}

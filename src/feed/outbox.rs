//! The change feed's outbox: the one place that publishes, numbers, wakes and vacuums.
//!
//! Every transaction that writes `resources` fills `change_pending` through a trigger,
//! in that transaction: the change is as durable as the write. It gets its `seq` after
//! the commit:
//! - on PostgreSQL from the sequencer ([`Outbox::settle`]): a pass, in its own short
//!   transaction under the lock of `change_seq`, numbers every committed pending change
//!   (of any writer of any replica) and moves it to `changes`. A change still in an open
//!   transaction is invisible to the pass and gets a higher seq from a later one, so
//!   `seq` grows in visibility order, gap-free, each change once — and no writer waits
//!   for another's commit. A webhook delivery's answer awaits the first pass that began
//!   after its commit ([`Outbox::settle`]: its 200 says the change is in the feed; one
//!   pass serves every writer that committed before it began); a reconcile page or a
//!   tombstone only requests one ([`Outbox::request`]) and goes on, and a one-shot
//!   command waits for its passes before it exits ([`Outbox::flush`]). What a killed
//!   process left pending is numbered by the next pass of any process ([`Outbox::run`]).
//! - on SQLite by [`publish`], last in the writing transaction (one writer at a time:
//!   numbering there costs no other writer anything).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::sql;
use crate::config::Backend;
use crate::db::{Conn, Db, DbError};

/// Whether a transaction may have left changes for the feed: the one condition for a
/// sequencer pass and for waking the feed's readers. Returned by [`publish`], consumed
/// by [`Outbox::settle`] after the commit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[must_use = "hand it to Outbox::settle after the commit"]
pub struct Published(bool);

impl Published {
    /// Whether the transaction may have changed anything the feed carries.
    pub fn anything(self) -> bool {
        self.0
    }
}

/// Call last in every transaction that writes `resources`. `rows_written` is how many
/// resource rows the transaction wrote: with none there is nothing pending and no
/// statement runs. On SQLite the pending changes are numbered here.
pub fn publish(conn: &mut Conn, rows_written: usize) -> diesel::QueryResult<Published> {
    if rows_written == 0 {
        return Ok(Published(false));
    }
    match conn.backend() {
        Backend::Sqlite => Ok(Published(sql::publish_changes(conn)? > 0)),
        Backend::Postgres => Ok(Published(true)),
    }
}

/// Blanks the states of one account's kept changes, numbered or pending, in the
/// caller's transaction (the account's data is erased; its tombstone changes are
/// published as usual).
pub fn erase_account_states(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    sql::erase_account_states(conn, source, account)
}

/// Blanks the states of named resources' kept changes (one account and kind), in the
/// caller's transaction.
pub fn erase_resource_states(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
    ids: &[&str],
) -> diesel::QueryResult<usize> {
    sql::erase_resource_states(conn, source, account, kind, ids)
}

/// Labels an erasure's changes `erasure`, in its transaction, before [`publish`] (SQLite;
/// on PostgreSQL the tombstones carry it).
pub fn label_erasure(conn: &mut Conn) -> diesel::QueryResult<usize> {
    sql::label_erasure(conn)
}

/// Numbers committed changes and wakes the feed's readers. Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    db: Db,
    published: Arc<Notify>,
    sequencer: Arc<Sequencer>,
    /// When this process last vacuumed `change_pending`.
    vacuumed: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

/// This process's passes: one at a time, each covering every request made before it
/// began.
#[derive(Default)]
struct Sequencer {
    /// Tickets handed out: one per settle, taken after its commit.
    requested: AtomicU64,
    /// Every ticket up to this one was covered by a pass that succeeded.
    covered: AtomicU64,
    /// Held while a pass runs; holds when the next may begin (see `GATHER`).
    running: tokio::sync::Mutex<Option<tokio::time::Instant>>,
}

/// After a pass that numbered something, the next pass of this process begins no
/// sooner than this, so that it numbers more at once: a pass costs the database a lock,
/// a commit and its flush whatever it numbers, and on 2 cores that is CPU the writers
/// wait for. Since writers that answer nobody no longer wait for their pass
/// ([`Outbox::request`]), a lone writer's passes gather too: one writer through the
/// product's write path went from 0.68 to 0.79 of its commits/s without the feed
/// (benches/feed_commits.rs). A delivery's answer, which waits for its pass, waits at
/// most this much longer.
const GATHER: Duration = Duration::from_millis(1);

/// How often `serve` looks for changes nobody numbered (a process killed between its
/// commit and its pass; a pass that failed).
const LEFTOVERS_EVERY: Duration = Duration::from_secs(1);

/// At most one vacuum of `change_pending` per this interval, across replicas, and only
/// after a pass numbered something: a many-account source ends thousands of small runs
/// a minute, and a vacuum after each was most of the database's cost of an account-kind
/// run (benches/accounts_scale). Every 10 s the passes walked the primary key past the
/// entries of up to 10 s of numbered rows: at 10,000 accounts 2,011 buffers a pass
/// against 1,420 with 2 s, and 8% less database CPU (benches/README.md).
const VACUUM_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Outbox {
    pub fn new(db: Db) -> Self {
        Self {
            db,
            published: Arc::new(Notify::new()),
            sequencer: Arc::new(Sequencer::default()),
            vacuumed: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// Call after the commit of a transaction that called [`publish`]: on PostgreSQL,
    /// returns once a pass that began after that commit has numbered its changes (so a
    /// read after a write sees them); wakes the readers when changes were numbered. A
    /// failed pass is logged, not returned: the write is committed, its changes are
    /// kept in `change_pending`, and the next pass of any process numbers them.
    pub async fn settle(&self, published: Published) {
        if let Some(ticket) = self.ticket(published) {
            self.pass_logged(ticket).await;
        }
    }

    /// Like [`Outbox::settle`], but returns at once: the pass runs on a task of its
    /// own. For writers that do not answer anyone with their change (a reconcile page, a
    /// tombstone): the change is committed and durable in `change_pending` already, and
    /// waiting for its number made every such writer wait for a pass — with 8 writers
    /// side by side, 0.39 of the commits/s without the feed (benches/feed_commits.rs).
    /// [`Outbox::flush`] waits for what was requested.
    pub fn request(&self, published: Published) {
        if let Some(ticket) = self.ticket(published) {
            let outbox = self.clone();
            tokio::spawn(async move { outbox.pass_logged(ticket).await });
        }
    }

    /// The ticket a committed write's pass must cover; `None` when no pass is needed
    /// (nothing written, or SQLite, where the changes were numbered in the transaction
    /// and the readers are woken here).
    fn ticket(&self, published: Published) -> Option<u64> {
        if !published.0 {
            return None;
        }
        if self.db.backend() == Backend::Sqlite {
            self.published.notify_waiters();
            return None;
        }
        Some(self.sequencer.requested.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// [`Outbox::pass`] for a write already committed: a failure is logged, not returned.
    async fn pass_logged(&self, ticket: u64) {
        if let Err(e) = self.pass(ticket).await {
            tracing::warn!(error = %e, "could not number committed changes; they are kept and the next pass numbers them");
        }
    }

    /// Returns once every change this process committed and published before the call
    /// is numbered (PostgreSQL; at once on SQLite): before a command that wrote exits,
    /// so that its changes reach the feed without waiting for another process.
    pub async fn flush(&self) -> Result<(), DbError> {
        if self.db.backend() == Backend::Sqlite {
            return Ok(());
        }
        let ticket = self.sequencer.requested.load(Ordering::SeqCst);
        if self.sequencer.covered.load(Ordering::SeqCst) >= ticket {
            return Ok(());
        }
        self.pass(ticket).await.map(|_| ())
    }

    /// Numbers what is pending now (PostgreSQL; nothing to do on SQLite): what a killed
    /// process committed and never numbered. Returns how many changes were numbered.
    pub async fn sequence_leftovers(&self) -> Result<i64, DbError> {
        if self.db.backend() == Backend::Sqlite || !self.db.read(sql::anything_pending).await? {
            return Ok(0);
        }
        let ticket = self.sequencer.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.pass(ticket).await
    }

    /// Under `serve`: numbers leftovers at start and every `LEFTOVERS_EVERY` until
    /// `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(LEFTOVERS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.sequence_leftovers().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(changes = n, "numbered changes left pending"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not number pending changes; retrying in a second")
                }
            }
        }
    }

    /// The pass that covers `ticket`: this caller's, unless one that began after the
    /// ticket was taken has already succeeded while the caller waited for its turn.
    async fn pass(&self, ticket: u64) -> Result<i64, DbError> {
        let mut turn = self.sequencer.running.lock().await;
        if self.sequencer.covered.load(Ordering::SeqCst) >= ticket {
            return Ok(0);
        }
        if let Some(not_before) = turn.take() {
            tokio::time::sleep_until(not_before).await;
        }
        // Every ticket taken so far was taken after its commit, and this pass's move
        // begins after this load: it sees all of them.
        let covers = self.sequencer.requested.load(Ordering::SeqCst);
        let numbered = self.db.write_statement(sql::sequence_pending).await?;
        self.sequencer.covered.fetch_max(covers, Ordering::SeqCst);
        metrics::counter!("feed_sequencer_passes_total").increment(1);
        if numbered > 0 {
            *turn = Some(tokio::time::Instant::now() + GATHER);
            // Every numbered change leaves a dead row, and the next pass walks the
            // primary key past every dead row not yet vacuumed: within a long run the
            // passes grew with everything numbered before them (a one-shot first sync of
            // 10M items, which vacuumed only at its end: 23,024 items/s).
            self.vacuum_in_background();
            metrics::counter!("feed_changes_numbered_total").increment(numbered as u64);
            self.published.notify_waiters();
        }
        Ok(numbered)
    }

    /// Woken (`notify_waiters`) after changes were numbered.
    pub fn published(&self) -> Arc<Notify> {
        self.published.clone()
    }

    /// Starts [`Outbox::vacuum`] on its own task if `VACUUM_EVERY` has passed since
    /// this process's last: the pass that calls it does not wait.
    fn vacuum_in_background(&self) {
        let due = self
            .vacuumed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none_or(|t| t.elapsed() >= VACUUM_EVERY);
        if due {
            let outbox = self.clone();
            tokio::spawn(async move { outbox.vacuum().await });
        }
    }

    /// On PostgreSQL, vacuums `change_pending` (and `change_seq`). Every row of the
    /// first dies in the pass that numbers it: without a vacuum the table only
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
        let every = VACUUM_EVERY.as_secs_f64();
        match self
            .db
            .read(move |c| sql::vacuum_change_pending(c, every))
            .await
        {
            Ok(true) => tracing::debug!(
                seconds = started.elapsed().as_secs_f64(),
                "vacuumed change_pending"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not vacuum change_pending; its dead rows stay until autovacuum gets to them")
            }
        }
    }
}

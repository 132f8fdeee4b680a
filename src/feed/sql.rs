//! The change feed: `change_pending` (filled by a trigger on `resources`), `changes`,
//! `change_seq`, consumer positions and skips.

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text};

use crate::config::Backend;
use crate::db::sql::{in_list, minus_seconds, prepared, query, ts_text};
use crate::db::{Conn, on_conn};

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// SQLite: moves this transaction's pending changes into `changes`, numbered. SQLite
/// has one writer at a time, so numbering in the writing transaction costs no other
/// writer anything and every pending row is this transaction's. Returns how many.
pub(crate) fn publish_changes(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let Conn::Sqlite(c) = conn else {
        return Ok(0);
    };
    let b = Backend::Sqlite;
    let n = prepared(query(b, "SELECT COUNT(*) AS n FROM change_pending"))
        .get_result::<Count>(c)?
        .n;
    if n == 0 {
        return Ok(0);
    }
    let last = prepared(
        query(
            b,
            "UPDATE change_seq SET last = last + $1 RETURNING last AS n",
        )
        .bind::<BigInt, _>(n),
    )
    .get_result::<Count>(c)?
    .n;
    prepared(
        query(
            b,
            "INSERT INTO changes (seq, source, account, kind, id, version, deleted, state, origin, event_id) \
             SELECT $1 + ROW_NUMBER() OVER (ORDER BY pending_id), source, account, kind, id, version, deleted, state, origin, event_id \
             FROM change_pending",
        )
        .bind::<BigInt, _>(last - n),
    )
    .execute(c)?;
    prepared(query(b, "DELETE FROM change_pending")).execute(c)?;
    Ok(n)
}

/// PostgreSQL: one pass of the sequencer: every committed pending change, of any writer
/// of any replica, numbered in `pending_id` order and moved to `changes`, by the
/// function `feed_sequence_pass` (migration `000021`, where the argument for its order
/// is), in one statement sent without `BEGIN`/`COMMIT`: its own transaction. Passes are
/// serialised by the row lock of `change_seq`, held to commit; writers never take it. A
/// pass that finds nothing pending takes no lock and writes nothing, so it waits for no
/// flush. Returns how many changes were numbered.
///
/// The rows are found through the primary key, lowest first, a bounded batch at a time:
/// every numbered row dies here, and until a vacuum reaches them a sequential scan would
/// read every dead row of every earlier pass (a 1M-item first sync in one account took
/// 4.8× as long that way: benches/accounts_scale); index entries of dead rows are marked
/// dead once seen, so the index walk stays short.
pub(crate) fn sequence_pending(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let Conn::Postgres(c) = conn else {
        return Ok(0);
    };
    let q = prepared(query(Backend::Postgres, PASS_SQL).bind::<BigInt, _>(SEQUENCE_BATCH));
    Ok(q.get_result::<Count>(c)?.n)
}

/// The most pending changes one statement of a pass numbers.
pub(crate) const SEQUENCE_BATCH: i64 = 50_000;

/// The lock that serialises passes (and anything else that must not run beside one).
pub(crate) const LOCK_SEQ_SQL: &str = "SELECT last AS n FROM change_seq FOR UPDATE";

/// One pass, `$1` the batch.
pub(crate) const PASS_SQL: &str = "SELECT feed_sequence_pass($1) AS n";

/// PostgreSQL: whether any change waits for the sequencer (committed, or in a
/// transaction still open). Takes no lock.
pub(crate) fn anything_pending(conn: &mut Conn) -> diesel::QueryResult<bool> {
    let Conn::Postgres(c) = conn else {
        return Ok(false);
    };
    let q = prepared(query(
        Backend::Postgres,
        "SELECT COUNT(*) AS n FROM (SELECT 1 FROM change_pending LIMIT 1) p",
    ));
    Ok(q.get_result::<Count>(c)?.n > 0)
}

/// `VACUUM (SKIP_LOCKED)` of `change_pending` and of `change_seq` (one row, which every
/// pass updates and so leaves a dead version of) on PostgreSQL, outside a transaction
/// (VACUUM refuses to run in one), unless either was vacuumed (by any replica, or by
/// autovacuum) less than `every_secs` ago. Returns whether it vacuumed. SQLite reuses
/// the pages of deleted rows by itself.
pub(crate) fn vacuum_change_pending(conn: &mut Conn, every_secs: f64) -> diesel::QueryResult<bool> {
    use diesel::connection::SimpleConnection;
    let Conn::Postgres(c) = conn else {
        return Ok(false);
    };
    // Replicas share one clock: the server's record of the table's last vacuum. Each
    // vacuuming on its own clock was three vacuums where one did (10.6 s of the
    // database's 110 s in accounts_scale at 10,000 accounts, 3 replicas).
    let recent: Count = query(
        Backend::Postgres,
        "SELECT COUNT(*) AS n FROM pg_stat_user_tables \
         WHERE relid = 'change_pending'::regclass \
           AND GREATEST(last_vacuum, last_autovacuum) > now() - make_interval(secs => $1)",
    )
    .bind::<diesel::sql_types::Double, _>(every_secs)
    .get_result(c)?;
    if recent.n > 0 {
        return Ok(false);
    }
    c.batch_execute("VACUUM (SKIP_LOCKED) change_pending, change_seq")?;
    Ok(true)
}

/// One row of the feed.
#[derive(Debug, Clone, PartialEq, Eq, diesel::QueryableByName)]
pub struct ChangeRow {
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    #[diesel(sql_type = Text)]
    pub source: String,
    /// `''` for a single-account source.
    #[diesel(sql_type = Text)]
    pub account: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub id: String,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
    #[diesel(sql_type = Text)]
    pub origin: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub changed_at: String,
    /// How many rows the read found before its byte budget cut it.
    #[diesel(sql_type = BigInt)]
    pub listed: i64,
}

/// `AND source IN (..) AND kind IN (..)` for non-empty filters, placeholders from `first`.
fn filters(sources: &[String], kinds: &[String], first: usize) -> String {
    let mut sql = String::new();
    if !sources.is_empty() {
        sql.push_str(&format!(
            " AND source IN ({})",
            in_list(first, sources.len())
        ));
    }
    if !kinds.is_empty() {
        sql.push_str(&format!(
            " AND kind IN ({})",
            in_list(first + sources.len(), kinds.len())
        ));
    }
    sql
}

/// Changes with seq > `after`, oldest first, at most `limit` and at most `max_bytes` of
/// states (the first change always, whatever its size), of the given sources and kinds
/// (empty: all).
pub(crate) fn changes_after(
    conn: &mut Conn,
    after: i64,
    limit: i64,
    max_bytes: i64,
    sources: &[String],
    kinds: &[String],
) -> diesel::QueryResult<Vec<ChangeRow>> {
    let b = conn.backend();
    let state = crate::db::sql::state_text(b);
    let bytes = match b {
        Backend::Postgres => "COALESCE(octet_length(state::text), 0)",
        Backend::Sqlite => "COALESCE(length(CAST(state AS BLOB)), 0)",
    };
    let budget = 3 + sources.len() + kinds.len();
    // The states' running total decides where the read stops: a row is read while the
    // rows before it are under the budget, so one change of any accepted size still
    // goes through alone, and a read never carries much more than the budget.
    let q = query(
        b,
        &format!(
            "SELECT seq, source, account, kind, id, version, deleted, {state}, origin, event_id, {} AS changed_at, listed \
             FROM (SELECT c.*, SUM({bytes}) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) - {bytes} AS before, \
                   COUNT(*) OVER () AS listed \
                   FROM (SELECT * FROM changes WHERE seq > $1{} ORDER BY seq LIMIT $2) c) t \
             WHERE before < ${budget} ORDER BY seq",
            ts_text(b, "changed_at"),
            filters(sources, kinds, 3)
        ),
    );
    on_conn!(conn, c => {
        let mut q = q.into_boxed().bind::<BigInt, _>(after).bind::<BigInt, _>(limit);
        for s in sources.iter().chain(kinds) {
            q = q.bind::<Text, _>(s.as_str());
        }
        q.bind::<BigInt, _>(max_bytes).load(c)
    })
}

/// The highest seq handed out so far.
pub(crate) fn last_seq(conn: &mut Conn) -> diesel::QueryResult<i64> {
    let q = query(conn.backend(), "SELECT last AS n FROM change_seq");
    Ok(on_conn!(conn, c => q.get_result::<Count>(c))?.n)
}

/// A consumer's position (0 for a new consumer).
pub(crate) fn consumer_position(conn: &mut Conn, consumer: &str) -> diesel::QueryResult<i64> {
    let q = query(
        conn.backend(),
        "SELECT position AS n FROM consumer_positions WHERE consumer = $1",
    );
    let mut rows: Vec<Count> = on_conn!(conn, c => q.bind::<Text, _>(consumer).load(c))?;
    Ok(rows.pop().map_or(0, |r| r.n))
}

/// Gives a consumer without a position the feed's current end as its position.
/// (`WHERE true`: SQLite cannot otherwise tell the upsert's ON from a join's.)
pub(crate) fn start_consumer_now(conn: &mut Conn, consumer: &str) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "INSERT INTO consumer_positions (consumer, position) SELECT $1, last FROM change_seq WHERE true \
         ON CONFLICT (consumer) DO NOTHING",
    );
    on_conn!(conn, c => q.bind::<Text, _>(consumer).execute(c))?;
    Ok(())
}

/// Moves a consumer's position from `from` to `position`; false when it is no longer
/// at `from` (an operator rewound it meanwhile: the rewind wins).
pub(crate) fn advance_consumer(
    conn: &mut Conn,
    consumer: &str,
    from: i64,
    position: i64,
) -> diesel::QueryResult<bool> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO consumer_positions (consumer, position) VALUES ($1, $2) \
             ON CONFLICT (consumer) DO UPDATE SET position = excluded.position, updated_at = {} \
             WHERE consumer_positions.position = $3",
            crate::db::sql::now(b)
        ),
    );
    let n = on_conn!(conn, c => q
        .bind::<Text, _>(consumer)
        .bind::<BigInt, _>(position)
        .bind::<BigInt, _>(from)
        .execute(c))?;
    Ok(n > 0)
}

/// Records that a consumer gave up on change `seq` (`on_failure = "skip"`).
pub(crate) fn record_consumer_skip(
    conn: &mut Conn,
    consumer: &str,
    seq: i64,
    attempts: i32,
    error: &str,
) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "INSERT INTO consumer_skips (consumer, seq, attempts, last_error) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (consumer, seq) DO NOTHING",
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(consumer)
        .bind::<BigInt, _>(seq)
        .bind::<Integer, _>(attempts)
        .bind::<Text, _>(error)
        .execute(c))?;
    Ok(())
}

/// How far a consumer is behind: changes waiting (of its sources and kinds) and the
/// age in seconds of the oldest.
#[derive(Debug, Clone, Copy, Default, PartialEq, diesel::QueryableByName, serde::Serialize)]
pub struct Lag {
    #[diesel(sql_type = BigInt)]
    pub waiting: i64,
    #[diesel(sql_type = Double)]
    pub oldest_seconds: f64,
}

pub(crate) fn consumer_lag(
    conn: &mut Conn,
    position: i64,
    sources: &[String],
    kinds: &[String],
) -> diesel::QueryResult<Lag> {
    let b = conn.backend();
    let age = match b {
        Backend::Postgres => {
            "COALESCE(CAST(EXTRACT(EPOCH FROM now() - MIN(changed_at)) AS DOUBLE PRECISION), 0)"
        }
        Backend::Sqlite => {
            "COALESCE((julianday('now') - julianday(MIN(changed_at))) * 86400.0, 0.0)"
        }
    };
    let q = query(
        b,
        &format!(
            "SELECT COUNT(*) AS waiting, {age} AS oldest_seconds FROM changes WHERE seq > $1{}",
            filters(sources, kinds, 2)
        ),
    );
    on_conn!(conn, c => {
        let mut q = q.into_boxed().bind::<BigInt, _>(position);
        for s in sources.iter().chain(kinds) {
            q = q.bind::<Text, _>(s.as_str());
        }
        q.get_result(c)
    })
}

/// Deletes, of the `limit` lowest seqs <= `acknowledged` (what every consumer has),
/// those older than `age_secs`; returns how many. Only the oldest are looked at, through
/// the primary key: a change's time grows with its seq (give or take a transaction), so
/// a young change there means the rest are young too, and a call costs at most `limit`
/// rows whatever the feed holds, with no index by time for every write to fill.
pub(crate) fn prune_changes(
    conn: &mut Conn,
    age_secs: f64,
    acknowledged: i64,
    limit: i64,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "DELETE FROM changes WHERE seq IN (SELECT seq FROM (SELECT seq, changed_at FROM changes WHERE seq <= $2 ORDER BY seq LIMIT $3) oldest WHERE changed_at < {})",
            minus_seconds(b, 1)
        ),
    );
    on_conn!(conn, c => q
        .bind::<Double, _>(age_secs)
        .bind::<BigInt, _>(acknowledged)
        .bind::<BigInt, _>(limit)
        .execute(c))
}

/// The lowest position of the given consumers (0 if one has none yet).
pub(crate) fn lowest_position(conn: &mut Conn, consumers: &[String]) -> diesel::QueryResult<i64> {
    let mut low = i64::MAX;
    for c in consumers {
        low = low.min(consumer_position(conn, c)?);
    }
    Ok(low)
}

/// A change of one resource, as `explain` shows it.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct ResourceChange {
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    #[diesel(sql_type = BigInt)]
    pub version: i64,
    #[diesel(sql_type = Bool)]
    pub deleted: bool,
    #[diesel(sql_type = Text)]
    pub origin: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub event_id: Option<String>,
    #[diesel(sql_type = Text)]
    pub changed_at: String,
}

/// The kept changes of one resource, in seq order, at most `limit` (through
/// `changes_resource_idx`).
pub(crate) fn changes_of(
    conn: &mut Conn,
    key: &crate::change::ResourceKey,
    limit: i64,
) -> diesel::QueryResult<Vec<ResourceChange>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT seq, version, deleted, origin, event_id, {} AS changed_at FROM changes \
             WHERE source = $1 AND account = $2 AND kind = $3 AND id = $4 ORDER BY seq LIMIT $5",
            ts_text(b, "changed_at")
        ),
    );
    on_conn!(conn, c => q
        .bind::<Text, _>(key.source.as_str())
        .bind::<Text, _>(key.account.as_str())
        .bind::<Text, _>(key.kind.as_str())
        .bind::<Text, _>(key.id.as_str())
        .bind::<BigInt, _>(limit)
        .load(c))
}

/// The oldest kept change's seq (`None`: the feed keeps none).
pub(crate) fn oldest_seq(conn: &mut Conn) -> diesel::QueryResult<Option<i64>> {
    #[derive(diesel::QueryableByName)]
    struct Min {
        #[diesel(sql_type = Nullable<BigInt>)]
        n: Option<i64>,
    }
    let q = query(conn.backend(), "SELECT MIN(seq) AS n FROM changes");
    Ok(on_conn!(conn, c => q.get_result::<Min>(c))?.n)
}

/// A consumer's row as `consumers list` shows it.
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct ConsumerRow {
    #[diesel(sql_type = Text)]
    pub consumer: String,
    #[diesel(sql_type = BigInt)]
    pub position: i64,
    #[diesel(sql_type = Bool)]
    pub paused: bool,
    #[diesel(sql_type = BigInt)]
    pub skipped: i64,
}

pub(crate) fn consumer_rows(conn: &mut Conn) -> diesel::QueryResult<Vec<ConsumerRow>> {
    let q = query(
        conn.backend(),
        "SELECT p.consumer, p.position, p.paused, \
         (SELECT COUNT(*) FROM consumer_skips s WHERE s.consumer = p.consumer) AS skipped \
         FROM consumer_positions p ORDER BY p.consumer",
    );
    on_conn!(conn, c => q.load(c))
}

/// A consumer's position and whether it is paused (a consumer without a row: 0, not
/// paused).
pub(crate) fn consumer_state(conn: &mut Conn, consumer: &str) -> diesel::QueryResult<(i64, bool)> {
    #[derive(diesel::QueryableByName)]
    struct State {
        #[diesel(sql_type = BigInt)]
        position: i64,
        #[diesel(sql_type = Bool)]
        paused: bool,
    }
    let q = query(
        conn.backend(),
        "SELECT position, paused FROM consumer_positions WHERE consumer = $1",
    );
    let rows: Vec<State> = on_conn!(conn, c => q.bind::<Text, _>(consumer).load(c))?;
    Ok(rows.first().map_or((0, false), |r| (r.position, r.paused)))
}

/// Pauses or resumes a consumer (a consumer without a position gets 0, the feed's
/// start, like a new one).
pub(crate) fn set_consumer_paused(
    conn: &mut Conn,
    consumer: &str,
    paused: bool,
) -> diesel::QueryResult<()> {
    let q = query(
        conn.backend(),
        "INSERT INTO consumer_positions (consumer, position, paused) VALUES ($1, 0, $2) \
         ON CONFLICT (consumer) DO UPDATE SET paused = excluded.paused",
    );
    on_conn!(conn, c => q.bind::<Text, _>(consumer).bind::<Bool, _>(paused).execute(c))?;
    Ok(())
}

/// Sets a consumer's position back (or anywhere): changes after it are pushed again.
pub(crate) fn set_consumer_position(
    conn: &mut Conn,
    consumer: &str,
    position: i64,
) -> diesel::QueryResult<()> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "INSERT INTO consumer_positions (consumer, position) VALUES ($1, $2) \
             ON CONFLICT (consumer) DO UPDATE SET position = excluded.position, updated_at = {}",
            crate::db::sql::now(b)
        ),
    );
    on_conn!(conn, c => q.bind::<Text, _>(consumer).bind::<BigInt, _>(position).execute(c))?;
    Ok(())
}

/// Blanks the state of the kept changes of named resources of one account and kind (a
/// customer's data must go), numbered or pending; seqs stay.
pub(crate) fn erase_resource_states(
    conn: &mut Conn,
    source: &str,
    account: &str,
    kind: &str,
    ids: &[&str],
) -> diesel::QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let b = conn.backend();
    if b == Backend::Postgres {
        // As for an account: no pass moves a change of these resources meanwhile.
        let q = query(b, LOCK_SEQ_SQL);
        on_conn!(conn, c => q.get_result::<Count>(c))?;
    }
    let mut blanked = 0;
    for table in ["changes", "change_pending"] {
        let q = query(
            b,
            &format!(
                "UPDATE {table} SET state = NULL WHERE source = $1 AND account = $2 AND kind = $3 \
                 AND state IS NOT NULL AND id IN ({})",
                crate::db::sql::in_list(4, ids.len())
            ),
        );
        blanked += on_conn!(conn, c => {
            let mut q = q
                .into_boxed()
                .bind::<Text, _>(source)
                .bind::<Text, _>(account)
                .bind::<Text, _>(kind);
            for id in ids {
                q = q.bind::<Text, _>(*id);
            }
            q.execute(c)
        })?;
    }
    Ok(blanked)
}

/// SQLite: labels the transaction's pending changes `erasure` (on SQLite every pending
/// row is the running transaction's: each write numbers its own before it commits).
/// PostgreSQL's tombstones carry the origin themselves.
pub(crate) fn label_erasure(conn: &mut Conn) -> diesel::QueryResult<usize> {
    let Conn::Sqlite(c) = conn else {
        return Ok(0);
    };
    query(
        Backend::Sqlite,
        "UPDATE change_pending SET origin = 'erasure' WHERE deleted AND state IS NULL",
    )
    .execute(c)
}

/// Blanks the state of every kept change of one account (its data must go: purge,
/// `shop/redact`). Seqs stay, so the feed has no gap; a consumer that has not read them
/// yet gets the changes without their states.
pub(crate) fn erase_account_states(
    conn: &mut Conn,
    source: &str,
    account: &str,
) -> diesel::QueryResult<usize> {
    let b = conn.backend();
    if b == Backend::Postgres {
        // No pass may move a change of the account while its states are blanked: one
        // that moved a pending row after the first statement's snapshot would keep its
        // state in `changes`.
        let q = query(b, LOCK_SEQ_SQL);
        on_conn!(conn, c => q.get_result::<Count>(c))?;
    }
    let mut blanked = 0;
    for table in ["changes", "change_pending"] {
        let q = query(
            b,
            &format!(
                "UPDATE {table} SET state = NULL WHERE source = $1 AND account = $2 AND state IS NOT NULL"
            ),
        );
        blanked +=
            on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(account).execute(c))?;
    }
    Ok(blanked)
}

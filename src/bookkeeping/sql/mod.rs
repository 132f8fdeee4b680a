//! Reconcile bookkeeping's statements, a file per table (or pair of tables): `runs`
//! (`reconcile_runs`, `reconcile_last_success`), `leases`, `sweeps`
//! (`reconcile_checkpoints`, `reconcile_state`), `prunes` (`prune_runs`), `pauses`
//! (`reconcile_paused`) and `due` (`reconcile_due`: the schedule). Here: the database's
//! clock and the run counts' columns, which the page record (`leases`) and the run's end
//! (`runs`) both set. Only `bookkeeping` calls these.

pub(crate) mod due;

use diesel::RunQueryDsl;
use diesel::sql_types::{BigInt, Bool, Double, Nullable, Text};

use super::{Mode, RunCounts, RunState};
use crate::change::Key;
use crate::db::sql::{
    RunId, TextValue, age_secs, display_time, minus_seconds, now, plus_seconds, prepared, query,
    ts_param, ts_text,
};
use crate::db::{Conn, DbTime, on_conn};

/// The database's clock: the one clock every replica agrees on, used for sweep starts
/// and leases (never for versions).
pub(crate) fn db_now(conn: &mut Conn) -> diesel::QueryResult<DbTime> {
    let b = conn.backend();
    let q = query(
        b,
        &format!("SELECT {} AS v", ts_text(b, crate::db::sql::now(b))),
    );
    let r: TextValue = on_conn!(conn, c => prepared(q).get_result(c))?;
    DbTime::parse(&r.v)
}

/// A run's count columns, in the order `bind_counts!` binds them.
const COUNT_COLUMNS: [&str; 10] = [
    "pages",
    "scanned",
    "missing",
    "newer_remote",
    "differing",
    "newer_local",
    "equal",
    "applied",
    "tombstoned",
    "skipped",
];

/// `pages = $first, scanned = $first+1, ..`: [`COUNT_COLUMNS`] set from consecutive
/// parameters, bound by `bind_counts!` after the statement's others.
fn set_counts(first: usize) -> String {
    COUNT_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| format!("{column} = ${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds a [`RunCounts`] as [`set_counts`] numbers them.
macro_rules! bind_counts {
    ($q:expr, $counts:expr) => {{
        let c: &RunCounts = $counts;
        $q.bind::<BigInt, _>(c.pages)
            .bind::<BigInt, _>(c.scanned)
            .bind::<BigInt, _>(c.missing)
            .bind::<BigInt, _>(c.newer_remote)
            .bind::<BigInt, _>(c.differing)
            .bind::<BigInt, _>(c.newer_local)
            .bind::<BigInt, _>(c.equal)
            .bind::<BigInt, _>(c.applied)
            .bind::<BigInt, _>(c.tombstoned)
            .bind::<BigInt, _>(c.skipped)
    }};
}

/// A single count.
#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

mod leases;
mod pauses;
mod prunes;
mod runs;
mod sweeps;

pub(crate) use leases::*;
pub use pauses::PausedRow;
pub(crate) use pauses::*;
pub use prunes::PruneRow;
pub(crate) use prunes::*;
pub(crate) use runs::*;
pub use runs::{RunRow, SuccessAge};
pub(crate) use sweeps::*;
pub use sweeps::{Checkpoint, SweepState};

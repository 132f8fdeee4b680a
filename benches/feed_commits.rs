//! What the change feed costs concurrent writers, through the product's own write path
//! (PostgreSQL). N writers (tokio tasks, as `serve`'s requests are), each in a loop: one
//! guarded upsert of a ~450-byte state (a random one of 100,000 invoices, always a newer
//! version), two ways:
//!   feed     `Store::apply_batch`: the upsert, the `resources` trigger's pending change
//!            in the same transaction, the commit, then the wait for the sequencer's pass
//!            that numbers it (`feed::outbox`: one pass at a time per process, each
//!            covering every writer that committed before it began, 1 ms apart under
//!            load), with the outbox's own vacuum of `change_pending`;
//!   no-feed  `store::baseline::apply_batch_without_feed`: the same upsert in the same
//!            transaction through the same pool, with the trigger disabled and no pass:
//!            the least a write does without the feed's promises.
//! Unlike `benches/feed_writers.sh` (pgbench, whose sequencer runs passes back to back
//! whether or not anything was committed), a pass runs here only when a writer asks for
//! one, as in the product. The two ways alternate in ROUNDS paired rounds per N (which
//! goes first alternates too), each after a CHECKPOINT; it prints every round and the
//! median of the rounds' ratios per N. At the end every change written must have been
//! numbered once, gap-free, nothing left pending.
//!
//!   cargo bench --bench feed_commits
//!   cargo bench --bench feed_commits -- --clients 1,8,24 --rounds 5 --seconds 6
//!
//! PostgreSQL server: $WR_TEST_PG (default postgres://postgres@127.0.0.1:5432).
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark harness, not the daemon"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, RunQueryDsl};
use webhook_reconciler::change::Change;
use webhook_reconciler::config::{Action, Config};
use webhook_reconciler::db::Db;
use webhook_reconciler::store::{Store, baseline};

fn pg_server() -> String {
    std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn scalar(c: &mut PgConnection, sql: &str) -> i64 {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    diesel::sql_query(sql).get_result::<N>(c).unwrap().n
}

/// One invoice's state, canonical (keys sorted, no whitespace) as the product stores it.
/// It carries its version, so that every write changes the state and is one change (the
/// feed records nothing for a write that leaves the state as it was).
fn change(id: u32, amount: u32, version: i64) -> Change {
    let state = format!(
        r#"{{"amount_due":{amount},"created":1700000000,"currency":"eur","customer":"cus_{amount}","description":"An invoice state of a few hundred bytes, as senders send them, padded with a description of the kind people write","id":"in_{id}","lines":{{"data":[],"has_more":false,"object":"list"}},"livemode":false,"metadata":{{}},"object":"invoice","status":"open","version":{version}}}"#
    );
    Change {
        source: "api".into(),
        account: String::new(),
        kind: "invoice".into(),
        id: format!("in_{id}"),
        version,
        state: Some(state),
        action: Action::Upsert,
    }
}

/// One round: `clients` writers for `seconds`; returns (commits/s, rows written).
async fn round(
    store: &Arc<Store>,
    admin: &mut PgConnection,
    feed: bool,
    clients: usize,
    seconds: f64,
    versions: &Arc<AtomicI64>,
) -> (f64, i64) {
    let toggle = if feed { "ENABLE" } else { "DISABLE" };
    admin
        .batch_execute(&format!(
            "ALTER TABLE resources {toggle} TRIGGER resources_record_change"
        ))
        .unwrap();
    admin.batch_execute("CHECKPOINT").unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut writers = Vec::new();
    for _ in 0..clients {
        let store = store.clone();
        let versions = versions.clone();
        writers.push(tokio::spawn(async move {
            let mut written = 0i64;
            while Instant::now() < deadline {
                let c = change(
                    rand::random_range(1..=100_000),
                    rand::random_range(1..=1000),
                    versions.fetch_add(1, Ordering::Relaxed),
                );
                written += if feed {
                    store.apply_batch(vec![c]).await.unwrap().len() as i64
                } else {
                    baseline::apply_batch_without_feed(store.db(), vec![c])
                        .await
                        .unwrap() as i64
                };
            }
            written
        }));
    }
    let mut written = 0;
    for w in writers {
        written += w.await.unwrap();
    }
    (written as f64 / started.elapsed().as_secs_f64(), written)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let clients: Vec<usize> = value("--clients")
        .unwrap_or_else(|| "1,8,24".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let rounds: usize = value("--rounds").map_or(5, |s| s.parse().unwrap());
    let seconds: f64 = value("--seconds").map_or(6.0, |s| s.parse().unwrap());

    let name = format!("wr_bench_feed_commits_{}", std::process::id());
    let mut admin = PgConnection::establish(&format!("{}/postgres", pg_server()))
        .expect("PostgreSQL unreachable; run scripts/ensure-postgres.sh");
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let url = format!("{}/{name}", pg_server());
    let pool = clients.iter().max().copied().unwrap_or(1) + 4;
    let cfg = Config::from_toml_str(&format!(
        "[database]\nurl = \"{url}\"\nmax_connections = {pool}\nacquire_timeout = \"30s\"\n\
         [http]\nlisten = \"127.0.0.1:0\"\n[log]\nlevel = \"warn\"\n"
    ))
    .unwrap();
    let db = Db::connect(&cfg.database).unwrap();
    db.migrate().unwrap();
    let store = Arc::new(Store::new(db));
    let mut c = PgConnection::establish(&url).unwrap();
    let versions = Arc::new(AtomicI64::new(1));

    println!(
        "{:>8} {:>6} {:>14} {:>14} {:>10}",
        "clients", "round", "feed commits/s", "no-feed", "feed/no"
    );
    let mut changes_written = 0;
    for &n in &clients {
        let (mut with, mut without, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for r in 1..=rounds {
            let (w, wo) = if r % 2 == 1 {
                let w = round(&store, &mut c, true, n, seconds, &versions).await;
                let wo = round(&store, &mut c, false, n, seconds, &versions).await;
                (w, wo)
            } else {
                let wo = round(&store, &mut c, false, n, seconds, &versions).await;
                let w = round(&store, &mut c, true, n, seconds, &versions).await;
                (w, wo)
            };
            changes_written += w.1;
            println!(
                "{n:>8} {r:>6} {:>14.0} {:>14.0} {:>10.2}",
                w.0,
                wo.0,
                w.0 / wo.0
            );
            with.push(w.0);
            without.push(wo.0);
            ratios.push(w.0 / wo.0);
        }
        println!(
            "{n:>8} {:>6} {:>14.0} {:>14.0} {:>10.2}",
            "median",
            median(with),
            median(without),
            median(ratios)
        );
    }

    // Every change the feed rounds wrote numbered once, gap-free, nothing pending.
    store.outbox().sequence_leftovers().await.unwrap();
    let count = scalar(&mut c, "SELECT COUNT(*) AS n FROM changes");
    let max = scalar(&mut c, "SELECT COALESCE(MAX(seq), 0) AS n FROM changes");
    let last = scalar(&mut c, "SELECT last AS n FROM change_seq");
    let pending = scalar(&mut c, "SELECT COUNT(*) AS n FROM change_pending");
    println!(
        "changes written {changes_written}, numbered {count}, seqs 1..{max}, last handed out {last}, pending left {pending}"
    );
    assert!(
        count == changes_written && max == count && last == count && pending == 0,
        "the feed lost, repeated or skipped a change"
    );
    drop(c);
    drop(store);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap();
}

//! The soak's faults, on a schedule: the database gone (PostgreSQL stopped and started
//! again when the soak was given the commands — `scripts/soak.sh` does, on its own
//! throwaway cluster — else its connections cut and refused; SQLite locked by another
//! writer), the sender answering 500, then 429 with `Retry-After`, then slowly (3 s a
//! request), and a burst of bad deliveries (unsigned, badly signed, not JSON, unknown
//! event types, oversized).

use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, SqliteConnection};
use webhook_reconciler::simulator::{Fault, Quirk, SimSender};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Database,
    Sender500,
    Sender429,
    SlowSender,
    BadDeliveries,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Database => "database gone",
            Kind::Sender500 => "sender answers 500",
            Kind::Sender429 => "sender answers 429",
            Kind::SlowSender => "sender slow (3 s)",
            Kind::BadDeliveries => "burst of bad deliveries",
        }
    }

    /// Whether recovery includes a successful reconcile (the sender's faults, and the
    /// database's).
    pub fn needs_reconcile(self) -> bool {
        self != Kind::BadDeliveries
    }
}

/// A fault from `start` to `end` (seconds since the soak started).
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub kind: Kind,
    pub start: f64,
    pub end: f64,
}

/// After a quiet start (`quiet` seconds: the latency baseline), two cycles of the faults
/// one after another, each in its own slot: the fault in the slot's first third (at most
/// 30 s), recovery and quiet in the rest. The first cycle takes the daemon to its
/// high-water marks (a database outage fills the in-flight limit once); growth is
/// measured over the second.
pub fn schedule(seconds: f64, quiet: f64, length: Option<f64>) -> Vec<Window> {
    const ORDER: [Kind; 5] = [
        Kind::Database,
        Kind::Sender500,
        Kind::BadDeliveries,
        Kind::Sender429,
        Kind::SlowSender,
    ];
    let slot = (seconds - quiet) / (2 * ORDER.len()) as f64;
    let length = length.unwrap_or((slot / 3.0).clamp(2.0, 30.0));
    let mut out = Vec::new();
    for cycle in 0..2 {
        for (i, kind) in ORDER.into_iter().enumerate() {
            let start = quiet + slot * (cycle * ORDER.len() + i) as f64;
            out.push(Window {
                kind,
                start,
                end: start
                    + if kind == Kind::BadDeliveries {
                        2.0
                    } else {
                        length
                    },
            });
        }
    }
    out
}

/// When the second cycle starts (the measured half), for `schedule(seconds, quiet)`.
pub fn second_cycle(seconds: f64, quiet: f64) -> f64 {
    quiet + (seconds - quiet) / 2.0
}

/// How the database is taken away and given back.
pub enum Database {
    /// Shell commands that stop and start the PostgreSQL server (a real restart).
    PgCommands { stop: String, start: String },
    /// Refuse and cut the connections to this database on the shared server.
    PgCut { server: String, name: String },
    /// Hold SQLite's write lock from another connection.
    SqliteLock { path: String },
}

/// Something to undo when the window ends.
pub enum Undo {
    Nothing,
    Sender,
    PgStart(String),
    PgAllow { server: String, name: String },
    SqliteRelease(mpsc::Sender<()>, std::thread::JoinHandle<()>),
}

fn shell(cmd: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "soak: `{cmd}` failed");
}

fn pg_admin(server: &str) -> PgConnection {
    PgConnection::establish(&format!("{server}/test")).expect("the soak's admin connection")
}

/// Starts the fault; `bad` sends the burst of bad deliveries.
pub async fn begin(kind: Kind, db: &Database, sim: &SimSender, bad: impl AsyncFnOnce()) -> Undo {
    match kind {
        Kind::Database => match db {
            Database::PgCommands { stop, start } => {
                shell(stop);
                Undo::PgStart(start.clone())
            }
            Database::PgCut { server, name } => {
                pg_admin(server)
                    .batch_execute(&format!(
                        "ALTER DATABASE {name} ALLOW_CONNECTIONS false; \
                         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
                    ))
                    .unwrap();
                Undo::PgAllow {
                    server: server.clone(),
                    name: name.clone(),
                }
            }
            Database::SqliteLock { path } => {
                let (tx, rx) = mpsc::channel();
                let (locked_tx, locked_rx) = mpsc::channel();
                let path = path.clone();
                let holder = std::thread::spawn(move || {
                    let mut c = SqliteConnection::establish(&path).unwrap();
                    c.batch_execute("PRAGMA busy_timeout = 30000; BEGIN EXCLUSIVE")
                        .unwrap();
                    locked_tx.send(()).unwrap();
                    let _ = rx.recv();
                    c.batch_execute("COMMIT").unwrap();
                });
                locked_rx.recv().unwrap();
                Undo::SqliteRelease(tx, holder)
            }
        },
        Kind::Sender500 => {
            sim.add_quirk(Quirk::Outage(Fault::Status(500, None)));
            Undo::Sender
        }
        Kind::Sender429 => {
            sim.add_quirk(Quirk::Outage(Fault::Status(429, Some(2))));
            Undo::Sender
        }
        Kind::SlowSender => {
            sim.add_quirk(Quirk::Slow(Duration::from_secs(3)));
            Undo::Sender
        }
        Kind::BadDeliveries => {
            bad().await;
            Undo::Nothing
        }
    }
}

pub fn end(undo: Undo, sim: &SimSender) {
    match undo {
        Undo::Nothing => {}
        Undo::Sender => sim.clear_quirks(),
        Undo::PgStart(cmd) => shell(&cmd),
        Undo::PgAllow { server, name } => pg_admin(&server)
            .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
            .unwrap(),
        Undo::SqliteRelease(tx, holder) => {
            let _ = tx.send(());
            holder.join().unwrap();
        }
    }
}

/// The burst: `n` bad deliveries, 32 at a time; returns the count of each (kind,
/// status). Unknown event types are answered 200 `ignored` (SPEC), the rest 4xx.
pub async fn bad_deliveries(
    url: &str,
    n: usize,
) -> std::collections::BTreeMap<(&'static str, u16), u64> {
    // A connection per request: the daemon closes one after refusing an oversized body
    // unread, and a pooled connection reused then would fail on the client's side.
    let client = &reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut statuses = std::collections::BTreeMap::new();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (kind, request) = match i % 6 {
            0 => (
                "unsigned",
                client.post(url).body("{\"id\":\"evt_unsigned\"}"),
            ),
            1 => (
                "badly signed",
                client
                    .post(url)
                    .header("X-Signature", "00ff")
                    .header("X-Signature-Timestamp", "1")
                    .body("{}"),
            ),
            2 => (
                "not json",
                super::load::signed(client, url, "{not json".into()),
            ),
            3 => (
                "unknown type",
                super::load::signed(
                    client,
                    url,
                    format!("{{\"id\":\"evt_bad_{i}\",\"type\":\"no.such.type\",\"data\":{{}}}}"),
                ),
            ),
            4 => (
                "unmappable",
                super::load::signed(
                    client,
                    url,
                    format!(
                        "{{\"id\":\"evt_bad_{i}\",\"type\":\"order.updated\",\"data\":{{\"version\":\"x\"}}}}"
                    ),
                ),
            ),
            _ => (
                "oversized",
                super::load::signed(client, url, "x".repeat(2 << 20)),
            ),
        };
        set.spawn(async move {
            (
                kind,
                request.send().await.map_or(0, |r| r.status().as_u16()),
            )
        });
        if set.len() >= 32
            && let Some(Ok(k)) = set.join_next().await
        {
            *statuses.entry(k).or_default() += 1;
        }
    }
    while let Some(Ok(k)) = set.join_next().await {
        *statuses.entry(k).or_default() += 1;
    }
    statuses
}

//! `webhook-reconciler demo`: the whole product on one machine, in one command.
//!
//! A simulated sender owns orders (whose status changes, with versions) and refunds
//! (insert-once). It delivers its events as signed webhooks to a real daemon, with the
//! faults real senders have; then the daemon reconciles against the sender's listing,
//! and the demo compares the two sides. Every figure in the report is measured — the
//! receiver's answers and the rows in the database — not asserted.

pub mod accounts;
pub mod application;

use crate::bookkeeping::Bookkeeping;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::app::Application;
use crate::change::Key;
use crate::config::Config;
use crate::reconcile::{Reconciler, RunOptions, RunStatus};
use crate::simulator::deliver::{DeliveryStats, Faults, deliver};
use crate::simulator::{SimSender, Style};
use crate::store::Store;
use crate::store::StoredRow;

const TEMPLATE: &str = include_str!("../../config/demo.toml");
const STATUSES: [&str; 6] = [
    "created",
    "paid",
    "packed",
    "shipped",
    "delivered",
    "closed",
];

/// The demo's knobs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub orders: usize,
    pub refunds: usize,
    pub seed: u64,
    pub faults: Faults,
    /// Probability that an order emits two states within one version (whole-second
    /// timestamps).
    pub same_second: f64,
    pub concurrency: usize,
    /// `None`: a SQLite file in a temporary directory.
    pub database: Option<String>,
    /// Skip reconciliation, to see what the webhooks alone leave behind.
    pub reconcile: bool,
    pub progress: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            orders: 2000,
            refunds: 500,
            seed: 42,
            faults: Faults {
                loss: 0.05,
                duplicate: 0.10,
                concurrent_duplicate: 0.05,
                reorder: 0.20,
                slow_ack: 0.03,
            },
            same_second: 0.02,
            concurrency: 16,
            database: None,
            reconcile: true,
            progress: true,
        }
    }
}

/// What the demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub seed: u64,
    pub database: String,
    pub orders: usize,
    pub refunds: usize,
    pub deliveries: DeliveryStats,
    /// Resources whose local state differed from the sender's before reconciling.
    pub diverged_before_reconcile: usize,
    /// Items the reconcile run wrote.
    pub repaired_by_reconcile: i64,
    pub reconcile_ran: bool,
    /// Resources whose local state differs from the sender's at the end.
    pub diverged_at_end: usize,
    pub resources: usize,
    /// Changes committed to the feed.
    pub changes: i64,
    /// Where they came from.
    pub origins: ChangeOrigins,
    /// What the application did with them.
    pub effects: application::EffectCounts,
    pub converged: bool,
    pub seconds: f64,
}

/// Runs the demo and returns its report; `Ok` even when the states differ (the report
/// says so, and the command exits 1).
pub async fn run(opts: DemoOptions) -> anyhow::Result<DemoReport> {
    let started = Instant::now();
    let (dir, database) = database(opts.database.as_deref())?;
    let sim = SimSender::start()
        .await
        .context("starting the simulated sender")?;
    sim.add_kind("orders", Style::Cursor);
    sim.add_kind("refunds", Style::Cursor);
    let secret = format!("demo-{:016x}", rand::random::<u64>());
    let app_key: [u8; 32] = rand::random();
    let application = application::Application::start(&app_key)
        .await
        .context("starting the demo's application")?;
    let config = Config::from_toml_str(
        &TEMPLATE
            .replace("{{DATABASE_URL}}", &database)
            .replace("{{SENDER}}", &sim.base_url())
            .replace("{{SECRET}}", &secret)
            .replace("{{APPLICATION}}", &application.url())
            .replace(
                "{{APPLICATION_SECRET}}",
                &format!(
                    "whsec_{}",
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, app_key)
                ),
            ),
    )
    .map_err(|e| anyhow::anyhow!("the demo configuration: {e}"))?;

    let events = scenario(&sim, &opts);
    say(
        &opts,
        &format!(
            "demo: a sender with {} orders and {} refunds emits {} events (seed {}); database {}",
            opts.orders,
            opts.refunds,
            events.len(),
            opts.seed,
            crate::config::redact_database_url(&database)
        ),
    );

    let daemon = Daemon::start(&config).await?;
    let url = format!("http://{}{}", daemon.addr, "/webhooks/shop");
    let db = daemon.db.clone();
    let store = Store::new(db.clone());

    let bar = progress_bar(&opts);
    let deliveries = deliver(
        &events,
        &url,
        secret.as_bytes(),
        opts.faults,
        opts.seed,
        opts.concurrency,
        &|done, total| {
            if let Some(bar) = &bar {
                bar.set_length(total);
                bar.set_position(done);
            }
        },
    )
    .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let expected = expected_state(&sim);
    // Conflicts are resolved from the sender in the background; give the resolver the
    // moment it needs, bounded, before measuring what the webhooks left behind.
    let conflicts = deliveries.answers.get("conflict").copied().unwrap_or(0);
    let mut diverged_before = diverged(&store, &expected).await?;
    if conflicts > 0 {
        // Settled once two readings 200 ms apart agree (at most 5 s).
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let d = diverged(&store, &expected).await?;
            if d == diverged_before {
                break;
            }
            diverged_before = d;
        }
    }

    let feed = crate::feed::Feed::new(db.clone());
    let before_reconcile = feed.last_seq().await?;
    let mut repaired = 0;
    if opts.reconcile {
        say(
            &opts,
            "demo: deliveries done; reconciling against the sender's listing",
        );
        let reconciler = Reconciler::new(
            std::sync::Arc::new(config.clone()),
            store.clone(),
            Bookkeeping::new(db.clone()),
        )?;
        for (source, kind) in reconciler
            .kinds(None, None)
            .into_iter()
            .map(|(s, k)| (s.clone(), k.clone()))
            .collect::<Vec<_>>()
        {
            let report = reconciler
                .run_kind(
                    &source,
                    &kind,
                    &RunOptions::default(),
                    &CancellationToken::new(),
                    &|_| {},
                )
                .await;
            if let RunStatus::Failed { error } = &report.status {
                anyhow::bail!("reconciling {}: {error}", kind.name);
            }
            repaired += report.counts.applied;
        }
    }
    let diverged_at_end = diverged(&store, &expected).await?;
    // Every committed change reaches the application (pushed within a second while it
    // keeps up); wait for the last one, bounded.
    let changes = feed.last_seq().await?;
    let origins = change_origins(&feed, before_reconcile).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while application.counts().performed < changes as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let effects = application.counts();
    daemon.stop().await;
    drop(dir);
    Ok(DemoReport {
        seed: opts.seed,
        database: crate::config::redact_database_url(&database),
        orders: opts.orders,
        refunds: opts.refunds,
        deliveries,
        diverged_before_reconcile: diverged_before,
        repaired_by_reconcile: repaired,
        reconcile_ran: opts.reconcile,
        diverged_at_end,
        resources: expected.len(),
        changes,
        origins,
        effects,
        converged: diverged_at_end == 0 && effects.performed == changes as usize,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The demo's database: `given`, else a SQLite file in a temporary directory (kept
/// while the returned directory lives).
fn database(given: Option<&str>) -> anyhow::Result<(tempfile::TempDir, String)> {
    let dir = tempfile::Builder::new()
        .prefix("webhook-reconciler-demo")
        .tempdir()?;
    let url = given.map_or_else(
        || format!("sqlite://{}", dir.path().join("demo.db").display()),
        String::from,
    );
    Ok((dir, url))
}

/// The daemon the demo delivers to, running `serve` in this process until stopped.
struct Daemon {
    addr: std::net::SocketAddr,
    db: crate::db::Db,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Daemon {
    async fn start(config: &Config) -> anyhow::Result<Daemon> {
        let app = Application::build(config.clone())
            .await
            .context("starting the daemon")?;
        let (addr, db) = (app.local_addr(), app.db().clone());
        let stop = CancellationToken::new();
        let server = {
            let stop = stop.clone();
            tokio::spawn(app.run_until(async move { stop.cancelled().await }))
        };
        Ok(Daemon {
            addr,
            db,
            stop,
            server,
        })
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.server.await;
    }
}

fn say(opts: &DemoOptions, line: &str) {
    if opts.progress {
        eprintln!("{line}");
    }
}

fn progress_bar(opts: &DemoOptions) -> Option<indicatif::ProgressBar> {
    (opts.progress && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("delivering {bar:40} {pos}/{len} deliveries")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    })
}

/// Builds the sender's history: every order through a few statuses (sometimes two
/// states within one version), every refund once. The sender ends in the final state
/// of each; the events are returned in the order they happened.
fn scenario(sim: &SimSender, opts: &DemoOptions) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(opts.seed ^ 0x5eed);
    let mut events = Vec::new();
    for i in 0..opts.orders {
        let id = format!("ord_{i:06}");
        let amount = rng.random_range(500..50_000);
        let steps = rng.random_range(1..=STATUSES.len());
        // Versions are whole-second timestamps of the sender's clock.
        let mut version = 1_767_225_600 + rng.random_range(0..86_400);
        let mut last = json!(null);
        for (n, status) in STATUSES.iter().take(steps).enumerate() {
            let same_second = n > 0 && rng.random_bool(opts.same_second);
            if !same_second {
                version += rng.random_range(1..600);
            }
            let data = json!({"id": id, "version": version, "status": status, "amount": amount});
            events.push(json!({
                "id": format!("evt_{id}_{n}"),
                "type": "order.status_changed",
                "created_at": version,
                "data": data,
            }));
            last = data;
        }
        sim.put(
            "orders",
            &id,
            version,
            json!({"status": last["status"], "amount": amount}),
        );
    }
    for i in 0..opts.refunds {
        let id = format!("re_{i:06}");
        let order = format!("ord_{:06}", rng.random_range(0..opts.orders.max(1)));
        let amount = rng.random_range(100..5_000);
        events.push(json!({
            "id": format!("evt_{id}"),
            "type": "refund.succeeded",
            "data": {"id": id, "version": 0, "order_id": order, "amount": amount},
        }));
        sim.put(
            "refunds",
            &id,
            0,
            json!({"order_id": order, "amount": amount}),
        );
    }
    // The sender's event order interleaves resources.
    events.shuffle(&mut rng);
    events
}

/// (kind, id) -> (version, state) as the sender holds them now.
fn expected_state(sim: &SimSender) -> BTreeMap<(String, String), (i64, Value)> {
    let mut out = BTreeMap::new();
    for (sim_kind, kind) in [("orders", "order"), ("refunds", "refund")] {
        for (id, item) in sim.items(sim_kind) {
            let version = if kind == "order" {
                item["version"].as_i64().unwrap_or(0)
            } else {
                0
            };
            out.insert((kind.to_string(), id), (version, item));
        }
    }
    out
}

/// How many resources differ between the local table and the sender.
async fn diverged(
    store: &Store,
    expected: &BTreeMap<(String, String), (i64, Value)>,
) -> anyhow::Result<usize> {
    let mut by_kind: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (kind, id) in expected.keys() {
        by_kind.entry(kind.clone()).or_default().push(id.clone());
    }
    let mut local: BTreeMap<(String, String), StoredRow> = BTreeMap::new();
    for (kind, ids) in by_kind {
        let rows = store
            .stored_rows_with_states(&Key::new("shop", kind.as_str()), ids)
            .await?;
        for r in rows {
            local.insert((kind.clone(), r.id.clone()), r);
        }
    }
    Ok(expected
        .iter()
        .filter(|(key, (version, state))| match local.get(*key) {
            None => true,
            Some(row) => {
                row.deleted
                    || row.version != *version
                    || row
                        .state
                        .as_deref()
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        .as_ref()
                        != Some(state)
            }
        })
        .count())
}

/// The feed's changes by what wrote them; the three add up to every change.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ChangeOrigins {
    /// Written by a webhook (an `applied` or `conflict` delivery).
    pub webhooks: u64,
    /// Same-version conflicts settled from the sender's `get` while deliveries ran.
    pub conflicts_settled: u64,
    /// Written by the reconcile run.
    pub reconcile: u64,
}

async fn change_origins(
    feed: &crate::feed::Feed,
    before_reconcile: i64,
) -> anyhow::Result<ChangeOrigins> {
    let mut o = ChangeOrigins::default();
    let mut after = 0;
    loop {
        let page = feed
            .page(
                after,
                crate::feed::MAX_PAGE,
                &crate::feed::Filter::default(),
            )
            .await?;
        for c in &page.changes {
            match (c.origin.as_str(), c.seq <= before_reconcile) {
                ("webhook", _) => o.webhooks += 1,
                (_, true) => o.conflicts_settled += 1,
                (_, false) => o.reconcile += 1,
            }
            after = c.seq;
        }
        if page.changes.is_empty() || !page.more {
            return Ok(o);
        }
    }
}

/// The report as a person reads it.
pub fn print_report(r: &DemoReport) {
    let d = &r.deliveries;
    let answer = |k: &str| d.answers.get(k).copied().unwrap_or(0);
    let o = &r.origins;
    println!();
    println!("webhook-reconciler demo — seed {}, {}", r.seed, r.database);
    println!(
        "  the sender:          {} orders, {} refunds; {} events (each order's a newer version than the last)",
        r.orders, r.refunds, d.events
    );
    println!(
        "  requests sent:       {:>6}  for {} events; {} events never sent (duplicates {}, concurrent pairs {}, reordered {}, retried after a slow ack {}, after an error {})",
        d.requests,
        d.events - d.lost,
        d.lost,
        d.duplicates_sent,
        d.concurrent_duplicates_sent,
        d.reordered,
        d.retried_after_slow_ack,
        d.retried_after_error
    );
    println!(
        "  answers it saw:      applied {}, duplicate {}, stale {}, conflict {} (not the first answer of a slow ack: it came after the sender gave up)",
        answer("applied"),
        answer("duplicate"),
        answer("stale"),
        answer("conflict")
    );
    println!(
        "  after the webhooks:  {:>6}  of {} resources differ from the sender (a lost event matters only when no later event of its resource arrived)",
        r.diverged_before_reconcile, r.resources
    );
    if r.reconcile_ran {
        println!(
            "  reconcile wrote:     {:>6}  items (what differed)",
            r.repaired_by_reconcile
        );
    } else {
        println!("  reconcile wrote:          -  (skipped: --no-reconcile)");
    }
    println!(
        "  changes committed:   {:>6}  = {} by webhooks + {} conflicts settled through get + {} by reconcile",
        r.changes, o.webhooks, o.conflicts_settled, o.reconcile
    );
    println!(
        "  the application:     {:>6}  changes acted on; each once: {} ({} pushes redelivered and recognised by their webhook-id)",
        r.effects.performed,
        if r.effects.performed as i64 == r.changes {
            "YES"
        } else {
            "NO"
        },
        r.effects.redelivered
    );
    println!(
        "  equals the sender:  {:>6}  ({} of {} resources equal); the whole demo took {:.1}s",
        if r.converged { "YES" } else { "NO" },
        r.resources - r.diverged_at_end,
        r.resources,
        r.seconds
    );
}

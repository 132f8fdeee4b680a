//! Metrics (Prometheus text format): the recorder, and the counters, histograms and
//! gauges of this process. A leaf: recorded where things happen (`http::reply`,
//! `reconcile`, `retention`, the group commit), it imports none of them. What the
//! database says (freshness, pending fetches) is read by `health` when scraped, so
//! every replica reports the same truth.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::db::Db;

/// Delivery latency buckets, seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// How often the recorder is upkept (histogram samples folded in).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
static DELIVERIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Deliveries handed to the group commit and not yet answered.
static WRITES_IN_FLIGHT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
/// HTTP connections open (bounded by `http.max_connections`).
static HTTP_CONNECTIONS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// One delivery in the group commit's queue or transaction, for as long as it lives.
pub struct InFlightWrite(());

impl InFlightWrite {
    pub fn start() -> Self {
        WRITES_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(())
    }
}

impl Drop for InFlightWrite {
    fn drop(&mut self) {
        WRITES_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// An HTTP connection was accepted.
pub fn connection_opened() {
    HTTP_CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// An HTTP connection was closed.
pub fn connection_closed() {
    HTTP_CONNECTIONS.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
}

/// The daemon's in-memory queues (both bounded), as `/readyz` and `/metrics` show them:
/// what a soak watches for growth. (Fetches a 200 left to do are not among them: they
/// are kept in the database, `pending_fetches`.)
pub fn queues() -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    serde_json::json!({
        "writes_in_flight": WRITES_IN_FLIGHT.load(Relaxed),
        "http_connections": HTTP_CONNECTIONS.load(Relaxed),
    })
}

/// The process's memory as its allocators count it, for `/readyz` and `/metrics`: the
/// Rust heap (jemalloc's bytes allocated, and the pages it holds resident) and, on
/// SQLite, the heap SQLite holds itself. RSS less these is code, stacks and the C
/// libraries' own malloc: a rise of RSS can then be put where it is.
pub fn memory(db: &Db) -> serde_json::Value {
    use tikv_jemalloc_ctl::{epoch, stats};
    let mut m = serde_json::Map::new();
    // The statistics are a snapshot taken at the last epoch.
    if epoch::advance().is_ok() {
        if let Ok(n) = stats::allocated::read() {
            m.insert("allocated_bytes".into(), n.into());
        }
        if let Ok(n) = stats::resident::read() {
            m.insert("resident_bytes".into(), n.into());
        }
    }
    if let Some(n) = db.sqlite_memory_bytes() {
        m.insert("sqlite_bytes".into(), n.into());
    }
    m.into()
}

/// Each pool's connections for `/readyz`: open now, and opened since the start. A
/// count that rises while nothing failed is a pool that reconnects.
pub fn pools(db: &Db) -> serde_json::Value {
    db.pool_states()
        .into_iter()
        .map(|(pool, s)| {
            (
                pool.to_string(),
                serde_json::json!({"open": s.open, "idle": s.idle, "opened_total": s.opened_total}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Counts one handled delivery (any answer), for STATUS=.
pub fn count_delivery() {
    DELIVERIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Deliveries handled by this process.
pub fn deliveries() -> u64 {
    DELIVERIES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Installs the process-wide metrics recorder (once; later calls reuse it).
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("webhook_delivery_duration_seconds".into()),
                    LATENCY_BUCKETS,
                )
                .ok()?
                .install_recorder();
            match recorder {
                Ok(h) => {
                    // Histogram samples wait in the recorder until it is rendered or
                    // upkept: without anyone scraping /metrics they would grow for ever
                    // (~20 bytes a delivery). Upkeep on a timer keeps memory flat.
                    let upkept = h.clone();
                    let started = std::thread::Builder::new()
                        .name("metrics-upkeep".into())
                        .spawn(move || {
                            loop {
                                std::thread::sleep(UPKEEP_EVERY);
                                upkept.run_upkeep();
                            }
                        });
                    if let Err(e) = started {
                        tracing::warn!(error = %e, "metrics upkeep not started; histograms drain only when /metrics is scraped");
                    }
                    Some(h)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        })
        .as_ref()
}

/// The `/metrics` body: the recorded series, with this process's gauges (its queues,
/// memory, pools) read now. The database's gauges are set by `health::render` first.
pub fn render(db: &Db) -> String {
    {
        use std::sync::atomic::Ordering::Relaxed;
        metrics::gauge!("webhook_writes_in_flight").set(WRITES_IN_FLIGHT.load(Relaxed) as f64);
        metrics::gauge!("http_connections_open").set(HTTP_CONNECTIONS.load(Relaxed) as f64);
    }
    let memory = memory(db);
    for (key, name) in [
        ("allocated_bytes", "jemalloc_allocated_bytes"),
        ("resident_bytes", "jemalloc_resident_bytes"),
        ("sqlite_bytes", "sqlite_memory_bytes"),
    ] {
        if let Some(n) = memory[key].as_f64() {
            metrics::gauge!(name).set(n);
        }
    }
    for (pool, state) in db.pool_states() {
        metrics::gauge!("db_pool_connections", "pool" => pool, "state" => "idle")
            .set(f64::from(state.idle));
        metrics::gauge!("db_pool_connections", "pool" => pool, "state" => "in_use")
            .set(f64::from(state.open.saturating_sub(state.idle)));
        metrics::counter!("db_connections_opened_total", "pool" => pool)
            .absolute(state.opened_total);
    }
    install().map(PrometheusHandle::render).unwrap_or_default()
}

/// Records one finished reconcile run.
pub fn record_run(
    source: &str,
    kind: &str,
    status: &str,
    counts: &crate::bookkeeping::RunCounts,
    took: Duration,
) {
    let (s, k) = (source.to_string(), kind.to_string());
    metrics::counter!("reconcile_runs_total", "source" => s.clone(), "kind" => k.clone(), "status" => status.to_string()).increment(1);
    metrics::histogram!("reconcile_run_duration_seconds", "source" => s.clone(), "kind" => k.clone()).record(took.as_secs_f64());
    if status == "succeeded" {
        for (class, n) in [
            ("missing", counts.missing),
            ("newer_remote", counts.newer_remote),
            ("differing", counts.differing),
            ("newer_local", counts.newer_local),
            ("equal", counts.equal),
        ] {
            metrics::gauge!("reconcile_drift_items", "source" => s.clone(), "kind" => k.clone(), "class" => class).set(n as f64);
        }
    }
    metrics::counter!("reconcile_items_applied_total", "source" => s, "kind" => k)
        .increment(counts.applied.max(0) as u64);
}

/// A subject (a configured source, or a fixed name) and a reason of ours.
type LineKey = (String, &'static str);
/// When its last line was written, and how many were not written since.
type LastLine = (std::time::Instant, u64);

/// The repeated log lines' last times. Bounded: subjects and reasons are.
static LOG_LINES: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<LineKey, LastLine>>,
> = std::sync::LazyLock::new(Default::default);

/// Whether to write a repeated log line now: `Some(n)` with the `n` occurrences not
/// logged since the last line, at most once a second per subject and reason.
pub fn log_line_now(subject: &str, reason: &'static str) -> Option<u64> {
    let mut seen = LOG_LINES.lock().unwrap_or_else(|p| p.into_inner());
    let now = std::time::Instant::now();
    match seen.get_mut(&(subject.to_string(), reason)) {
        Some((last, quiet)) if now.duration_since(*last) < Duration::from_secs(1) => {
            *quiet += 1;
            None
        }
        Some((last, quiet)) => {
            let n = *quiet;
            (*last, *quiet) = (now, 0);
            Some(n)
        }
        None => {
            seen.insert((subject.to_string(), reason), (now, 0));
            Some(0)
        }
    }
}

//! What the soak samples from outside the daemon, as an operator would: /proc (RSS,
//! descriptors, threads), PostgreSQL's pg_stat_activity (connections; on SQLite
//! `/readyz`'s pools) and `/readyz`'s queue depths, connections opened since the start
//! and memory (the Rust heap, and on SQLite the heap SQLite holds itself),
//! and on SQLite how long the disk takes to sync a small write next to the database (a
//! commit waits for that: synchronous = FULL); and the arithmetic over the samples.

use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, RunQueryDsl};

/// One sample of the daemon.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at: f64,
    pub rss_mib: f64,
    /// RSS's anonymous part (heaps, stacks): where a leak shows.
    pub anon_mib: f64,
    pub fds: f64,
    pub threads: f64,
    pub connections: f64,
    /// Database connections the daemon has opened since it started (`/readyz`'s
    /// pools): what it costs to reconnect is paid once each.
    pub opened_total: f64,
    pub writes_in_flight: f64,
    /// Fetches pending in the database (all sources).
    pub fetches_pending: f64,
    /// Connections the daemon has accepted and not closed (`http.max_connections`).
    pub http_connections: f64,
    /// A 4 KiB write and fsync next to the SQLite database, in ms (NaN on PostgreSQL,
    /// whose throwaway cluster runs with fsync off).
    pub fsync_ms: f64,
    /// The Rust heap: what jemalloc holds resident (`/readyz`'s `memory`), in MiB.
    pub heap_mib: f64,
    /// The heap SQLite holds itself, in MiB; NaN on PostgreSQL.
    pub sqlite_mib: f64,
}

/// Writes and syncs 4 KiB in `dir`, as a commit does; its time in ms.
fn fsync_ms(dir: &std::path::Path) -> f64 {
    use std::io::Write;
    let t = std::time::Instant::now();
    let synced = std::fs::File::create(dir.join("fsync-probe"))
        .and_then(|mut f| f.write_all(&[0u8; 4096]).and_then(|()| f.sync_all()));
    match synced {
        Ok(()) => t.elapsed().as_secs_f64() * 1000.0,
        Err(_) => f64::NAN,
    }
}

fn status_field(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn fds(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(f64::NAN, |d| d.count() as f64)
}

pub fn scalar_pg(url: &str, sql: &str) -> Option<i64> {
    #[derive(diesel::QueryableByName)]
    struct V {
        #[diesel(sql_type = BigInt)]
        v: i64,
    }
    let mut c = PgConnection::establish(url).ok()?;
    diesel::sql_query(sql)
        .get_result::<V>(&mut c)
        .ok()
        .map(|v| v.v)
}

/// Samples the daemon `pid` now; `pg` is (server URL, database name) on PostgreSQL,
/// `sqlite_dir` the SQLite database's directory.
pub async fn sample(
    at: f64,
    pid: u32,
    pg: Option<(&str, &str)>,
    sqlite_dir: Option<&std::path::Path>,
    client: &reqwest::Client,
    readyz: &str,
) -> Sample {
    let ready = match client.get(readyz).send().await {
        Ok(r) => r.json::<serde_json::Value>().await.unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    };
    let pools = |k: &str| {
        ready["pools"].as_object().map_or(f64::NAN, |pools| {
            pools.values().filter_map(|p| p[k].as_f64()).sum()
        })
    };
    // On PostgreSQL the server's count, which also sees a connection the pool lost
    // track of; a SQLite file has no such count.
    let connections = match pg {
        Some((server, name)) => scalar_pg(
            &format!("{server}/test"),
            &format!("SELECT COUNT(*) AS v FROM pg_stat_activity WHERE datname = '{name}'"),
        )
        .map_or(f64::NAN, |n| n as f64),
        None => pools("open"),
    };
    let q = |k: &str| ready["queues"][k].as_f64().unwrap_or(f64::NAN);
    let memory_mib = |k: &str| {
        ready["memory"][k]
            .as_f64()
            .map_or(f64::NAN, |b| b / 1048576.0)
    };
    let fsync_ms = match sqlite_dir.map(std::path::Path::to_path_buf) {
        Some(dir) => tokio::task::spawn_blocking(move || fsync_ms(&dir))
            .await
            .unwrap_or(f64::NAN),
        None => f64::NAN,
    };
    Sample {
        at,
        rss_mib: status_field(pid, "VmRSS:") / 1024.0,
        anon_mib: status_field(pid, "RssAnon:") / 1024.0,
        fds: fds(pid),
        threads: status_field(pid, "Threads:"),
        connections,
        opened_total: pools("opened_total"),
        writes_in_flight: q("writes_in_flight"),
        // `+ 0.0`: an empty sum of f64 is -0.0, which would print as "-0".
        fetches_pending: ready["fetches"].as_array().map_or(f64::NAN, |f| {
            f.iter().filter_map(|c| c["pending"].as_f64()).sum::<f64>() + 0.0
        }),
        http_connections: q("http_connections"),
        fsync_ms,
        heap_mib: memory_mib("resident_bytes"),
        sqlite_mib: memory_mib("sqlite_bytes"),
    }
}

/// Least-squares slope of `y` over `at` (seconds), per hour; NaN samples are left out.
pub fn slope_per_hour(samples: &[Sample], y: impl Fn(&Sample) -> f64) -> f64 {
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| (s.at, y(s)))
        .filter(|(_, v)| v.is_finite())
        .collect();
    let n = pts.len() as f64;
    if n < 2.0 {
        return f64::NAN;
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let var: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    3600.0 * cov / var
}

/// The `q` quantile (0..1) of `values` (sorted here).
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 * q) as usize).min(values.len() - 1)]
}

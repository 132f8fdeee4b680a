//! The systemd protocol for `serve`: READY=1 once migrations ran and the listener is
//! bound, WATCHDOG=1 only while the runtime runs tasks and the database answers (a
//! stalled or wedged process stops pinging and systemd restarts it), STATUS= with a one-line
//! summary, STOPPING=1 at shutdown. Outside systemd (no NOTIFY_SOCKET) every call is a
//! no-op.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::Bookkeeping;
use crate::config::Config;
use crate::db::Db;

/// How often STATUS= is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(10);

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[
        NotifyState::Stopping,
        NotifyState::Status("shutting down: draining requests and runs"),
    ]);
}

/// Pings the watchdog at half its interval, each time only after the daemon proved it
/// can serve and write: the runtime runs a fresh task promptly, and the database
/// answers. It never asks through the public listener: a flood of anonymous clients
/// there must not make systemd restart the daemon (and the caps would queue the probe
/// behind them).
pub async fn watchdog(db: Db, cancel: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut tick = tokio::time::interval(interval / 2);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokio::time::timeout(interval / 4, alive(&db)).await {
            Ok(Ok(())) => send(&[NotifyState::Watchdog]),
            Ok(Err(why)) => tracing::warn!(why, "not pinging the systemd watchdog"),
            Err(_) => tracing::warn!(
                "the liveness check took longer than a quarter of WatchdogSec; not pinging the systemd watchdog"
            ),
        }
    }
}

/// The runtime schedules a new task, and the database answers a query.
async fn alive(db: &Db) -> Result<(), String> {
    tokio::spawn(async {})
        .await
        .map_err(|e| format!("the runtime did not run a task: {e}"))?;
    match db.is_migrated().await {
        Ok(true) => Ok(()),
        Ok(false) => Err("the database lost its schema".into()),
        Err(e) => Err(format!("the database does not answer: {e}")),
    }
}

/// Keeps STATUS= current: deliveries handled, and the age of the oldest last
/// successful reconcile.
pub async fn status_line(book: Bookkeeping, config: Arc<Config>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(STATUS_EVERY);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let deliveries = crate::observability::deliveries();
        let reconcile = match crate::health::freshness(&book, &config).await {
            Ok(kinds) if kinds.is_empty() => "no reconciled kinds".to_string(),
            Ok(kinds) => {
                let overdue = kinds.iter().filter(|k| k.overdue).count();
                let oldest = kinds
                    .iter()
                    .filter_map(|k| k.last_success_age_seconds)
                    .fold(None, |m: Option<f64>, a| Some(m.map_or(a, |m| m.max(a))));
                match oldest {
                    Some(a) => {
                        format!("oldest last successful reconcile {a:.0}s ago, {overdue} overdue")
                    }
                    None => "no successful reconcile yet".into(),
                }
            }
            Err(_) => "database unavailable".into(),
        };
        let line = format!("{deliveries} deliveries; {reconcile}");
        send(&[NotifyState::Status(&line)]);
    }
}

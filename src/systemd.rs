//! The systemd protocol for `serve`: READY=1 once migrations ran and the listener is
//! bound, WATCHDOG=1 only while the HTTP loop answers our own /healthz (a stalled or
//! wedged process stops pinging and systemd restarts it), STATUS= with a one-line
//! summary, STOPPING=1 at shutdown. Outside systemd (no NOTIFY_SOCKET) every call is a
//! no-op.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::bookkeeping::Bookkeeping;
use crate::config::Config;

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

/// Pings the watchdog at half its interval, each time only after our own `/healthz`
/// answered 200 through the real listener.
pub async fn watchdog(listen: SocketAddr, cancel: CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let target = if listen.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], listen.port()))
    } else {
        listen
    };
    let mut tick = tokio::time::interval(interval / 2);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokio::time::timeout(interval / 4, healthz(target)).await {
            Ok(true) => send(&[NotifyState::Watchdog]),
            _ => tracing::warn!("own /healthz did not answer; not pinging the systemd watchdog"),
        }
    }
}

async fn healthz(addr: SocketAddr) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).await.is_ok() && &buf[9..12] == b"200"
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
        let reconcile = match crate::observability::freshness(&book, &config).await {
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

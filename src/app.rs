//! Building and running `serve`: database, migrations, listener, router, the reconcile
//! scheduler and the fetcher of pending fetches, until shutdown.

use crate::bookkeeping::Bookkeeping;
use crate::feed::Feed;
use crate::feed::push::Pusher;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, Scheme};
use crate::db::Db;
use crate::http::{HttpState, router};
use crate::reconcile::fetches::Fetcher;
use crate::reconcile::{Reconciler, schedule};
use crate::retention::Owners;
use crate::store::Store;
use crate::webhook::Receiver;

/// Shutdown waits this long for in-flight requests and the current reconcile page;
/// shorter than the unit's TimeoutStopSec (90 s by default).
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

/// A built, bound, not yet serving daemon. Tests build it on port 0 and read
/// [`Application::local_addr`].
pub struct Application {
    listener: TcpListener,
    router: crate::http::Routes,
    /// The operators' listener and its routes, when `http.admin_listen` is set.
    admin: Option<(crate::http::AdminListener, crate::http::Routes)>,
    db: Db,
    reconciler: Reconciler,
    /// One per configured consumer of the change feed.
    pushers: Vec<Pusher>,
    /// The tables' owners, for retention.
    owners: Owners,
    config: Arc<Config>,
}

impl Application {
    /// Connects to the database, runs migrations (unless `database.migrate = false`) and
    /// binds the listener.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let db = Db::connect(&config.database)
            .with_context(|| format!("database {}", config.database.redacted_url()))?;
        if config.database.migrate {
            let db2 = db.clone();
            let applied = tokio::task::spawn_blocking(move || db2.migrate())
                .await
                .context("migration task")??;
            if !applied.is_empty() {
                tracing::info!(?applied, "database migrations applied");
            }
        }
        let store = Store::new(db.clone());
        if config.database.migrate {
            let views = store.sync_views(&config).await?;
            if let Some(line) = views.summary() {
                tracing::info!("{line}");
            }
        }
        let mut receivers = Vec::new();
        for w in &config.warnings {
            tracing::warn!(key = w.key, "configuration: {}", w.message);
        }
        for source in &config.sources {
            if source.webhook.scheme == Scheme::None {
                tracing::warn!(
                    source = source.name,
                    "signature verification is OFF (scheme = \"none\"): anyone who can reach {} can write to this source",
                    source.webhook.path
                );
            }
            receivers.push((
                source.webhook.path.clone(),
                Receiver::new(source, store.clone()),
            ));
        }
        let listener = TcpListener::bind(config.http.listen)
            .await
            .with_context(|| format!("cannot listen on {} (http.listen)", config.http.listen))?;
        let config = Arc::new(config);
        crate::observability::install();
        let book = Bookkeeping::new(db.clone());
        let routers = router(HttpState {
            receivers,
            db: db.clone(),
            book: book.clone(),
            config: config.clone(),
            store: store.clone(),
        });
        let admin = match (&config.http.admin_listen, routers.admin) {
            (Some(at), Some(routes)) => Some((
                crate::http::AdminListener::bind(at)
                    .await
                    .with_context(|| format!("cannot listen on {at} (http.admin_listen)"))?,
                routes,
            )),
            _ => None,
        };
        let owners = Owners {
            store: store.clone(),
            book: book.clone(),
            feed: Feed::new(db.clone()),
        };
        let pushers = config
            .consumers
            .iter()
            .map(|c| {
                Pusher::new(
                    c.clone(),
                    db.clone(),
                    book.clone(),
                    store.outbox().published(),
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let reconciler = Reconciler::new(config.clone(), store, book)?;
        Ok(Self {
            listener,
            router: routers.public,
            admin,
            db,
            reconciler,
            pushers,
            owners,
            config,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        // A bound listener always has an address; 0.0.0.0:0 would only show in a log.
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The operators' listener's address (`http.admin_listen`), if any.
    pub fn admin_addr(&self) -> Option<String> {
        self.admin.as_ref().map(|(l, _)| l.local_addr())
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Serves until `shutdown` completes: then stops accepting, lets in-flight requests
    /// finish and running reconciles finish their current page, within
    /// [`DRAIN_DEADLINE`].
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let listen = self.local_addr();
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let mut scheduler =
            schedule::start(self.reconciler.clone(), cancel.clone(), tracker.clone()).await?;
        // What earlier 200s left to fetch (this process's or a dead one's) is taken
        // from the database at once.
        tracker.spawn(Fetcher::new(self.reconciler.clone()).run(cancel.clone()));
        // Changes committed and never numbered (a process killed between its commit and
        // its pass) are numbered at start and looked for every second.
        tracker.spawn(self.owners.store.outbox().clone().run(cancel.clone()));
        tracker.spawn(prune_loop(
            self.owners.clone(),
            self.config.clone(),
            cancel.clone(),
        ));
        for pusher in self.pushers {
            tracker.spawn(pusher.run(cancel.clone()));
        }
        tracker.spawn(consumer_lag_loop(
            self.db.clone(),
            self.config.clone(),
            cancel.clone(),
        ));
        tracker.spawn(crate::systemd::watchdog(self.db.clone(), cancel.clone()));
        tracker.spawn(crate::systemd::status_line(
            self.owners.book.clone(),
            self.config.clone(),
            cancel.clone(),
        ));
        tracing::info!(%listen, "serving");
        crate::systemd::ready(&format!("serving on {listen}"));
        let stop = cancel.clone();
        if let Some((listener, routes)) = self.admin {
            tracing::info!(
                admin_listen = listener.local_addr(),
                "serving the operators' routes"
            );
            let stop = cancel.clone();
            tracker.spawn(async move {
                let served = listener
                    .serve(routes, async move { stop.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "the admin listener stopped");
                }
            });
        }
        let served =
            crate::http::serve(self.listener, self.router, &self.config.http, async move {
                shutdown.await;
                stop.cancel();
            })
            .await
            .context("HTTP server");
        cancel.cancel();
        crate::systemd::stopping();
        if let Some(s) = scheduler.as_mut() {
            if let Err(e) = s.shutdown().await {
                tracing::warn!(error = %e, "scheduler shutdown");
            }
        }
        tracker.close();
        if tokio::time::timeout(DRAIN_DEADLINE, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "reconcile runs still going after the drain deadline; exiting anyway (their pages are committed, the next run resumes)"
            );
        }
        served
    }
}

/// Retention under `serve`: a first pass soon after start (so a restart loop still
/// prunes), then every `retention.every`.
async fn prune_loop(owners: Owners, config: Arc<Config>, cancel: CancellationToken) {
    let every = config.retention.every;
    let first = every.min(Duration::from_secs(60));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        match crate::retention::prune(&owners, &config, &cancel).await {
            Ok(r) => tracing::info!(
                processed_events = r.processed_events,
                reconcile_runs = r.reconcile_runs,
                dead_letters = r.dead_letters,
                seconds = r.seconds,
                "retention pass done"
            ),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; the next one retries"),
        }
    }
}

/// Consumer lag (changes waiting, age of the oldest) into the metrics, every few
/// seconds.
async fn consumer_lag_loop(db: Db, config: Arc<Config>, cancel: CancellationToken) {
    if config.consumers.is_empty() {
        return;
    }
    let feed = Feed::new(db);
    loop {
        for c in &config.consumers {
            if let Ok(lag) = feed.lag(c).await {
                metrics::gauge!("feed_consumer_waiting", "consumer" => c.name.clone())
                    .set(lag.waiting as f64);
                metrics::gauge!("feed_consumer_oldest_seconds", "consumer" => c.name.clone())
                    .set(lag.oldest_seconds);
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

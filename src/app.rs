//! Building and running `serve`: database, migrations, listener, router, until shutdown.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::config::{Config, Scheme};
use crate::db::Db;
use crate::http::{HttpState, router};
use crate::store::Store;
use crate::webhook::Receiver;

/// A built, bound, not yet serving daemon. Tests build it on port 0 and read
/// [`Application::local_addr`].
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    db: Db,
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
        let mut receivers = Vec::new();
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
        let router = router(HttpState {
            receivers,
            db: db.clone(),
            max_body: config.http.max_body,
        });
        Ok(Self {
            listener,
            router,
            db,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        // A bound listener always has an address; 0.0.0.0:0 would only show in a log.
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Serves until `shutdown` completes, then stops accepting and lets in-flight
    /// requests finish.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        tracing::info!(listen = %self.local_addr(), "serving");
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .context("HTTP server")
    }
}

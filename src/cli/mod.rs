//! The command line: parse, load the configuration, run one command, return its exit
//! code. `main` only calls [`run`].

mod reconcile;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::app::Application;
use crate::config::{CONFIG_ENV, Config, ConfigError};
use crate::db::Db;

/// Exit code for bad usage or invalid configuration.
pub const EXIT_CONFIG: u8 = 2;
/// Exit code when the work failed.
pub const EXIT_FAILED: u8 = 1;

/// Keeps a local database exactly in step with the resources a webhook sender owns.
#[derive(Debug, Parser)]
#[command(name = "webhook-reconciler", version, about)]
pub struct Cli {
    /// Configuration file (TOML). Without it, built-in defaults; environment variables
    /// WEBHOOK_RECONCILER__SECTION__KEY override either.
    #[arg(long, global = true, env = CONFIG_ENV, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the webhook HTTP server with /healthz and /readyz.
    Serve,
    /// Apply the embedded database migrations and exit.
    Migrate,
    /// Validate the configuration (and that every secret resolves) without side effects.
    CheckConfig,
    /// Delete processed event ids, old reconcile runs and dead letters past retention.
    Prune,
    /// Recent reconcile runs, drift, age of the last success, dead letters, last prune.
    Status {
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Reconcile now, once: page through the senders' listings and repair what differs.
    Reconcile {
        /// Only this source.
        #[arg(long)]
        source: Option<String>,
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Write nothing; report what would change and the first ids.
        #[arg(long)]
        dry_run: bool,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the parsed command line; errors of the work itself are printed here, once.
pub async fn run(cli: Cli) -> ExitCode {
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    crate::telemetry::init(&config.log);
    let result = match cli.command {
        Command::CheckConfig => {
            print_config_summary(&config);
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => migrate(&config).await.map(|()| ExitCode::SUCCESS),
        Command::Prune => status::prune(&config).await.map(|()| ExitCode::SUCCESS),
        Command::Status { json } => status::status(&config, json)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Serve => serve(config).await.map(|()| ExitCode::SUCCESS),
        Command::Reconcile {
            source,
            kind,
            dry_run,
            json,
        } => {
            reconcile::run(
                config,
                reconcile::Args {
                    source,
                    kind,
                    dry_run,
                    json,
                },
            )
            .await
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn config_error(e: &ConfigError) -> ExitCode {
    eprint!("{e}");
    ExitCode::from(EXIT_CONFIG)
}

fn print_config_summary(config: &Config) {
    println!("configuration OK");
    println!("  database: {}", config.database.redacted_url());
    println!("  listen:   {}", config.http.listen);
    for s in &config.sources {
        println!(
            "  source {}: POST {} ({}, {} secret{}), kinds: {}",
            s.name,
            s.webhook.path,
            s.webhook.scheme.name(),
            s.webhook.secrets.len(),
            if s.webhook.secrets.len() == 1 {
                ""
            } else {
                "s"
            },
            s.kinds
                .iter()
                .map(|k| k.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

async fn migrate(config: &Config) -> anyhow::Result<()> {
    let db = Db::connect(&config.database)?;
    let applied = tokio::task::spawn_blocking(move || db.migrate()).await??;
    if applied.is_empty() {
        println!("database is up to date");
    } else {
        println!(
            "applied {} migration(s): {}",
            applied.len(),
            applied.join(", ")
        );
    }
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let app = Application::build(config).await?;
    app.run_until(crate::shutdown::signal()).await
}

//! The command line: parse, load the configuration, run one command, return its exit
//! code. `main` only calls [`run`].

mod generate;
mod operate;
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

/// The version `--version` prints: the crate's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WR_GIT_COMMIT"),
    ")"
);

/// Keeps a local database exactly in step with the resources a webhook sender owns.
#[derive(Debug, Parser)]
#[command(name = "webhook-reconciler", version = VERSION, about)]
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
    /// Run the webhook receiver, the reconcile schedule and retention, with /healthz,
    /// /readyz and /metrics.
    Serve,
    /// Apply the embedded database migrations and exit.
    Migrate,
    /// Validate the configuration (and that every secret resolves) without side effects.
    CheckConfig,
    /// Print the effective configuration as TOML: presets applied, environment
    /// overrides merged, secrets redacted. Keys not shown take their defaults.
    Config,
    /// Delete processed event ids, old reconcile runs and dead letters past retention.
    Prune,
    /// Recent reconcile runs, drift, age of the last success, dead letters, last prune.
    Status {
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The zero-setup showcase: a simulated sender with real faults, the daemon on an
    /// embedded SQLite file, a reconcile, and a report. Exits 0 only if the local state
    /// ends equal to the sender's.
    Demo(DemoArgs),
    /// Print the change feed as JSON lines, oldest first.
    Changes {
        /// Only changes with a seq above this one.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// At most this many (without --follow).
        #[arg(long)]
        limit: Option<i64>,
        /// Keep printing new changes as they are committed (until Ctrl-C).
        #[arg(long)]
        follow: bool,
    },
    /// Reconcile now, once: page through the senders' listings and repair what differs.
    /// `reconcile pause|resume SOURCE [KIND]` stops or restarts a kind's reconciling on
    /// every replica.
    #[command(args_conflicts_with_subcommands = true)]
    Reconcile {
        #[command(subcommand)]
        action: Option<operate::PauseAction>,
        /// Only this source.
        #[arg(long)]
        source: Option<String>,
        /// Only this account of a many-account source (default: each enabled one).
        #[arg(long, requires = "source")]
        account: Option<String>,
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Write nothing; report what would change (and what deletion detection
        /// would tombstone) and the first ids.
        #[arg(long)]
        dry_run: bool,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
        /// Wait for a kind another process is reconciling, instead of skipping it.
        #[arg(long)]
        wait: bool,
        /// Let deletion detection tombstone more than the kind's max_delete_fraction
        /// (check the ids first with --dry-run).
        #[arg(long)]
        allow_mass_delete: bool,
    },
    /// Authentic deliveries that could not be applied (a mapping pointing at the wrong
    /// field, data the database refused): list them, retry them after the fix, discard
    /// them.
    DeadLetters {
        #[command(subcommand)]
        action: operate::DeadLettersAction,
    },
    /// One resource's story: its row, every event claimed for it (id, type, outcome,
    /// time), its changes (seq, version, origin) and the reconcile runs that wrote it.
    Explain {
        source: String,
        kind: String,
        id: String,
        /// The account of a many-account source.
        #[arg(long)]
        account: Option<String>,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The change feed's consumers: list them, rewind one (changes after a seq are
    /// pushed again, with the same ids), pause or resume one.
    Consumers {
        #[command(subcommand)]
        action: operate::ConsumersAction,
    },
    /// The accounts of a many-account source ([sources.NAME.accounts]): a delivery is
    /// applied to the account its signed body names only when it is registered here.
    Accounts {
        #[command(subcommand)]
        action: AccountsAction,
    },
    /// Make secrets: `secret new` prints a fresh Standard Webhooks key (whsec_ + 32
    /// random bytes in base64), for a consumer's `secret`; `--raw` without whsec_, for
    /// accounts.key.
    Secret {
        #[command(subcommand)]
        action: SecretAction,
    },
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one page per command into a directory.
    Man {
        /// Write webhook-reconciler.1 and one page per subcommand here.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountsAction {
    /// Register an account (enabled; one registered before is enabled again); its first
    /// full sync starts within seconds under `serve`.
    Add {
        source: String,
        account: String,
        /// The account's own API credential, read from this file (kept encrypted
        /// with accounts.key, never printed).
        #[arg(long, conflicts_with = "token_env")]
        token_file: Option<String>,
        /// The account's own API credential, read from this environment variable.
        #[arg(long)]
        token_env: Option<String>,
        /// The account's own API base URL (a Shopify shop's), instead of the source's.
        #[arg(long)]
        api_base: Option<String>,
    },
    /// The registered accounts, of one source or all.
    List {
        source: Option<String>,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Stop applying the account's deliveries (answered `ignored`); its rows stay.
    Disable { source: String, account: String },
    /// Apply the account's deliveries again.
    Enable { source: String, account: String },
    /// Unregister the account and tombstone its rows (each a change in the feed).
    Remove {
        source: String,
        account: String,
        /// Delete its rows instead of tombstoning them (no change is recorded).
        #[arg(long)]
        purge: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretAction {
    /// Print a new whsec_ key on stdout (nothing else is written).
    New {
        /// 32 random bytes in plain base64, without whsec_ (for accounts.key).
        #[arg(long)]
        raw: bool,
    },
}

/// `demo` flags.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Orders the sender owns (each goes through up to 6 statuses).
    #[arg(long, default_value_t = 2000)]
    orders: usize,
    /// Refunds the sender owns (insert-once).
    #[arg(long, default_value_t = 500)]
    refunds: usize,
    /// Seed of the scenario and of the faults.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Share of events never delivered.
    #[arg(long, default_value_t = 0.05)]
    loss: f64,
    /// Share of events delivered again later.
    #[arg(long, default_value_t = 0.10)]
    duplicate: f64,
    /// Share of events delivered twice at the same moment.
    #[arg(long, default_value_t = 0.05)]
    concurrent_duplicate: f64,
    /// Share of deliveries swapped with an earlier one.
    #[arg(long, default_value_t = 0.20)]
    reorder: f64,
    /// Share of deliveries whose acknowledgement comes after the sender's timeout.
    #[arg(long, default_value_t = 0.03)]
    slow_ack: f64,
    /// Share of order updates that reuse the previous version (same-second timestamps).
    #[arg(long, default_value_t = 0.02)]
    same_second: f64,
    /// Concurrent deliveries.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Database URL (default: a SQLite file in a temporary directory).
    #[arg(long)]
    database: Option<String>,
    /// Skip reconciliation: shows what the webhooks alone leave behind.
    #[arg(long)]
    no_reconcile: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// A Stripe Connect platform with this many connected accounts instead: each
    /// account's customers and products, one registered only after its deliveries, all
    /// reconciled by the shared per-kind schedule.
    #[arg(long, value_name = "N", conflicts_with_all = ["orders", "refunds", "no_reconcile", "same_second"])]
    accounts: Option<usize>,
}

fn rate(name: &str, v: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("--{name} {v} is not a rate between 0 and 1"))
    }
}

async fn demo(a: DemoArgs) -> anyhow::Result<ExitCode> {
    let checked = (|| -> Result<crate::simulator::deliver::Faults, String> {
        Ok(crate::simulator::deliver::Faults {
            loss: rate("loss", a.loss)?,
            duplicate: rate("duplicate", a.duplicate)?,
            concurrent_duplicate: rate("concurrent-duplicate", a.concurrent_duplicate)?,
            reorder: rate("reorder", a.reorder)?,
            slow_ack: rate("slow-ack", a.slow_ack)?,
        })
    })();
    let faults = match (checked, rate("same-second", a.same_second)) {
        (Ok(f), Ok(_)) => f,
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    if let Some(accounts) = a.accounts {
        let report = crate::demo::accounts::run(crate::demo::accounts::AccountsDemoOptions {
            accounts,
            seed: a.seed,
            loss: faults.loss,
            duplicate: faults.duplicate,
            concurrency: a.concurrency.max(1),
            database: a.database,
            progress: !a.json,
        })
        .await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            crate::demo::accounts::print_report(&report);
        }
        return Ok(if report.converged {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILED)
        });
    }
    let report = crate::demo::run(crate::demo::DemoOptions {
        orders: a.orders,
        refunds: a.refunds,
        seed: a.seed,
        faults,
        same_second: a.same_second,
        concurrency: a.concurrency.max(1),
        database: a.database,
        reconcile: !a.no_reconcile,
        progress: !a.json,
    })
    .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        crate::demo::print_report(&report);
    }
    Ok(if report.converged {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    })
}

/// Runs the parsed command line; errors of the work itself are printed here, once.
pub async fn run(cli: Cli) -> ExitCode {
    if let Command::Demo(args) = cli.command {
        // The demo brings its own configuration (config/demo.toml) and keeps the
        // terminal for its report: warnings only, unless RUST_LOG says otherwise.
        crate::telemetry::init(&crate::config::LogConfig {
            format: crate::config::LogFormat::Human,
            level: "warn".into(),
        });
        return match demo(args).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(EXIT_FAILED)
            }
        };
    }
    // Generated from the definition alone: no configuration is read.
    let generated = match &cli.command {
        Command::Completions { shell } => Some(generate::completions(*shell)),
        Command::Man { dir } => Some(generate::man(dir.as_deref())),
        Command::Secret {
            action: SecretAction::New { raw: false },
        } => {
            println!("{}", crate::signature::new_secret());
            Some(Ok(()))
        }
        Command::Secret {
            action: SecretAction::New { raw: true },
        } => Some(
            crate::accounts::credential::new_key()
                .map(|key| println!("{key}"))
                .map_err(anyhow::Error::from),
        ),
        _ => None,
    };
    if let Some(result) = generated {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(EXIT_FAILED)
            }
        };
    }
    if let Command::Config = cli.command {
        return match Config::effective_toml(cli.config.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => config_error(&e),
        };
    }
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
        // Handled above.
        Command::Demo(_)
        | Command::Config
        | Command::Completions { .. }
        | Command::Man { .. }
        | Command::Secret { .. } => Ok(ExitCode::SUCCESS),
        Command::Changes {
            after,
            limit,
            follow,
        } => changes(&config, after, limit, follow)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Prune => status::prune(&config).await.map(|()| ExitCode::SUCCESS),
        Command::Accounts { action } => accounts(&config, action).await,
        Command::Status { json } => status::status(&config, json)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Serve => serve(config).await.map(|()| ExitCode::SUCCESS),
        Command::DeadLetters { action } => operate::dead_letters(&config, action).await,
        Command::Explain {
            source,
            kind,
            id,
            account,
            json,
        } => operate::explain(&config, &source, &kind, &id, account.as_deref(), json).await,
        Command::Consumers { action } => operate::consumers(&config, action).await,
        Command::Reconcile {
            action: Some(action),
            ..
        } => operate::pause(&config, action).await,
        Command::Reconcile {
            action: None,
            source,
            account,
            kind,
            dry_run,
            json,
            wait,
            allow_mass_delete,
        } => {
            reconcile::run(
                config,
                reconcile::Args {
                    source,
                    account,
                    kind,
                    dry_run,
                    json,
                    wait,
                    allow_mass_delete,
                },
            )
            .await
        }
    };
    match result {
        Ok(code) => code,
        Err(e) if e.downcast_ref::<NotMigrated>().is_some() => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
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
    for w in &config.warnings {
        println!("  warning: {}: {}", w.key, w.message);
    }
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
        if let Some(p) = s.preset {
            println!("    preset: {p:?} (see `webhook-reconciler config` for every key it set)");
        }
        if let Some(cu) = &s.catchup {
            println!(
                "    catch-up: {} since the last run (window {})",
                cu.listing.list.as_deref().unwrap_or_default(),
                humantime::format_duration(cu.window)
            );
        }
    }
}

/// A command needed the schema on a database that has none (or an older one).
#[derive(Debug, thiserror::Error)]
#[error("{0}: run `webhook-reconciler migrate` (or start `serve`), then try again")]
pub(crate) struct NotMigrated(String);

/// The database of a command that reads or writes through the schema: [`NotMigrated`]
/// (exit 2) when it was never migrated, and a SQLite file that does not exist is never
/// created for it.
pub(crate) async fn open_migrated(config: &Config) -> anyhow::Result<Db> {
    use secrecy::ExposeSecret;
    let url = config.database.url.expose_secret();
    if config.database.backend == crate::config::Backend::Sqlite {
        let path = url.strip_prefix("sqlite://").unwrap_or(url);
        if path != ":memory:" && !std::path::Path::new(path).exists() {
            return Err(
                NotMigrated(format!("the SQLite database {path} does not exist yet")).into(),
            );
        }
    }
    let db = Db::connect(&config.database)?;
    if !db.is_migrated().await? {
        return Err(NotMigrated(format!(
            "the database {} has no schema of this version yet",
            crate::config::redact_database_url(url)
        ))
        .into());
    }
    Ok(db)
}

/// `accounts`: the registry of many-account sources.
async fn accounts(config: &Config, action: AccountsAction) -> anyhow::Result<ExitCode> {
    use crate::accounts::lifecycle::{Lifecycle, LifecycleError};
    let code = |e: &LifecycleError| match e {
        LifecycleError::NotRegistered { .. } => ExitCode::from(EXIT_FAILED),
        e if e.caller_error() => ExitCode::from(EXIT_CONFIG),
        _ => ExitCode::from(EXIT_FAILED),
    };
    // Mistakes of the command are told before the database is opened.
    let (source, account) = match &action {
        AccountsAction::Add {
            source, account, ..
        }
        | AccountsAction::Disable { source, account }
        | AccountsAction::Enable { source, account }
        | AccountsAction::Remove {
            source, account, ..
        } => (Some(source.as_str()), Some(account.as_str())),
        AccountsAction::List { source, .. } => (source.as_deref(), None),
    };
    if let Some(source) = source {
        let problem = match config.source(source) {
            None => Some(LifecycleError::UnknownSource(source.into())),
            Some(s) if s.accounts.is_none() => Some(LifecycleError::SingleAccount(source.into())),
            Some(_) => account.and_then(|a| {
                crate::change::limits::check_id(a)
                    .err()
                    .map(|why| LifecycleError::BadAccount {
                        account: a.into(),
                        why: why.to_string(),
                    })
            }),
        };
        if let Some(e) = problem {
            eprintln!("error: {e}");
            return Ok(code(&e));
        }
    }
    let credential = match &action {
        AccountsAction::Add {
            token_file,
            token_env,
            ..
        } => match crate::config::secret_from_file_or_env(
            token_file.as_deref(),
            token_env.as_deref(),
        ) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: the account's credential: {e}");
                return Ok(ExitCode::from(EXIT_CONFIG));
            }
        },
        _ => None,
    };
    let db = open_migrated(config).await?;
    let life = Lifecycle::new(
        std::sync::Arc::new(config.clone()),
        crate::store::Store::new(db),
    );
    let done = match action {
        AccountsAction::Add {
            source,
            account,
            api_base,
            ..
        } => life
            .add(&source, &account, api_base, credential)
            .await
            .map(|()| {
                format!("{source}: account {account} added; its deliveries are applied, and its first sync starts within seconds under `serve`")
            }),
        AccountsAction::List { source, json } => {
            let rows = match life.list(source.as_deref()).await {
                Ok(rows) => rows,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(code(&e));
                }
            };
            if json {
                println!("{}", serde_json::to_string(&rows)?);
            } else {
                for r in &rows {
                    println!(
                        "{}\t{}\t{}\t{}\t{}\t{}",
                        r.source,
                        r.account,
                        if r.enabled { "enabled" } else { "disabled" },
                        r.api_base.as_deref().unwrap_or("-"),
                        if r.has_credential { "own-credential" } else { "source-credential" },
                        r.created_at
                    );
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        AccountsAction::Disable { source, account } => life
            .set_enabled(&source, &account, false)
            .await
            .map(|()| format!("{source}: account {account} disabled; its deliveries are answered \"ignored\" and it is not reconciled")),
        AccountsAction::Enable { source, account } => life
            .set_enabled(&source, &account, true)
            .await
            .map(|()| format!("{source}: account {account} enabled; a sync starts within seconds under `serve`")),
        AccountsAction::Remove {
            source,
            account,
            purge,
        } => life.remove(&source, &account, purge).await.map(|r| {
            let done = if r.purged {
                format!("{} rows deleted", r.rows)
            } else {
                format!("{} rows tombstoned (each a change in the feed)", r.rows)
            };
            format!("{source}: account {account} removed; {done}")
        }),
    };
    Ok(match done {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            code(&e)
        }
    })
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

/// `changes`: the feed as JSON lines, read from the database.
async fn changes(
    config: &Config,
    after: i64,
    limit: Option<i64>,
    follow: bool,
) -> anyhow::Result<()> {
    use std::io::Write;
    let feed = crate::feed::Feed::new(open_migrated(config).await?);
    let filter = crate::feed::Filter::default();
    let mut position = after;
    let mut left = limit.unwrap_or(i64::MAX);
    let stop = crate::shutdown::signal();
    tokio::pin!(stop);
    loop {
        let asked = left.min(crate::feed::MAX_PAGE);
        let crate::feed::FeedPage {
            changes: page,
            more,
        } = feed.page(position, asked, &filter).await?;
        let mut out = std::io::stdout().lock();
        for c in &page {
            writeln!(out, "{}", serde_json::to_string(c)?)?;
        }
        out.flush()?;
        drop(out);
        left -= page.len() as i64;
        if let Some(last) = page.last() {
            position = last.seq;
        }
        // Done: the limit is reached, or (without --follow) the feed's end.
        if left <= 0 || (!follow && !more) {
            return Ok(());
        }
        if page.is_empty() {
            tokio::select! {
                () = &mut stop => return Ok(()),
                () = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            }
        }
    }
}

//! The command line: parse, load the configuration, run one command, return its exit
//! code. `main` only calls [`run`].

mod accounts;
mod args;
mod generate;
mod operate;
mod prove;
mod reconcile;
mod status;

use std::process::ExitCode;

use crate::app::Application;
use crate::config::{Config, ConfigError};
use crate::db::Db;

/// Exit code for bad usage or invalid configuration.
pub const EXIT_CONFIG: u8 = 2;
/// Exit code when the work failed.
pub const EXIT_FAILED: u8 = 1;

use args::rate;
pub use args::{AccountsAction, Cli, Command, DemoArgs, SecretAction};

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
    // Another party's receiver: no configuration of ours is read.
    if let Command::Prove(args) = cli.command {
        return prove::run(args).await;
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
            crate::credential::new_key()
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
    let config_path = config_path(cli.config.as_deref());
    if let Command::Config = cli.command {
        return match Config::effective_toml(config_path.as_deref()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => config_error(&e),
        };
    }
    // Commands that read and report use no secret: from a shell they run without the
    // unit's credentials (only the database's password, if any, is read).
    let secrets_unused = matches!(
        &cli.command,
        Command::Status { .. }
            | Command::Explain { .. }
            | Command::DeadLetters {
                action: operate::DeadLettersAction::List { .. }
            }
            | Command::Consumers {
                action: operate::ConsumersAction::List { .. }
            }
            | Command::Accounts {
                action: AccountsAction::List { .. }
            }
    );
    let loaded = if secrets_unused {
        Config::load_without_secrets(config_path.as_deref())
    } else {
        Config::load(config_path.as_deref())
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => return config_error_in(&e, config_path.as_deref()),
    };
    crate::telemetry::init(&config.log);
    let result = match cli.command {
        Command::CheckConfig => {
            print_config_summary(&config, config_path.as_deref());
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => migrate(&config).await.map(|()| ExitCode::SUCCESS),
        // Handled above.
        Command::Demo(_)
        | Command::Prove(_)
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
        Command::Accounts { action } => accounts::accounts(&config, action).await,
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
            concurrency,
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
                    concurrency,
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

fn print_config_summary(config: &Config, path: Option<&std::path::Path>) {
    println!("configuration OK");
    match path {
        Some(p) => println!("  file:     {}", p.display()),
        None => println!("  file:     none (built-in defaults; --config FILE names one)"),
    }
    for w in &config.warnings {
        println!("  warning: {}: {}", w.key, w.message);
    }
    println!("  database: {}", config.database.redacted_url());
    println!("  listen:   {}", config.http.listen);
    if let Some(admin) = &config.http.admin_listen {
        println!("  admin:    {admin} (/readyz, /metrics, /changes, /admin/*)");
    }
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
        for v in s.kinds.iter().filter_map(|k| k.view.as_ref()) {
            let columns: Vec<&str> = v.columns.iter().map(|c| c.name.as_str()).collect();
            println!(
                "    view {}: {}{}",
                v.name,
                columns.join(", "),
                if v.indexes.is_empty() {
                    String::new()
                } else {
                    format!(" (indexed: {})", v.indexes.join(", "))
                }
            );
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
            config.database.redacted_url()
        ))
        .into());
    }
    Ok(db)
}

async fn migrate(config: &Config) -> anyhow::Result<()> {
    let db = Db::connect(&config.database)?;
    let db2 = db.clone();
    let applied = tokio::task::spawn_blocking(move || db2.migrate()).await??;
    if applied.is_empty() {
        println!("database is up to date");
    } else {
        println!(
            "applied {} migration(s): {}",
            applied.len(),
            applied.join(", ")
        );
    }
    let views = crate::store::Store::new(db).sync_views(config).await?;
    if let Some(line) = views.summary() {
        println!("{line}");
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
    let db = open_migrated(config).await?;
    // Changes a killed process committed and never numbered are numbered first (with
    // `serve` running, its sequencer does it within a second anyway).
    let outbox = crate::feed::outbox::Outbox::new(db.clone());
    let feed = crate::feed::Feed::new(db);
    let filter = crate::feed::Filter::default();
    let mut position = after;
    let mut left = limit.unwrap_or(i64::MAX);
    let stop = crate::shutdown::signal();
    tokio::pin!(stop);
    loop {
        if let Err(e) = outbox.sequence_leftovers().await {
            tracing::warn!(error = %e, "could not number pending changes; reading what is numbered");
        }
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

/// The configuration file a command reads: the one named (`--config` or
/// `$WEBHOOK_RECONCILER_CONFIG`), else the installed one when it exists, else none.
fn config_path(given: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    given.map(std::path::Path::to_path_buf).or_else(|| {
        let installed = std::path::Path::new(crate::config::INSTALLED_CONFIG);
        installed.is_file().then(|| installed.to_path_buf())
    })
}

/// A configuration error, naming the file it was read from.
fn config_error_in(e: &crate::config::ConfigError, path: Option<&std::path::Path>) -> ExitCode {
    if let Some(p) = path {
        eprintln!("in {}:", p.display());
    }
    config_error(e)
}

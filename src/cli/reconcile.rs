//! `reconcile`: one run of the selected kinds now, a summary row per kind, a progress
//! line per kind on a terminal, JSON with `--json`.

use crate::bookkeeping::Bookkeeping;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use tokio_util::sync::CancellationToken;

use super::{EXIT_CONFIG, EXIT_FAILED};
use crate::config::Config;
use crate::db::Db;
use crate::reconcile::{KindReport, Reconciler, RunOptions, RunStatus};
use crate::store::Store;

pub struct Args {
    pub source: Option<String>,
    /// One account of a many-account source (default: each enabled one).
    pub account: Option<String>,
    pub kind: Option<String>,
    pub dry_run: bool,
    pub json: bool,
    pub wait: bool,
    pub allow_mass_delete: bool,
    /// Account-kinds at once (default: the selected sources' `accounts.concurrency`).
    pub concurrency: Option<u16>,
}

/// How long the one-shot command does pending fetches after its runs.
const FETCH_DRAIN: Duration = Duration::from_secs(10);

pub async fn run(config: Config, args: Args) -> anyhow::Result<ExitCode> {
    // A dry run writes nothing, not even the schema or a new SQLite file.
    let db = if config.database.migrate && !args.dry_run {
        let db = Db::connect(&config.database)?;
        let d = db.clone();
        tokio::task::spawn_blocking(move || d.migrate()).await??;
        db
    } else {
        super::open_migrated(&config).await?
    };
    let store = Store::new(db.clone());
    let outbox = store.outbox().clone();
    if !args.dry_run {
        // What a killed process committed and never numbered reaches the feed now.
        store.outbox().sequence_leftovers().await?;
    }
    let reconciler = Reconciler::new(Arc::new(config), store, Bookkeeping::new(db))?;
    let selected: Vec<_> = reconciler
        .kinds(args.source.as_deref(), args.kind.as_deref())
        .into_iter()
        .map(|(s, k)| (s.clone(), k.clone()))
        .collect();
    if selected.is_empty() {
        eprintln!(
            "no kind with a list endpoint matches{}{}; check --source / --kind and the configuration",
            args.source
                .as_deref()
                .map(|s| format!(" --source {s}"))
                .unwrap_or_default(),
            args.kind
                .as_deref()
                .map(|k| format!(" --kind {k}"))
                .unwrap_or_default(),
        );
        return Ok(ExitCode::from(EXIT_CONFIG));
    }
    if let Some(a) = &args.account {
        if let Some((s, _)) = selected.iter().find(|(s, _)| s.accounts.is_none()) {
            eprintln!(
                "--account {a:?}: source {:?} serves one account; name a many-account source with --source",
                s.name
            );
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    }
    let cancel = CancellationToken::new();
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown::signal().await;
            cancel.cancel();
        });
    }
    let terminal = std::io::stderr().is_terminal() && !args.json;
    let opts = RunOptions {
        dry_run: args.dry_run,
        wait: args.wait,
        allow_mass_delete: args.allow_mass_delete,
    };
    let mut reports = Vec::new();
    let mut runs = Vec::new();
    for (source, kind) in &selected {
        let accounts = match &args.account {
            Some(a) => vec![crate::change::Account::from_stored(a.as_str())],
            None => reconciler.accounts_of(source).await?,
        };
        runs.extend(accounts.into_iter().map(|a| (source, kind, a)));
    }
    // Many accounts' account-kinds run side by side, as `serve` runs them (each under its
    // own lease, with its account's request budget); the reports keep the selection's order.
    let concurrency = args.concurrency.map_or_else(
        || {
            selected
                .iter()
                .filter_map(|(s, _)| s.accounts.as_ref().map(|a| a.concurrency))
                .max()
                .unwrap_or(1)
        },
        usize::from,
    );
    let bars = terminal.then(indicatif::MultiProgress::new);
    let reconciler = &reconciler;
    let (opts, cancel_ref, bars_ref) = (&opts, &cancel, &bars);
    let mut finished = futures_util::stream::iter(runs)
        .map(|(source, kind, account)| async move {
            let bar = bars_ref.as_ref().map(|bars| {
                let bar = bars.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {prefix}: {msg} [{elapsed}]")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.set_prefix(run_name(&source.name, account.stored(), &kind.name));
                bar.enable_steady_tick(Duration::from_millis(120));
                bar
            });
            let progress = {
                let bar = bar.clone();
                move |c: &crate::reconcile::RunCounts| {
                    if let Some(bar) = &bar {
                        bar.set_message(format!(
                            "page {}, {} scanned, {} applied",
                            c.pages, c.scanned, c.applied
                        ));
                    }
                }
            };
            let report = if cancel_ref.is_cancelled() {
                None
            } else {
                Some(
                    reconciler
                        .run_account_kind(source, kind, &account, opts, cancel_ref, &progress)
                        .await,
                )
            };
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            report
        })
        .buffered(concurrency);
    while let Some(report) = finished.next().await {
        reports.extend(report);
    }
    drop(finished);
    if !args.dry_run && !cancel.is_cancelled() {
        // Conflicts this run recorded (items listed in the second of the local row) and
        // fetches left by deliveries are due now: done here when no `serve` runs. What
        // is not done within the bound stays pending for `serve` or the next run.
        crate::reconcile::fetches::Fetcher::new(reconciler.clone())
            .drain(FETCH_DRAIN)
            .await;
    }
    // The runs' pages asked for passes without waiting for them; their changes reach
    // the feed before this process exits, not at the next process's pass.
    if !args.dry_run {
        match outbox.flush().await {
            // The rows those passes left dead, which a run's own vacuum may have come
            // before.
            Ok(()) => outbox.vacuum().await,
            Err(e) => {
                tracing::warn!(error = %e, "could not number this run's changes; they are kept and the next pass of any process numbers them")
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    } else {
        print_table(&reports);
    }
    let failed = reports
        .iter()
        .any(|r| matches!(r.status, RunStatus::Failed { .. }));
    Ok(if failed {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// `source/kind`, or `source[account]/kind` for an account of a many-account source.
fn run_name(source: &str, account: &str, kind: &str) -> String {
    crate::change::Key::new(source, kind)
        .in_account(account)
        .to_string()
}

fn print_table(reports: &[KindReport]) {
    // The first column as wide as its longest name (an account id can be long), so the
    // numbers stay under their headings.
    let width = reports
        .iter()
        .map(|r| run_name(&r.source, &r.account, &r.kind).chars().count())
        .max()
        .unwrap_or(0)
        .max(24);
    println!(
        "{:<width$} {:<10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>11} {:>6} {:>9}",
        "KIND",
        "STATUS",
        "PAGES",
        "SCANNED",
        if reports.iter().any(|r| r.dry_run) {
            "WOULD"
        } else {
            "APPLIED"
        },
        "UNCHANGED",
        "MISSING",
        "LOCAL-NEWER",
        "ERRORS",
        "DURATION"
    );
    for r in reports {
        let c = &r.counts;
        let status = match &r.status {
            RunStatus::Succeeded if r.dry_run => "dry-run",
            RunStatus::Succeeded => "ok",
            RunStatus::Failed { .. } => "FAILED",
            RunStatus::Skipped { .. } => "skipped",
            RunStatus::Paused => "paused",
        };
        println!(
            "{:<width$} {:<10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>11} {:>6} {:>8.1}s",
            run_name(&r.source, &r.account, &r.kind),
            status,
            c.pages,
            c.scanned,
            c.applied,
            c.equal,
            c.missing,
            c.newer_local,
            u8::from(matches!(r.status, RunStatus::Failed { .. })),
            r.seconds
        );
    }
    for r in reports {
        match &r.status {
            RunStatus::Failed { error } => {
                println!("{}: {error}", run_name(&r.source, &r.account, &r.kind))
            }
            RunStatus::Paused => println!(
                "{}: paused by an operator; `webhook-reconciler reconcile resume {} {}` ends it (or `reconcile resume {}`, when the whole source was paused; `status` lists the pauses)",
                run_name(&r.source, &r.account, &r.kind),
                r.source,
                r.kind,
                r.source
            ),
            RunStatus::Skipped {
                lease_holder,
                lease_expires_at,
            } => {
                println!(
                    "{}/{}: another process ({lease_holder}) is reconciling it now; its lease expires at {lease_expires_at} \
                     unless it renews it. Run again with --wait to wait for it",
                    r.source, r.kind
                )
            }
            RunStatus::Succeeded if r.dry_run => {
                if !r.would_change.is_empty() {
                    println!(
                        "{}/{}: would write {} item(s), first: {}",
                        r.source,
                        r.kind,
                        r.counts.applied,
                        r.would_change.join(", ")
                    );
                }
                if !r.would_tombstone.is_empty() {
                    println!(
                        "{}/{}: would tombstone {} row(s) the sender no longer lists, first: {}",
                        r.source,
                        r.kind,
                        r.counts.tombstoned,
                        r.would_tombstone.join(", ")
                    );
                }
            }
            _ => {}
        }
    }
}

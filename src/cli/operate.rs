//! The operator's commands: `dead-letters`, `explain`, `consumers`, `reconcile
//! pause|resume` — printed for a person, or JSON with `--json`, over
//! [`crate::operations`] (the admin API's too).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;

use super::{EXIT_CONFIG, EXIT_FAILED, open_migrated};
use crate::config::Config;
use crate::operations::{OpError, Operations, Retried, Selection};

#[derive(Debug, Subcommand)]
pub enum DeadLettersAction {
    /// The kept deliveries, oldest first, with why each was not applied.
    List {
        /// Only this source's.
        #[arg(long)]
        source: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Run kept deliveries again through mapping, claim and guarded write (no second
    /// signature check: each was authenticated when it arrived). One that now goes
    /// through leaves the list; one that fails again stays with the new reason.
    Retry(Selected),
    /// Delete kept deliveries without applying them.
    Discard(Selected),
}

/// The dead letters `retry` and `discard` act on.
#[derive(Debug, clap::Args)]
pub struct Selected {
    /// Event ids (or --all).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<String>,
    /// Every kept delivery (of --source).
    #[arg(long)]
    all: bool,
    /// The source, when an id is kept for two.
    #[arg(long)]
    source: Option<String>,
    /// Print machine-readable results on stdout.
    #[arg(long)]
    json: bool,
}

impl Selected {
    fn selection(self) -> (Selection, bool) {
        let json = self.json;
        let sel = Selection {
            ids: self.ids,
            all: self.all,
            source: self.source,
        };
        (sel, json)
    }
}

#[derive(Debug, Subcommand)]
pub enum ConsumersAction {
    /// Each configured consumer: position, paused, changes waiting, skipped.
    List {
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Push the changes after SEQ again (same `chg_<seq>` ids); refused below the
    /// oldest kept change. A running `serve` picks it up within a second.
    Rewind {
        name: String,
        #[arg(long, value_name = "SEQ")]
        to: i64,
    },
    /// Stop pushing to a consumer (every replica); its position stays.
    Pause { name: String },
    /// Push to a paused consumer again, from its position.
    Resume { name: String },
}

#[derive(Debug, Subcommand)]
pub enum PauseAction {
    /// Stop reconciling a kind (every kind of the source without KIND) on every replica
    /// and in the one-shot command, until `reconcile resume`.
    Pause {
        source: String,
        kind: Option<String>,
    },
    /// Reconcile a paused kind again (its due runs start at once).
    Resume {
        source: String,
        kind: Option<String>,
    },
}

async fn operations(config: &Config) -> anyhow::Result<Operations> {
    let db = open_migrated(config).await?;
    Ok(Operations::standalone(Arc::new(config.clone()), db))
}

/// A refused operation: the caller's mistake exits 2, the database's 1.
fn refused(e: &OpError) -> ExitCode {
    eprintln!("error: {e}");
    if e.caller_error() {
        ExitCode::from(EXIT_CONFIG)
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

pub async fn dead_letters(config: &Config, action: DeadLettersAction) -> anyhow::Result<ExitCode> {
    let ops = operations(config).await?;
    match action {
        DeadLettersAction::List {
            source,
            limit,
            json,
        } => {
            let letters = match ops.dead_letters(source.as_deref(), limit.max(1)).await {
                Ok(l) => l,
                Err(e) => return Ok(refused(&e)),
            };
            if json {
                println!("{}", serde_json::to_string(&letters)?);
            } else if letters.is_empty() {
                println!("no dead letters");
            } else {
                println!(
                    "{:<12} {:<28} {:<24} {:<24} {:>8} {:>9} {:<24} REASON",
                    "SOURCE", "EVENT", "ACCOUNT", "TYPE", "ATTEMPTS", "BYTES", "LAST SEEN"
                );
                for l in &letters {
                    println!(
                        "{:<12} {:<28} {:<24} {:<24} {:>8} {:>9} {:<24} {}",
                        l.source,
                        l.event_id,
                        l.account.as_deref().unwrap_or("-"),
                        l.event_type,
                        l.attempts,
                        l.size,
                        l.last_seen_at,
                        l.reason
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DeadLettersAction::Retry(selected) => {
            let (sel, json) = selected.selection();
            match ops.retry_dead_letters(&sel).await {
                Ok(done) => print_results(&done, json, "retried"),
                Err(e) => Ok(refused(&e)),
            }
        }
        DeadLettersAction::Discard(selected) => {
            let (sel, json) = selected.selection();
            match ops.discard_dead_letters(&sel).await {
                Ok(done) => print_results(&done, json, "discarded"),
                Err(e) => Ok(refused(&e)),
            }
        }
    }
}

/// One line per dead letter and a summary; exit 1 when one is still failing or was
/// not found.
fn print_results(done: &[Retried], json: bool, verb: &str) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string(done)?);
    } else {
        for r in done {
            match &r.reason {
                Some(why) => println!("{} {}: {} ({why})", r.source, r.event_id, r.outcome),
                None => println!("{} {}: {}", r.source, r.event_id, r.outcome),
            }
        }
        let failing = done
            .iter()
            .filter(|r| matches!(r.outcome.as_str(), "failed" | "not_found"))
            .count();
        println!(
            "{} dead letter(s) {verb}; {failing} still kept or not found",
            done.len() - failing
        );
    }
    Ok(
        if done
            .iter()
            .any(|r| matches!(r.outcome.as_str(), "failed" | "not_found"))
        {
            ExitCode::from(EXIT_FAILED)
        } else {
            ExitCode::SUCCESS
        },
    )
}

pub async fn explain(
    config: &Config,
    source: &str,
    kind: &str,
    id: &str,
    account: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let ops = operations(config).await?;
    let x = match ops.explain(source, kind, id, account).await {
        Ok(x) => x,
        Err(e) => return Ok(refused(&e)),
    };
    // Nothing known of it is a failed look-up (exit 1), in either output.
    let found = if x.is_unknown() {
        ExitCode::from(crate::cli::EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&x)?);
        return Ok(found);
    }
    let name = format!(
        "{}/{}",
        crate::change::Key::new(&x.source, &x.kind).in_account(&x.account),
        x.id
    );
    if x.row.is_none() && !x.in_accounts.is_empty() {
        println!(
            "{name}: no row in the source's own account; {} serves many accounts, and {} of them hold this id: {} (name one with --account)",
            x.source,
            x.in_accounts.len(),
            x.in_accounts.join(", ")
        );
    }
    let many = config
        .source(&x.source)
        .is_some_and(|s| s.accounts.is_some());
    if many && !x.account.is_empty() {
        match &x.registered {
            None => println!(
                "account {}: not registered (never added, or removed)",
                x.account
            ),
            Some(a) if a.enabled => println!("account {}: registered, enabled", x.account),
            Some(a) => println!(
                "account {}: registered, disabled ({}, since {})",
                x.account,
                a.disabled_reason.as_deref().unwrap_or("no reason kept"),
                a.disabled_since.as_deref().unwrap_or("-")
            ),
        }
    }
    match &x.row {
        None => println!("{name}: no row"),
        Some(r) => {
            println!(
                "{name}: version {}{}, written by {} {}at {}",
                r.version,
                if r.deleted { " (deleted)" } else { "" },
                r.origin,
                r.last_event_id
                    .as_deref()
                    .map(|e| format!("(event {e}) "))
                    .unwrap_or_default(),
                r.updated_at
            );
            if let Some(state) = &r.state {
                println!("  state: {state}");
            }
        }
    }
    println!("events claimed for it ({}):", x.claims.len());
    for c in &x.claims {
        println!(
            "  {}  {:<28} {:<28} {}",
            c.processed_at, c.event_id, c.event_type, c.outcome
        );
    }
    if let Some(f) = &x.pending_fetch {
        let state = match (&f.failed_at, &f.error) {
            (Some(at), e) => format!(
                "FAILED at {at} after {} attempts ({}); its account-kind was made due for a full reconcile",
                f.attempts,
                e.as_deref().unwrap_or("no error recorded")
            ),
            (None, Some(e)) => format!(
                "pending, attempt {} failed ({e}); next try at {}",
                f.attempts, f.due_at
            ),
            (None, None) => format!("pending, due at {}", f.due_at),
        };
        println!(
            "fetch from the sender ({}{}, requested {} time(s) since {}): {state}",
            f.reason,
            f.event_id
                .as_deref()
                .map(|e| format!(" for event {e}"))
                .unwrap_or_default(),
            f.requests,
            f.requested_at,
        );
    }
    println!("its changes ({}):", x.changes.len());
    for c in &x.changes {
        println!(
            "  seq {:<8} version {:<20} {:<9} {}{}{}",
            c.seq,
            c.version,
            c.origin,
            c.changed_at,
            if c.deleted { " deleted" } else { "" },
            c.event_id
                .as_deref()
                .map(|e| format!(" event {e}"))
                .unwrap_or_default()
        );
    }
    println!("reconcile runs that wrote it ({}):", x.runs.len());
    for r in &x.runs {
        println!(
            "  {} .. {}  {} {}: scanned {}, applied {}",
            r.started_at,
            r.finished_at.as_deref().unwrap_or("running"),
            r.mode,
            r.status,
            r.scanned,
            r.applied
        );
    }
    Ok(found)
}

pub async fn consumers(config: &Config, action: ConsumersAction) -> anyhow::Result<ExitCode> {
    let ops = operations(config).await?;
    let done = match action {
        ConsumersAction::List { json } => {
            let list = match ops.consumers().await {
                Ok(l) => l,
                Err(e) => return Ok(refused(&e)),
            };
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else if list.is_empty() {
                println!("no consumers configured ([consumers.NAME])");
            } else {
                println!(
                    "{:<16} {:>10} {:<7} {:>9} {:>12} {:>8}",
                    "CONSUMER", "POSITION", "PAUSED", "WAITING", "OLDEST", "SKIPPED"
                );
                for c in &list {
                    println!(
                        "{:<16} {:>10} {:<7} {:>9} {:>11.0}s {:>8}",
                        c.name,
                        c.position,
                        if c.paused { "yes" } else { "no" },
                        c.lag.waiting,
                        c.lag.oldest_seconds,
                        c.skipped
                    );
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        ConsumersAction::Rewind { name, to } => ops.rewind(&name, to).await.map(|from| {
            format!("consumer {name}: position {from} -> {to}; the changes after {to} are pushed again (same chg_<seq> ids) within a second under `serve`")
        }),
        ConsumersAction::Pause { name } => ops
            .set_consumer_paused(&name, true)
            .await
            .map(|()| format!("consumer {name}: paused (its position stays)")),
        ConsumersAction::Resume { name } => ops
            .set_consumer_paused(&name, false)
            .await
            .map(|()| format!("consumer {name}: resumed")),
    };
    match done {
        Ok(line) => {
            println!("{line}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(refused(&e)),
    }
}

pub async fn pause(config: &Config, action: PauseAction) -> anyhow::Result<ExitCode> {
    let ops = operations(config).await?;
    let (source, kind, paused) = match &action {
        PauseAction::Pause { source, kind } => (source, kind, true),
        PauseAction::Resume { source, kind } => (source, kind, false),
    };
    let what = match kind {
        Some(k) => format!("{source}/{k}"),
        None => format!("{source} (every kind)"),
    };
    match ops
        .set_reconcile_paused(source, kind.as_deref(), paused)
        .await
    {
        Ok(changed) => {
            println!(
                "{what}: {}{}",
                if paused { "paused" } else { "resumed" },
                if changed { "" } else { " (it already was)" }
            );
            if !paused {
                let still: Vec<String> = ops
                    .reconcile_pauses()
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| &p.source == source)
                    .map(|p| p.key().to_string())
                    .collect();
                if !still.is_empty() {
                    println!("  still paused: {}", still.join(", "));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(refused(&e)),
    }
}

//! `status` and `prune`: what the database says about reconciliation and retention.

use serde::Serialize;

use crate::bookkeeping::{Bookkeeping, PruneRow, RunRow};
use crate::change::Key;
use crate::config::Config;
use crate::feed::{Feed, Lag};
use crate::health::{KindFreshness, freshness};
use crate::store::{FetchCount, SourceCount, Store};

/// Runs shown per kind.
const RECENT_RUNS: i64 = 5;

#[derive(Serialize)]
struct KindStatus {
    #[serde(flatten)]
    freshness: KindFreshness,
    recent_runs: Vec<RunRow>,
}

#[derive(Serialize)]
struct ConsumerStatus {
    consumer: String,
    position: i64,
    /// Paused by an operator (`consumers pause`).
    paused: bool,
    #[serde(flatten)]
    lag: Lag,
}

#[derive(Serialize)]
struct Status {
    kinds: Vec<KindStatus>,
    consumers: Vec<ConsumerStatus>,
    dead_letters: Vec<SourceCount>,
    /// Fetches from the sender still to do, per source (those a 200 promised).
    fetches: Vec<FetchCount>,
    /// Kinds an operator paused (`reconcile pause`; kind `""`: the whole source).
    paused: Vec<crate::bookkeeping::PausedRow>,
    last_prune: Option<PruneRow>,
    /// Many-account sources: account-kinds by state, and the most overdue by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    accounts: Option<AccountsStatus>,
}

#[derive(Serialize)]
struct AccountsStatus {
    counts: Vec<crate::bookkeeping::DueCount>,
    most_overdue: Vec<crate::bookkeeping::Overdue>,
}

/// How many overdue account-kinds `status` names.
const MOST_OVERDUE: i64 = 10;

pub async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let db = super::open_migrated(config).await?;
    let book = Bookkeeping::new(db.clone());
    let mut kinds = Vec::new();
    for f in freshness(&book, config).await? {
        // A many-account kind's last run is its latest in any account: its freshness
        // covers them all, so "last run" and "last success" speak of the same runs.
        let many = config
            .source(&f.source)
            .is_some_and(|s| s.accounts.is_some());
        let recent_runs = if many {
            book.recent_runs_of_every_account(&f.source, &f.kind, RECENT_RUNS)
                .await?
        } else {
            book.recent_runs(&Key::new(&f.source, &f.kind), RECENT_RUNS)
                .await?
        };
        kinds.push(KindStatus {
            freshness: f,
            recent_runs,
        });
    }
    let feed = Feed::new(db.clone());
    let mut consumers = Vec::new();
    for c in &config.consumers {
        let (position, paused) = feed.state(&c.name).await?;
        consumers.push(ConsumerStatus {
            consumer: c.name.clone(),
            position,
            paused,
            lag: feed.lag(c).await?,
        });
    }
    let paused = book.pauses().await?;
    let accounts = if config.sources.iter().any(|s| s.accounts.is_some()) {
        Some(AccountsStatus {
            counts: book.due_counts().await?,
            most_overdue: book.most_overdue(MOST_OVERDUE).await?,
        })
    } else {
        None
    };
    let fetches = crate::store::fetch_counts(&db).await?;
    let dead_letters = Store::new(db).dead_letter_counts().await?;
    let last_prune = book.last_prune().await?;
    let st = Status {
        kinds,
        consumers,
        dead_letters,
        fetches,
        paused,
        last_prune,
        accounts,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<10} {:<24} {:>14} {:<8} {:>8} {:>8} {:>9} {:>8} {:>8}",
        "KIND",
        "LAST RUN",
        "STARTED",
        "LAST SUCCESS",
        "OVERDUE",
        "SCANNED",
        "MISSING",
        "NEWER@SND",
        "NEWER@US",
        "APPLIED"
    );
    for k in &st.kinds {
        let f = &k.freshness;
        let last = k.recent_runs.first();
        println!(
            "{:<24} {:<10} {:<24} {:>14} {:<8} {:>8} {:>8} {:>9} {:>8} {:>8}",
            format!("{}/{}", f.source, f.kind),
            last.map_or("never", |r| r.status.as_str()),
            last.map_or("-", |r| r.started_at.as_str()),
            f.last_success_age_seconds
                .map_or("never".to_string(), |a| format!(
                    "{} ago",
                    humantime::format_duration(std::time::Duration::from_secs(a as u64))
                )),
            if f.overdue { "YES" } else { "no" },
            last.map_or(0, |r| r.scanned),
            last.map_or(0, |r| r.missing),
            last.map_or(0, |r| r.newer_remote + r.differing),
            last.map_or(0, |r| r.newer_local),
            last.map_or(0, |r| r.applied),
        );
        if let Some(error) = last.and_then(|r| r.error.as_deref()) {
            println!("  last error: {error}");
        }
    }
    for p in &st.paused {
        let what = p.key().to_string();
        let resume = format!(
            "webhook-reconciler reconcile resume {} {}",
            p.source, p.kind
        );
        println!(
            "paused: {what} since {} (`{}` ends it)",
            p.paused_at,
            resume.trim_end()
        );
    }
    for c in &st.consumers {
        println!(
            "consumer {}{}: at seq {}, {} change(s) waiting{}",
            c.consumer,
            if c.paused {
                " (PAUSED: `consumers resume` ends it)"
            } else {
                ""
            },
            c.position,
            c.lag.waiting,
            if c.lag.waiting > 0 {
                format!(", the oldest {:.0}s old", c.lag.oldest_seconds)
            } else {
                String::new()
            }
        );
    }
    if let Some(a) = &st.accounts {
        print_accounts(a);
    }
    if st.fetches.is_empty() {
        println!("fetches from the senders: none pending");
    }
    for f in &st.fetches {
        let failed = if f.failed > 0 {
            format!(
                ", {} FAILED after their last attempt (`webhook-reconciler explain` shows why; their account-kinds were made due)",
                f.failed
            )
        } else {
            String::new()
        };
        println!(
            "fetches from {}: {} pending, the oldest for {}{failed}",
            f.source,
            f.pending - f.failed,
            humantime::format_duration(std::time::Duration::from_secs(
                f.oldest_seconds.max(0.0) as u64
            )),
        );
    }
    if st.dead_letters.is_empty() {
        println!("dead letters: none");
    } else {
        for d in &st.dead_letters {
            println!(
                "dead letters: {} waiting for source {} (`webhook-reconciler dead-letters list --source {}`)",
                d.count, d.source, d.source
            );
        }
    }
    match &st.last_prune {
        Some(p) => println!(
            "last prune: {} — deleted {} event ids, {} runs, {} dead letters{}",
            p.started_at,
            p.processed_events,
            p.reconcile_runs,
            p.dead_letters,
            p.error
                .as_deref()
                .map(|e| format!(" (error: {e})"))
                .unwrap_or_default()
        ),
        None => println!("last prune: never"),
    }
    Ok(())
}

/// One line per many-account source (its account-kinds by state), then the most
/// overdue (failed first) by name.
fn print_accounts(a: &AccountsStatus) {
    let mut sources: Vec<&str> = a.counts.iter().map(|c| c.source.as_str()).collect();
    sources.dedup();
    for source in sources {
        let of = || a.counts.iter().filter(|c| c.source == source);
        let total: i64 = of().map(|c| c.count).sum();
        let overdue: i64 = of().map(|c| c.overdue).sum();
        let states: Vec<String> = of().map(|c| format!("{} {}", c.count, c.status)).collect();
        println!(
            "accounts of {source}: {total} account-kinds ({}), {overdue} overdue",
            states.join(", ")
        );
    }
    for o in &a.most_overdue {
        println!(
            "  {}[{}]/{}: {}, {}{}",
            o.source,
            o.account,
            o.kind,
            o.status,
            due_text(o.overdue_secs),
            o.error
                .as_deref()
                .map(|e| format!(" — {e}"))
                .unwrap_or_default()
        );
    }
}

/// "overdue by 3m" for an account-kind past its due time, "due in 45m" for one not yet
/// due (a failed one is listed before it is due again).
fn due_text(overdue_secs: f64) -> String {
    let secs = overdue_secs.abs().round() as u64;
    // Whole minutes past a minute: seconds are noise at that scale.
    let rounded = if secs >= 60 { secs - secs % 60 } else { secs };
    let d = humantime::format_duration(std::time::Duration::from_secs(rounded));
    if overdue_secs >= 0.0 {
        format!("overdue by {d}")
    } else {
        format!("due in {d}")
    }
}

pub async fn prune(config: &Config) -> anyhow::Result<()> {
    let db = super::open_migrated(config).await?;
    let owners = crate::retention::Owners::new(db);
    let report =
        crate::retention::prune(&owners, config, &tokio_util::sync::CancellationToken::new())
            .await?;
    println!(
        "pruned {} event ids, {} reconcile runs, {} dead letters, {} changes in {:.1}s",
        report.processed_events,
        report.reconcile_runs,
        report.dead_letters,
        report.changes,
        report.seconds
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_account_kind_is_overdue_by_or_due_in_never_due_a_negative_time_ago() {
        assert_eq!(super::due_text(-2710.0), "due in 45m");
        assert_eq!(super::due_text(185.0), "overdue by 3m");
        assert_eq!(super::due_text(12.4), "overdue by 12s");
        assert_eq!(super::due_text(0.0), "overdue by 0s");
    }
}

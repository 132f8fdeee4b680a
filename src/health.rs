//! What the database says about the daemon's health, read when asked: each kind's
//! reconcile freshness and the fetches still pending, for `/metrics`, `/readyz`,
//! `status` and systemd's STATUS= line.

use serde::Serialize;

use crate::bookkeeping::Bookkeeping;
use crate::config::{Config, Schedule};
use crate::db::{Db, DbError};

/// How fresh one kind's reconciliation is.
#[derive(Debug, Clone, Serialize)]
pub struct KindFreshness {
    pub source: String,
    pub kind: String,
    /// Seconds since the last successful run; `None` if it never succeeded.
    pub last_success_age_seconds: Option<f64>,
    /// The age beyond which the kind counts as overdue (`reconcile.stale_after`).
    pub stale_after_seconds: Option<f64>,
    pub overdue: bool,
}

/// Freshness of every scheduled kind with a list endpoint. With many accounts, a kind
/// is as fresh as its stalest account: the accounts a run covers now (the source's own,
/// `""`, where it reconciles one, and its enabled registered accounts), each aged by its
/// last success, or, for a registered account that never succeeded, by the time since it
/// was added (an account onboarded a minute ago is not overdue; one that has failed
/// since it was added a day ago is). Disabled and removed accounts' runs do not count.
pub async fn freshness(book: &Bookkeeping, config: &Config) -> Result<Vec<KindFreshness>, DbError> {
    let ages = book.last_success_ages().await?;
    // Looked up per account and kind: a map, so a scrape stays linear in the accounts.
    let ages: std::collections::HashMap<(&str, &str, &str), f64> = ages
        .iter()
        .map(|a| {
            (
                (a.source.as_str(), a.account.as_str(), a.kind.as_str()),
                a.age_seconds,
            )
        })
        .collect();
    let onboarded = if config.sources.iter().any(|s| s.accounts.is_some()) {
        crate::accounts::Accounts::new(book.db().clone())
            .enabled_ages()
            .await?
    } else {
        Vec::new()
    };
    let mut out = Vec::new();
    for source in &config.sources {
        // Each account the source's runs cover, with its age when it never succeeded
        // (`None`: the source's own account, never succeeded means never).
        let mut accounts: Vec<(&str, Option<f64>)> = Vec::new();
        if source.reconciles_own_account() {
            accounts.push(("", None));
        }
        if source.accounts.is_some() {
            accounts.extend(
                onboarded
                    .iter()
                    .filter(|a| a.source == source.name)
                    .map(|a| (a.account.as_str(), Some(a.age_seconds))),
            );
        }
        let stale_after = source
            .reconcile
            .stale_after
            .or(match &source.reconcile.schedule {
                Some(Schedule::Every(d)) => Some(*d * 3),
                _ => None,
            });
        for kind in source.reconciled_kinds() {
            let stale_after = if kind.listing == crate::config::Listing::Events {
                match source.schedule_of(kind) {
                    Some(Schedule::Every(d)) => Some(*d * 3),
                    _ => None,
                }
            } else {
                stale_after
            };
            let age_of = |account: &str, never: Option<f64>| {
                ages.get(&(source.name.as_str(), account, kind.name.as_str()))
                    .copied()
                    .or(never)
                    .map(|age| age.max(0.0))
            };
            // The stalest account; `None` if one never succeeded.
            let age = accounts
                .iter()
                .map(|(account, never)| age_of(account, *never))
                .try_fold(0.0_f64, |stalest, age| age.map(|a| stalest.max(a)));
            let limit = stale_after.map(|d| d.as_secs_f64());
            let overdue = match (limit, age) {
                // No account to run (a platform before its first account): nothing
                // can be overdue.
                _ if accounts.is_empty() => false,
                (Some(limit), Some(age)) => age > limit,
                // Never succeeded: overdue once the process could have run it, which
                // the caller judges by its uptime; here, only if a limit exists.
                (Some(_), None) => true,
                (None, _) => false,
            };
            let age = age.filter(|_| !accounts.is_empty());
            out.push(KindFreshness {
                source: source.name.clone(),
                kind: kind.name.clone(),
                last_success_age_seconds: age,
                stale_after_seconds: limit,
                overdue,
            });
        }
    }
    Ok(out)
}

/// The `/metrics` body: the database's gauges read now (freshness per kind, pending
/// fetches per source), then everything `observability` recorded.
pub async fn render(db: &Db, book: &Bookkeeping, config: &Config) -> String {
    if let Ok(kinds) = freshness(book, config).await {
        for k in kinds {
            if let Some(age) = k.last_success_age_seconds {
                metrics::gauge!("reconcile_seconds_since_success", "source" => k.source.clone(), "kind" => k.kind.clone()).set(age);
            }
            metrics::gauge!("reconcile_overdue", "source" => k.source, "kind" => k.kind)
                .set(f64::from(u8::from(k.overdue)));
        }
    }
    if let Ok(counts) = crate::store::fetch_counts(db).await {
        fetch_gauges(config, &counts);
    }
    crate::observability::render(db)
}

/// Pending fetches per source (`/metrics`): every configured source is set, so a
/// source whose fetches were all done reads 0, not its last value.
fn fetch_gauges(config: &Config, counts: &[crate::store::FetchCount]) {
    for source in &config.sources {
        let c = counts.iter().find(|c| c.source == source.name);
        let s = source.name.clone();
        metrics::gauge!("fetches_pending", "source" => s.clone())
            .set(c.map_or(0.0, |c| (c.pending - c.failed) as f64));
        metrics::gauge!("fetches_failed", "source" => s.clone())
            .set(c.map_or(0.0, |c| c.failed as f64));
        metrics::gauge!("fetches_oldest_seconds", "source" => s)
            .set(c.map_or(0.0, |c| c.oldest_seconds));
    }
}

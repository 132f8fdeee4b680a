//! `webhook-reconciler demo --accounts N`: a Stripe Connect platform with N connected
//! accounts on one daemon.
//!
//! The simulated Stripe API scopes every object by its `Stripe-Account` header and signs
//! events naming their account inside the body. Every account has customers and products
//! with the same ids as the others' (one row per account each). All accounts but the last
//! are registered before the deliveries; the last one's deliveries are answered `ignored`
//! until it is added while the daemon runs, which starts its first full sync. Deliveries
//! are lost, duplicated and reordered; the daemon's shared per-kind loop reconciles every
//! account-kind on its schedule. The demo measures how long after the last delivery every
//! account equals the sender.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};

use crate::change::Key;
use crate::config::Config;
use crate::simulator::providers::{Provider, ProviderSim, Webhook};
use crate::store::Store;

const TEMPLATE: &str = include_str!("../../config/demo-accounts.toml");
const SOURCE: &str = "stripe";
/// (the simulator's collection, our kind, objects per account)
const KINDS: [(&str, &str, usize); 2] = [("customers", "customer", 8), ("products", "product", 3)];
/// How long the accounts may take to equal the sender after the last delivery.
const CONVERGE_WITHIN: Duration = Duration::from_secs(120);

/// The knobs of the many-accounts demo.
#[derive(Debug, Clone)]
pub struct AccountsDemoOptions {
    pub accounts: usize,
    pub seed: u64,
    /// Share of events never delivered.
    pub loss: f64,
    /// Share of events delivered twice.
    pub duplicate: f64,
    pub concurrency: usize,
    /// `None`: a SQLite file in a temporary directory.
    pub database: Option<String>,
    pub progress: bool,
}

/// What the many-accounts demo measured.
#[derive(Debug, Clone, Serialize)]
pub struct AccountsDemoReport {
    pub seed: u64,
    pub database: String,
    pub accounts: usize,
    /// The account registered only after its deliveries were answered.
    pub added_late: String,
    /// Objects the sender holds, over every account.
    pub objects: usize,
    pub events: usize,
    pub requests_sent: usize,
    pub lost: usize,
    pub duplicates_sent: usize,
    /// The daemon's answers by outcome (`http_<status>` for anything but 200).
    pub answers: BTreeMap<String, u64>,
    /// Objects differing from the sender right after the last delivery.
    pub diverged_after_webhooks: usize,
    /// Seconds from the last delivery until every account equals the sender.
    pub seconds_to_converge: Option<f64>,
    /// Account-kind runs by how they last ended, at the end.
    pub runs: BTreeMap<String, i64>,
    /// Rows stored for the accounts (each id once per account that has it).
    pub rows: usize,
    pub diverged_at_end: usize,
    pub converged: bool,
    pub seconds: f64,
}

fn account_name(i: usize) -> String {
    format!("acct_demo{i:05}")
}

/// Runs the demo; `Ok` even when the accounts differ from the sender (the report says
/// so and the command exits 1).
pub async fn run(opts: AccountsDemoOptions) -> anyhow::Result<AccountsDemoReport> {
    let started = Instant::now();
    anyhow::ensure!(opts.accounts >= 1, "--accounts must be at least 1");
    let (dir, database) = super::database(opts.database.as_deref())?;
    let secret = format!("whsec_{:032x}", rand::random::<u128>());
    let sim = ProviderSim::start(Provider::Stripe, &secret)
        .await
        .context("starting the simulated Stripe API")?;
    let accounts_key = crate::credential::new_key()
        .map_err(|e| anyhow::anyhow!("making the demo's accounts.key: {e}"))?;
    let config = Config::from_toml_str(
        &TEMPLATE
            .replace("{{DATABASE_URL}}", &database)
            .replace("{{SENDER}}", &sim.api_base())
            .replace("{{SECRET}}", &secret)
            .replace("{{ACCOUNTS_KEY}}", &accounts_key),
    )
    .map_err(|e| anyhow::anyhow!("the demo configuration: {e}"))?;

    let accounts: Vec<String> = (0..opts.accounts).map(account_name).collect();
    let added_late = accounts[accounts.len() - 1].clone();
    let events = scenario(&sim, &accounts, opts.seed);
    let objects: usize = KINDS
        .iter()
        .map(|(collection, _, _)| {
            accounts
                .iter()
                .map(|a| sim.objects_in(a, collection).len())
                .sum::<usize>()
        })
        .sum();
    say(
        &opts,
        &format!(
            "demo: a Stripe Connect platform with {} connected accounts ({} objects) emits {} events (seed {}); database {}",
            accounts.len(),
            objects,
            events.len(),
            opts.seed,
            crate::config::redact_database_url(&database)
        ),
    );

    let daemon = super::Daemon::start(&config).await?;
    let url = format!("http://{}/webhooks/{SOURCE}", daemon.addr);
    let store = Store::new(daemon.db.clone());
    let life = crate::operations::Operations::new(Arc::new(config.clone()), store.clone());
    for a in &accounts[..accounts.len() - 1] {
        life.add_account(SOURCE, a, None, None)
            .await
            .map_err(|e| anyhow::anyhow!("registering {a}: {e}"))?;
    }
    say(
        &opts,
        &format!(
            "demo: {} accounts registered (their first syncs start now); {added_late} is not yet",
            accounts.len() - 1
        ),
    );

    let plan = delivery_plan(&events, &opts);
    let answers = send(&url, &plan.requests, opts.concurrency).await;
    let delivered = Instant::now();
    let diverged_after_webhooks = diverged(&sim, &store, &accounts).await?;
    say(
        &opts,
        &format!(
            "demo: deliveries done ({} answered `ignored`: {added_late}'s); adding {added_late}",
            answers.get("ignored").copied().unwrap_or(0)
        ),
    );
    life.add_account(SOURCE, &added_late, None, None)
        .await
        .map_err(|e| anyhow::anyhow!("registering {added_late}: {e}"))?;

    // Converged once every account equals the sender (bounded).
    let mut seconds_to_converge = None;
    let mut diverged_at_end = diverged_after_webhooks;
    while delivered.elapsed() < CONVERGE_WITHIN {
        diverged_at_end = diverged(&sim, &store, &accounts).await?;
        if diverged_at_end == 0 {
            seconds_to_converge = Some(delivered.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut runs = BTreeMap::new();
    let book = crate::bookkeeping::Bookkeeping::new(store.db().clone());
    for c in book.due_counts().await? {
        *runs.entry(c.status).or_insert(0) += c.count;
    }
    let rows = stored_rows(&store, &accounts).await?;
    daemon.stop().await;
    drop(dir);
    Ok(AccountsDemoReport {
        seed: opts.seed,
        database: crate::config::redact_database_url(&database),
        accounts: accounts.len(),
        added_late,
        objects,
        events: events.len(),
        requests_sent: plan.requests.len(),
        lost: plan.lost,
        duplicates_sent: plan.duplicates,
        answers,
        diverged_after_webhooks,
        seconds_to_converge,
        runs,
        rows,
        diverged_at_end,
        converged: diverged_at_end == 0 && rows == objects,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn say(opts: &AccountsDemoOptions, line: &str) {
    if opts.progress {
        eprintln!("{line}");
    }
}

/// Every account's objects, created and then changed a few times; the events in the
/// order they happened.
fn scenario(sim: &ProviderSim, accounts: &[String], seed: u64) -> Vec<Webhook> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xacc0);
    let mut events = Vec::new();
    for account in accounts {
        for (collection, kind, per_account) in KINDS {
            for i in 0..per_account {
                let id = format!("{}_{i}", &kind[..3]);
                let name = format!("{kind} {i} of {account}");
                events.push(sim.change_in(
                    account,
                    collection,
                    &id,
                    json!({"name": name, "revision": 0}),
                    &format!("{kind}.created"),
                ));
                for revision in 1..=rng.random_range(0..3) {
                    events.push(sim.change_in(
                        account,
                        collection,
                        &id,
                        json!({"revision": revision}),
                        &format!("{kind}.updated"),
                    ));
                }
            }
        }
    }
    events
}

struct Plan<'a> {
    requests: Vec<&'a Webhook>,
    lost: usize,
    duplicates: usize,
}

/// What the sender sends: some events never, some twice, in a shuffled order.
fn delivery_plan<'a>(events: &'a [Webhook], opts: &AccountsDemoOptions) -> Plan<'a> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut requests = Vec::with_capacity(events.len());
    let (mut lost, mut duplicates) = (0, 0);
    for e in events {
        if rng.random_bool(opts.loss) {
            lost += 1;
            continue;
        }
        requests.push(e);
        if rng.random_bool(opts.duplicate) {
            requests.push(e);
            duplicates += 1;
        }
    }
    requests.shuffle(&mut rng);
    Plan {
        requests,
        lost,
        duplicates,
    }
}

/// Posts every request, `concurrency` at a time; the answers by outcome.
async fn send(url: &str, requests: &[&Webhook], concurrency: usize) -> BTreeMap<String, u64> {
    let client = reqwest::Client::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for hook in requests {
        let (client, gate, url, hook) = (
            client.clone(),
            gate.clone(),
            url.to_string(),
            (*hook).clone(),
        );
        tasks.spawn(async move {
            let _slot = gate.acquire_owned().await;
            let mut req = client.post(url).header("Content-Type", "application/json");
            for (k, v) in &hook.headers {
                req = req.header(k, v);
            }
            match req.body(hook.body).send().await {
                Ok(r) if r.status() == 200 => r
                    .json::<Value>()
                    .await
                    .ok()
                    .and_then(|b| b["outcome"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "unreadable".into()),
                Ok(r) => format!("http_{}", r.status().as_u16()),
                Err(_) => "unanswered".into(),
            }
        });
    }
    let mut answers = BTreeMap::new();
    while let Some(outcome) = tasks.join_next().await {
        *answers
            .entry(outcome.unwrap_or_else(|_| "unanswered".into()))
            .or_insert(0) += 1;
    }
    answers
}

/// How many of the sender's objects differ from their rows (missing, older, other state).
async fn diverged(sim: &ProviderSim, store: &Store, accounts: &[String]) -> anyhow::Result<usize> {
    let mut n = 0;
    for account in accounts {
        for (collection, kind, _) in KINDS {
            let expected = sim.objects_in(account, collection);
            let key = Key::new(SOURCE, kind).in_account(account.as_str());
            let local: BTreeMap<String, Option<Value>> = store
                .stored_rows_with_states(&key, expected.keys().cloned().collect())
                .await?
                .into_iter()
                .filter(|r| !r.deleted)
                .map(|r| {
                    let state = r
                        .state
                        .as_deref()
                        .and_then(|s| serde_json::from_str(s).ok());
                    (r.id, state)
                })
                .collect();
            n += expected
                .iter()
                .filter(|(id, object)| local.get(*id) != Some(&Some((*object).clone())))
                .count();
        }
    }
    Ok(n)
}

/// Rows stored under the accounts, every kind.
async fn stored_rows(store: &Store, accounts: &[String]) -> anyhow::Result<usize> {
    let mut n = 0;
    for account in accounts {
        for (_, kind, per_account) in KINDS {
            let ids = (0..per_account)
                .map(|i| format!("{}_{i}", &kind[..3]))
                .collect();
            let key = Key::new(SOURCE, kind).in_account(account.as_str());
            n += store
                .stored_rows_with_states(&key, ids)
                .await?
                .iter()
                .filter(|r| !r.deleted)
                .count();
        }
    }
    Ok(n)
}

/// The report as a person reads it.
pub fn print_report(r: &AccountsDemoReport) {
    let answer = |k: &str| r.answers.get(k).copied().unwrap_or(0);
    let others: u64 = r
        .answers
        .iter()
        .filter(|(k, _)| {
            !["applied", "duplicate", "stale", "conflict", "ignored"].contains(&k.as_str())
        })
        .map(|(_, v)| v)
        .sum();
    println!();
    println!(
        "webhook-reconciler demo --accounts {} — seed {}, {}",
        r.accounts, r.seed, r.database
    );
    println!(
        "  the platform:        {} connected accounts, {} objects (customers and products, the same ids in every account)",
        r.accounts, r.objects
    );
    println!(
        "  requests sent:       {:>6}  for {} events; {} never sent, {} sent twice, all shuffled",
        r.requests_sent, r.events, r.lost, r.duplicates_sent
    );
    println!(
        "  answers it saw:      applied {}, duplicate {} (claimed before, by a copy or by the event catch-up), stale {}, conflict {}, ignored {} ({} not yet registered), other {}",
        answer("applied"),
        answer("duplicate"),
        answer("stale"),
        answer("conflict"),
        answer("ignored"),
        r.added_late,
        others
    );
    println!(
        "  after the webhooks:  {:>6}  objects differ from the sender (lost events, {}'s objects, first syncs still running)",
        r.diverged_after_webhooks, r.added_late
    );
    let runs: Vec<String> = r.runs.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "  account-kind runs:   {}  (each account's customers, products and event catch-up, by how its last run ended)",
        runs.join(", ")
    );
    match r.seconds_to_converge {
        Some(s) => println!(
            "  equals the sender:   YES     every account, {s:.1}s after the last delivery ({} rows: one per account and id)",
            r.rows
        ),
        None => println!(
            "  equals the sender:   NO      {} objects still differ after {}s",
            r.diverged_at_end,
            CONVERGE_WITHIN.as_secs()
        ),
    }
    println!("  the whole demo took {:.1}s", r.seconds);
}

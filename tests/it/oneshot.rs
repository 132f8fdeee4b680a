//! The one-shot `reconcile` over many accounts runs `accounts.concurrency` account-kinds
//! at once (`--concurrency` overrides it), against the simulated Stripe Connect API
//! answering each request after a delay: the sender sees that many requests in flight,
//! and every account's objects arrive under their account.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use webhook_reconciler::simulator::providers::{Provider, ProviderSim};

use crate::connect::{NEVER, PLATFORM_TOKEN, STRIPE_WHSEC, config, lifecycle};
use crate::helpers::process::{bin, write_config};
use crate::helpers::{Backend, TestDb, both_backends};

both_backends!(the_one_shot_runs_the_accounts_concurrency_at_once_and_concurrency_1_one_at_a_time);

/// A simulated Stripe Connect API answering after `latency`, `accounts` registered
/// (accounts.concurrency = 4, from `config`) with a customer each; the configuration's
/// file in `dir`.
async fn platform(
    b: Backend,
    accounts: &[String],
    latency: Duration,
    dir: &Path,
) -> (ProviderSim, TestDb, PathBuf) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    sim.set_latency(latency);
    let db = TestDb::new(b);
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let life = lifecycle(&toml, crate::helpers::store_on(&db).await);
    for a in accounts {
        life.add_account("stripe", a, None, None).await.unwrap();
        sim.change_in(
            a,
            "customers",
            "cus_1",
            json!({"name": a}),
            "customer.created",
        );
    }
    let path = write_config(dir, &toml);
    (sim, db, path)
}

/// `reconcile --source stripe --kind customer` and `extra`: exit 0, its stdout.
fn oneshot(path: &Path, extra: &[&str]) -> String {
    let out = bin()
        .args(["--config", path.to_str().unwrap(), "reconcile"])
        .args(["--source", "stripe", "--kind", "customer"])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

async fn the_one_shot_runs_the_accounts_concurrency_at_once_and_concurrency_1_one_at_a_time(
    b: Backend,
) {
    let accounts: Vec<String> = (1..=8).map(|i| format!("acct_{i:02}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let many = dir.path().join("many");
    std::fs::create_dir(&many).unwrap();
    let (sim, db, path) = platform(b, &accounts, Duration::from_millis(100), &many).await;
    let printed = oneshot(&path, &[]);
    for a in &accounts {
        assert_eq!(
            db.count(&format!(
                "resources WHERE kind = 'customer' AND account = '{a}' AND id = 'cus_1'"
            )),
            1,
            "{a}"
        );
        assert!(
            printed.contains(a.as_str()),
            "a row per account-kind: {printed}"
        );
    }
    // The nine account-kinds (the platform's own account too) went four at a time.
    let seen = sim.max_in_flight();
    assert!((2..=4).contains(&seen), "{seen} requests in flight at most");
    // The reports keep the order of the accounts, whatever order the runs ended in.
    let order: Vec<usize> = accounts
        .iter()
        .map(|a| printed.find(a.as_str()).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{printed}");

    let one = dir.path().join("one");
    std::fs::create_dir(&one).unwrap();
    let (sim1, db1, path1) = platform(b, &accounts[..4], Duration::from_millis(20), &one).await;
    oneshot(&path1, &["--concurrency", "1"]);
    assert_eq!(db1.count("resources WHERE kind = 'customer'"), 4);
    assert_eq!(sim1.max_in_flight(), 1, "--concurrency 1: one at a time");
}

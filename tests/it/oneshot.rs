//! The one-shot `reconcile` over many accounts runs `accounts.concurrency` account-kinds
//! at once (`--concurrency` overrides it), against the simulated Stripe Connect API
//! answering each request after a delay: the sender sees that many requests in flight,
//! and every account's objects arrive under their account.

use std::time::Duration;

use serde_json::json;
use webhook_reconciler::simulator::providers::{Provider, ProviderSim};

use crate::connect::{NEVER, PLATFORM_TOKEN, STRIPE_WHSEC, config, lifecycle};
use crate::helpers::process::{bin, write_config};
use crate::helpers::{Backend, TestDb, both_backends};

both_backends!(the_one_shot_runs_the_accounts_concurrency_at_once_and_concurrency_1_one_at_a_time);

async fn the_one_shot_runs_the_accounts_concurrency_at_once_and_concurrency_1_one_at_a_time(
    b: Backend,
) {
    let sim = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    sim.set_latency(Duration::from_millis(100));
    let db = TestDb::new(b);
    // `config` sets accounts.concurrency = 4.
    let toml = config(
        &db.url,
        &sim,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let life = lifecycle(&toml, crate::helpers::store_on(&db).await);
    let accounts: Vec<String> = (1..=8).map(|i| format!("acct_{i:02}")).collect();
    for a in &accounts {
        life.add_account("stripe", a, None, None).await.unwrap();
        sim.change_in(
            a,
            "customers",
            "cus_1",
            json!({"name": a}),
            "customer.created",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), &toml);
    let oneshot = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            path.to_str().unwrap(),
            "reconcile",
            "--source",
            "stripe",
            "--kind",
            "customer",
        ];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let printed = oneshot(&[]);
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

    let sim1 = ProviderSim::start(Provider::Stripe, STRIPE_WHSEC)
        .await
        .unwrap();
    sim1.set_latency(Duration::from_millis(20));
    let db1 = TestDb::new(b);
    let toml1 = config(
        &db1.url,
        &sim1,
        &format!("cron = \"{NEVER}\""),
        PLATFORM_TOKEN,
    );
    let life1 = lifecycle(&toml1, crate::helpers::store_on(&db1).await);
    for a in &accounts[..4] {
        life1.add_account("stripe", a, None, None).await.unwrap();
        sim1.change_in(
            a,
            "customers",
            "cus_1",
            json!({"name": a}),
            "customer.created",
        );
    }
    let path1 = write_config(dir.path(), &toml1);
    let out = bin()
        .args([
            "--config",
            path1.to_str().unwrap(),
            "reconcile",
            "--source",
            "stripe",
            "--kind",
            "customer",
            "--concurrency",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(db1.count("resources WHERE kind = 'customer'"), 4);
    assert_eq!(sim1.max_in_flight(), 1, "--concurrency 1: one at a time");
}

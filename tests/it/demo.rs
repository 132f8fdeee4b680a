//! The demo, on both backends: it converges across seeds and fault mixes, and without
//! reconciliation it shows the divergence that reconciliation repairs.

use webhook_reconciler::demo::{DemoOptions, run};
use webhook_reconciler::simulator::deliver::Faults;

use crate::helpers::{Backend, TestDb, both_backends};

fn options(db: &TestDb, seed: u64, faults: Faults) -> DemoOptions {
    DemoOptions {
        orders: 150,
        refunds: 40,
        seed,
        faults,
        same_second: 0.05,
        concurrency: 8,
        database: Some(db.url.clone()),
        reconcile: true,
        progress: false,
    }
}

both_backends!(
    the_demo_converges_across_seeds_and_fault_mixes,
    without_reconciliation_the_demo_shows_what_the_webhooks_missed,
);

async fn the_demo_converges_across_seeds_and_fault_mixes(b: Backend) {
    let mixes = [
        Faults {
            loss: 0.05,
            duplicate: 0.1,
            concurrent_duplicate: 0.05,
            reorder: 0.2,
            slow_ack: 0.03,
        },
        Faults {
            loss: 0.3,
            duplicate: 0.5,
            concurrent_duplicate: 0.3,
            reorder: 0.8,
            slow_ack: 0.2,
        },
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            concurrent_duplicate: 0.0,
            reorder: 0.0,
            slow_ack: 0.0,
        },
    ];
    for (seed, faults) in [
        (1u64, mixes[0]),
        (2, mixes[1]),
        (3, mixes[2]),
        (4, mixes[1]),
    ] {
        let db = TestDb::new(b);
        let report = run(options(&db, seed, faults)).await.unwrap();
        assert!(report.converged, "seed {seed}: {report:#?}");
        assert_eq!(report.diverged_at_end, 0);
        assert_eq!(report.resources, 190);
        let answers = &report.deliveries.answers;
        let applied = answers.get("applied").copied().unwrap_or(0);
        // Nothing applied twice: at most one applied answer per event.
        assert!(
            applied <= report.deliveries.events,
            "seed {seed}: {report:#?}"
        );
        if faults.duplicate > 0.0 {
            assert!(
                answers.get("duplicate").copied().unwrap_or(0) > 0,
                "seed {seed}: duplicates were sent and absorbed"
            );
        }
        if faults.loss > 0.0 {
            assert!(
                report.deliveries.lost > 0 && report.repaired_by_reconcile > 0,
                "seed {seed}: {report:#?}"
            );
        } else {
            assert_eq!(
                report.diverged_before_reconcile, 0,
                "seed {seed}: nothing lost, nothing to repair"
            );
        }
        assert_eq!(report.deliveries.abandoned, 0);
        assert_eq!(
            db.count("processed_events"),
            report.deliveries.events as i64 - report.deliveries.lost as i64,
            "every delivered event claimed exactly once"
        );
    }
}

async fn without_reconciliation_the_demo_shows_what_the_webhooks_missed(b: Backend) {
    let db = TestDb::new(b);
    let mut opts = options(
        &db,
        9,
        Faults {
            loss: 0.2,
            duplicate: 0.1,
            concurrent_duplicate: 0.05,
            reorder: 0.2,
            slow_ack: 0.05,
        },
    );
    opts.reconcile = false;
    let report = run(opts).await.unwrap();
    assert!(!report.converged);
    assert!(report.diverged_at_end > 0);
    assert_eq!(report.diverged_at_end, report.diverged_before_reconcile);
    assert_eq!(report.repaired_by_reconcile, 0);
}

/// The report adds up for a reader (the changes are the webhooks' plus the conflicts
/// settled plus the reconcile's, which are the items it wrote) and is a function of the
/// seed: two runs with one seed report the same counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_report_adds_up_and_its_counts_are_a_function_of_the_seed() {
    let faults = Faults {
        loss: 0.1,
        duplicate: 0.2,
        concurrent_duplicate: 0.1,
        reorder: 0.3,
        slow_ack: 0.05,
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let db = TestDb::new(Backend::Sqlite);
        let r = run(options(&db, 7, faults)).await.unwrap();
        assert!(r.converged, "{r:#?}");
        let o = r.origins;
        assert_eq!(
            (o.webhooks + o.conflicts_settled + o.reconcile) as i64,
            r.changes
        );
        assert_eq!(o.reconcile as i64, r.repaired_by_reconcile);
        assert_eq!(r.effects.performed as i64, r.changes);
        seen.push(format!(
            "{:?} {} {} {} {:?}",
            r.deliveries.answers,
            r.diverged_before_reconcile,
            r.repaired_by_reconcile,
            r.changes,
            o
        ));
    }
    assert_eq!(seen[0], seen[1]);
}

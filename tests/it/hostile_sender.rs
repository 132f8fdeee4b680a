//! A sender's odd or hostile listing can only make a run fail loudly or skip a reported
//! item: never succeed wrongly, delete live rows, leak the token or loop for ever
//! (SPEC "What a sender's listing can never do"). Each fault is served by the simulated
//! sender, a real HTTP server.

use std::time::{Duration, Instant};

use serde_json::json;
use webhook_reconciler::reconcile::{RunOptions, RunStatus};
use webhook_reconciler::simulator::{Quirk, SimSender, Style};

use crate::helpers::{Backend, TestDb, both_backends, eventually};
use crate::reconcile::{
    assert_converged, order_fields, reconcile_config, reconciler_for, run, run_with, sim_with,
};

both_backends!(
    a_comma_in_a_link_url_and_several_link_headers_neither_end_the_sweep_nor_delete_anything,
    a_next_link_to_another_origin_fails_the_run_and_never_receives_the_token,
    a_stuck_cursor_fails_the_run_within_seconds_and_the_fixed_sender_converges,
    a_stripe_listing_whose_has_more_never_ends_fails_with_no_progress,
    a_self_referencing_link_fails_with_no_progress,
    a_page_larger_than_max_page_bytes_fails_the_run_clearly,
    a_sweep_that_suddenly_lists_half_the_items_tombstones_nothing_unless_allowed,
    a_run_that_lost_its_lease_writes_nothing_more_and_fails_naming_the_holder,
    a_run_that_lost_its_lease_before_its_last_page_writes_it_not_and_keeps_the_checkpoint,
    get_puts_an_id_in_exactly_one_path_segment,
    a_redirect_to_another_origin_is_not_followed,
);

fn failed_error(report: &webhook_reconciler::reconcile::KindReport) -> String {
    match &report.status {
        RunStatus::Failed { error } => error.clone(),
        other => panic!("expected a failed run, got {other:?}: {report:?}"),
    }
}

async fn filled(style: Style, n: usize) -> SimSender {
    let sim = sim_with(style).await;
    for i in 0..n {
        sim.put("orders", &format!("o{i:02}"), 1, order_fields("paid"));
    }
    sim
}

async fn a_comma_in_a_link_url_and_several_link_headers_neither_end_the_sweep_nor_delete_anything(
    b: Backend,
) {
    let db = TestDb::new(b);
    let sim = filled(Style::Link, 30).await;
    let config = reconcile_config(&db.url, &sim, Style::Link, "", "detect_deletes = true");
    let r = reconciler_for(&config).await;
    assert_eq!(run(&r, "order", false).await.status, RunStatus::Succeeded);
    sim.add_quirk(Quirk::AwkwardLinks);
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_eq!(
        report.counts.scanned, 30,
        "every page was listed: {report:?}"
    );
    assert_eq!(report.counts.tombstoned, 0, "{report:?}");
    assert_eq!(db.count("resources WHERE deleted"), 0);
    assert_converged(&db, &sim, "orders", "order");
}

async fn a_next_link_to_another_origin_fails_the_run_and_never_receives_the_token(b: Backend) {
    let db = TestDb::new(b);
    let sim = filled(Style::Link, 30).await;
    let elsewhere = filled(Style::Link, 30).await;
    sim.add_quirk(Quirk::ForeignNext(elsewhere.base_url()));
    let config = reconcile_config(
        &db.url,
        &sim,
        Style::Link,
        "api_token = \"tok-sender-secret\"",
        "",
    );
    let r = reconciler_for(&config).await;
    let report = run(&r, "order", false).await;
    let error = failed_error(&report);
    assert!(
        error.contains(&elsewhere.base_url()),
        "names the URL: {error}"
    );
    assert!(error.contains("another origin"), "{error}");
    assert!(!error.contains("tok-sender-secret"), "{error}");
    assert_eq!(
        elsewhere.list_requests(),
        0,
        "the foreign link was never followed"
    );
    assert!(elsewhere.authorizations().is_empty());
    assert!(
        sim.authorizations()
            .iter()
            .all(|a| a.as_deref() == Some("Bearer tok-sender-secret")),
        "the sender itself gets the token"
    );
    assert_eq!(
        db.count(&format!(
            "reconcile_checkpoints WHERE position LIKE '%{}%'",
            elsewhere.addr.port()
        )),
        0,
        "the foreign URL is never a resume point"
    );
    assert_eq!(
        db.count("reconcile_runs WHERE status = 'failed'"),
        1,
        "recorded failed"
    );
    sim.clear_quirks();
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_converged(&db, &sim, "orders", "order");
}

/// A stuck listing fails the run quickly with "no progress"; the fixed sender's next
/// run converges.
async fn stuck_listing_fails_then_converges(b: Backend, style: Style, quirk: Quirk) {
    let db = TestDb::new(b);
    let sim = filled(style, 30).await;
    sim.add_quirk(quirk);
    let r = reconciler_for(&reconcile_config(
        &db.url,
        &sim,
        style,
        "",
        "detect_deletes = true",
    ))
    .await;
    let started = Instant::now();
    let report = run(&r, "order", false).await;
    let error = failed_error(&report);
    assert!(error.contains("no progress at"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped within seconds, not by a timeout: {:?}",
        started.elapsed()
    );
    assert!(sim.list_requests() <= 3, "{} requests", sim.list_requests());
    assert_eq!(db.count("reconcile_runs WHERE status = 'failed'"), 1);
    assert_eq!(db.count("resources WHERE deleted"), 0);
    sim.clear_quirks();
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_converged(&db, &sim, "orders", "order");
}

async fn a_stuck_cursor_fails_the_run_within_seconds_and_the_fixed_sender_converges(b: Backend) {
    stuck_listing_fails_then_converges(b, Style::Cursor, Quirk::StuckCursor).await;
}

async fn a_stripe_listing_whose_has_more_never_ends_fails_with_no_progress(b: Backend) {
    stuck_listing_fails_then_converges(b, Style::Stripe, Quirk::StuckHasMore).await;
}

async fn a_self_referencing_link_fails_with_no_progress(b: Backend) {
    stuck_listing_fails_then_converges(b, Style::Link, Quirk::SelfLink).await;
}

async fn a_page_larger_than_max_page_bytes_fails_the_run_clearly(b: Backend) {
    let db = TestDb::new(b);
    let sim = filled(Style::Cursor, 10).await;
    sim.add_quirk(Quirk::Padding(64 * 1024));
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "").replace(
        "lease_ttl = \"3s\"",
        "lease_ttl = \"3s\"\nmax_page_bytes = \"16KiB\"",
    );
    let r = reconciler_for(&config).await;
    let report = run(&r, "order", false).await;
    let error = failed_error(&report);
    assert!(error.contains("max_page_bytes"), "{error}");
    assert!(error.contains("/orders?limit=7"), "names the URL: {error}");
    assert_eq!(
        sim.list_requests(),
        1,
        "not retried: it would be as large again"
    );
    assert_eq!(db.count("resources"), 0);
}

async fn a_sweep_that_suddenly_lists_half_the_items_tombstones_nothing_unless_allowed(b: Backend) {
    let db = TestDb::new(b);
    let sim = filled(Style::Cursor, 20).await;
    let r = reconciler_for(&reconcile_config(
        &db.url,
        &sim,
        Style::Cursor,
        "",
        "detect_deletes = true",
    ))
    .await;
    assert_eq!(run(&r, "order", false).await.status, RunStatus::Succeeded);
    assert!(eventually(Duration::from_secs(2), || async { db.clock_past_writes() }).await);
    for i in 0..10 {
        sim.remove("orders", &format!("o{:02}", i * 2));
    }
    let report = run(&r, "order", false).await;
    let error = failed_error(&report);
    assert!(error.contains("would tombstone 10 of 20"), "{error}");
    assert!(error.contains("--allow-mass-delete"), "{error}");
    assert!(error.contains("--dry-run"), "{error}");
    assert_eq!(db.count("resources WHERE deleted"), 0, "nothing tombstoned");

    let dry = run(&r, "order", true).await;
    assert_eq!(dry.status, RunStatus::Succeeded, "{dry:?}");
    assert_eq!(dry.counts.tombstoned, 10, "{dry:?}");
    assert!(dry.would_tombstone.contains(&"o00".to_string()), "{dry:?}");
    assert_eq!(
        db.count("resources WHERE deleted"),
        0,
        "a dry run writes nothing"
    );

    let allowed = run_with(
        &r,
        "order",
        RunOptions {
            allow_mass_delete: true,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(allowed.status, RunStatus::Succeeded, "{allowed:?}");
    assert_eq!(allowed.counts.tombstoned, 10);
    assert_eq!(db.count("resources WHERE deleted"), 10);
    assert_eq!(db.count("resources WHERE NOT deleted"), 10);
}

async fn a_run_that_lost_its_lease_writes_nothing_more_and_fails_naming_the_holder(b: Backend) {
    lose_the_lease_during_the_second_page(b, 30).await;
}

/// The last page clears the checkpoint in the statement that checks the lease
/// (PostgreSQL): with the lease lost, it neither writes its rows nor clears it.
async fn a_run_that_lost_its_lease_before_its_last_page_writes_it_not_and_keeps_the_checkpoint(
    b: Backend,
) {
    lose_the_lease_during_the_second_page(b, 8).await;
}

/// `items` orders listed 7 a page; the second page waits until another process holds
/// the lease. Nothing after the first page is written, the run fails naming the holder,
/// the first page's checkpoint stays; once the lease is free the kind converges.
async fn lose_the_lease_during_the_second_page(b: Backend, items: usize) {
    let db = TestDb::new(b);
    let sim = filled(Style::Cursor, items).await;
    // The second page (list request 2) takes 2 s: long enough to hand the lease over.
    sim.add_quirk(Quirk::SlowRequest {
        n: 2,
        delay: Duration::from_secs(2),
    });
    let config = reconcile_config(&db.url, &sim, Style::Cursor, "", "");
    let r = reconciler_for(&config).await;
    let stalled = {
        let r = r.clone();
        tokio::spawn(async move { run(&r, "order", false).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            sim.list_requests() >= 2 && db.count("resources") == 7
        })
        .await,
        "the first page was written and the second is on its way"
    );
    // Another process takes the kind over (as after this one stalled past lease_ttl).
    db.execute(
        "UPDATE reconcile_leases SET holder = 'other-host:4242:17:0', expires_at = '2999-01-01T00:00:00.000Z'",
    );
    let report = stalled.await.unwrap();
    let error = failed_error(&report);
    assert!(
        error.contains("lease lost to other-host:4242:17:0"),
        "{error}"
    );
    assert_eq!(
        db.count("resources"),
        7,
        "nothing written after the lease was lost"
    );
    assert_eq!(db.count("reconcile_runs WHERE status = 'failed'"), 1);
    assert_eq!(
        db.count("reconcile_checkpoints"),
        1,
        "the first page's checkpoint stays"
    );

    db.execute("DELETE FROM reconcile_leases");
    sim.clear_quirks();
    let report = run(&r, "order", false).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_converged(&db, &sim, "orders", "order");
}

async fn get_puts_an_id_in_exactly_one_path_segment(b: Backend) {
    let db = TestDb::new(b);
    let sim = sim_with(Style::Cursor).await;
    let ids = ["a b", "a/b", "ü", "a?b#c", "50%"];
    for id in ids {
        sim.put("orders", id, 3, json!({"status": "paid"}));
    }
    sim.put("orders", "..", 3, json!({"status": "paid"}));
    let r = reconciler_for(&reconcile_config(&db.url, &sim, Style::Cursor, "", "")).await;
    for id in ids {
        assert_eq!(r.resolve("shop", "order", id).await, Ok(true), "{id}");
    }
    assert_eq!(sim.get_ids(), ids.to_vec(), "the sender saw each id whole");
    for id in ids {
        assert_eq!(db.resource("shop", "order", id).unwrap().version, 3, "{id}");
    }
    let err = r.resolve("shop", "order", "..").await.unwrap_err();
    assert!(err.contains("cannot be put in a URL path"), "{err}");
    assert_eq!(
        sim.get_requests(),
        ids.len() as u64,
        "no request for \"..\""
    );
}

async fn a_redirect_to_another_origin_is_not_followed(b: Backend) {
    let db = TestDb::new(b);
    let sim = filled(Style::Cursor, 10).await;
    let elsewhere = filled(Style::Cursor, 10).await;
    sim.add_quirk(Quirk::RedirectTo(elsewhere.base_url()));
    let config = reconcile_config(
        &db.url,
        &sim,
        Style::Cursor,
        "api_token = \"tok-sender-secret\"",
        "",
    );
    let r = reconciler_for(&config).await;
    let report = run(&r, "order", false).await;
    let error = failed_error(&report);
    assert!(error.contains("redirect to"), "{error}");
    assert!(error.contains(&elsewhere.base_url()), "{error}");
    assert_eq!(
        elsewhere.list_requests(),
        0,
        "never followed, so never sent the token"
    );
    assert_eq!(sim.list_requests(), 1, "a refused redirect is not retried");
    assert_eq!(db.count("resources"), 0);
}

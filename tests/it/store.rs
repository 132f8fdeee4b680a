//! The guarded write through the store API, on both backends: the guide's four tests,
//! ties, tombstones, insert-once kinds, the batch form, and awkward ids and versions.

use webhook_reconciler::change::{Change, Key};
use webhook_reconciler::config::Action;
use webhook_reconciler::store::{Delivery, Outcome};

use crate::helpers::{Backend, TestDb, both_backends, store_on};

fn order(id: &str, version: i64, status: &str) -> Change {
    Change {
        source: "shop".into(),
        account: String::new(),
        kind: "order".into(),
        id: id.into(),
        version,
        state: Some(serde_json::json!({ "status": status }).to_string()),
        action: Action::Upsert,
    }
}

fn refund(id: &str, amount: i64) -> Change {
    Change {
        source: "shop".into(),
        account: String::new(),
        kind: "refund".into(),
        id: id.into(),
        version: 0,
        state: Some(format!(r#"{{"amount":{amount}}}"#)),
        action: Action::Upsert,
    }
}

fn delivery(event_id: &str, change: Change) -> Delivery {
    Delivery {
        body_digest: None,
        fetch: None,
        settle_conflict: false,
        source: "shop".into(),
        event_id: event_id.into(),
        event_type: "order.status_changed".into(),
        change: Some(change),
    }
}

both_backends!(
    a_repeated_delivery_applies_the_effect_once,
    concurrent_deliveries_of_the_same_event_from_three_replicas_apply_it_once,
    an_out_of_order_status_update_is_discarded,
    a_burst_of_200_deliveries_half_duplicates_applies_each_effect_once,
    an_equal_version_with_another_state_is_a_conflict_and_keeps_the_row,
    a_tombstone_stops_an_older_create_from_reviving_the_row,
    an_insert_once_kind_is_never_overwritten_by_a_webhook,
    ids_with_unicode_quotes_and_sql_are_stored_verbatim,
    the_largest_version_is_stored_and_compared_exactly,
    the_batch_applies_newer_and_different_states_but_never_older_ones,
    an_unmapped_event_is_claimed_as_ignored,
    a_delivery_the_database_refuses_fails_alone_and_the_rest_of_its_group_commits,
    every_write_keeps_the_state_digest_and_rows_without_one_are_read_with_their_state,
    the_same_id_in_two_accounts_is_two_rows_each_with_its_own_guard,
    a_concurrent_burst_of_every_outcome_records_what_it_answers,
    a_page_in_id_order_is_read_as_a_key_range_with_exactly_its_rows,
);

/// Groups mix every outcome (on PostgreSQL the claim records a predicted outcome and
/// only the unsure ones are relabelled): each event's answer, its recorded outcome and
/// the rows must agree.
async fn a_concurrent_burst_of_every_outcome_records_what_it_answers(b: Backend) {
    use rand::seq::SliceRandom;
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    for i in 0..40 {
        let first = delivery(&format!("first_{i}"), order(&format!("o{i}"), 5, "paid"));
        assert_eq!(store.apply_event(first).await.unwrap(), Outcome::Applied);
    }
    let mut expected = Vec::new();
    for i in 0..40 {
        let id = format!("o{i}");
        let (change, want) = match i % 4 {
            0 => (order(&id, 3, "new"), Outcome::Stale),
            1 => (order(&id, 5, "paid"), Outcome::Stale),
            2 => (order(&id, 5, "refunded"), Outcome::Conflict),
            _ => (order(&id, 7, "shipped"), Outcome::Applied),
        };
        expected.push((delivery(&format!("evt_{i}"), change), want));
    }
    for i in 0..20 {
        let change = order(&format!("n{i}"), 1, "new");
        expected.push((delivery(&format!("new_{i}"), change), Outcome::Applied));
    }
    let mut burst: Vec<Delivery> = expected
        .iter()
        .flat_map(|(d, _)| [d.clone(), d.clone()])
        .collect();
    burst.shuffle(&mut rand::rng());
    let results = futures_join(burst.into_iter().map(|d| {
        let s = store.clone();
        async move { (d.event_id.clone(), s.apply_event(d).await.unwrap()) }
    }))
    .await;
    for (d, want) in &expected {
        let answers: Vec<Outcome> = results
            .iter()
            .filter(|(e, _)| *e == d.event_id)
            .map(|(_, o)| *o)
            .collect();
        assert!(
            answers.contains(want) && answers.contains(&Outcome::Duplicate),
            "{}: answered {answers:?}, want {want:?} and a duplicate",
            d.event_id
        );
        assert_eq!(
            db.event_outcome("shop", &d.event_id).as_deref(),
            Some(want.as_str()),
            "{} recorded",
            d.event_id
        );
        let c = d.change.as_ref().unwrap();
        let row = db.resource("shop", "order", &c.id).unwrap();
        let stored = if *want == Outcome::Applied {
            c.version
        } else {
            5
        };
        assert_eq!(row.version, stored, "{}", c.id);
    }
}

async fn a_repeated_delivery_applies_the_effect_once(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let d = delivery("evt_9tX2mLq7Rk3vBn5cWd8pYs1a", refund("re_1", 4200));
    assert_eq!(
        store.apply_event(d.clone()).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(store.apply_event(d).await.unwrap(), Outcome::Duplicate);
    assert_eq!(db.count("resources WHERE kind = 'refund'"), 1);
    assert_eq!(db.count("processed_events"), 1);
}

async fn concurrent_deliveries_of_the_same_event_from_three_replicas_apply_it_once(b: Backend) {
    let db = TestDb::new(b);
    // Three handles with their own pools, as three daemons on one database would be:
    // only the database can arbitrate between them.
    let stores = [
        store_on(&db).await,
        store_on(&db).await,
        store_on(&db).await,
    ];
    for round in 0..20 {
        let d = delivery(
            &format!("evt_race_{round}"),
            refund(&format!("re_{round}"), 100),
        );
        let results = futures_join(stores.iter().map(|s| {
            let (s, d) = (s.clone(), d.clone());
            async move { s.apply_event(d).await }
        }))
        .await;
        let results: Vec<Outcome> = results.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            results.iter().filter(|r| **r == Outcome::Applied).count(),
            1,
            "round {round}: {results:?}"
        );
        assert_eq!(
            results.iter().filter(|r| **r == Outcome::Duplicate).count(),
            2
        );
    }
    assert_eq!(db.count("resources"), 20);
}

/// Runs futures concurrently (each on its own task) and collects their results in order.
async fn futures_join<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

async fn an_out_of_order_status_update_is_discarded(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let newer = delivery("evt_b", order("ord_42", 5, "delivered"));
    let older = delivery("evt_a", order("ord_42", 4, "shipped"));
    assert_eq!(store.apply_event(newer).await.unwrap(), Outcome::Applied);
    assert_eq!(store.apply_event(older).await.unwrap(), Outcome::Stale);
    let row = db.resource("shop", "order", "ord_42").unwrap();
    assert_eq!(
        (row.version, row.state_json()["status"].as_str()),
        (5, Some("delivered"))
    );
    assert_eq!(db.event_outcome("shop", "evt_a").as_deref(), Some("stale"));
}

async fn a_burst_of_200_deliveries_half_duplicates_applies_each_effect_once(b: Backend) {
    use rand::seq::SliceRandom;
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let events: Vec<Delivery> = (0..100)
        .map(|i| delivery(&format!("evt_{i}"), refund(&format!("re_{i}"), i)))
        .collect();
    let mut burst: Vec<Delivery> = events.iter().chain(events.iter()).cloned().collect();
    burst.shuffle(&mut rand::rng());
    let results = futures_join(burst.into_iter().map(|d| {
        let s = store.clone();
        async move { s.apply_event(d).await.unwrap() }
    }))
    .await;
    assert_eq!(
        results.iter().filter(|r| **r == Outcome::Applied).count(),
        100
    );
    assert_eq!(
        results.iter().filter(|r| **r == Outcome::Duplicate).count(),
        100
    );
    assert_eq!(db.count("resources WHERE kind = 'refund'"), 100);
}

async fn an_equal_version_with_another_state_is_a_conflict_and_keeps_the_row(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    store
        .apply_event(delivery("e1", order("o1", 7, "paid")))
        .await
        .unwrap();
    let same = store
        .apply_event(delivery("e2", order("o1", 7, "paid")))
        .await
        .unwrap();
    let other = store
        .apply_event(delivery("e3", order("o1", 7, "refunded")))
        .await
        .unwrap();
    assert_eq!((same, other), (Outcome::Stale, Outcome::Conflict));
    let row = db.resource("shop", "order", "o1").unwrap();
    assert_eq!(
        row.state_json()["status"],
        "paid",
        "a conflict never overwrites"
    );
    assert_eq!(row.last_event_id.as_deref(), Some("e1"));
    assert_eq!(db.event_outcome("shop", "e3").as_deref(), Some("conflict"));
}

async fn a_tombstone_stops_an_older_create_from_reviving_the_row(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    store
        .apply_event(delivery("e1", order("o1", 1, "new")))
        .await
        .unwrap();
    let mut del = order("o1", 3, "");
    del.state = None;
    del.action = Action::Delete;
    assert_eq!(
        store.apply_event(delivery("e3", del)).await.unwrap(),
        Outcome::Applied
    );
    let late = store
        .apply_event(delivery("e2", order("o1", 2, "paid")))
        .await
        .unwrap();
    assert_eq!(late, Outcome::Stale);
    let row = db.resource("shop", "order", "o1").unwrap();
    assert!(row.deleted);
    assert_eq!(row.version, 3);
    assert_eq!(
        row.state_json()["status"],
        "new",
        "the tombstone keeps the last known state"
    );
    // A delete of a resource never seen leaves a tombstone without state.
    let mut del2 = order("o2", 9, "");
    del2.state = None;
    del2.action = Action::Delete;
    store.apply_event(delivery("e4", del2)).await.unwrap();
    let row = db.resource("shop", "order", "o2").unwrap();
    assert!(row.deleted && row.state.is_none());
}

async fn an_insert_once_kind_is_never_overwritten_by_a_webhook(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    assert_eq!(
        store
            .apply_event(delivery("e1", refund("re_1", 100)))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        store
            .apply_event(delivery("e2", refund("re_1", 100)))
            .await
            .unwrap(),
        Outcome::Stale
    );
    assert_eq!(
        store
            .apply_event(delivery("e3", refund("re_1", 999)))
            .await
            .unwrap(),
        Outcome::Conflict
    );
    assert_eq!(
        db.resource("shop", "refund", "re_1").unwrap().state_json()["amount"],
        100
    );
}

async fn ids_with_unicode_quotes_and_sql_are_stored_verbatim(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let ids = [
        "ordre-été-🚀",
        "it's \"quoted\"",
        "'; DROP TABLE resources; --",
        "back\\slash\tand\nnewline",
        "?1 $1 %s",
    ];
    for (i, id) in ids.iter().enumerate() {
        let event_id = format!("{id}#evt{i}");
        assert_eq!(
            store
                .apply_event(delivery(&event_id, order(id, 1, id)))
                .await
                .unwrap(),
            Outcome::Applied
        );
        assert_eq!(
            store
                .apply_event(delivery(&event_id, order(id, 1, id)))
                .await
                .unwrap(),
            Outcome::Duplicate
        );
    }
    for id in ids {
        let row = db
            .resource("shop", "order", id)
            .unwrap_or_else(|| panic!("{id:?} not stored verbatim"));
        assert_eq!(row.id, id);
        assert_eq!(row.state_json()["status"], id);
    }
    assert_eq!(db.count("resources"), ids.len() as i64);
}

async fn the_largest_version_is_stored_and_compared_exactly(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let max = i64::MAX;
    store
        .apply_event(delivery("e1", order("o1", max - 1, "a")))
        .await
        .unwrap();
    assert_eq!(
        store
            .apply_event(delivery("e2", order("o1", max, "b")))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        store
            .apply_event(delivery("e3", order("o1", max - 1, "c")))
            .await
            .unwrap(),
        Outcome::Stale
    );
    assert_eq!(
        store
            .apply_event(delivery("e4", order("o1", max, "b")))
            .await
            .unwrap(),
        Outcome::Stale
    );
    assert_eq!(db.resource("shop", "order", "o1").unwrap().version, max);
}

async fn the_batch_applies_newer_and_different_states_but_never_older_ones(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    for (i, (id, v, s)) in [("a", 5, "x"), ("b", 5, "x"), ("c", 5, "x"), ("d", 5, "x")]
        .iter()
        .enumerate()
    {
        store
            .apply_event(delivery(&format!("e{i}"), order(id, *v, s)))
            .await
            .unwrap();
    }
    let mut written: Vec<String> = store
        .apply_batch(vec![
            order("a", 6, "newer"),    // newer: applied
            order("b", 5, "x"),        // equal, same state: untouched
            order("c", 5, "other"),    // equal, other state: applied (listing is current)
            order("d", 4, "older"),    // older: never
            order("e", 1, "missing"),  // missing locally: inserted
            order("e", 2, "missing2"), // same id twice in a page: the higher version wins
        ])
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    written.sort();
    assert_eq!(written, ["a", "c", "e"]);
    let state = |id: &str| db.resource("shop", "order", id).unwrap().state_json()["status"].clone();
    assert_eq!(
        (state("a"), state("b"), state("c"), state("d"), state("e")),
        (
            "newer".into(),
            "x".into(),
            "other".into(),
            "x".into(),
            "missing2".into()
        )
    );
    let e = db.resource("shop", "order", "e").unwrap();
    assert_eq!(
        (e.version, e.origin.as_str(), e.last_event_id),
        (2, "reconcile", None)
    );
    // Applying the same page again writes nothing.
    let again = store
        .apply_batch(vec![order("a", 6, "newer"), order("e", 2, "missing2")])
        .await
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
    // A large page crosses the statement chunk size and still lands in one call.
    let big: Vec<Change> = (0..2500)
        .map(|i| order(&format!("big{i:05}"), 1, "n"))
        .collect();
    assert_eq!(store.apply_batch(big).await.unwrap().len(), 2500);
}

async fn an_unmapped_event_is_claimed_as_ignored(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let d = Delivery {
        body_digest: None,
        fetch: None,
        settle_conflict: false,
        source: "shop".into(),
        event_id: "e_unknown".into(),
        event_type: "customer.created".into(),
        change: None,
    };
    assert_eq!(
        store.apply_event(d.clone()).await.unwrap(),
        Outcome::Ignored
    );
    assert_eq!(store.apply_event(d).await.unwrap(), Outcome::Duplicate);
    assert_eq!(db.count("resources"), 0);
    assert_eq!(
        db.event_outcome("shop", "e_unknown").as_deref(),
        Some("ignored")
    );
}

async fn a_delivery_the_database_refuses_fails_alone_and_the_rest_of_its_group_commits(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    // Parsing never yields a negative version; the table's CHECK refuses one. Sent
    // among 50 good deliveries at once, it shares their group transaction.
    let mut bad = order("bad", 1, "x");
    bad.version = -1;
    let mut deliveries: Vec<Delivery> = (0..50)
        .map(|i| delivery(&format!("e{i}"), refund(&format!("re_{i}"), i)))
        .collect();
    deliveries.insert(25, delivery("e_bad", bad));
    let results = futures_join(deliveries.into_iter().map(|d| {
        let s = store.clone();
        async move { s.apply_event(d).await }
    }))
    .await;
    assert!(
        results[25].is_err(),
        "the refused delivery reports an error"
    );
    let applied = results
        .iter()
        .filter(|r| matches!(r, Ok(Outcome::Applied)))
        .count();
    assert_eq!(applied, 50, "{results:?}");
    assert_eq!(db.count("resources"), 50);
    assert_eq!(
        db.count("processed_events"),
        50,
        "the refused event is not claimed"
    );
}

async fn every_write_keeps_the_state_digest_and_rows_without_one_are_read_with_their_state(
    b: Backend,
) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    store
        .apply_event(delivery("e1", order("a", 1, "paid")))
        .await
        .unwrap();
    store
        .apply_batch(vec![order("b", 1, "paid"), order("c", 1, "paid")])
        .await
        .unwrap();
    let ids = || vec!["a".to_string(), "b".to_string(), "c".to_string()];
    let rows = store
        .stored_rows(&Key::new("shop", "order"), ids())
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    for r in &rows {
        let want = order(&r.id, 1, "paid");
        assert_eq!(
            r.digest,
            Some(webhook_reconciler::change::state_digest(
                want.state.as_deref().unwrap()
            )),
            "{}: the digest of the canonical state",
            r.id
        );
        assert_eq!(
            r.state, None,
            "{}: no state read when the digest is there",
            r.id
        );
    }
    // A tombstone without state keeps the state and its digest.
    let mut tomb = order("c", 2, "paid");
    tomb.state = None;
    tomb.action = webhook_reconciler::config::Action::Delete;
    store.apply_event(delivery("e2", tomb)).await.unwrap();
    let c = store
        .stored_rows(&Key::new("shop", "order"), vec!["c".into()])
        .await
        .unwrap();
    assert_eq!(
        c[0].digest,
        rows.iter().find(|r| r.id == "c").unwrap().digest
    );
    // A row written before digests existed is read with its state, and compares equal.
    db.execute("UPDATE resources SET state_digest = NULL WHERE id = 'b'");
    let b_row = store
        .stored_rows(&Key::new("shop", "order"), vec!["b".into()])
        .await
        .unwrap();
    assert_eq!(b_row[0].digest, None);
    let listed = order("b", 1, "paid");
    assert_eq!(
        webhook_reconciler::reconcile::compare::verdict(Some(&b_row[0]), &listed),
        webhook_reconciler::change::tie::Relation::Equal
    );
    assert_eq!(
        webhook_reconciler::reconcile::compare::verdict(Some(&rows[0]), &order("a", 1, "refunded")),
        webhook_reconciler::change::tie::Relation::Differing
    );
}

/// Many accounts: the account is part of a resource's key. The same id in two accounts
/// is two rows, each guarded on its own (an older version in one account is stale there
/// and applies in the other), and the feed says which account changed.
async fn the_same_id_in_two_accounts_is_two_rows_each_with_its_own_guard(b: Backend) {
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let in_account = |account: &str, version: i64, status: &str| Change {
        account: account.into(),
        ..order("o1", version, status)
    };
    let apply = |id: &str, c: Change| store.apply_event(delivery(id, c));
    assert_eq!(
        apply("e1", in_account("acct_1", 2, "paid")).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        apply("e2", in_account("acct_2", 1, "new")).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        apply("e3", in_account("acct_1", 1, "new")).await.unwrap(),
        Outcome::Stale
    );
    assert_eq!(
        apply("e4", in_account("", 1, "new")).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(db.count("resources WHERE id = 'o1'"), 3);
    let key = Key::new("shop", "order");
    for (account, version) in [("acct_1", 2), ("acct_2", 1), ("", 1)] {
        let rows = store
            .stored_rows(&key.clone().in_account(account), vec!["o1".into()])
            .await
            .unwrap();
        assert_eq!(rows.len(), 1, "{account}");
        assert_eq!(rows[0].version, version, "{account}");
    }
    let feed = crate::helpers::feed_on(&db).await;
    let page = feed
        .page(0, 10, &webhook_reconciler::feed::Filter::default())
        .await
        .unwrap();
    let accounts: Vec<&str> = page.changes.iter().map(|c| c.account.as_str()).collect();
    assert_eq!(accounts, ["acct_1", "acct_2", ""]);
}

/// A page listed in id order is read as one range of the primary key; the rows come out
/// exactly as the id-by-id read gives them (local rows the page skips dropped, another
/// account's and kind's rows never read), either way round; a range holding too many
/// rows falls back to the probes, and a run stops trying after `RangeReads::TRIES`.
async fn a_page_in_id_order_is_read_as_a_key_range_with_exactly_its_rows(b: Backend) {
    use std::sync::Arc;
    use webhook_reconciler::store::RangeReads;
    let db = TestDb::new(b);
    let store = store_on(&db).await;
    let id = |i: usize| format!("k{i:03}");
    let mut rows: Vec<Change> = (0..100).map(|i| order(&id(i), 1, "paid")).collect();
    let mut elsewhere = order("k050x", 1, "other account");
    elsewhere.account = "acct_2".into();
    rows.push(elsewhere);
    let mut other_kind = order("k050y", 1, "other kind");
    other_kind.kind = "refund".into();
    rows.push(other_kind);
    store.apply_batch(rows).await.unwrap();
    let mut tomb = order(&id(30), 2, "paid");
    tomb.state = None;
    tomb.action = Action::Delete;
    store.apply_event(delivery("e1", tomb)).await.unwrap();
    db.execute("UPDATE resources SET state_digest = NULL WHERE id = 'k020'");

    let key = Key::new("shop", "order");
    let sorted = |mut rows: Vec<webhook_reconciler::store::StoredRow>| {
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    };
    // Listed: every id but k010..k014 (deleted at the sender), and two ids not stored.
    let mut page: Vec<String> = (0..100).filter(|i| !(10..15).contains(i)).map(id).collect();
    let at = page.iter().position(|i| i == "k051").unwrap();
    page.insert(at, "k050z".into());
    page.push("k100".into());
    let ranges = Arc::new(RangeReads::default());
    let probed = sorted(store.stored_rows(&key, page.clone()).await.unwrap());
    assert_eq!(probed.len(), 95);
    let by_range = sorted(
        store
            .stored_rows_of_page(&key, page.clone(), ranges.clone())
            .await
            .unwrap(),
    );
    assert_eq!(by_range, probed);
    assert!(by_range.iter().all(|r| !(10..15).any(|i| r.id == id(i))));
    let k020 = by_range.iter().find(|r| r.id == "k020").unwrap();
    assert!(k020.digest.is_none() && k020.state.is_some(), "{k020:?}");
    assert!(by_range.iter().find(|r| r.id == "k030").unwrap().deleted);
    page.reverse();
    let descending = sorted(
        store
            .stored_rows_of_page(&key, page.clone(), ranges.clone())
            .await
            .unwrap(),
    );
    assert_eq!(descending, probed);
    assert_eq!((ranges.read(), ranges.in_vain()), (2, 0));

    // Not in id order: probed, no range tried.
    let shuffled: Vec<String> = ["k005", "k001", "k003"].map(String::from).to_vec();
    let rows = store
        .stored_rows_of_page(&key, shuffled.clone(), ranges.clone())
        .await
        .unwrap();
    assert_eq!(
        sorted(rows),
        sorted(store.stored_rows(&key, shuffled).await.unwrap())
    );
    assert_eq!((ranges.read(), ranges.in_vain()), (2, 0));

    // In id order, but the range holds 100 rows for 2 ids: probed instead.
    let sparse: Vec<String> = vec![id(0), id(99)];
    for attempt in 1..=RangeReads::TRIES + 1 {
        let rows = store
            .stored_rows_of_page(&key, sparse.clone(), ranges.clone())
            .await
            .unwrap();
        assert_eq!(
            sorted(rows)
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["k000", "k099"]
        );
        assert_eq!(
            (ranges.read(), ranges.in_vain()),
            (2, attempt.min(RangeReads::TRIES)),
            "after {} ranges in vain a run stops trying them",
            RangeReads::TRIES
        );
    }
}

//! The tie rule is written twice — in Rust (`change::tie`) and in SQL
//! (`store::sql::guard_condition`). One truth table runs through both, on both backends:
//! for every case, each guard writes the row exactly when the Rust rule admits it.

use webhook_reconciler::change::tie::{Guard, truth_table};
use webhook_reconciler::change::{Change, canonical_json};
use webhook_reconciler::config::Action;
use webhook_reconciler::store::{Delivery, Outcome};

use crate::helpers::{Backend, TestDb, both_backends, store_on};

both_backends!(the_sql_guard_writes_exactly_what_the_rust_tie_rule_admits);

async fn the_sql_guard_writes_exactly_what_the_rust_tie_rule_admits(backend: Backend) {
    let db = TestDb::new(backend);
    let store = store_on(&db).await;
    for (n, case) in truth_table().into_iter().enumerate() {
        for guard in [Guard::NewerOnly, Guard::NewerOrDifferent] {
            let id = format!("{n}-{guard:?}");
            if let Some((version, deleted, state)) = case.stored {
                // States reach the database canonical, as `change::read_state` makes them.
                let state = state.map(|s| {
                    canonical_json(&serde_json::from_str::<serde_json::Value>(s).unwrap())
                });
                let seed = Change {
                    source: "shop".into(),
                    account: String::new(),
                    kind: "order".into(),
                    id: id.clone(),
                    version,
                    state,
                    action: if deleted {
                        Action::Delete
                    } else {
                        Action::Upsert
                    },
                };
                assert_eq!(store.apply_batch(vec![seed]).await.unwrap().len(), 1);
            }
            let incoming = case.incoming("shop", "order", &id);
            let written = match guard {
                Guard::NewerOrDifferent => {
                    !store.apply_batch(vec![incoming]).await.unwrap().is_empty()
                }
                Guard::NewerOnly => {
                    let outcome = store
                        .apply_event(Delivery {
                            body_digest: None,
                            fetch: None,
                            settle_conflict: false,
                            source: "shop".into(),
                            event_id: format!("evt-{id}"),
                            event_type: "order.status_changed".into(),
                            change: Some(incoming),
                        })
                        .await
                        .unwrap();
                    outcome == Outcome::Applied
                }
            };
            assert_eq!(
                written,
                guard.admits(case.relation),
                "{} under {guard:?} on {backend:?}",
                case.name
            );
            let row = db.resource("shop", "order", &id).unwrap();
            if written {
                assert_eq!(row.version, case.version, "{}", case.name);
                assert_eq!(row.deleted, case.action == Action::Delete, "{}", case.name);
            } else if let Some((version, deleted, _)) = case.stored {
                assert_eq!(
                    (row.version, row.deleted),
                    (version, deleted),
                    "{}",
                    case.name
                );
            }
        }
    }
}

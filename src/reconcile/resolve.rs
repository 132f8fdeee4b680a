//! Conflict resolution: a webhook answered `conflict` (same version, other state), or a
//! listed item of a kind versioned by fetch time seen in the same second as the local
//! row, is settled from the sender's current state, fetched through the kind's `get`
//! endpoint and applied through the same guarded write as a listing.

use std::time::Duration;

use super::{Reconciler, RunCounts, compare, item_pointers};
use crate::change::Key;

/// How often a resource versioned by fetch time is fetched while the sender's clock
/// is still in the second of the local row (the answer would be ambiguous again).
const SAME_SECOND_ATTEMPTS: u32 = 4;
/// The wait between those fetches: the sender's clock has whole seconds.
const NEXT_SECOND: Duration = Duration::from_millis(1000);

impl Reconciler {
    /// Fetches one resource from the sender and applies it. `Ok(false)`: the kind has no
    /// `get`, the sender does not have it, or it changed nothing.
    pub async fn resolve(&self, source: &str, kind: &str, id: &str) -> Result<bool, String> {
        self.resolve_in(source, "", kind, id).await
    }

    /// [`Reconciler::resolve`] in `account` of a many-account source, through that
    /// account's API.
    pub async fn resolve_in(
        &self,
        source: &str,
        account: &str,
        kind: &str,
        id: &str,
    ) -> Result<bool, String> {
        let Some((s, k)) = self
            .config
            .sources
            .iter()
            .filter(|s| s.name == source)
            .flat_map(|s| s.kinds.iter().map(move |k| (s, k)))
            .find(|(_, k)| k.name == kind)
        else {
            return Err(format!("unknown kind {source}/{kind}"));
        };
        if k.get.is_none() {
            return Ok(false);
        }
        let sender = self
            .sender_for(source, account)
            .await
            .map_err(|e| e.to_string())?;
        let fetch_time = k.by_fetch_time();
        for attempt in 1..=SAME_SECOND_ATTEMPTS {
            let Some(fetched) = sender.get_one(k, id).await.map_err(|e| e.to_string())? else {
                return Ok(false);
            };
            let mut change = item_pointers(k, chrono::Utc::now().timestamp_micros())
                .read(&fetched.item, &s.name, &k.name)
                .map_err(|e| format!("GET {id}: {e}"))?;
            change.account = account.to_string();
            if let Some(date) = fetched.date {
                change.version = date;
            }
            let local = self
                .store
                .stored_rows(
                    &Key::new(source, kind).in_account(account),
                    vec![change.id.clone()],
                )
                .await
                .map_err(|e| e.to_string())?;
            let verdicts = compare::compare_page(
                std::slice::from_ref(&change),
                &local,
                fetch_time,
                &mut RunCounts::default(),
            );
            if !verdicts.ambiguous.is_empty() {
                // Fetched in the second of the local row: wait for the sender's clock.
                if attempt < SAME_SECOND_ATTEMPTS {
                    tokio::time::sleep(NEXT_SECOND).await;
                    continue;
                }
                return Err(format!(
                    "GET {id}: the sender's Date is still the second of the local row after {attempt} fetches; left for the next reconcile"
                ));
            }
            if verdicts.write.is_empty() {
                return Ok(false);
            }
            let written = self
                .store
                .apply_batch_with(vec![change], compare::guard_for(fetch_time))
                .await
                .map_err(|e| e.to_string())?;
            return Ok(!written.is_empty());
        }
        Ok(false)
    }
}

//! Conflict resolution: a webhook answered `conflict` (same version, other state) is
//! settled from the sender's current state, fetched through the kind's `get` endpoint
//! and applied through the same guarded write as a listing.

use super::{Reconciler, item_pointers};

impl Reconciler {
    /// Fetches one resource from the sender and applies it. `Ok(false)`: the kind has no
    /// `get`, the sender does not have it, or it changed nothing.
    pub async fn resolve(&self, source: &str, kind: &str, id: &str) -> Result<bool, String> {
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
        let sender = self.sender(source).ok_or("no sender")?;
        let Some(item) = sender.get_one(k, id).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        let change = item_pointers(k)
            .read(&item, &s.name, &k.name)
            .map_err(|e| format!("GET {id}: {e}"))?;
        let written = self
            .store
            .apply_batch(vec![change])
            .await
            .map_err(|e| e.to_string())?;
        Ok(!written.is_empty())
    }
}

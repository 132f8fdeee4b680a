//! `explain`: one resource's story — its row, the events claimed for it, a fetch still
//! pending (or failed) for it, its changes and the reconcile runs that wrote it.

use serde::Serialize;

use super::{OpError, Operations};
use crate::bookkeeping::RunRow;
use crate::change::{Key, ResourceKey};
use crate::feed::ResourceChange;
use crate::store::{ClaimRow, FetchRow, ResourceRow};

/// Most claims and changes shown (the newest are what a support ticket needs; the
/// counts say when there are more).
const LIMIT: i64 = 200;

#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub source: String,
    pub account: String,
    pub kind: String,
    pub id: String,
    /// `None`: no row (never written, or purged).
    pub row: Option<ResourceRow>,
    /// Events claimed for it, oldest first, with their outcome.
    pub claims: Vec<ClaimRow>,
    /// A fetch from the sender still to do (a delivery answered `fetching`, a conflict
    /// to settle), or kept as failed after its last attempt.
    pub pending_fetch: Option<FetchRow>,
    /// Its kept changes, in seq order (older ones may be pruned by `retention.changes`).
    pub changes: Vec<ResourceChange>,
    /// The reconcile runs that wrote a change of it.
    pub runs: Vec<RunRow>,
    /// On a many-account source asked without an account: the accounts that hold a row
    /// with this id (at most 20).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_accounts: Vec<String>,
    /// Asked with an account: its registration (enabled, or why and since when it is
    /// disabled: an operator, `app/uninstalled`, a suspension); `None` when it is not
    /// registered (never, or removed, or erased).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered: Option<crate::accounts::AccountRow>,
}

impl Explanation {
    /// Nothing is known of the resource: no row, claim, pending fetch or change.
    pub fn is_unknown(&self) -> bool {
        self.row.is_none()
            && self.claims.is_empty()
            && self.pending_fetch.is_none()
            && self.changes.is_empty()
    }
}

impl Operations {
    pub async fn explain(
        &self,
        source: &str,
        kind: &str,
        id: &str,
        account: Option<&str>,
    ) -> Result<Explanation, OpError> {
        self.check_kind(source, kind)?;
        let account = account.unwrap_or("");
        let key = ResourceKey::new(source, account, kind, id).to_owned();
        let row = self.store.resource_row(&key).await?;
        let claims = self.store.claims_of(&key, LIMIT).await?;
        let pending_fetch = self.store.pending_fetch(&key).await?;
        let changes = self.feed.changes_of(&key, LIMIT).await?;
        let runs_key = Key::new(source, kind).in_account(account);
        let mut runs: Vec<RunRow> = Vec::new();
        for c in changes.iter().filter(|c| c.origin == "reconcile") {
            for r in self.book.runs_at(&runs_key, &c.changed_at).await? {
                if !runs.iter().any(|known| known.started_at == r.started_at) {
                    runs.push(r);
                }
            }
        }
        let many = self
            .config
            .source(source)
            .is_some_and(|s| s.accounts.is_some());
        let in_accounts = if many && account.is_empty() {
            self.store
                .accounts_with(source, kind, id, 20)
                .await?
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        let registered = if many && !account.is_empty() {
            self.registry().get(source, account).await?
        } else {
            None
        };
        Ok(Explanation {
            in_accounts,
            registered,
            source: source.to_string(),
            account: account.to_string(),
            kind: kind.to_string(),
            id: id.to_string(),
            row,
            claims,
            pending_fetch,
            changes,
            runs,
        })
    }
}

//! Many accounts behind one sender (SPEC "Many accounts per sender"): Stripe Connect
//! accounts, Shopify shops, GitHub App installations. The registry (`accounts`, owned
//! here) says which accounts a many-account source serves; a delivery is applied to the
//! account its signed body names only when that account is registered and enabled.
//! [`credential`] seals an account's credential at rest.

pub mod credential;
mod sql;

pub use sql::AccountRow;

use crate::db::{Db, DbError};

/// The accounts registry. Cheap to clone.
#[derive(Clone)]
pub struct Accounts {
    db: Db,
}

impl Accounts {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Registers `account` of `source` (enabled again if it was disabled).
    pub async fn add(&self, source: &str, account: &str) -> Result<(), DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.write(move |c| sql::add(c, &s, &a)).await
    }

    /// The registered accounts of `source` (`None`: of every source).
    pub async fn list(&self, source: Option<&str>) -> Result<Vec<AccountRow>, DbError> {
        let s = source.unwrap_or_default().to_string();
        self.db.read(move |c| sql::list(c, &s)).await
    }

    /// Whether deliveries for `account` of `source` are applied.
    pub async fn is_enabled(&self, source: &str, account: &str) -> Result<bool, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.read(move |c| sql::is_enabled(c, &s, &a)).await
    }

    /// Enables or disables an account; false when it is not registered.
    pub async fn set_enabled(
        &self,
        source: &str,
        account: &str,
        enabled: bool,
    ) -> Result<bool, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db
            .write(move |c| sql::set_enabled(c, &s, &a, enabled))
            .await
    }

    /// Removes an account from the registry; false when it was not registered.
    pub async fn remove(&self, source: &str, account: &str) -> Result<bool, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.write(move |c| sql::remove(c, &s, &a)).await
    }
}

//! Many accounts behind one sender (SPEC "Many accounts per sender"): Stripe Connect
//! accounts, Shopify shops, GitHub App installations. The registry (`accounts`, owned
//! here) says which accounts a many-account source serves; a delivery is applied to the
//! account its signed body names only when that account is registered and enabled.
//! An account's credential is sealed at rest by `crate::credential`; `lifecycle` holds
//! the registry's own rules (an account id's shape, the one removal sequence). The
//! operator adds and removes accounts through `operations`.

pub mod lifecycle;
mod sql;

pub use sql::{AccountAge, AccountRow};

use secrecy::SecretString;

use crate::credential;
use crate::db::{Db, DbError};

/// How the daemon reaches one account's API.
pub struct Access {
    pub enabled: bool,
    /// Its own base URL (`None`: the source's template or base).
    pub api_base: Option<String>,
    /// Its own credential (`None`: the source's).
    pub credential: Option<SecretString>,
}

/// Why an account could not be added.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The account is registered with another base URL: a second `add` never moves it
    /// (the kept credential would follow the new base).
    #[error(
        "account {account:?} is registered with api_base {}; an `add` never changes it. Remove the account and add it again with the new base and its credential",
        registered.as_deref().map_or_else(|| "the source's".to_string(), |b| format!("{b:?}"))
    )]
    OtherBase {
        account: String,
        registered: Option<String>,
    },
    #[error(transparent)]
    Seal(#[from] credential::CredentialError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Why an account's credential could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(
        "a credential is kept for this account but accounts.key is not set; set accounts.key to the key it was sealed with"
    )]
    NoKey,
    #[error(transparent)]
    Open(#[from] credential::CredentialError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// The accounts registry. Cheap to clone.
#[derive(Clone)]
pub struct Accounts {
    db: Db,
}

impl Accounts {
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Registers `account` of `source` (enabled again if it was disabled), with its own
    /// API base and credential sealed by `key` (those not given are kept).
    pub async fn add(
        &self,
        source: &str,
        account: &str,
        api_base: Option<String>,
        credential: Option<(&credential::AccountsKey, &SecretString)>,
    ) -> Result<(), AddError> {
        let sealed = credential
            .map(|(key, c)| key.seal(source, account, c))
            .transpose()?;
        let (s, a) = (source.to_string(), account.to_string());
        let kept = self
            .db
            .write(move |c| {
                // Checked in the same transaction as the write: an account's base is
                // never changed by a second `add` (its credential would go along to it).
                if let (Some(given), Some(row)) = (&api_base, sql::access(c, &s, &a)?) {
                    if row.api_base.as_deref() != Some(given.as_str()) {
                        return Ok(Err(row.api_base));
                    }
                }
                sql::add(c, &s, &a, api_base.as_deref(), sealed.as_deref()).map(Ok)
            })
            .await?;
        kept.map_err(|registered| AddError::OtherBase {
            account: account.to_string(),
            registered,
        })
    }

    /// How to reach `account`'s API: its base URL and credential (opened with `key`).
    /// `Ok(None)`: not registered. A credential `key` cannot open fails this account only.
    pub async fn access(
        &self,
        source: &str,
        account: &str,
        key: Option<&credential::AccountsKey>,
    ) -> Result<Option<Access>, AccessError> {
        let (s, a) = (source.to_string(), account.to_string());
        let Some(row) = self.db.read(move |c| sql::access(c, &s, &a)).await? else {
            return Ok(None);
        };
        let credential = match (row.credential, key) {
            (None, _) => None,
            (Some(_), None) => return Err(AccessError::NoKey),
            (Some(sealed), Some(key)) => Some(key.open(source, account, &sealed)?),
        };
        Ok(Some(Access {
            enabled: row.enabled,
            api_base: row.api_base,
            credential,
        }))
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

    /// Seconds since each enabled registered account was added (an account that never
    /// succeeded ages from then).
    pub async fn enabled_ages(&self) -> Result<Vec<AccountAge>, DbError> {
        self.db.read(sql::enabled_account_ages).await
    }
}

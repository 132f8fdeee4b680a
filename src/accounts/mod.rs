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

/// A deliberate change of an account's access (`accounts set`, `PATCH`).
#[derive(Debug, Default)]
pub struct AccessChange {
    /// `None`: unchanged; `Some(None)`: cleared (the source's template or base again).
    pub api_base: Option<Option<String>>,
    /// A new credential (`None`: the kept one, which cannot follow a new base).
    pub credential: Option<SecretString>,
}

/// Why an account's access could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    #[error(
        "account {account:?} keeps a credential given for its current api_base; a new base needs its credential given again (--token-file FILE or --token-env VAR; \"credential\" in the admin API)"
    )]
    CredentialStays { account: String },
    #[error(
        "a credential is kept encrypted with accounts.key, which is not set; make one with `webhook-reconciler secret new --raw` and set accounts.key"
    )]
    NoKey,
    #[error(
        "the account changed while this change was made; look at it again (accounts list) and retry"
    )]
    Concurrent,
    #[error(transparent)]
    Seal(#[from] credential::CredentialError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What `rekey` did.
#[derive(Debug, Default, serde::Serialize)]
pub struct Rekeyed {
    pub resealed: usize,
    /// (source, account, why) of each credential left as it was.
    pub failed: Vec<(String, String, String)>,
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
    /// API base and credential sealed by `key`, bound to the base (those not given are
    /// kept). A registered account's base is never changed here (`set` does that).
    pub async fn add(
        &self,
        source: &str,
        account: &str,
        api_base: Option<String>,
        credential: Option<(&credential::AccountsKey, &SecretString)>,
    ) -> Result<(), AddError> {
        let (s, a) = (source.to_string(), account.to_string());
        let row = self.db.read(move |c| sql::access(c, &s, &a)).await?;
        let registered = row.as_ref().map(|r| r.api_base.clone());
        if let (Some(given), Some(registered)) = (&api_base, &registered) {
            if registered.as_deref() != Some(given.as_str()) {
                return Err(AddError::OtherBase {
                    account: account.to_string(),
                    registered: registered.clone(),
                });
            }
        }
        let base = api_base.clone().or(registered.clone().flatten());
        let sealed = credential
            .map(|(key, c)| key.seal(source, account, base.as_deref(), c))
            .transpose()?;
        let (s, a) = (source.to_string(), account.to_string());
        let kept = self
            .db
            .write(move |c| {
                // Checked again in the write's transaction: the credential was sealed
                // for the base read above.
                let now = sql::access(c, &s, &a)?.map(|r| r.api_base);
                if now.is_some() && now != registered {
                    return Ok(Err(now.flatten()));
                }
                sql::add(c, &s, &a, api_base.as_deref(), sealed.as_deref()).map(Ok)
            })
            .await?;
        kept.map_err(|registered| AddError::OtherBase {
            account: account.to_string(),
            registered,
        })
    }

    /// Changes a registered account's base and/or credential deliberately (`accounts
    /// set`). A new base takes a new credential with it when the account keeps one: the
    /// old one was given for the old base and never follows it. `Ok(false)`: not
    /// registered.
    pub async fn set(
        &self,
        source: &str,
        account: &str,
        change: AccessChange,
        key: Option<&credential::AccountsKey>,
    ) -> Result<bool, SetError> {
        let (s, a) = (source.to_string(), account.to_string());
        let Some(row) = self.db.read(move |c| sql::access(c, &s, &a)).await? else {
            return Ok(false);
        };
        let base = match &change.api_base {
            None => row.api_base.clone(),
            Some(b) => b.clone(),
        };
        let moved = base != row.api_base;
        let sealed = match (&change.credential, key) {
            (Some(c), Some(key)) => Some(key.seal(source, account, base.as_deref(), c)?),
            (Some(_), None) => return Err(SetError::NoKey),
            (None, _) if moved && row.credential.is_some() => {
                return Err(SetError::CredentialStays {
                    account: account.to_string(),
                });
            }
            (None, _) => row.credential.clone(),
        };
        let (s, a) = (source.to_string(), account.to_string());
        let replaced = self
            .db
            .write(move |c| {
                sql::replace_access(
                    c,
                    &s,
                    &a,
                    (row.api_base.as_deref(), row.credential.as_deref()),
                    (base.as_deref(), sealed.as_deref()),
                )
            })
            .await?;
        if replaced {
            Ok(true)
        } else {
            Err(SetError::Concurrent)
        }
    }

    /// Re-seals every kept credential under `keys.key` (opened with it or with
    /// `keys.previous`), each bound to its account's base: after it, `previous` can go.
    /// Each account is its own write, so every credential opens at every moment.
    pub async fn rekey(&self, keys: credential::Keys<'_>) -> Result<Rekeyed, DbError> {
        let rows = self.db.read(sql::sealed_credentials).await?;
        let mut out = Rekeyed::default();
        for row in rows {
            let plain = match keys.open_any_form(
                &row.source,
                &row.account,
                row.api_base.as_deref(),
                &row.credential,
            ) {
                Ok(p) => p,
                Err(e) => {
                    out.failed.push((row.source, row.account, e.to_string()));
                    continue;
                }
            };
            let sealed =
                match keys
                    .key
                    .seal(&row.source, &row.account, row.api_base.as_deref(), &plain)
                {
                    Ok(s) => s,
                    Err(e) => {
                        out.failed.push((row.source, row.account, e.to_string()));
                        continue;
                    }
                };
            let (s, a, base, old) = (
                row.source.clone(),
                row.account.clone(),
                row.api_base.clone(),
                row.credential,
            );
            let done = self
                .db
                .write(move |c| {
                    sql::replace_access(
                        c,
                        &s,
                        &a,
                        (base.as_deref(), Some(&old)),
                        (base.as_deref(), Some(&sealed)),
                    )
                })
                .await?;
            if done {
                out.resealed += 1;
            } else {
                out.failed.push((
                    row.source,
                    row.account,
                    "changed while it was re-sealed; run rekey again".into(),
                ));
            }
        }
        Ok(out)
    }

    /// How to reach `account`'s API: its base URL and credential (opened with `keys`,
    /// bound to that base). `Ok(None)`: not registered. A credential the keys cannot
    /// open fails this account only.
    pub async fn access(
        &self,
        source: &str,
        account: &str,
        keys: Option<credential::Keys<'_>>,
    ) -> Result<Option<Access>, AccessError> {
        let (s, a) = (source.to_string(), account.to_string());
        let Some(row) = self.db.read(move |c| sql::access(c, &s, &a)).await? else {
            return Ok(None);
        };
        let credential = match (row.credential, keys) {
            (None, _) => None,
            (Some(_), None) => return Err(AccessError::NoKey),
            (Some(sealed), Some(keys)) => {
                Some(keys.open(source, account, row.api_base.as_deref(), &sealed)?)
            }
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

    /// One registered account (`None`: not registered).
    pub async fn get(&self, source: &str, account: &str) -> Result<Option<AccountRow>, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.read(move |c| sql::one(c, &s, &a)).await
    }

    /// Whether `account` of `source` is enabled, and its own base URL; `None`: not
    /// registered. Nothing is opened.
    pub async fn enabled_base(
        &self,
        source: &str,
        account: &str,
    ) -> Result<Option<(bool, Option<String>)>, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        let row = self.db.read(move |c| sql::access(c, &s, &a)).await?;
        Ok(row.map(|r| (r.enabled, r.api_base)))
    }

    /// Whether deliveries for `account` of `source` are applied.
    pub async fn is_enabled(&self, source: &str, account: &str) -> Result<bool, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.read(move |c| sql::is_enabled(c, &s, &a)).await
    }

    /// Enables an account (`disabled_for` `None`), or disables it and says why (shown
    /// by `accounts list` with the time); false when it is not registered.
    pub async fn set_enabled(
        &self,
        source: &str,
        account: &str,
        disabled_for: Option<&str>,
    ) -> Result<bool, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        let reason = disabled_for.map(String::from);
        self.db
            .write(move |c| sql::set_enabled(c, &s, &a, reason.as_deref()))
            .await
    }

    /// Disables an account the platform says uninstalled the app, naming the delivery
    /// that said so; false when it is not registered.
    pub async fn uninstall(
        &self,
        source: &str,
        account: &str,
        reason: &str,
        event_id: &str,
    ) -> Result<bool, DbError> {
        let (s, a, r, e) = (
            source.to_string(),
            account.to_string(),
            reason.to_string(),
            event_id.to_string(),
        );
        self.db
            .write(move |c| sql::uninstall(c, &s, &a, &r, &e))
            .await
    }

    /// The delivery that uninstalled `account` since its last registration (`None`:
    /// not registered; `Some(None)`: installed now).
    pub async fn uninstalled_by(
        &self,
        source: &str,
        account: &str,
    ) -> Result<Option<Option<String>>, DbError> {
        let (s, a) = (source.to_string(), account.to_string());
        self.db.read(move |c| sql::uninstalled_by(c, &s, &a)).await
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

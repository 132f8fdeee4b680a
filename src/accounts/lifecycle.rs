//! An account's life, the same from the command line and the admin API: added (its
//! credential sealed, its first full sync due at once), disabled and enabled, removed
//! (its rows tombstoned through the store, changes appended, or purged).

use std::sync::Arc;

use secrecy::SecretString;

use super::{AccountRow, Accounts, AddError};
use crate::config::Config;
use crate::db::DbError;
use crate::store::Store;

/// Why an account operation was refused or failed. `caller_error()` tells a mistake of
/// the request (exit 2, HTTP 400/404) from a failure.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("no source {0:?} in the configuration")]
    UnknownSource(String),
    #[error(
        "source {0:?} serves one account; add [sources.{0}.accounts] (with `from`, where a delivery's signed body names its account) to serve many"
    )]
    SingleAccount(String),
    #[error("account {account:?}: {why}")]
    BadAccount { account: String, why: String },
    #[error("api_base {0:?} is not an http(s) URL")]
    BadApiBase(String),
    #[error(
        "a credential is kept encrypted with accounts.key, which is not set; make one with `webhook-reconciler secret new --raw` and set accounts.key"
    )]
    NoKey,
    #[error("account {account:?} of {of:?} is not registered")]
    NotRegistered { of: String, account: String },
    #[error(transparent)]
    Add(#[from] AddError),
    #[error(transparent)]
    Db(#[from] DbError),
}

impl LifecycleError {
    /// The request was wrong (not the database, not the sealing).
    pub fn caller_error(&self) -> bool {
        !matches!(
            self,
            Self::Add(AddError::Seal(_) | AddError::Db(_)) | Self::Db(_)
        )
    }
}

/// What `remove` did to the account's rows.
#[derive(Debug, serde::Serialize)]
pub struct Removed {
    pub rows: usize,
    pub purged: bool,
}

/// Adds, lists, switches and removes accounts.
#[derive(Clone)]
pub struct Lifecycle {
    config: Arc<Config>,
    registry: Accounts,
    /// Where each account-kind's schedule is kept.
    book: crate::bookkeeping::Bookkeeping,
    store: Store,
}

impl Lifecycle {
    pub fn new(config: Arc<Config>, store: Store) -> Self {
        Self {
            config,
            registry: Accounts::new(store.db().clone()),
            book: crate::bookkeeping::Bookkeeping::new(store.db().clone()),
            store,
        }
    }

    /// The source, if it serves many accounts, and the account id, if it is one.
    fn check(&self, source: &str, account: Option<&str>) -> Result<(), LifecycleError> {
        Self::check_request(&self.config, source, account)
    }

    /// What every call checks before the database is touched: the source exists and
    /// serves many accounts, and the account id (if any) is one. The CLI asks it before
    /// it opens the database.
    pub fn check_request(
        config: &Config,
        source: &str,
        account: Option<&str>,
    ) -> Result<(), LifecycleError> {
        match config.source(source) {
            None => return Err(LifecycleError::UnknownSource(source.into())),
            Some(s) if s.accounts.is_none() => {
                return Err(LifecycleError::SingleAccount(source.into()));
            }
            Some(_) => {}
        }
        if let Some(account) = account {
            let preset = config.source(source).and_then(|s| s.preset);
            account_id_rule(preset, account).map_err(|why| LifecycleError::BadAccount {
                account: account.into(),
                why,
            })?;
        }
        Ok(())
    }

    /// Registers an account (or enables it again) and makes its first full sync due
    /// now: a running daemon starts it within seconds.
    pub async fn add(
        &self,
        source: &str,
        account: &str,
        api_base: Option<String>,
        credential: Option<SecretString>,
    ) -> Result<(), LifecycleError> {
        self.check(source, Some(account))?;
        if let Some(b) = &api_base {
            if crate::config::origin_of(b).is_none() {
                return Err(LifecycleError::BadApiBase(b.clone()));
            }
        }
        let key = match (&credential, &self.config.accounts_key) {
            (Some(c), Some(k)) => Some((k.as_ref(), c)),
            (Some(_), None) => return Err(LifecycleError::NoKey),
            (None, _) => None,
        };
        self.registry.add(source, account, api_base, key).await?;
        let kinds = self.kinds(source);
        self.book.due_now(source, account, kinds).await?;
        Ok(())
    }

    /// The kinds reconciled per account: every kind with a listing, and catch-up.
    fn kinds(&self, source: &str) -> Vec<String> {
        self.config
            .source(source)
            .map(|s| s.reconciled_kinds().map(|k| k.name.clone()).collect())
            .unwrap_or_default()
    }

    pub async fn list(&self, source: Option<&str>) -> Result<Vec<AccountRow>, LifecycleError> {
        if let Some(s) = source {
            self.check(s, None)?;
        }
        Ok(self.registry.list(source).await?)
    }

    /// Enables or disables a registered account.
    pub async fn set_enabled(
        &self,
        source: &str,
        account: &str,
        enabled: bool,
    ) -> Result<(), LifecycleError> {
        self.check(source, Some(account))?;
        if !self.registry.set_enabled(source, account, enabled).await? {
            return Err(self.not_registered(source, account));
        }
        if enabled {
            self.book
                .due_now(source, account, self.kinds(source))
                .await?;
        } else {
            self.book.unschedule_account(source, account).await?;
        }
        Ok(())
    }

    fn not_registered(&self, source: &str, account: &str) -> LifecycleError {
        LifecycleError::NotRegistered {
            of: source.into(),
            account: account.into(),
        }
    }

    /// Unregisters an account: disabled first (no delivery writes a row of it
    /// meanwhile), its rows tombstoned (changes appended) or purged, unregistered last
    /// (a failure halfway leaves it disabled, and removing again finishes the job).
    pub async fn remove(
        &self,
        source: &str,
        account: &str,
        purge: bool,
    ) -> Result<Removed, LifecycleError> {
        self.check(source, Some(account))?;
        let removed = unregister(&self.store, source, account, purge).await?;
        removed.ok_or_else(|| self.not_registered(source, account))
    }
}

/// The one removal sequence (`accounts remove`, the admin API, Shopify's `shop/redact`):
/// disabled first (no delivery writes a row of it meanwhile), its rows tombstoned (changes
/// appended) or, with `purge`, erased (`Store::purge_account`), its schedule and last
/// successes forgotten, unregistered last (a failure halfway leaves it disabled, and
/// removing again finishes the job). `None`: it was not registered.
pub async fn unregister(
    store: &Store,
    source: &str,
    account: &str,
    purge: bool,
) -> Result<Option<Removed>, DbError> {
    let registry = Accounts::new(store.db().clone());
    if !registry.set_enabled(source, account, false).await? {
        return Ok(None);
    }
    let rows = if purge {
        store.purge_account(source, account).await?
    } else {
        store.tombstone_account(source, account).await?
    };
    crate::bookkeeping::Bookkeeping::new(store.db().clone())
        .forget_account(source, account)
        .await?;
    registry.remove(source, account).await?;
    Ok(Some(Removed {
        rows,
        purged: purge,
    }))
}

/// Whether `account` may be registered: an id (non-empty, at most 1,024 bytes, no NUL),
/// never carrying `/ ? # @ :`, whitespace or a control character (an account id goes
/// into URLs, `https://{account}/...` for Shopify, and must never steer a request, or a
/// credential, to another host), and of its preset's shape: Stripe `acct_` and letters
/// or digits, Shopify a host name ending in `.myshopify.com`, GitHub digits.
pub fn account_id_rule(preset: Option<crate::config::Preset>, account: &str) -> Result<(), String> {
    use crate::config::Preset;
    crate::change::limits::check_id(account)?;
    if let Some(c) = account
        .chars()
        .find(|c| matches!(c, '/' | '?' | '#' | '@' | ':') || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "it contains {c:?}; an account id never carries / ? # @ :, whitespace or control characters"
        ));
    }
    let shop_host = |shop: &str| {
        !shop.is_empty()
            && shop
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    };
    let misshapen = match preset {
        None => None,
        Some(Preset::Stripe) => (!account.strip_prefix("acct_").is_some_and(|rest| {
            !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric())
        }))
        .then_some(
            "a Stripe account id is acct_ followed by letters or digits (acct_1Nv0FGQ9RKHgCVdK)",
        ),
        Some(Preset::Shopify) => (!account
            .strip_suffix(".myshopify.com")
            .is_some_and(shop_host))
        .then_some("a Shopify shop is its host name ending in .myshopify.com (acme.myshopify.com)"),
        Some(Preset::Github) => (!account.chars().all(|c| c.is_ascii_digit()))
            .then_some("a GitHub App installation id is digits (4711)"),
    };
    match misshapen {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::account_id_rule;
    use crate::config::Preset;

    #[test]
    fn account_ids_that_could_steer_a_url_or_break_a_presets_shape_are_refused() {
        for (preset, ok) in [
            (Some(Preset::Stripe), "acct_1Nv0FGQ9RKHgCVdK"),
            (Some(Preset::Shopify), "acme.myshopify.com"),
            (Some(Preset::Shopify), "my-shop-2.myshopify.com"),
            (Some(Preset::Github), "4711"),
            (None, "tenant-7"),
        ] {
            assert_eq!(account_id_rule(preset, ok), Ok(()), "{ok}");
        }
        for (preset, bad) in [
            (Some(Preset::Shopify), "evil.com/x?"),
            (Some(Preset::Shopify), "evil.com#.myshopify.com"),
            (Some(Preset::Shopify), "evil.com"),
            (Some(Preset::Shopify), ".myshopify.com"),
            (Some(Preset::Shopify), "user@evil.com"),
            (Some(Preset::Stripe), "acct_"),
            (Some(Preset::Stripe), "acct_../x"),
            (Some(Preset::Stripe), "a"),
            (Some(Preset::Github), "47x"),
            (None, "a b"),
            (None, "host:8080"),
            (None, "line\nbreak"),
            (None, ""),
        ] {
            assert!(account_id_rule(preset, bad).is_err(), "{bad:?}");
        }
    }
}

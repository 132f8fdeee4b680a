//! An account's life, beside the other operations and through the same door for the
//! command line and the admin API: added (its credential sealed, its first full sync due
//! at once), listed, disabled and enabled, removed (its rows tombstoned, changes
//! appended, or purged: `accounts::lifecycle::unregister`).

use secrecy::SecretString;

use super::{OpError, Operations};
use crate::accounts::lifecycle::{Removed, account_id_rule, unregister};
use crate::accounts::{AccessChange, AccountRow, Accounts, Rekeyed};
use crate::config::Config;

impl Operations {
    pub(super) fn registry(&self) -> Accounts {
        Accounts::new(self.store.db().clone())
    }

    /// What every account call checks before the database is touched: the source exists
    /// and serves many accounts, and the account id (if any) is one. The command line
    /// asks it before it opens the database.
    pub fn check_account_request(
        config: &Config,
        source: &str,
        account: Option<&str>,
    ) -> Result<(), OpError> {
        let s = config
            .source(source)
            .ok_or_else(|| OpError::UnknownSource(source.into()))?;
        if s.accounts.is_none() {
            return Err(OpError::SingleAccount(source.into()));
        }
        if let Some(account) = account {
            account_id_rule(s.preset, account).map_err(|why| OpError::BadAccount {
                account: account.into(),
                why,
            })?;
        }
        Ok(())
    }

    fn check_account(&self, source: &str, account: Option<&str>) -> Result<(), OpError> {
        Self::check_account_request(&self.config, source, account)
    }

    /// Registers an account (or enables it again) and makes its first full sync due
    /// now: a running daemon starts it within seconds.
    pub async fn add_account(
        &self,
        source: &str,
        account: &str,
        api_base: Option<String>,
        credential: Option<SecretString>,
    ) -> Result<(), OpError> {
        self.check_account(source, Some(account))?;
        if let Some(b) = &api_base {
            self.check_base(source, b)?;
        }
        let key = match (&credential, &self.config.accounts_key) {
            (Some(c), Some(k)) => Some((k.as_ref(), c)),
            (Some(_), None) => return Err(OpError::NoAccountsKey),
            (None, _) => None,
        };
        self.registry().add(source, account, api_base, key).await?;
        self.book
            .due_now(source, account, self.reconciled_kinds(source))
            .await?;
        Ok(())
    }

    /// An account's own base: an http(s) URL under the source's allowed prefixes.
    fn check_base(&self, source: &str, base: &str) -> Result<(), OpError> {
        if crate::config::origin_of(base).is_none() {
            return Err(OpError::BadApiBase(base.to_string()));
        }
        let Some(accounts) = self.config.source(source).and_then(|s| s.accounts.as_ref()) else {
            return Err(OpError::SingleAccount(source.to_string()));
        };
        if !accounts.base_allowed(base) {
            return Err(OpError::BaseNotAllowed {
                source_name: source.to_string(),
                base: base.to_string(),
                allowed: accounts.api_bases_text(),
            });
        }
        Ok(())
    }

    /// Changes a registered account's base and/or credential deliberately; a new base
    /// needs the credential again when the account keeps one.
    pub async fn set_account(
        &self,
        source: &str,
        account: &str,
        change: AccessChange,
    ) -> Result<(), OpError> {
        self.check_account(source, Some(account))?;
        if change.api_base.is_none() && change.credential.is_none() {
            return Err(OpError::NothingToChange);
        }
        if let Some(Some(b)) = &change.api_base {
            self.check_base(source, b)?;
        }
        if self
            .registry()
            .set(source, account, change, self.config.accounts_key.as_deref())
            .await?
        {
            Ok(())
        } else {
            Err(not_registered(source, account))
        }
    }

    /// Re-seals every kept credential under `accounts.key`, opened with it or with
    /// `accounts.previous_key`, each bound to its account's base.
    pub async fn rekey_accounts(&self) -> Result<Rekeyed, OpError> {
        let keys = self.config.account_keys().ok_or(OpError::NoAccountsKey)?;
        Ok(self.registry().rekey(keys).await?)
    }

    /// The kinds reconciled per account: every kind with a listing, and catch-up.
    fn reconciled_kinds(&self, source: &str) -> Vec<String> {
        self.config
            .source(source)
            .map(|s| s.reconciled_kinds().map(|k| k.name.clone()).collect())
            .unwrap_or_default()
    }

    /// The registered accounts (of one source, or all).
    pub async fn accounts(&self, source: Option<&str>) -> Result<Vec<AccountRow>, OpError> {
        if let Some(s) = source {
            self.check_account(s, None)?;
        }
        Ok(self.registry().list(source).await?)
    }

    /// Enables or disables a registered account.
    pub async fn set_account_enabled(
        &self,
        source: &str,
        account: &str,
        enabled: bool,
    ) -> Result<(), OpError> {
        self.check_account(source, Some(account))?;
        if !self
            .registry()
            .set_enabled(
                source,
                account,
                (!enabled).then_some("disabled by an operator"),
            )
            .await?
        {
            return Err(not_registered(source, account));
        }
        if enabled {
            self.book
                .due_now(source, account, self.reconciled_kinds(source))
                .await?;
        } else {
            self.book.unschedule_account(source, account).await?;
        }
        Ok(())
    }

    /// Unregisters an account (`accounts::lifecycle::unregister`: disabled first, rows
    /// tombstoned or purged, unregistered last).
    pub async fn remove_account(
        &self,
        source: &str,
        account: &str,
        purge: bool,
    ) -> Result<Removed, OpError> {
        self.check_account(source, Some(account))?;
        unregister(&self.store, source, account, purge)
            .await?
            .ok_or_else(|| not_registered(source, account))
    }
}

fn not_registered(source: &str, account: &str) -> OpError {
    OpError::NotRegistered {
        of: source.into(),
        account: account.into(),
    }
}

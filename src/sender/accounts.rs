//! A many-account source's clients: each account's header, base URL, credential (or
//! GitHub App installation token) and request budget.

use std::sync::Arc;

use secrecy::SecretString;

use super::{Sender, SenderError, budget, github_app};
use crate::config::{SourceConfig, origin_of};

/// How a many-account source's requests reach each account.
pub(super) struct AccountsAccess {
    /// The header naming the account on every request (Stripe's `Stripe-Account`).
    pub(super) header: Option<reqwest::header::HeaderName>,
    /// A base URL per account, `{account}` in it.
    pub(super) api_base: Option<String>,
    /// Where an account's own base may point (`accounts.api_bases`).
    pub(super) allowed: Arc<crate::config::AccountsConfig>,
    /// A GitHub App: installation tokens.
    pub(super) app: Option<Arc<github_app::AppTokens>>,
    pub(super) requests_per_second: f64,
    /// One budget per account: one account's spent quota never slows another.
    pub(super) budgets: std::sync::Mutex<std::collections::HashMap<String, Arc<budget::Budget>>>,
}

/// The account of a client made by [`Sender::for_account`].
#[derive(Clone)]
pub(super) struct AccountScope {
    pub(super) id: String,
    pub(super) header: Option<(reqwest::header::HeaderName, reqwest::header::HeaderValue)>,
    /// Mint the request's token for this installation.
    pub(super) app: Option<Arc<github_app::AppTokens>>,
}

impl Sender {
    /// This source's client for `account`: requests name it in the source's account
    /// header, go to its own base URL (`api_base`, else the source's per-account
    /// template, else the source's), carry its own credential (`token`, else a GitHub
    /// App installation token, else the source's), and spend its own budget.
    pub fn for_account(
        &self,
        account: &str,
        api_base: Option<String>,
        token: Option<SecretString>,
    ) -> Result<Sender, SenderError> {
        let Some(access) = &self.accounts else {
            return Ok(self.clone());
        };
        let mut scoped = self.clone();
        // An account's own base, whoever set it (a command, the admin API, the
        // database), is used only under the allowed prefixes: nothing is sent elsewhere.
        if let Some(own) = &api_base {
            if !access.allowed.base_allowed(own) {
                return Err(SenderError::BadUrl(format!(
                    "account {account:?}: its api_base {own:?} is not under the source's allowed prefixes ({}); \
                     nothing is sent there. Set sources.{}.accounts.api_bases to allow it, or change the base \
                     (`webhook-reconciler accounts set {} {account} --api-base URL --token-file FILE`)",
                    access.allowed.api_bases_text(),
                    self.source,
                    self.source
                )));
            }
        }
        let base = api_base.or_else(|| {
            access
                .api_base
                .as_ref()
                .map(|t| t.replace("{account}", account))
        });
        if let Some(base) = base {
            let origin = origin_of(&base).ok_or_else(|| {
                SenderError::BadUrl(format!(
                    "account {account:?}: api_base {base:?} is not an http(s) URL"
                ))
            })?;
            let mut origins = (*self.origins).clone();
            if !origins.contains(&origin) {
                // Another origin than the source's own: the source's token is never sent
                // there (a base changed by an admin call or in the database must not
                // steer it away). Such an account brings its own credential.
                if token.is_none() && access.app.is_none() && self.token.is_some() {
                    return Err(SenderError::BadUrl(format!(
                        "account {account:?}: its base URL is on {origin}, not the source's origin, and the \
                         source's token is never sent elsewhere; give the account its own credential \
                         (`webhook-reconciler accounts add {} {account} --api-base URL --token-file FILE`)",
                        self.source
                    )));
                }
                origins.push(origin);
            }
            scoped.origins = Arc::new(origins);
            scoped.api_base = Some(base);
        }
        let header = match &access.header {
            Some(h) => {
                let v = reqwest::header::HeaderValue::from_str(account).map_err(|_| {
                    SenderError::BadUrl(format!("account {account:?} cannot be sent in header {h}"))
                })?;
                Some((h.clone(), v))
            }
            None => None,
        };
        let app = if token.is_none() {
            access.app.clone()
        } else {
            None
        };
        if let Some(t) = token {
            scoped.token = Some(t);
        }
        scoped.budget = {
            let mut budgets = access.budgets.lock().unwrap_or_else(|e| e.into_inner());
            budgets
                .entry(account.to_string())
                .or_insert_with(|| Arc::new(budget::Budget::new(access.requests_per_second)))
                .clone()
        };
        scoped.account = Some(AccountScope {
            id: account.to_string(),
            header,
            app,
        });
        Ok(scoped)
    }
}

/// How `source`'s requests reach each of its accounts.
pub(super) fn accounts_access(
    source: &SourceConfig,
    a: &crate::config::AccountsConfig,
) -> anyhow::Result<AccountsAccess> {
    let app = match &a.app {
        Some(app) => {
            // The exchange is on the API's origin (`https://api.github.com`), whatever
            // path the source's base URL has.
            let base = source
                .api_base
                .as_deref()
                .and_then(|b| url::Url::parse(b).ok())
                .map(|u| u.origin().ascii_serialization())
                .unwrap_or_else(|| "https://api.github.com".into());
            Some(Arc::new(github_app::AppTokens::new(
                &app.app_id,
                &app.key,
                &base,
                source.reconcile.timeout,
            )?))
        }
        None => None,
    };
    Ok(AccountsAccess {
        header: a
            .header
            .as_deref()
            .map(|h| reqwest::header::HeaderName::from_bytes(h.as_bytes()))
            .transpose()?,
        api_base: a.api_base.clone(),
        allowed: Arc::new(a.clone()),
        app,
        requests_per_second: source.requests_per_second,
        budgets: std::sync::Mutex::new(std::collections::HashMap::new()),
    })
}

//! `[sources.NAME.accounts]` validated: how a many-account source tells its accounts
//! apart and where their requests may go.

use secrecy::SecretString;

use super::Config;

/// `[sources.NAME.accounts]`, validated.
#[derive(Debug, Clone)]
pub struct AccountsConfig {
    /// The pointer into a delivery's signed body that names its account; `None` when the
    /// sender signs none (Shopify).
    pub from: Option<String>,
    /// The request header naming the account (Stripe: `Stripe-Account`).
    pub header: Option<String>,
    /// A base URL per account with `{account}` in it (Shopify).
    pub api_base: Option<String>,
    /// A GitHub App whose installations are the accounts.
    pub app: Option<GithubApp>,
    /// Account-kinds one process reconciles at once.
    pub concurrency: usize,
    /// Whether the platform's lifecycle webhooks (Shopify `app/uninstalled`, GitHub
    /// `installation`, Stripe `account.application.*`) drive the registry.
    pub lifecycle: bool,
    /// Where an account's own base may point (`accounts add --api-base`, the admin API,
    /// the database): checked where it is set and again before every request.
    pub api_bases: Vec<crate::config::base_prefix::BasePrefix>,
}

impl AccountsConfig {
    /// Whether an account's own base is among the allowed prefixes.
    pub fn base_allowed(&self, base: &str) -> bool {
        self.api_bases.iter().any(|p| p.allows(base))
    }

    /// The allowed prefixes, for a message.
    pub fn api_bases_text(&self) -> String {
        self.api_bases
            .iter()
            .map(|p| format!("{:?}", p.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A GitHub App's id and private key (PEM).
#[derive(Debug, Clone)]
pub struct GithubApp {
    pub app_id: String,
    pub key: SecretString,
}

impl Config {
    /// The keys an account credential opens with (`None`: `accounts.key` is not set).
    pub fn account_keys(&self) -> Option<crate::credential::Keys<'_>> {
        self.accounts_key
            .as_deref()
            .map(|key| crate::credential::Keys {
                key,
                previous: self.accounts_previous_key.as_deref(),
            })
    }
}

//! A GitHub App's installation tokens: the App signs a short JWT (RS256, its private
//! key, `iss` = the App id, at most 10 minutes ahead), exchanges it at
//! `POST {api_base}/app/installations/{id}/access_tokens` for a token of that
//! installation, and keeps the token until 5 minutes before its `expires_at`. Each
//! installation mints on its own: one installation's slow exchange never holds back
//! another's, and concurrent callers for one installation wait for one exchange.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::{ExposeSecret, SecretString};

/// Refreshed this long before GitHub says the token expires.
const REFRESH_MARGIN_SECS: i64 = 300;
/// The JWT's lifetime (GitHub allows at most 10 minutes), and how far its `iat` is set
/// back for a clock that runs ahead of GitHub's.
const JWT_LIFETIME_SECS: i64 = 540;
const JWT_BACKDATE_SECS: i64 = 60;

#[derive(Debug, thiserror::Error)]
pub enum AppTokenError {
    #[error(
        "the GitHub App private key cannot be read: {0} (it is the PEM file GitHub made for the App)"
    )]
    BadKey(String),
    #[error("installation id {0:?} is not a number")]
    BadInstallation(String),
    #[error("POST {url}: {reason}")]
    Exchange { url: String, reason: String },
}

struct Cached {
    token: SecretString,
    refresh_at: i64,
}

/// The installation tokens of one GitHub App.
pub struct AppTokens {
    app_id: String,
    key: EncodingKey,
    api_base: String,
    client: reqwest::Client,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Cached>>>>>,
}

impl std::fmt::Debug for AppTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppTokens")
            .field("app_id", &self.app_id)
            .field("api_base", &self.api_base)
            .finish_non_exhaustive()
    }
}

impl AppTokens {
    /// `private_key`: the App's PEM (PKCS#1 as GitHub makes it, or PKCS#8).
    pub fn new(
        app_id: &str,
        private_key: &SecretString,
        api_base: &str,
        timeout: Duration,
    ) -> Result<Self, AppTokenError> {
        let key = EncodingKey::from_rsa_pem(private_key.expose_secret().as_bytes())
            .map_err(|e| AppTokenError::BadKey(e.to_string()))?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| AppTokenError::BadKey(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            app_id: app_id.to_string(),
            key,
            api_base: api_base.trim_end_matches('/').to_string(),
            client,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The App's JWT at `now` (seconds since the epoch).
    pub fn jwt(&self, now: i64) -> Result<SecretString, AppTokenError> {
        #[derive(serde::Serialize)]
        struct Claims<'a> {
            iat: i64,
            exp: i64,
            iss: &'a str,
        }
        let claims = Claims {
            iat: now - JWT_BACKDATE_SECS,
            exp: now + JWT_LIFETIME_SECS,
            iss: &self.app_id,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, &self.key)
            .map(SecretString::from)
            .map_err(|e| AppTokenError::BadKey(e.to_string()))
    }

    /// A token of `installation`, minted when none is kept or the kept one is near its
    /// expiry.
    pub async fn token(&self, installation: &str) -> Result<SecretString, AppTokenError> {
        if installation.is_empty() || !installation.bytes().all(|b| b.is_ascii_digit()) {
            return Err(AppTokenError::BadInstallation(installation.to_string()));
        }
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(installation.to_string()).or_default().clone()
        };
        let mut kept = slot.lock().await;
        let now = chrono::Utc::now().timestamp();
        if let Some(c) = kept.as_ref().filter(|c| now < c.refresh_at) {
            return Ok(c.token.clone());
        }
        let fresh = self.exchange(installation, now).await?;
        let token = fresh.token.clone();
        *kept = Some(fresh);
        Ok(token)
    }

    /// Drops a kept token (the API answered 401 with it: revoked, or the App's key
    /// was rotated), so the next call mints a new one.
    pub fn forget(&self, installation: &str) {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(installation)
            .cloned();
        if let Some(slot) = slot {
            if let Ok(mut kept) = slot.try_lock() {
                *kept = None;
            }
        }
    }

    async fn exchange(&self, installation: &str, now: i64) -> Result<Cached, AppTokenError> {
        #[derive(serde::Deserialize)]
        struct Minted {
            token: String,
            expires_at: String,
        }
        let url = format!(
            "{}/app/installations/{installation}/access_tokens",
            self.api_base
        );
        let fail = |reason: String| AppTokenError::Exchange {
            url: url.clone(),
            reason,
        };
        let jwt = self.jwt(now)?;
        let response = self
            .client
            .post(&url)
            .bearer_auth(jwt.expose_secret())
            .header(reqwest::header::ACCEPT, "application/vnd.github+json")
            .header(reqwest::header::USER_AGENT, "webhook-reconciler")
            .send()
            .await
            .map_err(|e| fail(format!("request failed: {}", e.without_url())))?;
        let status = response.status();
        if !status.is_success() {
            return Err(fail(format!(
                "HTTP {status}{}",
                match status.as_u16() {
                    401 =>
                        ": GitHub refused the App's JWT (the App id or its private key is wrong)",
                    404 => ": no such installation of this App (uninstalled?)",
                    _ => "",
                }
            )));
        }
        let minted: Minted = response
            .json()
            .await
            .map_err(|e| fail(format!("the answer is not a token: {}", e.without_url())))?;
        let expires_at = chrono::DateTime::parse_from_rfc3339(&minted.expires_at)
            .map_err(|_| {
                fail(format!(
                    "expires_at {:?} is not RFC 3339",
                    minted.expires_at
                ))
            })?
            .timestamp();
        if minted.token.is_empty() {
            return Err(fail("the answer's token is empty".into()));
        }
        Ok(Cached {
            token: SecretString::from(minted.token),
            refresh_at: expires_at - REFRESH_MARGIN_SECS,
        })
    }
}

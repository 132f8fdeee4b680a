//! The sender's API, as the reconcile path uses it: list pages of a kind, fetch one
//! resource. Only this module knows reqwest.
//!
//! Every request waits for the source's rate budget (`requests_per_second`, shared by
//! all kinds of the source), has a timeout, and is retried with exponential backoff and
//! jitter on timeouts, connection errors, 429 and 5xx — honouring `Retry-After` — up to
//! `reconcile.max_attempts`. Errors name the URL and the reason; the token never
//! appears in them.

pub mod page;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::config::{KindConfig, SourceConfig};
pub use page::{Next, Page};

/// Why a request to the sender failed for good.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SenderError {
    /// Still failing after every attempt (timeouts, connection errors, 5xx).
    #[error("GET {url}: {reason} (gave up after {attempts} attempts)")]
    Exhausted {
        url: String,
        reason: String,
        attempts: u32,
    },
    /// The sender kept answering 429: the run fails rather than pretend it completed.
    #[error(
        "GET {url}: rate limited by the sender ({reason}); lower requests_per_second or retry later"
    )]
    RateLimited { url: String, reason: String },
    /// A status that retrying will not change (4xx other than 408 / 429).
    #[error("GET {url}: {reason}")]
    Refused { url: String, reason: String },
    /// The response arrived but is not a page this kind can read.
    #[error("GET {url}: {reason}")]
    BadPage { url: String, reason: String },
    #[error("{0}")]
    BadUrl(String),
}

/// One failed attempt; decides whether another is worth it.
#[derive(Debug)]
struct Attempt {
    reason: String,
    retryable: bool,
    rate_limited: bool,
    retry_after: Option<Duration>,
}

/// A client for one source.
#[derive(Clone)]
pub struct Sender {
    source: String,
    http: reqwest::Client,
    api_base: Option<String>,
    token: Option<SecretString>,
    limiter: Arc<DefaultDirectRateLimiter>,
    page_size: u32,
    max_attempts: u32,
    max_retry_wait: Duration,
}

impl Sender {
    pub fn new(source: &SourceConfig) -> anyhow::Result<Self> {
        let r = &source.reconcile;
        let http = reqwest::Client::builder()
            .connect_timeout(r.timeout.min(Duration::from_secs(10)))
            .timeout(r.timeout)
            .user_agent(concat!("webhook-reconciler/", env!("CARGO_PKG_VERSION")))
            .build()?;
        // One request every 1/rps seconds, with a burst of one second's worth.
        let period = Duration::from_secs_f64(1.0 / source.requests_per_second);
        let burst = NonZeroU32::new(source.requests_per_second.ceil().max(1.0) as u32)
            .unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Ok(Self {
            source: source.name.clone(),
            http,
            api_base: source.api_base.clone(),
            token: source.api_token.clone(),
            limiter: Arc::new(RateLimiter::direct(quota)),
            page_size: r.page_size,
            max_attempts: r.max_attempts,
            max_retry_wait: r.max_retry_wait,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    fn absolute(&self, path: &str) -> Result<Url, SenderError> {
        let text = if path.starts_with("http://") || path.starts_with("https://") {
            path.to_string()
        } else {
            format!(
                "{}{path}",
                self.api_base
                    .as_deref()
                    .unwrap_or_default()
                    .trim_end_matches('/')
            )
        };
        Url::parse(&text).map_err(|e| SenderError::BadUrl(format!("{text:?} is not a URL: {e}")))
    }

    /// The URL of the page at `at` (the first page without it), with `filter` (an
    /// incremental run's `param=value`) on every page but those the sender links to.
    fn page_url(
        &self,
        kind: &KindConfig,
        at: Option<&Next>,
        filter: Option<(&str, &str)>,
    ) -> Result<Url, SenderError> {
        if let Some(Next::Url(u)) = at {
            return Url::parse(u).map_err(|e| SenderError::BadUrl(format!("next link {u:?}: {e}")));
        }
        let list = kind.list.as_deref().ok_or_else(|| {
            SenderError::BadUrl(format!("kind {} has no list endpoint", kind.name))
        })?;
        let mut url = self.absolute(list)?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair(&kind.limit_param, &self.page_size.to_string());
            if let Some((param, value)) = filter {
                q.append_pair(param, value);
            }
            match at {
                Some(Next::Cursor(c)) => {
                    q.append_pair(&kind.cursor_param, c);
                }
                Some(Next::StartingAfter(id)) => {
                    q.append_pair(&kind.starting_after_param, id);
                }
                Some(Next::Url(_)) | None => {}
            }
        }
        Ok(url)
    }

    /// Fetches and parses one page of `kind`.
    pub async fn list_page(
        &self,
        kind: &KindConfig,
        at: Option<&Next>,
        filter: Option<(&str, &str)>,
    ) -> Result<Page, SenderError> {
        let url = self.page_url(kind, at, filter)?;
        let (body, link) = self.get(&url).await?.ok_or_else(|| SenderError::Refused {
            url: url.to_string(),
            reason: "404 Not Found: check the kind's list path".into(),
        })?;
        let mut page =
            page::parse_page(kind, url.as_str(), &body, link.as_deref()).map_err(|reason| {
                SenderError::BadPage {
                    url: url.to_string(),
                    reason,
                }
            })?;
        // A relative next link is relative to the page it came from.
        if let Some(Next::Url(u)) = &page.next {
            if let Ok(abs) = url.join(u) {
                page.next = Some(Next::Url(abs.to_string()));
            }
        }
        Ok(page)
    }

    /// Fetches one resource through the kind's `get` endpoint; `None` when the sender
    /// answers 404 (the resource is gone).
    pub async fn get_one(&self, kind: &KindConfig, id: &str) -> Result<Option<Value>, SenderError> {
        let template = kind.get.as_deref().ok_or_else(|| {
            SenderError::BadUrl(format!("kind {} has no get endpoint", kind.name))
        })?;
        let encoded: String = url::form_urlencoded::byte_serialize(id.as_bytes()).collect();
        let url = self.absolute(&template.replace("{id}", &encoded))?;
        match self.get(&url).await? {
            None => Ok(None),
            Some((body, _)) => {
                serde_json::from_slice(&body)
                    .map(Some)
                    .map_err(|e| SenderError::BadPage {
                        url: url.to_string(),
                        reason: format!("not JSON: {e}"),
                    })
            }
        }
    }

    /// GET with rate limit and retries; `None` for 404.
    async fn get(&self, url: &Url) -> Result<Option<(bytes::Bytes, Option<String>)>, SenderError> {
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(30))
            .with_max_times(self.max_attempts.saturating_sub(1) as usize)
            .with_jitter();
        let max_wait = self.max_retry_wait;
        let mut attempts = 0u32;
        let result = (|| {
            attempts += 1;
            self.attempt(url)
        })
        .retry(backoff)
        .when(|a: &Attempt| a.retryable)
        .adjust(move |a: &Attempt, next: Option<Duration>| {
            // `next` is None once the attempts are used up: stop even if the sender
            // named a wait. A wait longer than we accept ends the run too.
            let next = next?;
            match a.retry_after {
                Some(wait) if wait > max_wait => None,
                Some(wait) => Some(wait),
                None => Some(next),
            }
        })
        .notify(|a: &Attempt, wait: Duration| {
            tracing::warn!(source = self.source, url = %url, reason = a.reason, retry_in = ?wait, "sender request failed; retrying");
        })
        .await;
        result.map_err(|a| {
            let url = url.to_string();
            if a.rate_limited {
                SenderError::RateLimited {
                    url,
                    reason: a.reason,
                }
            } else if a.retryable {
                SenderError::Exhausted {
                    url,
                    reason: a.reason,
                    attempts,
                }
            } else {
                SenderError::Refused {
                    url,
                    reason: a.reason,
                }
            }
        })
    }

    async fn attempt(&self, url: &Url) -> Result<Option<(bytes::Bytes, Option<String>)>, Attempt> {
        self.limiter.until_ready().await;
        let mut req = self
            .http
            .get(url.clone())
            .header("Accept", "application/json");
        if let Some(token) = &self.token {
            req = req.bearer_auth(token.expose_secret());
        }
        let resp = req.send().await.map_err(|e| Attempt {
            reason: describe(&e),
            retryable: true,
            rate_limited: false,
            retry_after: None,
        })?;
        let status = resp.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            let retryable = status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::REQUEST_TIMEOUT
                || status.is_server_error();
            return Err(Attempt {
                reason: format!("HTTP {status}"),
                retryable,
                rate_limited: status == StatusCode::TOO_MANY_REQUESTS,
                retry_after,
            });
        }
        let link = resp
            .headers()
            .get(reqwest::header::LINK)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let body = resp.bytes().await.map_err(|e| Attempt {
            reason: format!("reading the body: {}", describe(&e)),
            retryable: true,
            rate_limited: false,
            retry_after: None,
        })?;
        Ok(Some((body, link)))
    }
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "cannot connect".into()
    } else {
        // The caller names the URL; only the causes are added here.
        let mut s = String::from("request failed");
        let mut src = std::error::Error::source(e);
        while let Some(inner) = src {
            s.push_str(&format!(": {inner}"));
            src = inner.source();
        }
        s
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare for APIs; it is ignored and the
/// backoff applies).
fn parse_retry_after(v: &str) -> Option<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

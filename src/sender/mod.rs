//! The sender's API: list pages of a kind (the reconcile flow), fetch one resource (the
//! pending fetches). Only this module knows reqwest.
//!
//! Every request waits for its rate budget (`requests_per_second`: one budget per
//! source, shared by all its kinds, its catch-up and its fetches; per account for a
//! many-account source, [`Sender::for_account`]), has a timeout, and is retried with exponential backoff and
//! jitter on timeouts, connection errors, 429 and 5xx — honouring `Retry-After` — up to
//! `reconcile.max_attempts`. Errors name the URL and the reason; the token never
//! appears in them.

mod accounts;
use accounts::{AccountScope, AccountsAccess, accounts_access};
pub mod budget;
mod date;
mod error;
pub mod github_app;
pub mod link;
pub mod page;
mod path;

pub use date::response_date;
pub use error::SenderError;
use path::path_segment;

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::config::{KindConfig, SourceConfig, origin_of};
pub use page::{Next, Page, item_texts};

/// One failed attempt; decides whether another is worth it.
#[derive(Debug)]
struct Attempt {
    reason: String,
    retryable: bool,
    rate_limited: bool,
    retry_after: Option<Duration>,
}

/// A successful response: its body (read within `max_page_bytes`), its `Link`
/// header values and its `Date`.
struct Fetched {
    body: bytes::Bytes,
    links: Vec<String>,
    /// The `Date` header as text, if any (read only for kinds versioned by it).
    date: Option<String>,
}

/// One resource fetched through a kind's `get`.
#[derive(Debug)]
pub struct Fetched1 {
    pub item: Value,
    /// The response's `Date` in microseconds, for kinds versioned by it.
    pub date: Option<i64>,
}

/// Resources fetched by id together (`get_many`).
pub struct FetchedMany {
    pub items: Vec<Value>,
    /// The response's `Date` in microseconds, for kinds versioned by it.
    pub date: Option<i64>,
}

/// A client for one source.
#[derive(Clone)]
pub struct Sender {
    source: String,
    http: reqwest::Client,
    api_base: Option<String>,
    token: Option<SecretString>,
    /// `None`: `Authorization: Bearer`; else the header carrying the token as it is.
    token_header: Option<reqwest::header::HeaderName>,
    /// The source's request budget: its rate and the sender's quota headers.
    budget: Arc<budget::Budget>,
    page_size: u32,
    max_attempts: u32,
    max_retry_wait: Duration,
    max_page_bytes: usize,
    /// Origins of `api_base` and of absolute `list` / `get` URLs: where the token goes.
    origins: Arc<Vec<String>>,
    /// A many-account source: how requests name an account, and each account's budget.
    accounts: Option<Arc<AccountsAccess>>,
    /// The account this client's requests are for (`None`: the source's own).
    account: Option<AccountScope>,
}

/// The origins the source's own URLs are on (`api_base`, absolute `list` / `get`).
fn source_origins(source: &SourceConfig) -> Vec<String> {
    let mut origins: Vec<String> = source
        .api_base
        .iter()
        .map(String::as_str)
        .chain(
            source
                .kinds
                .iter()
                .flat_map(|k| k.list.iter().chain(k.get.iter()))
                .map(String::as_str),
        )
        .filter_map(origin_of)
        .collect();
    origins.sort();
    origins.dedup();
    origins
}

impl Sender {
    pub fn new(source: &SourceConfig) -> anyhow::Result<Self> {
        let r = &source.reconcile;
        let origins = source_origins(source);
        // Redirects follow the same rule as next links: only within the sender's
        // origins (and any kind's allowed_origins). reqwest would follow any redirect,
        // dropping the token on another host; we do not follow it at all.
        let mut redirect_ok: Vec<String> = origins.clone();
        redirect_ok.extend(source.kinds.iter().flat_map(|k| k.allowed_origins.clone()));
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            let allowed =
                origin_of(attempt.url().as_str()).is_some_and(|o| redirect_ok.contains(&o));
            if attempt.previous().len() >= MAX_REDIRECTS {
                attempt.error("too many redirects")
            } else if allowed {
                attempt.follow()
            } else {
                let to = attempt.url().to_string();
                attempt.error(format!(
                    "redirect to {to}, outside the sender's origin; not followed"
                ))
            }
        });
        let http = reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(r.timeout.min(Duration::from_secs(10)))
            .timeout(r.timeout)
            .user_agent(concat!("webhook-reconciler/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            source: source.name.clone(),
            http,
            api_base: source.api_base.clone(),
            token: source.api_token.clone(),
            token_header: source
                .api_token_header
                .as_deref()
                .map(|h| reqwest::header::HeaderName::from_bytes(h.as_bytes()))
                .transpose()?,
            budget: Arc::new(budget::Budget::new(source.requests_per_second)),
            page_size: r.page_size,
            max_attempts: r.max_attempts,
            max_retry_wait: r.max_retry_wait,
            max_page_bytes: r.max_page_bytes,
            origins: Arc::new(origins),
            accounts: source
                .accounts
                .as_ref()
                .map(|a| accounts_access(source, a))
                .transpose()?
                .map(Arc::new),
            account: None,
        })
    }

    /// Refuses a URL of `kind` that leads off the sender's origins: a next link, a
    /// stored resume point.
    fn check_origin(&self, kind: &KindConfig, url: &Url) -> Result<(), SenderError> {
        let origin = origin_of(url.as_str());
        let allowed = |o: &String| self.origins.contains(o) || kind.allowed_origins.contains(o);
        if origin.as_ref().is_some_and(allowed) {
            return Ok(());
        }
        let downgrade = if url.scheme() == "http"
            && self.origins.iter().any(|o| {
                o.strip_prefix("https://")
                    .and_then(|rest| rest.rsplit_once(':'))
                    .is_some_and(|(host, _)| url.host_str() == Some(host))
            }) {
            ", a downgrade from https to http"
        } else {
            ""
        };
        let mut all: Vec<&str> = self.origins.iter().map(String::as_str).collect();
        all.extend(kind.allowed_origins.iter().map(String::as_str));
        Err(SenderError::ForeignOrigin {
            url: url.to_string(),
            allowed: all.join(", "),
            downgrade,
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
            let url =
                Url::parse(u).map_err(|e| SenderError::BadUrl(format!("next link {u:?}: {e}")))?;
            self.check_origin(kind, &url)?;
            return Ok(url);
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
        let started = std::time::Instant::now();
        let fetched = self.get(&url).await?.ok_or_else(|| SenderError::Refused {
            url: url.to_string(),
            reason: "404 Not Found: check the kind's list path".into(),
        })?;
        let fetch_seconds = started.elapsed().as_secs_f64();
        let started = std::time::Instant::now();
        let links: Vec<&str> = fetched.links.iter().map(String::as_str).collect();
        let bad = |reason: String| SenderError::BadPage {
            url: url.to_string(),
            reason,
        };
        let mut page = page::parse_page(kind, url.as_str(), &fetched.body, &links).map_err(bad)?;
        page.fetch_seconds = fetch_seconds;
        page.parse_seconds = started.elapsed().as_secs_f64();
        if kind.by_fetch_time() {
            page.date = Some(response_date(fetched.date.as_deref()).map_err(bad)?);
        }
        // A relative next link is relative to the page it came from; a link off the
        // sender's origin fails the run now, before anything could save it as the
        // position to resume from.
        if let Some(Next::Url(u)) = &page.next {
            let abs = url.join(u).map_err(|e| SenderError::BadPage {
                url: url.to_string(),
                reason: format!("next link {u:?} is not a URL: {e}"),
            })?;
            self.check_origin(kind, &abs)?;
            page.next = Some(Next::Url(abs.to_string()));
        }
        Ok(page)
    }

    /// Fetches one resource through the kind's `get` endpoint (the resource at its
    /// `get_item` pointer); `None` when the sender answers 404 (the resource is gone).
    pub async fn get_one(
        &self,
        kind: &KindConfig,
        id: &str,
    ) -> Result<Option<Fetched1>, SenderError> {
        let template = kind.get.as_deref().ok_or_else(|| {
            SenderError::BadUrl(format!("kind {} has no get endpoint", kind.name))
        })?;
        let url = self.absolute(&template.replace("{id}", &path_segment(id)?))?;
        let Some(fetched) = self.get(&url).await? else {
            return Ok(None);
        };
        let bad = |reason: String| SenderError::BadPage {
            url: url.to_string(),
            reason,
        };
        let mut doc: Value =
            serde_json::from_slice(&fetched.body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let item = doc
            .pointer_mut(&kind.get_item)
            .map(Value::take)
            .ok_or_else(|| {
                bad(format!(
                    "get_item pointer {:?} matches nothing in the response",
                    kind.get_item
                ))
            })?;
        let date = if kind.by_fetch_time() {
            Some(response_date(fetched.date.as_deref()).map_err(bad)?)
        } else {
            None
        };
        Ok(Some(Fetched1 { item, date }))
    }

    /// Fetches many resources of a kind by id in one request through its `get_many`
    /// (the resources in the array at its `items` pointer). What the sender leaves out
    /// is simply absent: the caller fetches it alone. A 404 is an empty answer.
    pub async fn get_many(
        &self,
        kind: &KindConfig,
        ids: &[&str],
    ) -> Result<FetchedMany, SenderError> {
        let many = kind.get_many.as_ref().ok_or_else(|| {
            SenderError::BadUrl(format!("kind {} has no get_many endpoint", kind.name))
        })?;
        let encoded: Vec<String> = ids
            .iter()
            .map(|id| path_segment(id))
            .collect::<Result<_, _>>()?;
        let url = self.absolute(&many.path.replace("{ids}", &encoded.join(",")))?;
        let Some(fetched) = self.get(&url).await? else {
            return Ok(FetchedMany {
                items: Vec::new(),
                date: None,
            });
        };
        let bad = |reason: String| SenderError::BadPage {
            url: url.to_string(),
            reason,
        };
        let mut doc: Value =
            serde_json::from_slice(&fetched.body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let items = match doc.pointer_mut(&many.items).map(Value::take) {
            Some(Value::Array(items)) => items,
            _ => {
                return Err(bad(format!(
                    "get_many_items pointer {:?} is not an array in the response",
                    many.items
                )));
            }
        };
        let date = if kind.by_fetch_time() {
            Some(response_date(fetched.date.as_deref()).map_err(bad)?)
        } else {
            None
        };
        Ok(FetchedMany { items, date })
    }

    /// GET with rate limit and retries; `None` for 404.
    async fn get(&self, url: &Url) -> Result<Option<Fetched>, SenderError> {
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

    async fn attempt(&self, url: &Url) -> Result<Option<Fetched>, Attempt> {
        let sent = self
            .budget
            .acquire(self.max_retry_wait)
            .await
            .map_err(|too_long| Attempt {
                reason: format!(
                    "{} for {}, longer than reconcile.max_retry_wait",
                    too_long.why,
                    humantime::format_duration(Duration::from_secs(too_long.wait.as_secs()))
                ),
                retryable: false,
                rate_limited: true,
                retry_after: None,
            })?;
        let mut req = self
            .http
            .get(url.clone())
            .header("Accept", "application/json");
        let minted = match &self.account {
            Some(AccountScope {
                id, app: Some(app), ..
            }) => Some(app.token(id).await.map_err(|e| Attempt {
                reason: e.to_string(),
                retryable: false,
                rate_limited: false,
                retry_after: None,
            })?),
            _ => None,
        };
        if let Some(AccountScope {
            header: Some((h, v)),
            ..
        }) = &self.account
        {
            req = req.header(h.clone(), v.clone());
        }
        if let Some(token) = minted.as_ref().or(self.token.as_ref()) {
            req = match &self.token_header {
                None => req.bearer_auth(token.expose_secret()),
                Some(h) => {
                    let mut v = reqwest::header::HeaderValue::from_str(token.expose_secret())
                        .map_err(|_| Attempt {
                            reason: "the API token is not a valid header value".into(),
                            retryable: false,
                            rate_limited: false,
                            retry_after: None,
                        })?;
                    v.set_sensitive(true);
                    req.header(h.clone(), v)
                }
            };
        }
        let resp = req.send().await.map_err(|e| Attempt {
            reason: describe(&e),
            // A refused redirect is refused again on every attempt.
            retryable: !e.is_redirect(),
            rate_limited: false,
            retry_after: None,
        })?;
        let status = resp.status();
        // Every response teaches the source's budget, successful ones included: the
        // point is to slow down before the sender refuses.
        let retry_after = self.budget.observe(resp.headers(), sent);
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if let (
            StatusCode::UNAUTHORIZED,
            Some(AccountScope {
                id, app: Some(app), ..
            }),
        ) = (status, &self.account)
        {
            // Revoked, or the App's key rotated: the next request mints a new token.
            app.forget(id);
        }
        if !status.is_success() {
            // GitHub refuses a spent quota with 403 and X-RateLimit-Remaining: 0.
            let rate_limited = status == StatusCode::TOO_MANY_REQUESTS
                || (status == StatusCode::FORBIDDEN && retry_after.is_some());
            let retryable =
                rate_limited || status == StatusCode::REQUEST_TIMEOUT || status.is_server_error();
            return Err(Attempt {
                reason: format!("HTTP {status}"),
                retryable,
                rate_limited,
                retry_after,
            });
        }
        let links: Vec<String> = resp
            .headers()
            .get_all(reqwest::header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(String::from)
            .collect();
        let date = resp
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let body = self.read_body(resp).await?;
        Ok(Some(Fetched { body, links, date }))
    }

    /// Reads a body of at most `max_page_bytes`, chunk by chunk: a larger one is
    /// refused as soon as it is known to be larger, never held whole.
    async fn read_body(&self, mut resp: reqwest::Response) -> Result<bytes::Bytes, Attempt> {
        let limit = self.max_page_bytes;
        let too_large = || Attempt {
            reason: format!(
                "the response is larger than reconcile.max_page_bytes ({}); lower page_size or raise max_page_bytes",
                bytesize::ByteSize(limit as u64)
            ),
            retryable: false,
            rate_limited: false,
            retry_after: None,
        };
        if resp.content_length().is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let mut body = bytes::BytesMut::new();
        loop {
            let chunk = resp.chunk().await.map_err(|e| Attempt {
                reason: format!("reading the body: {}", describe(&e)),
                retryable: true,
                rate_limited: false,
                retry_after: None,
            })?;
            let Some(chunk) = chunk else {
                return Ok(body.freeze());
            };
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
    }
}

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 5;

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

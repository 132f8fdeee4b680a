//! Why a request to the sender failed for good: what a run reports.

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
    /// A URL the sender handed us (a next link, a redirect, a resume point) leads
    /// away from the sender's origin, or from https to http: never followed, never sent
    /// the token.
    #[error(
        "GET {url}: refusing to follow a link to another origin than the sender's ({allowed}){downgrade}; \
         the API token is only sent to the sender's own origin. If the sender really serves pages from there, \
         add it to the kind's allowed_origins"
    )]
    ForeignOrigin {
        url: String,
        allowed: String,
        downgrade: &'static str,
    },
    #[error("{0}")]
    BadUrl(String),
}

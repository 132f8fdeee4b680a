//! The validated configuration: what the rest of the crate reads. Built only by
//! `validate`, so a value of these types is always valid.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use super::{AccountsConfig, WebhookSecret};

/// Database backend chosen by the URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// The URL as given; it may carry a password, so it is never logged (see [`Self::redacted_url`]).
    pub url: SecretString,
    pub backend: Backend,
    pub max_connections: u32,
    pub migrate: bool,
    pub acquire_timeout: Duration,
    pub busy_timeout: Duration,
    pub synchronous: Synchronous,
    pub(super) redacted: String,
}

/// SQLite's durability: when a commit returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// Every commit is on disk before it returns: a 2xx survives a power cut.
    #[default]
    Full,
    /// Faster; in WAL mode a power cut or OS crash can lose the last commits, which
    /// were already answered 2xx (the sender will not send them again).
    Normal,
}

impl Synchronous {
    pub fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

impl DatabaseConfig {
    /// The URL without its password, for logs and messages.
    pub fn redacted_url(&self) -> &str {
        &self.redacted
    }
}

#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    pub max_body: usize,
    /// Deliveries handled at once; more are answered 503 with `Retry-After`.
    pub max_in_flight: usize,
    /// The bytes of all bodies being received at once (each counted at its declared
    /// length, or `max_body` when it declares none); past it a new body is answered
    /// 503 before it is read.
    pub max_body_bytes_in_flight: usize,
    /// Connections open at once (0: no cap); at the cap, the oldest connection that is
    /// idle or has not sent a complete request head is closed to admit a new one.
    pub max_connections: usize,
    /// The same, per client address (0: no cap).
    pub max_connections_per_ip: usize,
    /// The whole request head must arrive within this.
    pub header_timeout: Duration,
    /// The whole body must arrive within this (408 otherwise).
    pub body_timeout: Duration,
    /// A keep-alive connection idle this long is closed.
    pub idle_timeout: Duration,
    /// Serve HTTP/2 (h2c) too; at most 100 streams per connection.
    pub http2: bool,
    /// The operators' listener: `/readyz`, `/metrics`, `/changes`, `/admin/*` there only.
    pub admin_listen: Option<AdminListen>,
    /// Bearer token of `/admin/*`; `None`: those routes answer 404.
    pub admin_token: Option<SecretString>,
    /// Bearer token of `GET /changes`; `None`: the endpoint answers 404.
    pub changes_token: Option<SecretString>,
}

/// Where the operators' listener listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminListen {
    Tcp(SocketAddr),
    Unix(std::path::PathBuf),
}

impl std::fmt::Display for AdminListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminListen::Tcp(a) => write!(f, "{a}"),
            AdminListen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub every: Duration,
    pub batch: u32,
    pub reconcile_runs: Duration,
    pub dead_letters: Duration,
    pub changes: Duration,
}

/// What a consumer does with a change it could not deliver in `max_attempts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFailure {
    /// Keep retrying that change (and hold back the later changes of its resource),
    /// raising the alarm (`feed_consumer_paused`).
    #[default]
    Pause,
    /// Record it in `consumer_skips` and go on.
    Skip,
}

/// Where a consumer that has no position yet starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsumerStart {
    /// Every change still kept (`retention.changes`): the whole retained history.
    #[default]
    Beginning,
    /// Only changes committed after the consumer first runs.
    Now,
}

/// An application the change feed is pushed to.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub name: String,
    pub url: String,
    /// Standard Webhooks key the pushes are signed with.
    pub secret: WebhookSecret,
    /// Only changes of these sources (empty: all).
    pub sources: Vec<String>,
    /// Only changes of these kinds (empty: all).
    pub kinds: Vec<String>,
    pub timeout: Duration,
    /// 0: for ever.
    pub max_attempts: u32,
    pub on_failure: OnFailure,
    /// Where it starts when the database has no position for it yet.
    pub start: ConsumerStart,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human on a terminal, JSON otherwise.
    #[default]
    Auto,
    Human,
    Json,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
}

/// The signature scheme a sender uses; see `webhook::verify`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    HmacSha256 {
        signature_header: String,
        timestamp_header: String,
    },
    StandardWebhooks,
    Stripe,
    Github,
    /// `X-Shopify-Hmac-Sha256`: base64 HMAC-SHA256 of the raw body; no timestamp.
    Shopify,
    /// No verification at all; only with `insecure_no_signature = true`.
    None,
}

/// A scheme's name as written in `webhook.scheme`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum SchemeName {
    #[default]
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    #[serde(rename = "standard-webhooks")]
    StandardWebhooks,
    #[serde(rename = "stripe")]
    Stripe,
    #[serde(rename = "github")]
    Github,
    #[serde(rename = "shopify")]
    Shopify,
    #[serde(rename = "none")]
    None,
}

impl Scheme {
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::HmacSha256 { .. } => "hmac-sha256",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::None => "none",
        }
    }
}

#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub path: String,
    pub scheme: Scheme,
    /// All accepted secrets; more than one while a rotation is under way.
    pub secrets: Vec<WebhookSecret>,
    /// Accepted distance between the signed timestamp and our clock, past and future.
    pub tolerance: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// An interval the cron schedule keeps exactly (see [`every_to_cron`]).
    Every(Duration),
    /// 6 fields, UTC.
    Cron(String),
}

impl Schedule {
    /// The 6-field UTC cron expression the scheduler runs.
    pub fn cron_expression(&self) -> String {
        match self {
            // Validation refused every interval without an exact expression.
            Schedule::Every(d) => every_to_cron(*d).unwrap_or_else(|_| "0 0 0 * * *".into()),
            Schedule::Cron(c) => c.clone(),
        }
    }
}

/// The cron expression firing exactly every `every`, or why there is none.
///
/// Schedules run at fixed times of the minute, hour or day (so they survive process
/// pauses and restarts), which keeps an interval exactly only when it divides a minute
/// (whole seconds), an hour (whole minutes) or a day (whole hours), or is one day. Any
/// other interval is refused rather than silently rounded.
pub fn every_to_cron(every: Duration) -> Result<String, String> {
    let secs = every.as_secs();
    let exact = every.subsec_nanos() == 0 && secs > 0;
    let expression = if !exact {
        None
    } else if secs < 60 {
        (60 % secs == 0).then(|| format!("*/{secs} * * * * *"))
    } else if secs < 3600 {
        (secs % 60 == 0 && 60 % (secs / 60) == 0).then(|| format!("0 */{} * * * *", secs / 60))
    } else if secs < 86_400 {
        (secs % 3600 == 0 && 24 % (secs / 3600) == 0)
            .then(|| format!("0 0 */{} * * *", secs / 3600))
    } else {
        (secs == 86_400).then(|| "0 0 0 * * *".to_string())
    };
    expression.ok_or_else(|| {
        format!(
            "{} cannot be kept exactly: scheduled runs happen at fixed times, so `every` must divide a minute \
             (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30s), an hour (the same numbers of minutes) or a day \
             (1, 2, 3, 4, 6, 8, 12h), or be 1d; to run at other chosen times write `cron` (6 fields, UTC), e.g. \"0 30 9 * * *\" for 09:30 daily",
            humantime::format_duration(every)
        )
    })
}

#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    pub schedule: Option<Schedule>,
    pub page_size: u32,
    /// Per request to the sender (connect and whole response).
    pub timeout: Duration,
    pub max_attempts: u32,
    pub max_retry_wait: Duration,
    pub jitter: Duration,
    pub run_at_start: bool,
    pub stale_after: Option<Duration>,
    pub lease_ttl: Duration,
    /// Largest response body read from the sender.
    pub max_page_bytes: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pagination {
    /// `next_cursor` in the body, sent back as `cursor=`.
    #[default]
    Cursor,
    /// RFC 8288 `Link: <..>; rel="next"`.
    Link,
    Stripe,
}

/// How a version field is turned into the integer the guard compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionFormat {
    #[default]
    Integer,
    /// RFC 3339 timestamp, stored as microseconds since the epoch.
    Rfc3339,
    /// Unix seconds (integer or fractional), stored as microseconds since the epoch.
    Unix,
}

/// A kind's view over its rows of `resources` (`store::views`): the fixed columns and
/// these, each read from the JSON state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedView {
    /// An SQL identifier, checked; distinct from every table and every other view.
    pub name: String,
    pub columns: Vec<Column>,
    /// Names of `columns`, each indexed (partial, on the kind's rows).
    pub indexes: Vec<String>,
}

/// The columns every typed view has, before the declared ones.
pub const FIXED_VIEW_COLUMNS: [&str; 5] = ["account", "id", "version", "deleted", "updated_at"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// The JSON pointer's segments, unescaped (`~1` is `/`, `~0` is `~`).
    pub path: Vec<String>,
    pub ty: ColumnType,
}

/// What a column's value is converted to; one that does not convert reads as NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Bigint,
    Numeric,
    Boolean,
    Timestamptz(TimeFormat),
}

/// How a timestamp column's value is written in the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeFormat {
    /// Seconds since the epoch.
    Unix,
    /// Milliseconds since the epoch.
    UnixMs,
    /// `2026-12-06T08:00:00Z` or with an offset.
    Rfc3339,
}

/// A sender whose API the daemon knows: fills a source's scheme, pagination, headers
/// and kinds (`src/config/presets/*.toml`); keys written out win.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    Stripe,
    Github,
    Shopify,
}

impl Preset {
    /// The preset's keys, as a `[sources.NAME]` table.
    pub fn toml(self) -> &'static str {
        match self {
            Preset::Stripe => include_str!("presets/stripe.toml"),
            Preset::Github => include_str!("presets/github.toml"),
            Preset::Shopify => include_str!("presets/shopify.toml"),
        }
    }
}

/// Catch-up from the sender's events API: events listed since a watermark, each
/// handled like an authentic delivery.
#[derive(Debug, Clone)]
pub struct CatchupConfig {
    /// The events listing as a kind (list, pagination, items; `id` is the event's),
    /// so the sender client pages it like any listing.
    pub listing: KindConfig,
    pub since_param: String,
    /// Pointer to an event's creation time.
    pub field: String,
    /// `Rfc3339` or `Unix`: how `field` is read and `since_param` written.
    pub format: VersionFormat,
    pub overlap: Duration,
    /// How far back the sender keeps events: no run asks for more.
    pub window: Duration,
    pub schedule: Option<Schedule>,
}

/// The kind name catch-up runs are recorded under (leases, runs, watermark); `$` keeps
/// it apart from every configurable kind name.
pub const CATCHUP_KIND: &str = "$catchup";

/// Where a listed (or fetched) item's version comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionFrom {
    /// The item's `version` pointer (none: version 0, insert-once).
    #[default]
    Item,
    /// The response's `Date` header (the sender's clock, whole seconds): for senders
    /// whose objects carry no version. Equal seconds are ambiguous, so such a kind is
    /// written only when strictly newer; see ARCHITECTURE.md.
    ResponseDate,
}

/// What an event does to its resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Upsert,
    /// Tombstone: the row stays, marked deleted, so an older create cannot revive it.
    Delete,
}

/// A kind's `get_many`: many resources by id in one request.
#[derive(Debug, Clone)]
pub struct GetMany {
    /// The path (or URL) with `{ids}`: the ids, each percent-encoded, comma-separated.
    pub path: String,
    /// Pointer to the array of resources in the response.
    pub items: String,
    /// Most ids one request asks for.
    pub size: usize,
}

/// Incremental listing of a kind between full sweeps.
#[derive(Debug, Clone)]
pub struct IncrementalConfig {
    pub param: String,
    pub field: String,
    /// `Rfc3339` or `Unix`.
    pub format: VersionFormat,
    pub overlap: Duration,
    pub full_every: Duration,
}

/// JSON pointers into one webhook event type's envelope.
#[derive(Debug, Clone)]
pub struct EventMapping {
    pub id: String,
    /// `None` for an insert-once kind (version 0).
    pub version: Option<String>,
    /// `None` for a delete that carries no state.
    pub state: Option<String>,
    pub action: Action,
}

/// The latest version accepted at `now_micros` for versions in `format`, `ahead` of now:
/// only timestamps are bounded.
pub fn latest_version(
    format: VersionFormat,
    ahead: Duration,
    max_version: Option<i64>,
    now_micros: i64,
) -> Option<i64> {
    match format {
        VersionFormat::Integer => max_version,
        VersionFormat::Rfc3339 | VersionFormat::Unix => {
            Some(now_micros.saturating_add(i64::try_from(ahead.as_micros()).unwrap_or(i64::MAX)))
        }
    }
}

/// What a listing lists, and so how the sweep handles its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// The sender's current resources: read into changes, compared with the local
    /// rows, written where they differ (`reconcile::sweep`).
    Resources,
    /// The sender's events (catch-up): each through the ingest step, like a webhook
    /// (`reconcile::catchup`). Its runs are recorded under [`CATCHUP_KIND`].
    Events,
}

#[derive(Debug, Clone)]
pub struct KindConfig {
    pub name: String,
    pub listing: Listing,
    /// Longest state accepted, written out (`http.max_body`).
    pub max_state_bytes: usize,
    /// The source's `max_version_ahead`, for timestamp versions.
    pub max_version_ahead: Duration,
    /// `max_version`, for integer versions: the highest accepted.
    pub max_version: Option<i64>,
    pub list: Option<String>,
    pub pagination: Pagination,
    pub items: String,
    pub next_cursor: String,
    pub cursor_param: String,
    pub limit_param: String,
    pub has_more: String,
    pub starting_after_param: String,
    pub id: String,
    pub version: Option<String>,
    pub version_format: VersionFormat,
    pub version_from: VersionFrom,
    pub state: String,
    pub get: Option<String>,
    /// Listed items where this pointer is present (and not null) are not of this kind
    /// and are left out (GitHub's issues listing holds pull requests: `/pull_request`).
    pub exclude: Option<String>,
    /// Many resources by id in one request (`get_many`); `None`: one `get` each.
    pub get_many: Option<GetMany>,
    /// Pointer to the resource in the `get` response ("" = the whole body).
    pub get_item: String,
    /// Origins besides the source's (`api_base`, absolute `list` / `get`) that next
    /// links and redirects may lead to, as `scheme://host:port`.
    pub allowed_origins: Vec<String>,
    /// Most of the kind's live rows one sweep may tombstone, 0..=1.
    pub max_delete_fraction: f64,
    pub detect_deletes: bool,
    pub incremental: Option<IncrementalConfig>,
    /// Event type -> mapping.
    pub events: BTreeMap<String, EventMapping>,
    /// `match`: (pointer, prefix) pairs a webhook body of this kind must match.
    pub match_prefixes: Vec<(String, String)>,
    /// `columns`: the typed view applications query instead of the JSON state.
    pub view: Option<TypedView>,
}

impl KindConfig {
    /// The latest version accepted at `now` (microseconds since the epoch): only
    /// timestamp versions are bounded.
    pub fn latest_version(&self, now_micros: i64) -> Option<i64> {
        latest_version(
            self.version_format,
            self.max_version_ahead,
            self.max_version,
            now_micros,
        )
    }

    /// A kind without a version field is insert-once: webhooks never overwrite it.
    pub fn versioned(&self) -> bool {
        self.version.is_some()
            || self.by_fetch_time()
            || self.events.values().any(|e| e.version.is_some())
    }

    /// Listed and fetched items are versioned by the response's `Date`.
    pub fn by_fetch_time(&self) -> bool {
        self.version_from == VersionFrom::ResponseDate
    }
}

#[derive(Debug, Clone)]
pub struct SourceConfig {
    pub name: String,
    /// `dead_letters.max_bytes`: the most body bytes its dead letters keep.
    pub dead_letters_max_bytes: u64,
    pub retry_window: Duration,
    /// How long processed event ids are kept: 2 × retry_window unless overridden.
    pub retention: Duration,
    /// A timestamp version later than now + this is refused: a row pinned in the far
    /// future could never be updated again.
    pub max_version_ahead: Duration,
    pub requests_per_second: f64,
    pub api_base: Option<String>,
    pub api_token: Option<SecretString>,
    /// `None`: `Authorization: Bearer TOKEN`; `Some(h)`: header `h` carries the token.
    pub api_token_header: Option<String>,
    pub insecure_no_signature: bool,
    pub webhook: WebhookConfig,
    pub reconcile: ReconcileConfig,
    pub kinds: Vec<KindConfig>,
    pub catchup: Option<CatchupConfig>,
    pub preset: Option<Preset>,
    /// Many accounts behind this source (`[sources.NAME.accounts]`); `None`: one account
    /// (`""`).
    pub accounts: Option<AccountsConfig>,
}

impl SourceConfig {
    /// Its kinds and its catch-up listing (a kind named `config::CATCHUP_KIND`).
    pub fn kinds_and_catchup(&self) -> impl Iterator<Item = &KindConfig> {
        self.kinds
            .iter()
            .chain(self.catchup.as_ref().map(|c| &c.listing))
    }

    /// The kinds a reconcile runs: those with a listing, and the catch-up.
    pub fn reconciled_kinds(&self) -> impl Iterator<Item = &KindConfig> {
        self.kinds_and_catchup().filter(|k| k.list.is_some())
    }

    /// Whether the source's own account (`""`) is reconciled: always for a
    /// single-account source; for a many-account one when it has a base URL of its own
    /// and tells accounts apart by a header only (Stripe Connect: the platform's own
    /// objects).
    pub fn reconciles_own_account(&self) -> bool {
        match &self.accounts {
            None => true,
            Some(a) => self.api_base.is_some() && a.api_base.is_none() && a.app.is_none(),
        }
    }

    /// When `kind` (one of its kinds, or its catch-up listing) runs under `serve`.
    pub fn schedule_of(&self, kind: &KindConfig) -> Option<&Schedule> {
        match kind.listing {
            Listing::Events => self.catchup.as_ref().and_then(|c| c.schedule.as_ref()),
            Listing::Resources => self.reconcile.schedule.as_ref(),
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub database: DatabaseConfig,
    pub http: HttpConfig,
    pub retention: RetentionConfig,
    pub log: LogConfig,
    pub sources: Vec<SourceConfig>,
    pub consumers: Vec<ConsumerConfig>,
    /// `dead_letters.max_bytes`: the most body bytes kept per source.
    pub dead_letters_max_bytes: u64,
    /// `accounts.key`: seals and opens account credentials kept in the database.
    pub accounts_key: Option<std::sync::Arc<crate::credential::AccountsKey>>,
    /// `accounts.previous_key`: opens what was sealed before a rekey.
    pub accounts_previous_key: Option<std::sync::Arc<crate::credential::AccountsKey>>,
    /// Settings that work but deserve a look (`check-config` prints them, `serve` logs
    /// them at start), each naming its key.
    pub warnings: Vec<super::Problem>,
}

/// `scheme://host:port` of an http(s) URL (the port always written, so that
/// `https://a` and `https://a:443` are one origin).
pub fn origin_of(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    if !matches!(u.scheme(), "http" | "https") {
        return None;
    }
    Some(format!(
        "{}://{}:{}",
        u.scheme(),
        u.host_str()?,
        u.port_or_known_default()?
    ))
}

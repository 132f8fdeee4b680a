//! Configuration: the raw file plus environment overrides, validated once at startup into
//! [`Config`]. Nothing else in the crate reads the environment or a secret file.
//!
//! Invariant: a `Config` that exists is valid — durations parsed, secrets resolved,
//! cross-field rules checked — so no later code re-checks or fails on configuration.

mod raw;
mod secret;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::SecretString;

pub use raw::RawConfig;
use raw::{RawEvent, RawKind, RawSource};
pub use secret::WebhookSecret;

/// Environment variable naming the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "WEBHOOK_RECONCILER_CONFIG";
/// Prefix of the environment overrides: `WEBHOOK_RECONCILER__DATABASE__URL=...`.
pub const ENV_PREFIX: &str = "WEBHOOK_RECONCILER__";

const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(24 * 3600);
const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);
const DEFAULT_REQUESTS_PER_SECOND: f64 = 25.0;
const DEFAULT_PAGE_SIZE: u32 = 500;
const MAX_PAGE_SIZE: u32 = 10_000;
const DEFAULT_SENDER_TIMEOUT: Duration = Duration::from_secs(30);

/// Every problem found in a configuration, each naming its key. Shown to the operator as
/// one line per problem; the process exits 2.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

/// One configuration problem: the dotted key and what is wrong with it.
#[derive(Debug, Clone)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            writeln!(f, "  {}: {}", p.key, p.message)?;
        }
        Ok(())
    }
}

impl ConfigError {
    fn one(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem {
                key: key.into(),
                message: message.into(),
            }],
        }
    }
}

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
    redacted: String,
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
}

#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub every: Duration,
    pub batch: u32,
    pub reconcile_runs: Duration,
    pub dead_letters: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
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
    /// No verification at all; only with `insecure_no_signature = true`.
    None,
}

impl Scheme {
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::HmacSha256 { .. } => "hmac-sha256",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
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
    Every(Duration),
    Cron(String),
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pagination {
    Cursor,
    Link,
    Stripe,
}

/// How a version field is turned into the integer the guard compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionFormat {
    Integer,
    /// RFC 3339 timestamp, stored as microseconds since the epoch.
    Rfc3339,
    /// Unix seconds (integer or fractional), stored as microseconds since the epoch.
    Unix,
}

/// What an event does to its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Upsert,
    /// Tombstone: the row stays, marked deleted, so an older create cannot revive it.
    Delete,
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

#[derive(Debug, Clone)]
pub struct KindConfig {
    pub name: String,
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
    pub state: String,
    pub get: Option<String>,
    pub detect_deletes: bool,
    pub incremental: Option<IncrementalConfig>,
    /// Event type -> mapping.
    pub events: BTreeMap<String, EventMapping>,
}

impl KindConfig {
    /// A kind without a version field is insert-once: webhooks never overwrite it.
    pub fn versioned(&self) -> bool {
        self.version.is_some() || self.events.values().any(|e| e.version.is_some())
    }
}

#[derive(Debug, Clone)]
pub struct SourceConfig {
    pub name: String,
    pub retry_window: Duration,
    /// How long processed event ids are kept: 2 × retry_window unless overridden.
    pub retention: Duration,
    pub requests_per_second: f64,
    pub api_base: Option<String>,
    pub api_token: Option<SecretString>,
    pub insecure_no_signature: bool,
    pub webhook: WebhookConfig,
    pub reconcile: ReconcileConfig,
    pub kinds: Vec<KindConfig>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub database: DatabaseConfig,
    pub http: HttpConfig,
    pub retention: RetentionConfig,
    pub log: LogConfig,
    pub sources: Vec<SourceConfig>,
}

impl Config {
    /// Loads the file (none: built-in defaults), applies the environment overrides and
    /// validates. The CLI resolves `--config` / `$WEBHOOK_RECONCILER_CONFIG` to `path`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(EmptyDefaults {}));
        if let Some(path) = &path {
            if !path.is_file() {
                return Err(ConfigError::one(
                    "--config",
                    format!(
                        "{} does not exist or is not a file; pass an existing TOML file",
                        path.display()
                    ),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        Self::from_figment(figment)
    }

    /// Validates a configuration given as TOML text (no environment overrides).
    pub fn from_toml_str(toml: &str) -> Result<Config, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(toml)))
    }

    fn from_figment(figment: Figment) -> Result<Config, ConfigError> {
        let raw: RawConfig = figment.extract().map_err(figment_error)?;
        validate(raw)
    }

    pub fn source(&self, name: &str) -> Option<&SourceConfig> {
        self.sources.iter().find(|s| s.name == name)
    }
}

#[derive(serde::Serialize)]
struct EmptyDefaults {}

fn figment_error(err: figment::Error) -> ConfigError {
    let problems = err
        .into_iter()
        .map(|e| {
            let key = if e.path.is_empty() {
                "(file)".to_string()
            } else {
                e.path.join(".")
            };
            let mut message = match &e.kind {
                figment::error::Kind::UnknownField(field, expected) => format!(
                    "unknown key `{field}`; expected one of: {}",
                    expected.join(", ")
                ),
                kind => kind.to_string(),
            };
            if let Some(source) = e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                message.push_str(&format!(" (from {source})"));
            }
            Problem { key, message }
        })
        .collect();
    ConfigError { problems }
}

/// Collects problems so that one run reports all of them, not the first only.
#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn fail(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    fn duration(&mut self, key: &str, text: &str) -> Option<Duration> {
        match parse_duration(text) {
            Ok(d) if d.is_zero() => {
                self.fail(key, format!("{text:?} is zero; give a positive duration"));
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                self.fail(key, e);
                None
            }
        }
    }

    fn opt_duration(&mut self, key: &str, text: Option<&str>, default: Duration) -> Duration {
        match text {
            Some(t) => self.duration(key, t).unwrap_or(default),
            None => default,
        }
    }

    fn pointer(&mut self, key: &str, pointer: &str) -> String {
        if !(pointer.is_empty() || pointer.starts_with('/')) {
            self.fail(
                key,
                format!(
                    "{pointer:?} is not a JSON pointer; it must be empty or start with '/', e.g. \"/data/id\""
                ),
            );
        }
        pointer.to_string()
    }
}

/// Parses `30s`, `5m`, `24h`, `3d`, `1h 30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!(
            "{text:?} is not a duration ({e}); write it like \"30s\", \"5m\", \"24h\" or \"3d\""
        )
    })
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    let mut c = Checker::default();

    let db = &raw.database;
    let (backend, redacted) = match database_backend(&db.url) {
        Ok(v) => v,
        Err(msg) => {
            c.fail("database.url", msg);
            (Backend::Sqlite, String::new())
        }
    };
    if db.max_connections == 0 {
        c.fail("database.max_connections", "must be at least 1");
    }
    let database = DatabaseConfig {
        url: SecretString::from(db.url.clone()),
        backend,
        max_connections: db.max_connections.max(1),
        migrate: db.migrate,
        acquire_timeout: c
            .duration("database.acquire_timeout", &db.acquire_timeout)
            .unwrap_or(Duration::from_secs(5)),
        busy_timeout: c
            .duration("database.busy_timeout", &db.busy_timeout)
            .unwrap_or(Duration::from_secs(10)),
        redacted,
    };

    let listen = match raw.http.listen.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            c.fail(
                "http.listen",
                format!(
                    "{:?} is not an address; write it as IP:PORT, e.g. \"127.0.0.1:8080\"",
                    raw.http.listen
                ),
            );
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    let max_body = match raw.http.max_body.parse::<bytesize::ByteSize>() {
        Ok(b) if b.as_u64() > 0 => usize::try_from(b.as_u64()).unwrap_or(usize::MAX),
        _ => {
            c.fail(
                "http.max_body",
                format!(
                    "{:?} is not a size; write it like \"1MiB\" or \"256KiB\"",
                    raw.http.max_body
                ),
            );
            1 << 20
        }
    };
    if raw.retention.batch == 0 || raw.retention.batch > 100_000 {
        c.fail("retention.batch", "use 1 to 100000 rows per batch");
    }
    let retention = RetentionConfig {
        every: c
            .duration("retention.every", &raw.retention.every)
            .unwrap_or(Duration::from_secs(3600)),
        batch: raw.retention.batch.clamp(1, 100_000),
        reconcile_runs: c
            .duration("retention.reconcile_runs", &raw.retention.reconcile_runs)
            .unwrap_or(Duration::from_secs(30 * 86_400)),
        dead_letters: c
            .duration("retention.dead_letters", &raw.retention.dead_letters)
            .unwrap_or(Duration::from_secs(30 * 86_400)),
    };
    let format = match raw.log.format.as_str() {
        "auto" => LogFormat::Auto,
        "human" => LogFormat::Human,
        "json" => LogFormat::Json,
        other => {
            c.fail(
                "log.format",
                format!("{other:?} is not a log format; use \"auto\", \"human\" or \"json\""),
            );
            LogFormat::Auto
        }
    };
    let log = LogConfig {
        format,
        level: raw.log.level.clone(),
    };

    let mut sources = Vec::new();
    let mut paths: HashSet<String> = HashSet::new();
    for (name, source) in &raw.sources {
        if let Some(s) = validate_source(&mut c, name, source) {
            if !paths.insert(s.webhook.path.clone()) {
                c.fail(
                    format!("sources.{name}.webhook.path"),
                    format!(
                        "{:?} is already the path of another source; give each source its own path",
                        s.webhook.path
                    ),
                );
            }
            sources.push(s);
        }
    }

    if c.problems.is_empty() {
        Ok(Config {
            database,
            http: HttpConfig { listen, max_body },
            retention,
            log,
            sources,
        })
    } else {
        Err(ConfigError {
            problems: c.problems,
        })
    }
}

/// Picks the backend from the URL scheme and returns a printable URL without password.
fn database_backend(url: &str) -> Result<(Backend, String), String> {
    if let Some(rest) = url.strip_prefix("sqlite://") {
        if rest.is_empty() {
            return Err("\"sqlite://\" names no file; write sqlite://PATH".into());
        }
        Ok((Backend::Sqlite, url.to_string()))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok((Backend::Postgres, redact_password(url)))
    } else {
        Err("must start with sqlite:// or postgres:// (e.g. \"sqlite://webhook-reconciler.db\" or \"postgres://user@host/db\")".into())
    }
}

fn redact_password(url: &str) -> String {
    // postgres://user:password@host/db -> postgres://user:***@host/db
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

fn validate_source(c: &mut Checker, name: &str, raw: &RawSource) -> Option<SourceConfig> {
    let key = |k: &str| format!("sources.{name}.{k}");
    let before = c.problems.len();

    let retry_window = c.opt_duration(
        &key("retry_window"),
        raw.retry_window.as_deref(),
        DEFAULT_RETRY_WINDOW,
    );
    let retention = match raw.retention.as_deref() {
        Some(t) => match c.duration(&key("retention"), t) {
            Some(r) if r < retry_window => {
                c.fail(
                    key("retention"),
                    format!(
                        "{t:?} is shorter than retry_window ({}); a retried delivery would be applied twice. Set it to at least the retry window or remove it (default: twice the retry window)",
                        humantime::format_duration(retry_window)
                    ),
                );
                r
            }
            Some(r) => r,
            None => retry_window * 2,
        },
        None => retry_window * 2,
    };
    let requests_per_second = raw
        .requests_per_second
        .unwrap_or(DEFAULT_REQUESTS_PER_SECOND);
    if !(requests_per_second.is_finite() && requests_per_second > 0.0) {
        c.fail(
            key("requests_per_second"),
            "must be a positive number of requests per second",
        );
    }
    if let Some(base) = &raw.api_base {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            c.fail(key("api_base"), format!("{base:?} is not an http(s) URL"));
        }
    }
    let api_token = raw
        .api_token
        .as_ref()
        .and_then(|s| match secret::resolve(s) {
            Ok(v) => Some(SecretString::from(v)),
            Err(e) => {
                c.fail(key("api_token"), e);
                None
            }
        });

    let webhook = validate_webhook(c, name, raw);
    let reconcile = validate_reconcile(c, name, raw);

    let mut kinds = Vec::new();
    let mut event_types: BTreeMap<&str, &str> = BTreeMap::new();
    for (kind_name, kind) in &raw.kinds {
        for event_type in kind.events.keys() {
            if let Some(other) = event_types.insert(event_type, kind_name) {
                c.fail(
                    format!("sources.{name}.kinds.{kind_name}.events.{event_type}"),
                    format!("event type {event_type:?} is already mapped by kind {other:?}; map each type to one kind"),
                );
            }
        }
        let k = validate_kind(c, name, kind_name, kind);
        if k.list.as_deref().is_some_and(|l| !is_absolute(l)) && raw.api_base.is_none() {
            c.fail(
                key("api_base"),
                format!(
                    "kind {kind_name:?} lists {:?}, a relative path; set api_base or make the list URL absolute",
                    k.list.as_deref().unwrap_or_default()
                ),
            );
        }
        kinds.push(k);
    }

    (c.problems.len() == before).then(|| SourceConfig {
        name: name.to_string(),
        retry_window,
        retention,
        requests_per_second,
        api_base: raw.api_base.clone(),
        api_token,
        insecure_no_signature: raw.insecure_no_signature,
        webhook,
        reconcile,
        kinds,
    })
}

fn is_absolute(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

fn validate_webhook(c: &mut Checker, name: &str, raw: &RawSource) -> WebhookConfig {
    let key = |k: &str| format!("sources.{name}.webhook.{k}");
    let w = &raw.webhook;
    let path = w
        .path
        .clone()
        .unwrap_or_else(|| format!("/webhooks/{name}"));
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        c.fail(
            key("path"),
            format!("{path:?} must be an absolute URL path such as \"/webhooks/{name}\""),
        );
    }
    if ["/healthz", "/readyz", "/metrics"].contains(&path.as_str()) {
        c.fail(
            key("path"),
            format!("{path:?} is reserved; choose another path"),
        );
    }
    let scheme = match w.scheme.as_deref().unwrap_or("hmac-sha256") {
        "hmac-sha256" => Scheme::HmacSha256 {
            signature_header: w
                .signature_header
                .clone()
                .unwrap_or_else(|| "X-Signature".into()),
            timestamp_header: w
                .timestamp_header
                .clone()
                .unwrap_or_else(|| "X-Signature-Timestamp".into()),
        },
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::Github,
        "none" => Scheme::None,
        other => {
            c.fail(
                key("scheme"),
                format!(
                    "{other:?} is not a signature scheme; use hmac-sha256, standard-webhooks, stripe or github"
                ),
            );
            Scheme::None
        }
    };
    if !matches!(scheme, Scheme::HmacSha256 { .. })
        && (w.signature_header.is_some() || w.timestamp_header.is_some())
    {
        c.fail(
            key("signature_header"),
            "header names can only be changed for scheme \"hmac-sha256\"",
        );
    }
    if scheme == Scheme::None {
        if !raw.insecure_no_signature {
            c.fail(
                key("scheme"),
                format!(
                    "\"none\" accepts unsigned deliveries from anyone; set sources.{name}.insecure_no_signature = true if that is really wanted"
                ),
            );
        }
    } else if w.secrets.is_empty() {
        c.fail(
            key("secrets"),
            "no secret configured; add secrets = [{ env = \"VAR\" }] or [{ file = \"/path\" }]",
        );
    }
    let mut secrets = Vec::new();
    for (i, s) in w.secrets.iter().enumerate() {
        match secret::resolve(s).and_then(|v| WebhookSecret::new(&scheme, v)) {
            Ok(s) => secrets.push(s),
            Err(e) => c.fail(format!("sources.{name}.webhook.secrets[{i}]"), e),
        }
    }
    let tolerance = c.opt_duration(&key("tolerance"), w.tolerance.as_deref(), DEFAULT_TOLERANCE);
    WebhookConfig {
        path,
        scheme,
        secrets,
        tolerance,
    }
}

fn validate_reconcile(c: &mut Checker, name: &str, raw: &RawSource) -> ReconcileConfig {
    let key = |k: &str| format!("sources.{name}.reconcile.{k}");
    let r = &raw.reconcile;
    let schedule = match (&r.every, &r.cron) {
        (Some(_), Some(_)) => {
            c.fail(key("cron"), "set either `every` or `cron`, not both");
            None
        }
        (Some(every), None) => c.duration(&key("every"), every).map(Schedule::Every),
        (None, Some(cron)) => {
            if cron.split_whitespace().count() != 6 {
                c.fail(
                    key("cron"),
                    format!(
                        "{cron:?} must have 6 fields (sec min hour day month weekday, in UTC), e.g. \"0 */5 * * * *\""
                    ),
                );
            }
            Some(Schedule::Cron(cron.clone()))
        }
        (None, None) => None,
    };
    let page_size = r.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
    if page_size == 0 || page_size > MAX_PAGE_SIZE {
        c.fail(
            key("page_size"),
            format!("{page_size} is out of range; use 1 to {MAX_PAGE_SIZE}"),
        );
    }
    let max_attempts = r.max_attempts.unwrap_or(5);
    if max_attempts == 0 {
        c.fail(key("max_attempts"), "must be at least 1");
    }
    let default_jitter = match &schedule {
        Some(Schedule::Every(d)) => (*d / 10).min(Duration::from_secs(30)),
        _ => Duration::ZERO,
    };
    let jitter = match r.jitter.as_deref() {
        Some("0") | Some("0s") => Duration::ZERO,
        Some(t) => c.duration(&key("jitter"), t).unwrap_or(default_jitter),
        None => default_jitter,
    };
    let stale_after = match r.stale_after.as_deref() {
        Some(t) => c.duration(&key("stale_after"), t),
        None => match &schedule {
            Some(Schedule::Every(d)) => Some(*d * 3),
            _ => None,
        },
    };
    ReconcileConfig {
        schedule,
        page_size,
        timeout: c.opt_duration(
            &key("timeout"),
            r.timeout.as_deref(),
            DEFAULT_SENDER_TIMEOUT,
        ),
        max_attempts: max_attempts.max(1),
        max_retry_wait: c.opt_duration(
            &key("max_retry_wait"),
            r.max_retry_wait.as_deref(),
            Duration::from_secs(60),
        ),
        jitter,
        run_at_start: r.run_at_start.unwrap_or(true),
        stale_after,
        lease_ttl: c.opt_duration(
            &key("lease_ttl"),
            r.lease_ttl.as_deref(),
            Duration::from_secs(120),
        ),
    }
}

fn validate_kind(c: &mut Checker, source: &str, name: &str, raw: &RawKind) -> KindConfig {
    let base = format!("sources.{source}.kinds.{name}");
    let key = |k: &str| format!("{base}.{k}");
    let pagination = match raw.pagination.as_deref().unwrap_or("cursor") {
        "cursor" => Pagination::Cursor,
        "link" => Pagination::Link,
        "stripe" => Pagination::Stripe,
        other => {
            c.fail(
                key("pagination"),
                format!("{other:?} is not a pagination; use cursor, link or stripe"),
            );
            Pagination::Cursor
        }
    };
    let version_format = match raw.version_format.as_deref().unwrap_or("integer") {
        "integer" => VersionFormat::Integer,
        "rfc3339" => VersionFormat::Rfc3339,
        "unix" => VersionFormat::Unix,
        other => {
            c.fail(
                key("version_format"),
                format!("{other:?} is not a version format; use integer, rfc3339 or unix"),
            );
            VersionFormat::Integer
        }
    };
    let kind_versioned = raw.version.is_some();
    let mut events = BTreeMap::new();
    for (event_type, e) in &raw.events {
        let ekey = |k: &str| format!("{base}.events.{event_type}.{k}");
        events.insert(
            event_type.clone(),
            validate_event(
                c,
                &ekey,
                e,
                kind_versioned || raw.events.values().any(|e| e.version.is_some()),
            ),
        );
    }
    KindConfig {
        name: name.to_string(),
        list: raw.list.clone(),
        pagination,
        items: c.pointer(&key("items"), raw.items.as_deref().unwrap_or("/data")),
        next_cursor: c.pointer(
            &key("next_cursor"),
            raw.next_cursor.as_deref().unwrap_or("/next_cursor"),
        ),
        cursor_param: raw.cursor_param.clone().unwrap_or_else(|| "cursor".into()),
        limit_param: raw.limit_param.clone().unwrap_or_else(|| "limit".into()),
        has_more: c.pointer(
            &key("has_more"),
            raw.has_more.as_deref().unwrap_or("/has_more"),
        ),
        starting_after_param: raw
            .starting_after_param
            .clone()
            .unwrap_or_else(|| "starting_after".into()),
        id: c.pointer(&key("id"), raw.id.as_deref().unwrap_or("/id")),
        version: raw
            .version
            .as_deref()
            .map(|p| c.pointer(&key("version"), p)),
        version_format,
        state: c.pointer(&key("state"), raw.state.as_deref().unwrap_or("")),
        get: raw.get.clone(),
        detect_deletes: raw.detect_deletes,
        incremental: raw
            .incremental
            .as_ref()
            .map(|i| validate_incremental(c, &base, i, raw, version_format)),
        events,
    }
}

fn validate_incremental(
    c: &mut Checker,
    base: &str,
    raw: &raw::RawIncremental,
    kind: &RawKind,
    version_format: VersionFormat,
) -> IncrementalConfig {
    let key = |k: &str| format!("{base}.incremental.{k}");
    let version_is_time = version_format != VersionFormat::Integer && kind.version.is_some();
    let field = match (&raw.field, version_is_time) {
        (Some(f), _) => c.pointer(&key("field"), f),
        (None, true) => kind.version.clone().unwrap_or_default(),
        (None, false) => {
            c.fail(
                key("field"),
                "the kind's version is not a timestamp; say which item field holds the last-modified time, e.g. field = \"/updated_at\"",
            );
            String::new()
        }
    };
    let format = match raw.format.as_deref() {
        Some("rfc3339") => VersionFormat::Rfc3339,
        Some("unix") => VersionFormat::Unix,
        Some(other) => {
            c.fail(
                key("format"),
                format!("{other:?} is not a timestamp format; use rfc3339 or unix"),
            );
            VersionFormat::Rfc3339
        }
        None if version_is_time && raw.field.is_none() => version_format,
        None => VersionFormat::Rfc3339,
    };
    if raw.param.is_empty() {
        c.fail(
            key("param"),
            "name the list endpoint's query parameter, e.g. \"updated_since\"",
        );
    }
    if kind.list.is_none() {
        c.fail(
            key("param"),
            "incremental listing needs the kind's `list` endpoint",
        );
    }
    IncrementalConfig {
        param: raw.param.clone(),
        field,
        format,
        overlap: c.opt_duration(
            &key("overlap"),
            raw.overlap.as_deref(),
            Duration::from_secs(300),
        ),
        full_every: c.opt_duration(
            &key("full_every"),
            raw.full_every.as_deref(),
            Duration::from_secs(86_400),
        ),
    }
}

fn validate_event(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    raw: &RawEvent,
    kind_versioned: bool,
) -> EventMapping {
    let action = match raw.action.as_deref().unwrap_or("upsert") {
        "upsert" => Action::Upsert,
        "delete" => Action::Delete,
        other => {
            c.fail(
                key("action"),
                format!("{other:?} is not an action; use \"upsert\" or \"delete\""),
            );
            Action::Upsert
        }
    };
    if kind_versioned && raw.version.is_none() {
        c.fail(
            key("version"),
            "this kind is versioned (it or another of its events names a version), so every event must say where its version is",
        );
    }
    if !kind_versioned && action == Action::Delete {
        c.fail(
            key("action"),
            "a delete needs a version (tombstones are versioned); set version on this event and the kind",
        );
    }
    EventMapping {
        id: c.pointer(&key("id"), &raw.id),
        version: raw
            .version
            .as_deref()
            .map(|p| c.pointer(&key("version"), p)),
        state: match (raw.state.as_deref(), action) {
            (Some(p), _) => Some(c.pointer(&key("state"), p)),
            (None, Action::Upsert) => Some("/data".to_string()),
            (None, Action::Delete) => None,
        },
        action,
    }
}

#[cfg(test)]
mod tests;

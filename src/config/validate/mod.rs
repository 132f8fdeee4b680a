//! Validation: the raw configuration becomes a [`Config`] — durations parsed, secrets
//! resolved, cross-field rules checked — with every problem reported against its dotted
//! key, all of them in one run.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use secrecy::SecretString;

mod catchup;
pub mod columns;
mod kind;
mod redact;
mod schedule;
mod source;

use super::raw::{RawConfig, RawSecret};
use super::types::*;
use super::{ConfigError, Problem, WebhookSecret, defaults, secret};
pub use redact::{redact_password, redact_secrets_in};
use source::validate_source;

/// Collects problems so that one run reports all of them, not the first only.
#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
    /// A command that uses no secret: a secret that cannot be read now is left out,
    /// not an error (`status` from a shell, without the unit's credentials).
    secrets_unused: bool,
}

impl Checker {
    /// A secret's value, or `None` (an error, unless this command uses no secret).
    fn secret(&mut self, key: impl Into<String>, reference: &RawSecret) -> Option<String> {
        match secret::resolve(reference) {
            Ok(v) => Some(v),
            Err(_) if self.secrets_unused => None,
            Err(e) => {
                self.fail(key, e);
                None
            }
        }
    }

    fn warn(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

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

    fn size(&mut self, key: &str, text: &str) -> usize {
        match text.parse::<bytesize::ByteSize>() {
            Ok(b) if b.as_u64() > 0 => usize::try_from(b.as_u64()).unwrap_or(usize::MAX),
            _ => {
                self.fail(
                    key,
                    format!("{text:?} is not a size; write it like \"32MiB\" or \"512KiB\""),
                );
                0
            }
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

pub(super) fn validate(raw: RawConfig, secrets_unused: bool) -> Result<Config, ConfigError> {
    let mut c = Checker {
        secrets_unused,
        ..Checker::default()
    };

    let db = &raw.database;
    let url = db.url.as_deref().unwrap_or(defaults::DATABASE_URL);
    let (backend, redacted) = match database_backend(url) {
        Ok(v) => v,
        Err(msg) => {
            c.fail("database.url", msg);
            (Backend::Sqlite, String::new())
        }
    };
    let max_connections = db.max_connections.unwrap_or(defaults::MAX_CONNECTIONS);
    if max_connections == 0 {
        c.fail("database.max_connections", "must be at least 1");
    }
    let mut full_url = url.to_string();
    if let Some(reference) = &db.password {
        if backend != Backend::Postgres {
            c.fail(
                "database.password",
                "is for PostgreSQL; SQLite has no password",
            );
        } else if redacted != url {
            c.fail(
                "database.password",
                "database.url carries a password already; keep it in one place (remove it from the URL)",
            );
        } else {
            match secret::resolve(reference) {
                Ok(pw) => {
                    // libpq reads `password` from the URL's parameters, percent-decoded.
                    let encoded = percent_encoding::utf8_percent_encode(
                        &pw,
                        percent_encoding::NON_ALPHANUMERIC,
                    );
                    let sep = if full_url.contains('?') { '&' } else { '?' };
                    full_url = format!("{full_url}{sep}password={encoded}");
                }
                Err(e) => c.fail("database.password", e),
            }
        }
    }
    let database = DatabaseConfig {
        url: SecretString::from(full_url),
        backend,
        max_connections: max_connections.max(1),
        migrate: db.migrate.unwrap_or(defaults::MIGRATE),
        acquire_timeout: c.opt_duration(
            "database.acquire_timeout",
            db.acquire_timeout.as_deref(),
            defaults::ACQUIRE_TIMEOUT,
        ),
        busy_timeout: c.opt_duration(
            "database.busy_timeout",
            db.busy_timeout.as_deref(),
            defaults::BUSY_TIMEOUT,
        ),
        synchronous: db.synchronous.unwrap_or_default(),
        redacted,
    };

    let listen_text = raw.http.listen.as_deref().unwrap_or(defaults::LISTEN);
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            c.fail(
                "http.listen",
                format!(
                    "{listen_text:?} is not an address; write it as IP:PORT, e.g. \"127.0.0.1:8080\""
                ),
            );
            SocketAddr::from(([127, 0, 0, 1], 0))
        }
    };
    let max_body_text = raw.http.max_body.as_deref().unwrap_or(defaults::MAX_BODY);
    let max_body = match max_body_text.parse::<bytesize::ByteSize>() {
        Ok(b) if b.as_u64() > 0 => usize::try_from(b.as_u64()).unwrap_or(usize::MAX),
        _ => {
            c.fail(
                "http.max_body",
                format!("{max_body_text:?} is not a size; write it like \"1MiB\" or \"256KiB\""),
            );
            0
        }
    };
    let dead_text = raw
        .dead_letters
        .max_bytes
        .as_deref()
        .unwrap_or(defaults::DEAD_LETTERS_MAX_BYTES);
    let dead_letters_max_bytes = match dead_text.parse::<bytesize::ByteSize>() {
        Ok(b) if b.as_u64() > 0 => b.as_u64(),
        _ => {
            c.fail(
                "dead_letters.max_bytes",
                format!("{dead_text:?} is not a size; write it like \"256MiB\" or \"1GiB\""),
            );
            0
        }
    };
    let max_in_flight = raw.http.max_in_flight.unwrap_or(defaults::MAX_IN_FLIGHT);
    if max_in_flight == 0 {
        c.fail(
            "http.max_in_flight",
            "must be at least 1 (deliveries handled at once; default 256)",
        );
    }
    let budget_text = raw
        .http
        .max_body_bytes_in_flight
        .as_deref()
        .unwrap_or(defaults::MAX_BODY_BYTES_IN_FLIGHT);
    let max_body_bytes_in_flight = match budget_text.parse::<bytesize::ByteSize>() {
        Ok(b) if b.as_u64() >= max_body as u64 => usize::try_from(b.as_u64()).unwrap_or(usize::MAX),
        Ok(_) => {
            c.fail(
                "http.max_body_bytes_in_flight",
                format!("{budget_text:?} is below http.max_body: no body of the largest size could be received; raise it (default {})", defaults::MAX_BODY_BYTES_IN_FLIGHT),
            );
            0
        }
        Err(_) => {
            c.fail(
                "http.max_body_bytes_in_flight",
                format!("{budget_text:?} is not a size; write it like \"256MiB\""),
            );
            0
        }
    };
    let max_connections = match raw.http.max_connections {
        // 0 turns the cap off (behind a reverse proxy that bounds connections itself).
        Some(0) => 0,
        Some(n) if n < max_in_flight.max(1) => {
            c.fail(
                "http.max_connections",
                format!(
                    "{n} is below http.max_in_flight ({max_in_flight}): deliveries could never reach that limit; raise it or leave it unset (default {}, at least max_in_flight)",
                    defaults::MAX_HTTP_CONNECTIONS
                ),
            );
            0
        }
        Some(n) => n,
        None => defaults::MAX_HTTP_CONNECTIONS.max(max_in_flight),
    };
    let idle_timeout = c.opt_duration(
        "http.idle_timeout",
        raw.http.idle_timeout.as_deref(),
        defaults::IDLE_TIMEOUT,
    );
    let header_timeout = c.opt_duration(
        "http.header_timeout",
        raw.http.header_timeout.as_deref(),
        defaults::HEADER_TIMEOUT,
    );
    let body_timeout = c.opt_duration(
        "http.body_timeout",
        raw.http.body_timeout.as_deref(),
        defaults::BODY_TIMEOUT,
    );
    for (key, d) in [
        ("http.idle_timeout", idle_timeout),
        ("http.header_timeout", header_timeout),
        ("http.body_timeout", body_timeout),
    ] {
        if d.is_zero() {
            c.fail(key, "must be longer than 0s");
        }
    }
    let max_connections_per_ip = raw
        .http
        .max_connections_per_ip
        .unwrap_or(defaults::MAX_HTTP_CONNECTIONS_PER_IP);
    let r = &raw.retention;
    let batch = r.batch.unwrap_or(defaults::RETENTION_BATCH);
    if batch == 0 || batch > defaults::MAX_RETENTION_BATCH {
        c.fail(
            "retention.batch",
            format!("use 1 to {} rows per batch", defaults::MAX_RETENTION_BATCH),
        );
    }
    let retention = RetentionConfig {
        every: c.opt_duration(
            "retention.every",
            r.every.as_deref(),
            defaults::RETENTION_EVERY,
        ),
        batch,
        reconcile_runs: c.opt_duration(
            "retention.reconcile_runs",
            r.reconcile_runs.as_deref(),
            defaults::KEEP_RECONCILE_RUNS,
        ),
        dead_letters: c.opt_duration(
            "retention.dead_letters",
            r.dead_letters.as_deref(),
            defaults::KEEP_DEAD_LETTERS,
        ),
        changes: c.opt_duration(
            "retention.changes",
            r.changes.as_deref(),
            defaults::KEEP_CHANGES,
        ),
    };
    let changes_token = raw
        .http
        .changes_token
        .as_ref()
        .and_then(|s| c.secret("http.changes_token", s))
        .map(secrecy::SecretString::from);
    let admin_listen = raw.http.admin_listen.as_deref().and_then(|text| {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() || !path.starts_with('/') {
                c.fail(
                    "http.admin_listen",
                    format!("{text:?}: a unix socket needs an absolute path (unix:/run/webhook-reconciler/admin.sock)"),
                );
                return None;
            }
            return Some(AdminListen::Unix(path.into()));
        }
        match text.parse() {
            Ok(addr) => Some(AdminListen::Tcp(addr)),
            Err(_) => {
                c.fail(
                    "http.admin_listen",
                    format!("{text:?} is neither host:port (127.0.0.1:9091) nor unix:/path"),
                );
                None
            }
        }
    });
    let admin_token =
        raw.http
            .admin_token
            .as_ref()
            .and_then(|s| match c.secret("http.admin_token", s) {
                Some(v) if v.len() < 16 => {
                    c.fail(
                        "http.admin_token",
                        "is shorter than 16 bytes; use a long random token (openssl rand -hex 32)",
                    );
                    None
                }
                v => v.map(secrecy::SecretString::from),
            });
    let accounts_key = |c: &mut Checker, name: &str, s: Option<&RawSecret>| {
        let value = c.secret(name, s?)?;
        match crate::credential::AccountsKey::from_base64(&value) {
            Ok(k) => Some(std::sync::Arc::new(k)),
            Err(e) => {
                c.fail(name, e.to_string().replace("accounts.key", name));
                None
            }
        }
    };
    let accounts_previous_key = accounts_key(
        &mut c,
        "accounts.previous_key",
        raw.accounts.previous_key.as_ref(),
    );
    let accounts_key = accounts_key(&mut c, "accounts.key", raw.accounts.key.as_ref());
    if raw.accounts.previous_key.is_some() && raw.accounts.key.is_none() {
        c.fail(
            "accounts.previous_key",
            "is read only beside accounts.key (the new key); set accounts.key, keep the old one here, then run `webhook-reconciler accounts rekey`",
        );
    }
    let log = LogConfig {
        format: raw.log.format,
        level: raw
            .log
            .level
            .clone()
            .unwrap_or_else(|| defaults::LOG_LEVEL.into()),
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
    let views: Vec<(String, &TypedView)> = sources
        .iter()
        .flat_map(|s| {
            s.kinds.iter().filter_map(|k| {
                k.view
                    .as_ref()
                    .map(|v| (format!("sources.{}.kinds.{}", s.name, k.name), v))
            })
        })
        .collect();
    columns::check_view_names(&mut c, &views);
    // A state is refused past http.max_body written out, from webhooks and listings
    // alike (SPEC "Input limits").
    for s in &mut sources {
        s.dead_letters_max_bytes = dead_letters_max_bytes;
        for k in s
            .kinds
            .iter_mut()
            .chain(s.catchup.as_mut().map(|c| &mut c.listing))
        {
            k.max_state_bytes = max_body;
            k.max_version_ahead = s.max_version_ahead;
        }
    }

    let mut consumers = Vec::new();
    for (name, raw) in &raw.consumers {
        let key = |k: &str| format!("consumers.{name}.{k}");
        if !(raw.url.starts_with("http://") || raw.url.starts_with("https://")) {
            c.fail(key("url"), format!("{:?} is not an http(s) URL", raw.url));
        } else if is_link_local(&raw.url) {
            c.warn(
                key("url"),
                "the host is a link-local address (169.254.0.0/16 or fe80::/10), where clouds serve instance metadata and credentials; every change's state would be posted there",
            );
        }
        let secret = match c.secret(key("secret"), &raw.secret) {
            Some(v) => match WebhookSecret::new(&Scheme::StandardWebhooks, v) {
                Ok(s) => Some(s),
                Err(e) => {
                    c.fail(key("secret"), e);
                    None
                }
            },
            // Not read, by a command that pushes nothing: the consumer is still listed.
            None if c.secrets_unused => WebhookSecret::new(
                &Scheme::StandardWebhooks,
                "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".into(),
            )
            .ok(),
            None => None,
        };
        let source_names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        let kind_names: Vec<&str> = sources
            .iter()
            .flat_map(|s| s.kinds.iter().map(|k| k.name.as_str()))
            .collect();
        for (list, what, given, known) in [
            ("sources", "source", &raw.sources, &source_names),
            ("kinds", "kind", &raw.kinds, &kind_names),
        ] {
            for g in given.iter().filter(|g| !known.contains(&g.as_str())) {
                c.fail(
                    key(list),
                    format!(
                        "{g:?} is not a configured {what}; known: {}",
                        known.join(", ")
                    ),
                );
            }
        }
        let timeout = c.opt_duration(
            &key("timeout"),
            raw.timeout.as_deref(),
            defaults::CONSUMER_TIMEOUT,
        );
        if let Some(secret) = secret {
            consumers.push(ConsumerConfig {
                name: name.clone(),
                url: raw.url.clone(),
                secret,
                sources: raw.sources.clone(),
                kinds: raw.kinds.clone(),
                timeout,
                max_attempts: raw.max_attempts.unwrap_or(defaults::CONSUMER_MAX_ATTEMPTS),
                on_failure: raw.on_failure.unwrap_or_default(),
                start: raw.start.unwrap_or_default(),
            });
        }
    }

    if c.problems.is_empty() {
        Ok(Config {
            database,
            http: HttpConfig {
                listen,
                max_body,
                max_in_flight: max_in_flight as usize,
                max_body_bytes_in_flight,
                max_connections: max_connections as usize,
                max_connections_per_ip: max_connections_per_ip as usize,
                header_timeout,
                body_timeout,
                idle_timeout,
                http2: raw.http.http2.unwrap_or(false),
                admin_listen,
                admin_token,
                changes_token,
            },
            retention,
            log,
            sources,
            consumers,
            dead_letters_max_bytes,
            accounts_key,
            accounts_previous_key,
            warnings: c.warnings,
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

/// Whether `url`'s host is a link-local IP address.
fn is_link_local(url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_link_local(),
        Some(url::Host::Ipv6(ip)) => (ip.segments()[0] & 0xffc0) == 0xfe80,
        _ => false,
    }
}

fn is_password_key(key: &str) -> bool {
    let decoded = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
    let k = decoded.trim().to_ascii_lowercase();
    k == "password" || k == "sslpassword"
}

//! Validation of one `[sources.NAME]`: its webhook, reconcile schedule, kinds, incremental
//! settings and event mappings.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use super::Checker;
use super::catchup::validate_catchup;
use super::kind::{validate_kind, warn_mappings};
use super::schedule::validate_schedule;

/// The smallest Standard Webhooks key the specification recommends.
const STDWH_MIN_KEY_BYTES: usize = 24;
/// Below this an HMAC secret can be guessed offline from one captured delivery.
const MIN_HMAC_SECRET_BYTES: usize = 16;
use crate::config::base_prefix::BasePrefix;
use crate::config::raw::RawSource;
use crate::config::types::*;
use crate::config::{AccountsConfig, GithubApp};
use crate::config::{WebhookSecret, defaults};

pub(super) fn validate_source(
    c: &mut Checker,
    name: &str,
    raw: &RawSource,
) -> Option<SourceConfig> {
    let key = |k: &str| format!("sources.{name}.{k}");
    let before = c.problems.len();

    let retry_window = c.opt_duration(
        &key("retry_window"),
        raw.retry_window.as_deref(),
        defaults::RETRY_WINDOW,
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
            None => retry_window * defaults::RETENTION_RETRY_WINDOWS,
        },
        None => retry_window * defaults::RETENTION_RETRY_WINDOWS,
    };
    let max_version_ahead = c.opt_duration(
        &key("max_version_ahead"),
        raw.max_version_ahead.as_deref(),
        defaults::MAX_VERSION_AHEAD,
    );
    let requests_per_second = raw
        .requests_per_second
        .unwrap_or(defaults::REQUESTS_PER_SECOND);
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
        .and_then(|s| c.secret(key("api_token"), s))
        .map(SecretString::from);

    if let Some(h) = &raw.api_token_header {
        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            c.fail(
                key("api_token_header"),
                format!("{h:?} is not an HTTP header name, e.g. \"X-Shopify-Access-Token\""),
            );
        }
    }
    let needs_base = match raw.preset {
        Some(Preset::Github) => Some("\"https://api.github.com/repos/OWNER/REPO\""),
        Some(Preset::Shopify) => Some("\"https://SHOP.myshopify.com/admin/api/2024-10\""),
        _ => None,
    };
    // A many-account source's base URL may be each account's (Shopify's shops).
    if let (Some(example), None, None) = (needs_base, &raw.api_base, &raw.accounts) {
        c.fail(
            key("api_base"),
            format!("the preset needs the account's API URL, e.g. api_base = {example}"),
        );
    }
    let webhook = validate_webhook(c, name, raw);
    let reconcile = validate_reconcile(c, name, raw);

    let mut kinds = Vec::new();
    let mut event_types: BTreeMap<&str, &str> = BTreeMap::new();
    for (kind_name, kind) in raw.kinds.iter().filter(|(_, k)| k.enabled != Some(false)) {
        if kind_name.starts_with('$') {
            c.fail(
                format!("sources.{name}.kinds.{kind_name}"),
                "kind names may not start with '$' (reserved for the daemon's own runs, such as $catchup)",
            );
        }
        for event_type in kind.events.keys() {
            if let Some(other) = event_types.insert(event_type, kind_name) {
                c.fail(
                    format!("sources.{name}.kinds.{kind_name}.events.{event_type}"),
                    format!("event type {event_type:?} is already mapped by kind {other:?}; map each type to one kind"),
                );
            }
        }
        let k = validate_kind(c, name, kind_name, kind);
        warn_mappings(
            c,
            &format!("sources.{name}.kinds.{kind_name}"),
            &k,
            &webhook.scheme,
        );
        if k.list.as_deref().is_some_and(|l| !is_absolute(l))
            && raw.api_base.is_none()
            && needs_base.is_none()
        {
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

    let catchup = raw.catchup.as_ref().filter(|cu| cu.enabled != Some(false)).map(|cu| {
        if cu.list.trim().is_empty() {
            c.fail(
                key("catchup.list"),
                "is empty; to turn the catch-up off write `enabled = false` in [sources.NAME.catchup]",
            );
        }
        let cu = validate_catchup(c, name, cu);
        if cu.listing.list.as_deref().is_some_and(|l| !is_absolute(l)) && raw.api_base.is_none() {
            c.fail(
                key("catchup.list"),
                "a relative path needs the source's api_base; set api_base or make the URL absolute",
            );
        }
        if kinds.iter().all(|k| k.events.is_empty()) {
            c.warn(
                key("catchup"),
                "no kind of this source maps any event type, so every listed event would be ignored",
            );
        }
        cu
    });

    let accounts = raw
        .accounts
        .as_ref()
        .map(|a| validate_accounts(c, name, raw.preset, raw.api_base.as_deref(), a));
    (c.problems.len() == before).then(|| SourceConfig {
        // Set from `[dead_letters]` once every source is read.
        dead_letters_max_bytes: 0,
        name: name.to_string(),
        retry_window,
        retention,
        max_version_ahead,
        requests_per_second,
        api_base: raw.api_base.clone(),
        api_token,
        api_token_header: raw
            .api_token_header
            .clone()
            .filter(|h| !h.eq_ignore_ascii_case("authorization")),
        insecure_no_signature: raw.insecure_no_signature,
        webhook,
        reconcile,
        kinds,
        catchup,
        preset: raw.preset,
        accounts,
    })
}

/// `[sources.NAME.accounts]`: what a preset fills (Stripe Connect: the account in
/// `/account` and in the `Stripe-Account` header; GitHub Apps: `/installation/id`;
/// Shopify: a base URL per shop), then what the file says.
fn validate_accounts(
    c: &mut Checker,
    name: &str,
    preset: Option<Preset>,
    source_base: Option<&str>,
    a: &crate::config::raw::RawSourceAccounts,
) -> AccountsConfig {
    let key = |k: &str| format!("sources.{name}.accounts.{k}");
    let (from, header, api_base) = match preset {
        Some(Preset::Stripe) => (Some("/account"), Some("Stripe-Account"), None),
        Some(Preset::Github) => (Some("/installation/id"), None, None),
        Some(Preset::Shopify) => (None, None, Some("https://{account}/admin/api/2025-01")),
        _ => (None, None, None),
    };
    let from = a.from.clone().or(from.map(String::from));
    match &from {
        Some(f) if !f.starts_with('/') => c.fail(
            key("from"),
            format!(
                "{f:?} is not a JSON pointer; write where the signed body names the account, e.g. \"/account\" (Stripe Connect)"
            ),
        ),
        _ => {}
    }
    let header = a.header.clone().or(header.map(String::from));
    if let Some(h) = &header {
        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            c.fail(
                key("header"),
                format!("{h:?} is not an HTTP header name, e.g. \"Stripe-Account\""),
            );
        }
    }
    let api_base = a.api_base.clone().or(api_base.map(String::from));
    if let Some(b) = &api_base {
        if !b.contains("{account}") || !(b.starts_with("http://") || b.starts_with("https://")) {
            c.fail(
                key("api_base"),
                format!("{b:?} must be an http(s) URL with {{account}} in it, e.g. \"https://{{account}}/admin/api/2025-01\""),
            );
        }
    }
    let app = match (&a.app_id, &a.app_key) {
        (None, None) => None,
        (Some(id), Some(k)) => match c.secret(key("app_key"), k) {
            Some(pem) => {
                let key_text = SecretString::from(pem);
                // The same parse the App's token client does (`sender::github_app`).
                match jsonwebtoken::EncodingKey::from_rsa_pem(key_text.expose_secret().as_bytes()) {
                    Ok(_) => Some(GithubApp {
                        app_id: id.clone(),
                        key: key_text,
                    }),
                    Err(e) => {
                        c.fail(
                            key("app_key"),
                            format!("the GitHub App private key cannot be read: {e} (it is the PEM file GitHub made for the App)"),
                        );
                        None
                    }
                }
            }
            None => None,
        },
        (Some(_), None) => {
            c.fail(
                key("app_key"),
                "app_id is set: set app_key too (a secret reference to the App's private key PEM)",
            );
            None
        }
        (None, Some(_)) => {
            c.fail(
                key("app_id"),
                "app_key is set: set app_id too (the GitHub App's id)",
            );
            None
        }
    };
    let concurrency = a.concurrency.unwrap_or(defaults::ACCOUNT_CONCURRENCY);
    if concurrency == 0 {
        c.fail(key("concurrency"), "must be at least 1");
    }
    if from.is_none() && header.is_none() && api_base.is_none() && app.is_none() {
        c.fail(
            format!("sources.{name}.accounts"),
            "says nothing of how accounts are told apart: set from (where the signed body names the account), header or api_base",
        );
    }
    AccountsConfig {
        from,
        header,
        api_base,
        app,
        concurrency: concurrency as usize,
        lifecycle: a.lifecycle.unwrap_or(preset.is_some()),
        api_bases: validate_api_bases(c, &key("api_bases"), preset, source_base, a),
    }
}

/// The prefixes an account's own base may start with: as configured, or the preset's
/// sender and the source's own base.
fn validate_api_bases(
    c: &mut Checker,
    key: &str,
    preset: Option<Preset>,
    source_base: Option<&str>,
    a: &crate::config::raw::RawSourceAccounts,
) -> Vec<BasePrefix> {
    let texts: Vec<String> = match &a.api_bases {
        Some(list) => list.clone(),
        None => {
            let sender = match preset {
                Some(Preset::Stripe) => Some("https://api.stripe.com/"),
                Some(Preset::Github) => Some("https://api.github.com/"),
                Some(Preset::Shopify) => Some("https://*.myshopify.com/"),
                _ => None,
            };
            sender
                .map(String::from)
                .into_iter()
                .chain(
                    source_base
                        .and_then(url_origin_prefix)
                        .filter(|o| Some(o.as_str()) != sender),
                )
                .collect()
        }
    };
    let mut out = Vec::new();
    for t in &texts {
        match BasePrefix::parse(t) {
            Ok(p) => out.push(p),
            Err(e) => c.fail(key, e),
        }
    }
    out
}

/// `scheme://host[:port]/` of a URL, as a prefix.
fn url_origin_prefix(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let host = u.host_str()?;
    Some(match u.port() {
        Some(p) => format!("{}://{host}:{p}/", u.scheme()),
        None => format!("{}://{host}/", u.scheme()),
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
        .unwrap_or_else(|| defaults::webhook_path(name));
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
    let scheme = match w.scheme.unwrap_or_default() {
        SchemeName::HmacSha256 => Scheme::HmacSha256 {
            signature_header: w
                .signature_header
                .clone()
                .unwrap_or_else(|| defaults::SIGNATURE_HEADER.into()),
            timestamp_header: w
                .timestamp_header
                .clone()
                .unwrap_or_else(|| defaults::TIMESTAMP_HEADER.into()),
        },
        SchemeName::StandardWebhooks => Scheme::StandardWebhooks,
        SchemeName::Stripe => Scheme::Stripe,
        SchemeName::Github => Scheme::Github,
        SchemeName::Shopify => Scheme::Shopify,
        SchemeName::None => Scheme::None,
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
        } else {
            c.warn(
                key("scheme"),
                "signature verification is OFF: anyone who can reach the webhook path can write to this source",
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
        let key = format!("sources.{name}.webhook.secrets[{i}]");
        let Some(value) = c.secret(&key, s) else {
            continue;
        };
        match WebhookSecret::new(&scheme, value) {
            Ok(s) => {
                let hmac_scheme = matches!(
                    scheme,
                    Scheme::HmacSha256 { .. } | Scheme::Stripe | Scheme::Github | Scheme::Shopify
                );
                if hmac_scheme && s.expose().len() < MIN_HMAC_SECRET_BYTES {
                    c.warn(
                        &key,
                        format!(
                            "the secret is {} bytes; one under {MIN_HMAC_SECRET_BYTES} bytes can be guessed offline from one captured delivery. Use a long random secret (openssl rand -hex 32)",
                            s.expose().len()
                        ),
                    );
                }
                if scheme == Scheme::StandardWebhooks && s.expose().len() < STDWH_MIN_KEY_BYTES {
                    c.warn(
                        &key,
                        format!(
                            "the key is {} bytes; the Standard Webhooks specification recommends 24 to 64 random bytes",
                            s.expose().len()
                        ),
                    );
                }
                secrets.push(s);
            }
            Err(e) => c.fail(key, e),
        }
    }
    let tolerance = c.opt_duration(
        &key("tolerance"),
        w.tolerance.as_deref(),
        defaults::TOLERANCE,
    );
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
    let schedule = validate_schedule(c, &key, r.every.as_ref(), r.cron.as_ref());
    let page_size = r.page_size.unwrap_or(defaults::PAGE_SIZE);
    if page_size == 0 || page_size > defaults::MAX_PAGE_SIZE {
        c.fail(
            key("page_size"),
            format!(
                "{page_size} is out of range; use 1 to {}",
                defaults::MAX_PAGE_SIZE
            ),
        );
    }
    let max_attempts = r.max_attempts.unwrap_or(defaults::MAX_ATTEMPTS);
    if max_attempts == 0 {
        c.fail(key("max_attempts"), "must be at least 1");
    }
    let default_jitter = match &schedule {
        Some(Schedule::Every(d)) => {
            (*d / defaults::JITTER_DIVISOR).min(defaults::MAX_DEFAULT_JITTER)
        }
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
            Some(Schedule::Every(d)) => Some(*d * defaults::STALE_AFTER_INTERVALS),
            _ => None,
        },
    };
    ReconcileConfig {
        schedule,
        page_size,
        timeout: c.opt_duration(
            &key("timeout"),
            r.timeout.as_deref(),
            defaults::SENDER_TIMEOUT,
        ),
        max_attempts: max_attempts.max(1),
        max_retry_wait: c.opt_duration(
            &key("max_retry_wait"),
            r.max_retry_wait.as_deref(),
            defaults::MAX_RETRY_WAIT,
        ),
        jitter,
        run_at_start: r.run_at_start.unwrap_or(defaults::RUN_AT_START),
        stale_after,
        lease_ttl: c.opt_duration(
            &key("lease_ttl"),
            r.lease_ttl.as_deref(),
            defaults::LEASE_TTL,
        ),
        max_page_bytes: c.size(
            &key("max_page_bytes"),
            r.max_page_bytes
                .as_deref()
                .unwrap_or(defaults::MAX_PAGE_BYTES),
        ),
    }
}

//! Validation of one `[sources.NAME]`: its webhook, reconcile schedule, kinds, incremental
//! settings and event mappings.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::SecretString;

use super::Checker;

/// The smallest Standard Webhooks key the specification recommends.
const STDWH_MIN_KEY_BYTES: usize = 24;
use crate::config::raw::{self, RawEvent, RawKind, RawSource};
use crate::config::types::*;
use crate::config::{WebhookSecret, defaults, secret};

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
        .and_then(|s| match secret::resolve(s) {
            Ok(v) => Some(SecretString::from(v)),
            Err(e) => {
                c.fail(key("api_token"), e);
                None
            }
        });

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
    if let (Some(example), None) = (needs_base, &raw.api_base) {
        c.fail(
            key("api_base"),
            format!("the preset needs the account's API URL, e.g. api_base = {example}"),
        );
    }
    let webhook = validate_webhook(c, name, raw);
    let reconcile = validate_reconcile(c, name, raw);

    let mut kinds = Vec::new();
    let mut event_types: BTreeMap<&str, &str> = BTreeMap::new();
    for (kind_name, kind) in &raw.kinds {
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

    let catchup = raw.catchup.as_ref().map(|cu| {
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

    (c.problems.len() == before).then(|| SourceConfig {
        name: name.to_string(),
        retry_window,
        retention,
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
    })
}

fn validate_catchup(c: &mut Checker, source: &str, raw: &raw::RawCatchup) -> CatchupConfig {
    let base = format!("sources.{source}.catchup");
    let key = |k: &str| format!("{base}.{k}");
    let format = match raw.format {
        Some(VersionFormat::Integer) => {
            c.fail(
                key("format"),
                "\"integer\" is not a timestamp format; use unix or rfc3339",
            );
            VersionFormat::Unix
        }
        Some(f) => f,
        None => VersionFormat::Unix,
    };
    if raw.since_param.is_empty() {
        c.fail(
            key("since_param"),
            "name the events endpoint's query parameter for \"created at or after\", e.g. \"created[gte]\"",
        );
    }
    let paging = validate_paging(
        c,
        &key,
        PagingKeys {
            items: raw.items.as_deref(),
            next_cursor: raw.next_cursor.as_deref(),
            cursor_param: raw.cursor_param.as_deref(),
            limit_param: raw.limit_param.as_deref(),
            has_more: raw.has_more.as_deref(),
            starting_after_param: raw.starting_after_param.as_deref(),
        },
    );
    let listing = KindConfig {
        name: CATCHUP_KIND.to_string(),
        list: Some(raw.list.clone()),
        pagination: raw.pagination.unwrap_or_default(),
        items: paging.items,
        next_cursor: paging.next_cursor,
        cursor_param: paging.cursor_param,
        limit_param: paging.limit_param,
        has_more: paging.has_more,
        starting_after_param: paging.starting_after_param,
        // An event's own id: Stripe-style pagination continues after it.
        id: "/id".into(),
        version: None,
        version_format: VersionFormat::Integer,
        version_from: VersionFrom::Item,
        state: String::new(),
        get: None,
        get_item: String::new(),
        allowed_origins: Vec::new(),
        max_delete_fraction: 0.0,
        detect_deletes: false,
        // Filled below: the generic sweep filters by it and keeps the watermark.
        incremental: None,
        events: BTreeMap::new(),
    };
    let window = c.opt_duration(
        &key("window"),
        raw.window.as_deref(),
        defaults::CATCHUP_WINDOW,
    );
    let overlap = c.opt_duration(
        &key("overlap"),
        raw.overlap.as_deref(),
        defaults::INCREMENTAL_OVERLAP,
    );
    if overlap >= window {
        c.fail(
            key("overlap"),
            "must be shorter than window (how long the sender keeps events)",
        );
    }
    let field = c.pointer(
        &key("field"),
        raw.field.as_deref().unwrap_or(defaults::CATCHUP_FIELD),
    );
    let mut listing = listing;
    listing.incremental = Some(IncrementalConfig {
        param: raw.since_param.clone(),
        field: field.clone(),
        format,
        overlap,
        // Never a full sweep: an events listing without a filter is the whole window.
        full_every: Duration::from_secs(100 * 365 * 86_400),
    });
    CatchupConfig {
        listing,
        since_param: raw.since_param.clone(),
        field,
        format,
        overlap,
        window,
        schedule: validate_schedule(c, &key, raw.every.as_ref(), raw.cron.as_ref()),
    }
}

/// Mappings that validate but cannot work as meant: `check-config` prints them, `serve`
/// logs them at start.
fn warn_mappings(c: &mut Checker, base: &str, k: &KindConfig, scheme: &Scheme) {
    let events_versioned = k.events.values().any(|e| e.version.is_some());
    if k.list.is_some() && k.version.is_none() && !k.by_fetch_time() && events_versioned {
        c.warn(
            format!("{base}.version"),
            "the events carry versions but listed items have none, so reconcile reads them as version 0 and can never \
             repair a missed update. Point `version` at the items' version or last-modified field, or set \
             version_from = \"response_date\" if the sender's objects carry none (Stripe)",
        );
    }
    if let Some(get) = &k.get {
        if !get.contains("{id}") {
            c.warn(
                format!("{base}.get"),
                format!("{get:?} has no {{id}}: every fetch would ask for the same URL; write it like \"/orders/{{id}}\""),
            );
        }
    }
    if k.by_fetch_time() && k.list.is_none() && k.get.is_none() {
        c.warn(
            format!("{base}.version_from"),
            "\"response_date\" versions listed and fetched items, but this kind has neither `list` nor `get`",
        );
    }
    for (event_type, e) in &k.events {
        let ekey = |k: &str| format!("{base}.events.{event_type}.{k}");
        // In an envelope (every scheme but Shopify's, whose body is the resource) "/id"
        // is the event's own id: each delivery would create a new resource.
        if e.id == "/id" && *scheme != Scheme::Shopify && *scheme != Scheme::Github {
            c.warn(
                ekey("id"),
                "\"/id\" is the event's own id in the envelope, so every event would create a new resource; \
                 point it at the resource's id, e.g. \"/data/object/id\" or \"/data/id\"",
            );
        }
        if e.version.as_deref() == Some(e.id.as_str()) || e.state.as_deref() == Some(e.id.as_str())
        {
            c.warn(
                ekey("id"),
                "the id pointer is also the version or state pointer; one of them points at the wrong field",
            );
        }
    }
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
        match secret::resolve(s).and_then(|v| WebhookSecret::new(&scheme, v)) {
            Ok(s) => {
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

/// `every` or `cron` of a schedule; keys are named by `key`.
fn validate_schedule(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    every: Option<&String>,
    cron: Option<&String>,
) -> Option<Schedule> {
    match (every, cron) {
        (Some(_), Some(_)) => {
            c.fail(key("cron"), "set either `every` or `cron`, not both");
            None
        }
        (Some(every), None) => match c.duration(&key("every"), every) {
            Some(d) => match every_to_cron(d) {
                Ok(_) => Some(Schedule::Every(d)),
                Err(e) => {
                    c.fail(key("every"), e);
                    None
                }
            },
            None => None,
        },
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
    }
}

/// The pagination keys a kind and a catch-up listing share, as written.
struct PagingKeys<'a> {
    items: Option<&'a str>,
    next_cursor: Option<&'a str>,
    cursor_param: Option<&'a str>,
    limit_param: Option<&'a str>,
    has_more: Option<&'a str>,
    starting_after_param: Option<&'a str>,
}

/// Those keys with their defaults, pointers checked.
struct Paging {
    items: String,
    next_cursor: String,
    cursor_param: String,
    limit_param: String,
    has_more: String,
    starting_after_param: String,
}

fn validate_paging(c: &mut Checker, key: &dyn Fn(&str) -> String, raw: PagingKeys<'_>) -> Paging {
    Paging {
        items: c.pointer(&key("items"), raw.items.unwrap_or(defaults::ITEMS)),
        next_cursor: c.pointer(
            &key("next_cursor"),
            raw.next_cursor.unwrap_or(defaults::NEXT_CURSOR),
        ),
        cursor_param: raw.cursor_param.unwrap_or(defaults::CURSOR_PARAM).into(),
        limit_param: raw.limit_param.unwrap_or(defaults::LIMIT_PARAM).into(),
        has_more: c.pointer(&key("has_more"), raw.has_more.unwrap_or(defaults::HAS_MORE)),
        starting_after_param: raw
            .starting_after_param
            .unwrap_or(defaults::STARTING_AFTER_PARAM)
            .into(),
    }
}

fn validate_kind(c: &mut Checker, source: &str, name: &str, raw: &RawKind) -> KindConfig {
    let base = format!("sources.{source}.kinds.{name}");
    let key = |k: &str| format!("{base}.{k}");
    let pagination = raw.pagination.unwrap_or_default();
    let version_format = raw.version_format.unwrap_or_default();
    let version_from = raw.version_from.unwrap_or_default();
    if version_from == VersionFrom::ResponseDate {
        if raw.version.is_some() {
            c.fail(
                key("version_from"),
                "\"response_date\" is for items without a version, but `version` is set too; remove one of them",
            );
        }
        if version_format == VersionFormat::Integer {
            c.fail(
                key("version_format"),
                "with version_from = \"response_date\" versions are times, so events must carry a timestamp too: set version_format = \"unix\" (e.g. Stripe's `created`) or \"rfc3339\"",
            );
        }
    }
    let kind_versioned = raw.version.is_some() || version_from == VersionFrom::ResponseDate;
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
    let paging = validate_paging(
        c,
        &key,
        PagingKeys {
            items: raw.items.as_deref(),
            next_cursor: raw.next_cursor.as_deref(),
            cursor_param: raw.cursor_param.as_deref(),
            limit_param: raw.limit_param.as_deref(),
            has_more: raw.has_more.as_deref(),
            starting_after_param: raw.starting_after_param.as_deref(),
        },
    );
    KindConfig {
        name: name.to_string(),
        list: raw.list.clone(),
        pagination,
        items: paging.items,
        next_cursor: paging.next_cursor,
        cursor_param: paging.cursor_param,
        limit_param: paging.limit_param,
        has_more: paging.has_more,
        starting_after_param: paging.starting_after_param,
        id: c.pointer(&key("id"), raw.id.as_deref().unwrap_or(defaults::ITEM_ID)),
        version: raw
            .version
            .as_deref()
            .map(|p| c.pointer(&key("version"), p)),
        version_format,
        version_from,
        state: c.pointer(
            &key("state"),
            raw.state.as_deref().unwrap_or(defaults::ITEM_STATE),
        ),
        get: raw.get.clone(),
        get_item: c.pointer(&key("get_item"), raw.get_item.as_deref().unwrap_or("")),
        allowed_origins: raw
            .allowed_origins
            .iter()
            .enumerate()
            .filter_map(|(i, o)| match origin_of(o) {
                Some(origin) => Some(origin),
                None => {
                    c.fail(
                        format!("{base}.allowed_origins[{i}]"),
                        format!("{o:?} is not an origin; write it as \"https://host\" or \"https://host:port\""),
                    );
                    None
                }
            })
            .collect(),
        max_delete_fraction: match raw.max_delete_fraction {
            Some(f) if (0.0..=1.0).contains(&f) => f,
            Some(f) => {
                c.fail(
                    key("max_delete_fraction"),
                    format!("{f} is out of range; use a fraction from 0 (never tombstone) to 1 (no limit)"),
                );
                defaults::MAX_DELETE_FRACTION
            }
            None => defaults::MAX_DELETE_FRACTION,
        },
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
    let format = match raw.format {
        Some(VersionFormat::Integer) => {
            c.fail(
                key("format"),
                "\"integer\" is not a timestamp format; use rfc3339 or unix",
            );
            VersionFormat::Rfc3339
        }
        Some(f) => f,
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
            defaults::INCREMENTAL_OVERLAP,
        ),
        full_every: c.opt_duration(
            &key("full_every"),
            raw.full_every.as_deref(),
            defaults::FULL_EVERY,
        ),
    }
}

fn validate_event(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    raw: &RawEvent,
    kind_versioned: bool,
) -> EventMapping {
    let action = raw.action.unwrap_or_default();
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
            (None, Action::Upsert) => Some(defaults::EVENT_STATE.to_string()),
            (None, Action::Delete) => None,
        },
        action,
    }
}

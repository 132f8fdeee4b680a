//! Validation of one `[sources.NAME.kinds.KIND]`: pagination, pointers, versions,
//! incremental listing, event mappings, and the warnings about mappings that cannot work.

use std::collections::BTreeMap;

use super::Checker;
use crate::config::defaults;
use crate::config::raw::{self, RawEvent, RawKind};
use crate::config::types::*;

/// Mappings that validate but cannot work as meant: `check-config` prints them, `serve`
/// logs them at start.
pub(super) fn warn_mappings(c: &mut Checker, base: &str, k: &KindConfig, scheme: &Scheme) {
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
    if k.version_format == VersionFormat::Integer
        && k.max_version.is_none()
        && k.events.values().any(|e| e.version.is_some())
    {
        c.warn(
            format!("{base}.max_version"),
            "integer versions have no bound: one authentic delivery with version 9223372036854775807 would pin a row \
             for good (nothing newer could replace it; only someone holding the webhook secret can send one). Set \
             max_version to the highest version the sender can reach, e.g. max_version = 1000000000000",
        );
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

/// The pagination keys a kind and a catch-up listing share, as written.
pub(super) struct PagingKeys<'a> {
    pub(super) items: Option<&'a str>,
    pub(super) next_cursor: Option<&'a str>,
    pub(super) cursor_param: Option<&'a str>,
    pub(super) limit_param: Option<&'a str>,
    pub(super) has_more: Option<&'a str>,
    pub(super) starting_after_param: Option<&'a str>,
}

/// Those keys with their defaults, pointers checked.
pub(super) struct Paging {
    pub(super) items: String,
    pub(super) next_cursor: String,
    pub(super) cursor_param: String,
    pub(super) limit_param: String,
    pub(super) has_more: String,
    pub(super) starting_after_param: String,
}

pub(super) fn validate_paging(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    raw: PagingKeys<'_>,
) -> Paging {
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

pub(super) fn validate_kind(
    c: &mut Checker,
    source: &str,
    name: &str,
    raw: &RawKind,
) -> KindConfig {
    let base = format!("sources.{source}.kinds.{name}");
    let key = |k: &str| format!("{base}.{k}");
    let pagination = raw.pagination.unwrap_or_default();
    let version_format = raw.version_format.unwrap_or_default();
    let version_from = raw.version_from.unwrap_or_default();
    match raw.max_version {
        Some(_) if version_format != VersionFormat::Integer => c.fail(
            key("max_version"),
            "is for integer versions; a timestamp version is bounded by the source's max_version_ahead",
        ),
        Some(m) if m < 1 => c.fail(key("max_version"), format!("{m} must be at least 1")),
        _ => {}
    }
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
    for (k, v) in [("list", &raw.list), ("get", &raw.get)] {
        if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
            c.fail(
                key(k),
                format!(
                    "is empty; leave `{k}` out, or switch the kind off with {base}.enabled = false"
                ),
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
        listing: Listing::Resources,
        // Set from http.max_body once it is known (validate::validate).
        max_state_bytes: usize::MAX,
        max_version_ahead: defaults::MAX_VERSION_AHEAD,
        max_version: raw.max_version,
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
        get_many: validate_get_many(c, &key, raw),
        exclude: raw.exclude.as_deref().map(|p| c.pointer(&key("exclude"), p)),
        get_item: c.pointer(&key("get_item"), raw.get_item.as_deref().unwrap_or("")),
        match_prefixes: raw
            .match_prefixes
            .iter()
            .filter(|(pointer, _)| {
                let ok = pointer.starts_with('/');
                if !ok {
                    c.fail(
                        key("match"),
                        format!("{pointer:?} is not a JSON pointer (they start with '/')"),
                    );
                }
                ok
            })
            .map(|(p, prefix)| (p.clone(), prefix.clone()))
            .collect(),
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
        view: super::columns::validate_view(c, source, name, raw),
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

/// `get_many`, `get_many_items` (default: the listing's `items`), `get_many_size`: a
/// path with `{ids}`, beside a `get` (a fetch the batch's answer left out is retried
/// alone through it).
fn validate_get_many(
    c: &mut Checker,
    key: &dyn Fn(&str) -> String,
    raw: &RawKind,
) -> Option<GetMany> {
    let path = raw.get_many.as_ref()?;
    if !path.contains("{ids}") {
        c.fail(
            key("get_many"),
            format!(
                "{path:?} has no {{ids}}; write it like \"/orders.json?ids={{ids}}&status=any\""
            ),
        );
    }
    if raw.get.is_none() {
        c.fail(
            key("get_many"),
            "needs `get` too: an id the batch's answer leaves out is fetched alone",
        );
    }
    let size = raw.get_many_size.unwrap_or(50);
    if !(1..=1000).contains(&size) {
        c.fail(
            key("get_many_size"),
            format!("{size} is not between 1 and 1000"),
        );
    }
    Some(GetMany {
        path: path.clone(),
        items: c.pointer(
            &key("get_many_items"),
            raw.get_many_items
                .as_deref()
                .or(raw.items.as_deref())
                .unwrap_or(defaults::ITEMS),
        ),
        size: size as usize,
    })
}

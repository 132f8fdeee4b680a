//! Validation of `[sources.NAME.catchup]`: the sender's events listing, read as a kind
//! named `$catchup` so the sweep can page through it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Checker;
use super::kind::{PagingKeys, validate_paging};
use super::schedule::validate_schedule;
use crate::config::defaults;
use crate::config::raw;
use crate::config::types::*;

pub(super) fn validate_catchup(
    c: &mut Checker,
    source: &str,
    raw: &raw::RawCatchup,
) -> CatchupConfig {
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
        max_version: None,
        view: None,
        name: CATCHUP_KIND.to_string(),
        listing: Listing::Events,
        max_state_bytes: usize::MAX,
        max_version_ahead: defaults::MAX_VERSION_AHEAD,
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
        get_many: None,
        exclude: None,
        get_item: String::new(),
        allowed_origins: Vec::new(),
        max_delete_fraction: 0.0,
        detect_deletes: false,
        // Filled below: the generic sweep filters by it and keeps the watermark.
        incremental: None,
        events: BTreeMap::new(),
        match_prefixes: Vec::new(),
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

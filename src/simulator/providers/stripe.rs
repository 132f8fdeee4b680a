//! The Stripe-shaped API: `/v1/{objects}` lists (`has_more`, `starting_after`), gets,
//! and `/v1/events` newest first, filtered by `created[gte]`.

use std::collections::HashMap;

use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{World, limit, not_found, scoped};

/// `account`: the request's `Stripe-Account` (`""`: the platform's own objects).
pub(super) fn stripe(
    w: &mut World,
    path: &str,
    q: &HashMap<String, String>,
    account: &str,
) -> Response {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let missing = || {
        not_found(
            json!({"error": {"type": "invalid_request_error", "code": "resource_missing", "message": "No such object"}}),
        )
    };
    match parts.as_slice() {
        ["v1", "events"] => {
            w.list_requests += 1;
            let since: i64 = q
                .get("created[gte]")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            // Newest first, as Stripe lists them.
            let newest_first: Vec<&Value> = w
                .events
                .iter()
                .rev()
                .filter(|e| e["created"].as_i64().unwrap_or(0) >= since)
                .filter(|e| e["account"].as_str().unwrap_or_default() == account)
                .collect();
            let start = match q.get("starting_after") {
                Some(after) => match newest_first.iter().position(|e| e["id"] == **after) {
                    Some(i) => i + 1,
                    None => return missing(),
                },
                None => 0,
            };
            let n = limit(q, "limit", 10, 100);
            let page: Vec<Value> = newest_first
                .iter()
                .skip(start)
                .take(n)
                .map(|e| (*e).clone())
                .collect();
            let has_more = start + page.len() < newest_first.len();
            axum::Json(
                json!({"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}),
            )
            .into_response()
        }
        ["v1", collection] => {
            w.list_requests += 1;
            let Some(objects) = w.objects.get(&scoped(account, collection)) else {
                return axum::Json(
                    json!({"object": "list", "url": path, "has_more": false, "data": []}),
                )
                .into_response();
            };
            let n = limit(q, "limit", 10, 100);
            let iter: Box<dyn Iterator<Item = &Value>> = match q.get("starting_after") {
                Some(after) => Box::new(
                    objects
                        .range::<str, _>((
                            std::ops::Bound::Excluded(after.as_str()),
                            std::ops::Bound::Unbounded,
                        ))
                        .map(|(_, v)| v),
                ),
                None => Box::new(objects.values()),
            };
            let mut iter = iter.peekable();
            let page: Vec<Value> = iter.by_ref().take(n).cloned().collect();
            let has_more = iter.peek().is_some();
            axum::Json(json!({"object": "list", "url": path, "has_more": has_more, "data": page}))
                .into_response()
        }
        ["v1", collection, id] => {
            w.get_requests += 1;
            match w
                .objects
                .get(&scoped(account, collection))
                .and_then(|c| c.get(*id))
            {
                Some(o) => axum::Json(o.clone()).into_response(),
                None => missing(),
            }
        }
        _ => missing(),
    }
}

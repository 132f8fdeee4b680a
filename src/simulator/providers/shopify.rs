//! The Shopify-shaped API: `{collection}.json` lists wrapped in their name, paged by
//! `page_info` links (filters refused next to it), gets wrapped in the singular.

use std::collections::{BTreeMap, HashMap};

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};

use super::{SHOPIFY_PREFIX, World, limit, not_found};

pub(super) fn shopify(
    w: &mut World,
    path: &str,
    q: &HashMap<String, String>,
    host: &str,
) -> Response {
    let missing = || not_found(json!({"errors": "Not Found"}));
    let Some(rest) = path.strip_prefix(SHOPIFY_PREFIX) else {
        return missing();
    };
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [file] if file.ends_with(".json") && q.contains_key("ids") => {
            // `orders.json?ids=1,2,3`: those that exist, in one request (up to 250).
            w.get_requests += 1;
            w.get_many_requests += 1;
            let collection = file.trim_end_matches(".json");
            let keys: Vec<String> = q["ids"].split(',').take(250).map(|i| w.key(i)).collect();
            let items: Vec<Value> = keys
                .iter()
                .filter_map(|k| w.objects.get(collection).and_then(|c| c.get(k)).cloned())
                .collect();
            axum::Json(json!({ collection: items })).into_response()
        }
        [file] if file.ends_with(".json") => {
            w.list_requests += 1;
            let collection = file.trim_end_matches(".json");
            let after = match q.get("page_info") {
                Some(info) => {
                    // Shopify refuses filters next to page_info: the link carries them.
                    if q.keys().any(|k| k != "page_info" && k != "limit") {
                        return (
                            StatusCode::BAD_REQUEST,
                            axum::Json(json!({"errors": {"page_info": ["page_info cannot be passed with other parameters"]}})),
                        )
                            .into_response();
                    }
                    match base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(info)
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                    {
                        Some(key) => Some(key),
                        None => {
                            return (
                                StatusCode::BAD_REQUEST,
                                axum::Json(json!({"errors": {"page_info": ["Invalid value."]}})),
                            )
                                .into_response();
                        }
                    }
                }
                None => None,
            };
            let empty = BTreeMap::new();
            let objects = w.objects.get(collection).unwrap_or(&empty);
            let n = limit(q, "limit", 50, 250);
            let iter: Box<dyn Iterator<Item = (&String, &Value)>> = match &after {
                Some(a) => Box::new(objects.range::<str, _>((
                    std::ops::Bound::Excluded(a.as_str()),
                    std::ops::Bound::Unbounded,
                ))),
                None => Box::new(objects.iter()),
            };
            let mut iter = iter.peekable();
            let page: Vec<(&String, &Value)> = iter.by_ref().take(n).collect();
            let more = iter.peek().is_some();
            let last_key = page.last().map(|(k, _)| (*k).clone());
            let items: Vec<Value> = page.into_iter().map(|(_, v)| v.clone()).collect();
            let mut r = axum::Json(json!({ collection: items })).into_response();
            let mut links = Vec::new();
            if after.is_some() {
                links.push(format!(
                    "<http://{host}{path}?limit={n}&page_info=cHJldmlvdXM>; rel=\"previous\""
                ));
            }
            if let (true, Some(k)) = (more, last_key) {
                let info = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(k);
                links.push(format!(
                    "<http://{host}{path}?limit={n}&page_info={info}>; rel=\"next\""
                ));
            }
            if !links.is_empty() {
                if let Ok(v) = HeaderValue::from_str(&links.join(", ")) {
                    r.headers_mut().insert(header::LINK, v);
                }
            }
            r
        }
        [collection, file] if file.ends_with(".json") => {
            w.get_requests += 1;
            let key = w.key(file.trim_end_matches(".json"));
            let singular = collection.strip_suffix('s').unwrap_or(collection);
            match w.objects.get(*collection).and_then(|c| c.get(&key)) {
                Some(o) => axum::Json(json!({ singular: o })).into_response(),
                None => missing(),
            }
        }
        _ => missing(),
    }
}

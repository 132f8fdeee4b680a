//! The GitHub-shaped API: a repository's issues and pulls as top-level arrays, paged
//! by `page` with `Link` headers, sorted by `updated_at`, filtered by `since`.

use std::collections::HashMap;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{GITHUB_REPO, World, limit, not_found};

pub(super) fn github(
    w: &mut World,
    path: &str,
    q: &HashMap<String, String>,
    host: &str,
) -> Response {
    let missing = || {
        not_found(
            json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}),
        )
    };
    let Some(rest) = path.strip_prefix(GITHUB_REPO) else {
        return missing();
    };
    let parts: Vec<&str> = rest.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        [collection] => {
            w.list_requests += 1;
            let since = q.get("since").cloned().unwrap_or_default();
            let mut items: Vec<&Value> = w
                .objects
                .get(*collection)
                .map(|c| c.values().collect())
                .unwrap_or_default();
            items.retain(|o| o["updated_at"].as_str().unwrap_or("") >= since.as_str());
            // sort=updated&direction=desc, ties by number.
            items.sort_by(|a, b| {
                (b["updated_at"].as_str(), b["number"].as_u64())
                    .cmp(&(a["updated_at"].as_str(), a["number"].as_u64()))
            });
            let per_page = limit(q, "per_page", 30, 100);
            let page_no: usize = q
                .get("page")
                .and_then(|p| p.parse().ok())
                .unwrap_or(1)
                .max(1);
            let page: Vec<Value> = items
                .iter()
                .skip((page_no - 1) * per_page)
                .take(per_page)
                .map(|v| (*v).clone())
                .collect();
            let last = items.len().div_ceil(per_page).max(1);
            let mut r = axum::Json(Value::Array(page)).into_response();
            let link_to = |p: usize| {
                let mut params: Vec<(String, String)> = q
                    .iter()
                    .filter(|(k, _)| *k != "page")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                params.sort();
                params.push(("page".into(), p.to_string()));
                let query = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(params)
                    .finish();
                format!("<http://{host}{path}?{query}>")
            };
            if page_no < last {
                let link = format!(
                    "{}; rel=\"next\", {}; rel=\"last\"",
                    link_to(page_no + 1),
                    link_to(last)
                );
                if let Ok(v) = HeaderValue::from_str(&link) {
                    r.headers_mut().insert(header::LINK, v);
                }
            }
            r
        }
        [collection, number] => {
            w.get_requests += 1;
            let key = w.key(number);
            match w.objects.get(*collection).and_then(|c| c.get(&key)) {
                Some(o) => axum::Json(o.clone()).into_response(),
                None => missing(),
            }
        }
        _ => missing(),
    }
}

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

/// A GitHub App as GitHub sees it: its id, its public key, its installations.
pub(super) struct App {
    app_id: String,
    key: jsonwebtoken::DecodingKey,
    installations: Vec<String>,
    token_lifetime: i64,
    pub(super) minted: Vec<(String, String)>,
}

impl App {
    pub(super) fn new(
        app_id: &str,
        public_key_pem: &str,
        installations: &[&str],
        token_lifetime: i64,
    ) -> Result<App, String> {
        Ok(App {
            app_id: app_id.to_string(),
            key: jsonwebtoken::DecodingKey::from_rsa_pem(public_key_pem.as_bytes())
                .map_err(|e| format!("the App's public key is not PEM: {e}"))?,
            installations: installations.iter().map(|i| i.to_string()).collect(),
            token_lifetime,
            minted: Vec::new(),
        })
    }
}

/// `POST /app/installations/{id}/access_tokens`: the App's JWT (RS256, its `iss`, at
/// most 10 minutes long) for a token of that installation, as GitHub answers it.
pub(super) fn mint(
    app: &mut Option<App>,
    installation: &str,
    headers: &axum::http::HeaderMap,
    now: i64,
    counter: u64,
) -> Response {
    let refuse = |status: axum::http::StatusCode, message: &str| {
        (status, axum::Json(json!({"message": message}))).into_response()
    };
    let Some(app) = app.as_mut() else {
        return refuse(axum::http::StatusCode::NOT_FOUND, "Not Found");
    };
    let jwt = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    #[derive(serde::Deserialize)]
    struct Claims {
        iat: i64,
        exp: i64,
    }
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_required_spec_claims(&["exp", "iss"]);
    validation.set_issuer(&[app.app_id.as_str()]);
    let claims = match jsonwebtoken::decode::<Claims>(jwt, &app.key, &validation) {
        Ok(c) => c.claims,
        Err(_) => {
            return refuse(
                axum::http::StatusCode::UNAUTHORIZED,
                "A JSON web token could not be decoded",
            );
        }
    };
    if claims.exp - claims.iat > 600 || claims.iat > now + 60 {
        return refuse(
            axum::http::StatusCode::UNAUTHORIZED,
            "'Expiration time' claim ('exp') is too far in the future",
        );
    }
    if !app.installations.iter().any(|i| i == installation) {
        return refuse(axum::http::StatusCode::NOT_FOUND, "Not Found");
    }
    let token = format!("ghs_sim{counter:0>30}");
    app.minted.push((installation.to_string(), token.clone()));
    let expires_at = chrono::DateTime::from_timestamp(now + app.token_lifetime, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    (
        axum::http::StatusCode::CREATED,
        axum::Json(json!({"token": token, "expires_at": expires_at, "permissions": {"issues": "read", "pull_requests": "read"}, "repository_selection": "all"})),
    )
        .into_response()
}

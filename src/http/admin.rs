//! `/admin/accounts`: the accounts registry over HTTP, behind `http.admin_token`, with
//! the same rules as `webhook-reconciler accounts` (one `Lifecycle` for both). A
//! credential goes in and is never returned.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get};
use secrecy::SecretString;
use serde_json::json;

use super::reply::{error_reply, json_reply, unavailable};
use crate::accounts::lifecycle::{Lifecycle, LifecycleError};

/// The largest request body an account operation reads.
const MAX_BODY: usize = 64 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AddAccount {
    source: String,
    account: String,
    credential: Option<String>,
    api_base: Option<String>,
}

#[derive(serde::Deserialize)]
struct ListQuery {
    source: Option<String>,
}

#[derive(serde::Deserialize)]
struct RemoveQuery {
    #[serde(default)]
    purge: bool,
}

/// The routes; `http` puts the admin token's check in front of them.
pub(super) fn routes(life: Lifecycle) -> Router {
    let (l1, l2, l3) = (life.clone(), life.clone(), life);
    Router::new()
        .route(
            "/admin/accounts",
            get(move |q: Query<ListQuery>| {
                let life = l1.clone();
                async move {
                    match life.list(q.0.source.as_deref()).await {
                        Ok(rows) => json_reply(StatusCode::OK, json!({ "accounts": rows })),
                        Err(e) => refusal(&e),
                    }
                }
            })
            .post(move |body: Body| {
                let life = l2.clone();
                async move { add(&life, body).await }
            }),
        )
        .route(
            "/admin/accounts/{source}/{account}",
            delete(
                move |Path((source, account)): Path<(String, String)>, q: Query<RemoveQuery>| {
                    let life = l3.clone();
                    async move {
                        match life.remove(&source, &account, q.0.purge).await {
                            Ok(removed) => json_reply(
                                StatusCode::OK,
                                json!({"source": source, "account": account, "removed": removed}),
                            ),
                            Err(e) => refusal(&e),
                        }
                    }
                },
            ),
        )
}

async fn add(life: &Lifecycle, body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an account's request body is at most {MAX_BODY} bytes"),
        );
    };
    let req: AddAccount = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return error_reply(
                StatusCode::BAD_REQUEST,
                format!(
                    "expected {{\"source\", \"account\", \"credential\"?, \"api_base\"?}}: {e}"
                ),
            );
        }
    };
    let credential = req.credential.map(SecretString::from);
    match life
        .add(&req.source, &req.account, req.api_base, credential)
        .await
    {
        Ok(()) => json_reply(
            StatusCode::CREATED,
            json!({"source": req.source, "account": req.account, "enabled": true, "first_sync": "due now"}),
        ),
        Err(e) => refusal(&e),
    }
}

/// A refused or failed operation: the request's mistake is 400 (404 for an account
/// not registered), the database's is 503, neither ever 500.
fn refusal(e: &LifecycleError) -> Response {
    match e {
        LifecycleError::NotRegistered { .. } | LifecycleError::UnknownSource(_) => {
            error_reply(StatusCode::NOT_FOUND, e.to_string())
        }
        e if e.caller_error() => error_reply(StatusCode::BAD_REQUEST, e.to_string()),
        e => {
            tracing::warn!(error = %e, "an account operation failed");
            unavailable("the database could not complete the account operation; try again")
        }
    }
}

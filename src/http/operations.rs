//! `/admin/accounts`, `/admin/dead-letters`, `/admin/explain`, `/admin/consumers`,
//! `/admin/reconcile`: the operator's commands over HTTP, behind `http.admin_token` (one
//! layer in `http`), JSON in and out, over the same [`Operations`] as the command line.
//! A credential goes in and is never returned.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, post};
use secrecy::SecretString;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::reply::{error_reply, json_reply, unavailable};
use crate::operations::{OpError, Operations, Selection};

/// The largest request body an operation reads.
const MAX_BODY: usize = 1024 * 1024;

#[derive(Clone)]
struct Ops {
    ops: Operations,
}

#[derive(serde::Deserialize)]
struct SourceQuery {
    source: Option<String>,
    limit: Option<i64>,
}

#[derive(serde::Deserialize)]
struct AccountQuery {
    account: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AddAccount {
    source: String,
    account: String,
    credential: Option<String>,
    api_base: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchAccount {
    credential: Option<String>,
    /// Absent: unchanged; `null`: cleared.
    #[serde(default, deserialize_with = "present")]
    api_base: Option<Option<String>>,
}

/// A field that is present (its value may be `null`), told from one that is absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    serde::Deserialize::deserialize(d).map(Some)
}

#[derive(serde::Deserialize)]
struct AccountsQuery {
    source: Option<String>,
}

#[derive(serde::Deserialize)]
struct RemoveQuery {
    #[serde(default)]
    purge: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RewindBody {
    to: i64,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    source: String,
    kind: Option<String>,
}

/// The routes; `http` puts the admin token's check in front of them.
pub(super) fn routes(ops: Operations) -> Router {
    Router::new()
        .route("/admin/accounts", get(list_accounts).post(add_account))
        .route("/admin/accounts/rekey", post(rekey_accounts))
        .route(
            "/admin/accounts/{source}/{account}",
            delete(remove_account).patch(patch_account),
        )
        .route("/admin/dead-letters", get(list_dead_letters))
        .route("/admin/dead-letters/retry", post(retry))
        .route("/admin/dead-letters/discard", post(discard))
        .route("/admin/explain/{source}/{kind}/{id}", get(explain))
        .route("/admin/consumers", get(consumers))
        .route("/admin/consumers/{name}/rewind", post(rewind))
        .route("/admin/consumers/{name}/pause", post(pause_consumer))
        .route("/admin/consumers/{name}/resume", post(resume_consumer))
        .route("/admin/reconcile/pause", post(pause_reconcile))
        .route("/admin/reconcile/resume", post(resume_reconcile))
        .with_state(Ops { ops })
}

/// The request's JSON body, or the answer that says what was expected.
async fn body<T: DeserializeOwned>(body: Body, expected: &str) -> Result<T, Response> {
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return Err(error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an operation's request body is at most {MAX_BODY} bytes"),
        ));
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| error_reply(StatusCode::BAD_REQUEST, format!("expected {expected}: {e}")))
}

/// A refused or failed operation: the request's mistake is 400 (404 for something
/// named that does not exist), the database's 503, never 500.
fn refusal(e: &OpError) -> Response {
    if e.not_found() {
        error_reply(StatusCode::NOT_FOUND, e.to_string())
    } else if e.caller_error() {
        error_reply(StatusCode::BAD_REQUEST, e.to_string())
    } else {
        tracing::warn!(error = %e, "an operation failed");
        unavailable("the database could not complete the operation; try again")
    }
}

fn answer<T: serde::Serialize>(r: Result<T, OpError>, wrap: &str) -> Response {
    match r {
        Ok(v) => json_reply(StatusCode::OK, json!({ wrap: v })),
        Err(e) => refusal(&e),
    }
}

async fn list_accounts(State(s): State<Ops>, q: Query<AccountsQuery>) -> Response {
    answer(s.ops.accounts(q.source.as_deref()).await, "accounts")
}

async fn add_account(State(s): State<Ops>, b: Body) -> Response {
    let req =
        match body::<AddAccount>(b, r#"{"source", "account", "credential"?, "api_base"?}"#).await {
            Ok(r) => r,
            Err(r) => return r,
        };
    let credential = req.credential.map(SecretString::from);
    match s
        .ops
        .add_account(&req.source, &req.account, req.api_base, credential)
        .await
    {
        Ok(()) => json_reply(
            StatusCode::CREATED,
            json!({"source": req.source, "account": req.account, "enabled": true, "first_sync": "due now"}),
        ),
        Err(e) => refusal(&e),
    }
}

async fn patch_account(
    State(s): State<Ops>,
    Path((source, account)): Path<(String, String)>,
    b: Body,
) -> Response {
    let req = match body::<PatchAccount>(b, r#"{"credential"?, "api_base"?: URL or null}"#).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let change = crate::accounts::AccessChange {
        api_base: req.api_base,
        credential: req.credential.map(SecretString::from),
    };
    match s.ops.set_account(&source, &account, change).await {
        Ok(()) => json_reply(
            StatusCode::OK,
            json!({"source": source, "account": account, "changed": true}),
        ),
        Err(e) => refusal(&e),
    }
}

async fn rekey_accounts(State(s): State<Ops>) -> Response {
    answer(s.ops.rekey_accounts().await, "rekeyed")
}

async fn remove_account(
    State(s): State<Ops>,
    Path((source, account)): Path<(String, String)>,
    q: Query<RemoveQuery>,
) -> Response {
    match s.ops.remove_account(&source, &account, q.purge).await {
        Ok(removed) => json_reply(
            StatusCode::OK,
            json!({"source": source, "account": account, "removed": removed}),
        ),
        Err(e) => refusal(&e),
    }
}

async fn list_dead_letters(State(s): State<Ops>, q: Query<SourceQuery>) -> Response {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    answer(
        s.ops.dead_letters(q.source.as_deref(), limit).await,
        "dead_letters",
    )
}

const SELECTION: &str = r#"{"ids": [...], "source"?} or {"all": true, "source"?}"#;

async fn retry(State(s): State<Ops>, b: Body) -> Response {
    match body::<Selection>(b, SELECTION).await {
        Ok(sel) => answer(s.ops.retry_dead_letters(&sel).await, "results"),
        Err(r) => r,
    }
}

async fn discard(State(s): State<Ops>, b: Body) -> Response {
    match body::<Selection>(b, SELECTION).await {
        Ok(sel) => answer(s.ops.discard_dead_letters(&sel).await, "results"),
        Err(r) => r,
    }
}

async fn explain(
    State(s): State<Ops>,
    Path((source, kind, id)): Path<(String, String, String)>,
    q: Query<AccountQuery>,
) -> Response {
    match s
        .ops
        .explain(&source, &kind, &id, q.account.as_deref())
        .await
    {
        Ok(x) => json_reply(StatusCode::OK, json!(x)),
        Err(e) => refusal(&e),
    }
}

async fn consumers(State(s): State<Ops>) -> Response {
    answer(s.ops.consumers().await, "consumers")
}

async fn rewind(State(s): State<Ops>, Path(name): Path<String>, b: Body) -> Response {
    let req = match body::<RewindBody>(b, r#"{"to": SEQ}"#).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    match s.ops.rewind(&name, req.to).await {
        Ok(from) => json_reply(
            StatusCode::OK,
            json!({"consumer": name, "from": from, "to": req.to}),
        ),
        Err(e) => refusal(&e),
    }
}

async fn set_consumer(s: &Ops, name: &str, paused: bool) -> Response {
    match s.ops.set_consumer_paused(name, paused).await {
        Ok(()) => json_reply(StatusCode::OK, json!({"consumer": name, "paused": paused})),
        Err(e) => refusal(&e),
    }
}

async fn pause_consumer(State(s): State<Ops>, Path(name): Path<String>) -> Response {
    set_consumer(&s, &name, true).await
}

async fn resume_consumer(State(s): State<Ops>, Path(name): Path<String>) -> Response {
    set_consumer(&s, &name, false).await
}

async fn set_reconcile(s: &Ops, b: Body, paused: bool) -> Response {
    let req = match body::<PauseBody>(b, r#"{"source", "kind"?}"#).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    match s
        .ops
        .set_reconcile_paused(&req.source, req.kind.as_deref(), paused)
        .await
    {
        Ok(changed) => json_reply(
            StatusCode::OK,
            json!({"source": req.source, "kind": req.kind, "paused": paused, "changed": changed}),
        ),
        Err(e) => refusal(&e),
    }
}

async fn pause_reconcile(State(s): State<Ops>, b: Body) -> Response {
    set_reconcile(&s, b, true).await
}

async fn resume_reconcile(State(s): State<Ops>, b: Body) -> Response {
    set_reconcile(&s, b, false).await
}

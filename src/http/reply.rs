//! The one place where results become HTTP statuses (SPEC's HTTP table), and where each
//! delivery is logged once.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::ingest::Refusal;
use crate::store::Outcome;
use crate::webhook::Rejection;

/// Seconds a sender is asked to wait after a 503.
pub const RETRY_AFTER_SECS: u32 = 10;

pub fn json_reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

pub fn error_reply(status: StatusCode, message: impl Into<String>) -> Response {
    json_reply(status, json!({"error": message.into()}))
}

/// 503 with `Retry-After`: "not now, the same request will succeed later". `message`
/// says what to do; an internal error's text never goes in it (it is logged instead).
pub fn unavailable(message: impl Into<String>) -> Response {
    let mut r = error_reply(StatusCode::SERVICE_UNAVAILABLE, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

/// Whether to log this rejection now (`Some(n)`: the `n` not logged since), at most
/// once a second per source and reason: an anonymous client sending 24,000 unsigned
/// requests a second must not write 24,000 lines (journald's rate limit would then drop
/// the real errors).
fn log_rejection(source: &str, reason: &'static str) -> Option<u64> {
    crate::observability::log_line_now(source, reason)
}

fn count(source: &str, result: &'static str, took: Option<Duration>) {
    crate::observability::count_delivery();
    metrics::counter!("webhook_deliveries_total", "source" => source.to_string(), "result" => result).increment(1);
    if let Some(took) = took {
        metrics::histogram!("webhook_delivery_duration_seconds", "source" => source.to_string())
            .record(took.as_secs_f64());
    }
}

pub fn overloaded(source: &str, max_in_flight: usize) -> Response {
    count(source, "overloaded", None);
    if let Some(not_logged) = log_rejection(source, "overloaded") {
        tracing::warn!(
            source,
            max_in_flight,
            not_logged,
            "delivery refused: http.max_in_flight deliveries are already being handled; the sender will retry (later ones within a second are counted, not logged)"
        );
    }
    unavailable(format!(
        "{max_in_flight} deliveries are already being handled (http.max_in_flight); retry later"
    ))
}

/// A delivery refused before its body is read: the bodies being received fill
/// `http.max_body_bytes_in_flight`.
pub fn bodies_full(source: &str, max: usize) -> Response {
    count(source, "bodies_full", None);
    if let Some(not_logged) = log_rejection(source, "bodies_full") {
        tracing::warn!(
            source,
            max_body_bytes_in_flight = max,
            not_logged,
            "delivery refused before its body was read: the bodies being received fill http.max_body_bytes_in_flight; the sender will retry (later ones within a second are counted, not logged)"
        );
    }
    unavailable(format!(
        "{max} bytes of request bodies are already being received (http.max_body_bytes_in_flight); retry later"
    ))
}

/// A request to `/admin/*` without the right token: counted, logged at most once a
/// second (with how many were not), answered 401.
pub fn admin_unauthorized() -> Response {
    metrics::counter!("admin_unauthorized_total").increment(1);
    if let Some(not_logged) = log_rejection("admin", "unauthorized") {
        tracing::warn!(
            not_logged,
            "admin request refused: missing or wrong Authorization: Bearer token (http.admin_token)"
        );
    }
    error_reply(
        StatusCode::UNAUTHORIZED,
        "missing or wrong `Authorization: Bearer` token (http.admin_token)",
    )
}

pub fn too_slow(source: &str, body_timeout: Duration) -> Response {
    count(source, "too_slow", None);
    if let Some(not_logged) = log_rejection(source, "too_slow") {
        tracing::warn!(
            source,
            ?body_timeout,
            not_logged,
            "delivery refused: body not complete within http.body_timeout"
        );
    }
    error_reply(
        StatusCode::REQUEST_TIMEOUT,
        format!("the body did not arrive within {body_timeout:?} (http.body_timeout)"),
    )
}

pub fn too_large(source: &str, max_body: usize) -> Response {
    count(source, "too_large", None);
    if let Some(not_logged) = log_rejection(source, "too_large") {
        tracing::warn!(
            source,
            max_body,
            not_logged,
            "delivery refused: body over http.max_body"
        );
    }
    error_reply(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body is larger than {max_body} bytes (http.max_body)"),
    )
}

pub fn delivery(
    source: &str,
    result: Result<(Outcome, String), Rejection>,
    took: Duration,
) -> Response {
    let ms = took.as_secs_f64() * 1000.0;
    let label = match &result {
        Ok((outcome, _)) => outcome.as_str(),
        Err(Rejection::Unauthorized(_)) => "unauthorized",
        Err(Rejection::BadRequest(_)) => "bad_request",
        Err(Rejection::Refused(Refusal::Unprocessable { .. })) => "unprocessable",
        Err(Rejection::Refused(Refusal::Unavailable(_))) => "unavailable",
        Err(Rejection::Refused(Refusal::DeadLettersFull { .. })) => "dead_letters_full",
    };
    count(source, label, Some(took));
    match result {
        Ok((outcome, event_id)) => {
            if outcome == Outcome::Conflict {
                tracing::info!(
                    source,
                    event_id,
                    outcome = outcome.as_str(),
                    ms,
                    "delivery: equal version with a different state, kept for resolution from the sender"
                );
            } else {
                tracing::debug!(source, event_id, outcome = outcome.as_str(), ms, "delivery");
            }
            json_reply(StatusCode::OK, json!({"outcome": outcome}))
        }
        Err(Rejection::Unauthorized(e)) => {
            if let Some(not_logged) = log_rejection(source, "unauthorized") {
                tracing::warn!(source, error = %e, not_logged, "delivery refused: not authentic (later ones within a second are counted, not logged)");
            }
            error_reply(StatusCode::UNAUTHORIZED, e.to_string())
        }
        Err(Rejection::BadRequest(e)) => {
            if let Some(not_logged) = log_rejection(source, "bad_request") {
                tracing::warn!(source, error = %e, not_logged, "delivery refused: not an event envelope (later ones within a second are counted, not logged)");
            }
            error_reply(StatusCode::BAD_REQUEST, e.to_string())
        }
        Err(Rejection::Refused(e @ Refusal::Unprocessable { .. })) => {
            if let Some(not_logged) = log_rejection(source, "unprocessable") {
                tracing::warn!(source, error = %e, not_logged, "delivery dead-lettered: mapped field missing or of the wrong type (later ones within a second are counted, not logged)");
            }
            error_reply(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        Err(Rejection::Refused(Refusal::Unavailable(e))) => {
            if let Some(not_logged) = log_rejection(source, "unavailable") {
                tracing::error!(source, error = %e, not_logged, "delivery not applied: database unavailable; the sender will retry (later ones within a second are counted, not logged)");
            }
            unavailable("database unavailable; retry later")
        }
        Err(Rejection::Refused(e @ Refusal::DeadLettersFull { .. })) => {
            if let Some(not_logged) = log_rejection(source, "dead_letters_full") {
                tracing::error!(source, error = %e, not_logged, "delivery not kept: the source's dead letters are full; the sender will retry (later ones within a second are counted, not logged)");
            }
            unavailable("this source's dead letters are full (dead_letters.max_bytes); retry later")
        }
    }
}

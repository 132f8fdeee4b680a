//! Parsing a verified body: the envelope (`id`, `type`) and, for a mapped type, the
//! resource change its pointers describe. Pure.

use serde_json::Value;

use crate::change::{Change, ExtractError, Pointers};
use crate::config::{EventMapping, VersionFormat};

/// A parsed webhook envelope `{"id", "type", ...}`.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub id: String,
    pub event_type: String,
    pub doc: Value,
    /// The account an unsigned header names (Shopify's `X-Shopify-Shop-Domain`): a
    /// hint only, never trusted for what is written.
    pub account_hint: Option<String>,
}

/// Why a body is not an envelope (400, nothing written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("body is not JSON: {0}")]
    NotJson(String),
    #[error("body is JSON but not an object")]
    NotObject,
    #[error("envelope has no {0:?} (a non-empty string without NUL characters is required)")]
    Missing(&'static str),
    #[error("missing header {0} (this scheme carries the event id and type in headers)")]
    MissingHeader(&'static str),
    #[error("envelope {field:?} is refused: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Event id and type carried in headers by schemes whose bodies may lack them
/// (GitHub's `X-GitHub-Delivery` / `X-GitHub-Event`, Standard Webhooks' `webhook-id`),
/// or whose bodies are the resource itself (Shopify).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeaderIds<'a> {
    pub id: Option<&'a str>,
    pub event_type: Option<&'a str>,
    /// The body is the resource (Shopify): its `id` is the resource's, never the
    /// event's, so id and type come from these headers only.
    pub only: Option<(&'static str, &'static str)>,
}

/// Parses an envelope; the body's `id` and `type` win over `headers` (unless the scheme
/// says the body is the resource).
pub fn parse(body: &[u8], headers: HeaderIds<'_>) -> Result<Envelope, EnvelopeError> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
    from_value(doc, headers)
}

/// [`parse`] for an envelope already read as JSON (an event listed by the sender's
/// events API).
pub fn from_value(doc: Value, headers: HeaderIds<'_>) -> Result<Envelope, EnvelopeError> {
    let obj = doc.as_object().ok_or(EnvelopeError::NotObject)?;
    if let Some((id_header, type_header)) = headers.only {
        let from_header = |value: Option<&str>, name: &'static str, field: &'static str| {
            let value = value
                .filter(|v| !v.is_empty())
                .ok_or(EnvelopeError::MissingHeader(name))?;
            crate::change::limits::check_id(value)
                .map_err(|reason| EnvelopeError::Invalid { field, reason })?;
            Ok(value.to_string())
        };
        return Ok(Envelope {
            id: from_header(headers.id, id_header, "id")?,
            event_type: from_header(headers.event_type, type_header, "type")?,
            doc,
            account_hint: None,
        });
    }
    let field = |name: &'static str, fallback: Option<&str>| {
        let value = match obj.get(name) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            // Integer ids are common enough (older APIs) to accept.
            Some(Value::Number(n)) if name == "id" && (n.is_u64() || n.is_i64()) => n.to_string(),
            None => fallback
                .filter(|f| !f.is_empty())
                .map(String::from)
                .ok_or(EnvelopeError::Missing(name))?,
            _ => return Err(EnvelopeError::Missing(name)),
        };
        crate::change::limits::check_id(&value).map_err(|reason| EnvelopeError::Invalid {
            field: name,
            reason,
        })?;
        Ok(value)
    };
    let id = field("id", headers.id)?;
    let event_type = field("type", headers.event_type)?;
    Ok(Envelope {
        id,
        event_type,
        doc,
        account_hint: None,
    })
}

/// How one event type maps onto a kind of the source.
#[derive(Debug, Clone)]
pub struct KindMapping {
    pub kind: String,
    pub mapping: EventMapping,
    pub version_format: VersionFormat,
    pub max_state_bytes: usize,
    pub max_version_ahead: std::time::Duration,
    /// Integer versions: the highest accepted.
    pub max_version: Option<i64>,
    /// (pointer, prefix) pairs the body must match: it confirms the kind.
    pub match_prefixes: Vec<(String, String)>,
    /// The kind has a `get` endpoint: a conflict is settled through it.
    pub has_get: bool,
}

impl KindMapping {
    /// The change this event describes at `now_micros`, or why it cannot be read (422).
    pub fn change(
        &self,
        source: &str,
        env: &Envelope,
        now_micros: i64,
    ) -> Result<Change, ExtractError> {
        for (pointer, prefix) in &self.match_prefixes {
            let value = env.doc.pointer(pointer).and_then(Value::as_str);
            if !value.is_some_and(|v| v.starts_with(prefix.as_str())) {
                let found = value.map_or_else(
                    || "absent or not a string".to_string(),
                    |v| format!("{:?}", v.chars().take(80).collect::<String>()),
                );
                return Err(ExtractError::Invalid {
                    what: "kind",
                    pointer: pointer.clone(),
                    reason: format!(
                        "the body does not confirm the kind {}: expected a string starting with {prefix:?}, found {found}",
                        self.kind
                    ),
                });
            }
        }
        Pointers {
            id: &self.mapping.id,
            version: self.mapping.version.as_deref(),
            state: self.mapping.state.as_deref(),
            version_format: self.version_format,
            action: self.mapping.action,
            max_state_bytes: self.max_state_bytes,
            latest_version: crate::config::latest_version(
                self.version_format,
                self.max_version_ahead,
                self.max_version,
                now_micros,
            ),
        }
        .read(&env.doc, source, &self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_needs_a_json_object_with_id_and_type() {
        let parse = |b: &[u8]| super::parse(b, HeaderIds::default());
        assert!(matches!(parse(b"not json"), Err(EnvelopeError::NotJson(_))));
        assert_eq!(parse(b"[1]").unwrap_err(), EnvelopeError::NotObject);
        assert_eq!(
            parse(br#"{"type":"a"}"#).unwrap_err(),
            EnvelopeError::Missing("id")
        );
        assert_eq!(
            parse(br#"{"id":"e1"}"#).unwrap_err(),
            EnvelopeError::Missing("type")
        );
        assert_eq!(
            parse(br#"{"id":"","type":"a"}"#).unwrap_err(),
            EnvelopeError::Missing("id")
        );
        assert_eq!(
            parse(br#"{"id":"e1","type":7}"#).unwrap_err(),
            EnvelopeError::Missing("type")
        );
        let e = parse(br#"{"id":42,"type":"a.b","data":{}}"#).unwrap();
        assert_eq!((e.id.as_str(), e.event_type.as_str()), ("42", "a.b"));
    }

    #[test]
    fn header_ids_fill_in_only_what_the_body_lacks() {
        let h = HeaderIds {
            id: Some("hdr-id"),
            event_type: Some("issues"),
            only: None,
        };
        let e = parse(br#"{"action":"opened"}"#, h).unwrap();
        assert_eq!((e.id.as_str(), e.event_type.as_str()), ("hdr-id", "issues"));
        let e = parse(br#"{"id":"body-id","type":"t"}"#, h).unwrap();
        assert_eq!((e.id.as_str(), e.event_type.as_str()), ("body-id", "t"));
    }

    #[test]
    fn when_the_body_is_the_resource_only_headers_name_the_event() {
        let only = Some(("X-Shopify-Webhook-Id", "X-Shopify-Topic"));
        let h = HeaderIds {
            id: Some("b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"),
            event_type: Some("orders/updated"),
            only,
        };
        let e = parse(br#"{"id":820982911946154508,"type":"x"}"#, h).unwrap();
        assert_eq!(e.id, "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043");
        assert_eq!(e.event_type, "orders/updated");
        let missing = HeaderIds {
            id: None,
            event_type: Some("orders/updated"),
            only,
        };
        assert_eq!(
            parse(br#"{"id":1}"#, missing).unwrap_err(),
            EnvelopeError::MissingHeader("X-Shopify-Webhook-Id"),
            "the body's id is the order's, never taken as the event's"
        );
    }
}

//! A desired state for one resource, as read from a webhook event or a list item, and the
//! pure rules that read it out of JSON: ids, versions (integer or timestamp), state.
//!
//! Both flows produce a [`Change`] and hand it to `store`; nothing here touches the
//! database. `tie` holds the tie rule both flows obey, in Rust (its SQL twin is
//! `store::sql::guard_condition`).

mod key;
pub mod limits;
pub mod scan;
pub mod tie;

use std::borrow::Cow;

use chrono::DateTime;
use serde_json::Value;

use crate::config::{Action, VersionFormat};

pub use key::{Account, Key, KindScope, PauseKey, ResourceKey};

/// Where a write came from; stored in `resources.origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Webhook,
    Reconcile,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Webhook => "webhook",
            Origin::Reconcile => "reconcile",
        }
    }
}

/// What happened to one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Claimed, and the state written.
    Applied,
    /// The event id was claimed before: a retry of something done.
    Duplicate,
    /// Claimed; the stored version is newer (or equal with the same state).
    Stale,
    /// Claimed; equal version with a different state. Kept as is, resolved from the
    /// sender's current state.
    Conflict,
    /// Claimed; the event type is not mapped to any kind.
    Ignored,
    /// Claimed; the delivery names its account only in an unsigned header (Shopify's
    /// shop), so its body is a hint: the state is fetched from that account's own API
    /// through `get` and written from there. Stored as `ignored` (nothing was written
    /// from the body), answered `fetching`.
    Fetching,
}

impl Outcome {
    /// The value stored in `processed_events.outcome` and answered to the sender.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Conflict => "conflict",
            Outcome::Ignored => "ignored",
            Outcome::Fetching => "fetching",
        }
    }
}

/// One resource's state at one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub source: String,
    /// The account of a many-account source; `""` for a single-account one.
    pub account: String,
    pub kind: String,
    pub id: String,
    /// 0 for insert-once kinds.
    pub version: i64,
    /// Canonical JSON text (keys sorted, no whitespace); `None` for a delete that carries
    /// no state, which keeps the stored state under the tombstone.
    pub state: Option<String>,
    pub action: Action,
}

impl Change {
    pub fn key(&self) -> ResourceKey<&str> {
        ResourceKey::new(&self.source, &self.account, &self.kind, &self.id)
    }
}

/// Why a value could not be read; becomes a 422 and a dead letter on the webhook path, a
/// page error on the reconcile path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    #[error("{what} pointer {pointer:?} matches nothing in the document")]
    Missing { what: &'static str, pointer: String },
    #[error("{what} at {pointer:?} is {found}, expected {expected}")]
    WrongType {
        what: &'static str,
        pointer: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("{what} at {pointer:?}: {reason}")]
    Invalid {
        what: &'static str,
        pointer: String,
        reason: String,
    },
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A document fields are read from: serde_json's tree (webhook bodies, fetched
/// resources) or an item read by [`scan`] (listings).
pub trait Document {
    /// The value at `pointer` (ids and versions: small values).
    fn value_at(&self, pointer: &str) -> Option<Cow<'_, Value>>;
    /// The canonical text of the value at `pointer` (see [`limits::canonical_state`]).
    fn canonical_at(&self, pointer: &str, max_bytes: usize) -> Option<Result<String, String>>;
}

impl Document for Value {
    fn value_at(&self, pointer: &str) -> Option<Cow<'_, Value>> {
        self.pointer(pointer).map(Cow::Borrowed)
    }

    fn canonical_at(&self, pointer: &str, max_bytes: usize) -> Option<Result<String, String>> {
        self.pointer(pointer)
            .map(|v| limits::canonical_state(v, max_bytes))
    }
}

impl Document for scan::Json<'_> {
    fn value_at(&self, pointer: &str) -> Option<Cow<'_, Value>> {
        self.pointer(pointer).map(|v| Cow::Owned(v.to_value()))
    }

    fn canonical_at(&self, pointer: &str, max_bytes: usize) -> Option<Result<String, String>> {
        self.pointer(pointer)
            .map(|v| limits::canonical_text(v, max_bytes))
    }
}

fn lookup<'a>(
    doc: &'a impl Document,
    what: &'static str,
    pointer: &str,
) -> Result<Cow<'a, Value>, ExtractError> {
    doc.value_at(pointer).ok_or_else(|| ExtractError::Missing {
        what,
        pointer: pointer.to_string(),
    })
}

/// A resource id: a non-empty string, or an integer (written as its decimal text).
pub fn read_id(doc: &impl Document, pointer: &str) -> Result<String, ExtractError> {
    let v = lookup(doc, "id", pointer)?;
    match &*v {
        Value::String(s) => match limits::check_id(s) {
            // Moved out when the document made it for this call (a scanned item).
            Ok(()) => Ok(match v {
                Cow::Owned(Value::String(s)) => s,
                _ => s.clone(),
            }),
            Err(reason) => Err(ExtractError::Invalid {
                what: "id",
                pointer: pointer.into(),
                reason,
            }),
        },
        Value::Number(n) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        other => Err(ExtractError::WrongType {
            what: "id",
            pointer: pointer.into(),
            found: type_name(other),
            expected: "a string or an integer",
        }),
    }
}

/// A version as the integer the guard compares: integers as they are (0..=2^63-1),
/// timestamps as microseconds since the Unix epoch.
pub fn read_version(
    doc: &impl Document,
    pointer: &str,
    format: VersionFormat,
) -> Result<i64, ExtractError> {
    let v = lookup(doc, "version", pointer)?;
    let v = &*v;
    let invalid = |reason: String| ExtractError::Invalid {
        what: "version",
        pointer: pointer.into(),
        reason,
    };
    let wrong = |expected: &'static str| ExtractError::WrongType {
        what: "version",
        pointer: pointer.into(),
        found: type_name(v),
        expected,
    };
    match format {
        VersionFormat::Integer => {
            // The common case without formatting the number again: an integer literal
            // (serde_json's arbitrary precision parses the same text as below).
            if let Value::Number(n) = v
                && let Some(i) = n.as_i64()
            {
                return if i < 0 {
                    Err(invalid(format!("{i} is negative")))
                } else {
                    Ok(i)
                };
            }
            let text = match v {
                Value::Number(n) => n.to_string(),
                // Some senders quote large versions to survive JavaScript clients.
                Value::String(s) => s.clone(),
                _ => return Err(wrong("an integer")),
            };
            let n: i64 = text
                .parse()
                .map_err(|_| invalid(format!("{text} is not an integer between 0 and 2^63-1")))?;
            if n < 0 {
                return Err(invalid(format!("{n} is negative")));
            }
            Ok(n)
        }
        VersionFormat::Rfc3339 => {
            let Value::String(s) = v else {
                return Err(wrong("an RFC 3339 timestamp string"));
            };
            let t = DateTime::parse_from_rfc3339(s)
                .map_err(|e| invalid(format!("{s:?} is not an RFC 3339 timestamp ({e})")))?;
            let micros = t.timestamp_micros();
            if micros < 0 {
                return Err(invalid(format!(
                    "{s:?} is before 1970; timestamps used as versions must be later"
                )));
            }
            Ok(micros)
        }
        VersionFormat::Unix => {
            let secs: f64 = match v {
                Value::Number(n) => {
                    if let Some(i) = n.as_i64() {
                        return i.checked_mul(1_000_000).filter(|m| *m >= 0).ok_or_else(|| {
                            invalid(format!("{i} is out of range for unix seconds"))
                        });
                    }
                    n.as_f64()
                        .ok_or_else(|| invalid(format!("{n} is not a number")))?
                }
                Value::String(s) => s
                    .parse()
                    .map_err(|_| invalid(format!("{s:?} is not unix seconds")))?,
                _ => return Err(wrong("unix seconds")),
            };
            let micros = (secs * 1e6).round();
            if !(0.0..9.2e18).contains(&micros) {
                return Err(invalid(format!("{secs} is out of range for unix seconds")));
            }
            // In range by the check above.
            Ok(micros as i64)
        }
    }
}

/// The state sub-document as canonical JSON text, so that equal states compare equal as
/// text on every backend.
/// NUL characters are refused: PostgreSQL can store them neither in TEXT nor in JSONB,
/// and a state must mean the same on both backends.
pub fn read_state(
    doc: &impl Document,
    pointer: &str,
    max_bytes: usize,
) -> Result<String, ExtractError> {
    doc.canonical_at(pointer, max_bytes)
        .ok_or_else(|| ExtractError::Missing {
            what: "state",
            pointer: pointer.to_string(),
        })?
        .map_err(|reason| ExtractError::Invalid {
            what: "state",
            pointer: pointer.into(),
            reason,
        })
}

/// The digest of a state's canonical text that `resources.state_digest` holds: the first
/// 8 bytes of its SHA-256. Equal digests stand for equal states (a collision needs
/// 2^32 states of one resource to become likely).
pub fn state_digest(canonical: &str) -> i64 {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(canonical.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash[..8]);
    i64::from_be_bytes(first)
}

/// serde_json's map is ordered by key, so serialising a parsed value is canonical.
pub fn canonical_json(v: &Value) -> String {
    // `to_string` writes into one byte buffer; `Value`'s `Display` would go through
    // `fmt::Write` a token at a time.
    serde_json::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// Microseconds since the epoch as RFC 3339 text, for messages.
fn micros_text(micros: i64) -> String {
    DateTime::from_timestamp_micros(micros).map_or_else(|| micros.to_string(), |t| t.to_rfc3339())
}

/// Reads a [`Change`] out of `doc` with the given pointers.
pub struct Pointers<'a> {
    pub id: &'a str,
    pub version: Option<&'a str>,
    pub state: Option<&'a str>,
    pub version_format: VersionFormat,
    pub action: Action,
    /// Longest state accepted, written out.
    pub max_state_bytes: usize,
    /// The latest version accepted (timestamp versions: now + `max_version_ahead`).
    pub latest_version: Option<i64>,
}

impl Pointers<'_> {
    pub fn read(
        &self,
        doc: &impl Document,
        source: &str,
        kind: &str,
    ) -> Result<Change, ExtractError> {
        Ok(Change {
            source: source.to_string(),
            account: String::new(),
            kind: kind.to_string(),
            id: read_id(doc, self.id)?,
            version: match self.version {
                Some(p) => {
                    let v = read_version(doc, p, self.version_format)?;
                    if let Some(latest) = self.latest_version.filter(|l| v > *l) {
                        if self.version_format == VersionFormat::Integer {
                            return Err(ExtractError::Invalid {
                                what: "version",
                                pointer: p.into(),
                                reason: format!(
                                    "{v} is above the kind's max_version ({latest}); a row at such a version could never be updated again. \
                                     If the sender's versions really go that high, raise sources.NAME.kinds.KIND.max_version"
                                ),
                            });
                        }
                        return Err(ExtractError::Invalid {
                            what: "version",
                            pointer: p.into(),
                            reason: format!(
                                "{} is later than {} (now + the source's max_version_ahead); a row pinned in the future could never be updated again. \
                                 If the sender's clock is right, raise sources.NAME.max_version_ahead",
                                micros_text(v),
                                micros_text(latest)
                            ),
                        });
                    }
                    v
                }
                None => 0,
            },
            state: self
                .state
                .map(|p| read_state(doc, p, self.max_state_bytes))
                .transpose()?,
            action: self.action,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_integer_version_over_max_version_is_refused_naming_the_key() {
        let pointers = |latest| Pointers {
            id: "/id",
            version: Some("/v"),
            state: None,
            version_format: VersionFormat::Integer,
            action: Action::Upsert,
            max_state_bytes: 1000,
            latest_version: latest,
        };
        let pinned = json!({"id": "a", "v": i64::MAX});
        let e = pointers(Some(1_000_000))
            .read(&pinned, "s", "k")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_version"), "{e}");
        let fine = json!({"id": "a", "v": 1_000_000});
        assert_eq!(
            pointers(Some(1_000_000))
                .read(&fine, "s", "k")
                .unwrap()
                .version,
            1_000_000
        );
        // Without a bound (the configuration warns), anything up to i64::MAX.
        assert_eq!(
            pointers(None).read(&pinned, "s", "k").unwrap().version,
            i64::MAX
        );
    }

    #[test]
    fn integer_versions_accept_numbers_and_digit_strings_up_to_i64_max() {
        let doc = json!({"a": 9223372036854775807_i64, "b": "42", "c": -1, "d": 1.5});
        assert_eq!(
            read_version(&doc, "/a", VersionFormat::Integer),
            Ok(i64::MAX)
        );
        assert_eq!(read_version(&doc, "/b", VersionFormat::Integer), Ok(42));
        assert!(read_version(&doc, "/c", VersionFormat::Integer).is_err());
        assert!(read_version(&doc, "/d", VersionFormat::Integer).is_err());
    }

    #[test]
    fn a_version_beyond_i64_is_refused_not_wrapped() {
        let doc: Value = serde_json::from_str(r#"{"v": 9223372036854775808}"#).unwrap();
        assert!(matches!(
            read_version(&doc, "/v", VersionFormat::Integer),
            Err(ExtractError::Invalid { .. })
        ));
    }

    #[test]
    fn timestamps_become_microseconds_in_both_formats() {
        let doc = json!({"r": "2026-07-29T10:00:00Z", "o": "2026-07-29T12:00:00+02:00", "u": 1785319200, "f": 1785319200.5});
        let r = read_version(&doc, "/r", VersionFormat::Rfc3339).unwrap();
        assert_eq!(r, 1_785_319_200_000_000);
        assert_eq!(read_version(&doc, "/o", VersionFormat::Rfc3339).unwrap(), r);
        assert_eq!(read_version(&doc, "/u", VersionFormat::Unix).unwrap(), r);
        assert_eq!(
            read_version(&doc, "/f", VersionFormat::Unix).unwrap(),
            r + 500_000
        );
    }

    #[test]
    fn ids_may_be_strings_or_integers_but_not_empty_or_objects() {
        let doc = json!({"s": "ord_1", "n": 17, "e": "", "o": {}});
        assert_eq!(read_id(&doc, "/s").unwrap(), "ord_1");
        assert_eq!(read_id(&doc, "/n").unwrap(), "17");
        assert!(read_id(&doc, "/e").is_err());
        assert!(matches!(
            read_id(&doc, "/o"),
            Err(ExtractError::WrongType { .. })
        ));
        assert!(matches!(
            read_id(&doc, "/x"),
            Err(ExtractError::Missing { .. })
        ));
    }

    #[test]
    fn state_text_is_canonical_whatever_the_key_order() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":1}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "a": {"x":1, "y":2}, "b": 1 }"#).unwrap();
        assert_eq!(
            read_state(&a, "", usize::MAX).unwrap(),
            read_state(&b, "", usize::MAX).unwrap()
        );
    }

    #[test]
    fn nul_characters_are_refused_in_ids_and_states() {
        let doc: Value =
            serde_json::from_str(r#"{"id":"a\u0000b","s":{"k":["x\u0000"]},"t":{"k\u0000":1}}"#)
                .unwrap();
        assert!(read_id(&doc, "/id").is_err());
        assert!(read_state(&doc, "/s", usize::MAX).is_err());
        assert!(read_state(&doc, "/t", usize::MAX).is_err());
    }

    #[test]
    fn big_numbers_in_state_are_kept_digit_for_digit() {
        let a: Value =
            serde_json::from_str(r#"{"amount":123456789012345678901234567890.10}"#).unwrap();
        assert_eq!(
            read_state(&a, "", usize::MAX).unwrap(),
            r#"{"amount":123456789012345678901234567890.10}"#
        );
    }
}

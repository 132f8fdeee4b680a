//! Reading one page of a list endpoint: its items and where the next page is, for the
//! three pagination styles. Pure: the HTTP response comes in as status-free parts.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::{KindConfig, Pagination};

/// Where the next page is, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Cursor pagination: the opaque `next_cursor`.
    Cursor(String),
    /// RFC 8288 `Link: <url>; rel="next"`.
    Url(String),
    /// Stripe style: `starting_after` = the last item's id.
    StartingAfter(String),
}

impl Next {
    /// The position as it is stored to resume a sweep.
    pub fn encode(&self) -> String {
        match self {
            Next::Cursor(c) => format!("cursor:{c}"),
            Next::Url(u) => format!("url:{u}"),
            Next::StartingAfter(id) => format!("after:{id}"),
        }
    }

    pub fn decode(s: &str) -> Option<Next> {
        if let Some(c) = s.strip_prefix("cursor:") {
            Some(Next::Cursor(c.to_string()))
        } else if let Some(u) = s.strip_prefix("url:") {
            Some(Next::Url(u.to_string()))
        } else {
            s.strip_prefix("after:")
                .map(|id| Next::StartingAfter(id.to_string()))
        }
    }
}

/// One page: its items (the JSON text of their array, checked but not yet parsed: the
/// reader reads it in one pass with the kind's pointers, off the fetcher's path) and the
/// next position.
#[derive(Debug)]
pub struct Page {
    /// The URL this page was fetched from (for error messages about its items).
    pub url: String,
    /// The items' array, as JSON text.
    pub items: Box<RawValue>,
    pub next: Option<Next>,
    /// The response's `Date` in microseconds, read for kinds versioned by it.
    pub date: Option<i64>,
    /// Seconds spent fetching it (retries and waits for the request budget included),
    /// and parsing its JSON.
    pub fetch_seconds: f64,
    pub parse_seconds: f64,
}

/// Reads a page body fetched from `url`. `links` are the response's `Link` header
/// values (several headers may carry links).
pub fn parse_page(
    kind: &KindConfig,
    url: &str,
    body: &[u8],
    links: &[&str],
) -> Result<Page, String> {
    let mut doc = Document::read(body)?;
    let next_cursor = doc.at(&kind.next_cursor)?;
    let has_more = doc.at(&kind.has_more)?;
    let items = doc.items(&kind.items)?;
    let next = match kind.pagination {
        Pagination::Cursor => match next_cursor.as_ref() {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(Next::Cursor(s.clone())),
            Some(Value::Number(n)) => Some(Next::Cursor(n.to_string())),
            Some(_) => {
                return Err(format!(
                    "next cursor at {:?} is neither a string nor null",
                    kind.next_cursor
                ));
            }
        },
        Pagination::Link => super::link::next_target(links.iter().copied())
            .map_err(|e| e.to_string())?
            .map(Next::Url),
        Pagination::Stripe => match has_more.as_ref() {
            Some(Value::Bool(true)) => {
                let all = item_texts(&items)?;
                let last = all
                    .last()
                    .ok_or("has_more is true but the page has no items")?;
                let last: Value = serde_json::from_str(last.get())
                    .map_err(|e| format!("the last item is not JSON: {e}"))?;
                let id = crate::change::read_id(&last, &kind.id).map_err(|e| e.to_string())?;
                Some(Next::StartingAfter(id))
            }
            Some(Value::Bool(false)) | None | Some(Value::Null) => None,
            Some(_) => return Err(format!("{:?} is not a boolean", kind.has_more)),
        },
    };
    Ok(Page {
        fetch_seconds: 0.0,
        parse_seconds: 0.0,
        url: url.to_string(),
        items,
        next,
        date: None,
    })
}

/// Each item's JSON text, borrowed from the items' array.
pub fn item_texts(items: &RawValue) -> Result<Vec<&RawValue>, String> {
    serde_json::from_str(items.get()).map_err(|e| format!("the items are not a JSON array: {e}"))
}

/// A page body with its top level read and everything below it left as JSON text, so the
/// fetcher only scans the page's items (the next request waits on the page's position
/// alone); a body whose top level is not an object is read whole.
enum Document {
    Object(BTreeMap<String, Box<RawValue>>),
    Whole(Value),
}

impl Document {
    fn read(body: &[u8]) -> Result<Document, String> {
        let not_json = |e: serde_json::Error| format!("page is not JSON: {e}");
        match serde_json::from_slice(body) {
            Ok(top) => Ok(Document::Object(top)),
            Err(_) => serde_json::from_slice(body)
                .map(Document::Whole)
                .map_err(not_json),
        }
    }

    /// The value at a JSON pointer; below the top level it is parsed (small values:
    /// cursors and flags; items only when a kind points inside another object).
    fn at(&self, pointer: &str) -> Result<Option<Value>, String> {
        match self {
            Document::Whole(doc) => Ok(doc.pointer(pointer).cloned()),
            Document::Object(top) => {
                let Some((first, rest)) = split_pointer(pointer) else {
                    return Ok(None);
                };
                let Some(raw) = top.get(&first) else {
                    return Ok(None);
                };
                let v: Value = serde_json::from_str(raw.get())
                    .map_err(|e| format!("{pointer:?} is not JSON: {e}"))?;
                Ok(v.pointer(rest).cloned())
            }
        }
    }

    /// The items' array as JSON text (taken out of the document).
    fn items(&mut self, pointer: &str) -> Result<Box<RawValue>, String> {
        let not_array = || format!("items pointer {pointer:?} is not an array");
        let missing = || format!("items pointer {pointer:?} matches nothing in the page");
        if pointer.is_empty() && matches!(self, Document::Object(_)) {
            return Err(not_array());
        }
        // The common case, items one level down: scanned, not parsed.
        if let (Document::Object(top), Some((first, ""))) = (&mut *self, split_pointer(pointer)) {
            let raw = top.remove(&first).ok_or_else(missing)?;
            // Checked JSON, so its first character tells an array.
            return if raw.get().starts_with('[') {
                Ok(raw)
            } else {
                Err(not_array())
            };
        }
        match self.at(pointer)? {
            Some(items @ Value::Array(_)) => {
                serde_json::value::to_raw_value(&items).map_err(|e| e.to_string())
            }
            Some(_) => Err(not_array()),
            None => Err(missing()),
        }
    }
}

/// A JSON pointer's first reference token (unescaped) and the pointer below it; `None`
/// for the empty pointer or one that does not start with `/`.
fn split_pointer(pointer: &str) -> Option<(String, &str)> {
    let rest = pointer.strip_prefix('/')?;
    let (first, below) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    Some((first.replace("~1", "/").replace("~0", "~"), below))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn kind(pagination: &str) -> KindConfig {
        let c = Config::from_toml_str(&format!(
            "[sources.s]\napi_base = \"http://x\"\n[sources.s.webhook]\nsecrets = [\"k\"]\n[sources.s.kinds.k]\nlist = \"/k\"\npagination = \"{pagination}\"\n"
        ))
        .unwrap();
        c.sources[0].kinds[0].clone()
    }

    #[test]
    fn cursor_pages_end_on_a_null_or_missing_cursor() {
        let k = kind("cursor");
        let p = parse_page(
            &k,
            "http://x/k",
            br#"{"data":[{"id":"a"}],"next_cursor":"c2"}"#,
            &[],
        )
        .unwrap();
        assert_eq!(
            (item_texts(&p.items).unwrap().len(), p.next),
            (1, Some(Next::Cursor("c2".into())))
        );
        for last in [r#"{"data":[],"next_cursor":null}"#, r#"{"data":[]}"#] {
            assert_eq!(
                parse_page(&k, "http://x/k", last.as_bytes(), &[])
                    .unwrap()
                    .next,
                None
            );
        }
    }

    #[test]
    fn a_page_without_items_or_not_json_is_an_error_that_says_why() {
        let k = kind("cursor");
        assert!(
            parse_page(&k, "http://x/k", b"<html>", &[])
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(
            parse_page(&k, "http://x/k", br#"{"items":[]}"#, &[])
                .unwrap_err()
                .contains("matches nothing")
        );
        assert!(
            parse_page(&k, "http://x/k", br#"{"data":{}}"#, &[])
                .unwrap_err()
                .contains("not an array")
        );
    }

    #[test]
    fn link_pagination_follows_rel_next_only() {
        let k = kind("link");
        let h = r#"<https://api.example/o?page=1>; rel="prev", <https://api.example/o?page=3>; rel="next""#;
        let p = parse_page(&k, "http://x/k", br#"{"data":[]}"#, &[h]).unwrap();
        assert_eq!(
            p.next,
            Some(Next::Url("https://api.example/o?page=3".into()))
        );
        let comma = r#"<http://h/v1/o?page=2&fields=id,version>; rel="next""#;
        let p = parse_page(&k, "http://x/k", br#"{"data":[]}"#, &[comma]).unwrap();
        assert_eq!(
            p.next,
            Some(Next::Url("http://h/v1/o?page=2&fields=id,version".into()))
        );
        assert!(parse_page(&k, "http://x/k", br#"{"data":[]}"#, &["<broken"]).is_err());
    }

    #[test]
    fn stripe_pagination_continues_after_the_last_id_while_has_more() {
        let k = kind("stripe");
        let p = parse_page(
            &k,
            "http://x/k",
            br#"{"data":[{"id":"a"},{"id":"b"}],"has_more":true}"#,
            &[],
        )
        .unwrap();
        assert_eq!(p.next, Some(Next::StartingAfter("b".into())));
        let p = parse_page(
            &k,
            "http://x/k",
            br#"{"data":[{"id":"c"}],"has_more":false}"#,
            &[],
        )
        .unwrap();
        assert_eq!(p.next, None);
    }

    #[test]
    fn positions_survive_being_stored() {
        for n in [
            Next::Cursor("c:1".into()),
            Next::Url("https://a/b?c=d".into()),
            Next::StartingAfter("x".into()),
        ] {
            assert_eq!(Next::decode(&n.encode()), Some(n));
        }
    }
}

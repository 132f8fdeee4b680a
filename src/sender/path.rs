//! Putting a resource id into a `get` URL: exactly one path segment, or a refusal.

use super::SenderError;

/// Characters escaped in an id put into a URL path: everything but RFC 3986's
/// unreserved characters, so an id is always exactly one path segment.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `id` as one percent-encoded path segment (`a b` -> `a%20b`, `a/b` -> `a%2Fb`). `.`
/// and `..` are refused: URL parsers treat them (even percent-encoded) as "this" and
/// "the parent" segment, so the request would go to another resource.
pub(super) fn path_segment(id: &str) -> Result<String, SenderError> {
    if id == "." || id == ".." {
        return Err(SenderError::BadUrl(format!(
            "resource id {id:?} cannot be put in a URL path (it would name another path); \
             it is left for the next reconcile"
        )));
    }
    Ok(percent_encoding::utf8_percent_encode(id, SEGMENT).to_string())
}

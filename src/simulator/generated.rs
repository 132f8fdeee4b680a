//! Items computed from their index: listings of millions that cost the sender no memory.

use std::sync::Arc;

use serde_json::Value;

/// Items computed from their index instead of stored, for listings of millions.
#[derive(Clone)]
pub struct Generated {
    pub count: u64,
    /// Item `i`'s version.
    pub version_of: Arc<dyn Fn(u64) -> i64 + Send + Sync>,
}

impl Generated {
    pub fn id_of(i: u64) -> String {
        format!("g{i:010}")
    }

    /// Item `i` at `version`: an order of about 200 bytes, as senders list them (the
    /// one definition is [`Self::write_item`]).
    pub fn item(i: u64, version: i64) -> Value {
        let mut out = String::new();
        Generated::write_item(&mut out, i, version);
        // Always JSON (the unit test below parses every shape); Null would show there.
        serde_json::from_str(&out).unwrap_or_default()
    }

    /// Appends item `i` at `version` to `out` as JSON with its keys in order (as
    /// serde_json writes a map), without building the tree: the bench's sender serves
    /// millions of them on the cores the reconciler and the database share.
    pub fn write_item(out: &mut String, i: u64, version: i64) {
        use std::fmt::Write;
        let status = ["pending", "paid", "shipped", "delivered"][(i % 4) as usize];
        let _ = write!(
            out,
            r#"{{"amount":{},"currency":"eur","customer":"cus_{:08}","id":"g{i:010}","lines":[{{"price":1299,"qty":{},"sku":"sku_{:05}"}}],"status":"{status}","updated_at":"2026-11-30T10:00:00Z","version":{version}}}"#,
            1000 + i % 90_000,
            i % 50_000,
            1 + i % 3,
            i % 997,
        );
    }

    pub(super) fn index_of(id: &str) -> Option<u64> {
        id.strip_prefix('g')?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_item_is_item_serialised() {
        for (i, v) in [(0, 1), (7, 2), (123_456, 1), (9_999_999_999, 3)] {
            let mut out = String::new();
            Generated::write_item(&mut out, i, v);
            assert_eq!(out, Generated::item(i, v).to_string());
        }
    }
}

//! Items computed from their index: listings of millions that cost the sender no memory.

use std::sync::Arc;

use serde_json::{Value, json};

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

    /// Item `i` at `version`: an order of about 200 bytes, as senders list them.
    pub fn item(i: u64, version: i64) -> Value {
        let status = ["pending", "paid", "shipped", "delivered"][(i % 4) as usize];
        json!({
            "id": Generated::id_of(i),
            "version": version,
            "status": status,
            "amount": 1000 + i % 90_000,
            "currency": "eur",
            "customer": format!("cus_{:08}", i % 50_000),
            "lines": [{"sku": format!("sku_{:05}", i % 997), "qty": 1 + i % 3, "price": 1299}],
            "updated_at": "2026-11-30T10:00:00Z",
        })
    }

    pub(super) fn index_of(id: &str) -> Option<u64> {
        id.strip_prefix('g')?.parse().ok()
    }
}

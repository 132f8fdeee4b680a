//! What a new object of each provider looks like, and the time formats they answer in.

use serde_json::{Value, json};

use super::Provider;

/// RFC 9110 IMF-fixdate.
pub(super) fn http_date(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap_or_default()
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string()
}

pub(super) fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Shopify's GraphQL type of a REST collection (`orders` -> `Order`), as its
/// `admin_graphql_api_id` names it.
fn shopify_type(collection: &str) -> String {
    let singular = collection.strip_suffix('s').unwrap_or(collection);
    let mut chars = singular.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

/// Stripe's singular object name, and the event type prefix, of a collection.
pub(super) fn stripe_object(collection: &str) -> &str {
    match collection {
        "payment_intents" => "payment_intent",
        other => other.strip_suffix('s').unwrap_or(other),
    }
}

pub(super) fn new_object(provider: Provider, collection: &str, id: &str, now: i64) -> Value {
    match provider {
        Provider::Stripe => json!({
            "id": id,
            "object": stripe_object(collection),
            "created": now,
            "livemode": false,
            "metadata": {},
        }),
        Provider::Github => {
            let number: u64 = id.parse().unwrap_or(0);
            json!({
                "id": 1_347_000_000 + number,
                "node_id": format!("MDU6SXNzdWUx{number}"),
                "number": number,
                "state": "open",
                "created_at": rfc3339(now),
                "updated_at": rfc3339(now),
                "user": {"login": "octocat", "id": 1},
            })
        }
        Provider::Shopify => {
            let number: u64 = id.parse().unwrap_or(0);
            json!({
                "id": number,
                "admin_graphql_api_id": format!("gid://shopify/{}/{number}", shopify_type(collection)),
                "created_at": rfc3339(now),
                "updated_at": rfc3339(now),
            })
        }
    }
}

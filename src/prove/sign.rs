//! Signs a delivery as its sender would, for every scheme the receiver verifies, with
//! the functions `webhook::verify`'s tests check against the senders' published vectors
//! (`crate::signature`): the signer and the verifier cannot drift apart.

use crate::config::{Scheme, WebhookSecret, defaults};
use crate::signature as sig;

/// The `--scheme` names: `webhook.scheme`'s, and `seed` for the guide's (hmac-sha256).
pub const SCHEMES: &[&str] = &[
    "seed",
    "hmac-sha256",
    "standard-webhooks",
    "stripe",
    "github",
    "shopify",
];

pub fn scheme_named(name: &str) -> Option<Scheme> {
    Some(match name {
        "seed" | "hmac-sha256" => Scheme::HmacSha256 {
            signature_header: defaults::SIGNATURE_HEADER.into(),
            timestamp_header: defaults::TIMESTAMP_HEADER.into(),
        },
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::Github,
        "shopify" => Scheme::Shopify,
        _ => return None,
    })
}

/// Whether the scheme signs a timestamp (and so refuses an old delivery).
pub fn has_timestamp(scheme: &Scheme) -> bool {
    matches!(
        scheme,
        Scheme::HmacSha256 { .. } | Scheme::StandardWebhooks | Scheme::Stripe
    )
}

/// One delivery's headers: the signature, and the id and type where the scheme carries
/// them in headers.
pub fn headers(
    scheme: &Scheme,
    secret: &WebhookSecret,
    event_id: &str,
    event_type: &str,
    timestamp: i64,
    body: &[u8],
) -> Vec<(String, String)> {
    let key = secret.expose();
    let h = |k: &str, v: String| (k.to_string(), v);
    match scheme {
        Scheme::HmacSha256 {
            signature_header,
            timestamp_header,
        } => vec![
            h(signature_header, sig::hmac_sha256(key, timestamp, body)),
            h(timestamp_header, timestamp.to_string()),
        ],
        Scheme::StandardWebhooks => vec![
            h("webhook-id", event_id.to_string()),
            h("webhook-timestamp", timestamp.to_string()),
            h(
                "webhook-signature",
                sig::standard_webhooks(key, event_id, timestamp, body),
            ),
        ],
        Scheme::Stripe => vec![h("Stripe-Signature", sig::stripe(key, timestamp, body))],
        Scheme::Github => vec![
            h("X-Hub-Signature-256", sig::github(key, body)),
            h("X-GitHub-Delivery", event_id.to_string()),
            h("X-GitHub-Event", event_type.to_string()),
        ],
        Scheme::Shopify => vec![
            h("X-Shopify-Hmac-Sha256", sig::shopify(key, body)),
            h("X-Shopify-Webhook-Id", event_id.to_string()),
            h("X-Shopify-Topic", event_type.to_string()),
            h("X-Shopify-Event-Id", event_id.to_string()),
        ],
        Scheme::None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use crate::webhook::verify::Verifier;

    /// What `prove` sends, the receiver's own verifier accepts; with another secret or
    /// (where signed) an old timestamp, it refuses.
    #[test]
    fn every_scheme_signs_what_the_receivers_verifier_accepts() {
        let now = 1_700_000_000;
        let body = br#"{"id":"prove_1","type":"refund.succeeded"}"#;
        for name in SCHEMES {
            let scheme = scheme_named(name).unwrap();
            let text = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".to_string();
            let secret = WebhookSecret::new(&scheme, text.clone()).unwrap();
            let verifier = Verifier::new(
                scheme.clone(),
                vec![WebhookSecret::new(&scheme, text).unwrap()],
                Duration::from_secs(300),
            );
            let map = |pairs: Vec<(String, String)>| {
                let mut m = HeaderMap::new();
                for (k, v) in pairs {
                    m.insert(
                        HeaderName::from_bytes(k.as_bytes()).unwrap(),
                        HeaderValue::from_str(&v).unwrap(),
                    );
                }
                m
            };
            let signed = map(headers(
                &scheme,
                &secret,
                "prove_1",
                "refund.succeeded",
                now,
                body,
            ));
            assert_eq!(verifier.verify(&signed, body, now), Ok(()), "{name}");
            let other = WebhookSecret::from_bytes(b"another secret entirely".to_vec());
            let forged = map(headers(
                &scheme,
                &other,
                "prove_1",
                "refund.succeeded",
                now,
                body,
            ));
            assert!(verifier.verify(&forged, body, now).is_err(), "{name}");
            if has_timestamp(&scheme) {
                let old = map(headers(&scheme, &secret, "prove_1", "x", now - 3600, body));
                assert!(verifier.verify(&old, body, now).is_err(), "{name}");
            }
        }
    }
}

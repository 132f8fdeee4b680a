//! Webhook signatures as the senders compute them: the inbound verifier
//! (`webhook::verify`) checks against these schemes, the outbound pusher (`feed::push`)
//! signs the application's deliveries with Standard Webhooks, and the simulator, the
//! demo and the tests sign like a sender does.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

/// `X-Signature` (hex) for the hmac-sha256 scheme.
pub fn hmac_sha256(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    hex::encode(hmac(
        secret,
        &[timestamp.to_string().as_bytes(), b".", body],
    ))
}

/// `Stripe-Signature` header value.
pub fn stripe(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "t={timestamp},v1={}",
        hex::encode(hmac(
            secret,
            &[timestamp.to_string().as_bytes(), b".", body]
        ))
    )
}

/// `webhook-signature` header value; `key` is the decoded secret.
pub fn standard_webhooks(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = hmac(
        key,
        &[
            id.as_bytes(),
            b".",
            timestamp.to_string().as_bytes(),
            b".",
            body,
        ],
    );
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    )
}

/// `X-Shopify-Hmac-Sha256` header value.
pub fn shopify(secret: &[u8], body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(hmac(secret, &[body]))
}

/// `X-Hub-Signature-256` header value.
pub fn github(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hex::encode(hmac(secret, &[body])))
}

/// A new Standard Webhooks key: `whsec_` and 32 bytes from the thread's CSPRNG (rand's
/// ThreadRng, seeded from the operating system) in base64.
pub fn new_secret() -> String {
    let key: [u8; 32] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

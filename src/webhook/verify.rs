//! Signature verification for the five schemes, over the raw body bytes. Pure: the
//! clock is a parameter.
//!
//! Invariant: signatures are compared in constant time (`Mac::verify_slice`), and an
//! error never contains a secret or the expected signature.

use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;

use crate::config::{Scheme, WebhookSecret};

type HmacSha256 = Hmac<Sha256>;

/// Why a delivery is not authentic (401, nothing written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(String),
    #[error("header {header} is malformed: {reason}")]
    Malformed { header: String, reason: String },
    #[error(
        "timestamp {timestamp} is {skew}s away from this server's clock; the tolerance is {tolerance}s (replayed delivery, or a clock out of sync)"
    )]
    OutsideTolerance {
        timestamp: i64,
        skew: i64,
        tolerance: u64,
    },
    #[error("signature does not match any configured secret")]
    Mismatch,
}

/// Verifies deliveries for one source.
#[derive(Debug, Clone)]
pub struct Verifier {
    scheme: Scheme,
    secrets: Vec<WebhookSecret>,
    tolerance: Duration,
}

impl Verifier {
    pub fn new(scheme: Scheme, secrets: Vec<WebhookSecret>, tolerance: Duration) -> Self {
        Self {
            scheme,
            secrets,
            tolerance,
        }
    }

    /// Checks `body` and `headers` against the scheme at time `now` (unix seconds).
    pub fn verify(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        match &self.scheme {
            Scheme::None => Ok(()),
            Scheme::HmacSha256 {
                signature_header,
                timestamp_header,
            } => {
                let ts_text = header(headers, timestamp_header)?;
                let ts = self.check_timestamp(timestamp_header, ts_text, now)?;
                let sig_text = header(headers, signature_header)?;
                let sig = hex::decode(sig_text.trim()).map_err(|_| VerifyError::Malformed {
                    header: signature_header.clone(),
                    reason: "expected a hex HMAC-SHA256".into(),
                })?;
                self.any_secret_matches(&[&sig], &[ts.to_string().as_bytes(), b".", body])
            }
            Scheme::Stripe => {
                const H: &str = "Stripe-Signature";
                let value = header(headers, H)?;
                let mut ts = None;
                let mut sigs = Vec::new();
                for part in value.split(',') {
                    match part.trim().split_once('=') {
                        Some(("t", t)) => ts = Some(t),
                        Some(("v1", s)) => {
                            // An undecodable v1 cannot match; other v1 entries still may.
                            if let Ok(s) = hex::decode(s) {
                                sigs.push(s);
                            }
                        }
                        _ => {}
                    }
                }
                let ts_text = ts.ok_or_else(|| VerifyError::Malformed {
                    header: H.into(),
                    reason: "no t= timestamp".into(),
                })?;
                let ts = self.check_timestamp(H, ts_text, now)?;
                if sigs.is_empty() {
                    return Err(VerifyError::Malformed {
                        header: H.into(),
                        reason: "no v1= signature".into(),
                    });
                }
                let sigs: Vec<&[u8]> = sigs.iter().map(Vec::as_slice).collect();
                self.any_secret_matches(&sigs, &[ts.to_string().as_bytes(), b".", body])
            }
            Scheme::StandardWebhooks => {
                let id = header(headers, "webhook-id")?;
                let ts_text = header(headers, "webhook-timestamp")?;
                let ts = self.check_timestamp("webhook-timestamp", ts_text, now)?;
                let value = header(headers, "webhook-signature")?;
                let sigs: Vec<Vec<u8>> = value
                    .split_whitespace()
                    .filter_map(|s| s.strip_prefix("v1,"))
                    .filter_map(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                    .collect();
                if sigs.is_empty() {
                    return Err(VerifyError::Malformed {
                        header: "webhook-signature".into(),
                        reason: "no v1,<base64> signature".into(),
                    });
                }
                let sigs: Vec<&[u8]> = sigs.iter().map(Vec::as_slice).collect();
                self.any_secret_matches(
                    &sigs,
                    &[id.as_bytes(), b".", ts.to_string().as_bytes(), b".", body],
                )
            }
            Scheme::Github => {
                const H: &str = "X-Hub-Signature-256";
                let value = header(headers, H)?;
                let sig = value
                    .strip_prefix("sha256=")
                    .and_then(|s| hex::decode(s).ok())
                    .ok_or_else(|| VerifyError::Malformed {
                        header: H.into(),
                        reason: "expected sha256=<hex>".into(),
                    })?;
                self.any_secret_matches(&[&sig], &[body])
            }
            Scheme::Shopify => {
                const H: &str = "X-Shopify-Hmac-Sha256";
                let value = header(headers, H)?;
                let sig = base64::engine::general_purpose::STANDARD
                    .decode(value.trim())
                    .map_err(|_| VerifyError::Malformed {
                        header: H.into(),
                        reason: "expected a base64 HMAC-SHA256".into(),
                    })?;
                self.any_secret_matches(&[&sig], &[body])
            }
        }
    }

    fn check_timestamp(&self, name: &str, text: &str, now: i64) -> Result<i64, VerifyError> {
        let ts: i64 = text.trim().parse().map_err(|_| VerifyError::Malformed {
            header: name.into(),
            reason: "expected unix seconds".into(),
        })?;
        let skew = now.saturating_sub(ts);
        let tolerance = self.tolerance.as_secs();
        if skew.unsigned_abs() > tolerance {
            return Err(VerifyError::OutsideTolerance {
                timestamp: ts,
                skew,
                tolerance,
            });
        }
        Ok(ts)
    }

    /// True when any candidate signature is the HMAC of `parts` under any secret; every
    /// comparison is constant-time.
    fn any_secret_matches(&self, candidates: &[&[u8]], parts: &[&[u8]]) -> Result<(), VerifyError> {
        for secret in &self.secrets {
            let Ok(mut mac) = HmacSha256::new_from_slice(secret.expose()) else {
                continue;
            };
            for p in parts {
                mac.update(p);
            }
            for candidate in candidates {
                if mac.clone().verify_slice(candidate).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(VerifyError::Mismatch)
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, VerifyError> {
    let v = headers
        .get(name)
        .ok_or_else(|| VerifyError::MissingHeader(name.to_string()))?;
    v.to_str().map_err(|_| VerifyError::Malformed {
        header: name.to_string(),
        reason: "not ASCII".into(),
    })
}

#[cfg(test)]
mod tests;

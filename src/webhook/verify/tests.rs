use std::time::Duration;

use http::{HeaderMap, HeaderValue};

use super::*;
use crate::signature as sign;

const NOW: i64 = 1_700_000_000;
const TOLERANCE: Duration = Duration::from_secs(300);

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn hmac_scheme() -> Scheme {
    Scheme::HmacSha256 {
        signature_header: "X-Signature".into(),
        timestamp_header: "X-Signature-Timestamp".into(),
    }
}

fn verifier(scheme: Scheme, secrets: &[&[u8]]) -> Verifier {
    Verifier::new(
        scheme,
        secrets
            .iter()
            .map(|s| WebhookSecret::from_bytes(s.to_vec()))
            .collect(),
        TOLERANCE,
    )
}

#[test]
fn standard_webhooks_accepts_the_specs_published_vector() {
    // From the Standard Webhooks reference library's test_sign.
    let key = base64::engine::general_purpose::STANDARD
        .decode("C2FVsBQIhrscChlQIMV+b5sSYspob7oD")
        .unwrap();
    let body = br#"{"email":"test@example.com","username":"test_user"}"#;
    let ts = 1_649_367_553;
    let h = headers(&[
        ("webhook-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"),
        ("webhook-timestamp", "1649367553"),
        (
            "webhook-signature",
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        ),
    ]);
    let v = verifier(Scheme::StandardWebhooks, &[&key]);
    assert_eq!(v.verify(&h, body, ts), Ok(()));
    assert_eq!(
        sign::standard_webhooks(&key, "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk", ts, body),
        "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
    );
    // A signature list with an unknown version and a stale key still passes.
    let h2 = headers(&[
        ("webhook-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"),
        ("webhook-timestamp", "1649367553"),
        (
            "webhook-signature",
            "v1a,abc v1,AAAA v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        ),
    ]);
    assert_eq!(v.verify(&h2, body, ts), Ok(()));
}

#[test]
fn github_accepts_its_documented_vector() {
    // docs.github.com, "Validating webhook deliveries": secret and payload below.
    let v = verifier(Scheme::Github, &[b"It's a Secret to Everybody"]);
    let h = headers(&[(
        "X-Hub-Signature-256",
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
    )]);
    assert_eq!(v.verify(&h, b"Hello, World!", NOW), Ok(()));
}

#[test]
fn stripe_accepts_a_vector_computed_independently() {
    // Stripe documents the scheme (HMAC-SHA256 of "{t}.{body}", hex, in v1=); this
    // expected value was computed with Python's hmac module, not with our code.
    let body = br#"{"id":"evt_1","type":"order.status_changed"}"#;
    let v = verifier(Scheme::Stripe, &[b"whsec_test_secret"]);
    let h = headers(&[(
        "Stripe-Signature",
        "t=1700000000,v1=5b0f442a0ebfbf78c769c720a58dcf241c04f03a942884195d4b1272ef0e6453,v0=ignored",
    )]);
    assert_eq!(v.verify(&h, body, NOW), Ok(()));
}

#[test]
fn stripe_accepts_an_event_envelope_signed_by_its_published_algorithm() {
    // Stripe's published algorithm: HMAC-SHA256 keyed with the whole whsec_ secret
    // over "{t}.{raw body}", hex. Expected value computed with openssl, not our code:
    // printf '%s' "1700000000.$BODY" | openssl dgst -sha256 -hmac whsec_test_secret
    let body = br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2023-10-16","created":1700000000,"data":{"object":{"id":"cus_NffrFeUfNV2Hib","object":"customer","email":"jenny.rosen@example.com"}},"livemode":false,"pending_webhooks":1,"request":{"id":null,"idempotency_key":null},"type":"customer.updated"}"#;
    let v = verifier(Scheme::Stripe, &[b"whsec_test_secret"]);
    let h = headers(&[(
        "Stripe-Signature",
        "t=1700000000,v1=3c0375e186329086278b848e026ac443efa832bbc14fa865fa65f8f08146c984",
    )]);
    assert_eq!(v.verify(&h, body, NOW), Ok(()));
    let mut tampered = body.to_vec();
    tampered[10] ^= 1;
    assert_eq!(v.verify(&h, &tampered, NOW), Err(VerifyError::Mismatch));
}

#[test]
fn shopify_accepts_a_vector_computed_independently() {
    // Shopify: base64 HMAC-SHA256 of the raw body. Computed with openssl, not our code:
    // printf '%s' "$BODY" | openssl dgst -sha256 -hmac shpss_test_secret -binary | base64
    let body = br#"{"id":820982911946154508,"email":"jon@example.com","updated_at":"2026-11-30T10:00:00-05:00"}"#;
    let v = verifier(Scheme::Shopify, &[b"shpss_test_secret"]);
    let h = headers(&[(
        "X-Shopify-Hmac-Sha256",
        "Jmwae7jO/hupys3nDEtMT7CluWz/GNSQ2Pg/DuFj0Vg=",
    )]);
    assert_eq!(v.verify(&h, body, NOW), Ok(()));
    assert_eq!(
        sign::shopify(b"shpss_test_secret", body),
        "Jmwae7jO/hupys3nDEtMT7CluWz/GNSQ2Pg/DuFj0Vg="
    );
    assert_eq!(
        v.verify(&h, &body[1..], NOW),
        Err(VerifyError::Mismatch),
        "a changed body is refused"
    );
    assert!(matches!(
        v.verify(
            &headers(&[("X-Shopify-Hmac-Sha256", "not base64!")]),
            body,
            NOW
        ),
        Err(VerifyError::Malformed { .. })
    ));
}

#[test]
fn hmac_sha256_accepts_a_vector_computed_independently() {
    let body = br#"{"id":"evt_1","type":"order.status_changed"}"#;
    let v = verifier(hmac_scheme(), &[b"shop-secret"]);
    let h = headers(&[
        (
            "X-Signature",
            "33c4118e0de42778dac1df58211fd5b64bfbab4b58f159826a56a064d56d705e",
        ),
        ("X-Signature-Timestamp", "1700000000"),
    ]);
    assert_eq!(v.verify(&h, body, NOW), Ok(()));
    assert_eq!(
        sign::hmac_sha256(b"shop-secret", NOW, body),
        "33c4118e0de42778dac1df58211fd5b64bfbab4b58f159826a56a064d56d705e"
    );
}

#[test]
fn any_of_several_secrets_verifies_during_a_rotation() {
    let body = b"{}";
    let v = verifier(hmac_scheme(), &[b"old", b"new"]);
    for secret in [&b"old"[..], b"new"] {
        let h = headers(&[
            ("X-Signature", &sign::hmac_sha256(secret, NOW, body)),
            ("X-Signature-Timestamp", "1700000000"),
        ]);
        assert_eq!(v.verify(&h, body, NOW), Ok(()));
    }
}

#[test]
fn a_wrong_secret_a_missing_header_or_a_tampered_body_is_refused_in_every_scheme() {
    let body = br#"{"id":"e"}"#;
    let ts = NOW.to_string();
    let std_key = b"0123456789abcdef".to_vec();
    let cases: Vec<(Scheme, Vec<u8>, HeaderMap)> = vec![
        (
            hmac_scheme(),
            b"good".to_vec(),
            headers(&[
                ("X-Signature", &sign::hmac_sha256(b"bad", NOW, body)),
                ("X-Signature-Timestamp", &ts),
            ]),
        ),
        (
            Scheme::Stripe,
            b"good".to_vec(),
            headers(&[("Stripe-Signature", &sign::stripe(b"bad", NOW, body))]),
        ),
        (
            Scheme::StandardWebhooks,
            std_key.clone(),
            headers(&[
                ("webhook-id", "e"),
                ("webhook-timestamp", &ts),
                (
                    "webhook-signature",
                    &sign::standard_webhooks(b"bad", "e", NOW, body),
                ),
            ]),
        ),
        (
            Scheme::Github,
            b"good".to_vec(),
            headers(&[("X-Hub-Signature-256", &sign::github(b"bad", body))]),
        ),
    ];
    for (scheme, secret, h) in cases {
        let name = scheme.name();
        let v = verifier(scheme, &[&secret]);
        assert_eq!(
            v.verify(&h, body, NOW),
            Err(VerifyError::Mismatch),
            "{name}: wrong secret"
        );
        assert!(
            matches!(
                v.verify(&HeaderMap::new(), body, NOW),
                Err(VerifyError::MissingHeader(_))
            ),
            "{name}: no headers"
        );
    }
    // Right secret, body changed after signing.
    let v = verifier(Scheme::Github, &[b"good"]);
    let h = headers(&[("X-Hub-Signature-256", &sign::github(b"good", body))]);
    assert_eq!(
        v.verify(&h, b"{\"id\":\"f\"}", NOW),
        Err(VerifyError::Mismatch)
    );
}

#[test]
fn timestamps_too_old_or_too_far_in_the_future_are_refused() {
    let body = b"{}";
    let v = verifier(hmac_scheme(), &[b"s"]);
    for (ts, ok) in [
        (NOW - 300, true),
        (NOW + 300, true),
        (NOW - 301, false),
        (NOW + 301, false),
        (NOW - 86_400, false),
    ] {
        let h = headers(&[
            ("X-Signature", &sign::hmac_sha256(b"s", ts, body)),
            ("X-Signature-Timestamp", &ts.to_string()),
        ]);
        let r = v.verify(&h, body, NOW);
        assert_eq!(r.is_ok(), ok, "ts offset {}: {r:?}", ts - NOW);
        if !ok {
            assert!(matches!(r, Err(VerifyError::OutsideTolerance { .. })));
        }
    }
    let stripe = verifier(Scheme::Stripe, &[b"s"]);
    let h = headers(&[("Stripe-Signature", &sign::stripe(b"s", NOW + 3600, body))]);
    assert!(matches!(
        stripe.verify(&h, body, NOW),
        Err(VerifyError::OutsideTolerance { .. })
    ));
}

#[test]
fn errors_never_show_the_expected_signature() {
    let body = b"{}";
    let v = verifier(Scheme::Github, &[b"topsecret"]);
    let expected = sign::github(b"topsecret", body);
    let h = headers(&[("X-Hub-Signature-256", "sha256=00")]);
    let msg = v.verify(&h, body, NOW).unwrap_err().to_string();
    assert!(
        !msg.contains(&expected[7..]) && !msg.contains("topsecret"),
        "{msg}"
    );
}

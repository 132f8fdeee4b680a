//! No input makes the pure parsers panic: any bytes through envelope parsing, every
//! scheme's verification, page parsing, Link headers and version parsing end in `Ok` or a
//! typed error (proptest, stable). And a running server answers thousands of random and
//! mutated deliveries without a 5xx (503 only while its database is down).

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use webhook_reconciler::change::{read_id, read_state, read_version};
use webhook_reconciler::config::{Config, VersionFormat};
use webhook_reconciler::ingest::envelope::{self, HeaderIds};
use webhook_reconciler::sender::{link, page};
use webhook_reconciler::webhook::verify::Verifier;

use crate::helpers::proxy::Proxy;
use crate::helpers::{Backend, SHOP_SECRET, TestDb, spawn_app_on};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,20}".prop_map(Value::from),
        "[0-9]{1,5}(\\.[0-9]{0,5})?([eE][-+]?[0-9]{1,7})?"
            .prop_map(|n| serde_json::from_str(&n).unwrap_or(Value::Null)),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn headers(pairs: &[(String, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v)) {
            h.append(k, v);
        }
    }
    h
}

fn kinds() -> Vec<webhook_reconciler::config::KindConfig> {
    ["cursor", "link", "stripe"]
        .iter()
        .map(|p| {
            let c = Config::from_toml_str(&format!(
                "[sources.s]\napi_base = \"http://x\"\n[sources.s.webhook]\nsecrets = [\"k\"]\n[sources.s.kinds.k]\nlist = \"/k\"\npagination = \"{p}\"\n"
            ))
            .unwrap();
            c.sources[0].kinds[0].clone()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn envelope_parsing_never_panics(body in prop::collection::vec(any::<u8>(), 0..300), json in arb_json(),
                                     id in proptest::option::of("\\PC{0,10}"), ty in proptest::option::of("\\PC{0,10}")) {
        let ids = HeaderIds { id: id.as_deref(), event_type: ty.as_deref(), only: None };
        let _ = envelope::parse(&body, ids);
        let _ = envelope::parse(json.to_string().as_bytes(), ids);
    }

    #[test]
    fn every_scheme_verification_never_panics(body in prop::collection::vec(any::<u8>(), 0..200),
            pairs in prop::collection::vec((prop_oneof![
                Just("x-signature".to_string()), Just("x-signature-timestamp".to_string()),
                Just("stripe-signature".to_string()), Just("webhook-id".to_string()),
                Just("webhook-timestamp".to_string()), Just("webhook-signature".to_string()),
                Just("x-hub-signature-256".to_string()), "[a-z-]{1,12}"],
                "[ -~]{0,80}"), 0..6),
            now in any::<i64>()) {
        let toml = |scheme: &str, secret: &str| format!(
            "[sources.s]\ninsecure_no_signature = true\n[sources.s.webhook]\nscheme = \"{scheme}\"\nsecrets = [\"{secret}\"]\n");
        for (scheme, secret) in [("hmac-sha256", "k"), ("stripe", "whsec_k"),
                                 ("standard-webhooks", "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="), ("github", "k")] {
            let c = Config::from_toml_str(&toml(scheme, secret)).unwrap();
            let w = &c.sources[0].webhook;
            let v = Verifier::new(w.scheme.clone(), w.secrets.clone(), w.tolerance);
            let _ = v.verify(&headers(&pairs), &body, now);
        }
    }

    #[test]
    fn page_and_link_parsing_never_panic(body in prop::collection::vec(any::<u8>(), 0..300), json in arb_json(),
                                         link_header in "[ -~]{0,120}") {
        for kind in kinds() {
            let _ = page::parse_page(&kind, "http://x/k", &body, &[link_header.as_str()]);
            let doc = json!({"data": [json.clone()], "next_cursor": json.clone(), "has_more": true});
            let _ = page::parse_page(&kind, "http://x/k", doc.to_string().as_bytes(), &[link_header.as_str()]);
        }
        let _ = link::next_target([link_header.as_str()]);
    }

    #[test]
    fn version_id_and_state_reading_never_panic(json in arb_json()) {
        let doc = json!({"v": json.clone()});
        for f in [VersionFormat::Integer, VersionFormat::Rfc3339, VersionFormat::Unix] {
            let _ = read_version(&doc, "/v", f);
        }
        let _ = read_id(&doc, "/v");
        let _ = read_state(&doc, "/v", 1 << 20);
    }
}

/// A signed delivery with a random or mutated body: signatures are valid, so the body
/// reaches parsing, mapping and the guarded write.
fn mutated_body(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<u8> {
    let template = json!({"id": format!("evt-{n}"), "type": "order.status_changed",
        "data": {"order_id": format!("o{}", n % 50), "version": n % 7, "status": "paid"}});
    let mut body = template.to_string().into_bytes();
    match rng.random_range(0..8) {
        0 => {
            // Flip some bytes.
            for _ in 0..rng.random_range(1..6) {
                let i = rng.random_range(0..body.len());
                body[i] = rng.random();
            }
        }
        1 => body.truncate(rng.random_range(0..body.len())),
        2 => {
            body = (0..rng.random_range(0..200))
                .map(|_| rng.random())
                .collect()
        }
        3 => {
            let weird = [
                json!(null),
                json!(-1),
                json!(1e300),
                json!("x".repeat(3000)),
                json!([]),
                json!({"a": {"b": [1, 2, {"c": "\u{0}"}]}}),
                json!(u64::MAX),
                json!("0001-01-01T00:00:00Z"),
            ];
            let mut v = template.clone();
            let field = ["id", "type"][rng.random_range(0..2)];
            v[field] = weird[rng.random_range(0..weird.len())].clone();
            body = v.to_string().into_bytes();
        }
        4 => {
            let mut v = template.clone();
            let weird = [
                "1e1000000",
                "-5",
                "\"v\"",
                "9223372036854775808",
                "1.5",
                "{}",
                "null",
            ];
            let s = v.to_string().replace(
                &format!("\"version\":{}", n % 7),
                &format!("\"version\":{}", weird[rng.random_range(0..weird.len())]),
            );
            v = serde_json::from_str(&s).unwrap_or(Value::Null);
            body = if v.is_null() {
                s.into_bytes()
            } else {
                v.to_string().into_bytes()
            };
        }
        5 => {
            let mut v = template.clone();
            v["data"]["order_id"] = json!("i".repeat(rng.random_range(1000..1100)));
            body = v.to_string().into_bytes();
        }
        6 => {
            let mut v = template.clone();
            v["type"] = json!(
                [
                    "shipment.updated",
                    "refund.succeeded",
                    "order.deleted",
                    "nope"
                ][rng.random_range(0..4)]
            );
            body = v.to_string().into_bytes();
        }
        _ => {}
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousands_of_random_and_mutated_deliveries_never_get_a_5xx_except_503_with_the_database_down()
 {
    let db = TestDb::new(Backend::Postgres);
    let proxy = Proxy::start(crate::helpers::db::pg_addr().await).await;
    let name = db.pg_name.clone().unwrap();
    let via_proxy = format!("postgres://postgres@{}/{name}", proxy.addr);
    let app = spawn_app_on(db, &via_proxy, "").await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20261201);
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    // 2,500 with the database up, 500 with it down (each of those waits
    // database.acquire_timeout before its 503).
    for (round, count) in [(0usize, 2500usize), (1, 500)] {
        if round == 1 {
            proxy.down();
        }
        let mut batch = Vec::new();
        for n in 0..count {
            let body = mutated_body(&mut rng, round * 10_000 + n);
            let ts = crate::helpers::now();
            let signed = rng.random_range(0..10) != 0;
            let sig = if signed {
                webhook_reconciler::signature::hmac_sha256(SHOP_SECRET.as_bytes(), ts, &body)
            } else {
                (0..rng.random_range(0..70))
                    .map(|_| rng.random_range(b' '..=b'~') as char)
                    .collect()
            };
            let req = app
                .client
                .post(app.url("/webhooks/shop"))
                .header("X-Signature", sig)
                .header("X-Signature-Timestamp", ts.to_string())
                .body(body);
            batch.push(tokio::spawn(async move {
                req.send().await.map(|r| r.status().as_u16())
            }));
            if batch.len() == 32 {
                for t in batch.drain(..) {
                    let s = t.await.unwrap().expect("the server answers");
                    *statuses.entry(s).or_default() += 1;
                    assert!(
                        s < 500 || (round == 1 && s == 503),
                        "round {round}: status {s}"
                    );
                }
            }
        }
        for t in batch.drain(..) {
            let s = t.await.unwrap().expect("the server answers");
            *statuses.entry(s).or_default() += 1;
            assert!(
                s < 500 || (round == 1 && s == 503),
                "round {round}: status {s}"
            );
        }
    }
    proxy.up();
    println!("statuses over 3,000 deliveries: {statuses:?}");
    assert!(statuses.get(&200).is_some_and(|n| *n > 100), "{statuses:?}");
    assert!(
        statuses.contains_key(&400) && statuses.contains_key(&401) && statuses.contains_key(&422),
        "{statuses:?}"
    );
    assert!(statuses.contains_key(&503), "{statuses:?}");
    // Still serving afterwards.
    let ok = crate::helpers::eventually(Duration::from_secs(10), || async {
        app.deliver(&crate::helpers::order_event(
            "evt-after",
            "o-after",
            1,
            "paid",
        ))
        .await
        .0 == 200
    })
    .await;
    assert!(ok);
}

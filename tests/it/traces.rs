//! Trace export: the real binary's `serve`, with the standard `OTEL_*` variables
//! pointing at a small OTLP/HTTP receiver in the test, exports the `delivery` span of a
//! signed delivery as protobuf, in the trace of the delivery's `traceparent`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::json;
use webhook_reconciler::signature as sign;

use crate::helpers::db::{Backend, TestDb};
use crate::helpers::eventually;
use crate::helpers::process::{bin, free_port, signal, write_migrated_config};
use crate::helpers::{SHOP_SECRET, config_toml, now};

/// An OTLP/HTTP receiver: keeps every `POST /v1/traces` body, answers 200 with an empty
/// `ExportTraceServiceResponse`.
async fn otlp_receiver() -> (String, Arc<Mutex<Vec<ExportTraceServiceRequest>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                keep.lock().unwrap().push(request);
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), got)
}

/// (trace id, parent span id, service name) of every span named `name` received.
fn spans_named(
    got: &Mutex<Vec<ExportTraceServiceRequest>>,
    name: &str,
) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for request in got.lock().unwrap().iter() {
        for rs in &request.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for span in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                if span.name == name {
                    found.push((
                        hex::encode(&span.trace_id),
                        hex::encode(&span.parent_span_id),
                        service.clone(),
                    ));
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_span_is_exported_over_otlp_in_the_trace_of_its_traceparent() {
    let (endpoint, got) = otlp_receiver().await;
    let db = TestDb::new(Backend::Sqlite);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let text = config_toml(&db.url, "").replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config = write_migrated_config(dir.path(), &text);
    let mut child = bin()
        .env("RUST_LOG", "warn")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let up = eventually(Duration::from_secs(15), || async {
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(up, "serve did not come up");

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let body = json!({"id": "evt_traced", "type": "order.status_changed",
        "data": {"order_id": "ord_traced", "version": 1, "status": "paid"}})
    .to_string()
    .into_bytes();
    let ts = now();
    let r = client
        .post(format!("{base}/webhooks/shop"))
        .header(
            "X-Signature",
            sign::hmac_sha256(SHOP_SECRET.as_bytes(), ts, &body),
        )
        .header("X-Signature-Timestamp", ts.to_string())
        .header("traceparent", format!("00-{trace_id}-{parent_id}-01"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(db.count("resources WHERE id = 'ord_traced'"), 1);

    let exported = eventually(Duration::from_secs(15), || async {
        !spans_named(&got, "delivery").is_empty()
    })
    .await;
    signal(child.id(), "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(exported, "no delivery span reached the OTLP receiver");
    let spans = spans_named(&got, "delivery");
    assert_eq!(spans.len(), 1, "{spans:?}");
    let (trace, parent, service) = &spans[0];
    assert_eq!(trace, trace_id, "the span continues the delivery's trace");
    assert_eq!(parent, parent_id, "its parent is the sender's span");
    assert!(
        service.contains("webhook-reconciler"),
        "service.name: {service}"
    );
    assert_eq!(status.code(), Some(0), "serve exits 0 on SIGTERM");
}

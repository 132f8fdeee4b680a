//! Logging and traces. Logs: human-readable on a terminal, JSON lines for journald and
//! log shippers. Traces: the same spans (`delivery`, `reconcile`, `push`) exported over
//! OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`)
//! is set, configured by the other `OTEL_*` variables the OpenTelemetry SDK reads
//! (`OTEL_SERVICE_NAME`, `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_BSP_*`, …); off otherwise.

use std::io::IsTerminal;
use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

use crate::config::{LogConfig, LogFormat};

const SERVICE: &str = "webhook-reconciler";

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// `level` with the scheduler crate held at `warn` unless `level` names it: at `info` it
/// logs its own setup (`Uninited`, `Job creator created`) a line per job at every start.
fn quiet_dependencies(level: &str) -> String {
    if level.contains("tokio_cron_scheduler") {
        level.to_string()
    } else {
        format!("{level},tokio_cron_scheduler=warn")
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides `log.level` (for logs; traces
/// carry this crate's spans at info whatever the log level). Safe to call more than
/// once (later calls do nothing).
pub fn init(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(quiet_dependencies(&log.level)))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match log.format {
        LogFormat::Json => true,
        LogFormat::Human => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if json {
        fmt.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let traces = otlp_tracer().map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(
                filter::Targets::new().with_target("webhook_reconciler", tracing::Level::INFO),
            )
    });
    let installed = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    if installed.is_ok() && PROVIDER.get().is_some() {
        tracing::info!("exporting traces over OTLP/HTTP");
    }
}

/// The OTLP/HTTP tracer, batched on the SDK's own thread, when the environment asks
/// for it (`config::otel`). A configuration the exporter refuses is reported and
/// tracing stays off: traces are not worth refusing to start over.
fn otlp_tracer() -> Option<opentelemetry_sdk::trace::Tracer> {
    let export = crate::config::otel::TraceExport::from_env();
    if !export.wanted {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("OTLP trace export is off: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !export.service_name_set {
        resource = resource.with_service_name(SERVICE);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer(SERVICE);
    let _ = PROVIDER.set(provider);
    Some(tracer)
}

/// Makes `span` continue the trace of an incoming W3C `traceparent` (and `tracestate`)
/// header, when trace export is on and the header is valid.
pub fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    if PROVIDER.get().is_none() || !headers.contains_key("traceparent") {
        return;
    }
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let parent = opentelemetry::global::get_text_map_propagator(|p| {
        p.extract(&opentelemetry_http::HeaderExtractor(headers))
    });
    let _ = span.set_parent(parent);
}

/// Exports the spans still batched; called once on the way out.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown()
    {
        eprintln!("OTLP trace export: the last spans were not sent: {e}");
    }
}

//! The standard OpenTelemetry variables that decide whether traces are exported. Read
//! here, like every other setting from the environment; the OTLP exporter itself then
//! reads the rest of its `OTEL_*` variables (endpoint, headers, timeout).

/// What the environment says about trace export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceExport {
    /// An OTLP endpoint is set, and neither `OTEL_SDK_DISABLED=true` nor
    /// `OTEL_TRACES_EXPORTER=none`.
    pub wanted: bool,
    /// `OTEL_SERVICE_NAME` is set (else we name the service ourselves).
    pub service_name_set: bool,
}

impl TraceExport {
    pub fn from_env() -> Self {
        let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
        let is =
            |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.trim().eq_ignore_ascii_case(v));
        TraceExport {
            wanted: (set("OTEL_EXPORTER_OTLP_ENDPOINT")
                || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
                && !is("OTEL_SDK_DISABLED", "true")
                && !is("OTEL_TRACES_EXPORTER", "none"),
            service_name_set: std::env::var("OTEL_SERVICE_NAME").is_ok(),
        }
    }
}

//! `prove`: checks its arguments (exit 2 naming the flag), says where it will send,
//! runs the cases and prints them like a test runner, or as JSON with `--json`.

use std::process::ExitCode;

use super::args::ProveArgs;
use super::{EXIT_CONFIG, EXIT_FAILED};
use crate::prove::probe::Probe;
use crate::prove::{self, Setup, Verdict};

pub async fn run(args: ProveArgs) -> ExitCode {
    let setup = match setup(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let probe = args
        .probe_db
        .as_deref()
        .map(crate::config::redact_database_url)
        .map(|db| format!("the database {db}"))
        .or_else(|| args.probe_url.clone())
        .unwrap_or_default();
    eprintln!(
        "prove: sending about 211 signed deliveries ({}) to {} and reading their effects from {probe}",
        setup.scheme_name, setup.url
    );
    let json = args.json;
    let results = prove::prove(&setup, &mut |r| {
        if !json {
            println!("{}", prove::line(r));
        }
    })
    .await;
    // Skipped cases are listed, not failed; a probe error is not a pass.
    let ok = results
        .iter()
        .all(|r| matches!(r.verdict, Verdict::Passed | Verdict::Skipped));
    if json {
        let doc = serde_json::json!({"url": setup.url, "scheme": setup.scheme_name, "ok": ok, "cases": results});
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        println!();
        println!("{}", prove::summary(&results));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

fn setup(args: &ProveArgs) -> Result<Setup, String> {
    let scheme = match prove::sign::scheme_named(&args.scheme) {
        Some(crate::config::Scheme::HmacSha256 { .. }) => crate::config::Scheme::HmacSha256 {
            signature_header: header_name("--signature-header", &args.signature_header)?,
            timestamp_header: header_name("--timestamp-header", &args.timestamp_header)?,
        },
        Some(other) => other,
        None => {
            return Err(format!(
                "--scheme {:?} is not a scheme; use one of: {}",
                args.scheme,
                prove::sign::SCHEMES.join(", ")
            ));
        }
    };
    if !(args.url.starts_with("http://") || args.url.starts_with("https://")) {
        return Err(format!(
            "--url {:?} must start with http:// or https://",
            args.url
        ));
    }
    let text = std::fs::read_to_string(&args.secret_file).map_err(|e| {
        format!(
            "--secret-file {}: cannot read it ({e}); write the receiver's webhook secret in it",
            args.secret_file.display()
        )
    })?;
    let secret =
        crate::config::WebhookSecret::new(&scheme, text.trim().to_string()).map_err(|e| {
            format!(
                "--secret-file {}: the secret {e}",
                args.secret_file.display()
            )
        })?;
    let template = match &args.template {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("--template {}: cannot read it ({e})", path.display()))?,
        None => prove::DEFAULT_TEMPLATE.to_string(),
    };
    prove::check_template(&template).map_err(|e| format!("--template: {e}"))?;
    let count = match (&args.probe_db, &args.probe_sql, &args.probe_url) {
        (Some(db), Some(sql), _) => {
            Probe::sql(db, sql, "event_id").map_err(|e| format!("--probe-sql: {e}"))?
        }
        (_, _, Some(url)) => {
            Probe::url(url, "event_id", "count").map_err(|e| format!("--probe-url: {e}"))?
        }
        _ => {
            return Err("name the count probe: --probe-db with --probe-sql, or --probe-url".into());
        }
    };
    let version = match (
        &args.probe_db,
        &args.probe_version_sql,
        &args.probe_version_url,
    ) {
        (Some(db), Some(sql), _) => Some(
            Probe::sql(db, sql, "resource_id").map_err(|e| format!("--probe-version-sql: {e}"))?,
        ),
        (_, _, Some(url)) => Some(
            Probe::url(url, "resource_id", "version")
                .map_err(|e| format!("--probe-version-url: {e}"))?,
        ),
        _ => None,
    };
    Ok(Setup {
        url: args.url.clone(),
        scheme,
        scheme_name: args.scheme.clone(),
        secret,
        template,
        count,
        version,
        timeout: args.timeout,
    })
}

fn header_name(flag: &str, name: &str) -> Result<String, String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(|_| name.to_string())
        .map_err(|_| format!("{flag} {name:?} is not an HTTP header name"))
}

//! Reads a receiver's effect back, the way its owner names it: an SQL query on their
//! PostgreSQL or SQLite database with `:event_id` / `:resource_id` (bound as a
//! parameter, never spliced), or an HTTP GET with `{event_id}` / `{resource_id}` in the
//! URL answering a number or `{"count": N}` / `{"version": N}`. This is the user's SQL
//! on the user's database, not ours: it is the one `sql_query` outside `db` and the
//! table owners (`tests/it/structure.rs` says so).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::{Connection, PgConnection, RunQueryDsl, SqliteConnection};

/// Why a probe gave no answer: not the receiver's failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ProbeError(pub String);

#[derive(Debug, Clone)]
pub enum Probe {
    Sql {
        url: String,
        /// The query with its `:name` turned into the backend's first placeholder.
        sql: String,
    },
    Url {
        template: String,
        field: &'static str,
    },
}

impl Probe {
    /// `param` is `event_id` or `resource_id`; `field` the JSON key of a URL's answer.
    pub fn sql(url: &str, sql: &str, param: &str) -> Result<Probe, String> {
        let sqlite = url.starts_with("sqlite://");
        if !sqlite && !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(format!(
                "the probe database must be a postgres://… or sqlite://… URL, not {:?}",
                crate::config::redact_database_url(url)
            ));
        }
        let name = format!(":{param}");
        let placeholder = if sqlite { "?1" } else { "$1" };
        // `::` is a cast, not a parameter.
        let mut out = String::with_capacity(sql.len());
        let mut rest = sql.trim().trim_end_matches(';');
        let mut found = false;
        while let Some(i) = rest.find(&name) {
            let before = &rest[..i];
            let after = &rest[i + name.len()..];
            let cast = before.ends_with(':');
            let longer = after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
            out.push_str(before);
            if cast || longer {
                out.push_str(&name);
            } else {
                out.push_str(placeholder);
                found = true;
            }
            rest = after;
        }
        out.push_str(rest);
        if !found {
            return Err(format!(
                "the probe query has no {name}: it must select the effect of one {}",
                param.replace('_', " ")
            ));
        }
        Ok(Probe::Sql {
            url: url.to_string(),
            sql: out,
        })
    }

    pub fn url(template: &str, param: &str, field: &'static str) -> Result<Probe, String> {
        if !(template.starts_with("http://") || template.starts_with("https://")) {
            return Err(format!(
                "the probe URL must start with http:// or https://, not {template:?}"
            ));
        }
        if !template.contains(&format!("{{{param}}}")) {
            return Err(format!(
                "the probe URL has no {{{param}}}: it must name the one it asks about"
            ));
        }
        Ok(Probe::Url {
            template: template.to_string(),
            field,
        })
    }

    /// The number the probe answers for `value` (NULL or no row: `None`).
    pub async fn read(
        &self,
        http: &reqwest::Client,
        param: &str,
        value: &str,
    ) -> Result<Option<i64>, ProbeError> {
        match self {
            Probe::Sql { url, sql } => {
                let (url, sql, value) = (url.clone(), sql.clone(), value.to_string());
                tokio::task::spawn_blocking(move || query(&url, &sql, &value))
                    .await
                    .map_err(|e| ProbeError(format!("probe task: {e}")))?
            }
            Probe::Url { template, field } => {
                // The values are prove's own ids (`prove_` and hex): nothing to encode.
                let url = template.replace(&format!("{{{param}}}"), value);
                let answer = http
                    .get(&url)
                    .send()
                    .await
                    .map_err(|e| ProbeError(format!("GET {url}: {}", cause_of(&e))))?;
                let status = answer.status();
                let (body, whole) = read_at_most(answer, MAX_ANSWER)
                    .await
                    .map_err(|e| ProbeError(format!("GET {url}: {}", cause_of(&e))))?;
                if !whole {
                    return Err(ProbeError(format!(
                        "GET {url} answered more than {MAX_ANSWER} bytes; a probe answers a number"
                    )));
                }
                let text = String::from_utf8_lossy(&body);
                if !status.is_success() {
                    return Err(ProbeError(format!("GET {url} answered {status}")));
                }
                number_in(&text, field).ok_or_else(|| {
                    ProbeError(format!(
                        "GET {url} answered {:?}: expected a number or {{\"{field}\": N}}",
                        text.chars().take(120).collect::<String>()
                    ))
                })
            }
        }
    }
}

/// The most of an answer `prove` reads: another party's server may send without end.
pub const MAX_ANSWER: usize = 64 * 1024;

/// The answer's body up to `limit` bytes, and whether that was all of it.
pub async fn read_at_most(
    mut answer: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

/// The error and its causes (the URL is said by the caller).
fn cause_of(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "no answer in time".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// `7`, `"7"`, `{"count": 7}`, `null` / `{"version": null}` (nothing yet).
fn number_in(text: &str, field: &str) -> Option<Option<i64>> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let n = match &v {
        serde_json::Value::Object(o) => o.get(field)?.clone(),
        other => other.clone(),
    };
    match n {
        serde_json::Value::Null => Some(None),
        serde_json::Value::Number(n) => n.as_i64().map(Some),
        serde_json::Value::String(s) => s.trim().parse().ok().map(Some),
        _ => None,
    }
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = Nullable<BigInt>)]
    n: Option<i64>,
}

fn query(url: &str, sql: &str, value: &str) -> Result<Option<i64>, ProbeError> {
    let shown = crate::config::redact_database_url(url);
    let fail = |e: &dyn std::fmt::Display| {
        ProbeError(crate::config::redact_secrets_in(
            &format!("the probe query on {shown} failed: {e}"),
            url,
        ))
    };
    // The first column of the first row, as a number.
    let wrapped = format!("SELECT CAST((SELECT * FROM ({sql}) AS probe LIMIT 1) AS BIGINT) AS n");
    let rows: Vec<N> = if let Some(path) = url.strip_prefix("sqlite://") {
        let mut c = SqliteConnection::establish(path).map_err(|e| fail(&e))?;
        c.batch_execute("PRAGMA busy_timeout = 10000")
            .map_err(|e| fail(&e))?;
        diesel::sql_query(&wrapped)
            .bind::<Text, _>(value)
            .load(&mut c)
            .map_err(|e| fail(&e))?
    } else {
        let mut c = PgConnection::establish(url).map_err(|e| fail(&e))?;
        c.batch_execute("SET statement_timeout = '10s'")
            .map_err(|e| fail(&e))?;
        diesel::sql_query(&wrapped)
            .bind::<Text, _>(value)
            .load(&mut c)
            .map_err(|e| fail(&e))?
    };
    Ok(rows.into_iter().next().and_then(|r| r.n))
}

/// How long a probe waits for effects still being applied (a receiver may answer
/// before it is done, or a first attempt may still be running).
pub const SETTLE: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_bound_and_casts_left_alone() {
        let p = Probe::sql(
            "postgres://h/db",
            "select count(*)::bigint from refunds where source_event = :event_id and note <> ':event_idx';",
            "event_id",
        )
        .unwrap();
        let Probe::Sql { sql, .. } = p else { panic!() };
        assert_eq!(
            sql,
            "select count(*)::bigint from refunds where source_event = $1 and note <> ':event_idx'"
        );
        assert!(Probe::sql("sqlite:///x.db", "select 1", "event_id").is_err());
        assert!(Probe::sql("mysql://h/db", "select :event_id", "event_id").is_err());
        assert!(Probe::url("http://h/c", "event_id", "count").is_err());
        assert_eq!(number_in("7", "count"), Some(Some(7)));
        assert_eq!(number_in(r#"{"count": 2}"#, "count"), Some(Some(2)));
        assert_eq!(number_in(r#"{"version": null}"#, "version"), Some(None));
        assert_eq!(number_in("<html>", "count"), None);
    }
}

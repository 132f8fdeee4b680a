//! Configuration: the raw file plus environment overrides, validated once at startup into
//! [`Config`]. Nothing else in the crate reads the environment or a secret file.
//!
//! Invariant: a `Config` that exists is valid — durations parsed, secrets resolved,
//! cross-field rules checked — so no later code re-checks or fails on configuration.

//!
//! | file | what |
//! | --- | --- |
//! | `raw` | the file's shape (serde), enums parsed by serde |
//! | `defaults` | every default, in one place |
//! | `validate` | raw -> [`Config`], every problem named by its dotted key |
//! | `types` | the validated configuration the crate reads |
//! | `secret` | secret references (`{ env }`, `{ file }`) and their redacted types |

mod accounts;
pub mod base_prefix;
pub mod defaults;
pub mod otel;
mod raw;
mod secret;
mod types;
mod validate;

use std::fmt;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};

pub use accounts::{AccountsConfig, GithubApp};
pub use raw::RawConfig;
pub use secret::{WebhookSecret, from_file_or_env as secret_from_file_or_env};
pub use types::*;
pub use validate::columns as validate_columns;
pub use validate::{parse_duration, redact_password as redact_database_url, redact_secrets_in};

/// Environment variable naming the configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "WEBHOOK_RECONCILER_CONFIG";
/// The configuration the package installs: read when no file is named, so the day-2
/// commands on a packaged host see the service's database.
pub const INSTALLED_CONFIG: &str = "/etc/webhook-reconciler/config.toml";
/// Prefix of the environment overrides: `WEBHOOK_RECONCILER__DATABASE__URL=...`.
pub const ENV_PREFIX: &str = "WEBHOOK_RECONCILER__";

/// Every problem found in a configuration, each naming its key. Shown to the operator as
/// one line per problem; the process exits 2.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

/// One configuration problem: the dotted key and what is wrong with it.
#[derive(Debug, Clone)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        writeln!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            writeln!(f, "  {}: {}", p.key, p.message)?;
        }
        Ok(())
    }
}

impl ConfigError {
    fn one(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            problems: vec![Problem {
                key: key.into(),
                message: message.into(),
            }],
        }
    }
}

impl Config {
    /// Loads the file (none: built-in defaults), applies the environment overrides and
    /// validates. The CLI resolves `--config` / `$WEBHOOK_RECONCILER_CONFIG` to `path`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with(path, false)
    }

    /// As [`Config::load`], for a command that uses no secret (`status`, `explain`, the
    /// lists): a secret that cannot be read now (no `$CREDENTIALS_DIRECTORY` in a
    /// shell) is left out instead of refused. The database's password is still read.
    pub fn load_without_secrets(path: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with(path, true)
    }

    fn load_with(path: Option<&Path>, secrets_unused: bool) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(EmptyDefaults {}));
        if let Some(path) = &path {
            if !path.is_file() {
                return Err(ConfigError::one(
                    "--config",
                    format!(
                        "{} does not exist or is not a file; pass an existing TOML file",
                        path.display()
                    ),
                ));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        Self::from_figment(figment, secrets_unused)
    }

    /// Validates a configuration given as TOML text (no environment overrides).
    pub fn from_toml_str(toml: &str) -> Result<Config, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(toml)), false)
    }

    fn from_figment(figment: Figment, secrets_unused: bool) -> Result<Config, ConfigError> {
        let raw: RawConfig = with_presets(figment)?.extract().map_err(figment_error)?;
        validate::validate(raw, secrets_unused)
    }

    /// The effective configuration as TOML: the file, its sources' presets and the
    /// environment overrides merged, secrets redacted (`config` prints it). Keys still
    /// absent take the defaults listed in docs/reference.md.
    pub fn effective_toml(path: Option<&Path>) -> Result<String, ConfigError> {
        let config = Self::load(path)?;
        let mut figment = Figment::from(Serialized::defaults(EmptyDefaults {}));
        if let Some(path) = path {
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(Env::prefixed(ENV_PREFIX).split("__"));
        let raw: RawConfig = with_presets(figment)?.extract().map_err(figment_error)?;
        let mut value = toml::Value::try_from(&raw)
            .map_err(|e| ConfigError::one("(file)", format!("cannot print it: {e}")))?;
        // The URL may carry a password.
        if let Some(db) = value.get_mut("database").and_then(|d| d.as_table_mut()) {
            if db.contains_key("url") {
                db.insert(
                    "url".into(),
                    toml::Value::String(config.database.redacted_url().to_string()),
                );
            }
        }
        // A many-account source's keys its preset fills in (how accounts are told apart,
        // where their bases may point), as they are in effect.
        for s in &config.sources {
            let (Some(a), Some(table)) = (
                &s.accounts,
                value
                    .get_mut("sources")
                    .and_then(|v| v.get_mut(&s.name))
                    .and_then(|v| v.get_mut("accounts"))
                    .and_then(|v| v.as_table_mut()),
            ) else {
                continue;
            };
            let text = |v: &str| toml::Value::String(v.to_string());
            for (key, v) in [
                ("from", &a.from),
                ("header", &a.header),
                ("api_base", &a.api_base),
            ] {
                if let Some(v) = v {
                    table.entry(key).or_insert_with(|| text(v));
                }
            }
            table
                .entry("concurrency")
                .or_insert_with(|| toml::Value::Integer(a.concurrency as i64));
            table.entry("api_bases").or_insert_with(|| {
                toml::Value::Array(a.api_bases.iter().map(|p| text(&p.to_string())).collect())
            });
        }
        toml::to_string_pretty(&value)
            .map_err(|e| ConfigError::one("(file)", format!("cannot print it: {e}")))
    }

    pub fn source(&self, name: &str) -> Option<&SourceConfig> {
        self.sources.iter().find(|s| s.name == name)
    }
}

#[derive(serde::Serialize)]
struct EmptyDefaults {}

/// `figment` with, under each source that names a preset, the preset's keys: merged
/// first, so every key written in the file or the environment wins, table by table.
fn with_presets(figment: Figment) -> Result<Figment, ConfigError> {
    #[derive(serde::Deserialize, Default)]
    struct Sources {
        #[serde(default)]
        sources: std::collections::BTreeMap<String, OnlyPreset>,
    }
    #[derive(serde::Deserialize)]
    struct OnlyPreset {
        preset: Option<Preset>,
        #[serde(default)]
        reconcile: Schedules,
        #[serde(default)]
        catchup: Schedules,
    }
    /// Which way a schedule is written: the preset's other way is dropped, since
    /// `every` and `cron` exclude each other.
    #[derive(serde::Deserialize, Default)]
    struct Schedules {
        every: Option<toml::Value>,
        cron: Option<toml::Value>,
    }
    let found: Sources = figment.extract().map_err(figment_error)?;
    let mut base = Figment::new();
    for (name, source) in found.sources {
        let Some(preset) = source.preset else {
            continue;
        };
        let mut table: toml::Table = toml::from_str(preset.toml()).map_err(|e| {
            ConfigError::one(
                format!("sources.{name}.preset"),
                format!("built-in preset does not parse: {e}"),
            )
        })?;
        for (section, written) in [
            ("reconcile", &source.reconcile),
            ("catchup", &source.catchup),
        ] {
            let other = match (&written.every, &written.cron) {
                (Some(_), None) => "cron",
                (None, Some(_)) => "every",
                _ => continue,
            };
            if let Some(t) = table.get_mut(section).and_then(|t| t.as_table_mut()) {
                t.remove(other);
            }
        }
        let nested = toml::Table::from_iter([(
            "sources".to_string(),
            toml::Value::Table(toml::Table::from_iter([(name, toml::Value::Table(table))])),
        )]);
        base = base.merge(Serialized::defaults(nested));
    }
    Ok(base.merge(figment))
}

fn figment_error(err: figment::Error) -> ConfigError {
    let problems = err
        .into_iter()
        .map(|e| {
            let key = if e.path.is_empty() {
                "(file)".to_string()
            } else {
                e.path.join(".")
            };
            let mut message = match &e.kind {
                figment::error::Kind::UnknownField(field, expected) => format!(
                    "unknown key `{field}`; expected one of: {}",
                    expected.join(", ")
                ),
                figment::error::Kind::UnknownVariant(found, expected) => format!(
                    "{found:?} is not accepted here; use one of: {}",
                    expected.join(", ")
                ),
                kind => kind.to_string(),
            };
            if let Some(source) = e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                message.push_str(&format!(" (from {source})"));
            }
            Problem { key, message }
        })
        .collect();
    ConfigError { problems }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_more;

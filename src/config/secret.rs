//! Secret references (`{ env = ".." }`, `{ file = ".." }`) resolved once at startup.
//!
//! Invariant: a secret's value is never formatted into a message, a log line or `Debug`
//! output; errors name the reference (the variable or the path), never the value.

use base64::Engine;
use secrecy::{ExposeSecret, SecretSlice};

use super::Scheme;
use super::raw::RawSecret;

/// Reads the secret a reference points to. Trailing newlines of files are dropped
/// (`echo secret > file` is how most people write them).
pub(super) fn resolve(r: &RawSecret) -> Result<String, String> {
    match r {
        RawSecret::Env { env } => match std::env::var(env) {
            Ok(v) if !v.is_empty() => Ok(v),
            Ok(_) => Err(format!(
                "environment variable {env} is empty; set it to the secret"
            )),
            Err(_) => Err(format!(
                "environment variable {env} is not set; export it or use {{ file = \"...\" }}"
            )),
        },
        RawSecret::File { file } => {
            let path = expand_credentials_dir(file)?;
            match std::fs::read_to_string(&path) {
                Ok(v) => {
                    let v = v.trim_end_matches(['\n', '\r']).to_string();
                    if v.is_empty() {
                        Err(format!("file {path} is empty; write the secret into it"))
                    } else {
                        Ok(v)
                    }
                }
                Err(e) => Err(format!(
                    "cannot read file {path} ({e}); check the path and its permissions"
                )),
            }
        }
        RawSecret::Literal(v) if v.is_empty() => Err("the secret is empty".into()),
        RawSecret::Literal(v) => Ok(v.clone()),
    }
}

/// A secret named on the command line (`--token-file F` or `--token-env VAR`), read as
/// a reference in the configuration is.
pub fn from_file_or_env(
    file: Option<&str>,
    env: Option<&str>,
) -> Result<Option<secrecy::SecretString>, String> {
    let r = match (file, env) {
        (Some(f), _) => RawSecret::File { file: f.into() },
        (None, Some(e)) => RawSecret::Env { env: e.into() },
        (None, None) => return Ok(None),
    };
    resolve(&r).map(|v| Some(secrecy::SecretString::from(v)))
}

/// systemd's `LoadCredential=` puts secrets under `$CREDENTIALS_DIRECTORY`; a unit file
/// cannot know that path in advance, so the configuration may name it.
fn expand_credentials_dir(path: &str) -> Result<String, String> {
    const VAR: &str = "CREDENTIALS_DIRECTORY";
    for pattern in ["${CREDENTIALS_DIRECTORY}", "$CREDENTIALS_DIRECTORY"] {
        if path.contains(pattern) {
            let dir = std::env::var(VAR).map_err(|_| {
                format!(
                    "{path:?} uses ${VAR}, which is not set: systemd sets it for the unit (LoadCredential=); from a shell, name the directory the unit loads the files from, e.g. {VAR}=/etc/webhook-reconciler/credentials"
                )
            })?;
            return Ok(path.replace(pattern, &dir));
        }
    }
    Ok(path.to_string())
}

/// A webhook signing key, as the bytes the scheme's HMAC uses.
#[derive(Clone)]
pub struct WebhookSecret(SecretSlice<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl WebhookSecret {
    /// Standard Webhooks secrets are base64 behind an optional `whsec_` prefix; the
    /// other schemes use the secret's bytes as they are (Stripe keeps its `whsec_`).
    pub fn new(scheme: &Scheme, value: String) -> Result<Self, String> {
        let bytes = match scheme {
            Scheme::StandardWebhooks => {
                let b64 = value.strip_prefix("whsec_").unwrap_or(&value);
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|_| {
                        "is not a Standard Webhooks secret (expected whsec_ followed by base64)"
                            .to_string()
                    })?
            }
            _ => value.into_bytes(),
        };
        if bytes.is_empty() {
            return Err(
                "decodes to an empty key, with which anyone could sign deliveries; use the secret the sender shows"
                    .into(),
            );
        }
        Ok(Self(SecretSlice::from(bytes)))
    }

    /// A secret from raw bytes (tests and the demo build their own).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(SecretSlice::from(bytes))
    }

    pub fn expose(&self) -> &[u8] {
        self.0.expose_secret()
    }
}

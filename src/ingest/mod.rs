//! The one ingest step below every authentic event, whatever brought it: a verified
//! webhook delivery (`webhook::Receiver`), an event listed by the sender's events API
//! (`reconcile`'s catch-up), or a dead letter retried by an operator
//! (`operations`). It owns the envelope (`envelope`) all three arrive as.
//!
//! mapping -> claim -> guarded write, or a dead letter: the event type picks the kind
//! and pointers, `store` claims the id and applies the change in one transaction, and
//! an event that cannot be read, or whose data the database refuses, is kept in
//! `dead_letters` with the reason. Nothing here verifies a signature: the caller
//! vouches that the event is authentic.

pub mod envelope;
mod lifecycle;

pub use lifecycle::DATA_REQUEST_KIND;

use std::collections::HashMap;

use crate::accounts::Accounts;
use crate::change::ResourceKey;
use crate::config::{Scheme, SourceConfig};
use crate::db::{DbError, ErrorClass};
use crate::store::{Delivery, Kept, NewDeadLetter, Outcome, Store};
use envelope::{Envelope, KindMapping};

/// The account a signed body names at the source's `accounts.from` pointer: none
/// (absent or null: the sender's own account), a string id, or a non-negative integer
/// as its decimal text (GitHub sends `"installation": {"id": 4711}`); else why not.
fn account_named(value: Option<&serde_json::Value>) -> Result<Option<String>, &'static str> {
    use serde_json::Value;
    let text = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(a)) => a.clone(),
        Some(Value::Number(n)) if n.as_u64().is_some() => n.to_string(),
        Some(_) => return Err("is neither a string id nor a non-negative integer"),
    };
    crate::change::limits::check_id(&text)
        .map_err(|_| "is not a valid id (empty, over 1,024 bytes or with NUL)")?;
    Ok(Some(text))
}

/// The repository `OWNER/REPO` a GitHub base URL lists (`.../repos/OWNER/REPO`), in
/// lower case (GitHub's names are case-insensitive); `None` for a base naming none.
fn repository_of_base(base: &str) -> Option<String> {
    let (_, rest) = base.split_once("/repos/")?;
    let mut parts = rest.trim_end_matches('/').split('/');
    let (owner, repo) = (parts.next()?, parts.next()?);
    (!owner.is_empty() && !repo.is_empty() && parts.next().is_none())
        .then(|| format!("{owner}/{repo}").to_ascii_lowercase())
}

/// Longest reason kept with a dead letter.
const MAX_REASON_BYTES: usize = 500;

/// Why an authentic event was not applied.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The mapped pointers cannot be read, or the database refused the event's data:
    /// kept in `dead_letters` (a retry of the same bytes cannot succeed).
    #[error("event {event_id} ({event_type}): {reason}; kept in dead_letters")]
    Unprocessable {
        event_id: String,
        event_type: String,
        reason: String,
    },
    /// The database cannot take it now; the same event succeeds later.
    #[error(transparent)]
    Unavailable(#[from] DbError),
    /// It would be kept, but the source's dead letters hold `dead_letters.max_bytes`:
    /// answered 503, so the sender keeps it until an operator makes room.
    #[error(
        "the dead letters of source {source_name} hold dead_letters.max_bytes ({max_bytes} bytes); fix their cause and retry or discard them (`webhook-reconciler dead-letters list`), or raise the limit"
    )]
    DeadLettersFull { source_name: String, max_bytes: u64 },
}

/// What became of an applied event: its outcome, and the resource it maps to (none
/// for an unmapped type).
pub type Ingested = (Outcome, Option<ResourceKey>);

/// The ingest step of one configured source. Cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    source: String,
    scheme: Scheme,
    /// Event type -> kind and pointers.
    mappings: HashMap<String, KindMapping>,
    store: Store,
    /// `dead_letters.max_bytes`.
    dead_letters_max_bytes: u64,
    /// A many-account source: where the signed body names the account (`None`: only an
    /// unsigned header does, Shopify's shop), and the registry that says whether it is
    /// served.
    accounts: Option<(Option<String>, Accounts)>,
    /// `accounts.lifecycle`: the platform's lifecycle webhooks drive the registry.
    lifecycle: bool,
    /// The source's kinds by name (what a customer's redaction erases).
    kinds: Vec<String>,
    /// The kinds reconciled per account (due now when a platform installs one).
    reconciled: Vec<String>,
    /// The source's own API base (a GitHub source's repository, when no account has
    /// one of its own).
    api_base: Option<String>,
    preset: Option<crate::config::Preset>,
}

impl Ingest {
    pub fn new(source: &SourceConfig, store: Store) -> Self {
        let mut mappings = HashMap::new();
        for kind in &source.kinds {
            for (event_type, mapping) in &kind.events {
                mappings.insert(
                    event_type.clone(),
                    KindMapping {
                        kind: kind.name.clone(),
                        mapping: mapping.clone(),
                        version_format: kind.version_format,
                        max_state_bytes: kind.max_state_bytes,
                        max_version_ahead: kind.max_version_ahead,
                        max_version: kind.max_version,
                        match_prefixes: kind.match_prefixes.clone(),
                        has_get: kind.get.is_some(),
                    },
                );
            }
        }
        let accounts = source
            .accounts
            .as_ref()
            .map(|a| (a.from.clone(), Accounts::new(store.db().clone())));
        Self {
            source: source.name.clone(),
            scheme: source.webhook.scheme.clone(),
            mappings,
            store,
            dead_letters_max_bytes: source.dead_letters_max_bytes,
            accounts,
            lifecycle: source.accounts.as_ref().is_some_and(|a| a.lifecycle),
            kinds: source.kinds.iter().map(|k| k.name.clone()).collect(),
            reconciled: source.reconciled_kinds().map(|k| k.name.clone()).collect(),
            api_base: source.api_base.clone(),
            preset: source.preset,
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Applies one authentic delivery (a webhook, or a dead letter retried): as
    /// [`Self::event`], and for senders that sign the body but not the delivery id
    /// header (GitHub, Shopify) the claim covers the body's SHA-256 too, so a captured
    /// body replayed under fresh ids is a duplicate.
    pub async fn delivery(&self, env: Envelope, body: &[u8]) -> Result<Ingested, Refusal> {
        let digest = matches!(self.scheme, Scheme::Github | Scheme::Shopify).then(|| {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(body))
        });
        self.event(env, body, digest).await
    }

    /// Runs a dead letter through the same step as a delivery (mapping, claim, guarded
    /// write, change feed), without a second signature check: it was verified when it
    /// arrived. One that fails again is kept with the new reason.
    pub async fn replay(&self, dead: &crate::store::DeadLetter) -> Result<Outcome, Refusal> {
        let doc: serde_json::Value = match serde_json::from_str(&dead.body) {
            Ok(doc) => doc,
            Err(e) => {
                return Err(Refusal::Unprocessable {
                    event_id: dead.event_id.clone(),
                    event_type: dead.event_type.clone(),
                    reason: format!("the kept body is not JSON: {e}"),
                });
            }
        };
        let env = Envelope {
            id: dead.event_id.clone(),
            event_type: dead.event_type.clone(),
            doc,
            account_hint: dead.account_hint.clone(),
        };
        Ok(self.delivery(env, dead.body.as_bytes()).await?.0)
    }

    /// Applies one authentic event: mapping, claim, guarded write (and what it leaves
    /// to fetch, in the claim's transaction); an event that cannot be read or stored is
    /// kept as a dead letter. `body` is what is kept; `body_digest`, when the sender
    /// signs only the body, is claimed with the id. A listed event (catch-up) has none.
    pub async fn event(
        &self,
        env: Envelope,
        body: &[u8],
        body_digest: Option<String>,
    ) -> Result<Ingested, Refusal> {
        if self.scheme == Scheme::Shopify && self.accounts.is_some() {
            if let Some(topic) = lifecycle::Topic::of(&env.event_type) {
                return self.shopify_topic(topic, env, body_digest).await;
            }
        }
        if self.lifecycle {
            let action = env.doc.get("action").and_then(|a| a.as_str());
            if let Some(change) = lifecycle::platform_event(&self.scheme, &env.event_type, action) {
                return self
                    .platform_lifecycle(change, env, body, body_digest)
                    .await;
            }
        }
        let mapping = self.mapping(&env);
        let settle_conflict = mapping.is_some_and(|m| m.has_get);
        let mut change = match mapping {
            None => None,
            Some(m) => match m.change(&self.source, &env, chrono::Utc::now().timestamp_micros()) {
                Ok(c) => Some(c),
                Err(e) => {
                    return Err(self
                        .dead_letter(env, e.to_string(), body, body_digest.as_deref())
                        .await);
                }
            },
        };
        let mut fetch = None;
        if let (Some(c), Some((None, registry))) = (change.as_ref(), &self.accounts) {
            // Only an unsigned header names the account: anyone holding one signed body
            // could send it under another account's name. Nothing is written from the
            // body; the resource is fetched from the named account's own API, so a
            // forged name can only bring that account its own state.
            let named = env
                .account_hint
                .as_deref()
                .filter(|a| crate::change::limits::check_id(a).is_ok());
            if let Some(a) = named {
                if registry.is_enabled(&self.source, a).await? {
                    let mut key = c.key().to_owned();
                    key.account = a.to_string();
                    fetch = Some(key);
                }
            }
            change = None;
        }
        if let (Some(c), Some((Some(from), registry))) = (change.as_mut(), &self.accounts) {
            // The account the signed body names. A body that names none is the sender's
            // own account (`""`); one that names an account not registered or disabled
            // is `ignored` (claimed, nothing written): its first sync brings its state.
            match account_named(env.doc.pointer(from)) {
                Ok(None) => {}
                Ok(Some(a)) => {
                    if self.serves(registry, &a, &env).await? {
                        c.account = a;
                    } else {
                        change = None;
                    }
                }
                Err(why) => {
                    let reason = format!("the account at {from:?} {why}");
                    return Err(self
                        .dead_letter(env, reason, body, body_digest.as_deref())
                        .await);
                }
            }
        }
        let key = change.as_ref().map(|c| c.key().to_owned());
        let applied = self
            .store
            .apply_event(Delivery {
                source: self.source.clone(),
                event_id: env.id.clone(),
                event_type: env.event_type.clone(),
                change,
                fetch: fetch.clone(),
                settle_conflict,
                body_digest: body_digest.clone(),
            })
            .await;
        match applied {
            Ok(Outcome::Fetching) => {
                self.store.fetches_requested();
                Ok((Outcome::Fetching, fetch))
            }
            Ok(Outcome::Conflict) => {
                if settle_conflict {
                    self.store.fetches_requested();
                }
                Ok((Outcome::Conflict, key))
            }
            Ok(outcome) => Ok((outcome, key)),
            Err(e) => Err(self
                .database_refused(e, env, body, body_digest.as_deref())
                .await),
        }
    }

    /// Whether a delivery for `account` is applied: the account is registered and
    /// enabled, and, for a GitHub App installation listed through one repository's base
    /// (`https://api.github.com/repos/OWNER/REPO`), the signed body's
    /// `repository.full_name` is that repository. An installation covering several
    /// repositories sends deliveries for each; keyed by number alone, another
    /// repository's #7 would overwrite this one's, so it is `ignored` (logged).
    async fn serves(
        &self,
        registry: &Accounts,
        account: &str,
        env: &Envelope,
    ) -> Result<bool, Refusal> {
        let Some((enabled, own_base)) = registry.enabled_base(&self.source, account).await? else {
            return Ok(false);
        };
        if !enabled {
            return Ok(false);
        }
        if self.scheme != Scheme::Github {
            return Ok(true);
        }
        let Some(listed) = own_base
            .as_deref()
            .or(self.api_base.as_deref())
            .and_then(repository_of_base)
        else {
            return Ok(true);
        };
        match env
            .doc
            .pointer("/repository/full_name")
            .and_then(|r| r.as_str())
        {
            Some(named) if !named.eq_ignore_ascii_case(&listed) => {
                tracing::warn!(
                    source = self.source,
                    account,
                    event_id = env.id,
                    repository = named,
                    listed,
                    "a delivery for a repository this installation's base does not list was ignored (one repository per installation: give another repository an installation of its own)"
                );
                Ok(false)
            }
            _ => Ok(true),
        }
    }

    /// The mapping of an event: GitHub names the change in the body's `action`
    /// (`issues` + `"action": "deleted"`), so `issues.deleted` is looked up before
    /// `issues`.
    fn mapping(&self, env: &Envelope) -> Option<&KindMapping> {
        if self.scheme == Scheme::Github {
            if let Some(action) = env.doc.get("action").and_then(|a| a.as_str()) {
                let specific = format!("{}.{action}", env.event_type);
                if let Some(m) = self.mappings.get(&specific) {
                    return Some(m);
                }
            }
        }
        self.mappings.get(&env.event_type)
    }

    /// What to answer when the guarded write failed: "not now" is `Unavailable` (the
    /// sender's retry succeeds later); an error caused by this event's data is a dead
    /// letter (a 503 would make the sender retry it for its whole retry window); an
    /// unknown error is `Unavailable` too, so nothing is lost, and logged as an error.
    async fn database_refused(
        &self,
        e: DbError,
        env: Envelope,
        body: &[u8],
        digest: Option<&str>,
    ) -> Refusal {
        match e.class() {
            ErrorClass::Unavailable => Refusal::Unavailable(e),
            ErrorClass::Unknown => {
                tracing::error!(source = self.source, event_id = env.id, error = %e, "unclassified database error; answered 503 so that nothing is lost. Please report it");
                Refusal::Unavailable(e)
            }
            ErrorClass::Data => {
                let mut reason = format!("the database refused this delivery's data: {e}");
                if reason.len() > MAX_REASON_BYTES {
                    let cut = (0..=MAX_REASON_BYTES)
                        .rev()
                        .find(|i| reason.is_char_boundary(*i))
                        .unwrap_or(0);
                    reason.truncate(cut);
                    reason.push_str("...");
                }
                self.dead_letter(env, reason, body, digest).await
            }
        }
    }

    /// Keeps an authentic event that cannot be applied, with the reason: once per event
    /// id, or per body for a sender that signs only the body (`digest`); a kept body is
    /// never replaced. `Unavailable` if even the dead letter cannot be written, `Full`
    /// when the source's dead letters hold `dead_letters.max_bytes`.
    async fn dead_letter(
        &self,
        env: Envelope,
        reason: String,
        body: &[u8],
        digest: Option<&str>,
    ) -> Refusal {
        let kept = self
            .store
            .dead_letter(
                NewDeadLetter {
                    source: self.source.clone(),
                    event_id: env.id.clone(),
                    event_type: env.event_type.clone(),
                    reason: reason.clone(),
                    body: String::from_utf8_lossy(body).into_owned(),
                    account_hint: env.account_hint.clone(),
                    digest: digest.map(String::from),
                },
                self.dead_letters_max_bytes,
            )
            .await;
        match kept {
            Ok(Kept::New | Kept::Again) => Refusal::Unprocessable {
                event_id: env.id,
                event_type: env.event_type,
                reason,
            },
            Ok(Kept::Full) => Refusal::DeadLettersFull {
                source_name: self.source.clone(),
                max_bytes: self.dead_letters_max_bytes,
            },
            Err(e) => Refusal::Unavailable(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::repository_of_base;

    #[test]
    fn a_github_base_names_the_repository_it_lists() {
        assert_eq!(
            repository_of_base("https://api.github.com/repos/Acme/Shop").as_deref(),
            Some("acme/shop")
        );
        assert_eq!(
            repository_of_base("http://127.0.0.1:9/repos/acme/shop/").as_deref(),
            Some("acme/shop")
        );
        assert_eq!(repository_of_base("https://api.github.com"), None);
        assert_eq!(
            repository_of_base("https://api.github.com/repos/acme"),
            None
        );
        assert_eq!(repository_of_base("https://x/repos/acme/shop/issues"), None);
    }
}

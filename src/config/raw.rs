//! The configuration as written: TOML file, then `WEBHOOK_RECONCILER__SECTION__KEY`
//! environment overrides. Nothing here is checked beyond its shape; `super::validate`
//! turns it into a [`super::Config`].
//!
//! Every struct denies unknown fields, so a misspelt key is an error that names it
//! instead of a setting silently ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::types::{
    Action, ConsumerStart, LogFormat, OnFailure, Pagination, Preset, SchemeName, Synchronous,
    VersionFormat, VersionFrom,
};

/// The file format, section by section. A key left out is `None` here; its default is
/// in `super::defaults`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub database: RawDatabase,
    pub http: RawHttp,
    pub retention: RawRetention,
    pub log: RawLog,
    pub sources: BTreeMap<String, RawSource>,
    pub consumers: BTreeMap<String, RawConsumer>,
    pub accounts: RawAccounts,
    pub dead_letters: RawDeadLetters,
}

/// `[dead_letters]`: the deliveries kept because they could not be applied.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDeadLetters {
    /// The most body bytes kept per source (default 256MiB); past it a delivery that
    /// would be kept is answered 503.
    pub max_bytes: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDatabase {
    pub url: Option<String>,
    /// PostgreSQL's password as a secret reference, completing `url` (which then
    /// carries none): the configuration file can stay readable by all.
    pub password: Option<RawSecret>,
    pub max_connections: Option<u32>,
    pub migrate: Option<bool>,
    /// How long a request waits for a database connection before answering 503.
    pub acquire_timeout: Option<String>,
    /// How long SQLite waits for another writer's lock before giving up.
    pub busy_timeout: Option<String>,
    /// SQLite's `synchronous` pragma: `full` (default) or `normal`.
    pub synchronous: Option<Synchronous>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawHttp {
    pub listen: Option<String>,
    pub max_body: Option<String>,
    pub max_in_flight: Option<u32>,
    /// The bytes of all request bodies being received at once (default 256MiB).
    pub max_body_bytes_in_flight: Option<String>,
    pub max_connections: Option<u32>,
    pub max_connections_per_ip: Option<u32>,
    pub header_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub http2: Option<bool>,
    /// Where `/readyz`, `/metrics`, `/changes` and `/admin/*` are served instead of the
    /// public listener: `127.0.0.1:9091` or `unix:/run/webhook-reconciler/admin.sock`.
    pub admin_listen: Option<String>,
    /// Bearer token of `/admin/*`; without it those routes answer 404.
    pub admin_token: Option<RawSecret>,
    /// Bearer token of `GET /changes`; without it the endpoint does not exist (404).
    pub changes_token: Option<RawSecret>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetention {
    pub every: Option<String>,
    /// Rows deleted per statement (each batch is its own short transaction).
    pub batch: Option<u32>,
    /// Finished reconcile runs are kept this long.
    pub reconcile_runs: Option<String>,
    /// Dead letters are kept this long after their last delivery.
    pub dead_letters: Option<String>,
    /// Changes every consumer acknowledged are kept this long.
    pub changes: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    /// `auto` (human on a terminal, JSON otherwise), `human` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `webhook_reconciler=debug`; `RUST_LOG` wins.
    pub level: Option<String>,
}

/// Where a secret comes from. A literal string is accepted (handy in an environment
/// override), but `env` and `file` keep the secret out of the configuration file.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSecret {
    Env { env: String },
    File { file: String },
    Literal(String),
}

/// Printed by `config`: references as written, a literal secret never.
impl Serialize for RawSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            Self::Env { env } => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("env", env)?;
                m.end()
            }
            Self::File { file } => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("file", file)?;
                m.end()
            }
            Self::Literal(_) => s.serialize_str("[redacted]"),
        }
    }
}

impl std::fmt::Debug for RawSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env { env } => write!(f, "{{ env = {env:?} }}"),
            Self::File { file } => write!(f, "{{ file = {file:?} }}"),
            Self::Literal(_) => f.write_str("[redacted]"),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    /// `stripe`, `github` or `shopify`: the sender's keys from `presets/*.toml`, under
    /// the ones written here.
    pub preset: Option<Preset>,
    pub retry_window: Option<String>,
    pub retention: Option<String>,
    /// Timestamp versions later than now + this are refused.
    pub max_version_ahead: Option<String>,
    pub requests_per_second: Option<f64>,
    pub api_base: Option<String>,
    pub api_token: Option<RawSecret>,
    /// The header carrying `api_token`: `Authorization` (default, as `Bearer TOKEN`) or
    /// another name, which carries the token as it is (`X-Shopify-Access-Token`).
    pub api_token_header: Option<String>,
    #[serde(default)]
    pub insecure_no_signature: bool,
    #[serde(default)]
    pub webhook: RawWebhook,
    #[serde(default)]
    pub reconcile: RawReconcile,
    /// A kind may also be written `false`: switched off (a preset's kind the account
    /// cannot list), as `enabled = false` does.
    #[serde(default, deserialize_with = "kinds_or_off")]
    pub kinds: BTreeMap<String, RawKind>,
    pub catchup: Option<RawCatchup>,
    /// `[sources.NAME.accounts]`: the source serves many accounts.
    pub accounts: Option<RawSourceAccounts>,
}

/// `[sources.NAME.accounts]`: where a delivery's signed body names its account.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSourceAccounts {
    /// JSON pointer into the signed body (Stripe Connect: `/account`). A preset fills
    /// it; Shopify signs no account (the shop is only in a header).
    pub from: Option<String>,
    /// The header naming the account on every API request (Stripe: `Stripe-Account`).
    pub header: Option<String>,
    /// A base URL per account, `{account}` replaced by its id (Shopify:
    /// `https://{account}/admin/api/2025-01`); an account's own `api_base` wins.
    pub api_base: Option<String>,
    /// A GitHub App: its id and private key (a secret reference to the PEM); each
    /// installation's token is minted from them.
    pub app_id: Option<String>,
    pub app_key: Option<RawSecret>,
    /// How many account-kinds one process reconciles at once (default 4).
    pub concurrency: Option<u32>,
    /// Where an account's own `api_base` may point: prefixes, `*` one host label or the
    /// port (default: the preset's sender and the source's own `api_base`).
    pub api_bases: Option<Vec<String>>,
    /// Whether the platform's lifecycle webhooks drive the registry (installed,
    /// uninstalled, suspended; default: true for a preset, false otherwise).
    pub lifecycle: Option<bool>,
}

/// `[accounts]`: settings of every many-account source.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAccounts {
    /// The key account credentials are sealed with: a secret reference to 32 random
    /// bytes in base64.
    pub key: Option<RawSecret>,
    /// The key before `key` while `accounts rekey` re-seals every credential: what it
    /// sealed still opens.
    pub previous_key: Option<RawSecret>,
}

/// `[sources.NAME.catchup]`: the sender's events API.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCatchup {
    /// `false` turns the catch-up off (a preset's, Stripe's, included).
    #[serde(default)]
    pub enabled: Option<bool>,
    pub list: String,
    pub pagination: Option<Pagination>,
    pub items: Option<String>,
    pub next_cursor: Option<String>,
    pub cursor_param: Option<String>,
    pub limit_param: Option<String>,
    pub has_more: Option<String>,
    pub starting_after_param: Option<String>,
    /// The query parameter that lists events created at or after a time.
    pub since_param: String,
    /// Pointer to an event's creation time (default `/created`).
    pub field: Option<String>,
    /// `unix` (default) or `rfc3339`.
    pub format: Option<VersionFormat>,
    /// How far before the watermark each run starts again (default 5m).
    pub overlap: Option<String>,
    /// How long the sender keeps events (default 30d): the first run, and a run after a
    /// long stop, start this far back, never further.
    pub window: Option<String>,
    pub every: Option<String>,
    pub cron: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWebhook {
    pub path: Option<String>,
    pub scheme: Option<SchemeName>,
    pub secrets: Vec<RawSecret>,
    pub tolerance: Option<String>,
    /// hmac-sha256 only: the header carrying the hex signature (default `X-Signature`).
    pub signature_header: Option<String>,
    /// hmac-sha256 only: the header carrying the unix timestamp (default
    /// `X-Signature-Timestamp`).
    pub timestamp_header: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawReconcile {
    pub every: Option<String>,
    pub cron: Option<String>,
    pub page_size: Option<u32>,
    pub timeout: Option<String>,
    /// Attempts per request to the sender before the run fails (default 5).
    pub max_attempts: Option<u32>,
    /// Longest `Retry-After` honoured; a sender asking for more fails the run (default 60s).
    pub max_retry_wait: Option<String>,
    /// Random delay before each scheduled run, so replicas and sources spread out.
    pub jitter: Option<String>,
    /// Run once as soon as `serve` starts (default true).
    pub run_at_start: Option<bool>,
    /// `/readyz` reports a kind overdue past this age of its last successful run
    /// (default 3 × the interval).
    pub stale_after: Option<String>,
    /// How long a reconciling process holds a kind without renewing (default 2m): after
    /// a crash, the next run can start once this has passed.
    pub lease_ttl: Option<String>,
    /// Largest response body read from the sender (default 32MiB); larger ones fail the
    /// run without being read whole.
    pub max_page_bytes: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawKind {
    /// `false` switches the kind off: no listing, its event types ignored (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    pub list: Option<String>,
    pub pagination: Option<Pagination>,
    pub items: Option<String>,
    pub next_cursor: Option<String>,
    pub cursor_param: Option<String>,
    pub limit_param: Option<String>,
    /// stripe pagination: pointer to the "more pages follow" flag (default `/has_more`).
    pub has_more: Option<String>,
    /// stripe pagination: the parameter carrying the last id (default `starting_after`).
    pub starting_after_param: Option<String>,
    pub id: Option<String>,
    pub version: Option<String>,
    pub version_format: Option<VersionFormat>,
    /// Integer versions: the highest one accepted (a higher one is a dead letter).
    pub max_version: Option<i64>,
    /// `item` (default: the `version` pointer) or `response_date`: the listing's or
    /// get's `Date` header, for senders whose objects carry no version.
    pub version_from: Option<VersionFrom>,
    pub state: Option<String>,
    pub get: Option<String>,
    /// Pointer to the resource in the `get` response (default: the whole body), for
    /// senders that wrap it (`{"order": {...}}`).
    pub get_item: Option<String>,
    /// A pointer that marks a listed item as not of this kind (GitHub's issue listing
    /// includes pull requests: `/pull_request`): such an item is left out.
    pub exclude: Option<String>,
    /// Many resources by id in one request, `{ids}` their ids comma-separated
    /// (Shopify: `/orders.json?ids={ids}&status=any`): pending fetches of one account
    /// and kind are fetched together.
    pub get_many: Option<String>,
    /// Pointer to the array of resources in the `get_many` response (default: `items`).
    pub get_many_items: Option<String>,
    /// Most ids one `get_many` request asks for (default 50; Shopify's limit is 250).
    pub get_many_size: Option<u32>,
    /// Further origins (`https://host[:port]`) this kind's next-page links and redirects
    /// may point to; the API token is sent there too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// Most of the kind's live rows one sweep may tombstone (default 0.1).
    pub max_delete_fraction: Option<f64>,
    #[serde(default)]
    pub detect_deletes: bool,
    pub incremental: Option<RawIncremental>,
    /// Pointers a webhook body must match (pointer -> prefix of its string value): the
    /// body confirms the kind that an unsigned header named.
    #[serde(default, rename = "match", skip_serializing_if = "BTreeMap::is_empty")]
    pub match_prefixes: BTreeMap<String, String>,
    #[serde(default)]
    pub events: BTreeMap<String, RawEvent>,
    /// Typed columns of the kind's view: name -> JSON pointer, `{ pointer, type,
    /// format }`, or `false` (a preset's column switched off).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub columns: BTreeMap<String, RawColumn>,
    /// Columns to index (partial indexes on the kind's rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indexes: Option<Vec<String>>,
    /// The view's name (default `SOURCE_KIND`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
}

/// One entry of `[sources.S.kinds.K.columns]`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum RawColumn {
    /// `false` switches a preset's column off.
    Off(bool),
    /// A JSON pointer; the column is text.
    Pointer(String),
    Typed(RawTypedColumn),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTypedColumn {
    pub pointer: String,
    /// text (default), bigint, numeric, boolean or timestamptz.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub ty: Option<String>,
    /// For timestamptz: unix, unix_ms or rfc3339 (default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawEvent {
    pub id: String,
    pub version: Option<String>,
    pub state: Option<String>,
    pub action: Option<Action>,
}

/// Incremental reconciliation of a kind: list only what changed since a watermark.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawIncremental {
    /// Query parameter the list endpoint filters by, e.g. `updated_since`.
    pub param: String,
    /// Pointer to an item's last-modified time (default: the kind's version, when the
    /// version is a timestamp).
    pub field: Option<String>,
    /// `rfc3339` or `unix`: how `field` is read and `param` written (default: the
    /// kind's version_format when that is a timestamp).
    pub format: Option<VersionFormat>,
    /// How far before the watermark each run starts again (sender clock skew, late
    /// commits); default 5m.
    pub overlap: Option<String>,
    /// A full sweep at least this often (catches what an incremental listing cannot,
    /// and detects deletions); default 24h.
    pub full_every: Option<String>,
}

/// An application the change feed is pushed to.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsumer {
    pub url: String,
    /// A Standard Webhooks secret (`whsec_` + base64) the pushes are signed with.
    pub secret: RawSecret,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    pub timeout: Option<String>,
    /// 0: retry for ever (default).
    pub max_attempts: Option<u32>,
    pub on_failure: Option<OnFailure>,
    /// `beginning` (default: every change still kept) or `now`, for a consumer without
    /// a position yet.
    pub start: Option<ConsumerStart>,
}

/// `[sources.NAME.kinds]`: a table of kinds, each a table or `false`. A list (the way
/// other tools name the kinds to keep) gets an answer saying how it is written here.
fn kinds_or_off<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, RawKind>, D::Error> {
    use serde::de::{self, MapAccess, SeqAccess, Visitor};
    struct Kinds;
    impl<'de> Visitor<'de> for Kinds {
        type Value = BTreeMap<String, RawKind>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a table of kinds")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(de::Error::custom(
                "kinds is a table, one entry a kind; to keep only some of a preset's kinds, switch the others off: kinds.KIND.enabled = false (or kinds.KIND = false)",
            ))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut kinds = BTreeMap::new();
            while let Some((name, KindOrOff(kind))) = map.next_entry::<String, KindOrOff>()? {
                kinds.insert(name, kind);
            }
            Ok(kinds)
        }
    }
    d.deserialize_any(Kinds)
}

struct KindOrOff(RawKind);

impl<'de> Deserialize<'de> for KindOrOff {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KindOrOff;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a kind's table, or false to switch the kind off")
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<KindOrOff, E> {
                if on {
                    return Err(E::custom(
                        "`true` says nothing about the kind: write its table, or false to switch it off",
                    ));
                }
                Ok(KindOrOff(RawKind {
                    enabled: Some(false),
                    ..RawKind::default()
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KindOrOff, A::Error> {
                RawKind::deserialize(de::value::MapAccessDeserializer::new(map)).map(KindOrOff)
            }
        }
        d.deserialize_any(V)
    }
}

// By hand rather than `untagged`, whose error ("did not match any variant") names neither
// the forms accepted nor the key that was wrong.
impl<'de> Deserialize<'de> for RawColumn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawColumn;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a JSON pointer (\"/status\"), { pointer = \"/amount\", type = \"bigint\" }, or false to switch a preset's column off",
                )
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<RawColumn, E> {
                if on {
                    return Err(E::custom(
                        "`true` says nothing about the column: write its JSON pointer, or false to switch it off",
                    ));
                }
                Ok(RawColumn::Off(false))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawColumn, E> {
                Ok(RawColumn::Pointer(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawColumn, A::Error> {
                RawTypedColumn::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawColumn::Typed)
            }
        }
        d.deserialize_any(V)
    }
}

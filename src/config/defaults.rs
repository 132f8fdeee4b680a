//! Every default of the configuration, in one place. README's key reference and
//! `config/webhook-reconciler.example.toml` show the same values.

use std::time::Duration;

const SECOND: u64 = 1;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

// [database]
pub const DATABASE_URL: &str = "sqlite://webhook-reconciler.db";
pub const MAX_CONNECTIONS: u32 = 16;
pub const MIGRATE: bool = true;
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5 * SECOND);
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10 * SECOND);

/// A timestamp version may be at most this far ahead of our clock.
pub const MAX_VERSION_AHEAD: Duration = Duration::from_secs(DAY);

// [http]
pub const LISTEN: &str = "127.0.0.1:8080";
pub const MAX_BODY: &str = "1MiB";
/// Deliveries handled at once; more are answered 503 at once. Bounds the memory a
/// database outage can pile up (each waiting delivery holds its connection and body).
pub const MAX_IN_FLIGHT: u32 = 256;
/// The bytes of all request bodies being received at once.
pub const MAX_BODY_BYTES_IN_FLIGHT: &str = "256MiB";
/// HTTP connections open at once (at least `max_in_flight`). Bounds the memory of the
/// retry storm that ends an outage (~20 KiB a connection); at the cap, idle and
/// head-less connections make room, oldest first.
pub const MAX_HTTP_CONNECTIONS: u32 = 2048;
/// The same per client address: one client cannot take every place.
pub const MAX_HTTP_CONNECTIONS_PER_IP: u32 = 256;
/// A request head must arrive whole within this.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10 * SECOND);
/// A request body must arrive whole within this (408 otherwise).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30 * SECOND);
/// A connection with no bytes read or written for this long is closed (nginx keeps
/// idle connections 75 s); without it, idle connections could hold every place.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60 * SECOND);

// [retention]
pub const RETENTION_EVERY: Duration = Duration::from_secs(HOUR);
pub const RETENTION_BATCH: u32 = 5000;
pub const MAX_RETENTION_BATCH: u32 = 100_000;
pub const KEEP_RECONCILE_RUNS: Duration = Duration::from_secs(30 * DAY);
pub const KEEP_DEAD_LETTERS: Duration = Duration::from_secs(30 * DAY);

pub const KEEP_CHANGES: Duration = Duration::from_secs(7 * DAY);

// [consumers.NAME]
pub const CONSUMER_TIMEOUT: Duration = Duration::from_secs(10 * SECOND);
/// 0: a consumer retries a change for ever.
pub const CONSUMER_MAX_ATTEMPTS: u32 = 0;

// [log]
pub const LOG_LEVEL: &str = "info";

// [sources.NAME]
pub const RETRY_WINDOW: Duration = Duration::from_secs(DAY);
/// Event ids are kept this many retry windows unless `retention` says otherwise.
pub const RETENTION_RETRY_WINDOWS: u32 = 2;
pub const REQUESTS_PER_SECOND: f64 = 25.0;

// [sources.NAME.webhook]
pub const TOLERANCE: Duration = Duration::from_secs(5 * MINUTE);
pub const SIGNATURE_HEADER: &str = "X-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Signature-Timestamp";
/// The webhook path of source `name`.
pub fn webhook_path(name: &str) -> String {
    format!("/webhooks/{name}")
}

// [sources.NAME.reconcile]
pub const PAGE_SIZE: u32 = 500;
pub const MAX_PAGE_SIZE: u32 = 10_000;
pub const SENDER_TIMEOUT: Duration = Duration::from_secs(30 * SECOND);
pub const MAX_ATTEMPTS: u32 = 5;
pub const MAX_RETRY_WAIT: Duration = Duration::from_secs(MINUTE);
pub const RUN_AT_START: bool = true;
pub const LEASE_TTL: Duration = Duration::from_secs(2 * MINUTE);
pub const MAX_PAGE_BYTES: &str = "32MiB";
/// Jitter is this fraction of `every`...
pub const JITTER_DIVISOR: u32 = 10;
/// ...at most this much.
pub const MAX_DEFAULT_JITTER: Duration = Duration::from_secs(30 * SECOND);
/// A kind is overdue after this many intervals without a successful run.
pub const STALE_AFTER_INTERVALS: u32 = 3;

// [sources.NAME.kinds.KIND]
pub const ITEMS: &str = "/data";
pub const NEXT_CURSOR: &str = "/next_cursor";
pub const CURSOR_PARAM: &str = "cursor";
pub const LIMIT_PARAM: &str = "limit";
pub const HAS_MORE: &str = "/has_more";
pub const STARTING_AFTER_PARAM: &str = "starting_after";
pub const ITEM_ID: &str = "/id";
/// The whole item.
pub const ITEM_STATE: &str = "";
pub const INCREMENTAL_OVERLAP: Duration = Duration::from_secs(5 * MINUTE);
pub const FULL_EVERY: Duration = Duration::from_secs(DAY);
pub const MAX_DELETE_FRACTION: f64 = 0.1;

// [sources.NAME.catchup]
/// How long senders keep events (Stripe: 30 days).
/// The most dead letters' body bytes kept per source.
pub const DEAD_LETTERS_MAX_BYTES: &str = "256MiB";

pub const CATCHUP_WINDOW: Duration = Duration::from_secs(30 * DAY);
/// Stripe's event creation time.
pub const CATCHUP_FIELD: &str = "/created";

// [sources.NAME.kinds.KIND.events."TYPE"]
pub const EVENT_STATE: &str = "/data";

/// Account-kinds one process reconciles at once.
pub const ACCOUNT_CONCURRENCY: u32 = 4;

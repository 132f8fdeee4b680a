//! What the command line accepts (clap's derive): the commands, their arguments and
//! their help. What each does is in `cli`'s dispatch and its modules.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::operate;
use crate::config::CONFIG_ENV;

/// The version `--version` prints: the crate's, and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WR_GIT_COMMIT"),
    ")"
);

/// Keeps a local database exactly in step with the resources a webhook sender owns.
#[derive(Debug, Parser)]
#[command(name = "webhook-reconciler", version = VERSION, about)]
pub struct Cli {
    /// Configuration file (TOML). Without it, /etc/webhook-reconciler/config.toml when
    /// it exists, else built-in defaults; environment variables
    /// WEBHOOK_RECONCILER__SECTION__KEY override either.
    #[arg(long, global = true, env = CONFIG_ENV, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the webhook receiver, the reconcile schedule and retention, with /healthz,
    /// /readyz and /metrics.
    Serve,
    /// Apply the embedded database migrations and exit.
    Migrate,
    /// Validate the configuration (and that every secret resolves) without side effects.
    CheckConfig,
    /// Print the effective configuration as TOML: presets applied, environment
    /// overrides merged, secrets redacted. Keys not shown take their defaults.
    Config,
    /// Delete processed event ids, old reconcile runs and dead letters past retention.
    Prune,
    /// Recent reconcile runs, drift, age of the last success, dead letters, last prune.
    Status {
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The zero-setup showcase: a simulated sender with real faults, the daemon on an
    /// embedded SQLite file, a reconcile, and a report. Exits 0 only if the local state
    /// ends equal to the sender's.
    Demo(DemoArgs),
    /// Print the change feed as JSON lines, oldest first.
    Changes {
        /// Only changes with a seq above this one.
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// At most this many (without --follow).
        #[arg(long)]
        limit: Option<i64>,
        /// Keep printing new changes as they are committed (until Ctrl-C).
        #[arg(long)]
        follow: bool,
    },
    /// Reconcile now, once: page through the senders' listings and repair what differs.
    /// `reconcile pause|resume SOURCE [KIND]` stops or restarts a kind's reconciling on
    /// every replica.
    #[command(args_conflicts_with_subcommands = true)]
    Reconcile {
        #[command(subcommand)]
        action: Option<operate::PauseAction>,
        /// Only this source.
        #[arg(long)]
        source: Option<String>,
        /// Only this account of a many-account source (default: each enabled one).
        #[arg(long, requires = "source")]
        account: Option<String>,
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Write nothing; report what would change (and what deletion detection
        /// would tombstone) and the first ids.
        #[arg(long)]
        dry_run: bool,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
        /// Wait for a kind another process is reconciling, instead of skipping it.
        #[arg(long)]
        wait: bool,
        /// Let deletion detection tombstone more than the kind's max_delete_fraction
        /// (check the ids first with --dry-run).
        #[arg(long)]
        allow_mass_delete: bool,
        /// Account-kinds run at once (default: the largest accounts.concurrency of
        /// the selected sources; 1 when none serves many accounts).
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
        concurrency: Option<u16>,
    },
    /// Authentic deliveries that could not be applied (a mapping pointing at the wrong
    /// field, data the database refused): list them, retry them after the fix, discard
    /// them.
    DeadLetters {
        #[command(subcommand)]
        action: operate::DeadLettersAction,
    },
    /// One resource's story: its row, every event claimed for it (id, type, outcome,
    /// time), its changes (seq, version, origin) and the reconcile runs that wrote it.
    Explain {
        source: String,
        kind: String,
        id: String,
        /// The account of a many-account source.
        #[arg(long)]
        account: Option<String>,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The change feed's consumers: list them, rewind one (changes after a seq are
    /// pushed again, with the same ids), pause or resume one.
    Consumers {
        #[command(subcommand)]
        action: operate::ConsumersAction,
    },
    /// The accounts of a many-account source ([sources.NAME.accounts]): a delivery is
    /// applied to the account its signed body names only when it is registered here.
    Accounts {
        #[command(subcommand)]
        action: AccountsAction,
    },
    /// Make secrets: `secret new` prints a fresh Standard Webhooks key (whsec_ + 32
    /// random bytes in base64), for a consumer's `secret`; `--raw` without whsec_, for
    /// accounts.key.
    Secret {
        #[command(subcommand)]
        action: SecretAction,
    },
    /// Prove any running receiver: the guide's seven cases (a repeated delivery, three
    /// concurrent ones, an older update after a newer one, a burst of 200 half
    /// duplicates, a delivery abandoned before its answer and retried, a forged
    /// signature, an old timestamp) sent as its sender would, each effect read back
    /// through a probe. Exit 0 when none fails, 1 when one does, 2 on bad arguments.
    Prove(ProveArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one page per command into a directory.
    Man {
        /// Write webhook-reconciler.1 and one page per subcommand here.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountsAction {
    /// Register an account (enabled; one registered before is enabled again); its first
    /// full sync starts within seconds under `serve`.
    Add {
        source: String,
        account: String,
        /// The account's own API credential, read from this file (kept encrypted
        /// with accounts.key, never printed).
        #[arg(long, conflicts_with = "token_env")]
        token_file: Option<String>,
        /// The account's own API credential, read from this environment variable.
        #[arg(long)]
        token_env: Option<String>,
        /// The account's own API base URL (a Shopify shop's), instead of the source's.
        #[arg(long)]
        api_base: Option<String>,
    },
    /// Change a registered account's API base or credential. A new base needs the
    /// credential again when the account keeps one (it was given for the old base).
    Set {
        source: String,
        account: String,
        /// The account's new API credential, read from this file.
        #[arg(long, conflicts_with = "token_env")]
        token_file: Option<String>,
        /// The account's new API credential, read from this environment variable.
        #[arg(long)]
        token_env: Option<String>,
        /// The account's new API base URL (under the source's accounts.api_bases).
        #[arg(long, conflicts_with = "clear_api_base")]
        api_base: Option<String>,
        /// Forget the account's own base: the source's template or base again.
        #[arg(long)]
        clear_api_base: bool,
    },
    /// Re-seal every kept credential under accounts.key (opened with it or with
    /// accounts.previous_key), each bound to its account's base. Run it after setting
    /// the new key as accounts.key and the old one as accounts.previous_key; then the
    /// previous key can go.
    Rekey {
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The registered accounts, of one source or all.
    List {
        source: Option<String>,
        /// Print machine-readable results on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Stop applying the account's deliveries (answered `ignored`); its rows stay.
    Disable { source: String, account: String },
    /// Apply the account's deliveries again.
    Enable { source: String, account: String },
    /// Unregister the account and tombstone its rows (each a change in the feed).
    Remove {
        source: String,
        account: String,
        /// Delete its rows instead of tombstoning them (no change is recorded).
        #[arg(long)]
        purge: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretAction {
    /// Print a new whsec_ key on stdout (nothing else is written).
    New {
        /// 32 random bytes in plain base64, without whsec_ (for accounts.key).
        #[arg(long)]
        raw: bool,
    },
}

/// `demo` flags.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Orders the sender owns (each goes through up to 6 statuses).
    #[arg(long, default_value_t = 2000)]
    pub orders: usize,
    /// Refunds the sender owns (insert-once).
    #[arg(long, default_value_t = 500)]
    pub refunds: usize,
    /// Seed of the scenario and of the faults.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Share of events never delivered.
    #[arg(long, default_value_t = 0.05)]
    pub loss: f64,
    /// Share of events delivered again later.
    #[arg(long, default_value_t = 0.10)]
    pub duplicate: f64,
    /// Share of events delivered twice at the same moment.
    #[arg(long, default_value_t = 0.05)]
    pub concurrent_duplicate: f64,
    /// Share of deliveries swapped with an earlier one.
    #[arg(long, default_value_t = 0.20)]
    pub reorder: f64,
    /// Share of deliveries whose acknowledgement comes after the sender's timeout.
    #[arg(long, default_value_t = 0.03)]
    pub slow_ack: f64,
    /// Share of order updates that reuse the previous version (same-second timestamps).
    #[arg(long, default_value_t = 0.02)]
    pub same_second: f64,
    /// Concurrent deliveries.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Database URL (default: a SQLite file in a temporary directory).
    #[arg(long)]
    pub database: Option<String>,
    /// Skip reconciliation: shows what the webhooks alone leave behind.
    #[arg(long)]
    pub no_reconcile: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// A Stripe Connect platform with this many connected accounts instead: each
    /// account's customers and products, one registered only after its deliveries, all
    /// reconciled by the shared per-kind schedule.
    #[arg(long, value_name = "N", conflicts_with_all = ["orders", "refunds", "no_reconcile", "same_second"])]
    pub accounts: Option<usize>,
}

/// A demo fault rate, checked to be between 0 and 1.
pub(super) fn rate(name: &str, v: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("--{name} {v} is not a rate between 0 and 1"))
    }
}

/// `prove`'s arguments. A probe is required: the count probe (SQL or URL), and
/// optionally the version probe for the order case.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("count").required(true).args(["probe_sql", "probe_url"])))]
pub struct ProveArgs {
    /// The receiver's endpoint, e.g. `https://staging.example.com/webhooks`.
    #[arg(long)]
    pub url: String,
    /// How the receiver verifies: seed (the guide's, = hmac-sha256), hmac-sha256,
    /// standard-webhooks, stripe, github, shopify.
    #[arg(long)]
    pub scheme: String,
    /// hmac-sha256 (seed): the signature's header, if the receiver reads another.
    #[arg(long, default_value = "X-Signature")]
    pub signature_header: String,
    /// hmac-sha256 (seed): the timestamp's header.
    #[arg(long, default_value = "X-Signature-Timestamp")]
    pub timestamp_header: String,
    /// File holding the webhook secret (as the sender shows it); never printed.
    #[arg(long, value_name = "FILE")]
    pub secret_file: PathBuf,
    /// A JSON event with {event_id}, {resource_id}, {version}, {created} (RFC 3339) and
    /// {created_unix} placeholders (default: the guide's refund event).
    #[arg(long, value_name = "FILE")]
    pub template: Option<PathBuf>,
    /// The database the count and version probe queries run on (postgres://… or
    /// sqlite://…).
    #[arg(long, value_name = "URL")]
    pub probe_db: Option<String>,
    /// How many times an event's effect was applied, with :event_id bound, e.g.
    /// "select count(*) from refunds where source_event = :event_id".
    #[arg(long, value_name = "SQL", requires = "probe_db")]
    pub probe_sql: Option<String>,
    /// The same over HTTP: GET with {event_id} filled in, answering N or {"count": N}.
    #[arg(long, value_name = "URL")]
    pub probe_url: Option<String>,
    /// Which version of a resource the receiver holds, with :resource_id bound (for
    /// the order case; without a version probe it is skipped).
    #[arg(long, value_name = "SQL", requires = "probe_db")]
    pub probe_version_sql: Option<String>,
    /// The same over HTTP: GET with {resource_id}, answering N or {"version": N}.
    #[arg(long, value_name = "URL", conflicts_with = "probe_version_sql")]
    pub probe_version_url: Option<String>,
    /// Each request's timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

use super::*;
use std::time::Duration;

/// SPEC.md's example, with literal secrets instead of env/file references.
const SPEC_EXAMPLE: &str = r#"
[database]
url = "sqlite://webhook-reconciler.db"
max_connections = 16

[http]
listen = "127.0.0.1:8080"
max_body = "1MiB"

[retention]
every = "1h"

[sources.shop]
retry_window = "24h"
requests_per_second = 25
api_base = "https://api.shop.example/v1"
api_token = "token"

[sources.shop.webhook]
path = "/webhooks/shop"
scheme = "hmac-sha256"
secrets = ["s1"]
tolerance = "5m"

[sources.shop.reconcile]
every = "5m"
page_size = 500
timeout = "30s"

[sources.shop.kinds.order]
list = "/orders"
pagination = "cursor"
items = "/data"
id = "/id"
version = "/version"
version_format = "integer"
get = "/orders/{id}"
[sources.shop.kinds.order.events."order.status_changed"]
id = "/data/order_id"
version = "/data/version"
state = "/data"
[sources.shop.kinds.order.events."order.deleted"]
id = "/data/order_id"
version = "/data/version"
action = "delete"

[sources.shop.kinds.refund]
list = "/refunds"
id = "/id"
[sources.shop.kinds.refund.events."refund.succeeded"]
id = "/data/refund_id"
state = "/data"
"#;

fn problems(toml: &str) -> Vec<(String, String)> {
    Config::from_toml_str(toml)
        .unwrap_err()
        .problems
        .into_iter()
        .map(|p| (p.key, p.message))
        .collect()
}

fn has_problem(toml: &str, key: &str, needle: &str) {
    let ps = problems(toml);
    assert!(
        ps.iter().any(|(k, m)| k == key && m.contains(needle)),
        "expected a problem at {key} mentioning {needle:?}, got {ps:#?}"
    );
}

#[test]
fn the_spec_example_is_a_valid_configuration() {
    let c = Config::from_toml_str(SPEC_EXAMPLE).unwrap();
    let shop = c.source("shop").unwrap();
    assert_eq!(
        shop.retention,
        Duration::from_secs(48 * 3600),
        "twice the retry window"
    );
    assert_eq!(shop.webhook.path, "/webhooks/shop");
    assert_eq!(
        shop.reconcile.schedule,
        Some(Schedule::Every(Duration::from_secs(300)))
    );
    let order = shop.kinds.iter().find(|k| k.name == "order").unwrap();
    assert!(order.versioned());
    assert_eq!(order.events["order.deleted"].action, Action::Delete);
    let refund = shop.kinds.iter().find(|k| k.name == "refund").unwrap();
    assert!(!refund.versioned(), "a kind without version is insert-once");
}

#[test]
fn no_file_means_the_documented_defaults() {
    let c = Config::from_toml_str("").unwrap();
    assert_eq!(c.database.backend, Backend::Sqlite);
    assert_eq!(c.database.redacted_url(), "sqlite://webhook-reconciler.db");
    assert_eq!(c.http.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.http.max_body, 1 << 20);
    assert!(c.sources.is_empty());
}

#[test]
fn a_retention_shorter_than_the_retry_window_is_refused_by_name() {
    let toml = SPEC_EXAMPLE.replace(
        "retry_window = \"24h\"",
        "retry_window = \"24h\"\nretention = \"12h\"",
    );
    has_problem(&toml, "sources.shop.retention", "shorter than retry_window");
}

#[test]
fn a_misspelt_key_is_named() {
    has_problem(
        "[database]\nurll = \"x\"",
        "database.urll",
        "unknown key `urll`",
    );
    let toml = SPEC_EXAMPLE.replace("page_size = 500", "pagesize = 500");
    has_problem(
        &toml,
        "sources.shop.reconcile.pagesize",
        "unknown key `pagesize`",
    );
}

#[test]
fn bad_durations_sizes_and_addresses_name_their_key() {
    has_problem(
        &SPEC_EXAMPLE.replace("\"5m\"\npage", "\"5 parsecs\"\npage"),
        "sources.shop.reconcile.every",
        "not a duration",
    );
    has_problem("[http]\nmax_body = \"lots\"", "http.max_body", "not a size");
    has_problem(
        "[http]\nmax_in_flight = 0",
        "http.max_in_flight",
        "at least 1",
    );
    has_problem(
        "[http]\nmax_in_flight = 300\nmax_connections = 100",
        "http.max_connections",
        "below http.max_in_flight (300)",
    );
    has_problem(
        "[http]\nidle_timeout = \"soon\"",
        "http.idle_timeout",
        "soon",
    );
    has_problem("[http]\nlisten = \"localhost\"", "http.listen", "IP:PORT");
    has_problem(
        "[database]\nurl = \"mysql://x\"",
        "database.url",
        "sqlite:// or postgres://",
    );
}

#[test]
fn an_unsigned_source_needs_the_explicit_insecure_flag() {
    let toml = "[sources.x.webhook]\nscheme = \"none\"";
    has_problem(toml, "sources.x.webhook.scheme", "insecure_no_signature");
    let ok = "[sources.x]\ninsecure_no_signature = true\n[sources.x.webhook]\nscheme = \"none\"";
    assert!(Config::from_toml_str(ok).is_ok());
}

#[test]
fn a_signed_source_needs_a_secret() {
    has_problem(
        "[sources.x.webhook]\nscheme = \"github\"",
        "sources.x.webhook.secrets",
        "no secret",
    );
}

#[test]
fn a_missing_secret_names_the_variable_and_never_a_value() {
    let toml = "[sources.x.webhook]\nsecrets = [{ env = \"WR_TEST_SURELY_UNSET_VAR\" }]";
    has_problem(
        toml,
        "sources.x.webhook.secrets[0]",
        "WR_TEST_SURELY_UNSET_VAR is not set",
    );
    let toml = "[sources.x.webhook]\nsecrets = [{ file = \"/nonexistent/secret\" }]";
    has_problem(toml, "sources.x.webhook.secrets[0]", "/nonexistent/secret");
}

#[test]
fn secrets_are_read_from_files_without_the_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    std::fs::write(&path, "hunter2\n").unwrap();
    let toml = format!(
        "[sources.x.webhook]\nsecrets = [{{ file = {:?} }}]",
        path.display().to_string()
    );
    let c = Config::from_toml_str(&toml).unwrap();
    assert_eq!(c.sources[0].webhook.secrets[0].expose(), b"hunter2");
    assert_eq!(
        format!("{:?}", c.sources[0].webhook.secrets[0]),
        "[redacted]"
    );
}

#[test]
fn list_kinds_need_an_api_base_or_absolute_urls() {
    let toml = "[sources.x.webhook]\nsecrets=[\"s\"]\n[sources.x.kinds.order]\nlist = \"/orders\"";
    has_problem(toml, "sources.x.api_base", "relative");
    let ok = "[sources.x.webhook]\nsecrets=[\"s\"]\n[sources.x.kinds.order]\nlist = \"https://a.example/orders\"";
    assert!(Config::from_toml_str(ok).is_ok());
}

#[test]
fn a_versioned_kind_needs_a_version_on_every_event() {
    let toml = SPEC_EXAMPLE.replace(
        "id = \"/data/order_id\"\nversion = \"/data/version\"\nstate",
        "id = \"/data/order_id\"\nstate",
    );
    has_problem(
        &toml,
        "sources.shop.kinds.order.events.order.status_changed.version",
        "versioned",
    );
}

#[test]
fn the_database_password_never_shows_in_the_printable_url() {
    let c = Config::from_toml_str("[database]\nurl = \"postgres://app:s3cret@db.internal/app\"")
        .unwrap();
    assert_eq!(
        c.database.redacted_url(),
        "postgres://app:***@db.internal/app"
    );
    assert!(!format!("{c:?}").contains("s3cret"));
}

#[test]
fn an_interval_the_schedule_cannot_keep_is_refused_not_rounded() {
    let toml = SPEC_EXAMPLE.replace("every = \"5m\"", "every = \"7m\"");
    has_problem(
        &toml,
        "sources.shop.reconcile.every",
        "cannot be kept exactly",
    );
    let toml = SPEC_EXAMPLE.replace("every = \"5m\"", "every = \"3d\"");
    has_problem(&toml, "sources.shop.reconcile.every", "write `cron`");
}

#[test]
fn an_unknown_enum_value_is_named_with_the_accepted_values() {
    let toml = SPEC_EXAMPLE.replace("pagination = \"cursor\"", "pagination = \"pages\"");
    has_problem(&toml, "sources.shop.kinds.order.pagination", "cursor");
    let toml = SPEC_EXAMPLE.replace("scheme = \"hmac-sha256\"", "scheme = \"md5\"");
    has_problem(&toml, "sources.shop.webhook.scheme", "standard-webhooks");
}

#[test]
fn a_database_password_given_as_a_query_parameter_is_redacted_too() {
    let c = Config::from_toml_str(
        "[database]\nurl = \"postgres://app@db.internal/app?sslmode=require&password=S3cr3t&SSLPassword=k3y\"",
    )
    .unwrap();
    assert_eq!(
        c.database.redacted_url(),
        "postgres://app@db.internal/app?sslmode=require&password=***&SSLPassword=***"
    );
    assert!(!format!("{c:?}").contains("S3cr3t"));
}

#[test]
fn a_standard_webhooks_secret_must_have_a_key_and_a_short_one_is_warned_about() {
    let base = "[sources.s.webhook]\nscheme = \"standard-webhooks\"\n";
    has_problem(
        &format!("{base}secrets = [\"whsec_\"]"),
        "sources.s.webhook.secrets[0]",
        "empty key",
    );
    for empty in ["\"\"", "{ env = \"WR_TEST_SURELY_UNSET_VAR\" }"] {
        assert!(
            !problems(&format!("[sources.s.webhook]\nsecrets = [{empty}]")).is_empty(),
            "{empty}"
        );
    }
    // 16 bytes: accepted, with a warning naming the key.
    let c = Config::from_toml_str(&format!(
        "{base}secrets = [\"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"]"
    ))
    .unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert_eq!(c.warnings[0].key, "sources.s.webhook.secrets[0]");
    assert!(c.warnings[0].message.contains("24 to 64"));
}

#[test]
fn a_preset_fills_a_source_and_every_key_written_out_wins() {
    let c = Config::from_toml_str(
        r#"
[sources.stripe]
preset = "stripe"
api_token = "sk_test_x"
[sources.stripe.webhook]
secrets = ["whsec_0123456789abcdefghij"]
[sources.stripe.reconcile]
every = "1h"
[sources.stripe.kinds.customer]
get = "/v1/customers/{id}?expand[]=sources"
"#,
    )
    .unwrap();
    let s = &c.sources[0];
    assert_eq!(s.webhook.scheme, Scheme::Stripe);
    assert_eq!(s.api_base.as_deref(), Some("https://api.stripe.com"));
    assert_eq!(
        s.reconcile.schedule,
        Some(Schedule::Every(Duration::from_secs(3600)))
    );
    let names: Vec<&str> = s.kinds.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "charge",
            "customer",
            "invoice",
            "payment_intent",
            "price",
            "product",
            "refund",
            "subscription"
        ]
    );
    let customer = s.kinds.iter().find(|k| k.name == "customer").unwrap();
    assert_eq!(
        customer.get.as_deref(),
        Some("/v1/customers/{id}?expand[]=sources")
    );
    assert!(customer.by_fetch_time());
    assert_eq!(customer.pagination, Pagination::Stripe);
    assert_eq!(
        customer.events["customer.updated"].version.as_deref(),
        Some("/created")
    );
    assert_eq!(customer.events["customer.deleted"].action, Action::Delete);
    let catchup = s.catchup.as_ref().unwrap();
    assert_eq!(catchup.since_param, "created[gte]");
    assert_eq!(catchup.window, Duration::from_secs(30 * 86_400));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn github_and_shopify_presets_need_the_accounts_api_url() {
    for (preset, secret) in [("github", "s"), ("shopify", "s")] {
        let e = Config::from_toml_str(&format!(
            "[sources.x]\npreset = \"{preset}\"\n[sources.x.webhook]\nsecrets = [\"{secret}\"]\n"
        ))
        .unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].key, "sources.x.api_base");
        assert!(e.problems[0].message.contains("e.g. api_base"), "{e}");
    }
    let c = Config::from_toml_str(
        "[sources.x]\npreset = \"shopify\"\napi_base = \"https://s.myshopify.com/admin/api/2024-10\"\n[sources.x.webhook]\nsecrets = [\"shpss_0123456789abcdef\"]\n",
    )
    .unwrap();
    let s = &c.sources[0];
    assert_eq!(s.webhook.scheme, Scheme::Shopify);
    assert_eq!(
        s.api_token_header.as_deref(),
        Some("X-Shopify-Access-Token")
    );
    let order = s.kinds.iter().find(|k| k.name == "order").unwrap();
    assert_eq!(
        (order.items.as_str(), order.get_item.as_str()),
        ("/orders", "/order")
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let e = Config::from_toml_str("[sources.x]\npreset = \"paypal\"\n").unwrap_err();
    assert!(e.to_string().contains("sources.x.preset"), "{e}");
}

#[test]
fn a_listing_without_versions_under_versioned_events_is_warned_about() {
    // The natural Stripe configuration written by hand, without version_from: reconcile
    // could never repair a missed customer.updated.
    let c = Config::from_toml_str(
        r#"
[sources.s]
api_base = "https://api.stripe.com"
[sources.s.webhook]
scheme = "stripe"
secrets = ["whsec_0123456789abcdefghij"]
[sources.s.kinds.customer]
list = "/v1/customers"
get = "/v1/customers"
pagination = "stripe"
version_format = "unix"
[sources.s.kinds.customer.events."customer.updated"]
id = "/id"
version = "/created"
state = "/id"
"#,
    )
    .unwrap();
    let keys: Vec<&str> = c.warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "sources.s.kinds.customer.version",
            "sources.s.kinds.customer.get",
            "sources.s.kinds.customer.events.customer.updated.id",
            "sources.s.kinds.customer.events.customer.updated.id",
        ]
    );
    assert!(c.warnings[0].message.contains("version_from"));
    let e = Config::from_toml_str(
        "[sources.s]\napi_base = \"http://x\"\n[sources.s.webhook]\nsecrets = [\"k\"]\n[sources.s.kinds.c]\nlist = \"/c\"\nversion = \"/v\"\nversion_from = \"response_date\"\n",
    )
    .unwrap_err();
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "sources.s.kinds.c.version_from",
            "sources.s.kinds.c.version_format"
        ]
    );
}

#[test]
fn no_password_libpq_accepts_is_ever_printed() {
    for (url, printed) in [
        ("postgres://u:PW1_ab?cd@host/db", "postgres://u:***@host/db"),
        ("postgres://u:p%40ss@host/db", "postgres://u:***@host/db"),
        ("postgres://u:p/w@host/db", "postgres://u:***@host/db"),
        (
            "postgresql://u:pw@h1:5432,h2:5433/db",
            "postgresql://u:***@h1:5432,h2:5433/db",
        ),
        (
            "postgres://u:pw@[::1]:5432/db",
            "postgres://u:***@[::1]:5432/db",
        ),
        (
            "postgres://host/db?pass%77ord=secret",
            "postgres://host/db?pass%77ord=***",
        ),
        (
            "postgres://host/db?password=p@ss",
            "postgres://host/db?password=***",
        ),
        (
            "postgres://u:x?y@host/db?sslmode=require&PASSWORD=z",
            "postgres://u:***@host/db?sslmode=require&PASSWORD=***",
        ),
        (
            "postgres://host/db?%20password=s",
            "postgres://host/db?%20password=***",
        ),
    ] {
        let c = Config::from_toml_str(&format!("[database]\nurl = \"{url}\"")).unwrap();
        assert_eq!(c.database.redacted_url(), printed, "{url}");
        let shown = format!("{c:?}{}", c.database.redacted_url());
        for secret in [
            "PW1_ab", "p%40ss", "p/w", "secret", "p@ss", "x?y", "=z", "=s",
        ] {
            if url.contains(secret) {
                assert!(!shown.contains(secret), "{url}: {secret} shown");
            }
        }
    }
}

#[test]
fn database_password_completes_the_url_and_is_never_shown() {
    let c = Config::from_toml_str(
        "[database]\nurl = \"postgres://app@db.internal/app?sslmode=require\"\npassword = \"p@ss w&rd\"",
    )
    .unwrap();
    assert_eq!(
        c.database.redacted_url(),
        "postgres://app@db.internal/app?sslmode=require"
    );
    assert_eq!(
        secrecy::ExposeSecret::expose_secret(&c.database.url),
        "postgres://app@db.internal/app?sslmode=require&password=p%40ss%20w%26rd"
    );
    assert!(!format!("{c:?}").contains("p@ss"));
    has_problem(
        "[database]\nurl = \"postgres://app:x@db/app\"\npassword = \"y\"",
        "database.password",
        "one place",
    );
    has_problem(
        "[database]\nurl = \"sqlite://x.db\"\npassword = \"y\"",
        "database.password",
        "PostgreSQL",
    );
}

#[test]
fn check_config_warns_of_no_signature_short_secrets_and_link_local_consumers() {
    let c = Config::from_toml_str(
        r#"
[sources.open.webhook]
scheme = "none"
[sources.open]
insecure_no_signature = true
[sources.short.webhook]
secrets = ["tooshort"]
[consumers.meta]
url = "http://169.254.169.254/latest"
secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"
"#,
    )
    .unwrap();
    let keys: Vec<&str> = c.warnings.iter().map(|w| w.key.as_str()).collect();
    for key in [
        "sources.open.webhook.scheme",
        "sources.short.webhook.secrets[0]",
        "consumers.meta.url",
    ] {
        assert!(keys.contains(&key), "no warning at {key}: {:?}", c.warnings);
    }
}

#[test]
fn a_presets_kind_is_switched_off_with_enabled_false_or_false() {
    let c = Config::from_toml_str(
        r#"
[sources.stripe]
preset = "stripe"
api_token = "sk_test_x"
[sources.stripe.webhook]
secrets = ["whsec_0123456789abcdefghij"]
[sources.stripe.kinds.invoice]
enabled = false
[sources.stripe.kinds]
price = false
"#,
    )
    .unwrap();
    let names: Vec<&str> = c.sources[0].kinds.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "charge",
            "customer",
            "payment_intent",
            "product",
            "refund",
            "subscription"
        ]
    );
    // Their event types are no longer mapped (a delivery of one is `ignored`).
    assert!(
        c.sources[0]
            .kinds
            .iter()
            .all(|k| !k.events.contains_key("invoice.paid"))
    );
    let base = "[sources.stripe]\npreset = \"stripe\"\napi_token = \"sk_test_x\"\n[sources.stripe.webhook]\nsecrets = [\"whsec_0123456789abcdefghij\"]\n";
    for (extra, key, says) in [
        (
            "kinds = [\"customer\"]\n",
            "sources.stripe.kinds",
            "enabled = false",
        ),
        (
            "[sources.stripe.kinds.invoice]\nlist = \"\"\n",
            "sources.stripe.kinds.invoice.list",
            "enabled = false",
        ),
        (
            "[sources.stripe.kinds]\ninvoice = true\n",
            "sources.stripe.kinds",
            "false to switch it off",
        ),
    ] {
        let text = if extra.starts_with("kinds") {
            base.replace("api_token", &format!("{extra}api_token"))
        } else {
            format!("{base}{extra}")
        };
        let e = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(says), "{text}\n{e}");
    }
}

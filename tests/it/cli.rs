//! The binary as an operator runs it: exit codes, messages, no secrets in output.

use crate::helpers::process::{bin, write_config};
use crate::helpers::{Backend, TestDb};

#[test]
fn check_config_exits_2_and_names_the_key_when_retention_is_too_short() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[sources.shop]\nretry_window = \"24h\"\nretention = \"1h\"\n[sources.shop.webhook]\nsecrets = [\"x\"]\n",
    );
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sources.shop.retention") && err.contains("shorter than retry_window"),
        "{err}"
    );
}

#[test]
fn check_config_reports_a_missing_secret_without_printing_any_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[sources.shop.webhook]\nsecrets = [{ env = \"WR_SHOP_SECRET\" }]\n",
    );
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("WR_SHOP_SECRET is not set"));

    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("check-config")
        .env("WR_SHOP_SECRET", "sup3r-s3cret-value")
        .env(
            "WEBHOOK_RECONCILER__DATABASE__URL",
            "postgres://app:db-pa55word@db.internal/app",
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains("configuration OK") && all.contains("db.internal"),
        "env override applied: {all}"
    );
    assert!(
        !all.contains("sup3r-s3cret-value") && !all.contains("db-pa55word"),
        "{all}"
    );
}

#[test]
fn an_env_override_with_a_bad_value_names_the_key() {
    let out = bin()
        .arg("check-config")
        .env("WEBHOOK_RECONCILER__HTTP__LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("http.listen"));
}

#[test]
fn a_missing_config_file_is_a_usage_error() {
    let out = bin()
        .args(["--config", "/nonexistent/wr.toml", "check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/wr.toml"));
}

#[test]
fn an_unknown_command_is_a_usage_error() {
    let out = bin().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_never_shows_a_secret_from_the_environment() {
    let out = bin()
        .arg("--help")
        .env(
            "WEBHOOK_RECONCILER__SOURCES__SHOP__WEBHOOK__SECRETS",
            "[\"leak-me-not\"]",
        )
        .env("SHOP_WEBHOOK_SECRET", "leak-me-not")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("leak-me-not"));
}

#[test]
fn migrate_creates_the_tables_on_both_backends_and_is_idempotent() {
    for backend in [Backend::Postgres, Backend::Sqlite] {
        let db = TestDb::new(backend);
        for round in 0..2 {
            let out = bin()
                .arg("migrate")
                .env("WEBHOOK_RECONCILER__DATABASE__URL", &db.url)
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{backend:?} round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            if round == 1 {
                assert!(stdout.contains("up to date"), "{stdout}");
            }
        }
        assert_eq!(db.count("resources"), 0);
        assert_eq!(db.count("processed_events"), 0);
        assert_eq!(db.count("dead_letters"), 0);
    }
}

#[test]
fn migrate_against_an_unreachable_database_exits_1_with_the_reason() {
    let out = bin()
        .arg("migrate")
        .env(
            "WEBHOOK_RECONCILER__DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/none",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
}

#[test]
fn the_shipped_example_configurations_are_valid() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shop-token"), "token\n").unwrap();
    for file in [
        "config/webhook-reconciler.example.toml",
        "config/local.toml",
    ] {
        let out = bin()
            .args(["--config", file, "check-config"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("SHOP_WEBHOOK_SECRET", "x")
            .env("CREDENTIALS_DIRECTORY", dir.path())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_demo_command_exits_0_when_converged_1_when_not_and_2_on_bad_flags() {
    let run = |args: &[&str]| {
        bin()
            .arg("demo")
            .args(["--orders", "60", "--refunds", "10"])
            .args(args)
            .output()
            .unwrap()
    };
    let ok = run(&[]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let report = String::from_utf8_lossy(&ok.stdout);
    assert!(report.contains("equals the sender:     YES"), "{report}");
    let diverged = run(&["--no-reconcile", "--loss", "0.5"]);
    assert_eq!(diverged.status.code(), Some(1));
    let bad = run(&["--loss", "2"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--loss"));
}

#[test]
fn the_many_accounts_demo_converges_every_account_on_both_backends() {
    let pg = TestDb::new(Backend::Postgres);
    for database in [None, Some(pg.url.as_str())] {
        let mut cmd = bin();
        cmd.args(["demo", "--accounts", "12", "--json"]);
        if let Some(url) = database {
            cmd.args(["--database", url]);
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{database:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // 12 accounts x (8 customers + 3 products), the same ids in every account.
        assert_eq!(r["objects"], 132, "{r}");
        assert_eq!(r["rows"], 132, "{r}");
        assert_eq!(r["diverged_at_end"], 0, "{r}");
        // The late account's deliveries were ignored until it was added.
        assert!(r["answers"]["ignored"].as_u64().unwrap() > 0, "{r}");
        // customers, products and the event catch-up of every account.
        let runs: i64 = r["runs"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_i64().unwrap())
            .sum();
        assert_eq!(runs, 36, "{r}");
    }
    let refused = bin()
        .args(["demo", "--accounts", "3", "--orders", "10"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}

#[test]
fn a_database_password_in_the_url_query_never_shows_in_any_output() {
    let db = TestDb::new(Backend::Postgres);
    // Trust authentication ignores the password; libpq accepts it as a parameter.
    let url = format!("{}?sslmode=disable&password=S3cr3tPw-in-query", db.url);
    let mut seen = String::new();
    for args in [
        &["check-config"][..],
        &["migrate"],
        &["status"],
        &["status", "--json"],
        &["prune"],
    ] {
        let out = bin()
            .args(args)
            .env("WEBHOOK_RECONCILER__DATABASE__URL", &url)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    assert!(
        seen.contains("password=***"),
        "check-config shows the redacted URL: {seen}"
    );
    assert!(!seen.contains("S3cr3tPw"), "{seen}");

    // An unreachable server: the error names the server, not the password.
    let out = bin()
        .arg("migrate")
        .env(
            "WEBHOOK_RECONCILER__DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/none?password=S3cr3tPw-in-query",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("S3cr3tPw"), "{err}");
}

#[test]
fn config_prints_the_preset_merged_under_written_keys_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "[database]\nurl = \"postgres://app:db-pass-123@127.0.0.1/x\"\n\
         [sources.stripe]\npreset = \"stripe\"\napi_token = \"sk_live_do_not_print\"\n\
         [sources.stripe.webhook]\nsecrets = [\"whsec_do_not_print\"]\n\
         [sources.stripe.kinds.customer]\nget = \"/v1/customers/{id}?expand[]=tax\"\n",
    );
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("config")
        .env(
            "WEBHOOK_RECONCILER__SOURCES__STRIPE__REQUESTS_PER_SECOND",
            "7",
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let printed: toml::Table = toml::from_str(&text).unwrap();
    let stripe = &printed["sources"]["stripe"];
    assert_eq!(
        stripe["webhook"]["scheme"].as_str(),
        Some("stripe"),
        "from the preset"
    );
    assert_eq!(
        stripe["requests_per_second"]
            .as_integer()
            .or(stripe["requests_per_second"].as_float().map(|f| f as i64)),
        Some(7),
        "the environment wins"
    );
    assert_eq!(
        stripe["kinds"]["customer"]["get"].as_str(),
        Some("/v1/customers/{id}?expand[]=tax"),
        "the file wins"
    );
    assert_eq!(
        stripe["kinds"]["customer"]["version_from"].as_str(),
        Some("response_date")
    );
    assert!(
        stripe["kinds"]["refund"]["events"]
            .get("refund.created")
            .is_some()
    );
    for secret in ["db-pass-123", "sk_live_do_not_print", "whsec_do_not_print"] {
        assert!(!text.contains(secret), "{secret} printed:\n{text}");
    }
    // An invalid configuration is refused as by every other command.
    let bad = write_config(dir.path(), "[sources.s]\npreset = \"paypal\"\n");
    let out = bin()
        .arg("--config")
        .arg(&bad)
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sources.s.preset"));
}

/// Every form of password libpq accepts in a URL, and `database.password`: never in the
/// output of `check-config`, `config`, or `serve` failing to connect.
#[test]
fn no_database_password_is_printed_by_any_command() {
    let port = crate::helpers::process::free_port();
    for (url, extra, secret) in [
        (
            format!("postgres://u:PW1_ab?cd@127.0.0.1:{port}/db"),
            "",
            "PW1_ab",
        ),
        (
            format!("postgres://u:p%40ssWd9@127.0.0.1:{port}/db"),
            "",
            "ssWd9",
        ),
        (
            format!("postgres://u@127.0.0.1:{port}/db?pass%77ord=Zq7secret"),
            "",
            "Zq7secret",
        ),
        (
            format!("postgres://u@127.0.0.1:{port}/db"),
            "password = \"Vx9fromref\"\n",
            "Vx9fromref",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_config(
            dir.path(),
            &format!(
                "[database]\nurl = \"{url}\"\n{extra}acquire_timeout = \"1s\"\n[http]\nlisten = \"127.0.0.1:0\"\n[sources.shop.webhook]\nsecrets = [\"0123456789abcdef0123\"]\n"
            ),
        );
        for command in [&["check-config"][..], &["config"], &["serve"], &["status"]] {
            let out = bin()
                .arg("--config")
                .arg(&cfg)
                .args(command)
                .output()
                .unwrap();
            let shown = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !shown.contains(secret),
                "{command:?} printed the password of {url}:\n{shown}"
            );
        }
    }
}

/// The README's first check, on a database nobody migrated: every command that needs
/// the schema exits 2 saying what to run, once; a dry run creates nothing, not even the
/// SQLite file.
#[test]
fn commands_that_need_the_schema_say_to_migrate_and_a_dry_run_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite_file = dir.path().join("never.db");
    let pg = TestDb::new(Backend::Postgres);
    for url in [
        format!("sqlite://{}", sqlite_file.display()),
        pg.url.clone(),
    ] {
        let cfg = write_config(dir.path(), &crate::helpers::config_toml(&url, ""));
        for args in [
            &["reconcile", "--dry-run"][..],
            &["status"],
            &["prune"],
            &["changes", "--limit", "1"],
        ] {
            let out = bin().arg("--config").arg(&cfg).args(args).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} on {url}: {err}");
            assert!(
                err.contains("run `webhook-reconciler migrate` (or start `serve`)"),
                "{err}"
            );
            assert_eq!(err.matches("migrate`").count(), 1, "said once: {err}");
            assert!(!sqlite_file.exists(), "{args:?} created {sqlite_file:?}");
        }
    }
    // Nothing was written on PostgreSQL either: not even diesel's migrations table.
    assert_eq!(
        pg.count("information_schema.tables WHERE table_schema = 'public'"),
        0
    );
}

/// What the package installs: its configuration passes `check-config` as it is, with no
/// credentials and nothing in the environment, and no unit sets a variable that would
/// override the file (a unit that set the database URL once made every host run on a
/// private SQLite file whatever config.toml said).
#[test]
fn the_installed_configuration_is_valid_as_installed_and_no_unit_overrides_it() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = bin()
        .args(["--config", "config/webhook-reconciler.toml", "check-config"])
        .current_dir(root)
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for unit in std::fs::read_dir(format!("{root}/systemd")).unwrap() {
        let path = unit.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                !line.contains("WEBHOOK_RECONCILER"),
                "{path:?} overrides the configuration: {line}"
            );
            assert!(
                !line.starts_with("LoadCredential="),
                "{path:?} names a source's credential; they belong in a drop-in: {line}"
            );
        }
    }
}

#[test]
fn secret_new_prints_a_fresh_key_that_a_consumer_accepts() {
    let make = || {
        let out = bin().args(["secret", "new"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (a, b) = (make(), make());
    assert_ne!(a, b);
    assert!(a.starts_with("whsec_") && a.len() == 6 + 44, "{a}");
    let c = webhook_reconciler::config::Config::from_toml_str(&format!(
        "[consumers.app]\nurl = \"http://127.0.0.1:9/x\"\nsecret = \"{a}\"\n"
    ))
    .unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // --raw: 32 random bytes in base64, what accounts.key takes.
    let out = bin().args(["secret", "new", "--raw"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let raw = String::from_utf8(out.stdout).unwrap();
    assert!(!raw.starts_with("whsec_"));
    webhook_reconciler::credential::AccountsKey::from_base64(&raw).unwrap();
}

#[test]
fn the_man_pages_and_completions_include_the_operators_commands() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["man", "--dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    for page in [
        "webhook-reconciler-dead-letters-retry.1",
        "webhook-reconciler-explain.1",
        "webhook-reconciler-consumers-rewind.1",
        "webhook-reconciler-reconcile-pause.1",
    ] {
        assert!(dir.path().join(page).exists(), "{page}");
    }
    let out = bin().args(["completions", "bash"]).output().unwrap();
    let script = String::from_utf8_lossy(&out.stdout);
    for word in [
        "dead-letters",
        "explain",
        "consumers",
        "rewind",
        "pause",
        "resume",
    ] {
        assert!(script.contains(word), "{word}");
    }
}

/// A password with a raw `/` or `@` in the URL: libpq's own message quotes a cut piece
/// of it (as a port, as a host name); no piece of it is printed.
#[test]
fn no_piece_of_a_badly_written_database_password_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    for (url, pieces) in [
        (
            "postgres://u:SeCr3t8/xyz@127.0.0.1:5432/db",
            ["SeCr3t", "xyz"],
        ),
        ("postgres://u:Se@Cr3tTail@127.0.0.1:1/db", ["Cr3t", "Tail"]),
    ] {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, format!("[database]\nurl = \"{url}\"\n")).unwrap();
        let out = bin()
            .arg("--config")
            .arg(&cfg)
            .arg("migrate")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("PostgreSQL"), "{err}");
        for piece in pieces {
            assert!(!err.contains(piece), "{piece:?} printed: {err}");
        }
    }
}

/// Which configuration a command reads is said: `check-config` names the file, whether
/// given by `--config` or by `$WEBHOOK_RECONCILER_CONFIG` (without either, the installed
/// /etc/webhook-reconciler/config.toml when it exists); an error in it names the file.
#[test]
fn check_config_names_the_file_it_read_and_an_error_names_it_too() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[http]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let out = bin()
        .arg("check-config")
        .env("WEBHOOK_RECONCILER_CONFIG", &good)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("file:     {}", good.display())),
        "{text}"
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[http]\nmax_in_flight = 0\n").unwrap();
    let out = bin()
        .arg("--config")
        .arg(&bad)
        .arg("check-config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(err.contains("http.max_in_flight"), "{err}");
}

/// `config` prints what is in effect, a preset's account keys included.
#[test]
fn config_prints_the_keys_a_preset_fills_for_many_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[sources.stripe]\npreset = \"stripe\"\napi_token = \"sk_test_0123456789\"\n[sources.stripe.webhook]\nsecrets = [\"whsec_c3RyaXBlLXNpbXVsYXRvci1zZWNyZXQ\"]\n[sources.stripe.accounts]\n",
    )
    .unwrap();
    let out = bin()
        .arg("--config")
        .arg(&cfg)
        .arg("config")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in [
        "from = \"/account\"",
        "header = \"Stripe-Account\"",
        "api_bases = [\"https://api.stripe.com/\"]",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    assert!(!text.contains("sk_test_0123456789"), "{text}");
}

/// A command resolves only the secrets it uses: from a shell, without the unit's
/// `$CREDENTIALS_DIRECTORY`, `status` and the lists run; `check-config` and anything
/// that sends or verifies still refuse, naming the secret.
#[test]
fn status_and_the_lists_need_no_secret_but_check_config_names_each_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[database]\nurl = \"sqlite://{}\"\n\n[http]\nadmin_token = {{ file = \"$CREDENTIALS_DIRECTORY/admin-token\" }}\n\n[accounts]\nkey = {{ file = \"$CREDENTIALS_DIRECTORY/accounts.key\" }}\n\n[sources.stripe]\npreset = \"stripe\"\napi_token = {{ file = \"$CREDENTIALS_DIRECTORY/stripe-api-key\" }}\n[sources.stripe.webhook]\nsecrets = [{{ file = \"$CREDENTIALS_DIRECTORY/stripe-webhook-secret\" }}]\n[sources.stripe.accounts]\n\n[consumers.app]\nurl = \"http://127.0.0.1:9/changes\"\nsecret = {{ file = \"$CREDENTIALS_DIRECTORY/app-secret\" }}\n",
        dir.path().join("db.sqlite").display()
    );
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, toml).unwrap();
    let run = |args: &[&str]| {
        let out = bin()
            .arg("--config")
            .arg(&cfg)
            .args(args)
            .env_remove("CREDENTIALS_DIRECTORY")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, _, err) = run(&["check-config"]);
    assert_eq!(code, Some(2), "{err}");
    for key in [
        "http.admin_token",
        "accounts.key",
        "sources.stripe.api_token",
        "consumers.app.secret",
    ] {
        assert!(err.contains(key), "{key}: {err}");
    }
    // `migrate` is not among them: without the secrets, refused too.
    let (code, _, err) = run(&["migrate"]);
    assert_eq!(code, Some(2), "{err}");
    // The schema, made with a configuration that names no secret.
    let url = format!("sqlite://{}", dir.path().join("db.sqlite").display());
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, format!("[database]\nurl = \"{url}\"\n")).unwrap();
    let out = bin()
        .arg("--config")
        .arg(&plain)
        .arg("migrate")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for args in [
        &["status"][..],
        &["consumers", "list"],
        &["dead-letters", "list"],
        &["accounts", "list", "stripe"],
        &["explain", "stripe", "customer", "cus_1"],
    ] {
        let (code, out, err) = run(args);
        assert!(
            matches!(code, Some(0 | 1)),
            "{args:?} exited {code:?}: {out}{err}"
        );
        assert!(!err.contains("CREDENTIALS_DIRECTORY"), "{args:?}: {err}");
    }
}

//! Configuration tests: secrets in messages, version bounds, switching a preset's
//! catch-up off.

use super::*;

#[test]
fn a_drivers_error_shows_no_piece_of_the_password_however_the_url_cut_it() {
    use crate::config::redact_secrets_in;
    // An unencoded `/` cut the password: libpq shows its start as a port.
    let url = "postgres://u:SeCr3t8/xyz@127.0.0.1:5432/db";
    let shown = redact_secrets_in(
        "invalid integer value \"SeCr3t8\" for connection option \"port\"",
        url,
    );
    assert!(!shown.contains("SeCr3t"), "{shown}");
    assert!(shown.contains("connection option \"port\""), "{shown}");
    // A raw `@` in it: libpq shows its tail as a host name.
    let url = "postgres://u:Se@Cr3tTail@127.0.0.1:1/db";
    let shown = redact_secrets_in(
        "could not translate host name \"Cr3tTail@127.0.0.1\" to address",
        url,
    );
    assert!(
        !shown.contains("Cr3t") && !shown.contains("Tail"),
        "{shown}"
    );
    assert!(shown.contains("127.0.0.1"), "{shown}");
    // As a parameter, and a message that names none of it, unchanged.
    let shown = redact_secrets_in("bad password hunter22", "postgres://h/db?password=hunter22");
    assert!(!shown.contains("hunter"), "{shown}");
    assert_eq!(
        redact_secrets_in("connection refused", "postgres://u:pw@h/db"),
        "connection refused"
    );
}

#[test]
fn an_unbounded_integer_version_is_a_warning_and_max_version_is_for_integers_only() {
    let base = "[sources.s]\n[sources.s.webhook]\nsecrets = [\"0123456789abcdef0123\"]\n[sources.s.kinds.k]\n";
    let events =
        "[sources.s.kinds.k.events.\"k.updated\"]\nid = \"/data/id\"\nversion = \"/data/v\"\n";
    let c = Config::from_toml_str(&format!("{base}{events}")).unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.key == "sources.s.kinds.k.max_version"),
        "{:?}",
        c.warnings
    );
    let c = Config::from_toml_str(&format!("{base}max_version = 1000\n{events}")).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let e = Config::from_toml_str(&format!(
        "{base}version_format = \"rfc3339\"\nmax_version = 1000\n{events}"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("sources.s.kinds.k.max_version"), "{e}");
}

#[test]
fn a_presets_catchup_is_switched_off_with_enabled_false_and_an_empty_list_is_refused() {
    let base = "[sources.stripe]\npreset = \"stripe\"\napi_token = \"sk_test_0123456789\"\n[sources.stripe.webhook]\nsecrets = [\"whsec_c3RyaXBlLXNpbXVsYXRvci1zZWNyZXQ\"]\n";
    let on = Config::from_toml_str(base).unwrap();
    assert!(on.sources[0].catchup.is_some());
    let off = Config::from_toml_str(&format!(
        "{base}[sources.stripe.catchup]\nenabled = false\n"
    ))
    .unwrap();
    assert!(off.sources[0].catchup.is_none());
    let e = Config::from_toml_str(&format!("{base}[sources.stripe.catchup]\nlist = \"\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sources.stripe.catchup.list") && e.contains("enabled = false"),
        "{e}"
    );
}

const STRIPE: &str = "[sources.stripe]\npreset = \"stripe\"\napi_token = \"sk_test_x\"\n[sources.stripe.webhook]\nsecrets = [\"whsec_0123456789abcdefghij\"]\n";

fn view_of<'a>(c: &'a Config, kind: &str) -> Option<&'a TypedView> {
    c.sources[0]
        .kinds
        .iter()
        .find(|k| k.name == kind)
        .and_then(|k| k.view.as_ref())
}

#[test]
fn a_kinds_columns_are_checked_and_each_refusal_names_its_key() {
    let c = |extra: &str| Config::from_toml_str(&format!("{STRIPE}{extra}")).map(|_| ());
    for (extra, key, says) in [
        (
            "[sources.stripe.kinds.invoice.columns]\n\"Amount\" = \"/amount\"\n",
            "columns.Amount",
            "not a column name",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\n\"a;b\" = \"/amount\"\n",
            "columns.a;b",
            "not a column name",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nid = \"/id\"\n",
            "columns.id",
            "fixed columns",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nupdated_at = \"/x\"\n",
            "columns.updated_at",
            "fixed columns",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = { pointer = \"/x\", type = \"integer\" }\n",
            "columns.x.type",
            "bigint",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = { pointer = \"/x\", format = \"unix\" }\n",
            "columns.x.format",
            "timestamptz",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = { pointer = \"/x\", type = \"timestamptz\", format = \"iso\" }\n",
            "columns.x.format",
            "unix_ms",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = \"x\"\n",
            "columns.x",
            "JSON pointer",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = \"/a\\\"b\"\n",
            "columns.x",
            "double quote",
        ),
        (
            "[sources.stripe.kinds.invoice.columns]\nx = true\n",
            "columns.x",
            "`true`",
        ),
        (
            "[sources.stripe.kinds.invoice]\nindexes = [\"nope\"]\n",
            "indexes[0]",
            "not a column",
        ),
        (
            "[sources.stripe.kinds.invoice]\nview = \"resources\"\n",
            "invoice.view",
            "name of a table",
        ),
        (
            "[sources.stripe.kinds.invoice]\nview = \"Invoices\"\n",
            "invoice.view",
            "not a view name",
        ),
        (
            "[sources.stripe.kinds.charge]\nview = \"stripe_invoice\"\n",
            "view",
            "already the view",
        ),
    ] {
        let err = c(extra).expect_err(extra).to_string();
        assert!(err.contains(key) && err.contains(says), "{extra}: {err}");
    }
    // A pointer holding a quote or a semicolon is only a key.
    c("[sources.stripe.kinds.invoice.columns]\nodd = \"/it's; DROP TABLE resources\"\n").unwrap();
}

#[test]
fn the_presets_columns_are_declared_switched_off_and_renamed_and_config_prints_them() {
    let c = Config::from_toml_str(STRIPE).unwrap();
    let invoice = view_of(&c, "invoice").unwrap();
    assert_eq!(invoice.name, "stripe_invoice");
    let names: Vec<&str> = invoice.columns.iter().map(|c| c.name.as_str()).collect();
    for n in ["customer", "status", "amount_due"] {
        assert!(names.contains(&n), "{names:?}");
    }
    assert_eq!(invoice.indexes, ["customer", "status"]);
    let amount = invoice
        .columns
        .iter()
        .find(|c| c.name == "amount_due")
        .unwrap();
    assert_eq!(amount.ty, ColumnType::Bigint);
    assert!(
        view_of(&c, "refund").is_none(),
        "a kind without columns has no view"
    );

    // `status` off (its index with it), renamed `invoice_status`; the view renamed.
    let c = Config::from_toml_str(&format!(
        "{STRIPE}[sources.stripe.kinds.invoice]\nview = \"invoices\"\n[sources.stripe.kinds.invoice.columns]\nstatus = false\ninvoice_status = \"/status\"\n"
    ))
    .unwrap();
    let invoice = view_of(&c, "invoice").unwrap();
    assert_eq!(invoice.name, "invoices");
    assert!(invoice.columns.iter().all(|c| c.name != "status"));
    assert!(
        invoice
            .columns
            .iter()
            .any(|c| c.name == "invoice_status" && c.path == ["status"])
    );
    assert_eq!(invoice.indexes, ["customer"]);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, STRIPE).unwrap();
    let printed = Config::effective_toml(Some(&path)).unwrap();
    assert!(
        printed.contains("[sources.stripe.kinds.invoice.columns]")
            && printed.contains("amount_due"),
        "{printed}"
    );
}

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

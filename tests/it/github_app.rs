//! A GitHub App's installation tokens against the simulated GitHub: the JWT GitHub
//! verifies with the App's public key, one exchange per installation while its token is
//! good (concurrent callers share it), a new one near expiry, and clear errors that
//! never show a token.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::encoding::{AsDer, Pkcs8V1Der, PublicKeyX509Der};
use aws_lc_rs::rsa::{KeyPair, KeySize};
use aws_lc_rs::signature::KeyPair as _;
use base64::Engine;
use secrecy::{ExposeSecret, SecretString};
use webhook_reconciler::sender::github_app::{AppTokenError, AppTokens};
use webhook_reconciler::simulator::providers::{Provider, ProviderSim};

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// A fresh RSA key pair: (private PEM, public PEM).
pub(crate) fn app_key() -> (SecretString, String) {
    let pair = KeyPair::generate(KeySize::Rsa2048).unwrap();
    let private: Pkcs8V1Der = pair.as_der().unwrap();
    let public: PublicKeyX509Der = pair.public_key().as_der().unwrap();
    (
        SecretString::from(pem("PRIVATE KEY", private.as_ref())),
        pem("PUBLIC KEY", public.as_ref()),
    )
}

async fn github_with_app(lifetime: i64) -> (ProviderSim, SecretString) {
    let sim = ProviderSim::start(Provider::Github, "hook-secret")
        .await
        .unwrap();
    let (private, public) = app_key();
    sim.enable_app("123456", &public, &["42", "43"], lifetime)
        .unwrap();
    (sim, private)
}

fn base(sim: &ProviderSim) -> String {
    format!("http://{}", sim.addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_exchange_per_installation_while_its_token_is_good_shared_by_concurrent_callers() {
    let (sim, private) = github_with_app(3600).await;
    let tokens =
        Arc::new(AppTokens::new("123456", &private, &base(&sim), Duration::from_secs(5)).unwrap());
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let t = tokens.clone();
            tokio::spawn(async move { t.token("42").await.unwrap() })
        })
        .collect();
    let mut seen = Vec::new();
    for c in calls {
        seen.push(c.await.unwrap().expose_secret().to_string());
    }
    let minted = sim.minted_tokens();
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert!(seen.iter().all(|t| *t == minted[0].1));
    // Another installation has its own token.
    let other = tokens.token("43").await.unwrap();
    assert_eq!(sim.minted_tokens().len(), 2);
    assert_ne!(other.expose_secret(), minted[0].1);
    // A token the API refused is forgotten and minted again.
    tokens.forget("42");
    tokens.token("42").await.unwrap();
    assert_eq!(sim.minted_tokens().len(), 3);
}

#[tokio::test]
async fn a_token_near_its_expiry_is_replaced() {
    // GitHub's tokens live an hour; these 4 minutes, inside the 5-minute margin.
    let (sim, private) = github_with_app(240).await;
    let tokens = AppTokens::new("123456", &private, &base(&sim), Duration::from_secs(5)).unwrap();
    let a = tokens.token("42").await.unwrap();
    let b = tokens.token("42").await.unwrap();
    assert_ne!(a.expose_secret(), b.expose_secret());
    assert_eq!(sim.minted_tokens().len(), 2);
}

#[tokio::test]
async fn a_wrong_key_an_unknown_installation_or_a_bad_id_is_a_clear_error() {
    let (sim, _) = github_with_app(3600).await;
    let (other_key, _) = app_key();
    let wrong = AppTokens::new("123456", &other_key, &base(&sim), Duration::from_secs(5)).unwrap();
    let e = wrong.token("42").await.unwrap_err().to_string();
    assert!(
        e.contains("401") && e.contains("private key is wrong"),
        "{e}"
    );
    let (sim2, private) = github_with_app(3600).await;
    let tokens = AppTokens::new("123456", &private, &base(&sim2), Duration::from_secs(5)).unwrap();
    let e = tokens.token("99").await.unwrap_err().to_string();
    assert!(
        e.contains("404") && e.contains("no such installation"),
        "{e}"
    );
    assert!(matches!(
        tokens.token("42/../../x").await.unwrap_err(),
        AppTokenError::BadInstallation(_)
    ));
    assert!(sim2.minted_tokens().is_empty());
    let bad = AppTokens::new(
        "123456",
        &SecretString::from("not a key".to_string()),
        &base(&sim2),
        Duration::from_secs(5),
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("private key cannot be read"), "{bad}");
}

/// A GitHub App source with many installations: each installation's reconcile lists
/// with a token minted for that installation (never the App's JWT, never another
/// installation's), and writes its rows under the installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_installation_is_reconciled_with_its_own_minted_token() {
    use crate::helpers::{Backend, TestDb};
    use tokio_util::sync::CancellationToken;
    use webhook_reconciler::reconcile::{RunOptions, RunStatus};

    let (sim, private) = github_with_app(3600).await;
    sim.change("issues", "1", serde_json::json!({"title": "one"}), "opened");
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("app.pem");
    std::fs::write(&key_file, private.expose_secret()).unwrap();
    let db = TestDb::new(Backend::Sqlite);
    let toml = format!(
        r#"
[database]
url = "{}"

[sources.github]
preset = "github"
api_base = "{}"
requests_per_second = 100

[sources.github.webhook]
secrets = ["hook-secret-0123456789"]

[sources.github.reconcile]
cron = "0 0 0 1 1 *"

[sources.github.accounts]
app_id = "123456"
app_key = {{ file = "{}" }}
"#,
        db.url,
        sim.api_base(),
        key_file.display()
    );
    let r = crate::reconcile::reconciler_for(&toml).await;
    let registry =
        webhook_reconciler::accounts::Accounts::new(crate::helpers::handle_on(&db).await);
    registry.add("github", "42", None, None).await.unwrap();
    registry.add("github", "43", None, None).await.unwrap();
    let (s, k) = r
        .kinds(Some("github"), Some("issue"))
        .into_iter()
        .next()
        .map(|(s, k)| (s.clone(), k.clone()))
        .unwrap();
    // No token of its own: the App's installations are its only accounts.
    assert_eq!(
        r.accounts_of(&s).await.unwrap(),
        [
            webhook_reconciler::change::Account::Named("42".into()),
            webhook_reconciler::change::Account::Named("43".into())
        ]
    );
    for installation in ["42", "43"] {
        let report = r
            .run_account_kind(
                &s,
                &k,
                &webhook_reconciler::change::Account::Named(installation.to_string()),
                &RunOptions::default(),
                &CancellationToken::new(),
                &|_| {},
            )
            .await;
        assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    }
    assert_eq!(
        db.count("resources WHERE kind = 'issue' AND account = '42'"),
        1
    );
    assert_eq!(
        db.count("resources WHERE kind = 'issue' AND account = '43'"),
        1
    );
    let minted = sim.minted_tokens();
    let installations: std::collections::BTreeSet<&str> =
        minted.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(installations.into_iter().collect::<Vec<_>>(), ["42", "43"]);
    // Every listing request carried one of the minted installation tokens.
    let credentials = sim.credentials();
    assert!(!credentials.is_empty());
    for c in &credentials {
        let c = c.as_deref().unwrap_or_default();
        assert!(
            minted.iter().any(|(_, t)| c == format!("Bearer {t}")),
            "a request without a minted token: {c}"
        );
    }
}

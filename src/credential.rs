//! An account's credential as kept in the database: sealed with `accounts.key`
//! (ChaCha20-Poly1305 from aws-lc-rs, a fresh random nonce each time), bound to its
//! source, account and API base, so a sealed value copied onto another account's row
//! does not open there, and neither does one whose base was changed afterwards (in the
//! database, or by a call that did not bring the credential again): a credential is
//! never sent anywhere but where it was given for. The plain credential never leaves
//! this module except as a [`SecretString`]; its sealed form says nothing of it but its
//! length.

use aws_lc_rs::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use secrecy::{ExposeSecret, SecretString};

/// The sealed form's version prefix: a later binding or cipher gets another. `v2`: bound
/// to the base too.
const PREFIX: &str = "v2.";
/// The first form, bound to source and account only: it opens only for an account with
/// no base of its own (whose requests go where the configuration says); `accounts
/// rekey` re-seals it as `v2`.
const PREFIX_V1: &str = "v1.";

/// Why a credential could not be sealed or opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialError {
    /// `accounts.key` is not 32 bytes in base64.
    #[error(
        "accounts.key must be 32 random bytes in base64 (make one: webhook-reconciler secret new --raw); {0}"
    )]
    BadKey(String),
    /// The stored value is not a sealed credential of this version.
    #[error(
        "the stored credential is not in the sealed form (v1.); it was written by something else"
    )]
    Malformed,
    /// The key is not the one it was sealed with, the value was altered, or it belongs
    /// to another source, account or base.
    #[error(
        "the stored credential does not open with accounts.key (another key, copied from another account, or its api_base changed since it was given: give it again with `accounts set`)"
    )]
    WrongKey,
    /// Sealed before credentials were bound to their base, on an account with a base.
    #[error(
        "the stored credential was sealed by an earlier version, not bound to the account's api_base; run `webhook-reconciler accounts rekey` once (it re-seals every credential bound to its base)"
    )]
    Unbound,
    #[error("the system's random source failed")]
    Random,
}

/// `accounts.key`: the key every account credential is sealed with.
pub struct AccountsKey(LessSafeKey);

impl std::fmt::Debug for AccountsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccountsKey([redacted])")
    }
}

impl AccountsKey {
    /// From the configured value: 32 bytes, base64 (standard or URL-safe).
    pub fn from_base64(value: &str) -> Result<Self, CredentialError> {
        let value = value.trim();
        let bytes = STANDARD
            .decode(value)
            .or_else(|_| URL_SAFE_NO_PAD.decode(value.trim_end_matches('=')))
            .map_err(|_| CredentialError::BadKey("it is not base64".into()))?;
        if bytes.len() != 32 {
            return Err(CredentialError::BadKey(format!(
                "it decodes to {} bytes",
                bytes.len()
            )));
        }
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| CredentialError::BadKey("the cipher refused it".into()))?;
        Ok(Self(LessSafeKey::new(key)))
    }

    /// The sealed form of `credential` for `account` of `source` at `base` (`None`: the
    /// account has no base of its own).
    pub fn seal(
        &self,
        source: &str,
        account: &str,
        base: Option<&str>,
        credential: &SecretString,
    ) -> Result<String, CredentialError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| CredentialError::Random)?;
        let bound = aad(source, account, Some(base.unwrap_or("")));
        self.seal_as(PREFIX, &bound, nonce, credential.expose_secret())
    }

    /// `plain` sealed under `nonce` and bound to `bound`, written with `prefix`.
    fn seal_as(
        &self,
        prefix: &str,
        bound: &[u8],
        nonce: [u8; NONCE_LEN],
        plain: &str,
    ) -> Result<String, CredentialError> {
        let mut in_out = plain.as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(bound),
                &mut in_out,
            )
            .map_err(|_| CredentialError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&in_out);
        Ok(format!("{prefix}{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// The credential sealed in `stored` for `account` of `source` at `base`.
    pub fn open(
        &self,
        source: &str,
        account: &str,
        base: Option<&str>,
        stored: &str,
    ) -> Result<SecretString, CredentialError> {
        let (body, bound) = if let Some(b) = stored.strip_prefix(PREFIX) {
            (b, Some(base.unwrap_or("")))
        } else if let Some(b) = stored.strip_prefix(PREFIX_V1) {
            if base.is_some() {
                return Err(CredentialError::Unbound);
            }
            (b, None)
        } else {
            return Err(CredentialError::Malformed);
        };
        let raw = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| CredentialError::Malformed)?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(CredentialError::Malformed);
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce =
            Nonce::try_assume_unique_for_key(nonce).map_err(|_| CredentialError::Malformed)?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(aad(source, account, bound)), &mut in_out)
            .map_err(|_| CredentialError::WrongKey)?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| CredentialError::WrongKey)?;
        Ok(SecretString::from(text))
    }
}

/// The keys a credential opens with: `accounts.key`, and while a rekey is under way
/// `accounts.previous_key` (what was sealed before the key changed).
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    pub key: &'a AccountsKey,
    pub previous: Option<&'a AccountsKey>,
}

impl Keys<'_> {
    /// As [`Keys::open`], and a `v1` credential (bound to no base) whatever the base:
    /// only `accounts rekey`, which re-seals it bound to the base it has now.
    pub fn open_any_form(
        &self,
        source: &str,
        account: &str,
        base: Option<&str>,
        stored: &str,
    ) -> Result<SecretString, CredentialError> {
        let base = if stored.starts_with(PREFIX_V1) {
            None
        } else {
            base
        };
        self.open(source, account, base, stored)
    }

    /// The credential sealed in `stored`, opened with the key or else the previous key.
    pub fn open(
        &self,
        source: &str,
        account: &str,
        base: Option<&str>,
        stored: &str,
    ) -> Result<SecretString, CredentialError> {
        match (self.key.open(source, account, base, stored), self.previous) {
            (Err(CredentialError::WrongKey), Some(previous)) => {
                previous.open(source, account, base, stored)
            }
            (r, _) => r,
        }
    }
}

/// What a sealed credential is bound to: its source, account and (`v2`) base (NUL never
/// occurs in any: ids are checked for it, and a URL cannot carry it).
fn aad(source: &str, account: &str, base: Option<&str>) -> Vec<u8> {
    match base {
        None => format!("webhook-reconciler/credential/v1\0{source}\0{account}").into_bytes(),
        Some(base) => {
            format!("webhook-reconciler/credential/v2\0{source}\0{account}\0{base}").into_bytes()
        }
    }
}

/// A new `accounts.key`: 32 random bytes in base64.
pub fn new_key() -> Result<String, CredentialError> {
    let mut key = [0u8; 32];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| CredentialError::Random)?;
    Ok(STANDARD.encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> AccountsKey {
        AccountsKey::from_base64(&new_key().unwrap()).unwrap()
    }

    const SHOP: &str = "a.myshopify.com";
    const BASE: Option<&str> = Some("https://a.myshopify.com/admin/api/2025-01");

    #[test]
    fn a_sealed_credential_opens_only_with_its_key_source_account_and_base() {
        let k = key();
        let token = SecretString::from("shpat_0123456789abcdef".to_string());
        let sealed = k.seal("shopify", SHOP, BASE, &token).unwrap();
        assert!(sealed.starts_with("v2.") && !sealed.contains("shpat"));
        let opened = k.open("shopify", SHOP, BASE, &sealed).unwrap();
        assert_eq!(opened.expose_secret(), "shpat_0123456789abcdef");
        // Sealed twice, two different forms (a fresh nonce each time).
        assert_ne!(sealed, k.seal("shopify", SHOP, BASE, &token).unwrap());
        // Another account's row, another source, another base (or none), another key.
        for (source, account, base) in [
            ("shopify", "b.myshopify.com", BASE),
            ("other", SHOP, BASE),
            (
                "shopify",
                SHOP,
                Some("https://evil.example/admin/api/2025-01"),
            ),
            ("shopify", SHOP, None),
        ] {
            assert_eq!(
                k.open(source, account, base, &sealed).unwrap_err(),
                CredentialError::WrongKey,
                "{source} {account} {base:?}"
            );
        }
        assert_eq!(
            key().open("shopify", SHOP, BASE, &sealed).unwrap_err(),
            CredentialError::WrongKey
        );
        // Sealed without a base, it does not open for a base set later.
        let bare = k.seal("shopify", SHOP, None, &token).unwrap();
        assert!(k.open("shopify", SHOP, None, &bare).is_ok());
        assert_eq!(
            k.open("shopify", SHOP, BASE, &bare).unwrap_err(),
            CredentialError::WrongKey
        );
        // One bit of the ciphertext flipped (in the bytes: the last base64 character
        // may carry only padding bits, which a decoder refuses as malformed).
        let mut raw = URL_SAFE_NO_PAD.decode(&sealed[3..]).unwrap();
        raw[NONCE_LEN + 2] ^= 1;
        let altered = format!("v2.{}", URL_SAFE_NO_PAD.encode(raw));
        assert_eq!(
            k.open("shopify", SHOP, BASE, &altered).unwrap_err(),
            CredentialError::WrongKey
        );
        for bad in ["", "v2.", "v2.!!", "shpat_0123456789abcdef", "v3.AAAA"] {
            assert_eq!(
                k.open("shopify", SHOP, BASE, bad).unwrap_err(),
                CredentialError::Malformed,
                "{bad:?}"
            );
        }
    }

    /// A `v1` value (bound to source and account only), as the earlier version sealed it.
    fn seal_v1(k: &AccountsKey, source: &str, account: &str, plain: &str) -> String {
        k.seal_as(
            PREFIX_V1,
            &aad(source, account, None),
            [3u8; NONCE_LEN],
            plain,
        )
        .unwrap()
    }

    #[test]
    fn an_earlier_unbound_credential_opens_only_for_an_account_without_a_base() {
        let k = key();
        let v1 = seal_v1(&k, "stripe", "acct_1", "sk_test_x");
        assert_eq!(
            k.open("stripe", "acct_1", None, &v1)
                .unwrap()
                .expose_secret(),
            "sk_test_x"
        );
        let e = k
            .open("stripe", "acct_1", Some("https://api.stripe.com"), &v1)
            .unwrap_err();
        assert_eq!(e, CredentialError::Unbound);
        assert!(e.to_string().contains("accounts rekey"), "{e}");
    }

    #[test]
    fn the_key_must_be_32_bytes_of_base64_and_never_shows_in_debug() {
        assert!(matches!(
            AccountsKey::from_base64("not base64!").unwrap_err(),
            CredentialError::BadKey(_)
        ));
        let short = STANDARD.encode([7u8; 16]);
        let e = AccountsKey::from_base64(&short).unwrap_err().to_string();
        assert!(
            e.contains("16 bytes") && e.contains("secret new --raw"),
            "{e}"
        );
        let value = new_key().unwrap();
        let k = AccountsKey::from_base64(&value).unwrap();
        assert_eq!(format!("{k:?}"), "AccountsKey([redacted])");
        // URL-safe without padding is accepted too.
        let url = URL_SAFE_NO_PAD.encode(STANDARD.decode(&value).unwrap());
        assert!(AccountsKey::from_base64(&url).is_ok());
    }
}

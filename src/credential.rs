//! An account's credential as kept in the database: sealed with `accounts.key`
//! (ChaCha20-Poly1305 from aws-lc-rs, a fresh random nonce each time), bound to its
//! source and account, so a sealed value copied onto another account's row does not
//! open there. The plain credential never leaves this module except as a
//! [`SecretString`]; its sealed form says nothing of it but its length.

use aws_lc_rs::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use secrecy::{ExposeSecret, SecretString};

/// The sealed form's version prefix: a later key or cipher gets another.
const PREFIX: &str = "v1.";

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
    /// to another source or account.
    #[error(
        "the stored credential does not open with accounts.key (another key, or copied from another account)"
    )]
    WrongKey,
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

    /// The sealed form of `credential` for `account` of `source`.
    pub fn seal(
        &self,
        source: &str,
        account: &str,
        credential: &SecretString,
    ) -> Result<String, CredentialError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| CredentialError::Random)?;
        let mut in_out = credential.expose_secret().as_bytes().to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(source, account)),
                &mut in_out,
            )
            .map_err(|_| CredentialError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&in_out);
        Ok(format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// The credential sealed in `stored` for `account` of `source`.
    pub fn open(
        &self,
        source: &str,
        account: &str,
        stored: &str,
    ) -> Result<SecretString, CredentialError> {
        let raw = stored
            .strip_prefix(PREFIX)
            .and_then(|b| URL_SAFE_NO_PAD.decode(b).ok())
            .ok_or(CredentialError::Malformed)?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(CredentialError::Malformed);
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce =
            Nonce::try_assume_unique_for_key(nonce).map_err(|_| CredentialError::Malformed)?;
        let mut in_out = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(aad(source, account)), &mut in_out)
            .map_err(|_| CredentialError::WrongKey)?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| CredentialError::WrongKey)?;
        Ok(SecretString::from(text))
    }
}

/// What a sealed credential is bound to: its source and account (NUL never occurs in
/// either: ids are checked for it).
fn aad(source: &str, account: &str) -> Vec<u8> {
    format!("webhook-reconciler/credential/v1\0{source}\0{account}").into_bytes()
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

    #[test]
    fn a_sealed_credential_opens_only_with_its_key_source_and_account() {
        let k = key();
        let token = SecretString::from("shpat_0123456789abcdef".to_string());
        let sealed = k.seal("shopify", "a.myshopify.com", &token).unwrap();
        assert!(sealed.starts_with("v1.") && !sealed.contains("shpat"));
        let opened = k.open("shopify", "a.myshopify.com", &sealed).unwrap();
        assert_eq!(opened.expose_secret(), "shpat_0123456789abcdef");
        // Sealed twice, two different forms (a fresh nonce each time).
        assert_ne!(
            sealed,
            k.seal("shopify", "a.myshopify.com", &token).unwrap()
        );
        // Another account's row, another source, another key, an altered byte.
        assert_eq!(
            k.open("shopify", "b.myshopify.com", &sealed).unwrap_err(),
            CredentialError::WrongKey
        );
        assert_eq!(
            k.open("other", "a.myshopify.com", &sealed).unwrap_err(),
            CredentialError::WrongKey
        );
        assert_eq!(
            key()
                .open("shopify", "a.myshopify.com", &sealed)
                .unwrap_err(),
            CredentialError::WrongKey
        );
        // One bit of the ciphertext flipped (in the bytes: the last base64 character
        // may carry only padding bits, which a decoder refuses as malformed).
        let mut raw = URL_SAFE_NO_PAD.decode(&sealed[3..]).unwrap();
        raw[NONCE_LEN + 2] ^= 1;
        let altered = format!("v1.{}", URL_SAFE_NO_PAD.encode(raw));
        assert_eq!(
            k.open("shopify", "a.myshopify.com", &altered).unwrap_err(),
            CredentialError::WrongKey
        );
        for bad in ["", "v1.", "v1.!!", "shpat_0123456789abcdef", "v2.AAAA"] {
            assert_eq!(
                k.open("shopify", "a.myshopify.com", bad).unwrap_err(),
                CredentialError::Malformed,
                "{bad:?}"
            );
        }
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

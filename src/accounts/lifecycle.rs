//! The registry's own rules, below every caller: the one removal sequence
//! ([`unregister`]: `accounts remove`, the admin API and Shopify's `shop/redact`) and
//! what an account id may be ([`account_id_rule`]). The operator's door to accounts is
//! `operations::accounts`.

use super::Accounts;
use crate::db::DbError;
use crate::store::Store;

/// What `unregister` did to the account's rows.
#[derive(Debug, serde::Serialize)]
pub struct Removed {
    pub rows: usize,
    pub purged: bool,
}

/// The one removal sequence (`accounts remove`, the admin API, Shopify's `shop/redact`):
/// disabled first (no delivery writes a row of it meanwhile), its rows tombstoned (changes
/// appended) or, with `purge`, erased (`Store::purge_account`), its schedule and last
/// successes forgotten, unregistered last (a failure halfway leaves it disabled, and
/// removing again finishes the job). `None`: it was not registered.
pub async fn unregister(
    store: &Store,
    source: &str,
    account: &str,
    purge: bool,
) -> Result<Option<Removed>, DbError> {
    let registry = Accounts::new(store.db().clone());
    if !registry.set_enabled(source, account, false).await? {
        return Ok(None);
    }
    let rows = if purge {
        store.purge_account(source, account).await?
    } else {
        store.tombstone_account(source, account).await?
    };
    crate::bookkeeping::Bookkeeping::new(store.db().clone())
        .forget_account(source, account)
        .await?;
    registry.remove(source, account).await?;
    Ok(Some(Removed {
        rows,
        purged: purge,
    }))
}

/// Whether `account` may be registered: an id (non-empty, at most 1,024 bytes, no NUL),
/// never carrying `/ ? # @ :`, whitespace or a control character (an account id goes
/// into URLs, `https://{account}/...` for Shopify, and must never steer a request, or a
/// credential, to another host), and of its preset's shape: Stripe `acct_` and letters
/// or digits, Shopify a host name ending in `.myshopify.com`, GitHub digits.
pub fn account_id_rule(preset: Option<crate::config::Preset>, account: &str) -> Result<(), String> {
    use crate::config::Preset;
    crate::change::limits::check_id(account)?;
    if let Some(c) = account
        .chars()
        .find(|c| matches!(c, '/' | '?' | '#' | '@' | ':') || c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "it contains {c:?}; an account id never carries / ? # @ :, whitespace or control characters"
        ));
    }
    let shop_host = |shop: &str| {
        !shop.is_empty()
            && shop
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    };
    let misshapen = match preset {
        None => None,
        Some(Preset::Stripe) => (!account.strip_prefix("acct_").is_some_and(|rest| {
            !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric())
        }))
        .then_some(
            "a Stripe account id is acct_ followed by letters or digits (acct_1Nv0FGQ9RKHgCVdK)",
        ),
        Some(Preset::Shopify) => (!account
            .strip_suffix(".myshopify.com")
            .is_some_and(shop_host))
        .then_some("a Shopify shop is its host name ending in .myshopify.com (acme.myshopify.com)"),
        Some(Preset::Github) => (!account.chars().all(|c| c.is_ascii_digit()))
            .then_some("a GitHub App installation id is digits (4711)"),
    };
    match misshapen {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::account_id_rule;
    use crate::config::Preset;

    #[test]
    fn account_ids_that_could_steer_a_url_or_break_a_presets_shape_are_refused() {
        for (preset, ok) in [
            (Some(Preset::Stripe), "acct_1Nv0FGQ9RKHgCVdK"),
            (Some(Preset::Shopify), "acme.myshopify.com"),
            (Some(Preset::Shopify), "my-shop-2.myshopify.com"),
            (Some(Preset::Github), "4711"),
            (None, "tenant-7"),
        ] {
            assert_eq!(account_id_rule(preset, ok), Ok(()), "{ok}");
        }
        for (preset, bad) in [
            (Some(Preset::Shopify), "evil.com/x?"),
            (Some(Preset::Shopify), "evil.com#.myshopify.com"),
            (Some(Preset::Shopify), "evil.com"),
            (Some(Preset::Shopify), ".myshopify.com"),
            (Some(Preset::Shopify), "user@evil.com"),
            (Some(Preset::Stripe), "acct_"),
            (Some(Preset::Stripe), "acct_../x"),
            (Some(Preset::Stripe), "a"),
            (Some(Preset::Github), "47x"),
            (None, "a b"),
            (None, "host:8080"),
            (None, "line\nbreak"),
            (None, ""),
        ] {
            assert!(account_id_rule(preset, bad).is_err(), "{bad:?}");
        }
    }
}

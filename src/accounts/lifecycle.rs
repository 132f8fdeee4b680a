//! The registry's own rules, below every caller: the one removal sequence
//! ([`unregister`]: `accounts remove`, the admin API and Shopify's `shop/redact`), an
//! uninstall the platform reports ([`uninstall`]), and
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
/// disabled first (no delivery writes a row of it meanwhile), its leases revoked (no run
/// in flight writes another page), its rows tombstoned (changes
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
    if !registry
        .set_enabled(source, account, Some("being removed"))
        .await?
    {
        return Ok(None);
    }
    // A run of the account in flight writes no page after this: none after the rows go.
    let book = crate::bookkeeping::Bookkeeping::new(store.db().clone());
    book.revoke_account_leases(source, account).await?;
    let rows = if purge {
        store.purge_account(source, account).await?
    } else {
        store.tombstone_account(source, account).await?
    };
    book.forget_account(source, account).await?;
    registry.remove(source, account).await?;
    Ok(Some(Removed {
        rows,
        purged: purge,
    }))
}

/// A platform's word that `account` installed the app (GitHub `installation`
/// `created`, Stripe `account.application.authorized`): registered, or enabled again,
/// with the source's own credential (an App-minted token, the platform's key with the
/// account's header; a credential it already has is kept), and its `kinds` due now.
pub async fn register(
    store: &Store,
    source: &str,
    account: &str,
    kinds: Vec<String>,
) -> Result<(), super::AddError> {
    Accounts::new(store.db().clone())
        .add(source, account, None, None)
        .await?;
    crate::bookkeeping::Bookkeeping::new(store.db().clone())
        .due_now(source, account, kinds)
        .await?;
    Ok(())
}

/// A platform's word that `account` is suspended (`disabled_for` the reason: no run, no
/// fetch, rows kept) or resumed (`None`: enabled, its `kinds` due now). False when it is
/// not registered.
pub async fn suspend_or_resume(
    store: &Store,
    source: &str,
    account: &str,
    disabled_for: Option<&str>,
    kinds: Vec<String>,
) -> Result<bool, DbError> {
    let registry = Accounts::new(store.db().clone());
    if !registry.set_enabled(source, account, disabled_for).await? {
        return Ok(false);
    }
    let book = crate::bookkeeping::Bookkeeping::new(store.db().clone());
    match disabled_for {
        Some(_) => book.unschedule_account(source, account).await?,
        None => book.due_now(source, account, kinds).await?,
    }
    Ok(true)
}

/// A platform's word that `account` uninstalled the app (Shopify `app/uninstalled`):
/// disabled with the reason (`accounts list` shows it, and since when), its schedule
/// forgotten (no run, no fetch: its token no longer works), its rows kept until its
/// erasure; `event_id` is recorded as the uninstall a later `shop/redact` may follow.
/// False when it is not registered.
pub async fn uninstall(
    store: &Store,
    source: &str,
    account: &str,
    reason: &str,
    event_id: &str,
) -> Result<bool, DbError> {
    let registry = Accounts::new(store.db().clone());
    if !registry
        .uninstall(source, account, reason, event_id)
        .await?
    {
        return Ok(false);
    }
    crate::bookkeeping::Bookkeeping::new(store.db().clone())
        .unschedule_account(source, account)
        .await?;
    Ok(true)
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

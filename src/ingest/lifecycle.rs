//! The platforms' lifecycle and privacy deliveries (SPEC "Tenants as the platforms run
//! them"), with `accounts.lifecycle` on: GitHub `installation` registers, suspends,
//! resumes and unregisters an installation, Stripe `account.application.*` registers
//! and disables a connected account; Shopify's `app/uninstalled` disables the shop,
//! `shop/redact` erases an uninstalled shop, `customers/redact` erases one customer's
//! rows, `customers/data_request` reaches the application as a change. Each is claimed
//! once and its claim is never pruned (`store::NEVER_PRUNED`).
//!
//! Shopify signs the body, not the `X-Shopify-Topic` header, and a privacy body is the
//! same every time for its shop or customer. So each topic acts only on a body of exactly
//! its shape (a signed body of another topic sent under this one does nothing), and
//! `shop/redact` erases only a shop whose uninstall was seen since its last
//! registration: a captured redact replayed after a reinstall erases nothing. A body
//! that does not qualify is answered `ignored`, is not claimed (so it cannot make a
//! later genuine delivery a duplicate), and the reason is logged.

use serde_json::{Map, Value};

use super::{Ingest, Ingested, Refusal};
use crate::config::Scheme;
use crate::ingest::envelope::Envelope;
use crate::store::{Delivery, Outcome};

/// The Shopify topics handled here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Topic {
    AppUninstalled,
    ShopRedact,
    CustomersRedact,
    CustomersDataRequest,
}

impl Topic {
    pub(super) fn of(event_type: &str) -> Option<Self> {
        Some(match event_type {
            "app/uninstalled" => Self::AppUninstalled,
            "shop/redact" => Self::ShopRedact,
            "customers/redact" => Self::CustomersRedact,
            "customers/data_request" => Self::CustomersDataRequest,
            _ => return None,
        })
    }
}

/// What a platform's lifecycle event does to the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Registry {
    /// Registered (or enabled again), its kinds due now.
    Register,
    /// Disabled for this reason: no run, no fetch, rows kept.
    Disable(&'static str),
    /// Enabled again, its kinds due now.
    Enable,
    /// Unregistered, its rows tombstoned (as `accounts remove`).
    Unregister,
    /// The repositories it covers changed: its kinds due now, and its rows tombstoned
    /// when the repository its base lists was removed from it.
    Repositories,
}

/// The lifecycle events of GitHub Apps and Stripe Connect, by scheme, type and (GitHub)
/// the body's `action`.
pub(super) fn platform_event(
    scheme: &Scheme,
    event_type: &str,
    action: Option<&str>,
) -> Option<Registry> {
    Some(match (scheme, event_type, action) {
        (Scheme::Github, "installation", Some("created")) => Registry::Register,
        (Scheme::Github, "installation", Some("deleted")) => Registry::Unregister,
        (Scheme::Github, "installation", Some("suspend")) => {
            Registry::Disable("installation suspended")
        }
        (Scheme::Github, "installation", Some("unsuspend")) => Registry::Enable,
        (Scheme::Github, "installation_repositories", Some("added" | "removed")) => {
            Registry::Repositories
        }
        (Scheme::Stripe, "account.application.authorized", _) => Registry::Register,
        (Scheme::Stripe, "account.application.deauthorized", _) => {
            Registry::Disable("account.application.deauthorized")
        }
        _ => return None,
    })
}

/// The kind a customer's data request is recorded as: one row per request, id the
/// request's id, state the request's body (the application answers the merchant).
pub const DATA_REQUEST_KIND: &str = "customer_data_request";

/// A body of exactly these top-level keys, each present; else why not.
fn exactly<'a>(doc: &'a Value, keys: &[&str]) -> Result<&'a Map<String, Value>, String> {
    let Some(obj) = doc.as_object() else {
        return Err("the body is not a JSON object".into());
    };
    let mut extra: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !keys.contains(k))
        .collect();
    extra.sort_unstable();
    if !extra.is_empty() {
        return Err(format!(
            "the body has keys this topic never carries: {extra:?}"
        ));
    }
    if let Some(missing) = keys.iter().find(|k| !obj.contains_key(**k)) {
        return Err(format!("the body has no {missing:?}"));
    }
    Ok(obj)
}

/// An id Shopify sends as a non-negative integer, as its decimal text.
fn integer_id(v: &Value, what: &str) -> Result<String, String> {
    v.as_u64()
        .map(|n| n.to_string())
        .ok_or_else(|| format!("{what} is not a non-negative integer"))
}

/// The shop a body names at `shop_domain` (Shopify's domains are case-insensitive: the
/// registry holds them in lower case).
fn shop_domain(obj: &Map<String, Value>, key: &str) -> Result<String, String> {
    match obj.get(key) {
        Some(Value::String(s)) => {
            let shop = s.to_ascii_lowercase();
            crate::accounts::lifecycle::account_id_rule(
                Some(crate::config::Preset::Shopify),
                &shop,
            )
            .map_err(|why| format!("{key} {s:?} is not a shop: {why}"))?;
            Ok(shop)
        }
        _ => Err(format!("{key} is not a string")),
    }
}

/// `shop/redact`: `{"shop_id", "shop_domain"}`, nothing else.
pub(super) fn shop_redact(doc: &Value) -> Result<String, String> {
    let obj = exactly(doc, &["shop_id", "shop_domain"])?;
    integer_id(&obj["shop_id"], "shop_id")?;
    shop_domain(obj, "shop_domain")
}

/// What `customers/redact` names: the shop, the customer, the orders.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct CustomerRedact {
    pub shop: String,
    pub customer: String,
    pub orders: Vec<String>,
}

/// The `customer` object of the privacy topics: `id`, and at most `email` and `phone`.
fn customer_id(v: &Value) -> Result<String, String> {
    let Some(c) = v.as_object() else {
        return Err("customer is not an object".into());
    };
    if let Some(k) = c
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "email" | "phone"))
    {
        return Err(format!(
            "customer has a key this topic never carries: {k:?}"
        ));
    }
    integer_id(c.get("id").unwrap_or(&Value::Null), "customer.id")
}

fn integer_ids(v: &Value, what: &str) -> Result<Vec<String>, String> {
    let Some(items) = v.as_array() else {
        return Err(format!("{what} is not an array"));
    };
    items
        .iter()
        .map(|i| integer_id(i, &format!("an item of {what}")))
        .collect()
}

/// `customers/redact`: `{"shop_id", "shop_domain", "customer": {"id", ...},
/// "orders_to_redact": [...]}`.
pub(super) fn customers_redact(doc: &Value) -> Result<CustomerRedact, String> {
    let obj = exactly(
        doc,
        &["shop_id", "shop_domain", "customer", "orders_to_redact"],
    )?;
    integer_id(&obj["shop_id"], "shop_id")?;
    Ok(CustomerRedact {
        shop: shop_domain(obj, "shop_domain")?,
        customer: customer_id(&obj["customer"])?,
        orders: integer_ids(&obj["orders_to_redact"], "orders_to_redact")?,
    })
}

/// `customers/data_request`: `{"shop_id", "shop_domain", "orders_requested", "customer",
/// "data_request": {"id"}}`; the shop and the request's id.
pub(super) fn customers_data_request(doc: &Value) -> Result<(String, String), String> {
    let obj = exactly(
        doc,
        &[
            "shop_id",
            "shop_domain",
            "orders_requested",
            "customer",
            "data_request",
        ],
    )?;
    integer_id(&obj["shop_id"], "shop_id")?;
    customer_id(&obj["customer"])?;
    integer_ids(&obj["orders_requested"], "orders_requested")?;
    let request = match obj["data_request"].as_object() {
        Some(r) if r.len() == 1 => integer_id(&r["id"], "data_request.id")?,
        _ => return Err("data_request is not {\"id\": N}".into()),
    };
    Ok((shop_domain(obj, "shop_domain")?, request))
}

/// `app/uninstalled`: the shop object; the shop is its `myshopify_domain`.
pub(super) fn app_uninstalled(doc: &Value) -> Result<String, String> {
    let Some(obj) = doc.as_object() else {
        return Err("the body is not a JSON object".into());
    };
    integer_id(obj.get("id").unwrap_or(&Value::Null), "id")?;
    shop_domain(obj, "myshopify_domain")
}

impl Ingest {
    /// One of Shopify's lifecycle and privacy topics, for a many-account Shopify source.
    pub(super) async fn shopify_topic(
        &self,
        topic: Topic,
        env: Envelope,
        digest: Option<String>,
    ) -> Result<Ingested, Refusal> {
        let ignored = |why: String| {
            tracing::warn!(
                source = self.source,
                event_id = env.id,
                topic = env.event_type,
                reason = why,
                "a Shopify {} delivery was ignored: nothing was changed or erased",
                env.event_type
            );
            Ok((Outcome::Ignored, None))
        };
        match topic {
            Topic::AppUninstalled => {
                if !self.lifecycle {
                    return ignored(
                        "accounts.lifecycle is false: disable the shop with `accounts disable`"
                            .into(),
                    );
                }
                let shop = match app_uninstalled(&env.doc) {
                    Ok(shop) => shop,
                    Err(why) => return ignored(why),
                };
                self.uninstall_shop(env, digest, shop).await
            }
            Topic::ShopRedact => {
                let shop = match shop_redact(&env.doc) {
                    Ok(shop) => shop,
                    Err(why) => return ignored(format!("not a shop/redact body: {why}")),
                };
                let Some((_, registry)) = &self.accounts else {
                    return ignored("the source serves no accounts".into());
                };
                let uninstalled_by = match registry.uninstalled_by(&self.source, &shop).await? {
                    None => return ignored(format!("shop {shop} is not registered")),
                    Some(None) => {
                        return ignored(format!(
                            "shop {shop} is installed: no app/uninstalled was seen since its last registration (a shop is erased only after one; `accounts remove {} {shop} --purge` erases it now)",
                            self.source
                        ));
                    }
                    Some(Some(by)) => by,
                };
                self.redact_shop(env, shop, uninstalled_by).await
            }
            Topic::CustomersRedact => match customers_redact(&env.doc) {
                Ok(redact) => self.redact_customer(env, digest, redact).await,
                Err(why) => ignored(format!("not a customers/redact body: {why}")),
            },
            Topic::CustomersDataRequest => match customers_data_request(&env.doc) {
                Ok((shop, request)) => self.data_request(env, digest, shop, request).await,
                Err(why) => ignored(format!("not a customers/data_request body: {why}")),
            },
        }
    }

    /// A GitHub App's or Stripe Connect platform's lifecycle event: the account its
    /// signed body names, claimed (by id, and by body where only the body is signed),
    /// then the registry changed. Claimed first: a replay of a captured `created` after
    /// a `deleted` is a duplicate and registers nothing.
    pub(super) async fn platform_lifecycle(
        &self,
        change: Registry,
        env: Envelope,
        body: &[u8],
        digest: Option<String>,
    ) -> Result<Ingested, Refusal> {
        let Some((Some(from), _)) = &self.accounts else {
            return Ok((Outcome::Ignored, None));
        };
        let account = match super::account_named(env.doc.pointer(from)) {
            Ok(Some(a)) => a,
            Ok(None) => {
                tracing::warn!(
                    source = self.source,
                    event_id = env.id,
                    "a {} delivery names no account at {from:?}; ignored",
                    env.event_type
                );
                return Ok((Outcome::Ignored, None));
            }
            Err(why) => {
                let reason = format!("the account at {from:?} {why}");
                return Err(self.dead_letter(env, reason, body, digest.as_deref()).await);
            }
        };
        if let Err(why) = crate::accounts::lifecycle::account_id_rule(self.preset, &account) {
            let reason = format!("the account {account:?} at {from:?} cannot be registered: {why}");
            return Err(self.dead_letter(env, reason, body, digest.as_deref()).await);
        }
        if !self.claim(&env, env.id.clone(), digest).await? {
            return Ok((Outcome::Duplicate, None));
        }
        use crate::accounts::lifecycle as registry;
        let (source, kinds) = (&self.source, self.reconciled.clone());
        let done = match change {
            Registry::Register => {
                match registry::register(&self.store, source, &account, kinds).await {
                    Ok(()) => Ok(true),
                    Err(crate::accounts::AddError::Db(e)) => Err(e),
                    // No base and no credential are given: neither can be refused.
                    Err(e) => {
                        tracing::warn!(source, account, error = %e, "a lifecycle event could not register its account");
                        Ok(false)
                    }
                }
            }
            Registry::Disable(why) => {
                registry::suspend_or_resume(&self.store, source, &account, Some(why), kinds).await
            }
            Registry::Enable => {
                registry::suspend_or_resume(&self.store, source, &account, None, kinds).await
            }
            Registry::Unregister => registry::unregister(&self.store, source, &account, false)
                .await
                .map(|r| r.is_some()),
            Registry::Repositories => {
                let Some((_, registry)) = &self.accounts else {
                    return Ok((Outcome::Ignored, None));
                };
                match registry.enabled_base(source, &account).await? {
                    None => Ok(false),
                    Some((_, own_base)) => {
                        let listed = own_base
                            .as_deref()
                            .or(self.api_base.as_deref())
                            .and_then(super::repository_of_base);
                        let removed = env
                            .doc
                            .get("repositories_removed")
                            .and_then(|r| r.as_array())
                            .into_iter()
                            .flatten()
                            .filter_map(|r| r.get("full_name").and_then(|n| n.as_str()))
                            .any(|n| listed.as_deref().is_some_and(|l| n.eq_ignore_ascii_case(l)));
                        if removed {
                            // Its rows are the removed repository's: gone from it, as
                            // deleted at the sender (changes appended).
                            self.store
                                .tombstone_account(source, &account)
                                .await
                                .map(|_| true)
                        } else {
                            crate::bookkeeping::Bookkeeping::new(self.store.db().clone())
                                .due_now(source, &account, kinds)
                                .await
                                .map(|()| true)
                        }
                    }
                }
            }
        };
        match done {
            Ok(true) => {
                tracing::info!(source, account, event_id = env.id, event_type = env.event_type, change = ?change, "the registry follows the platform's lifecycle event");
                Ok((Outcome::Applied, None))
            }
            Ok(false) => Ok((Outcome::Ignored, None)),
            Err(e) => Err(self.unclaim(&env, e).await),
        }
    }

    /// A lifecycle event was claimed but the registry could not follow it: the claim is
    /// given up and the delivery answered 503, so the sender's retry makes the change
    /// (claimed first, the retry would otherwise be a duplicate with nothing done).
    async fn unclaim(&self, env: &Envelope, e: crate::db::DbError) -> Refusal {
        match self.store.release_claim(&self.source, &env.id).await {
            Ok(_) => {
                tracing::warn!(source = self.source, event_id = env.id, event_type = env.event_type, error = %e, "a lifecycle event could not change the registry; answered 503 so that the sender retries it")
            }
            Err(release) => {
                tracing::error!(source = self.source, event_id = env.id, event_type = env.event_type, error = %e, release_error = %release, "a lifecycle event was claimed but could not change the registry; make the change with `webhook-reconciler accounts`")
            }
        }
        Refusal::Unavailable(e)
    }

    /// Claims an event that changes no resource row (`change: None`): `Ok(true)` when
    /// this call took it, `Ok(false)` for a duplicate.
    async fn claim(
        &self,
        env: &Envelope,
        event_id: String,
        digest: Option<String>,
    ) -> Result<bool, Refusal> {
        let claimed = self
            .store
            .apply_event(Delivery {
                source: self.source.clone(),
                event_id,
                event_type: env.event_type.clone(),
                change: None,
                fetch: None,
                settle_conflict: false,
                body_digest: digest,
            })
            .await?;
        Ok(claimed == Outcome::Ignored)
    }

    /// `app/uninstalled`: claimed (by its id and body, never pruned), then the shop is
    /// disabled and the delivery recorded as its uninstall.
    async fn uninstall_shop(
        &self,
        env: Envelope,
        digest: Option<String>,
        shop: String,
    ) -> Result<Ingested, Refusal> {
        if !self.claim(&env, env.id.clone(), digest).await? {
            return Ok((Outcome::Duplicate, None));
        }
        let done = crate::accounts::lifecycle::uninstall(
            &self.store,
            &self.source,
            &shop,
            "app/uninstalled",
            &env.id,
        )
        .await;
        match done {
            Ok(true) => {
                tracing::info!(
                    source = self.source,
                    account = shop,
                    event_id = env.id,
                    "app/uninstalled: the shop is disabled (no run, no fetch); its rows are kept until shop/redact"
                );
                Ok((Outcome::Applied, None))
            }
            Ok(false) => Ok((Outcome::Ignored, None)),
            Err(e) => Err(self.unclaim(&env, e).await),
        }
    }

    /// `shop/redact` of a shop uninstalled by `uninstalled_by`: the shop is purged (its
    /// rows erased, changes appended with origin `erasure`, its schedule forgotten, its
    /// registration removed), then the redact is claimed under an id naming that
    /// uninstall. Purged first: a purge that fails halfway leaves the shop disabled and
    /// still uninstalled, so the sender's retry finishes it; once done, the shop is not
    /// registered and a replay finds nothing to erase. A genuine redact after a
    /// reinstall and a second uninstall erases the second installation's data.
    async fn redact_shop(
        &self,
        env: Envelope,
        shop: String,
        uninstalled_by: String,
    ) -> Result<Ingested, Refusal> {
        let purged =
            crate::accounts::lifecycle::unregister(&self.store, &self.source, &shop, true).await;
        let rows = match purged {
            Ok(Some(crate::accounts::lifecycle::Removed { rows, .. })) => rows,
            Ok(None) => return Ok((Outcome::Ignored, None)),
            Err(e) => {
                tracing::error!(source = self.source, account = shop, error = %e, "shop/redact: the purge failed; Shopify's retry finishes it, or `webhook-reconciler accounts remove {} {shop} --purge`", self.source);
                return Err(Refusal::Unavailable(e));
            }
        };
        tracing::info!(
            source = self.source,
            account = shop,
            rows,
            "shop/redact: the shop's rows were erased and the shop unregistered"
        );
        self.claim(
            &env,
            format!("shop/redact:{shop}:after:{uninstalled_by}"),
            None,
        )
        .await?;
        Ok((Outcome::Applied, None))
    }

    /// `customers/redact`: the listed orders and the customer's own row of that shop are
    /// erased, as a shop's erasure erases its rows, then the delivery is claimed (never
    /// pruned). Erased first: erasing twice is harmless, so a failure is answered 503
    /// and the sender's retry erases again.
    async fn redact_customer(
        &self,
        env: Envelope,
        digest: Option<String>,
        redact: CustomerRedact,
    ) -> Result<Ingested, Refusal> {
        let mut targets = Vec::new();
        if self.kinds.iter().any(|k| k == "order") {
            targets.push(("order".to_string(), redact.orders.clone()));
        }
        if self.kinds.iter().any(|k| k == "customer") {
            targets.push(("customer".to_string(), vec![redact.customer.clone()]));
        }
        let rows = self
            .store
            .erase_resources(&self.source, &redact.shop, targets)
            .await?;
        tracing::info!(
            source = self.source,
            account = redact.shop,
            customer = redact.customer,
            rows,
            "customers/redact: the customer's rows were erased"
        );
        if !self.claim(&env, env.id.clone(), digest).await? {
            return Ok((Outcome::Duplicate, None));
        }
        Ok((Outcome::Applied, None))
    }

    /// `customers/data_request`: recorded as a row of [`DATA_REQUEST_KIND`] (its state
    /// the request's body), so it reaches every consumer as a change; claimed with it in
    /// one transaction.
    async fn data_request(
        &self,
        env: Envelope,
        digest: Option<String>,
        shop: String,
        request: String,
    ) -> Result<Ingested, Refusal> {
        let state = crate::change::canonical_json(&env.doc);
        let change = crate::change::Change {
            source: self.source.clone(),
            account: shop,
            kind: DATA_REQUEST_KIND.to_string(),
            id: request,
            version: 0,
            state: Some(state),
            action: crate::config::Action::Upsert,
        };
        let key = change.key().to_owned();
        let outcome = self
            .store
            .apply_event(Delivery {
                source: self.source.clone(),
                event_id: env.id.clone(),
                event_type: env.event_type.clone(),
                change: Some(change),
                fetch: None,
                settle_conflict: false,
                body_digest: digest,
            })
            .await?;
        Ok((outcome, Some(key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_privacy_topic_acts_only_on_a_body_of_exactly_its_shape() {
        let redact = json!({"shop_id": 1, "shop_domain": "Acme.myshopify.com"});
        assert_eq!(shop_redact(&redact).unwrap(), "acme.myshopify.com");
        let customer = json!({
            "shop_id": 1, "shop_domain": "acme.myshopify.com",
            "customer": {"id": 7, "email": "a@b.c", "phone": "1"},
            "orders_to_redact": [1001, 1002]
        });
        // A customer's redaction under the shop's topic, and extra keys, erase nothing.
        assert!(shop_redact(&customer).is_err());
        assert!(
            shop_redact(&json!({"shop_id": 1, "shop_domain": "acme.myshopify.com", "x": 1}))
                .is_err()
        );
        assert!(shop_redact(&json!({"shop_domain": "acme.myshopify.com"})).is_err());
        assert!(
            shop_redact(&json!({"shop_id": "1", "shop_domain": "acme.myshopify.com"})).is_err()
        );
        assert!(shop_redact(&json!({"shop_id": 1, "shop_domain": "evil.com"})).is_err());
        assert_eq!(
            customers_redact(&customer).unwrap(),
            CustomerRedact {
                shop: "acme.myshopify.com".into(),
                customer: "7".into(),
                orders: vec!["1001".into(), "1002".into()],
            }
        );
        assert!(customers_redact(&redact).is_err());
        let request = json!({
            "shop_id": 1, "shop_domain": "acme.myshopify.com",
            "orders_requested": [1001], "customer": {"id": 7}, "data_request": {"id": 99}
        });
        assert_eq!(
            customers_data_request(&request).unwrap(),
            ("acme.myshopify.com".into(), "99".into())
        );
        assert!(customers_data_request(&customer).is_err());
        assert!(customers_redact(&request).is_err());
        assert!(
            app_uninstalled(
                &json!({"id": 1, "myshopify_domain": "acme.myshopify.com", "name": "Acme"})
            )
            .is_ok()
        );
        assert!(app_uninstalled(&redact).is_err());
    }

    #[test]
    fn every_lifecycle_topic_keeps_its_claims() {
        for t in [
            "app/uninstalled",
            "shop/redact",
            "customers/redact",
            "customers/data_request",
        ] {
            assert!(Topic::of(t).is_some());
            assert!(crate::store::NEVER_PRUNED.contains(&t), "{t}");
        }
    }
}

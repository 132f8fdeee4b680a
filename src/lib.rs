//! webhook-reconciler keeps a local database exactly in step with the resources a webhook
//! sender owns. See ARCHITECTURE.md for the map; in short:
//!
//! - webhook flow: [`http`] (receive) -> [`webhook::verify`] -> [`ingest::envelope`]
//!   (parse) -> [`ingest`] (mapping, claim) -> [`store`] (the guarded write, and the
//!   fetch a 200 leaves, in one transaction);
//! - reconcile flow: [`reconcile::schedule`] (claims what `reconcile_due` says is due)
//!   -> [`reconcile`] (plan, sweep) -> [`sender`] (list pages) -> [`reconcile::compare`]
//!   -> [`store`] (the same guarded write, with the page's [`bookkeeping`] in its
//!   transaction); catch-up's events go through [`ingest`] like webhooks;
//! - pending fetches: [`reconcile::fetches`] takes them from [`store`], fetches through
//!   [`sender`] and writes through the guarded write;
//! - every write publishes to the change feed ([`feed::outbox`]), which [`feed::push`]
//!   delivers to the application;
//! - each table has one owner: [`store`], [`bookkeeping`], [`feed`], [`accounts`];
//!   [`operations`] is the operator's one door over them; [`health`] and
//!   [`observability`] report;
//! - configuration: [`config`] (file + env -> validated `Config`), [`cli`], [`app`].

pub mod accounts;
pub mod app;
pub mod bookkeeping;
pub mod change;
pub mod cli;
pub mod config;
pub mod credential;
pub mod db;
pub mod demo;
pub mod feed;
pub mod health;
pub mod http;
pub mod ingest;
pub mod observability;
pub mod operations;
pub mod prove;
pub mod reconcile;
pub mod retention;
pub mod sender;
pub mod shutdown;
pub mod signature;
pub mod simulator;
pub mod store;
pub mod systemd;
pub mod telemetry;
pub mod webhook;

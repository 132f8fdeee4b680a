//! One integration-test binary (the crate links once). Every test gets its own database:
//! a fresh PostgreSQL database or a fresh SQLite file. PostgreSQL tests fail loudly when
//! the server is unreachable; they never skip.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code may unwrap: a panic here is a failed test, not an outage"
)]

mod helpers;

mod accounts;
mod cli;
mod connect;
mod day_to_day;
mod dead_letters;
mod demo;
mod feed;
mod fetches;
mod github_app;
mod hostile_deliveries;
mod hostile_sender;
mod input_limits;
mod listener;
mod migrations;
mod oneshot;
mod operations;
mod process;
mod properties;
mod prove;
mod reconcile;
mod senders;
mod store;
mod structure;
mod tenants;
mod tie_rule;
mod traces;
mod typed_views;
mod webhook_http;

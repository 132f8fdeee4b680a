#!/usr/bin/env bash
# The one command that runs every test: unit tests, and the integration tests against a
# real PostgreSQL and real SQLite files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-postgres.sh
# Unit and integration tests; no doc tests (the crate has none), so the run ends with
# the integration suite's summary line.
cargo test --locked --lib --bins --tests "$@"

#!/usr/bin/env bash
# The one command that runs every test: unit tests, and the integration tests against a
# real PostgreSQL and real SQLite files.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-postgres.sh
cargo test --locked "$@"

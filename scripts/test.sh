#!/usr/bin/env bash
# The one command that runs every test: unit tests, and the integration tests against a
# real PostgreSQL and real SQLite files.
#
# PostgreSQL: with WR_TEST_PG set (postgres://user@host:port, trust or a password in
# the URL; the user may create databases), that server; otherwise a throwaway cluster
# of its own (scripts/lib/throwaway-postgres.sh), removed afterwards.
# Runner: cargo-nextest when installed (one summary line for the whole run), else
# cargo test. Extra arguments go to the runner (a test name filter, say).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${WR_TEST_PG:-}" ]; then
  hostport=${WR_TEST_PG#*://}; hostport=${hostport#*@}; hostport=${hostport%%/*}
  host=${hostport%:*}; port=${hostport##*:}; [ "$port" = "$hostport" ] && port=5432
  if ! (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
    echo "WR_TEST_PG=$WR_TEST_PG: nothing answers on $host:$port; start that server or unset WR_TEST_PG to use a throwaway cluster" >&2
    exit 1
  fi
  echo "PostgreSQL for the tests: WR_TEST_PG ($host:$port)" >&2
else
  # shellcheck source=lib/throwaway-postgres.sh
  source scripts/lib/throwaway-postgres.sh
  throwaway_postgres_start
fi
# No doc tests (the crate has none). Not `exec`: the throwaway cluster is removed when
# this script exits.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --lib --bins --tests --no-fail-fast "$@"
else
  cargo test --locked --lib --bins --tests "$@"
fi

#!/usr/bin/env bash
# The soak (benches/soak): `serve` under a steady signed load and scheduled faults, on
# PostgreSQL and then on SQLite, 20 minutes each unless --seconds says otherwise; the
# PostgreSQL is a throwaway cluster of its own, so the database fault is a real stop and
# start of the server. Arguments go to the soak (--seconds, --backend, --rate,
# --no-faults, --check, --max-rss-slope, --sample-every).
#
#   scripts/soak.sh                      # 2 x 20 minutes
#   scripts/soak.sh --seconds 120        # the 2-minute smoke
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/throwaway-postgres.sh
source scripts/lib/throwaway-postgres.sh
throwaway_postgres_start
WR_SOAK_PG_STOP=$(throwaway_postgres_stop_cmd)
WR_SOAK_PG_START=$(throwaway_postgres_start_cmd)
export WR_SOAK_PG_STOP WR_SOAK_PG_START
cargo bench --locked --bench soak -- "$@"

#!/usr/bin/env bash
# Freshness's query (behind /metrics, /readyz, `status` and the systemd status line) at
# 10,000 accounts x 2 kinds, with 1, 24 and 168 runs kept per account-kind (a week of
# hourly runs): before 2026-12-05 it grouped all of reconcile_runs; now it reads
# reconcile_last_success, one row per account-kind. Median of 5 calls each, by psql
# (the 20,000 rows' transfer to psql included on both sides).
#
#   scripts/ensure-postgres.sh && scripts/bench-freshness.sh
#
# PostgreSQL server: $WR_TEST_PG (default postgres://postgres@127.0.0.1:5432); it
# creates and drops the database wr_bench_freshness.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER="${WR_TEST_PG:-postgres://postgres@127.0.0.1:5432}"
DB=wr_bench_freshness
P=(psql -X -q -v ON_ERROR_STOP=1)
old="SELECT source, account, kind, CAST(EXTRACT(EPOCH FROM now() - last) AS DOUBLE PRECISION) AS age_seconds FROM (SELECT source, account, kind, MAX(finished_at) AS last FROM reconcile_runs WHERE status = 'succeeded' GROUP BY source, account, kind) t"
new="SELECT source, account, kind, CAST(EXTRACT(EPOCH FROM now() - succeeded_at) AS DOUBLE PRECISION) AS age_seconds FROM reconcile_last_success"
median_ms() {
    { echo '\timing on'; for _ in 1 2 3 4 5 6; do echo "$1;"; done; } |
        "${P[@]}" "$SERVER/$DB" -o /dev/null 2>&1 | grep -o 'Time: [0-9.]*' | awk '{print $2}' |
        tail -5 | sort -n | sed -n 3p
}
for runs in 1 24 168; do
    "${P[@]}" "$SERVER/postgres" -c "DROP DATABASE IF EXISTS $DB" 2>/dev/null
    "${P[@]}" "$SERVER/postgres" -c "CREATE DATABASE $DB"
    for f in migrations/postgres/*/up.sql; do "${P[@]}" "$SERVER/$DB" -f "$f" >/dev/null; done
    "${P[@]}" "$SERVER/$DB" -c "INSERT INTO reconcile_runs (source, account, kind, mode, status, started_at, finished_at)
        SELECT 'stripe', 'acct_' || a, k, 'full', 'succeeded', now() - make_interval(hours => r), now() - make_interval(hours => r)
        FROM generate_series(1, 10000) a, unnest(ARRAY['charge', 'customer']) k, generate_series(1, $runs) r"
    # What the runs' own commits would have left (the migration's backfill, the same query).
    "${P[@]}" "$SERVER/$DB" -c "INSERT INTO reconcile_last_success (source, account, kind, succeeded_at)
        SELECT source, account, kind, MAX(finished_at) FROM reconcile_runs WHERE status = 'succeeded' GROUP BY source, account, kind"
    "${P[@]}" "$SERVER/$DB" -c "VACUUM ANALYZE"
    echo "$runs run(s) kept per account-kind ($((runs * 20000)) rows): grouping reconcile_runs $(median_ms "$old") ms, reading reconcile_last_success $(median_ms "$new") ms"
done
"${P[@]}" "$SERVER/postgres" -c "DROP DATABASE $DB"

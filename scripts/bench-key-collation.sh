#!/usr/bin/env bash
# What byte-ordered ("C") keys save PostgreSQL on the two lookups every write path makes:
# a sweep page's local read (the product's statement: 1,000 primary-key probes of one
# kind) and a delivery's claim (INSERT .. ON CONFLICT DO NOTHING on processed_events).
# Two copies of each table in a scratch database, one with the database's default
# collation and one with COLLATE "C" (migration 2026-12-03-000013_key_collation), the same
# 1M rows; pgbench alternates between them (A B A B) so both see the same machine.
#
#   scripts/bench-key-collation.sh                 # $WR_TEST_PG or postgres://postgres@127.0.0.1:5432
#   scripts/bench-key-collation.sh --seconds 8
#   scripts/bench-key-collation.sh --instead-of-default en-US-x-icu   # as on a database
#                                  # created with a linguistic default (en_US.UTF-8)
set -euo pipefail
server=${WR_TEST_PG:-postgres://postgres@127.0.0.1:5432}
seconds=8
base=default
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --instead-of-default) base=$2; shift 2 ;;
    *) echo "unknown option $1 (--seconds N, --instead-of-default COLLATION)" >&2; exit 2 ;;
  esac
done
db=wr_bench_collation_$$
dir=$(mktemp -d)
trap 'rm -rf "$dir"; psql -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db" >/dev/null' EXIT
psql -q "$server/postgres" -c "CREATE DATABASE $db"
url="$server/$db"
psql -q "$url" -c "SELECT datcollate AS \"the database's collation\" FROM pg_database WHERE datname = current_database()"
for c in "$base" C; do
  t=$([[ $c == C ]] && echo _c || true)
  psql -q "$url" <<SQL
CREATE TABLE resources$t (source TEXT COLLATE "$c" NOT NULL, account TEXT COLLATE "$c" NOT NULL DEFAULT '',
  kind TEXT COLLATE "$c" NOT NULL, id TEXT COLLATE "$c" NOT NULL, version BIGINT NOT NULL,
  deleted BOOLEAN NOT NULL DEFAULT false, state JSONB, state_digest BIGINT,
  PRIMARY KEY (source, account, kind, id));
INSERT INTO resources$t SELECT 'bench', '', 'item', 'g' || lpad(i::text, 10, '0'), 1, false,
  jsonb_build_object('amount', i, 'currency', 'eur', 'customer', 'cus_' || lpad(i::text, 8, '0'),
    'id', 'g' || lpad(i::text, 10, '0'), 'status', 'paid', 'updated_at', '2026-11-30T10:00:00Z', 'version', 1), i
  FROM generate_series(0, 999999) i;
CREATE TABLE processed_events$t (source TEXT COLLATE "$c" NOT NULL, event_id TEXT COLLATE "$c" NOT NULL,
  processed_at TIMESTAMPTZ NOT NULL DEFAULT now(), PRIMARY KEY (source, event_id));
INSERT INTO processed_events$t (source, event_id) SELECT 'bench', 'evt_' || md5(i::text) FROM generate_series(1, 1000000) i;
VACUUM ANALYZE resources$t; VACUUM ANALYZE processed_events$t;
SQL
done
for t in "" _c; do
  # The product's read (store::sql::resources::rows_by_id), one random page of 1,000 ids.
  cat > "$dir/read$t.sql" <<SQL
\set p random(0, 999)
SELECT count(*) FROM unnest(ARRAY(SELECT 'g' || lpad(i::text, 10, '0') FROM generate_series(:p * 1000, :p * 1000 + 999) i)) AS u(id)
  CROSS JOIN LATERAL (SELECT id, version, deleted, state_digest, CASE WHEN state_digest IS NULL THEN state::text END AS state
  FROM resources$t WHERE source = 'bench' AND account = '' AND kind = 'item' AND id = u.id LIMIT 1) r;
SQL
  # A claim of a new event id (half of a retried mix are duplicates: one of each).
  cat > "$dir/claim$t.sql" <<SQL
\set n random(1, 2000000000)
INSERT INTO processed_events$t (source, event_id) VALUES ('bench', 'evt_' || md5(:n::text)) ON CONFLICT DO NOTHING;
INSERT INTO processed_events$t (source, event_id) VALUES ('bench', 'evt_' || md5((:n % 1000000 + 1)::text)) ON CONFLICT DO NOTHING;
SQL
done
run() { pgbench -n -c "$2" -j "$2" -T "$seconds" -f "$dir/$1.sql" "$url" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
for what in read claim; do
  clients=$([[ $what == read ]] && echo 1 || echo 2)
  for round in 1 2; do
    a=$(run "$what" "$clients"); b=$(run "${what}_c" "$clients")
    echo "$what ($clients client(s), round $round): collation $base $a tps, COLLATE \"C\" $b tps ($(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }')x)"
  done
done

#!/usr/bin/env bash
# What typed views cost the write path, on PostgreSQL: pgbench running the product's
# guarded upsert (store::sql::upsert_sql for one row, as a delivery writes it, through the
# `resources` trigger that feeds the change feed) of Stripe-invoice-shaped states of
# about 450 bytes, over 100,000 invoices, in one run:
#   none      no view (a kind without `columns`)
#   preset    the Stripe preset's invoice view: 5 columns, 2 indexes (customer, status)
#   five      the same 5 columns, each indexed
# in ROUNDS rounds (default 2), each variant on a fresh database; the spread between
# rounds is the run's noise. Each database is made by the product's own `migrate`. Prints transactions/s and the
# ratio to the first `none`.
#
#   cargo build --release && benches/typed_view_indexes.sh
#   WR_BENCH_PG=postgres://postgres@127.0.0.1:5432 SECONDS_EACH=20 CLIENTS=2 benches/typed_view_indexes.sh
set -euo pipefail
PG=${WR_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
BIN=${BIN:-target/release/webhook-reconciler}
SECONDS_EACH=${SECONDS_EACH:-20}
CLIENTS=${CLIENTS:-2}
ROWS=${ROWS:-100000}
ROUNDS=${ROUNDS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

columns='[sources.stripe.kinds.invoice.columns]
customer = "/customer"
status = "/status"
amount_due = { pointer = "/amount_due", type = "bigint" }
currency = "/currency"
created = { pointer = "/created", type = "timestamptz", format = "unix" }'

cat > "$work/upsert.sql" <<'EOF'
\set id random(1, 100000)
\set c random(1, 1000)
\set a random(0, 100000)
INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id, state_digest) VALUES ('stripe', '', 'invoice', 'in_' || :id, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, ('{"id":"in_' || :id || '","object":"invoice","customer":"cus_' || :c || '","status":"open","amount_due":' || :a || ',"currency":"eur","created":1700000000,"livemode":false,"metadata":{},"lines":{"object":"list","data":[],"has_more":false},"description":"An invoice state of a few hundred bytes, as Stripe sends them, padded with a description of the kind people write"}')::jsonb, false, 'webhook', 'evt_' || :id || '_' || :a, 0) ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version, state = COALESCE(excluded.state, resources.state), state_digest = CASE WHEN excluded.state IS NULL THEN resources.state_digest ELSE excluded.state_digest END, deleted = excluded.deleted, origin = excluded.origin, last_event_id = excluded.last_event_id, updated_at = now() WHERE resources.version < excluded.version;
EOF

run() {
    local name=$1 indexes=$2 cols=$3
    local db="wr_bench_views_${name}_$$"
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
    cat > "$work/$name.toml" <<EOF
[database]
url = "$PG/$db"
[sources.stripe.webhook]
secrets = ["0123456789abcdef0123"]
[sources.stripe.kinds.invoice]
version = "/created"
indexes = [$indexes]
$cols
EOF
    "$BIN" --config "$work/$name.toml" migrate >/dev/null
    psql "$PG/$db" -qc "INSERT INTO resources (source, account, kind, id, version, state, origin) SELECT 'stripe', '', 'invoice', 'in_' || i, 1, jsonb_build_object('id', 'in_' || i, 'customer', 'cus_' || (i % 1000), 'status', 'open', 'amount_due', i, 'currency', 'eur', 'created', 1700000000), 'reconcile' FROM generate_series(1, $ROWS) i" \
        -c "TRUNCATE change_pending" -c "VACUUM ANALYZE" >/dev/null
    local tps
    tps=$(pgbench -n -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_EACH" -f "$work/upsert.sql" "$PG/$db" 2>/dev/null |
        awk '/^tps = / { print $3 }')
    local views
    views=$(psql "$PG/$db" -Atc "SELECT count(*) FROM typed_views")
    local indexes_made
    indexes_made=$(psql "$PG/$db" -Atc "SELECT count(*) FROM pg_indexes WHERE tablename = 'resources' AND indexname LIKE 'stripe_invoice_%'")
    psql "$PG/postgres" -qc "DROP DATABASE $db" >/dev/null
    echo "$name $tps $views $indexes_made"
}

printf '%-8s %12s %6s %8s %8s\n' variant "upserts/s" views indexes ratio
base=""
for round in $(seq "$ROUNDS"); do
    for v in "none||" "preset|\"customer\", \"status\"|x" \
        "five|\"customer\", \"status\", \"amount_due\", \"currency\", \"created\"|x"; do
        IFS='|' read -r name indexes cols <<<"$v"
        # `read` takes one line: the columns are passed whole.
        [ -n "$cols" ] && cols=$columns
        set -- $(run "$name" "$indexes" "$cols")
        [ -z "$base" ] && base=$2
        printf '%-8s %12.0f %6s %8s %8.2f\n' "$1" "$2" "$3" "$4" "$(echo "$2 / $base" | bc -l)"
    done
done

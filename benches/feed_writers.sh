#!/usr/bin/env bash
# What the change feed costs concurrent writers, on PostgreSQL: pgbench with N clients,
# each transaction one guarded upsert of a ~450-byte state (store::sql::upsert_sql for
# one row) into a database `migrate` made, two ways in one run:
#   feed      as the product writes: the `resources` trigger fills change_pending and
#             the transaction ends with feed::sql::publish_changes (numbered under the
#             change_seq row lock, held through the commit)
#   no-feed   the same upsert with the trigger disabled and no publish: the least a
#             write can do without the feed's promises
#   deferred  a candidate design (issue 53): writers only fill change_pending (trigger
#             on, no publish), and one sequencer, looping in its own session, numbers
#             and moves every committed pending row under an advisory lock; the run
#             ends with a last pass, and nothing may be left pending
# Prints commits/s of each and the ratios to no-feed per N.
#
#   cargo build --release && benches/feed_writers.sh
#   WR_BENCH_PG=postgres://postgres@127.0.0.1:5432 CLIENTS="1 8 24" SECONDS_EACH=15 benches/feed_writers.sh
set -euo pipefail
PG=${WR_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
BIN=${BIN:-target/release/webhook-reconciler}
SECONDS_EACH=${SECONDS_EACH:-15}
CLIENTS=${CLIENTS:-"1 8 24"}
work=$(mktemp -d)
db="wr_bench_feed_writers_$$"
trap 'rm -rf "$work"; psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

upsert="INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id, state_digest) VALUES ('api', '', 'invoice', 'in_' || :id, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, ('{\"id\":\"in_' || :id || '\",\"object\":\"invoice\",\"customer\":\"cus_' || :c || '\",\"status\":\"open\",\"amount_due\":' || :c || ',\"currency\":\"eur\",\"created\":1700000000,\"livemode\":false,\"metadata\":{},\"lines\":{\"object\":\"list\",\"data\":[],\"has_more\":false},\"description\":\"An invoice state of a few hundred bytes, as senders send them, padded with a description of the kind people write\"}')::jsonb, false, 'webhook', NULL, 0) ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version, state = COALESCE(excluded.state, resources.state), state_digest = CASE WHEN excluded.state IS NULL THEN resources.state_digest ELSE excluded.state_digest END, deleted = excluded.deleted, origin = excluded.origin, last_event_id = excluded.last_event_id, updated_at = now() WHERE resources.version < excluded.version;"
# feed::sql::publish_changes, as the product sends it.
publish="WITH moved AS (DELETE FROM change_pending WHERE txid = txid_current() RETURNING pending_id, source, account, kind, id, version, deleted, state, origin, event_id), counted AS (SELECT COUNT(*) AS n FROM moved), numbered AS (UPDATE change_seq SET last = last + counted.n FROM counted WHERE counted.n > 0 RETURNING last, counted.n AS n), inserted AS (INSERT INTO changes (seq, source, account, kind, id, version, deleted, state, origin, event_id) SELECT numbered.last - numbered.n + ROW_NUMBER() OVER (ORDER BY m.pending_id), m.source, m.account, m.kind, m.id, m.version, m.deleted, m.state, m.origin, m.event_id FROM moved m CROSS JOIN numbered) SELECT n FROM numbered;"
printf '\\set id random(1, 100000)\n\\set c random(1, 1000)\nBEGIN;\n%s\n%s\nCOMMIT;\n' "$upsert" "$publish" > "$work/feed.sql"
printf '\\set id random(1, 100000)\n\\set c random(1, 1000)\nBEGIN;\n%s\nCOMMIT;\n' "$upsert" > "$work/no-feed.sql"
cp "$work/no-feed.sql" "$work/deferred.sql"
# The sequencer's pass: every committed pending row, numbered in pending_id order.
pass="BEGIN; SELECT pg_advisory_xact_lock(7); WITH moved AS (DELETE FROM change_pending RETURNING pending_id, source, account, kind, id, version, deleted, state, origin, event_id), counted AS (SELECT COUNT(*) AS n FROM moved), numbered AS (UPDATE change_seq SET last = last + counted.n FROM counted WHERE counted.n > 0 RETURNING last, counted.n AS n), inserted AS (INSERT INTO changes (seq, source, account, kind, id, version, deleted, state, origin, event_id) SELECT numbered.last - numbered.n + ROW_NUMBER() OVER (ORDER BY m.pending_id), m.source, m.account, m.kind, m.id, m.version, m.deleted, m.state, m.origin, m.event_id FROM moved m CROSS JOIN numbered) SELECT n FROM numbered; COMMIT;"

psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
printf '[database]\nurl = "%s"\n' "$PG/$db" > "$work/c.toml"
"$BIN" --config "$work/c.toml" migrate >/dev/null

tps() {
    pgbench -n -c "$1" -j "$(( $1 < 2 ? 1 : 2 ))" -T "$SECONDS_EACH" -f "$work/$2.sql" "$PG/$db" 2>/dev/null |
        awk '/^tps = / { print $3 }'
}

printf '%8s %14s %14s %14s %8s %8s\n' clients "feed commits/s" "no-feed" "deferred" feed/no deferred/no
for n in $CLIENTS; do
    psql "$PG/$db" -qc "ALTER TABLE resources ENABLE TRIGGER resources_record_change" >/dev/null
    with=$(tps "$n" feed)
    ( while [ ! -e "$work/stop" ]; do psql "$PG/$db" -qAtc "$pass" >/dev/null; done ) &
    sequencer=$!
    deferred=$(tps "$n" deferred)
    touch "$work/stop"; wait "$sequencer"; rm -f "$work/stop"
    psql "$PG/$db" -qAtc "$pass" >/dev/null
    psql "$PG/$db" -qc "ALTER TABLE resources DISABLE TRIGGER resources_record_change" >/dev/null
    without=$(tps "$n" no-feed)
    printf '%8s %14.0f %14.0f %14.0f %8.2f %8.2f\n' "$n" "$with" "$without" "$deferred" \
        "$(echo "$with / $without" | bc -l)" "$(echo "$deferred / $without" | bc -l)"
done
# The feed's rows were written once each: as many changes as upserts that changed a row.
psql "$PG/$db" -Atc "SELECT 'changes written: ' || count(*) || ', pending left: ' || (SELECT count(*) FROM change_pending) FROM changes"

#!/usr/bin/env bash
# What the change feed costs concurrent writers, on PostgreSQL: pgbench with N clients,
# each transaction one guarded upsert of a ~450-byte state (store::sql::upsert_sql for
# one row) into a database `migrate` made, two ways:
#   feed      as the product writes: the `resources` trigger records the change in
#             change_pending (logged) in the writer's transaction, and the sequencer
#             numbers committed changes into `changes` after the commit: here one more
#             pgbench client running the product's passes back to back (the function
#             feed_sequence_pass: lock change_seq, move the committed pending rows found
#             through the primary key; 1 ms between passes after one that numbered more
#             than one), as `serve`'s passes run while writers commit, and a loop vacuuming
#             change_pending every 2 s as the outbox does. Each round ends with a last
#             pass; nothing may be left pending, and every change is numbered once,
#             gap-free.
#   no-feed   the same upsert with the trigger disabled and no pass: the least a write
#             can do without the feed's promises
# The sequencer here polls: between the writers' commit waves most of its passes find
# nothing (at 8 writers 1,922 of 14,958 numbered anything). The product runs a pass only
# when a writer that committed asks for one; benches/feed_commits.rs measures that path.
# With WRITERS_ONLY=1 the feed rounds run no pass while the writers run (the last pass of
# each round still numbers everything, and is checked): what the change row the contract
# puts in the writer's transaction costs on its own, the ceiling of any way of numbering.
# The two alternate in ROUNDS paired rounds per N (which goes first alternates too), each
# after a CHECKPOINT, so that a checkpoint's full-page writes or the machine's drift fall
# on both sides alike; prints every round and the median of the rounds' ratios per N.
#
#   cargo build --release && benches/feed_writers.sh
#   WR_BENCH_PG=postgres://postgres@127.0.0.1:5432 CLIENTS="1 8 24" ROUNDS=5 SECONDS_EACH=6 benches/feed_writers.sh
#   WRITERS_ONLY=1 benches/feed_writers.sh
#   FUNCTION_SQL=other_pass.sql benches/feed_writers.sh
# FUNCTION_SQL: a file of SQL run after `migrate` (another definition of the pass, to
# compare two in one sitting).
set -euo pipefail
PG=${WR_BENCH_PG:-postgres://postgres@127.0.0.1:5432}
BIN=${BIN:-target/release/webhook-reconciler}
SECONDS_EACH=${SECONDS_EACH:-6}
ROUNDS=${ROUNDS:-5}
CLIENTS=${CLIENTS:-"1 8 24"}
WRITERS_ONLY=${WRITERS_ONLY:-}
FUNCTION_SQL=${FUNCTION_SQL:-}
GATHER_MS=${GATHER_MS:-1}
work=$(mktemp -d)
db="wr_bench_feed_writers_$$"
trap 'touch "$work/stop"; rm -rf "$work"; psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT

upsert="INSERT INTO resources (source, account, kind, id, version, state, deleted, origin, last_event_id, state_digest) VALUES ('api', '', 'invoice', 'in_' || :id, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, ('{\"id\": \"in_' || :id || '\",\"object\": \"invoice\",\"customer\": \"cus_' || :c || '\",\"status\": \"open\",\"amount_due\": ' || :c || ',\"currency\": \"eur\",\"created\": 1700000000,\"livemode\": false,\"metadata\": {},\"lines\": {\"object\": \"list\",\"data\": [],\"has_more\": false},\"description\": \"An invoice state of a few hundred bytes, as senders send them, padded with a description of the kind people write\"}')::jsonb, false, 'webhook', NULL, 0) ON CONFLICT (source, account, kind, id) DO UPDATE SET version = excluded.version, state = COALESCE(excluded.state, resources.state), state_digest = CASE WHEN excluded.state IS NULL THEN resources.state_digest ELSE excluded.state_digest END, deleted = excluded.deleted, origin = excluded.origin, last_event_id = excluded.last_event_id, updated_at = now() WHERE resources.version < excluded.version;"
printf '\\set id random(1, 100000)\n\\set c random(1, 1000)\nBEGIN;\n%s\nCOMMIT;\n' "$upsert" > "$work/write.sql"
# The sequencer as the product runs it (feed::outbox::Outbox::pass): one statement in
# autocommit (feed::sql::PASS_SQL, SEQUENCE_BATCH), and after a pass that numbered more
# than one change the next begins 1 ms later (outbox's GATHER; GATHER_MS to try another).
pass="SELECT feed_sequence_pass(50000) AS n"
printf '%s \\gset\n\\if :n > 1\n\\sleep %s ms\n\\endif\n' "$pass" "$GATHER_MS" > "$work/pass.sql"
# The product vacuums change_pending at most every 2 s (feed::outbox).
vacuum_loop() { while [ ! -e "$work/stop" ]; do psql "$PG/$db" -qc "VACUUM (SKIP_LOCKED) change_pending, change_seq" >/dev/null 2>&1; sleep 2; done; }

psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null 2>&1
printf '[database]\nurl = "%s"\n' "$PG/$db" > "$work/c.toml"
"$BIN" --config "$work/c.toml" migrate >/dev/null
if [ -n "$FUNCTION_SQL" ]; then psql "$PG/$db" -q -v ON_ERROR_STOP=1 -f "$FUNCTION_SQL" >/dev/null; fi
vacuum_loop & vacuumer=$!

tps() { # clients script [seconds]
    pgbench -n -M prepared -c "$1" -j "$(( $1 < 2 ? 1 : 2 ))" -T "${3:-$SECONDS_EACH}" -f "$work/$2.sql" "$PG/$db" 2>/dev/null |
        awk '/^tps = / { print $3 }'
}
checkpoint() { psql "$PG/$db" -qc "CHECKPOINT" >/dev/null; }
feed_round() { # clients -> commits/s and passes/s
    psql "$PG/$db" -qc "ALTER TABLE resources ENABLE TRIGGER resources_record_change" >/dev/null
    checkpoint
    if [ -n "$WRITERS_ONLY" ]; then echo 0 > "$work/passes" & else tps 1 pass "$(( SECONDS_EACH + 1 ))" > "$work/passes" & fi
    local sequencer=$!
    local with
    with=$(tps "$1" write)
    wait "$sequencer"
    # The round's last passes, until nothing is pending.
    while [ "$(psql "$PG/$db" -qAtc "SELECT EXISTS (SELECT 1 FROM change_pending)")" = t ]; do
        psql "$PG/$db" -qAtc "$pass" >/dev/null
    done
    echo "$with $(cat "$work/passes")"
}
no_feed_round() {
    psql "$PG/$db" -qc "ALTER TABLE resources DISABLE TRIGGER resources_record_change" >/dev/null
    checkpoint
    tps "$1" write
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '%8s %6s %14s %14s %10s %10s\n' clients round "feed commits/s" "no-feed" feed/no "passes/s"
for n in $CLIENTS; do
    : > "$work/ratios"; : > "$work/with"; : > "$work/without"
    for r in $(seq 1 "$ROUNDS"); do
        if (( r % 2 )); then
            read -r with passes < <(feed_round "$n"); without=$(no_feed_round "$n")
        else
            without=$(no_feed_round "$n"); read -r with passes < <(feed_round "$n")
        fi
        ratio=$(echo "$with / $without" | bc -l)
        echo "$ratio" >> "$work/ratios"; echo "$with" >> "$work/with"; echo "$without" >> "$work/without"
        printf '%8s %6s %14.0f %14.0f %10.2f %10.0f\n' "$n" "$r" "$with" "$without" "$ratio" "$passes"
    done
    printf '%8s %6s %14.0f %14.0f %10.2f\n' "$n" median "$(median < "$work/with")" \
        "$(median < "$work/without")" "$(median < "$work/ratios")"
done
touch "$work/stop"; kill "$vacuumer" 2>/dev/null || true; wait "$vacuumer" 2>/dev/null || true
# Every change numbered once, gap-free, nothing left pending.
psql "$PG/$db" -Atc "SELECT 'changes: ' || count(*) || ', seqs 1..' || max(seq) || ', last handed out ' || (SELECT last FROM change_seq) || ', pending left: ' || (SELECT count(*) FROM change_pending) FROM changes"

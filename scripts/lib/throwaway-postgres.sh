# Sourced, not run: `throwaway_postgres_start` starts a PostgreSQL cluster of its own
# (initdb in a temporary directory, a free port on 127.0.0.1, trust authentication for
# user postgres, a database named test), exports WR_TEST_PG to it and stops and removes
# it when the calling script exits. As root, the cluster runs as an unprivileged user
# (PostgreSQL refuses root): $WR_TEST_PG_USER, default nobody.

# The directory with initdb, pg_ctl and createdb: $PG_BINDIR, else the PATH, else the
# newest /usr/lib/postgresql/N/bin (Debian and Ubuntu keep them there, off the PATH).
throwaway_postgres_bindir() {
  if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
  # Through symlinks: a PATH may link initdb alone, and createdb is needed beside it.
  if command -v initdb >/dev/null; then
    local real
    real=$(dirname "$(readlink -f "$(command -v initdb)")")
    if [ -x "$real/pg_ctl" ] && [ -x "$real/createdb" ]; then echo "$real"; return; fi
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/createdb" ]; then echo "$d"; return; fi
  echo "initdb not found: install the PostgreSQL server (Debian/Ubuntu: apt install postgresql)," >&2
  echo "set PG_BINDIR to the directory with initdb, or set WR_TEST_PG to a server to use" >&2
  return 1
}

throwaway_postgres_start() {
  local bindir run_as dir port attempt
  bindir=$(throwaway_postgres_bindir) || return 1
  run_as=()
  dir=$(mktemp -d "${TMPDIR:-/tmp}/wr-test-pg.XXXXXX")
  if [ "$(id -u)" = 0 ]; then
    local user=${WR_TEST_PG_USER:-nobody}
    chown "$user" "$dir"
    run_as=(runuser -u "$user" --)
  fi
  THROWAWAY_PG_DIR=$dir
  THROWAWAY_PG_RUN_AS=("${run_as[@]}")
  THROWAWAY_PG_BINDIR=$bindir
  trap throwaway_postgres_stop EXIT
  trap 'exit 130' INT TERM
  if ! "${run_as[@]}" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust \
      --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1; then
    echo "initdb failed:" >&2; cat "$dir/initdb.log" >&2; return 1
  fi
  # Below the kernel's ephemeral range: a client retrying a connect while the server is
  # down (the soak stops it) can be given the server's own port as its source port and
  # connect to itself, and the restarted server then cannot bind (CI saw pg_ctl fail so).
  local low
  low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  [ "$low" -gt 21000 ] 2>/dev/null || low=32768
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % (low - 20000)))
    # A port something already listens on answers the connect: take another.
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
    # Durability off: the cluster is thrown away; the tests check results, not crashes.
    THROWAWAY_PG_OPTS="-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    if "${run_as[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "$THROWAWAY_PG_OPTS" start >/dev/null; then
      "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres test
      export WR_TEST_PG="postgres://postgres@127.0.0.1:$port"
      echo "throwaway PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $dir)" >&2
      return 0
    fi
  done
  echo "could not start a throwaway PostgreSQL; its log:" >&2
  cat "$dir/server.log" >&2 2>/dev/null
  return 1
}

# Shell commands that stop the running throwaway cluster and start it again (for a
# test of the database going away).
throwaway_postgres_stop_cmd() {
  printf '%s ' "${THROWAWAY_PG_RUN_AS[@]}"
  printf '%q -D %q -m fast -w stop' "$THROWAWAY_PG_BINDIR/pg_ctl" "$THROWAWAY_PG_DIR/data"
}
# A start that fails prints the server log's tail and is tried again (three times).
throwaway_postgres_start_cmd() {
  local start
  start=$(printf '%s ' "${THROWAWAY_PG_RUN_AS[@]}"
    printf '%q -D %q -l %q -w -t 60 -o %q start' "$THROWAWAY_PG_BINDIR/pg_ctl" \
      "$THROWAWAY_PG_DIR/data" "$THROWAWAY_PG_DIR/server.log" "$THROWAWAY_PG_OPTS")
  printf 'for try in 1 2 3; do %s && exit 0; echo "PostgreSQL did not start (try $try); its log ends:" >&2; tail -n 15 %q >&2; sleep 2; done; exit 1' \
    "$start" "$THROWAWAY_PG_DIR/server.log"
}

throwaway_postgres_stop() {
  [ -n "${THROWAWAY_PG_DIR:-}" ] || return 0
  if [ -f "$THROWAWAY_PG_DIR/data/postmaster.pid" ]; then
    "${THROWAWAY_PG_RUN_AS[@]}" "$THROWAWAY_PG_BINDIR/pg_ctl" -D "$THROWAWAY_PG_DIR/data" \
      -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$THROWAWAY_PG_DIR"
  THROWAWAY_PG_DIR=
}

#!/usr/bin/env bash
# Makes sure the PostgreSQL the tests use answers on 127.0.0.1:5432; starts the local
# cluster if it is down. Tests never skip PostgreSQL: without it they fail.
set -euo pipefail
host=${PGHOST_TEST:-127.0.0.1}
port=${PGPORT_TEST:-5432}
if pg_isready -h "$host" -p "$port" -q 2>/dev/null; then
  exit 0
fi
echo "PostgreSQL is not answering on $host:$port; starting the local cluster" >&2
if ! command -v pg_ctlcluster >/dev/null || [ ! -d /etc/postgresql ]; then
  echo "no local PostgreSQL cluster to start; install postgresql or set WR_TEST_PG to a server" >&2
  exit 1
fi
pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
for _ in $(seq 1 30); do
  pg_isready -h "$host" -p "$port" -q && exit 0
  sleep 1
done
echo "PostgreSQL did not come up on $host:$port within 30s" >&2
exit 1

#!/usr/bin/env bash
# Checks the units in systemd/: `systemd-analyze verify` (with ExecStart pointed at the
# freshly built binary, since the installed path does not exist here) and an exposure
# of at most 1.5 from `systemd-analyze security --offline=yes` for the services.
set -euo pipefail
cd "$(dirname "$0")/.."
max_exposure=1.5
bin="$PWD/target/debug/webhook-reconciler"
[ -x "$bin" ] || cargo build --locked --quiet
if ! command -v systemd-analyze >/dev/null; then
  echo "systemd-analyze not found; install systemd" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for unit in systemd/*.service systemd/*.timer; do
  sed "s#/usr/local/bin/webhook-reconciler#$bin#" "$unit" > "$work/$(basename "$unit")"
done
status=0
for unit in "$work"/*.service "$work"/*.timer; do
  if ! out=$(systemd-analyze verify "$unit" 2>&1); then
    echo "systemd-analyze verify $(basename "$unit") failed:"; echo "$out"; status=1
  fi
done
for unit in "$work"/*.service; do
  level=$(systemd-analyze security --offline=yes "$unit" 2>/dev/null | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
  if [ -z "$level" ]; then
    echo "no exposure level for $(basename "$unit")"; status=1; continue
  fi
  if awk -v l="$level" -v m="$max_exposure" 'BEGIN { exit !(l > m) }'; then
    echo "$(basename "$unit"): exposure $level is above $max_exposure"; status=1
  else
    echo "$(basename "$unit"): verify OK, exposure $level (at most $max_exposure)"
  fi
done
exit $status

#!/usr/bin/env bash
# Checks config/prometheus-alerts.yml (`promtool check rules`, and `promtool test rules`
# with config/prometheus-alerts.test.yml: each alert fires on its series) and
# config/grafana-dashboard.json (valid JSON; every query parses as PromQL, checked by
# promtool as recording rules; every metric it or the alerts name is one the daemon
# exports). Installs promtool (Debian's prometheus package) when run as root without it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing promtool (apt-get install prometheus)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "promtool not found: install Debian's prometheus package (or Prometheus' release tarball)" >&2
    exit 1
  fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd config && promtool check rules prometheus-alerts.yml && promtool test rules prometheus-alerts.test.yml)
python3 - config/grafana-dashboard.json config/prometheus-alerts.yml "$work/dashboard-rules.yml" "$work/metrics.txt" <<'PY'
import json, re, sys
dash, alerts, rules_out, metrics_out = sys.argv[1:5]
d = json.load(open(dash))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
subst = lambda e: e.replace("$__rate_interval", "5m").replace("$instance", ".*").replace("$source", ".*")
with open(rules_out, "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        f.write(f"      - record: dashboard:query{i}\n        expr: {json.dumps(subst(e))}\n")
names = set()
for text in exprs + [open(alerts).read()]:
    names |= set(re.findall(r"\b((?:webhook|reconcile|feed|db|retention)_[a-z_]+)", text))
with open(metrics_out, "w") as f:
    f.write("\n".join(sorted(names)) + "\n")
print(f"dashboard: {len(d['panels'])} panels, {len(exprs)} queries")
PY
promtool check rules "$work/dashboard-rules.yml" >/dev/null && echo "dashboard queries: valid PromQL"
missing=0
while read -r name; do
  base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$name")
  if ! grep -rqE "(counter|gauge|histogram)!\(\s*\"$base\"" src; then
    echo "the dashboard or the alerts use $name, which the daemon does not export" >&2; missing=1
  fi
done < "$work/metrics.txt"
[ $missing = 0 ] && echo "metrics named by the dashboard and the alerts: all exported ($(wc -l < "$work/metrics.txt"))"
exit $missing

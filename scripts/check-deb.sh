#!/usr/bin/env bash
# Builds the Debian package and checks it as an operator would meet it, on this
# machine (as root): `dpkg -i`, `--version`, `check-config` on the installed example
# (with its two secrets provided as the units would), `systemd-analyze verify` of the
# installed units, the man page and completions in place; then `dpkg -r`, which must
# leave the configuration (a conffile) and remove the binary; then purge.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "check-deb.sh installs a package: run it as root" >&2; exit 1; }
deb=$(scripts/package-deb.sh | tail -n 1)
[ -f "$deb" ] || { echo "no package built (got: $deb)" >&2; exit 1; }
echo "package: $deb"
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\|Installed-Size\):/  \1:/p'
pkg=webhook-reconciler
cleanup() { dpkg --purge "$pkg" >/dev/null 2>&1 || true; rm -rf "$creds"; }
creds=$(mktemp -d)
trap cleanup EXIT
dpkg -i "$deb"
/usr/bin/webhook-reconciler --version
printf 'ci-webhook-secret' > "$creds/shop-webhook-secret"
printf 'ci-token' > "$creds/shop-token"
SHOP_WEBHOOK_SECRET=ci-webhook-secret CREDENTIALS_DIRECTORY=$creds \
  /usr/bin/webhook-reconciler --config /etc/webhook-reconciler/config.toml check-config >/dev/null
echo "check-config on /etc/webhook-reconciler/config.toml: OK"
for unit in webhook-reconciler.service webhook-reconciler-reconcile.service webhook-reconciler-reconcile.timer; do
  systemd-analyze verify "/lib/systemd/system/$unit"
  echo "systemd-analyze verify $unit: OK"
done
for f in /usr/share/man/man1/webhook-reconciler.1.gz /usr/share/bash-completion/completions/webhook-reconciler \
    /usr/share/zsh/vendor-completions/_webhook-reconciler /usr/share/fish/vendor_completions.d/webhook-reconciler.fish \
    /usr/share/doc/webhook-reconciler/README.md /usr/share/webhook-reconciler/prometheus-alerts.yml; do
  [ -s "$f" ] || { echo "missing from the package: $f" >&2; exit 1; }
done
grep -qx '/etc/webhook-reconciler/config.toml' /var/lib/dpkg/info/$pkg.conffiles ||
  { echo "config.toml is not a conffile" >&2; exit 1; }
dpkg -r "$pkg"
[ ! -e /usr/bin/webhook-reconciler ] || { echo "dpkg -r left the binary" >&2; exit 1; }
[ -f /etc/webhook-reconciler/config.toml ] || { echo "dpkg -r removed the configuration" >&2; exit 1; }
echo "dpkg -r: binary removed, configuration kept"

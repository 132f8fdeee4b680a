#!/usr/bin/env bash
# Builds the Debian package and walks the production path as the README writes it, on
# this machine (as root):
#  - `dpkg -i`; the installed configuration passes `check-config` as it is, and no
#    installed unit sets a variable that would override it;
#  - a PostgreSQL configuration with a source other than the example's ("billing", the
#    Stripe preset, one kind switched off), its credentials added the documented way (files
#    under /etc/webhook-reconciler/credentials and a unit drop-in with LoadCredential=):
#    `check-config` as systemd would run it (each LoadCredential= of the drop-in copied
#    into a $CREDENTIALS_DIRECTORY) and as the README runs it from a shell;
#    `systemd-analyze verify` of the units with the drop-in;
#  - on the empty database: `reconcile --dry-run` exits 2 saying to migrate and writes
#    nothing; then `migrate` and `status`;
#  - day 2 as the service runs: an unprivileged user (the unit's is dynamic), a Shopify
#    app with accounts.key and its webhook secret as credentials of a second drop-in, and
#    no --config: `check-config` reads the installed file, a shop is added and listed,
#    `status` runs;
#  - `dpkg -r` keeps the configuration and removes the binary; `dpkg -P` (after the units
#    were enabled) leaves no unit file, enable link or drop-in behind.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "check-deb.sh installs a package: run it as root" >&2; exit 1; }
deb=$(scripts/package-deb.sh | tail -n 1)
[ -f "$deb" ] || { echo "no package built (got: $deb)" >&2; exit 1; }
echo "package: $deb"
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\|Installed-Size\):/  \1:/p'
pkg=webhook-reconciler
wr=/usr/bin/webhook-reconciler
etc=/etc/webhook-reconciler
dropin=/etc/systemd/system/webhook-reconciler.service.d
fail() { echo "check-deb: $*" >&2; exit 1; }
# shellcheck source=lib/throwaway-postgres.sh
source scripts/lib/throwaway-postgres.sh
creds=$(mktemp -d)
cleanup() {
  dpkg --purge "$pkg" >/dev/null 2>&1 || true
  rm -rf "$creds" "$etc/credentials" "$dropin"
  throwaway_postgres_stop
}
throwaway_postgres_start
trap cleanup EXIT

dpkg -i "$deb"
$wr --version
env -u CREDENTIALS_DIRECTORY $wr --config $etc/config.toml check-config >/dev/null ||
  fail "the installed $etc/config.toml does not pass check-config as installed"
echo "check-config on the installed $etc/config.toml: OK"
if grep -n '^Environment=.*WEBHOOK_RECONCILER' /lib/systemd/system/webhook-reconciler*.service; then
  fail "an installed unit overrides the configuration file from its environment"
fi
echo "no installed unit overrides the configuration: OK"

# The walk: PostgreSQL, a Stripe source named billing, credentials through a drop-in.
createdb -h 127.0.0.1 -p "${WR_TEST_PG##*:}" -U postgres billing_walk
install -d -m700 $etc/credentials
printf 'whsec_check_deb_0123456789abcdef' | install -m600 /dev/stdin $etc/credentials/billing-webhook-secret
printf 'sk_test_check_deb' | install -m600 /dev/stdin $etc/credentials/billing-api-key
install -d "$dropin"
cat > "$dropin/billing.conf" <<'UNIT'
[Service]
LoadCredential=billing-webhook-secret:/etc/webhook-reconciler/credentials/billing-webhook-secret
LoadCredential=billing-api-key:/etc/webhook-reconciler/credentials/billing-api-key
UNIT
cat > $etc/config.toml <<TOML
[database]
url = "$WR_TEST_PG/billing_walk"

[sources.billing]
preset = "stripe"
api_token = { file = "\$CREDENTIALS_DIRECTORY/billing-api-key" }

[sources.billing.webhook]
secrets = [{ file = "\$CREDENTIALS_DIRECTORY/billing-webhook-secret" }]

[sources.billing.kinds.invoice]
enabled = false
TOML
# As systemd would: each LoadCredential=ID:PATH of the drop-in as \$CREDENTIALS_DIRECTORY/ID.
sed -n 's/^LoadCredential=\([^:]*\):\(.*\)$/\1 \2/p' "$dropin/billing.conf" |
  while read -r id path; do cp "$path" "$creds/$id"; done
CREDENTIALS_DIRECTORY=$creds $wr --config $etc/config.toml check-config > "$creds/check.out" ||
  fail "check-config with the drop-in's credentials failed"
grep -q 'postgres://' "$creds/check.out" || fail "check-config does not report the PostgreSQL database: $(cat "$creds/check.out")"
echo "check-config with the drop-in's credentials (as systemd runs it): OK"
CREDENTIALS_DIRECTORY=$etc/credentials $wr --config $etc/config.toml check-config >/dev/null ||
  fail "check-config as the README runs it from a shell failed"
echo "check-config from a shell (CREDENTIALS_DIRECTORY=$etc/credentials): OK"
for unit in webhook-reconciler.service webhook-reconciler-reconcile.service webhook-reconciler-reconcile.timer; do
  systemd-analyze verify "/lib/systemd/system/$unit"
  echo "systemd-analyze verify $unit: OK"
done
set +e
out=$(CREDENTIALS_DIRECTORY=$creds $wr --config $etc/config.toml reconcile --source billing --dry-run 2>&1)
code=$?
set -e
[ "$code" = 2 ] || fail "reconcile --dry-run on an empty database exited $code, not 2: $out"
grep -q 'run `webhook-reconciler migrate`' <<<"$out" || fail "reconcile --dry-run does not say to migrate: $out"
tables=$(psql -h 127.0.0.1 -p "${WR_TEST_PG##*:}" -U postgres -d billing_walk -tAc \
  "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
[ "$tables" = 0 ] || fail "the dry run wrote $tables table(s)"
echo "reconcile --dry-run on an empty database: exit 2, says to migrate, wrote nothing: OK"
CREDENTIALS_DIRECTORY=$creds $wr --config $etc/config.toml migrate >/dev/null
CREDENTIALS_DIRECTORY=$creds $wr --config $etc/config.toml status >/dev/null ||
  fail "status after migrate failed"
echo "migrate, then status: OK"

# Day 2, as the service runs: the service's own user (a dynamic user is an unprivileged
# uid; 65534 stands for it here), the credentials the drop-ins hand over in a directory
# only it reads, and no --config (the installed configuration is read). A Shopify app's
# shops on the same host: accounts.key and the webhook secret are credentials too.
printf '%s' "$($wr secret new --raw)" | install -m600 /dev/stdin $etc/credentials/accounts.key
printf 'shpss_check_deb_0123456789abcdef' | install -m600 /dev/stdin $etc/credentials/shopify-webhook-secret
printf 'shpat_check_deb_acme' | install -m600 /dev/stdin $etc/credentials/acme-token
cat > "$dropin/shopify.conf" <<'UNIT'
[Service]
LoadCredential=accounts.key:/etc/webhook-reconciler/credentials/accounts.key
LoadCredential=shopify-webhook-secret:/etc/webhook-reconciler/credentials/shopify-webhook-secret
UNIT
cat >> $etc/config.toml <<TOML

[accounts]
key = { file = "\$CREDENTIALS_DIRECTORY/accounts.key" }

[sources.shopify]
preset = "shopify"

[sources.shopify.webhook]
secrets = [{ file = "\$CREDENTIALS_DIRECTORY/shopify-webhook-secret" }]

[sources.shopify.accounts]
TOML
svc_creds=$(mktemp -d)
cat "$dropin"/*.conf | sed -n 's/^LoadCredential=\([^:]*\):\(.*\)$/\1 \2/p' |
  while read -r id path; do install -m400 -o 65534 -g 65534 "$path" "$svc_creds/$id"; done
chown 65534:65534 "$svc_creds" && chmod 500 "$svc_creds"
token=$(mktemp) && install -m400 -o 65534 -g 65534 $etc/credentials/acme-token "$token"
as_service() { (cd / && setpriv --reuid=65534 --regid=65534 --clear-groups env CREDENTIALS_DIRECTORY="$svc_creds" "$@"); }
as_service $wr check-config > "$creds/service-check.out" ||
  fail "check-config as the service's user, without --config, failed: $(cat "$creds/service-check.out")"
grep -q "file:     $etc/config.toml" "$creds/service-check.out" ||
  fail "check-config without --config did not read $etc/config.toml: $(cat "$creds/service-check.out")"
echo "check-config as the service's user, no --config, secrets from the drop-ins: OK"
as_service $wr accounts add shopify acme.myshopify.com --token-file "$token" >/dev/null ||
  fail "accounts add as the service's user failed"
as_service $wr accounts list shopify | grep -q 'acme.myshopify.com' ||
  fail "accounts list does not show the added shop"
as_service $wr status >/dev/null || fail "status as the service's user, without --config, failed"
echo "accounts add / list and status as the service's user, no --config: OK"
rm -rf "$svc_creds" "$token"

for f in /usr/share/man/man1/webhook-reconciler.1.gz /usr/share/bash-completion/completions/webhook-reconciler \
    /usr/share/zsh/vendor-completions/_webhook-reconciler /usr/share/fish/vendor_completions.d/webhook-reconciler.fish \
    /usr/share/doc/webhook-reconciler/README.md /usr/share/doc/webhook-reconciler/examples/config.toml \
    /usr/share/webhook-reconciler/prometheus-alerts.yml; do
  [ -s "$f" ] || fail "missing from the package: $f"
done
grep -qx "$etc/config.toml" /var/lib/dpkg/info/$pkg.conffiles || fail "config.toml is not a conffile"
! grep -q '#DEBHELPER#' /var/lib/dpkg/info/$pkg.postinst /var/lib/dpkg/info/$pkg.prerm /var/lib/dpkg/info/$pkg.postrm ||
  fail "a maintainer script holds a literal #DEBHELPER#"

# Enabled as the README says (systemctl works on the files without a running systemd).
systemctl enable webhook-reconciler.service webhook-reconciler-reconcile.timer >/dev/null 2>&1 || {
  install -d /etc/systemd/system/multi-user.target.wants /etc/systemd/system/timers.target.wants
  ln -sf /lib/systemd/system/webhook-reconciler.service /etc/systemd/system/multi-user.target.wants/
  ln -sf /lib/systemd/system/webhook-reconciler-reconcile.timer /etc/systemd/system/timers.target.wants/
}
[ -L /etc/systemd/system/multi-user.target.wants/webhook-reconciler.service ] || fail "the service was not enabled"
dpkg -r "$pkg"
[ ! -e $wr ] || fail "dpkg -r left the binary"
[ -f $etc/config.toml ] || fail "dpkg -r removed the configuration"
echo "dpkg -r: binary removed, configuration kept"
dpkg -P "$pkg"
left=$(find /lib/systemd/system /etc/systemd/system \( -name 'webhook-reconciler*' \) 2>/dev/null || true)
[ -z "$left" ] || fail "dpkg -P left unit files, links or drop-ins: $left"
[ ! -e $etc/config.toml ] || fail "dpkg -P left $etc/config.toml"
echo "dpkg -P: no unit file, enable link or drop-in left"

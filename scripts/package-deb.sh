#!/usr/bin/env bash
# Builds the Debian package: the release binary, then its generated assets (man pages
# and completions from the binary itself, the units with ExecStart in /usr/bin), then
# `cargo deb`. Prints the .deb's path last. Installs cargo-deb if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb (cargo install --locked cargo-deb)" >&2
  cargo install --locked --quiet cargo-deb
fi
cargo build --locked --release
# The binary is where cargo put it (CARGO_TARGET_DIR, if set); the generated assets stay
# in ./target/deb-assets, where Cargo.toml's [package.metadata.deb] names them.
bin="${CARGO_TARGET_DIR:-target}/release/webhook-reconciler"
assets=target/deb-assets
rm -rf "$assets" && mkdir -p "$assets"/{systemd,man,completions}
"$bin" man --dir "$assets/man"
gzip -9n "$assets"/man/*.1
"$bin" completions bash > "$assets/completions/webhook-reconciler"
"$bin" completions zsh > "$assets/completions/_webhook-reconciler"
"$bin" completions fish > "$assets/completions/webhook-reconciler.fish"
for unit in systemd/*.service systemd/*.timer; do
  sed -e 's#/usr/local/bin/webhook-reconciler#/usr/bin/webhook-reconciler#' \
      -e 's#/usr/local/share/doc/#/usr/share/doc/#' "$unit" > "$assets/systemd/$(basename "$unit")"
done
cargo deb --no-build --locked 2>&1 | tail -n 1

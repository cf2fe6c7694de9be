#!/usr/bin/env bash
# Builds target/debian/portcullis_VERSION_ARCH.deb: release binaries, man
# pages and shell completions, then cargo-deb (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deb >/dev/null; then
  cargo install cargo-deb --locked
fi
bash packaging/build-release.sh
# The launcher statically linked with musl: it starts twice per command,
# and glibc's start-up costs ~0.7 ms of CPU each time on a VM.
bash sandbox/build-static.sh
rm -rf target/assets
mkdir -p target/assets/completions
target/release/portcullis man target/assets/man
for shell in bash zsh fish; do
  target/release/portcullis completions "$shell" > "target/assets/completions/$shell"
done
mv target/assets/completions/bash target/assets/completions/portcullis.bash
mv target/assets/completions/zsh target/assets/completions/_portcullis
mv target/assets/completions/fish target/assets/completions/portcullis.fish
cargo deb --no-build --locked
ls target/debian/*.deb

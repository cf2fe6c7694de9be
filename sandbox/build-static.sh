#!/usr/bin/env bash
# Builds the launcher (portcullis-sandbox) statically linked with musl and
# installs it as target/release/portcullis-sandbox, where the daemon beside
# it looks for it; bench/run.sh and packaging/build-deb.sh call this.
#
# Why: every command starts the launcher twice (outside its world and
# inside it). On a VM each start of a program linked with glibc costs
# about 0.7 ms of CPU in glibc's start-up probing of the CPU (CPUID, which
# traps to the hypervisor); a static musl program skips it (0.07 ms for a
# hello world here). bench/README.md has the figures.
#
# The Rust target is installed with rustup when it is missing. Where there
# is no musl target for this host, the glibc build stays (a warning says so).
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) target=${host%-gnu}-musl ;;
  *) echo "build-static: no musl target for $host; the launcher stays as cargo built it" >&2; exit 0 ;;
esac
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target"
fi
cargo build --release --locked -p portcullis-sandbox --target "$target"
install -D -m 0755 "target/$target/release/portcullis-sandbox" target/release/portcullis-sandbox
echo "build-static: target/release/portcullis-sandbox is the $target build"

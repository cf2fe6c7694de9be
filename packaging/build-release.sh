#!/usr/bin/env bash
# The release build of the daemon and its launcher, as the .deb ships them.
# CI makes it once for the Python tests, the booted .deb and the bench;
# python/test.sh, packaging/build-deb.sh and bench/run.sh each call this
# script, so the command cannot drift between them (a different package
# set or flag would make cargo build everything again with fat LTO).
# Any arguments are added to the command (bench/run.sh adds
# `-p portcullis-bench`, whose crate turns on no feature of a shared
# dependency, so the daemon's build is reused).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo build --release --locked -p portcullis -p portcullis-sandbox --bins "$@"

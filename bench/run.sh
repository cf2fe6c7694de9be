#!/usr/bin/env bash
# Builds the release binaries and runs the benchmark harness from the
# repository root; any arguments go to portcullis-bench (--help lists them).
#
#   bash bench/run.sh --install-ssh     # the full run: writes bench/RESULTS.md and bench/chart.svg
#   bash bench/run.sh --quick           # small sizes: checks the harness works (about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/build-release.sh -p portcullis-bench
# The launcher as the .deb ships it: statically linked (see the script).
bash sandbox/build-static.sh
exec target/release/portcullis-bench "$@"

#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 30) and prints one line
# per target with libFuzzer's execution count. New inputs go to a temporary
# corpus; the committed seeds in fuzz/corpus/TARGET/ are only read.
# Exits non-zero if any target finds a crash (the input is left in
# fuzz/artifacts/TARGET/). cargo-fuzz needs nightly flags: on a stable
# toolchain RUSTC_BOOTSTRAP=1 unlocks them.
set -euo pipefail
seconds=${1:-30}
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1

cargo fuzz build --release >/dev/null 2>build.log || { cat build.log; exit 1; }
rm -f build.log

status=0
for target in $(cargo fuzz list); do
  work=$(mktemp -d) && mkdir "$work/corpus"
  log="$work/log"
  if cargo fuzz run --release "$target" "$work/corpus" "corpus/$target" -- \
       -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       >"$log" 2>&1; then
    execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -n 1 || true)
    echo "fuzz $target: ok, $execs execs in ${seconds}s (${cov:-cov: ?})"
  else
    echo "fuzz $target: FAILED"
    tail -n 60 "$log"
    status=1
  fi
  rm -rf "$work"
done
# The path target's fixture (a root with symlinks out of it).
rm -rf "${TMPDIR:-/tmp}"/portcullis-fuzz-path-*
exit $status

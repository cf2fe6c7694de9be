#!/usr/bin/env bash
# Running `true` remotely: ssh over a ControlMaster connection and with a
# new connection each time, against a throwaway sshd on 127.0.0.1. The
# gateway's figures for the same (`shell.exec /bin/true` on an open session
# and with a new connection) come from `cargo bench --bench gateway`; run
# both in one go to compare:
#
#   bash benches/exec_vs_ssh.sh [N]      (default 200 runs each)
set -euo pipefail
n=${1:-200}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  ssh -O exit -S "$work/ctl" 127.0.0.1 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
[ -x /usr/sbin/sshd ] || { echo "sshd is not installed (apt-get install -y openssh-server)"; exit 1; }
# shellcheck source=benches/sshd.sh
source "$here/benches/sshd.sh"
start_sshd

percentiles() { # label, then one latency in ms per line on stdin
  python3 -c '
import sys
xs = sorted(float(x) for x in sys.stdin)
p = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
print(f"{sys.argv[1]}: n={len(xs)} p50 {p(0.5):.2f} ms, p90 {p(0.9):.2f} ms, p99 {p(0.99):.2f} ms")
' "$1"
}
time_runs() { # count, command...
  local count=$1; shift
  for _ in $(seq "$count"); do
    local t0 t1
    t0=$(date +%s%N); "$@" > /dev/null; t1=$(date +%s%N)
    echo "scale=3; ($t1 - $t0) / 1000000" | bc
  done
}

ssh -fN -M -S "$work/ctl" "${ssh_opts[@]}" 127.0.0.1
time_runs 10 ssh -S "$work/ctl" "${ssh_opts[@]}" 127.0.0.1 true > /dev/null
time_runs "$n" ssh -S "$work/ctl" "${ssh_opts[@]}" 127.0.0.1 true |
  percentiles "ssh true over a ControlMaster connection"
time_runs "$((n / 4))" ssh "${ssh_opts[@]}" 127.0.0.1 true |
  percentiles "ssh true, new connection each"
time_runs "$n" /bin/true | percentiles "/bin/true from this shell (fork+exec floor, incl. date)"

#!/usr/bin/env bash
# File transfer over loopback: portcullis get/put/cat (the bundled client,
# release build) side by side with OpenSSH (scp, ssh cat) in the same run,
# on the same file, plus what the page cache and the disk allow.
#
#   bash benches/files_vs_ssh.sh [MIB] [RUNS]     (default 1024 MiB, 3 runs)
#
# Everything listens on 127.0.0.1 only and is stopped by PID at the end.
# OpenSSH rows are skipped (and say so) when sshd is not installed
# (apt-get install -y openssh-server). Prints a Markdown table of MB/s
# (10^6 bytes per second): best, median and every run.
set -euo pipefail
mib=${1:-1024}
runs=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
cargo build --release --quiet
bin="$here/target/release/portcullis"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

bytes=$((mib * 1024 * 1024))
head -c "$bytes" /dev/urandom > "$work/src.bin"
sha=$(sha256sum "$work/src.bin" | cut -d' ' -f1)
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# --- the gateway: the demo layout, on a free port --------------------------
port=$(free_port)
"$bin" serve --demo "$work/gw" > "$work/demo.out" 2>&1 &
demo_pid=$!
sleep 0.5; kill "$demo_pid" 2>/dev/null || true; wait "$demo_pid" 2>/dev/null || true
sed -i "s/127.0.0.1:7443/127.0.0.1:$port/" "$work/gw/portcullis.toml"
(cd "$work/gw" && exec "$bin" serve --config portcullis.toml > "$work/gw.log" 2>&1) &
pids+=($!)
key=$("$bin" keys show "$work/gw/gateway.key" --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["public_key"])')
for _ in $(seq 50); do grep -q "listening" "$work/gw.log" 2>/dev/null && break; sleep 0.1; done
target=(ws://127.0.0.1:$port --gateway-key "$key" --identity "$work/gw/client.key")
export XDG_CONFIG_HOME="$work/config"

# --- the transfers: a name and a command each -----------------------------
names=()
commands=()
transfer() {
  names+=("$1")
  commands+=("$(printf '%q ' "${@:2}")")
}

transfer "portcullis put (upload; gateway fsyncs and renames)" \
  "$bin" put "${target[@]}" "$work/src.bin" workspace:up.bin
transfer "portcullis get (download to a file, renamed into place)" \
  "$bin" get "${target[@]}" workspace:up.bin "$work/down.bin"
transfer "portcullis get --fsync" \
  "$bin" get "${target[@]}" --fsync workspace:up.bin "$work/down-fsync.bin"
transfer "portcullis cat (download to /dev/null)" \
  "$bin" cat "${target[@]}" workspace:up.bin

have_ssh=false
if [ -x /usr/sbin/sshd ]; then
  have_ssh=true
  # shellcheck source=benches/sshd.sh
  source "$here/benches/sshd.sh"
  start_sshd
  cipher=$(ssh -v "${ssh_opts[@]}" 127.0.0.1 true 2>&1 | grep -o 'cipher: [^ ]*' | head -1 || true)
  transfer "scp upload" scp "${scp_opts[@]}" "$work/src.bin" "127.0.0.1:$work/scp-up.bin"
  transfer "scp download" scp "${scp_opts[@]}" "127.0.0.1:$work/src.bin" "$work/scp-down.bin"
  transfer "ssh cat (upload)" \
    sh -c "ssh $(printf '%q ' "${ssh_opts[@]}") 127.0.0.1 'cat > $work/ssh-up.bin' < $work/src.bin"
  transfer "ssh cat (download to /dev/null)" ssh "${ssh_opts[@]}" 127.0.0.1 "cat $work/src.bin"
fi
transfer "cp (page cache, no fsync)" cp "$work/src.bin" "$work/cp.bin"
transfer "dd conv=fsync (disk)" dd if="$work/src.bin" of="$work/dd.bin" bs=4M conv=fsync status=none

# --- rounds: every transfer once per round, in turn, after one warm-up ----
# round (not counted): a VM's first touch of fresh page-cache memory is
# several times slower than any later one.
now() { date +%s.%N; }
declare -A results
for round in $(seq 0 "$runs"); do
  for i in "${!names[@]}"; do
    sync
    t0=$(now)
    eval "${commands[$i]}" > /dev/null
    t1=$(now)
    if [ "$round" -gt 0 ]; then
      results[$i]+="$(python3 -c "print(round($bytes / ($t1 - $t0) / 1e6))") "
    fi
  done
done
check() {
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ] || { echo "sha256 mismatch: $1" >&2; exit 1; }
}
check "$work/gw/workspace/up.bin"
check "$work/down.bin"
if $have_ssh; then
  check "$work/scp-up.bin"; check "$work/scp-down.bin"; check "$work/ssh-up.bin"
  echo "OpenSSH: $(ssh -V 2>&1), ${cipher:-cipher: default}"
else
  echo "OpenSSH rows skipped: /usr/sbin/sshd is not installed"
fi

echo
echo "$mib MiB file, $runs rounds after a warm-up, $(nproc) CPUs:" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo
echo "| transfer | best MB/s | median MB/s | runs |"
echo "|---|---|---|---|"
for i in "${!names[@]}"; do
  read -ra r <<< "${results[$i]}"
  sorted=$(printf '%s\n' "${r[@]}" | sort -n)
  best=$(echo "$sorted" | tail -1)
  median=$(echo "$sorted" | sed -n "$(( (${#r[@]} + 1) / 2 ))p")
  echo "| ${names[$i]} | $best | $median | ${r[*]} |"
done

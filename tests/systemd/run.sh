#!/usr/bin/env bash
# The booted-service test: installs the built .deb into a minimal Debian,
# boots it with systemd-nspawn, and uses the gateway from this host the way
# an operator and an agent would — a file read, a command and a tool call
# (with a secret passed as a systemd credential), a policy reload that
# revokes the session, the audit log, the journal — then stops the machine.
#
#   bash tests/systemd/run.sh            # builds the .deb if it is missing
#
# Needs root. The debootstrapped rootfs is cached in
# ${PORTCULLIS_ROOTFS_CACHE:-~/.cache/portcullis}/rootfs-bookworm-*; each run
# boots a fresh copy of it. The container shares the host's loopback, so the
# gateway listens on 127.0.0.1:$PORT (a socket unit holds it: this is also
# the socket-activation test).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
PORT=${PORTCULLIS_TEST_PORT:-17643}
RELAY_PORT=$((PORT + 1))
CACHE=${PORTCULLIS_ROOTFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/portcullis}
# The name changes with the package list, so a stale cache is not reused.
BASE=$CACHE/rootfs-bookworm-procps-bwrap

say() { echo "systemd-test: $*"; }
die() { echo "systemd-test: FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, systemd-nspawn)"
if ! command -v debootstrap >/dev/null || ! command -v systemd-nspawn >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap systemd-container >/dev/null
fi

if [ ! -d "$BASE" ]; then
  say "debootstrapping bookworm into $BASE (once)"
  mkdir -p "$CACHE"
  rm -rf "$BASE.tmp"
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,procps,bubblewrap \
    bookworm "$BASE.tmp" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap failed"; }
  mv "$BASE.tmp" "$BASE"
fi

DEB=$(ls -t target/debian/portcullis_*.deb 2>/dev/null | head -1 || true)
if [ -z "$DEB" ] || [ -n "${PORTCULLIS_REBUILD_DEB:-}" ]; then
  bash packaging/build-deb.sh
  DEB=$(ls -t target/debian/portcullis_*.deb | head -1)
fi
CLI=$REPO/target/release/portcullis
[ -x "$CLI" ] || die "$CLI is missing (packaging/build-deb.sh builds it)"

WORK=$(mktemp -d /var/tmp/portcullis-boot.XXXXXX)
ROOT=$WORK/root
NSPAWN_PID=
WEB_PID=
cleanup() {
  if [ -n "$WEB_PID" ]; then kill "$WEB_PID" 2>/dev/null || true; fi
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
  fi
  if [ -z "${PORTCULLIS_KEEP_MACHINE:-}" ]; then rm -rf "$WORK"; else say "kept $WORK"; fi
}
trap cleanup EXIT
export HOME=$WORK/home   # the client remembers gateway keys under ~/.config
mkdir -p "$HOME"

say "installing $(basename "$DEB") into a fresh copy of the rootfs"
cp -a "$BASE" "$ROOT"
cp "$DEB" "$ROOT/var/tmp/portcullis.deb"
in_root() { systemd-nspawn -q --register=no --keep-unit -D "$ROOT" "$@"; }
in_root dpkg -i /var/tmp/portcullis.deb >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log"; die "dpkg -i failed"; }
grep -q "created the gateway key" "$WORK/dpkg.log" || { cat "$WORK/dpkg.log"; die "postinst made no gateway key"; }
[ -L "$ROOT/etc/systemd/system/multi-user.target.wants/portcullis.service" ] || die "postinst did not enable the service"

# An "outside" web server for the egress allow-list, on the host's loopback
# (the container shares it), which the proxy reaches through the unit's
# IP filter (localhost is allowed).
WEB_PORT=$((PORT + 1))
mkdir -p "$WORK/web"
echo "hello from outside" >"$WORK/web/hello.txt"
setsid python3 -m http.server --bind 127.0.0.2 --directory "$WORK/web" "$WEB_PORT" >"$WORK/web.log" 2>&1 </dev/null &
WEB_PID=$!

# The operator's part: a principal (this host's client key), a grant, a
# tool with a secret, the secret as a credential, the socket on $PORT.
"$CLI" keys generate "$WORK/client.key" >/dev/null
CLIENT_KEY=$("$CLI" keys show "$WORK/client.key" --json | sed 's/.*"public_key":"\([^"]*\)".*/\1/')
GATEWAY_KEY=$("$CLI" keys show "$ROOT/var/lib/portcullis/gateway.key" --json | sed 's/.*"public_key":"\([^"]*\)".*/\1/')
cat >"$ROOT/etc/portcullis/policy.toml" <<EOF
[[root]]
id = "workspace"
path = "/srv/portcullis/workspace"
virtual_path = "/workspace"

[[root]]
id = "linked"
path = "/srv/portcullis/linked"
virtual_path = "/linked"
follow_symlinks = true

[[principal]]
id = "agent"
public_key = "$CLIENT_KEY"

[[grant]]
id = "agent"
principals = ["agent"]
fileops = { workspace = "rw", linked = "rw" }
shell = { commands = ["echo", "id", "sleep", "nice", "sh"], network = "deny", env_set = { PATH = "/usr/bin:/bin" }, max_processes = 3, max_tmp = "8 MiB" }
tools = { allow = ["greet"] }

[[grant]]
id = "agent-web"
principals = ["agent"]
shell = { commands = ["bash"], network = { allow = ["web.test:$WEB_PORT", "127.0.0.2:$WEB_PORT"] }, env_set = { PATH = "/usr/bin:/bin" } }

[[tool]]
name = "greet"
description = "Greets with a secret greeting."
input_schema = { type = "object", required = ["name"], properties = { name = { type = "string" } } }
risk = "low"
approval_policy = "allow"
script = "/etc/portcullis/tools/greet.rhai"
secrets = ["greeting"]
EOF
cat >>"$ROOT/etc/portcullis/portcullis.toml" <<EOF

[egress.resolve]
"web.test" = ["127.0.0.2"]

# Dial-out: to a runtime on this host's loopback (the test's CLI, below),
# the token from a systemd credential.
[[relay]]
url = "ws://127.0.0.1:$RELAY_PORT/api/v1/relay/connect"
token_credential = "relay-token"
EOF
head -c 24 /dev/urandom | base64 >"$WORK/relay.token"
install -m 600 "$WORK/relay.token" "$ROOT/etc/portcullis/relay.token"
mkdir -p "$ROOT/etc/portcullis/tools"
echo 'secret("greeting") + ", " + args.name' >"$ROOT/etc/portcullis/tools/greet.rhai"
echo "psst-hello" >"$ROOT/etc/portcullis/secrets/greeting"
echo "hello from the booted machine" >"$ROOT/srv/portcullis/workspace/hello.txt"
# Symlinks for the file requests below, which walk paths under the unit.
ln -s /etc/portcullis/policy.toml "$ROOT/srv/portcullis/workspace/abs"
ln -s hello.txt "$ROOT/srv/portcullis/workspace/in"
mkdir -p "$ROOT/srv/portcullis/linked/sub"
echo "linked inside" >"$ROOT/srv/portcullis/linked/sub/file"
ln -s sub/file "$ROOT/srv/portcullis/linked/in"
ln -s ../workspace/hello.txt "$ROOT/srv/portcullis/linked/up"
ln -s /srv/portcullis/workspace/hello.txt "$ROOT/srv/portcullis/linked/abs"
ln -s ../../workspace/hello.txt "$ROOT/srv/portcullis/linked/sub/out"
in_root chown -R portcullis:portcullis /srv/portcullis/workspace /srv/portcullis/linked
mkdir -p "$ROOT/etc/systemd/system/portcullis.service.d" "$ROOT/etc/systemd/system/portcullis.socket.d"
cat >"$ROOT/etc/systemd/system/portcullis.service.d/test.conf" <<EOF
[Service]
LoadCredential=greeting:/etc/portcullis/secrets/greeting
LoadCredential=relay-token:/etc/portcullis/relay.token
EOF
cat >"$ROOT/etc/systemd/system/portcullis.socket.d/test.conf" <<EOF
[Socket]
ListenStream=
ListenStream=127.0.0.1:$PORT
EOF
in_root systemctl enable portcullis.socket >/dev/null 2>&1
in_root portcullis policy check /etc/portcullis/policy.toml >/dev/null || die "the test policy does not check"

say "booting the machine"
# nspawn's own system-call filter (systemd 252) predates openat2's and
# Landlock's use in containers and answers them ENOSYS; let them through so
# the unit's filter is the one under test.
setsid systemd-nspawn --register=no --keep-unit -b -D "$ROOT" \
  --system-call-filter="openat2 landlock_create_ruleset landlock_add_rule landlock_restrict_self" \
  >"$WORK/boot.log" 2>&1 </dev/null &
NSPAWN_PID=$!
LEADER=
for _ in $(seq 1 300); do
  LEADER=$(pgrep -P "$NSPAWN_PID" -x systemd | head -1 || true)
  [ -n "$LEADER" ] && break
  sleep 0.1
done
[ -n "$LEADER" ] || { cat "$WORK/boot.log"; die "the container did not start"; }
inside() { nsenter -t "$LEADER" -m -u -i -p -- "$@"; }

state=
for _ in $(seq 1 240); do
  state=$(inside systemctl is-active portcullis.service 2>/dev/null || true)
  [ "$state" = active ] && break
  sleep 0.5
done
if [ "$state" != active ]; then
  inside systemctl status portcullis.service --no-pager || true
  inside journalctl -u portcullis --no-pager -n 50 || true
  die "portcullis.service is '$state', not active, after 120 s"
fi
say "portcullis.service is active (Type=notify: READY=1 was sent)"
# --man=no: minbase has no `man`; the page itself is checked here.
inside systemd-analyze verify --man=no portcullis.service portcullis.socket >"$WORK/verify.log" 2>&1 \
  || { cat "$WORK/verify.log"; die "systemd-analyze verify failed"; }
[ -f "$ROOT/usr/share/man/man1/portcullis.1.gz" ] || die "man page portcullis(1) is not installed"
say "systemd-analyze verify (installed units) and the man page: ok"
grep -q "serving on 127.0.0.1:$PORT" <<<"$(inside systemctl show portcullis.service -p StatusText)" \
  || die "no STATUS= line naming the inherited socket: $(inside systemctl show portcullis.service -p StatusText)"

URL=ws://127.0.0.1:$PORT
C=(--gateway-key "$GATEWAY_KEY" --identity "$WORK/client.key")
out=$("$CLI" cat "$URL" "${C[@]}" workspace:hello.txt) || die "file read failed"
[ "$out" = "hello from the booted machine" ] || die "file read gave '$out'"
say "file read: ok"
# The unit refuses openat2 (RestrictSUIDSGID=), so the gateway resolves
# paths one component at a time (confine/src/walk.rs): still beneath the
# root, symlinks only where the root follows them and only inside it.
grep -q "files: openat2 is refused here" <<<"$(inside journalctl -u portcullis --no-pager)" \
  || die "the journal does not say paths are walked (is openat2 allowed under the unit?)"
for path in workspace:abs workspace:in linked:up linked:abs linked:sub/out; do
  out=$("$CLI" cat "$URL" "${C[@]}" "$path" 2>&1) && die "cat $path should be refused, gave: $out"
  grep -q "leaves its root or goes through a symlink" <<<"$out" || die "cat $path: $out"
done
out=$("$CLI" cat "$URL" "${C[@]}" linked:in) || die "cat linked:in failed: $out"
[ "$out" = "linked inside" ] || die "cat linked:in gave '$out'"
echo "made under the unit" >"$WORK/made.txt"
"$CLI" mkdir "$URL" "${C[@]}" linked:sub/new >/dev/null || die "mkdir linked:sub/new failed"
"$CLI" put "$URL" "${C[@]}" "$WORK/made.txt" linked:sub/new/made.txt >/dev/null || die "put failed"
out=$("$CLI" cat "$URL" "${C[@]}" linked:sub/new/made.txt) || die "cat of the put file failed: $out"
[ "$out" = "made under the unit" ] || die "the put file reads '$out'"
say "file paths walked under the unit (openat2 refused): escapes and forbidden symlinks refused, inner ones followed, mkdir and put: ok"
out=$("$CLI" exec "$URL" "${C[@]}" -- id -un) || die "exec failed"
[ "$out" = portcullis ] || die "exec id -un gave '$out'"
say "command (as user '$out'): ok"
# The same gateway dials out to a runtime here (its backoff may have grown
# while nothing listened: the CLI waits for the next attempt).
out=$(timeout 90 "$CLI" exec "listen://127.0.0.1:$RELAY_PORT" "${C[@]}" --relay-token-file "$WORK/relay.token" -- id -un) \
  || die "exec over the connection the gateway dialed failed: $out"
[ "$out" = portcullis ] || die "exec over the dialed connection gave '$out'"
grep -q "relay ws://127.0.0.1:$RELAY_PORT/api/v1/relay/connect" <<<"$(inside portcullis status)" \
  || die "portcullis status does not show the relay endpoint: $(inside portcullis status)"
say "dial-out (token from a credential; the CLI as the runtime): ok"

# A command shares nothing with the daemon, under the unit as an operator
# runs it: its own namespaces (bubblewrap), as the service user.
out=$("$CLI" exec "$URL" "${C[@]}" -- sh -c \
  'test -e /run/portcullis/admin.sock && echo ADMIN-SOCKET; cat /etc/portcullis/policy.toml /run/credentials/*/greeting 2>/dev/null; grep -l CREDENTIALS_DIRECTORY /proc/*/environ 2>/dev/null; echo end') \
  || die "the isolation probe failed: $out"
[ "$out" = end ] || die "a command reached the daemon's socket, config, credentials or environment: $out"
out=$("$CLI" exec "$URL" "${C[@]}" -- sh -c 'for i in 1 2 3 4 5 6; do sleep 2 & done; wait; echo done' 2>&1) || true
grep -qi "resource temporarily unavailable\|cannot fork" <<<"$out" \
  || die "six processes under max_processes = 3: $out"
"$CLI" exec "$URL" "${C[@]}" -- sh -c 'setsid sleep 301 >/dev/null 2>&1 & echo started' >/dev/null \
  || die "the survivor probe failed"
for _ in $(seq 1 50); do inside pgrep -f "sleep 301" >/dev/null || break; sleep 0.1; done
inside pgrep -f "sleep 301" >/dev/null && die "a setsid process outlived its command"
# Its /tmp and /dev/shm are its own and bounded (max_tmp), also as the
# service user, for whom bwrap nests a second user namespace.
out=$("$CLI" exec "$URL" "${C[@]}" -- sh -c \
  'dd if=/dev/zero of=/tmp/fill bs=1M count=16 2>&1 | grep -o "No space left on device"; df -k /dev/shm | tail -1') \
  || die "the /tmp probe failed: $out"
head -1 <<<"$out" | grep -q "No space left on device" || die "16 MiB fit in /tmp under max_tmp = 8 MiB: $out"
echo "$out" | tail -1 | awk '{exit !($2 == 8192)}' || die "/dev/shm is not 8 MiB: $out"
say "a command sees no admin socket, config, credentials or other environments; max_processes counts all its processes; nothing outlives it; /tmp and /dev/shm are bounded by max_tmp: ok"
# RestrictSUIDSGID=: no set-uid file for other local users to run as the
# service's user.
out=$("$CLI" exec "$URL" "${C[@]}" -- sh -c \
  'cd /srv/portcullis/workspace && echo x >suid && chmod 4755 suid; stat -c %a suid' 2>&1) || true
grep -q "Operation not permitted" <<<"$out" || die "chmod 4755 in a root: $out"
grep -qx 600 <<<"$out" || die "a command made a set-uid file: $out"
say "a command cannot make a set-uid file (RestrictSUIDSGID=): ok"
# Under the unit the daemon has no cgroups (ProtectControlGroups) and no
# setpriority (~@resources): launchers wait at the daemon's priority, the
# journal says why, and a command runs at nice 0 and cannot change it.
grep -q "launchers are started at the daemon's CPU priority" <<<"$(inside journalctl -u portcullis --no-pager)" \
  || die "the daemon did not say launchers wait at its priority"
for _ in $(seq 1 50); do
  waiting=$(inside ps -e -o ni=,comm= | awk '$2 ~ /^portcullis-sand/ {print $1}' | sort -un | tr '\n' ' ')
  [ "$waiting" = "0 " ] && break
  sleep 0.1
done
[ "$waiting" = "0 " ] || die "idle launchers at nice '$waiting', not 0"
out=$("$CLI" exec "$URL" "${C[@]}" -- nice) || die "exec nice failed"
[ "$out" = 0 ] || die "a command from the pool runs at nice '$out', not 0"
# GNU nice warns and runs the program anyway when setpriority is refused.
out=$("$CLI" exec "$URL" "${C[@]}" -- nice -n 5 nice 2>&1) || true
grep -q "cannot set niceness: Operation not permitted" <<<"$out" \
  || die "nice -n 5 under the unit: $out"
say "launchers wait at nice $waiting(no setpriority under the unit), a command runs at nice 0 and cannot renice: ok"
# Egress through the daemon's proxy, under the unit: a listed name is
# fetched (bash's /dev/tcp to the proxy variable's port), an unlisted one is
# refused, and nothing goes straight out.
fetch='exec 3<>/dev/tcp/127.0.0.1/3128; printf "GET http://%s/hello.txt HTTP/1.0\r\n\r\n" "$1" >&3; cat <&3'
out=$("$CLI" exec "$URL" "${C[@]}" -- bash -c "$fetch" fetch "web.test:$WEB_PORT") || die "the egress fetch failed: $out"
grep -q "hello from outside" <<<"$out" || die "the allowed fetch gave: $out"
out=$("$CLI" exec "$URL" "${C[@]}" -- bash -c "$fetch" fetch "other.test:$WEB_PORT") || die "the refused fetch failed: $out"
grep -q "403" <<<"$out" || die "an unlisted name was not refused: $out"
out=$("$CLI" exec "$URL" "${C[@]}" -- bash -c "exec 3<>/dev/tcp/127.0.0.2/$WEB_PORT && echo CONNECTED || echo refused" 2>&1) || true
grep -q CONNECTED <<<"$out" && die "a command reached the outside server without the proxy"
egress=$(inside portcullis audit list --json --limit 100 --method 'egress.*') || die "audit list (egress) failed"
grep -q '"kind":"egress_start"' <<<"$egress" || die "no egress_start entry: $egress"
grep -q '"decision":"blocked"' <<<"$egress" || die "no refused egress entry: $egress"
say "egress through the proxy (listed name fetched, unlisted refused, no way around it, audited): ok"
out=$("$CLI" tool call "$URL" "${C[@]}" greet '{"name": "operator"}') || die "tool call failed"
grep -q '\[REDACTED:greeting\], operator' <<<"$out" || die "tool call gave '$out' (the credential should be loaded and redacted)"
grep -q psst <<<"$out" && die "the secret leaked: $out"
say "tool call with a credential: ok ($out)"

# A session in flight, then a reload that takes its grant away.
"$CLI" exec "$URL" "${C[@]}" -- sleep 60 >"$WORK/long.out" 2>&1 &
LONG=$!
sleep 2
kill -0 "$LONG" 2>/dev/null || { cat "$WORK/long.out"; die "the long command ended early"; }
sed -i 's/^public_key = .*/&\ndisabled = true/' "$ROOT/etc/portcullis/policy.toml"
inside systemctl reload portcullis.service
for _ in $(seq 1 100); do kill -0 "$LONG" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$LONG" 2>/dev/null; then kill "$LONG"; die "the session outlived the reload that revoked it"; fi
wait "$LONG" && die "the revoked command reported success"
grep -qi "revoked\|permission" "$WORK/long.out" || die "the revoked command said: $(cat "$WORK/long.out")"
say "reload revoked the session: $(tr '\n' ' ' <"$WORK/long.out")"

audit=$(inside portcullis audit list --json --limit 100) || die "audit list failed"
for needle in '"method":"file.read"' '"command":"id"' '"tool":"greet"' 'session_revoked'; do
  grep -q "$needle" <<<"$audit" || die "audit list --json has no $needle"
done
grep -q psst <<<"$audit" && die "the secret is in the audit log"
inside portcullis audit verify >/dev/null || die "audit verify failed"
say "audit list and verify (inside): ok"
metrics=$(inside portcullis metrics) || die "portcullis metrics failed"
grep -q '^portcullis_requests_total{method="file.read",decision="allowed"} 8$' <<<"$metrics" \
  || die "metrics do not count the 8 file reads: $metrics"
say "metrics (inside): ok"

journal=$(inside journalctl -u portcullis -o json --no-pager)
grep -q '"SYSLOG_IDENTIFIER":"portcullis"' <<<"$journal" || die "no portcullis entries in the journal"
grep -q '"PRINCIPAL":"agent"' <<<"$journal" || die "the journal has no structured fields (PRINCIPAL)"
say "journal has structured entries: ok"

exposure=$(systemd-analyze security --offline=true "$REPO/systemd/portcullis.service" 2>/dev/null \
  | tail -1 | grep -o '[0-9][0-9]*\.[0-9]' | head -1)
awk -v e="$exposure" 'BEGIN { exit !(e != "" && e + 0 <= 2.0) }' \
  || die "the unit's exposure is '$exposure' (systemd-analyze security), over 2.0"
say "unit exposure: $exposure (at most 2.0)"
say "stopping the machine (SIGTERM to systemd-nspawn $NSPAWN_PID)"
kill -TERM "$NSPAWN_PID"
for _ in $(seq 1 60); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$NSPAWN_PID" 2>/dev/null && die "the machine did not shut down within 30 s"
NSPAWN_PID=
say "PASS"

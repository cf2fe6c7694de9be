# Sourced by the benches: starts a throwaway sshd on 127.0.0.1 with fresh
# host and client keys under $work/ssh, appends its PID to the caller's
# `pids`, and sets ssh_opts / scp_opts. Needs openssh-server installed.
start_sshd() {
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$work/ssh" /run/sshd && chmod 700 "$work/ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host"
  ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/client"
  printf '%s\n' \
    "ListenAddress 127.0.0.1" "Port $port" "HostKey $work/ssh/host" \
    "AuthorizedKeysFile $work/ssh/client.pub" "PasswordAuthentication no" \
    "StrictModes no" "PidFile $work/ssh/sshd.pid" \
    "Subsystem sftp /usr/lib/openssh/sftp-server" > "$work/ssh/sshd_config"
  /usr/sbin/sshd -D -f "$work/ssh/sshd_config" -E "$work/ssh/sshd.log" &
  pids+=($!)
  sleep 0.5
  local common=(-i "$work/ssh/client" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
                -o LogLevel=ERROR -o BatchMode=yes)
  ssh_opts=(-p "$port" "${common[@]}")
  scp_opts=(-P "$port" "${common[@]}")
}

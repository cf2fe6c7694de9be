//! A command shares nothing with the daemon: tried as an agent would,
//! with a grant of `sh`, `python3` and `cat`, `network = "deny"`,
//! `max_tmp = "8 MiB"` and one rw root (bob's: `max_processes = 3`, `max_memory = "64 MiB"`,
//! `max_cpu = 0.25`), against the real binary. Each attack must fail, and the host
//! must show it did (nothing changed, nothing left running). These run as
//! the test's user — root in CI, as the demo daemon does.

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::time::{Duration, Instant};

use common::{Gateway, key_b64, processes_with};
use portcullis_client::Client;
use portcullis_crypto::StaticKeypair;
use serde_json::{Value, json};

const PLANTED: &str = "planted-daemon-secret-4f1d";
const BOBS_TOKEN: &str = "bobs-github-token-9a7c";

fn policy(alice: &StaticKeypair, bob: &StaticKeypair) -> String {
    format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[principal]]
id = "bob"
public_key = "{bob}"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[grant]]
id = "alice"
principals = ["alice"]
fileops = {{ main = "rw" }}
shell = {{ commands = ["sh", "python3", "cat"], cwd_roots = ["main"], env_set = {{ PATH = "/usr/bin:/bin" }}, network = "deny", persist = true, pty = true, max_processes = 12, max_tmp = "8 MiB" }}

[[grant]]
id = "bob"
principals = ["bob"]
shell = {{ commands = ["sh", "python3", "df"], env_set = {{ PATH = "/usr/bin:/bin", GITHUB_TOKEN = "{token}" }}, persist = true, max_processes = 3, max_memory = "64 MiB", max_cpu = 0.25 }}
"#,
        alice = key_b64(alice),
        bob = key_b64(bob),
        token = BOBS_TOKEN,
    )
}

struct Setup {
    gw: Gateway,
    alice: Client,
    bob: Client,
}

async fn setup() -> Setup {
    let (a, b) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let env = [("AWS_SECRET_ACCESS_KEY", PLANTED)];
    let gw = Gateway::start_with_env(&policy(&a, &b), "", &env);
    let alice = gw.connect(&a).await.unwrap();
    alice.accept_all().await.unwrap();
    let bob = gw.connect(&b).await.unwrap();
    bob.accept_all().await.unwrap();
    Setup { gw, alice, bob }
}

/// Runs `script` with `sh -c` in the root; the result.
async fn sh(client: &Client, script: &str) -> Value {
    exec(client, json!(["sh", "-c", script])).await
}

/// Runs a Python program; the result.
async fn python(client: &Client, program: &str) -> Value {
    exec(client, json!(["python3", "-c", program])).await
}

async fn exec(client: &Client, command: Value) -> Value {
    let request = json!({"command": command, "root_id": "main", "cwd": ""});
    client.request("shell.exec", request).await.unwrap()
}

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn the_daemon_s_socket_files_and_secrets_are_out_of_reach() {
    let Setup { gw, alice, .. } = setup().await;
    // The admin socket (approving its own tool calls), the daemon's
    // policy, key and state, a credentials directory under /run.
    let run_dir = std::path::PathBuf::from(format!("/run/portcullis-test-{}", std::process::id()));
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(run_dir.join("secret"), PLANTED).unwrap();
    let targets = [
        gw.admin_socket(),
        gw.dir.join("policy.toml"),
        gw.dir.join("gateway.key"),
        gw.dir.join("state"),
        run_dir.join("secret"),
    ];
    for target in &targets {
        let program = format!(
            "import socket, os\n\
             p = {target:?}\n\
             try:\n    s = socket.socket(socket.AF_UNIX); s.connect(p); print('CONNECTED')\n\
             except OSError as e: print('refused', e.errno)\n\
             try:\n    print('READ', open(p).read())\n\
             except OSError as e: print('refused', e.errno)\n\
             print('EXISTS' if os.path.exists(p) else 'absent')",
            target = target.display().to_string()
        );
        let r = python(&alice, &program).await;
        let out = stdout(&r);
        assert!(out.contains("absent"), "{}: {r}", target.display());
        assert!(!out.contains("CONNECTED") && !out.contains("READ"), "{r}");
    }
    let _ = std::fs::remove_dir_all(&run_dir);

    // /etc without what only root may read: the test runs as root, as the
    // demo daemon does, and the command's uid is root in its namespace.
    let r = sh(
        &alice,
        "cat /etc/shadow; echo status=$?; head -c 4 /etc/passwd",
    )
    .await;
    assert!(stdout(&r).contains("status=1"), "{r}");
    assert!(stdout(&r).ends_with("root"), "{r}");
}

/// Nothing the daemon, the launchers or bwrap held reaches the command:
/// its stdin, stdout and stderr only.
#[tokio::test]
async fn a_command_inherits_no_descriptor_but_its_three() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // No pipeline: the shell holds a pipe's ends while it starts one.
    let r = sh(&alice, "ls /proc/$$/fd; :").await;
    assert_eq!(stdout(&r), "0\n1\n2\n", "{r}");
}

#[tokio::test]
async fn other_environments_are_invisible() {
    let Setup { gw, alice, bob } = setup().await;
    // bob's persistent process holds his token in its environment.
    let marker = format!("bob-holds-{}", std::process::id());
    let start = json!({"command": ["sh", "-c", format!("sleep 30; : {marker}")]});
    let _running = bob.start("shell.start", start).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "bob's process started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let script = format!(
        "cat /proc/{daemon}/environ; echo; cat /proc/*/environ | tr '\\0' '\\n'; ls /proc",
        daemon = gw.pid()
    );
    let r = sh(&alice, &script).await;
    let out = stdout(&r);
    assert!(!out.contains(PLANTED), "the daemon's environment: {r}");
    assert!(
        !out.contains(BOBS_TOKEN),
        "another principal's environment: {r}"
    );
    // Its own PID namespace: the launcher's init, itself and little else.
    let pids: Vec<u32> = out.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(pids.iter().all(|pid| *pid < 20), "{pids:?}");
    assert!(!pids.contains(&gw.pid()), "{r}");
}

#[tokio::test]
async fn metadata_outside_every_root_cannot_change() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // A file outside every root but visible (below /opt, read-only in the
    // command's world).
    let dir = std::path::PathBuf::from(format!("/opt/portcullis-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("file");
    std::fs::write(&file, "host\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = std::fs::metadata(&file).unwrap();
    let program = format!(
        "import os\n\
         p = {path:?}\n\
         for name, f in [('chmod', lambda: os.chmod(p, 0o777)), ('chown', lambda: os.chown(p, 65534, 65534)),\n\
                         ('utime', lambda: os.utime(p, (0, 0))), ('xattr', lambda: os.setxattr(p, 'user.x', b'1')),\n\
                         ('write', lambda: open(p, 'a').write('x'))]:\n\
         \x20   try:\n\
         \x20       f(); print(name, 'CHANGED')\n\
         \x20   except OSError as e: print(name, 'refused', e.errno)",
        path = file.display().to_string()
    );
    let r = python(&alice, &program).await;
    let after = std::fs::metadata(&file).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!stdout(&r).contains("CHANGED"), "{r}");
    assert_eq!(stdout(&r).matches("refused").count(), 5, "{r}");
    assert_eq!(before.mode(), after.mode());
    assert_eq!((before.uid(), before.gid()), (after.uid(), after.gid()));
    assert_eq!(before.mtime(), after.mtime());
    assert_eq!(before.len(), after.len());
}

#[tokio::test]
async fn orphans_in_a_command_s_world_are_reaped() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // Five children that each leave an orphan which exits at once: the
    // world's init (the launcher inside) reaps them, so none stays a
    // zombie holding a pid of the grant's max_processes.
    let script = "for i in 1 2 3 4 5; do sh -c 'true &'; done; sleep 0.5; \
                  echo zombies $(grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l); \
                  echo init $(cat /proc/1/comm)";
    let r = sh(&alice, script).await;
    assert_eq!(stdout(&r), "zombies 0\ninit portcullis-sand\n", "{r}");
}

#[tokio::test]
async fn a_command_s_tmp_and_shm_are_its_own() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // Programs need a writable /tmp (mktemp, compilers, pip) and /dev/shm
    // (Python's multiprocessing): the world's own, empty at the start,
    // gone at the end, never the host's.
    let name = format!("portcullis-private-{}", std::process::id());
    // (A root below /tmp, as the tests' are, shows there as its path.)
    let seen = format!(
        "ls -A /dev/shm; for f in /tmp/{name} /dev/shm/{name}; do test -e $f && echo seen $f; done"
    );
    let script = format!(
        "{seen}; echo made > /tmp/{name} && echo made > /dev/shm/{name} \
         && cat /tmp/{name} /dev/shm/{name} && mktemp"
    );
    let first = sh(&alice, &script).await;
    assert_eq!(first["exit_code"], 0, "{first}");
    assert!(
        stdout(&first).starts_with("made\nmade\n/tmp/tmp."),
        "{first}"
    );
    let program = "from multiprocessing import shared_memory as s; m = s.SharedMemory(create=True, size=64); m.close(); m.unlink(); print('shm ok')";
    let r = python(&alice, program).await;
    assert_eq!(stdout(&r), "shm ok\n", "{r}");
    // The next command starts from empty ones, and the host never saw them.
    let second = sh(&alice, &seen).await;
    assert_eq!(stdout(&second), "", "{second}");
    assert!(!std::path::Path::new("/tmp").join(&name).exists());
    assert!(!std::path::Path::new("/dev/shm").join(&name).exists());
}

#[tokio::test]
async fn a_command_cannot_fill_memory_through_its_tmp_or_shm() {
    let Setup {
        gw: _gw,
        alice,
        bob,
    } = setup().await;
    // Both are tmpfs, memory the host does not get back while the command
    // lives. Bytes past the grant's `max_tmp` (8 MiB): ENOSPC, with what
    // was written at most that.
    for dir in ["/tmp", "/dev/shm"] {
        let script = format!(
            "dd if=/dev/zero of={dir}/fill bs=1M count=64 2>&1 | head -1; \
             echo kib $(du -k {dir}/fill | cut -f1)"
        );
        let r = sh(&alice, &script).await;
        let out = stdout(&r);
        assert!(out.contains("No space left on device"), "{dir}: {r}");
        let kib: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("kib "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{dir}: {r}"));
        assert!(
            (4096..=8192).contains(&kib),
            "{dir}: {kib} KiB written: {r}"
        );
    }
    // Empty files take no bytes but an inode each (about 1 KiB of kernel
    // memory; the kernel's default allows millions): bounded too.
    let program = "import errno, sys\n\
        for d in ('/tmp', '/dev/shm'):\n\
        \x20   n = 0\n\
        \x20   try:\n\
        \x20       while n < 200000:\n\
        \x20           open(f'{d}/e{n}', 'w').close(); n += 1\n\
        \x20   except OSError as e:\n\
        \x20       print(d, n, errno.errorcode[e.errno])\n\
        \x20   else:\n\
        \x20       print(d, n, 'no limit')";
    let r = python(&alice, program).await;
    let lines: Vec<&str> = stdout(&r).lines().collect();
    assert_eq!(lines.len(), 2, "{r}");
    for line in lines {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.get(2), Some(&"ENOSPC"), "{r}");
        let made: u64 = fields[1].parse().unwrap();
        assert!((500..=1024).contains(&made), "{line}: {r}");
    }
    // Without `max_tmp`, the grant's `max_memory` (bob's 64 MiB) bounds each.
    // (One process: bob's grant allows three.)
    let r = bob
        .request(
            "shell.exec",
            json!({"command": ["df", "-k", "/tmp", "/dev/shm"]}),
        )
        .await
        .unwrap();
    let sizes: Vec<&str> = stdout(&r)
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .collect();
    assert_eq!(sizes, ["65536", "65536"], "{r}");
}

#[tokio::test]
async fn a_command_cannot_unmount_or_mount_in_its_world() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // The launcher inside held CAP_SYS_ADMIN to mount /tmp and /dev/shm:
    // none of it may reach the program. Unmounting would uncover bwrap's
    // unbounded tmpfs below /tmp or what covers /etc/shadow; mounting
    // would make an unbounded tmpfs.
    let program = "import ctypes, errno, os\n\
        libc = ctypes.CDLL(None, use_errno=True)\n\
        for p in (b'/tmp', b'/dev/shm', b'/etc/shadow'):\n\
        \x20   r = libc.umount2(p, 2)\n\
        \x20   print('umount', p.decode(), 'DONE' if r == 0 else errno.errorcode[ctypes.get_errno()])\n\
        r = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n\
        print('mount /tmp', 'DONE' if r == 0 else errno.errorcode[ctypes.get_errno()])";
    let r = python(&alice, program).await;
    let out = stdout(&r);
    assert_eq!(out.lines().count(), 4, "{r}");
    assert!(!out.contains("DONE"), "{r}");
    assert!(out.lines().all(|l| l.ends_with("EPERM")), "{r}");
}

#[tokio::test]
async fn nothing_of_the_world_but_tmp_shm_and_roots_is_writable() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // The world's `/` and `/dev` are tmpfs mounts bwrap makes (unbounded,
    // memory): Landlock must keep them, and everything the host lends,
    // read-only.
    let program = "import errno, os\n\
        for d in ('/', '/dev', '/dev/pts', '/etc', '/usr', '/proc'):\n\
        \x20   for what, make in (('file', lambda p: open(p, 'w').close()), ('dir', os.mkdir)):\n\
        \x20       try:\n\
        \x20           make(os.path.join(d, 'planted')); print(d, what, 'MADE')\n\
        \x20       except OSError as e:\n\
        \x20           print(d, what, errno.errorcode[e.errno])";
    let r = python(&alice, program).await;
    let out = stdout(&r);
    assert_eq!(out.lines().count(), 12, "{r}");
    assert!(!out.contains("MADE"), "{r}");
    for line in out.lines() {
        let refused = ["EACCES", "EROFS", "EPERM", "ENOENT"];
        assert!(refused.iter().any(|e| line.ends_with(e)), "{line}: {r}");
    }
}

#[tokio::test]
async fn nothing_a_command_starts_outlives_it() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // setsid, a double fork and a new process group, each a sleeper; the
    // command itself exits at once.
    let marker = format!("survivor-{}", std::process::id());
    let script = format!(
        "setsid sh -c 'sleep 300; : {marker}-a' >/dev/null 2>&1 & \
         (sh -c 'sleep 300; : {marker}-b' >/dev/null 2>&1 &) ; \
         python3 -c 'import os,time; os.setpgid(0,0); time.sleep(300)' {marker}-c >/dev/null 2>&1 & \
         sleep 0.3; echo started $(ps -e -o args= | grep -c '{marker}-[abc]$')"
    );
    let r = sh(&alice, &script).await;
    // All three were running when the command exited.
    assert_eq!(stdout(&r), "started 3\n", "{r}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "survivors: {:?}",
            processes_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The same for a command that is cancelled while they run.
    let marker = format!("cancelled-{}", std::process::id());
    let script =
        format!("setsid sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 & echo up; sleep 300");
    let command = json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""});
    let mut handle = alice.start("shell.start", command).await.unwrap();
    let mut process_id = String::new();
    while let Some(item) = handle.next().await {
        if let portcullis_client::StreamItem::Stream { event, data } = &item
            && event == "started"
        {
            process_id = data["process_id"].as_str().unwrap().to_string();
        }
        if !processes_with(&marker).is_empty() && !process_id.is_empty() {
            break;
        }
    }
    let cancel = json!({"process_id": process_id});
    alice.request("shell.cancel", cancel).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", processes_with(&marker));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn root_in_the_daemon_is_not_root_in_the_command() {
    let Setup { gw, alice, .. } = setup().await;
    // Every capability gone, even when the daemon runs as root; no new
    // namespaces, no chroot, no hostname, no device node that works, no
    // reboot.
    let kmsg = gw.dir.join("workspace/kmsg");
    let script = "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; \
         hostname pwned 2>/dev/null && echo HOSTNAME; \
         chroot / true 2>/dev/null && echo CHROOT; \
         unshare -U true 2>/dev/null && echo USERNS; \
         unshare -n true 2>/dev/null && echo NETNS; \
         mknod kmsg c 1 11 2>/dev/null && head -c 1 kmsg >/dev/null 2>&1 && echo KMSG; \
         python3 -c 'import ctypes; print(\"REBOOT\" if ctypes.CDLL(None).reboot(0x89abcdef) == 0 else \"no reboot\")'";
    let r = sh(&alice, script).await;
    let out = stdout(&r);
    for line in out.lines().filter(|l| l.starts_with("Cap")) {
        assert!(line.ends_with("0000000000000000"), "{r}");
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("Cap")).count(),
        4,
        "{r}"
    );
    for escaped in ["HOSTNAME", "CHROOT", "USERNS", "NETNS", "KMSG", "REBOOT"] {
        assert!(!out.contains(escaped), "{escaped}: {r}");
    }
    assert!(out.contains("no reboot"), "{r}");
    let _ = std::fs::remove_file(kmsg);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(hostname.trim(), "pwned");
}

#[tokio::test]
async fn the_host_s_ipc_is_not_the_command_s() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    // A host SysV shared memory segment: invisible in the command's IPC
    // namespace.
    let made = std::process::Command::new("ipcmk")
        .args(["-M", "4096"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&made.stdout);
    let id = said.split_whitespace().last().unwrap().to_string();
    let r = sh(&alice, "ipcs -m | grep -c '^0x' || true").await;
    let _ = std::process::Command::new("ipcrm")
        .args(["-m", &id])
        .output();
    assert_eq!(stdout(&r).trim(), "0", "{r}");
}

#[tokio::test]
async fn the_admin_socket_refuses_a_peer_in_another_namespace() {
    let Setup { gw, .. } = setup().await;
    // The second layer behind the command's view, which has no admin
    // socket: a peer whose user namespace is not the daemon's is refused,
    // though it passes the owner check (it maps to the same uid).
    let status = |prefix: &[&str]| {
        let program = format!(
            "import socket\n\
             try:\n\
             \x20   s = socket.socket(socket.AF_UNIX); s.connect({socket:?})\n\
             \x20   s.sendall(b'GET /v1/status HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n\
             \x20   print(s.recv(64).decode(errors='replace').split('\\r\\n')[0] or 'CLOSED')\n\
             except OSError: print('CLOSED')",
            socket = gw.admin_socket().display().to_string()
        );
        let out = std::process::Command::new(prefix[0])
            .args(&prefix[1..])
            .args(["python3", "-c", &program])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(status(&["env"]), "HTTP/1.1 200 OK");
    assert_eq!(
        status(&["unshare", "--user", "--map-current-user"]),
        "CLOSED"
    );
}

#[tokio::test]
async fn max_processes_counts_every_process_setsid_daemons_too_even_as_root() {
    let Setup { gw: _gw, bob, .. } = setup().await;
    // Five daemons that leave the command's session: past max_processes =
    // 3 (python and two more) forks fail, as root too (where the kernel
    // exempts uid 0 from RLIMIT_NPROC, the command's pids cgroup counts).
    let program = [
        "import os, time",
        "made = refused = 0",
        "for i in range(5):",
        "    try:",
        "        pid = os.fork()",
        "    except OSError:",
        "        refused += 1",
        "        continue",
        "    if pid == 0:",
        "        os.setsid(); time.sleep(30); os._exit(0)",
        "    made += 1",
        "print(made, refused)",
    ]
    .join("\n");
    let r = bob
        .request(
            "shell.exec",
            json!({"command": ["python3", "-c", program], "timeout_ms": 10000}),
        )
        .await
        .unwrap();
    // python and two daemons: the other three forks fail.
    assert_eq!(stdout(&r), "2 3\n", "{r}");
}

#[tokio::test]
async fn max_memory_holds_for_the_whole_command() {
    let Setup { gw: _gw, bob, .. } = setup().await;
    // 256 MiB touched page by page under max_memory = "64 MiB": the
    // allocation fails (RLIMIT_AS, where there is no memory cgroup) or the
    // command is killed (its memory cgroup), and never finishes.
    let program =
        "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ALLOCATED')";
    let r = bob
        .request(
            "shell.exec",
            json!({"command": ["python3", "-c", program], "timeout_ms": 20000}),
        )
        .await
        .unwrap();
    assert!(!stdout(&r).contains("ALLOCATED"), "{r}");
    let killed = r["signal"] == "SIGKILL";
    let refused = r["stderr"]
        .as_str()
        .unwrap_or_default()
        .contains("MemoryError");
    assert!(killed || refused, "{r}");
    eprintln!(
        "memory limit: {}",
        if killed {
            "killed (memory cgroup)"
        } else {
            "MemoryError (RLIMIT_AS)"
        }
    );
    // And a command within the limit runs.
    let r = bob
        .request(
            "shell.exec",
            json!({"command": ["python3", "-c", "b = bytearray(8 << 20); print('fine')"]}),
        )
        .await
        .unwrap();
    assert_eq!(stdout(&r), "fine\n", "{r}");
}

/// The cgroup files of `controller` for process `pid`, from
/// `/proc/PID/cgroup`: its v1 hierarchy's, else the unified one's.
fn cgroup_dir(pid: u32, controller: &str) -> Option<std::path::PathBuf> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        list.split(',')
            .any(|c| c == controller)
            .then(|| (list.to_string(), path.to_string()))
    });
    match v1 {
        Some((list, path)) => {
            let mount = [
                "/sys/fs/cgroup/".to_string() + &list,
                format!("/sys/fs/cgroup/{controller}"),
            ]
            .into_iter()
            .find(|m| std::path::Path::new(m).is_dir())?;
            Some(std::path::Path::new(&mount).join(path.trim_start_matches('/')))
        }
        None => {
            let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            Some(std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')))
        }
    }
}

#[tokio::test]
async fn a_command_s_cgroup_carries_the_grant_s_limits_and_goes_with_it() {
    let Setup { gw: _gw, bob, .. } = setup().await;
    let marker = format!("limited-{}", std::process::id());
    let start = json!({"command": ["sh", "-c", format!("sleep 30; : {marker}")]});
    let mut handle = bob.start("shell.start", start).await.unwrap();
    let id = loop {
        match handle.next().await {
            Some(portcullis_client::StreamItem::Stream { event, data }) if event == "started" => {
                break data["process_id"].as_str().unwrap().to_string();
            }
            Some(_) => continue,
            None => panic!("no started event: {:?}", handle.response().await),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let found = common::pid_with(&marker);
        if let Some(pid) = found {
            break pid;
        }
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // max_processes = 3 and the sandbox's three tasks; 64 MiB; a quarter CPU.
    let read = |controller: &str, files: &[&str]| {
        let dir = cgroup_dir(pid, controller).unwrap();
        let value = files
            .iter()
            .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
            .unwrap_or_else(|| panic!("no {files:?} in {}", dir.display()));
        (dir, value.trim().to_string())
    };
    let (pids_dir, pids) = read("pids", &["pids.max"]);
    assert_eq!(pids, "6", "{}", pids_dir.display());
    assert!(
        pids_dir.to_string_lossy().contains("cmd-"),
        "{}",
        pids_dir.display()
    );
    let (_, memory) = read("memory", &["memory.max", "memory.limit_in_bytes"]);
    assert_eq!(memory, (64u64 << 20).to_string());
    let (_, cpu) = read("cpu", &["cpu.max", "cpu.cfs_quota_us"]);
    assert!(cpu == "25000 100000" || cpu == "25000", "{cpu}");
    // Cancelled: everything in it is gone, and so is the cgroup.
    bob.request("shell.cancel", json!({"process_id": id}))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} outlived its command",
            pids_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A command cgroup left by a daemon that is gone (one killed while its
/// command somehow ran on) is emptied and removed when the next starts:
/// what is in it runs unaudited.
#[tokio::test]
async fn a_gone_daemon_s_command_cgroups_are_emptied_at_the_next_start() {
    // The gateway's v1 `pids` directories go beside this process's own
    // cgroup (it starts in it); this host has that hierarchy, as CI's does.
    let own = cgroup_dir(std::process::id(), "pids").unwrap();
    let v1 = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .any(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "pids"))
        });
    assert!(v1, "this test needs a v1 pids hierarchy");
    // A pid no process has now: one that just ended.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    let gone = ended.id();
    ended.wait().unwrap();
    let stale = own.join(format!("portcullis-{gone}"));
    let command = stale.join("cmd-left");
    std::fs::create_dir_all(&command).unwrap();
    let mut left = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    std::fs::write(command.join("cgroup.procs"), left.id().to_string()).unwrap();
    let Setup { gw: _gw, .. } = setup().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ended = None;
    while (ended.is_none() || stale.exists()) && Instant::now() < deadline {
        ended = ended.or(left.try_wait().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Reaped either way (a no-op kill if it was).
    let _ = left.kill();
    let _ = left.wait();
    let removed = !stale.exists();
    let _ = std::fs::remove_dir(&command);
    let _ = std::fs::remove_dir(&stale);
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        ended.and_then(|s| s.signal()),
        Some(9),
        "the process in {}",
        command.display()
    );
    assert!(removed, "{} is still there", stale.display());
}

#[tokio::test]
async fn nothing_runs_on_when_the_daemon_is_killed() {
    let Setup { gw, alice, .. } = setup().await;
    // A persistent command (from the pool), one started while the pool
    // was busy, and a terminal's: SIGKILL to the daemon ends them all, and
    // what they started, within moments: nothing runs on unaudited.
    let marker = format!("orphan-{}", std::process::id());
    for (i, pty) in [(0, false), (1, false), (2, true)] {
        let script =
            format!("setsid sh -c 'sleep 300; : {marker}-{i}x' & sleep 300; : {marker}-{i}");
        let start =
            json!({"command": ["sh", "-c", script], "pty": pty, "root_id": "main", "cwd": ""});
        let _ = alice.start("shell.start", start).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 6 {
        assert!(
            Instant::now() < deadline,
            "the commands did not start: {:?}",
            processes_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The launchers, bwrap and worlds of this gateway, made for the
    // commands or waiting in its pool, name its root.
    let root = gw.dir.join("workspace").display().to_string();
    assert!(
        !processes_with(&root).is_empty(),
        "no launcher names {root}"
    );
    gw.signal("KILL");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "outlived the daemon: {:#?}",
            common::ancestry_of(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nor does any launcher or world it had, waiting or being made.
    while !processes_with(&root).is_empty() {
        assert!(
            Instant::now() < deadline,
            "outlived the daemon: {:#?}",
            processes_with(&root)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

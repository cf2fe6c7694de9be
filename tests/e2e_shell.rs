//! `shell.exec` end to end: the real binary starts real commands through
//! its sandbox launcher. Exit codes and signals, output and its cap, the
//! environment (exactly what the grant allows), the process group killed
//! on timeout and cancel, Landlock on files and TCP, and the audit entries.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{Gateway, code, key_b64, processes_with};
use portcullis_client::{Client, ClientError};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use serde_json::{Value, json};

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

[[root]]
id = "docs"
path = "GWDIR/docs"
virtual_path = "/workspace/docs"

[[grant]]
id = "alice-shell"
principals = ["alice"]
fileops = {{ main = "rw", docs = "ro" }}
shell = {{ commands = ["sh", "bash", "env", "cat", "/bin/true", "nonexistent"], cwd_roots = ["main"], env_allow = ["GREETING"], env_set = {{ PATH = "/usr/bin:/bin" }}, max_runtime = "20s", max_open_files = 64, max_file_size = "1 MiB", max_memory = "1 GiB" }}

[[grant]]
id = "bob-shell-with-network"
principals = ["bob"]
shell = {{ commands = ["bash"], env_set = {{ PATH = "/usr/bin:/bin" }}, network = "allow" }}
"#,
        alice = key_b64(alice),
        bob = key_b64(bob),
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
    let gw = Gateway::start(&policy(&a, &b), "");
    for dir in ["workspace/sub", "docs"] {
        std::fs::create_dir_all(gw.dir.join(dir)).unwrap();
    }
    std::fs::write(gw.dir.join("workspace/sub/inner.txt"), "inner\n").unwrap();
    let alice = gw.connect(&a).await.unwrap();
    alice.accept_all().await.unwrap();
    let bob = gw.connect(&b).await.unwrap();
    bob.accept_all().await.unwrap();
    Setup { gw, alice, bob }
}

fn sh(script: &str) -> Value {
    json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""})
}

#[tokio::test]
async fn exec_reports_exit_codes_signals_and_output() {
    let Setup { gw, alice, .. } = setup().await;
    let r = alice
        .request("shell.exec", sh("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(
        (r["exit_code"].as_i64(), r["signal"].as_str()),
        (Some(3), None)
    );
    assert_eq!(
        (r["stdout"].as_str(), r["stderr"].as_str()),
        (Some("out\n"), Some("err\n"))
    );
    assert_eq!(r["timed_out"], false);
    assert!(r["duration_ms"].is_u64(), "{r}");

    let r = alice
        .request("shell.exec", sh("kill -TERM $$"))
        .await
        .unwrap();
    assert_eq!(
        (r["exit_code"].as_i64(), r["signal"].as_str()),
        (None, Some("SIGTERM"))
    );

    // In the working directory asked for, beneath its root.
    let mut params = sh("cat inner.txt");
    params["cwd"] = json!("sub");
    let r = alice.request("shell.exec", params).await.unwrap();
    assert_eq!(r["stdout"], "inner\n");

    // stdin, and an absolute program.
    let r = alice
        .request(
            "shell.exec",
            json!({"command": ["cat"], "stdin": "piped in"}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], "piped in");
    let r = alice
        .request("shell.exec", json!({"command": ["/bin/true"]}))
        .await
        .unwrap();
    assert_eq!(r["exit_code"], 0);

    // 5 MiB of output comes whole (the response goes in parts); what is
    // beyond half the gateway's max_frame (16 MiB) is counted, not kept.
    let r = alice
        .request("shell.exec", sh("head -c 5242880 /dev/zero | tr '\\0' a"))
        .await
        .unwrap();
    assert_eq!(r["stdout_bytes"], 5 << 20);
    assert_eq!(r["stdout_truncated"], false);
    assert_eq!(r["stdout"].as_str().unwrap(), "a".repeat(5 << 20));
    let r = alice
        .request("shell.exec", sh("head -c 9000000 /dev/zero | tr '\\0' a"))
        .await
        .unwrap();
    assert_eq!(r["stdout_bytes"], 9_000_000);
    assert_eq!(r["stdout_truncated"], true);
    let kept = r["stdout"].as_str().unwrap().len();
    assert!((8_000_000..(8 << 20)).contains(&kept), "{kept}");

    // Refusals: a program not granted, not on PATH, a cwd outside cwd_roots.
    let not_granted = alice
        .request("shell.exec", json!({"command": ["ls"]}))
        .await;
    assert_eq!(code(&not_granted), Some(ErrorCode::PermissionDenied));
    let missing = alice
        .request("shell.exec", json!({"command": ["nonexistent"]}))
        .await;
    assert_eq!(code(&missing), Some(ErrorCode::NotFound), "{missing:?}");
    let mut elsewhere = sh("true");
    elsewhere["root_id"] = json!("docs");
    let outside = alice.request("shell.exec", elsewhere).await;
    assert_eq!(code(&outside), Some(ErrorCode::PermissionDenied));

    // 9 answered; the first is recorded with its command and exit code.
    gw.assert_requests_audited(10);
    let entries = gw.audit_entries();
    let exits: Vec<(Option<&str>, Option<i32>)> = entries
        .iter()
        .filter(|e| {
            e.record.method.as_deref() == Some("shell.exec") && e.record.completed_at.is_some()
        })
        .map(|e| (e.record.command.as_deref(), e.record.exit_code))
        .collect();
    assert!(exits.contains(&(Some("sh"), Some(3))), "{exits:?}");
    assert!(exits.contains(&(Some("/bin/true"), Some(0))), "{exits:?}");
}

#[tokio::test]
async fn the_child_environment_is_exactly_what_the_grant_allows() {
    let Setup { gw, alice, .. } = setup().await;
    // The daemon runs with cargo's test environment (CARGO_*), among others.
    let daemon_env = std::fs::read(format!("/proc/{}/environ", gw.pid())).unwrap();
    assert!(String::from_utf8_lossy(&daemon_env).contains("CARGO"));
    let r = alice
        .request(
            "shell.exec",
            json!({"command": ["env"], "env": {"GREETING": "hi", "SNEAKY": "x", "PATH": "/tmp"}}),
        )
        .await
        .unwrap();
    let mut lines: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["GREETING=hi", "PATH=/usr/bin:/bin"]);
    // The grant lists `env`; the same program by its path is allowed too
    // (resolved on the child's PATH before the list is checked), another
    // `env` is not.
    let by_path = json!({"command": ["/usr/bin/env"]});
    let r = alice.request("shell.exec", by_path).await.unwrap();
    assert_eq!(r["stdout"], "PATH=/usr/bin:/bin\n", "{r}");
    let fake = gw.dir.join("workspace/env");
    std::fs::write(&fake, "#!/bin/sh\necho fake\n").unwrap();
    let other = json!({"command": [fake.display().to_string()]});
    let refused = alice.request("shell.exec", other).await;
    assert_eq!(code(&refused), Some(ErrorCode::PermissionDenied));
    gw.assert_requests_audited(3);
}

#[tokio::test]
async fn timeout_and_cancel_kill_the_whole_process_group() {
    let Setup { gw, alice, .. } = setup().await;
    let marker = format!("{}.{}", 90 + std::process::id() % 9, std::process::id());
    let mut params = sh(&format!("sleep {marker} & sleep {marker}"));
    params["timeout_ms"] = json!(500);
    let Err(ClientError::Remote(e)) = alice.request("shell.exec", params).await else {
        panic!("a command past its time limit answers the error `timeout`")
    };
    assert_eq!(e.code, ErrorCode::Timeout, "{e:?}");
    assert!(e.message.contains("500 ms"), "{}", e.message);
    let r = e.details.unwrap();
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["signal"], "SIGKILL");
    assert!(r["duration_ms"].as_u64().unwrap() < 5_000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        processes_with(&marker),
        Vec::<String>::new(),
        "a grandchild survived"
    );

    // A background child left running when the command exits dies too.
    let r = alice
        .request("shell.exec", sh(&format!("sleep {marker}1 & echo started")))
        .await
        .unwrap();
    assert_eq!(r["stdout"], "started\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(processes_with(&format!("{marker}1")).is_empty());

    // A cancel frame kills it as well, and the answer says so.
    let handle = alice
        .start("shell.exec", sh(&format!("sleep {marker}2")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !processes_with(&format!("{marker}2")).is_empty(),
        "not started"
    );
    handle.cancel().await.unwrap();
    let cancelled = handle.response().await;
    assert_eq!(code(&cancelled), Some(ErrorCode::Cancelled));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(processes_with(&format!("{marker}2")).is_empty());
    gw.assert_requests_audited(3);
}

#[tokio::test]
async fn the_sandbox_confines_files_network_and_resources() {
    let Setup { gw, alice, bob } = setup().await;
    let outside = gw.dir.join("outside.txt");
    let docs = gw.dir.join("docs/new.txt");
    let script = format!(
        "echo ok > made.txt; echo no > {}; echo no > {}; cat /etc/hostname > /dev/null && echo read-ok",
        outside.display(),
        docs.display()
    );
    let r = alice.request("shell.exec", sh(&script)).await.unwrap();
    assert_eq!(r["stdout"], "read-ok\n", "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("Permission denied"),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(gw.dir.join("workspace/made.txt")).unwrap(),
        "ok\n"
    );
    assert!(!outside.exists(), "wrote outside every root");
    assert!(!docs.exists(), "wrote into a read-only root");

    // TCP: refused under network = "deny", allowed for bob's grant.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tcp = format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo connected");
    refused_then_allowed(&alice, &bob, &tcp, &["Permission denied"], "connected\n").await;

    // UDP, which Landlock does not cover: seccomp refuses the socket.
    let udp = format!("echo hi > /dev/udp/127.0.0.1/{port} && echo sent");
    refused_then_allowed(&alice, &bob, &udp, &["Permission denied"], "sent\n").await;

    // A host service on an abstract UNIX socket (no file for Landlock's
    // filesystem rules to guard): out of reach under network = "deny".
    use std::os::linux::net::SocketAddrExt as _;
    let name = format!("portcullis-test-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let _service = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    let perl = format!(
        r#"perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "socket: $!\n"; connect($s, pack_sockaddr_un("\0{name}")) or die "connect: $!\n"; print "connected\n"'"#
    );
    // The command's own network namespace has its own abstract sockets
    // (refused: nothing listens there); Landlock's scope is the layer
    // beneath (not permitted).
    let refusals = [
        "connect: Connection refused",
        "connect: Operation not permitted",
    ];
    refused_then_allowed(&alice, &bob, &perl, &refusals, "connected\n").await;

    // Signals reach only what the command started, not the daemon (the
    // same user) or anything else outside its sandbox: its PID namespace
    // has no such process, and Landlock (ABI 6) is the layer beneath.
    let script = format!("kill -0 {}; sleep 5 & kill $! && echo own-child", gw.pid());
    let r = alice.request("shell.exec", sh(&script)).await.unwrap();
    assert_eq!(r["stdout"], "own-child\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("No such process") || stderr.contains("Operation not permitted"),
        "{r}"
    );

    // Nor change its priority or limits (seccomp; the kernel allows it
    // for any process of the same user), while its own are its to lower.
    let gateway = gw.pid();
    let script =
        format!("renice -n 5 -p {gateway}; prlimit --pid {gateway} --nofile=10:10; nice -n 5 nice");
    let r = alice.request("shell.exec", sh(&script)).await.unwrap();
    assert_eq!(r["stdout"], "5\n", "{r}");
    let stderr = r["stderr"].as_str().unwrap();
    let refused = stderr.matches("Permission denied").count();
    assert_eq!(
        refused + stderr.matches("No such process").count(),
        2,
        "{r}"
    );
    let stat = std::fs::read_to_string(format!("/proc/{gateway}/stat")).unwrap();
    assert_eq!(stat_field(&stat, NICE), Some("0"), "{stat}");
    let limits = std::fs::read_to_string(format!("/proc/{gateway}/limits")).unwrap();
    assert!(!limits.contains("Max open files            10"), "{limits}");

    // The grant's rlimits: a file cannot grow past 1 MiB.
    let limits = alice
        .request(
            "shell.exec",
            sh("cat /proc/self/limits; exec head -c 2000000 /dev/zero > big"),
        )
        .await
        .unwrap();
    let text = limits["stdout"].as_str().unwrap();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert!(line("Max open files").contains("64 64"), "{text}");
    assert!(line("Max file size").contains("1048576 1048576"), "{text}");
    // max_memory is RLIMIT_AS only where the command has no memory cgroup
    // (e2e_isolation's max_memory test checks the limit itself).
    let address_space = line("Max address space");
    assert!(
        address_space.contains("1073741824 1073741824")
            || address_space.contains("unlimited unlimited"),
        "{text}"
    );
    assert!(line("Max core file size").contains("0 0"), "{text}");
    assert!(line("Max nice priority").contains("0 0"), "{text}");
    assert_eq!(limits["signal"], "SIGXFSZ", "{limits}");
    let big = std::fs::metadata(gw.dir.join("workspace/big"))
        .unwrap()
        .len();
    assert_eq!(big, 1 << 20);
    gw.assert_requests_audited(10);
}

/// Launchers wait in the pool at the lowest CPU priority — their cgroup's
/// lowest CPU weight where commands get cgroups with a `cpu` controller
/// (root here), else nice 19 where this process may take a priority back
/// and so may a launcher inside its world (`RLIMIT_NICE` alone) — except
/// one started while the pool was empty; the command runs at the daemon's
/// priority and the default weight.
#[tokio::test]
async fn launchers_wait_at_the_lowest_priority_and_commands_run_at_the_daemons() {
    let Setup { gw, alice, .. } = setup().await;
    let nice_of = |stat: &str| stat_field(stat, NICE)?.parse::<i64>().ok();
    // The first command finds the pool empty; it is filled after it.
    let r = alice.request("shell.exec", sh("true")).await.unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");

    let can_lower_and_restore = std::thread::spawn(|| {
        rustix::process::setpriority_process(None, 19).is_ok()
            && rustix::process::setpriority_process(None, 0).is_ok()
    })
    .join()
    .unwrap();
    // …and the launcher inside a world, without capabilities there, may
    // take it back too: RLIMIT_NICE is 20, or may be raised to it (as the
    // daemon then does; a root without CAP_SYS_RESOURCE may not).
    let limit_allows = {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nice);
        limit.current.is_none_or(|current| current >= 20)
            || setrlimit(
                Resource::Nice,
                Rlimit {
                    current: Some(20),
                    maximum: limit.maximum.map(|max| max.max(20)),
                },
            )
            .is_ok()
    };
    let can_lower_and_restore = can_lower_and_restore && limit_allows;
    let mut waiting = Vec::new();
    for _ in 0..100 {
        waiting = launcher_children(gw.pid());
        if waiting.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut nice: Vec<Option<i64>> = waiting.iter().map(|stat| nice_of(stat)).collect();
    nice.sort();
    let mut weights: Vec<Option<CpuWeight>> = waiting
        .iter()
        .map(|stat| stat_pid(stat).and_then(command_cpu_weight))
        .collect();
    weights.sort();
    // The first command found the pool empty: of the two started after
    // it, the first at the daemon's priority, the second (one waiting
    // already) at the lowest.
    if let [Some(first), Some(second)] = weights[..] {
        assert_eq!(
            [first.lowest(), second.default()],
            [true, true],
            "{weights:?}"
        );
        assert_eq!(nice, [Some(0), Some(0)], "{waiting:?}");
    } else {
        assert_eq!(weights, [None, None], "{waiting:?}");
        let expected = if can_lower_and_restore {
            [0, 19]
        } else {
            [0, 0]
        };
        assert_eq!(nice, expected.map(Some), "{waiting:?}");
    }
    // A command from the pool (the launcher started last, at the lowest)
    // runs at the daemon's priority and the default weight.
    let marker = "2.71828";
    let asked = alice.request("shell.exec", sh(&format!("sleep {marker}")));
    let inspect = async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let Some(pid) = pid_of_cmdline(&format!("sleep\0{marker}\0")) else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            return Some((nice_of(&stat), command_cpu_weight(pid)));
        }
        None
    };
    let (r, seen) = tokio::join!(asked, inspect);
    assert_eq!(r.unwrap()["exit_code"], 0);
    let (nice, weight) = seen.expect("the command's sleep was never seen");
    assert_eq!(nice, Some(0));
    if weights[0].is_some() {
        assert!(weight.is_some_and(CpuWeight::default), "{weight:?}");
    }
}

/// A cgroup's `cpu.weight` (v2) or `cpu.shares` (v1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CpuWeight {
    Shares(u64),
    Weight(u64),
}

impl CpuWeight {
    fn lowest(self) -> bool {
        matches!(self, Self::Shares(2) | Self::Weight(1))
    }
    fn default(self) -> bool {
        matches!(self, Self::Shares(1024) | Self::Weight(100))
    }
}

/// The CPU weight of process `pid`'s cgroup, where that is a command's
/// (`…/cmd-…`) in a hierarchy with the `cpu` controller.
fn command_cpu_weight(pid: u32) -> Option<CpuWeight> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        if !path.contains("/cmd-") {
            return None;
        }
        let v2 = list.is_empty();
        if !v2 && !list.split(',').any(|c| c == "cpu") {
            return None;
        }
        mounts.lines().find_map(|mount| {
            let (left, right) = mount.split_once(" - ")?;
            let mut right = right.split_whitespace();
            let (kind, options) = (right.next()?, right.nth(1)?);
            let matches = match v2 {
                true => kind == "cgroup2",
                false => kind == "cgroup" && options.split(',').any(|o| o == "cpu"),
            };
            if !matches {
                return None;
            }
            let dir = format!("{}{path}", left.split_whitespace().nth(4)?);
            let file = if v2 { "cpu.weight" } else { "cpu.shares" };
            let value = std::fs::read_to_string(format!("{dir}/{file}")).ok()?;
            let value = value.trim().parse().ok()?;
            Some(if v2 {
                CpuWeight::Weight(value)
            } else {
                CpuWeight::Shares(value)
            })
        })
    })
}

/// The process whose `/proc/PID/cmdline` is `cmdline`.
fn pid_of_cmdline(cmdline: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let found = std::fs::read(e.path().join("cmdline")).ok()?;
        (found == cmdline.as_bytes()).then(|| e.file_name().to_str()?.parse().ok())?
    })
}

/// The pid a `/proc/PID/stat` line starts with.
fn stat_pid(stat: &str) -> Option<u32> {
    stat.split(' ').next()?.parse().ok()
}

/// `/proc/PID/stat` of each launcher the gateway started.
fn launcher_children(gateway: u32) -> Vec<String> {
    let stats = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok());
    let gateway = gateway.to_string();
    stats
        .filter(|stat| {
            stat.contains("(portcullis-sand") && stat_field(stat, PARENT) == Some(&gateway)
        })
        .collect()
}

/// Fields of `/proc/PID/stat` (proc(5) numbers them from 1).
const PARENT: usize = 4;
const NICE: usize = 19;

/// Field `n` of a `/proc/PID/stat` line, counted past the command name,
/// which may hold spaces and parentheses.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.split(' ').nth(n.checked_sub(3)?)
}

/// `script` (bash) fails for alice, whose grant denies the network, with
/// one of `refusals` in its stderr, and prints `success` for bob, whose
/// grant allows it.
async fn refused_then_allowed(
    alice: &Client,
    bob: &Client,
    script: &str,
    refusals: &[&str],
    success: &str,
) {
    let command = json!({"command": ["bash", "-c", script]});
    let denied = alice.request("shell.exec", command.clone()).await.unwrap();
    assert_ne!(denied["exit_code"], 0, "{denied}");
    let stderr = denied["stderr"].as_str().unwrap();
    assert!(refusals.iter().any(|r| stderr.contains(r)), "{denied}");
    let allowed = bob.request("shell.exec", command).await.unwrap();
    assert_eq!(allowed["stdout"], success, "{allowed}");
}

/// Everything a `shell.start` streamed, and its response.
struct Streamed {
    process_id: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    result: Result<Value, ClientError>,
}

async fn collect(mut handle: portcullis_client::RequestHandle<'_>) -> Streamed {
    use portcullis_client::StreamItem;
    use portcullis_wire::record::Channel;
    let mut streamed = Streamed {
        process_id: String::new(),
        stdout: Vec::new(),
        stderr: Vec::new(),
        result: Ok(Value::Null),
    };
    while let Some(item) = handle.next().await {
        match item {
            StreamItem::Stream { event, data } if event == "started" => {
                streamed.process_id = data["process_id"].as_str().unwrap().to_string();
            }
            StreamItem::Stream { event, .. } if event == "status" => {}
            StreamItem::Chunk {
                channel: Channel::Stdout,
                data,
            } => streamed.stdout.extend(&data),
            StreamItem::Chunk {
                channel: Channel::Stderr,
                data,
            } => streamed.stderr.extend(&data),
            other => panic!("unexpected {other:?}"),
        }
    }
    streamed.result = handle.response().await;
    streamed
}

/// The id of the first process `client` has running, once it shows
/// (`answered` counts the requests it took).
async fn running_process(client: &Client, answered: &mut usize) -> String {
    for _ in 0..100 {
        let listed = client.request("shell.list", json!({})).await.unwrap();
        *answered += 1;
        if let Some(id) = listed["processes"][0]["process_id"].as_str() {
            return id.to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no process started");
}

#[tokio::test]
async fn start_streams_output_takes_input_and_answers_signals_and_cancel() {
    let Setup { gw, alice, bob } = setup().await;
    let mut answered = 0;
    // Output streams in order per channel; input reaches stdin.
    let handle = alice
        .start(
            "shell.start",
            sh("echo one; echo two >&2; read line; echo \"got $line\""),
        )
        .await
        .unwrap();
    let id = running_process(&alice, &mut answered).await;
    let status = alice
        .request("shell.status", json!({"process_id": id}))
        .await
        .unwrap();
    assert_eq!(status["command"][0], "sh");
    // Another principal can neither see nor touch it.
    let foreign = bob
        .request("shell.signal", json!({"process_id": id, "signal": "KILL"}))
        .await;
    assert_eq!(code(&foreign), Some(ErrorCode::NotFound));
    let theirs = bob.request("shell.list", json!({})).await.unwrap();
    assert_eq!(theirs["processes"], json!([]));
    let written = alice
        .request(
            "shell.input",
            json!({"process_id": id, "data": "hello\n", "eof": true}),
        )
        .await
        .unwrap();
    assert_eq!(written["written"], 6);
    let streamed = collect(handle).await;
    answered += 5; // status, bob's signal and list, input, start
    assert_eq!(streamed.process_id, id);
    assert_eq!(
        String::from_utf8_lossy(&streamed.stdout),
        "one\ngot hello\n"
    );
    assert_eq!(String::from_utf8_lossy(&streamed.stderr), "two\n");
    let result = streamed.result.unwrap();
    assert_eq!(
        (result["exit_code"].as_i64(), result["cancelled"].as_bool()),
        (Some(0), Some(false))
    );
    assert_eq!(result["stdout_bytes"], 14);

    // A signal reaches the process group; shell.cancel kills it.
    for (how, expected) in [("signal", "SIGTERM"), ("cancel", "SIGKILL")] {
        let handle = alice.start("shell.start", sh("sleep 30")).await.unwrap();
        let id = running_process(&alice, &mut answered).await;
        let params = match how {
            "signal" => json!({"process_id": id, "signal": "TERM"}),
            _ => json!({"process_id": id}),
        };
        alice
            .request(&format!("shell.{how}"), params)
            .await
            .unwrap();
        let result = collect(handle).await.result.unwrap();
        answered += 2; // the signal or cancel, the start
        assert_eq!(result["signal"], expected, "{how}: {result}");
        assert_eq!(result["cancelled"], how == "cancel");
        let after = alice.request("shell.list", json!({})).await.unwrap();
        answered += 1;
        assert_eq!(after["processes"], json!([]), "{how}");
    }
    gw.assert_requests_audited(answered);
}

#[test]
fn the_exec_verb_streams_output_and_exits_with_the_remote_code() {
    let home_dir = tempfile::Builder::new()
        .prefix("portcullis-exec-verb-")
        .tempdir()
        .unwrap();
    let home = home_dir.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let alice = portcullis_wire::keyfile::generate(&home.join("alice.key"), false).unwrap();
    let bob = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, &bob), "");
    let key = gw.key.to_base64();
    let run = |rest: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(["exec", gw.url.as_str(), "--gateway-key", &key])
            .args(["--identity", home.join("alice.key").to_str().unwrap()])
            .args(rest)
            .env("XDG_CONFIG_HOME", &home)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--env",
        "GREETING=hi",
        "--",
        "sh",
        "-c",
        "echo $GREETING; echo oops >&2; exit 7",
    ]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    let killed = run(&["--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(killed.status.code(), Some(128 + 9));
    let refused = run(&["--", "ls"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("permission_denied"));
    // `output()` gives the CLI /dev/null as stdin: the command reads EOF
    // from its start (the timeout fails this instead of hanging on it).
    let null = run(&["--timeout", "20", "--", "sh", "-c", "cat; echo read-eof"]);
    assert_eq!(String::from_utf8_lossy(&null.stdout), "read-eof\n");
    assert_eq!(null.status.code(), Some(0));
    // Local stdin reaches the command, and its end closes the command's.
    let mut piped = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["exec", gw.url.as_str(), "--gateway-key", &key])
        .args(["--identity", home.join("alice.key").to_str().unwrap()])
        .args(["--", "sh", "-c", "tr a-z A-Z; echo done"])
        .env("XDG_CONFIG_HOME", &home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = piped.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"hello\nworld\n").unwrap();
    drop(stdin);
    let out = piped.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO\nWORLD\ndone\n");
    assert_eq!(out.status.code(), Some(0));
    // Every command left its entry with its exit code (the `shell.input`
    // requests that carried stdin have theirs too, as many as it took).
    let mut entries = gw.audit_entries();
    entries.sort_by_key(|e| e.seq);
    let codes: Vec<Option<i32>> = entries
        .iter()
        .filter(|e| e.record.kind == portcullis_store::Kind::Request)
        .filter(|e| e.record.method.as_deref() == Some("shell.start"))
        .map(|e| e.record.exit_code)
        .collect();
    assert_eq!(
        codes,
        [Some(7), None, None, Some(0), Some(0)],
        "killed and refused have none"
    );
    // Only the piped run (the last start) sent input: with /dev/null the
    // start closed the command's stdin.
    let methods: Vec<(portcullis_store::Kind, &str)> = entries
        .iter()
        .filter_map(|e| Some((e.record.kind, e.record.method.as_deref()?)))
        .collect();
    let first_input = methods.iter().position(|(_, m)| *m == "shell.input");
    let last_start = methods.iter().rposition(|(kind, m)| {
        *kind == portcullis_store::Kind::RequestStart && *m == "shell.start"
    });
    assert!(
        first_input.is_some() && first_input > last_start,
        "{methods:?}"
    );
    let _ = std::fs::remove_dir_all(home);
}

#[tokio::test]
async fn a_reload_that_takes_the_shell_away_kills_running_commands() {
    let Setup { gw, alice, .. } = setup().await;
    let marker = format!("{}.{}", 80 + std::process::id() % 9, std::process::id());
    let handle = alice
        .start("shell.start", sh(&format!("sleep {marker}")))
        .await
        .unwrap();
    let mut answered = 0;
    running_process(&alice, &mut answered).await;
    // alice keeps her files (so the session stays), loses the shell.
    let text = std::fs::read_to_string(gw.dir.join("policy.toml")).unwrap();
    let narrowed: String = text
        .lines()
        .filter(|line| !line.starts_with("shell = { commands = [\"sh\""))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(narrowed, text);
    std::fs::write(gw.dir.join("policy.toml"), narrowed).unwrap();
    gw.signal("HUP");
    let result = tokio::time::timeout(Duration::from_secs(5), handle.response())
        .await
        .expect("the command was not stopped");
    assert_eq!(
        code(&result),
        Some(ErrorCode::PermissionDenied),
        "{result:?}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !processes_with(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the command survived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The session itself goes on.
    let files = alice
        .request("file.list", json!({"root_id": "main", "path": ""}))
        .await;
    assert!(files.is_ok(), "{files:?}");
    gw.assert_requests_audited(answered + 2);
}

#[tokio::test]
async fn a_host_without_a_mechanism_refuses_or_runs_with_a_warning_as_the_grant_says() {
    let (a, b) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    // alice's grant requires the sandbox (the default); bob's allows best
    // effort. The daemon's probe is told Landlock, the network cut and
    // namespaces are missing, as on a kernel without them.
    let policy = policy(&a, &b).replace(
        r#"network = "allow" }"#,
        r#"network = "deny", sandbox = "best_effort" }"#,
    );
    let gw = Gateway::start_with_env(
        &policy,
        "",
        &[(
            "PORTCULLIS_SANDBOX_PRETEND_MISSING",
            "landlock,network,namespaces",
        )],
    );
    let alice = gw.connect(&a).await.unwrap();
    alice.accept_all().await.unwrap();
    let bob = gw.connect(&b).await.unwrap();
    bob.accept_all().await.unwrap();
    let outside = gw.dir.join("outside.txt");
    let write_outside = |who: &str| json!({"command": ["bash", "-c", format!("echo {who} > {}", outside.display())]});

    let refused = alice.request("shell.exec", write_outside("alice")).await;
    let Err(ClientError::Remote(e)) = &refused else {
        panic!("a required sandbox the host lacks must refuse: {refused:?}");
    };
    assert_eq!(e.code, ErrorCode::CapabilityUnavailable);
    assert!(e.message.contains("landlock"), "{}", e.message);
    assert!(e.message.contains("best_effort"), "{}", e.message);
    assert!(!outside.exists(), "nothing was run");

    // Best effort: it runs unconfined — the write outside the roots lands,
    // which is exactly what the warning says.
    let ran = bob
        .request("shell.exec", write_outside("bob"))
        .await
        .unwrap();
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "bob\n");
    let warning = ran["sandbox_warning"].as_str().unwrap_or_default();
    assert!(
        warning.contains("landlock")
            && warning.contains("network")
            && warning.contains("namespaces"),
        "{ran}"
    );

    let entries = gw.audit_entries();
    let audited = |principal: &str| {
        entries
            .iter()
            .find(|e| {
                e.record.principal.as_deref() == Some(principal)
                    && e.record.method.as_deref() == Some("shell.exec")
            })
            .map(|e| e.record.clone())
            .unwrap()
    };
    let (alice_entry, bob_entry) = (audited("alice"), audited("bob"));
    assert_eq!(
        alice_entry.error_code.as_deref(),
        Some("capability_unavailable")
    );
    assert_eq!(alice_entry.warning, None);
    assert_eq!(bob_entry.exit_code, Some(0));
    assert_eq!(bob_entry.warning.as_deref(), Some(warning));
}

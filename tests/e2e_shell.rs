//! `shell.exec` end to end: the real binary starts real commands through
//! its sandbox launcher. Exit codes and signals, output and its cap, the
//! environment (exactly what the grant allows), the process group killed
//! on timeout and cancel, Landlock on files and TCP, and the audit entries.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{Gateway, key_b64};
use portcullis::client::{Client, ClientError};
use portcullis::frame::ErrorCode;
use portcullis_crypto::StaticKeypair;
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
shell = {{ commands = ["sh", "bash", "env", "cat", "/bin/true", "nonexistent"], cwd_roots = ["main"], env_allow = ["GREETING"], env_set = {{ PATH = "/usr/bin:/bin" }}, max_runtime = "20s" }}

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

fn code(result: &Result<Value, ClientError>) -> Option<ErrorCode> {
    match result {
        Err(ClientError::Remote(e)) => Some(e.code),
        _ => None,
    }
}

/// Processes on this host whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.ok()?.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(marker).then_some(cmdline)
        })
        .collect()
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
    assert!(r["duration_ms"].as_f64().unwrap() > 0.0);

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

    // Output beyond the cap is counted, not kept.
    let r = alice
        .request("shell.exec", sh("head -c 100000 /dev/zero | tr '\\0' a"))
        .await
        .unwrap();
    assert_eq!(r["stdout_bytes"], 100_000);
    assert_eq!(r["stdout_truncated"], true);
    let kept = r["stdout"].as_str().unwrap().len();
    assert!((20_000..=24 * 1024).contains(&kept), "{kept}");

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
    gw.assert_requests_audited(9);
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
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn timeout_and_cancel_kill_the_whole_process_group() {
    let Setup { gw, alice, .. } = setup().await;
    let marker = format!("{}.{}", 90 + std::process::id() % 9, std::process::id());
    let mut params = sh(&format!("sleep {marker} & sleep {marker}"));
    params["timeout_ms"] = json!(500);
    let r = alice.request("shell.exec", params).await.unwrap();
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["signal"], "SIGKILL");
    assert!(r["duration_ms"].as_f64().unwrap() < 5_000.0);
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
async fn landlock_confines_writes_to_rw_roots_and_denies_tcp() {
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
    let connect = json!({"command": ["bash", "-c", format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo connected")]});
    let denied = alice.request("shell.exec", connect.clone()).await.unwrap();
    assert_ne!(denied["exit_code"], 0, "{denied}");
    assert!(
        denied["stderr"]
            .as_str()
            .unwrap()
            .contains("Permission denied"),
        "{denied}"
    );
    let allowed = bob.request("shell.exec", connect).await.unwrap();
    assert_eq!(allowed["stdout"], "connected\n", "{allowed}");
    gw.assert_requests_audited(3);
}

//! `portcullis pause` as the relay spec's emergency stop: a revocation of
//! everything. Sessions closed, requests in flight failed, running
//! commands and persistent processes killed (but a grant's
//! `survive_revocation`), new sessions refused until `resume`, every step
//! audited.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, key_b64, processes_with};
use portcullis_client::ClientError;
use portcullis_crypto::StaticKeypair;
use portcullis_store::Kind;
use portcullis_wire::frame::ErrorCode;
use serde_json::json;

fn policy(alice: &StaticKeypair, bob: &StaticKeypair) -> String {
    format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[principal]]
id = "bob"
public_key = "{bob}"

[[grant]]
id = "alice"
principals = ["alice"]
shell = {{ commands = ["sh"], env_set = {{ PATH = "/usr/bin:/bin" }}, persist = true }}

[[grant]]
id = "bob"
principals = ["bob"]
shell = {{ commands = ["sh"], env_set = {{ PATH = "/usr/bin:/bin" }}, persist = true, survive_revocation = true }}
"#,
        alice = key_b64(alice),
        bob = key_b64(bob),
    )
}

fn sleeper(marker: &str) -> serde_json::Value {
    json!({"command": ["sh", "-c", format!("sleep 300; : {marker}")]})
}

/// Waits until `marker`'s processes are there (`true`) or gone (`false`).
async fn wait_for(marker: &str, running: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(marker).is_empty() == running {
        assert!(
            Instant::now() < deadline,
            "{marker}: expected running = {running}: {:?}",
            processes_with(marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_emergency_stop_revokes_everything_but_what_survives_revocation() {
    let (alice, bob) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let gw = Gateway::start(&policy(&alice, &bob), "");
    let id = std::process::id();
    let (persistent, exec, survivor) = (
        format!("stop-persist-{id}"),
        format!("stop-exec-{id}"),
        format!("stop-survive-{id}"),
    );
    let a = gw.connect(&alice).await.unwrap();
    a.accept_all().await.unwrap();
    let b = gw.connect(&bob).await.unwrap();
    b.accept_all().await.unwrap();
    let started = a.start("shell.start", sleeper(&persistent)).await.unwrap();
    let running = a.start("shell.exec", sleeper(&exec)).await.unwrap();
    let kept = b.start("shell.start", sleeper(&survivor)).await.unwrap();
    for marker in [&persistent, &exec, &survivor] {
        wait_for(marker, true).await;
    }

    let out = gw.cli(&["pause"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("stopped"));
    // Both sessions closed with the reason; the requests in flight failed.
    for client in [&a, &b] {
        let reason = tokio::time::timeout(Duration::from_secs(5), client.closed())
            .await
            .unwrap();
        assert!(reason.contains("stopped by its operator"), "{reason}");
    }
    // Each answer says why, whether the session or the process keeper
    // got there first; or the session closed before the answer left.
    for handle in [started, running, kept] {
        let answer = handle.response().await;
        assert!(
            matches!(&answer, Err(ClientError::Remote(e))
                if e.code == ErrorCode::PolicyBlocked && e.message.contains("stopped by its operator"))
                || matches!(&answer, Err(ClientError::Disconnected(_))),
            "{answer:?}"
        );
    }
    // Alice's command and her persistent process are killed; bob's grant
    // says survive_revocation.
    wait_for(&persistent, false).await;
    wait_for(&exec, false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!processes_with(&survivor).is_empty(), "survive_revocation");

    // No new session until resume.
    assert!(gw.connect(&alice).await.is_err(), "a session while stopped");
    let status: serde_json::Value =
        serde_json::from_slice(&gw.cli(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status["pause"], "stop");
    assert!(gw.cli(&["resume"]).status.success());
    let again = gw.connect(&alice).await.unwrap();
    again.accept_all().await.unwrap();
    again
        .request("shell.exec", json!({"command": ["sh", "-c", "true"]}))
        .await
        .unwrap();

    // Every step is in the log: the stop, the refused session, the resume,
    // and each request's outcome.
    let entries = gw.audit_entries();
    let events: Vec<&str> = entries
        .iter()
        .filter(|e| e.record.kind == Kind::Security)
        .filter_map(|e| e.record.event.as_deref())
        .collect();
    for event in ["paused", "session_refused", "resumed"] {
        assert!(events.contains(&event), "{event} not in {events:?}");
    }
    let stopped_exec = entries
        .iter()
        .find(|e| {
            e.record.kind == Kind::Request
                && e.record.method.as_deref() == Some("shell.exec")
                && e.record.error_code.is_some()
        })
        .expect("the stopped exec's entry");
    assert!(stopped_exec.record.status.is_some());
    drop(again);
    // Bob's survivor is ended by the test, not left behind.
    let b = gw.connect(&bob).await.unwrap();
    b.accept_all().await.unwrap();
    let list = b.request("shell.list", json!({})).await.unwrap();
    let process_id = list["processes"][0]["process_id"].as_str().unwrap();
    b.request("shell.cancel", json!({"process_id": process_id}))
        .await
        .unwrap();
    wait_for(&survivor, false).await;
}

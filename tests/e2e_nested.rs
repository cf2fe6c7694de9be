//! A script's own requests (`exec`, `read_file`, `call_tool`) take the
//! session's one admission path, over the real binary: each passes every
//! check a request from the peer passes — the operator's pause, the drain
//! at shutdown, the in-flight cap, a grant's expiry, the capabilities the
//! client accepted — and is audited with the script as its parent. (An
//! approval asked from inside a script: `e2e_tools.rs`.)

mod common;

use std::time::Duration;

use common::{Gateway, code, key_b64};
use portcullis_client::{Client, ClientError};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use serde_json::json;

const SECOND: Duration = Duration::from_secs(1);

/// Alice may run `true` and `sleep`, read the workspace and run scripts;
/// `shell_expires` ends her command grant at that time.
fn policy(alice: &StaticKeypair, shell_expires: Option<jiff::Timestamp>) -> String {
    let expiry = shell_expires
        .map(|t| format!("expires_at = \"{t}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[root]]
id = "main"
path = "WORKSPACE"
virtual_path = "/workspace"

[[grant]]
id = "files-and-scripts"
principals = ["alice"]
fileops = {{ main = "ro" }}
scripts = {{ max_operations = 1000000000, max_wall_time = "60s", max_tool_calls = 10 }}

[[grant]]
id = "commands"
principals = ["alice"]
shell = {{ commands = ["true", "sleep"], env_set = {{ PATH = "/usr/bin:/bin" }} }}
{expiry}"#,
        alice = key_b64(alice),
    )
}

/// Runs `exec(["true"])` until `refusals` of them are refused with `code`;
/// counts the successes, and those after the first refusal.
fn until_refused(code: &str, refusals: u32) -> String {
    format!(
        r#"
let ok = 0; let refused = 0; let after = 0; let other = [];
for i in 0..20000 {{
    try {{
        exec(["true"]);
        ok += 1;
        if refused > 0 {{ after += 1; }}
    }} catch (e) {{
        if e.code == "{code}" {{
            refused += 1;
            if refused >= {refusals} {{ break; }}
        }} else {{
            other.push(`${{e.code}}: ${{e.message}}`);
        }}
    }}
}}
#{{ok: ok, refused: refused, after: after, other: other}}
"#
    )
}

async fn connected(gw: &Gateway, alice: &StaticKeypair) -> Client {
    let client = gw.connect(alice).await.unwrap();
    client.accept_all().await.unwrap();
    client
}

/// Waits until the script's nested requests have started (its first
/// entries are in the log), so what the test does next lands mid-script.
async fn wait_for_nested(gw: &Gateway, at_least: usize) {
    for _ in 0..200 {
        let nested = gw
            .audit_entries()
            .iter()
            .filter(|e| e.record.parent_request_id.is_some())
            .count();
        if nested >= at_least {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the script's requests never reached the audit log");
}

#[tokio::test]
async fn a_pause_refuses_a_running_script_s_requests_as_it_refuses_direct_ones() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, None), "");
    let client = connected(&gw, &alice).await;
    let script = until_refused("policy_blocked", 20);
    let ran = client.request("script.run", json!({"source": script}));
    let operator = async {
        wait_for_nested(&gw, 20).await;
        assert!(gw.cli(&["pause", "--soft"]).status.success());
        let direct = client
            .request("shell.exec", json!({"command": ["true"]}))
            .await;
        assert_eq!(code(&direct), Some(ErrorCode::PolicyBlocked), "{direct:?}");
    };
    let (ran, ()) = tokio::join!(ran, operator);
    let value = &ran.unwrap()["value"];
    assert_eq!(value["refused"], 20, "{value}");
    assert_eq!(
        value["after"], 0,
        "a nested exec ran after the pause: {value}"
    );
    assert_eq!(value["other"], json!([]), "{value}");
    assert!(value["ok"].as_u64().unwrap() >= 10, "{value}");

    // Each refusal is audited as the direct one is, with the script as parent.
    let entries = gw.audit_entries();
    let paused: Vec<_> = entries
        .iter()
        .filter(|e| e.record.rule.as_deref() == Some("the gateway is paused"))
        .collect();
    assert_eq!(paused.len(), 21, "20 nested and 1 direct");
    assert_eq!(
        paused
            .iter()
            .filter(|e| e.record.parent_request_id.is_some())
            .count(),
        20
    );
    let ok = value["ok"].as_u64().unwrap() as usize;
    // The script, its nested requests (successes and refusals), the direct one.
    gw.assert_requests_audited(1 + ok + 20 + 1);
}

#[tokio::test]
async fn a_drain_refuses_a_running_script_s_requests() {
    let alice = StaticKeypair::generate().unwrap();
    let mut gw = Gateway::start(&policy(&alice, None), "");
    let client = connected(&gw, &alice).await;
    let script = until_refused("relay_disconnected", 5);
    let ran = client.request("script.run", json!({"source": script}));
    let operator = async {
        wait_for_nested(&gw, 20).await;
        gw.signal("TERM");
    };
    let (ran, ()) = tokio::join!(ran, operator);
    // The script still answers: it is in flight, and the drain waits for it.
    let value = &ran.unwrap()["value"];
    assert_eq!(value["refused"], 5, "{value}");
    assert_eq!(
        value["after"], 0,
        "a nested exec ran after SIGTERM: {value}"
    );
    assert_eq!(value["other"], json!([]), "{value}");
    let status = gw.wait_exit(10 * SECOND).expect("the gateway did not exit");
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn the_in_flight_cap_counts_a_script_s_requests() {
    let alice = StaticKeypair::generate().unwrap();
    let script = r#"
        let said = "ran";
        try { exec(["true"]); } catch (e) { said = `${e.code}: ${e.message}`; }
        said
    "#;
    // The script is the one request in flight the session may have.
    let gw = Gateway::start(&policy(&alice, None), "[limits]\nmax_in_flight = 1\n");
    let client = connected(&gw, &alice).await;
    let ran = client
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    let said = ran["value"].as_str().unwrap();
    assert!(
        said.starts_with("provider_error: too many requests in flight (limit 1)"),
        "{said}"
    );
    gw.assert_requests_audited(2);

    // With room for both, the same script runs its command.
    let gw = Gateway::start(&policy(&alice, None), "[limits]\nmax_in_flight = 2\n");
    let client = connected(&gw, &alice).await;
    let ran = client
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    assert_eq!(ran["value"], "ran");
    gw.assert_requests_audited(2);
}

#[tokio::test]
async fn a_grant_that_expires_mid_script_refuses_its_later_requests() {
    let alice = StaticKeypair::generate().unwrap();
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3);
    let gw = Gateway::start(&policy(&alice, Some(expires)), "");
    let client = connected(&gw, &alice).await;
    let script = until_refused("permission_denied", 5);
    let value = client
        .request("script.run", json!({"source": script}))
        .await
        .unwrap()["value"]
        .clone();
    assert_eq!(value["refused"], 5, "{value}");
    assert_eq!(value["after"], 0, "{value}");
    assert_eq!(value["other"], json!([]), "{value}");
    assert!(jiff::Timestamp::now() >= expires);
    let entries = gw.audit_entries();
    let last_ok = entries
        .iter()
        .filter(|e| {
            e.record.parent_request_id.is_some()
                && e.record.command.as_deref() == Some("true")
                && e.record.completed_at.is_some()
                && e.record.error_code.is_none()
        })
        .filter_map(|e| e.record.started_at.parse::<jiff::Timestamp>().ok())
        .max()
        .unwrap();
    assert!(
        last_ok < expires,
        "a nested exec started after the grant expired"
    );
}

#[tokio::test]
async fn a_script_s_requests_need_the_capabilities_the_client_accepted() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, None), "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept(&["scripts", "fileops"]).await.unwrap();
    let script = r#"
        let listed = list_dir("main", "");
        let said = "ran";
        try { exec(["true"]); } catch (e) { said = e.code; }
        said
    "#;
    let ran = client
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    assert_eq!(ran["value"], "capability_unavailable");
    gw.assert_requests_audited(3);
}

#[tokio::test]
async fn a_command_in_a_script_ends_at_the_script_s_wall_time() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, None), "");
    let client = connected(&gw, &alice).await;
    let started = std::time::Instant::now();
    let ran = client
        .request(
            "script.run",
            json!({"source": r#"exec(["sleep", "30"])"#, "limits": {"max_wall_time_ms": 1000}}),
        )
        .await;
    let took = started.elapsed();
    let Err(ClientError::Remote(error)) = &ran else {
        panic!("{ran:?}")
    };
    assert!(took < 10 * SECOND, "the script answered after {took:?}");
    assert_eq!(
        error.details.as_ref().map(|d| d["limit"].clone()),
        Some(json!("max_wall_time")),
        "{error:?}"
    );
    // The command's entry says it was cancelled.
    let entries = gw.audit_entries();
    let sleep = entries
        .iter()
        .find(|e| e.record.command.as_deref() == Some("sleep") && e.record.completed_at.is_some())
        .unwrap();
    assert_eq!(sleep.record.error_code.as_deref(), Some("cancelled"));
}

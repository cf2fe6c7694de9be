//! Tools and scripts end to end, over the real binary: `tool.list` and
//! `tool.call` with schema checks, secrets redacted from results, streams,
//! errors and the audit log; `script.run` calling a thousand tools in one
//! request, its limits (each hit named, other sessions unaffected), its
//! access to files and commands only as granted, cancellation (of a
//! script and, with `tool.cancel`, of a tool), approvals, and the events
//! a reload sends when it changes the tools a principal may call.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, key_b64};
use portcullis_client::{Client, ClientError, StreamItem};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use serde_json::{Value, json};

const SECRET: &str = "hunter2-s3cr3t-value";

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
fileops = {{ main = "ro" }}
shell = {{ commands = ["echo"], env_set = {{ PATH = "/usr/bin:/bin" }} }}
tools = {{ allow = ["*"] }}
scripts = {{ max_operations = 1000000000, max_wall_time = "3s", max_string_size = "64 KiB", max_array_len = 10000, max_map_len = 1000, max_call_depth = 32, max_tool_calls = 1000, max_output = "4 KiB" }}

[[grant]]
id = "bob"
principals = ["bob"]
tools = {{ allow = ["add"] }}

[[tool]]
name = "add"
description = "Adds two integers."
input_schema = {{ type = "object", required = ["a", "b"], additionalProperties = false, properties = {{ a = {{ type = "integer" }}, b = {{ type = "integer" }} }} }}
risk = "low"
approval_policy = "allow"
script = "tools/add.rhai"

[[tool]]
name = "vault"
description = "Uses an API key."
input_schema = {{ type = "object", properties = {{ fail = {{ type = "boolean" }} }} }}
risk = "medium"
approval_policy = "allow"
script = "tools/vault.rhai"
secrets = ["api_key"]

[[tool]]
name = "deploy"
description = "Asks once."
input_schema = {{ type = "object" }}
risk = "high"
approval_policy = "ask_once"
script = "tools/add.rhai"

[[tool]]
name = "wipe"
description = "Asks every time."
input_schema = {{ type = "object" }}
risk = "high"
approval_policy = "always_ask"
script = "tools/wipe.rhai"

[[tool]]
name = "per_run"
description = "Asks once per run."
input_schema = {{ type = "object" }}
risk = "high"
approval_policy = "ask_once_per_run"
script = "tools/add.rhai"

[[tool]]
name = "spin"
description = "Busy until cancelled or its 10 s wall time ends."
input_schema = {{ type = "object" }}
risk = "low"
approval_policy = "allow"
script = "tools/spin.rhai"

[[tool]]
name = "danger"
description = "Never runs."
input_schema = {{ type = "object" }}
risk = "critical"
approval_policy = "block"
script = "tools/add.rhai"

[[tool]]
name = "probe"
description = "Tries to get a secret's bytes out."
input_schema = {{ type = "object" }}
risk = "medium"
approval_policy = "allow"
script = "tools/probe.rhai"
secrets = ["api_key"]

[[tool]]
name = "pem"
description = "Holds a multi-line key."
input_schema = {{ type = "object" }}
risk = "medium"
approval_policy = "allow"
script = "tools/pem.rhai"
secrets = ["pem_key"]
"#,
        alice = key_b64(alice),
        bob = key_b64(bob),
    )
}

struct Setup {
    gw: Gateway,
    alice: Client,
    bob: Client,
    /// The policy the gateway started with.
    policy: String,
}

async fn setup() -> Setup {
    let (a, b) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let policy = policy(&a, &b);
    let gw = Gateway::start(
        &policy,
        "secrets_dir = \"secrets\"\napproval_timeout = \"2s\"",
    );
    for dir in ["tools", "secrets", "workspace"] {
        std::fs::create_dir_all(gw.dir.join(dir)).unwrap();
    }
    std::fs::write(gw.dir.join("tools/add.rhai"), "args.a + args.b").unwrap();
    // Each round sorts 20,000 numbers: few operations, much work.
    std::fs::write(
        gw.dir.join("tools/spin.rhai"),
        "let a = []; for i in 0..20000 { a.push((i * 7919) % 20011); }\nloop { let b = a; b.sort(); }",
    ).unwrap();
    std::fs::write(gw.dir.join("tools/wipe.rhai"), r#""wiped " + args.what"#).unwrap();
    std::fs::write(
        gw.dir.join("tools/vault.rhai"),
        r#"let key = secret("api_key");
print("using " + key);
if args.fail == true { throw "the service refused key " + key; }
"key is " + key"#,
    )
    .unwrap();
    std::fs::write(gw.dir.join("secrets/api_key"), format!("{SECRET}\n")).unwrap();
    std::fs::write(gw.dir.join("secrets/pem_key"), format!("{PEM}\n")).unwrap();
    // Every way a script might turn the handle into bytes: each attempt's
    // outcome (its value as text, or its error) is printed and returned.
    let attempts = [
        "k + \"\"",
        "\"\" + k",
        "`${k}`",
        "k.to_string()",
        "k.to_debug()",
        "k == \"hunter2-s3cr3t-value\"",
        "k.len()",
        "k.chars()",
        "k.split(\"-\")",
        "k.to_blob()",
        "k.to_upper()",
        "k.sub_string(0, 4)",
        "[k].to_string()",
        "#{a: k}.to_json()",
        "k.name",
        "type_of(k)",
        "parse_json(`\"${k}\"`)",
        "hmac_sha256(k, \"hello\")",
    ];
    let probe: String = attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "try {{ let v = {a}; out.push(`{i} -> ${{v}}`); }} catch (e) {{ out.push(`{i} !! ${{e}}`); }}\n"
            )
        })
        .collect();
    std::fs::write(
        gw.dir.join("tools/probe.rhai"),
        format!("let k = secret(\"api_key\");\nlet out = [];\n{probe}print(out);\nout"),
    )
    .unwrap();
    // The key in the escaped forms a script can make of it without
    // touching its characters: a map's debug and display, to_debug.
    std::fs::write(
        gw.dir.join("tools/pem.rhai"),
        r#"let k = secret("pem_key");
debug(#{key: k});
print(#{key: k});
print(k.to_debug());
throw `refused: ${#{key: k}}`"#,
    )
    .unwrap();
    std::fs::write(gw.dir.join("workspace/notes.txt"), "hello from a file\n").unwrap();
    let alice = gw.connect(&a).await.unwrap();
    alice.accept_all().await.unwrap();
    let bob = gw.connect(&b).await.unwrap();
    bob.accept_all().await.unwrap();
    Setup {
        gw,
        alice,
        bob,
        policy,
    }
}

fn remote(result: &Result<Value, ClientError>) -> (ErrorCode, String, Value) {
    match result {
        Err(ClientError::Remote(e)) => (
            e.code,
            e.message.clone(),
            e.details.clone().unwrap_or(Value::Null),
        ),
        other => panic!("expected a remote error, got {other:?}"),
    }
}

fn names(list: &Value) -> Vec<String> {
    list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn tools_are_listed_as_granted_and_called_with_checked_arguments() {
    let Setup { gw, alice, bob, .. } = setup().await;
    let list = alice.request("tool.list", json!({})).await.unwrap();
    assert_eq!(
        names(&list),
        [
            "add", "vault", "deploy", "wipe", "per_run", "spin", "probe", "pem"
        ],
        "a block tool is not listed"
    );
    assert_eq!(list["tools"][3]["approval_policy"], "always_ask");
    assert_eq!(
        list["tools"][0]["input_schema"]["required"],
        json!(["a", "b"])
    );
    assert_eq!(
        names(&bob.request("tool.list", json!({})).await.unwrap()),
        ["add"]
    );

    let sum = bob
        .request(
            "tool.call",
            json!({"name": "add", "arguments": {"a": 2, "b": 40}}),
        )
        .await
        .unwrap();
    assert_eq!(sum["value"], 42, "{sum}");

    let wrong_type = bob
        .request(
            "tool.call",
            json!({"name": "add", "arguments": {"a": "two", "b": 1}}),
        )
        .await;
    let (code, message, _) = remote(&wrong_type);
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(
        message.contains("/a") && message.contains("integer"),
        "{message}"
    );
    let missing = bob
        .request("tool.call", json!({"name": "add", "arguments": {"a": 1}}))
        .await;
    let (code, message, _) = remote(&missing);
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(
        message.contains("\"b\" is a required property"),
        "{message}"
    );

    let not_granted = bob
        .request("tool.call", json!({"name": "vault", "arguments": {}}))
        .await;
    assert_eq!(remote(&not_granted).0, ErrorCode::PermissionDenied);
    let blocked = alice
        .request("tool.call", json!({"name": "danger", "arguments": {}}))
        .await;
    assert_eq!(remote(&blocked).0, ErrorCode::PolicyBlocked);
    let unknown = alice
        .request("tool.call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(remote(&unknown).0, ErrorCode::NotFound);

    let calls: Vec<_> = gw
        .audit_entries()
        .into_iter()
        .filter(|e| {
            e.record.method.as_deref() == Some("tool.call") && e.record.completed_at.is_some()
        })
        .collect();
    assert_eq!(calls.len(), 6);
    assert!(calls.iter().all(|e| e.record.tool.is_some()));
}

/// Calls tool `name`: the `(event, text)` of each stream frame, then the
/// answer.
async fn call_streamed(
    client: &Client,
    name: &str,
) -> (Vec<(String, String)>, Result<Value, ClientError>) {
    let mut handle = client
        .start("tool.call", json!({"name": name, "arguments": {}}))
        .await
        .unwrap();
    let mut printed = Vec::new();
    while let Some(item) = handle.next().await {
        if let StreamItem::Stream { event, data } = item {
            printed.push((event, data.as_str().unwrap_or_default().to_string()));
        }
    }
    (printed, handle.response().await)
}

/// A key with what escaping changes: newlines, a quote, a backslash.
const PEM: &str = "-----BEGIN TEST KEY-----\nQUJD\"REVG\\R0hJ\n-----END TEST KEY-----";

/// A tool holds a secret as a handle: nothing its script does puts the
/// secret's bytes (as they are, reversed, upper-cased, hex, base64) in its
/// result, its output, its errors or the audit log; `hmac_sha256` uses
/// the value without showing it.
#[tokio::test]
async fn a_secret_handle_never_becomes_the_secret_s_bytes() {
    use base64::Engine as _;
    let Setup { gw, alice, .. } = setup().await;
    let (printed, result) = call_streamed(&alice, "probe").await;
    let printed: String = printed.into_iter().map(|(_, text)| text).collect();
    let result = result.unwrap();
    let outcomes: Vec<String> = result["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(outcomes.len(), 18, "{outcomes:#?}");
    let reversed: String = SECRET.chars().rev().collect();
    let forms = [
        SECRET.to_string(),
        reversed,
        SECRET.to_uppercase(),
        hex::encode(SECRET),
        base64::engine::general_purpose::STANDARD.encode(SECRET),
        "hunter2".to_string(),
        "s3cr3t".to_string(),
    ];
    let audit = String::from_utf8_lossy(
        &gw.cli_config(&["audit", "list", "--json", "--limit", "1000"])
            .stdout,
    )
    .to_string();
    for text in outcomes.iter().chain([&printed, &audit, &gw.log()]) {
        for form in &forms {
            assert!(
                !text.to_lowercase().contains(&form.to_lowercase()),
                "{form} in {text}"
            );
        }
    }
    // Shown, it is its redaction; it equals no string.
    // (Outcomes are named by the attempt's index.)
    assert_eq!(outcomes[0], "0 -> [REDACTED:api_key]", "{outcomes:#?}");
    assert_eq!(outcomes[5], "5 -> false", "{outcomes:#?}");
    // The one way to use it: a MAC under it, as the test computes with the key.
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    let mac = hex::encode(ring::hmac::sign(&key, b"hello"));
    assert_eq!(outcomes[17], format!("17 -> {mac}"), "{outcomes:#?}");
    // Returned as it is, it is refused (a result holds no secret).
    let returned = alice
        .request("script.run", json!({"source": "call_tool(\"vault\", #{})"}))
        .await
        .unwrap();
    assert_eq!(returned["value"], "key is [REDACTED:api_key]");
}

/// The redactor matches a secret in the escaped forms `debug`, `print`
/// of a map and `to_debug` give it, not only as it is.
#[tokio::test]
async fn a_secret_is_redacted_in_its_escaped_forms_too() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    let (printed, answer) = call_streamed(&alice, "pem").await;
    let printed: Vec<String> = printed.into_iter().map(|(_, text)| text).collect();
    let (_, message, _) = remote(&answer);
    assert_eq!(printed.len(), 3, "{printed:?}");
    for text in printed.iter().chain([&message]) {
        assert!(text.contains("[REDACTED:pem_key]"), "{text}");
        assert!(
            !text.contains("TEST KEY") && !text.contains("QUJD"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn secrets_never_leave_in_results_streams_errors_or_the_audit_log() {
    let Setup { gw, alice, .. } = setup().await;
    let (printed, result) = call_streamed(&alice, "vault").await;
    let result = result.unwrap();
    assert_eq!(result["value"], "key is [REDACTED:api_key]");
    assert_eq!(
        printed,
        [(
            "stdout".to_string(),
            "using [REDACTED:api_key]\n".to_string()
        )]
    );

    let failed = alice
        .request(
            "tool.call",
            json!({"name": "vault", "arguments": {"fail": true}}),
        )
        .await;
    let (_, message, _) = remote(&failed);
    assert!(message.contains("[REDACTED:api_key]"), "{message}");
    assert!(!message.contains(SECRET), "{message}");

    // Through a script as well.
    let script = r#"let r = call_tool("vault", #{}); print(r); r"#;
    let ran = alice
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    assert_eq!(ran["value"], "key is [REDACTED:api_key]");

    let log = gw.cli_config(&["audit", "list", "--json", "--limit", "1000"]);
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(text.contains("vault"), "the calls were audited");
    assert!(!text.contains(SECRET), "a secret reached the audit log");
    assert!(
        !gw.log().contains(SECRET),
        "a secret reached the daemon's log"
    );
}

#[tokio::test]
async fn a_script_calls_a_thousand_tools_in_one_request_each_audited() {
    let Setup { gw, alice, .. } = setup().await;
    let script = r#"let sum = 0; for i in 0..1000 { sum += call_tool("add", #{a: i, b: 1}); } sum"#;
    let started = Instant::now();
    let ran = alice
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(ran["value"], 500_500, "{ran}");
    assert_eq!(ran["stats"]["tool_calls"], 1000);
    eprintln!("1000 tool calls in one script: {took:?}");

    let entries = gw.audit_entries();
    let parent = entries
        .iter()
        .find(|e| {
            e.record.method.as_deref() == Some("script.run") && e.record.completed_at.is_some()
        })
        .unwrap();
    let children = entries
        .iter()
        .filter(|e| {
            e.record.parent_request_id == parent.record.request_id
                && e.record.completed_at.is_some()
                && e.record.tool.as_deref() == Some("add")
        })
        .count();
    assert_eq!(children, 1000);

    // The script's own limit on tool calls.
    let over = r#"for i in 0..1001 { call_tool("add", #{a: 1, b: 1}); }"#;
    let (code, message, details) =
        remote(&alice.request("script.run", json!({"source": over})).await);
    assert_eq!(code, ErrorCode::ProviderError);
    assert_eq!(details["limit"], "max_tool_calls", "{message}");
    // Nor can the script catch it and carry on.
    let caught = r#"
        let made = 0;
        for i in 0..20 { try { call_tool("add", #{a: 1, b: 1}); made += 1; } catch (e) { } }
        made
    "#;
    let limited = json!({"source": caught, "limits": {"max_tool_calls": 3}});
    let (code, message, details) = remote(&alice.request("script.run", limited).await);
    assert_eq!(code, ErrorCode::ProviderError);
    assert_eq!(details["limit"], "max_tool_calls", "{message}");
}

/// A script's source counts against the grant's `max_string_size` (64 KiB
/// here, and never more than 64 KiB).
#[tokio::test]
async fn a_script_longer_than_max_string_size_is_refused() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    let fits = format!("// {}\n1", "x".repeat(60 * 1024));
    assert_eq!(
        alice
            .request("script.run", json!({"source": fits}))
            .await
            .unwrap()["value"],
        1
    );
    let asked_less =
        json!({"source": "// padding padding padding\n1", "limits": {"max_string_size": 16}});
    let (code, message, _) = remote(&alice.request("script.run", asked_less).await);
    assert_eq!(code, ErrorCode::InvalidRequest, "{message}");
    assert!(message.contains("max_string_size"), "{message}");
}

/// `tool.cancel` reaches a call that is still waiting for its approval.
#[tokio::test]
async fn a_call_waiting_for_approval_is_cancelled_by_tool_cancel() {
    let Setup { gw, alice, .. } = setup().await;
    let handle = alice
        .start(
            "tool.call",
            json!({"name": "wipe", "arguments": {"what": "x"}}),
        )
        .await
        .unwrap();
    waiting(&gw, 1).await;
    let id = handle.id.to_string();
    let cancelled = alice
        .request("tool.cancel", json!({"request_id": id}))
        .await
        .unwrap();
    assert_eq!(cancelled["cancelled"], true);
    assert_eq!(remote(&handle.response().await).0, ErrorCode::Cancelled);
    assert!(
        waiting(&gw, 0).await.is_empty(),
        "still listed for approval"
    );
}

#[tokio::test]
async fn each_limit_ends_its_script_while_other_sessions_keep_working() {
    let Setup { gw, alice, bob, .. } = setup().await;
    let cases = [
        ("loop { }", "max_wall_time"),
        ("fn f(n) { f(n + 1) } f(0)", "max_call_depth"),
        (r#"let s = "x"; loop { s += s; }"#, "max_string_size"),
        ("let a = []; loop { a.push(1); }", "max_array_len"),
        (
            "let m = #{}; let i = 0; loop { m[`k${i}`] = i; i += 1; m.len(); }",
            "max_map_len",
        ),
        (
            "let n = 0; loop { print(`line ${n}`); n += 1; }",
            "max_output",
        ),
    ];
    let many: String = (0..=1000).map(|i| format!("let v{i} = {i};")).collect();
    for (source, limit) in cases
        .iter()
        .copied()
        .chain([(many.as_str(), "max_variables")])
    {
        let run = alice.request("script.run", json!({"source": source}));
        // While the script runs, another session's calls are answered.
        let probe = async {
            let started = Instant::now();
            let sum = bob
                .request(
                    "tool.call",
                    json!({"name": "add", "arguments": {"a": 1, "b": 2}}),
                )
                .await
                .unwrap();
            (sum, started.elapsed())
        };
        let (result, (sum, took)) = tokio::join!(run, probe);
        assert_eq!(sum["value"], 3);
        eprintln!("{limit}: another session's tool.call took {took:?}");
        let (code, message, details) = remote(&result);
        let named = details["limit"].as_str().unwrap_or_default().to_string();
        assert_eq!(named, limit, "{source}: {code:?} {message}");
        assert!(message.contains(limit), "{message}");
    }
    // A request may ask for less than the grant, never more.
    let asked = alice
        .request(
            "script.run",
            json!({"source": "loop {}", "limits": {"max_operations": 1000, "max_wall_time_ms": 600000}}),
        )
        .await;
    assert_eq!(remote(&asked).2["limit"], "max_operations");
    drop(gw);
}

#[tokio::test]
async fn a_running_script_is_cancelled() {
    let Setup { gw: _gw, alice, .. } = setup().await;
    let handle = alice
        .start("script.run", json!({"source": "loop { }"}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    handle.cancel().await.unwrap();
    let result = handle.response().await;
    assert_eq!(remote(&result).0, ErrorCode::Cancelled);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn scripts_reach_files_and_commands_only_as_granted() {
    let Setup { gw, alice, .. } = setup().await;
    let script = r#"
        let text = read_file("main", "notes.txt");
        let listing = list_dir("main", "");
        let echoed = exec(["echo", "from", "exec"]);
        let refused = "ran";
        try { exec(["cat", "/etc/hostname"]); } catch (e) { refused = e.code; }
        let outside = "read";
        try { read_file("main", "../../etc/passwd"); } catch (e) { outside = e.code; }
        #{text: text, entries: listing.entries.len(), echoed: echoed.stdout, refused: refused, outside: outside}
    "#;
    let ran = alice
        .request("script.run", json!({"source": script}))
        .await
        .unwrap();
    let value = &ran["value"];
    assert_eq!(value["text"], "hello from a file\n", "{ran}");
    assert_eq!(value["entries"], 1);
    assert_eq!(value["echoed"], "from exec\n");
    assert_eq!(value["refused"], "permission_denied");
    assert_eq!(value["outside"], "permission_denied");

    // Each of those was decided and audited as its own request.
    let entries = gw.audit_entries();
    let nested: Vec<_> = entries
        .iter()
        .filter(|e| e.record.parent_request_id.is_some() && e.record.completed_at.is_some())
        .map(|e| {
            (
                e.record.method.clone().unwrap_or_default(),
                e.record.error_code.clone(),
            )
        })
        .collect();
    for expected in [
        ("file.read", None),
        ("file.list", None),
        ("shell.exec", None),
        ("shell.exec", Some("permission_denied".to_string())),
        ("file.read", Some("permission_denied".to_string())),
    ] {
        let expected = (expected.0.to_string(), expected.1);
        assert!(nested.contains(&expected), "{expected:?} not in {nested:?}");
    }
    let shell = entries
        .iter()
        .find(|e| e.record.method.as_deref() == Some("shell.exec") && e.record.exit_code.is_some())
        .unwrap();
    assert_eq!(shell.record.command.as_deref(), Some("echo"));
}

/// The calls waiting for approval, as `portcullis approvals list --json`
/// shows them, once there are `n`.
async fn waiting(gw: &Gateway, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.cli(&["approvals", "list", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        let all = list["approvals"].as_array().unwrap().clone();
        if all.len() >= n {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "waited for {n} approvals: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_runtime_sees_a_parked_call_and_how_it_was_decided() {
    let Setup { gw, alice, .. } = setup().await;
    let ask = |what: &str| json!({"name": "wipe", "arguments": {"what": what}});
    let mut handle = alice.start("tool.call", ask("cache")).await.unwrap();
    // The call's status frame names the approval and a digest of the
    // arguments, and the session hears of it.
    let Some(StreamItem::Stream {
        event,
        data: parked,
    }) = handle.next().await
    else {
        panic!("no status frame")
    };
    assert_eq!(event, "status");
    assert_eq!(parked["state"], "awaiting_approval", "{parked}");
    assert_eq!(parked["method"], "tool.call");
    assert_eq!(parked["tool"], "wipe");
    assert!(parked["risk"].is_string(), "{parked}");
    let digest = parked["arguments_sha256"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64);
    assert!(
        parked.get("arguments").is_none(),
        "the arguments themselves stay with the operator"
    );
    let requested = event_named(&alice, "approval.requested").await;
    assert_eq!(requested["approval_id"], parked["approval_id"]);
    assert_eq!(requested["request_id"], handle.id.to_string());
    let pending = waiting(&gw, 1).await;
    assert_eq!(pending[0]["id"], parked["approval_id"]);
    assert!(
        gw.cli(&["approvals", "approve", &pending[0]["id"].to_string()])
            .status
            .success()
    );
    let Some(StreamItem::Stream { data: decided, .. }) = handle.next().await else {
        panic!("no decision frame")
    };
    assert_eq!(decided["state"], "approved", "{decided}");
    assert_eq!(
        event_named(&alice, "approval.decided").await["state"],
        "approved"
    );
    assert_eq!(handle.response().await.unwrap()["value"], "wiped cache");

    // Other arguments, another digest; the runtime may cancel it.
    let mut other = alice.start("tool.call", ask("logs")).await.unwrap();
    let Some(StreamItem::Stream { data: parked, .. }) = other.next().await else {
        panic!("no status frame")
    };
    assert_ne!(parked["arguments_sha256"], digest.as_str());
    other.cancel().await.unwrap();
    let (code, _, _) = remote(&other.response().await);
    assert_eq!(code, ErrorCode::Cancelled);
    assert_eq!(
        event_named(&alice, "approval.decided").await["state"],
        "approval_cancelled"
    );
}

#[tokio::test]
async fn approvals_park_the_call_until_an_operator_decides_or_it_times_out() {
    let Setup { gw, alice, .. } = setup().await;
    let wipe = json!({"name": "wipe", "arguments": {"what": "cache"}});

    // Approved: the call waits, is listed with its arguments, then runs.
    let call = alice.request("tool.call", wipe.clone());
    let operator = async {
        let pending = waiting(&gw, 1).await;
        assert_eq!(pending[0]["tool"], "wipe");
        assert_eq!(pending[0]["principal"], "alice");
        assert_eq!(pending[0]["arguments"], json!({"what": "cache"}));
        let id = pending[0]["id"].to_string();
        let out = gw.cli(&["approvals", "approve", &id]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (result, ()) = tokio::join!(call, operator);
    assert_eq!(result.unwrap()["value"], "wiped cache");

    // Denied.
    let call = alice.request("tool.call", wipe.clone());
    let operator = async {
        let id = waiting(&gw, 1).await[0]["id"].to_string();
        assert!(gw.cli(&["approvals", "deny", &id]).status.success());
    };
    let (result, ()) = tokio::join!(call, operator);
    let (code, message, _) = remote(&result);
    assert_eq!(code, ErrorCode::ApprovalRequired);
    assert!(message.contains("denied"), "{message}");

    // Nobody answers within approval_timeout (2 s).
    let started = Instant::now();
    let result = alice.request("tool.call", wipe.clone()).await;
    let (code, message, _) = remote(&result);
    assert_eq!(code, ErrorCode::ApprovalRequired);
    assert!(message.contains("within 2 s"), "{message}");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(
        waiting(&gw, 0).await.is_empty(),
        "the timed-out call is no longer listed"
    );

    // ask_once: approved once (from inside a script), then remembered.
    let script = r#"call_tool("deploy", #{a: 1, b: 2})"#;
    let call = alice.request("script.run", json!({"source": script}));
    let operator = async {
        let id = waiting(&gw, 1).await[0]["id"].to_string();
        assert!(gw.cli(&["approvals", "approve", &id]).status.success());
    };
    let (result, ()) = tokio::join!(call, operator);
    assert_eq!(result.unwrap()["value"], 3);
    let again = alice
        .request(
            "tool.call",
            json!({"name": "deploy", "arguments": {"a": 2, "b": 2}}),
        )
        .await
        .unwrap();
    assert_eq!(again["value"], 4, "remembered: no second question");

    let entries = gw.audit_entries();
    let decided: Vec<(String, Option<String>)> = entries
        .iter()
        .rev()
        .filter(|e| e.record.kind == portcullis_store::Kind::Request)
        .filter(|e| matches!(e.record.tool.as_deref(), Some("wipe" | "deploy")))
        .map(|e| {
            (
                serde_json::to_value(e.record.decision)
                    .unwrap()
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                e.record.approved_by.clone(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [
            ("approved".to_string(), Some("uid 0".to_string())),
            ("blocked".to_string(), None),
            ("blocked".to_string(), None),
            ("approved".to_string(), Some("uid 0".to_string())),
            (
                "approved".to_string(),
                Some("uid 0 (remembered)".to_string())
            ),
        ]
    );
}

#[tokio::test]
async fn a_running_tool_is_cancelled_by_its_caller_only() {
    let Setup {
        gw: _gw,
        alice,
        bob,
        ..
    } = setup().await;
    let handle = alice
        .start("tool.call", json!({"name": "spin", "arguments": {}}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let id = handle.id.to_string();

    // Another principal cannot reach it.
    let foreign = bob.request("tool.cancel", json!({"request_id": id})).await;
    assert_eq!(remote(&foreign).0, ErrorCode::NotFound);

    let started = Instant::now();
    let cancelled = alice
        .request("tool.cancel", json!({"request_id": id}))
        .await
        .unwrap();
    assert_eq!(cancelled["cancelled"], true);
    let result = handle.response().await;
    assert_eq!(remote(&result).0, ErrorCode::Cancelled);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Once finished it is gone.
    let again = alice
        .request("tool.cancel", json!({"request_id": id}))
        .await;
    assert_eq!(remote(&again).0, ErrorCode::NotFound);
}

#[tokio::test]
async fn ask_once_per_run_is_remembered_for_that_run_only() {
    let Setup { gw, alice, .. } = setup().await;
    let call = json!({"name": "per_run", "arguments": {"a": 1, "b": 1}});
    let run = |id: &str| portcullis_wire::frame::RequestContext {
        run_id: Some(id.to_string()),
        ..Default::default()
    };
    let approve_next = || async {
        let id = waiting(&gw, 1).await[0]["id"].to_string();
        assert!(gw.cli(&["approvals", "approve", &id]).status.success());
    };

    // Run 1: asked, approved, then remembered for run 1.
    let first = async {
        let handle = alice
            .start_with_context(run("run-1"), "tool.call", call.clone())
            .await
            .unwrap();
        handle.response().await
    };
    let (result, ()) = tokio::join!(first, approve_next());
    assert_eq!(result.unwrap()["value"], 2);
    let remembered = alice
        .start_with_context(run("run-1"), "tool.call", call.clone())
        .await
        .unwrap()
        .response()
        .await;
    assert_eq!(remembered.unwrap()["value"], 2, "run-1 is not asked again");

    // Run 2 is asked again (and nobody answers within 2 s).
    let other_run = alice
        .start_with_context(run("run-2"), "tool.call", call.clone())
        .await
        .unwrap()
        .response()
        .await;
    assert_eq!(remote(&other_run).0, ErrorCode::ApprovalRequired);

    // Without a run id there is nothing to remember it by: asked each time.
    let (result, ()) = tokio::join!(alice.request("tool.call", call.clone()), approve_next());
    assert_eq!(result.unwrap()["value"], 2);
    let (result, ()) = tokio::join!(alice.request("tool.call", call.clone()), approve_next());
    assert_eq!(result.unwrap()["value"], 2);
}

/// Events until one named `name` arrives (or 10 s pass).
async fn event_named(client: &Client, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(event) = client.next_event(Duration::from_millis(200)).await
            && event.event == name
        {
            return event.payload;
        }
    }
    panic!("no `{name}` event within 10 s");
}

#[tokio::test]
async fn a_reload_announces_the_tools_it_registers_and_unregisters() {
    let Setup {
        gw,
        alice,
        bob,
        policy,
    } = setup().await;
    // Bob loses `add` and gains `vault`; for alice (who may call every
    // tool) only the description of `add` changes.
    let edited = policy
        .replace(
            r#"tools = { allow = ["add"] }"#,
            r#"tools = { allow = ["vault"] }"#,
        )
        .replace("Adds two integers.", "Adds two integers (edited).");
    assert_ne!(edited, policy);
    gw.write_policy(&edited);
    gw.signal("HUP");

    let gone = event_named(&bob, "tool.unregistered").await;
    assert_eq!(gone["name"], "add");
    let added = event_named(&bob, "tool.registered").await;
    assert_eq!(added["tool"]["name"], "vault");
    assert_eq!(
        added["tool"]["input_schema"]["properties"]["fail"]["type"],
        "boolean"
    );
    assert!(added["generation"].is_string(), "{added}");
    assert_eq!(
        names(&bob.request("tool.list", json!({})).await.unwrap()),
        ["vault"]
    );

    let changed = event_named(&alice, "tool.registered").await;
    assert_eq!(changed["tool"]["name"], "add");
    assert_eq!(
        changed["tool"]["description"],
        "Adds two integers (edited)."
    );
    // Nothing else changed for alice.
    while let Some(event) = alice.next_event(Duration::from_millis(300)).await {
        assert!(!event.event.starts_with("tool."), "{event:?}");
    }
}

//! Every JSON example in the 0.92 spec (`../shared/specs/protocol-0.92/`,
//! or `$PORTCULLIS_SPECS_092_DIR`) is a fixture of the
//! ya-environment-protocol.v1 profile: a message a runtime sends is mapped
//! to the relay frame the gateway serves (never refused as malformed); a
//! message or result the provider sends has at least every field the
//! example has; a descriptor has the fields the provider's carry. Each
//! example is named by file and line, and every one must be claimed by a
//! check: a new example in the spec fails this test until it is.

mod spec_text;

use std::path::PathBuf;

use portcullis_wire::envproto::Translator;
use portcullis_wire::frame::{ErrorBody, ErrorCode, Frame, Heartbeat, RequestId, Response, Stream};
use portcullis_wire::record::{self, Record};
use serde_json::{Value, json};

const MAX: usize = 1 << 20;

fn specs_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_SPECS_092_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/specs/protocol-0.92"),
    }
}

/// The ```json blocks of one spec file, each named by file and line.
fn json_blocks(file: &str) -> Vec<(String, Value)> {
    spec_text::json_blocks(&specs_dir(), file)
        .into_iter()
        .map(|(line, value)| (format!("{file}:{line}"), value))
        .collect()
}

fn hello() -> Vec<u8> {
    json!({
        "type": "hello", "protocol": "ya-environment-relay.v1", "provider_id": "desktop-macbook",
        "client_version": "0.1.0", "instance_id": "envd_20260615_01", "principal": "runtime",
        "capabilities": {
            "fileops": {"enabled": true, "generation": "00000000000700000000",
                        "roots": [{"root_id": "main", "label": "ya-mono", "virtual_path": "/workspace/main", "mode": "rw", "follow_symlinks": false}]},
            "shell": {"enabled": true, "interactive": true, "persist": true, "cwd_roots": ["main"]},
            "tools": {"enabled": true, "tool_count": 1},
            "resources": {"enabled": true},
            "artifacts": {"enabled": true, "upload": "http"}
        }
    })
    .to_string()
    .into_bytes()
}

fn frames(records: Vec<Vec<u8>>, place: &str) -> Vec<Frame> {
    records
        .iter()
        .map(|r| match record::decode(r) {
            Ok(Record::Frame(frame)) => frame,
            other => panic!("{place}: the session would refuse this: {other:?}"),
        })
        .collect()
}

fn out(t: &mut Translator, frame: &Frame) -> Vec<Value> {
    let mut json = Vec::new();
    portcullis_wire::frame::encode_frame_json(frame, &mut json);
    t.outbound(&json)
}

/// Fields the spec marks optional that the provider leaves out.
const OPTIONAL_ABSENT: &[&str] = &[".params.provider.environment_id"];

/// Every key path of `spec` is in `ours` (values may differ; arrays are
/// compared by their first element).
fn has_fields(place: &str, spec: &Value, ours: &Value, path: &str) {
    match (spec, ours) {
        (Value::Object(spec), Value::Object(ours)) => {
            for (key, value) in spec {
                let here = format!("{path}.{key}");
                // Optional in the spec's types (`environment_id?`) and not
                // a notion of portcullis's: one gateway is one environment.
                if OPTIONAL_ABSENT.contains(&here.as_str()) {
                    continue;
                }
                let Some(mine) = ours.get(key) else {
                    panic!(
                        "{place}: the provider's message lacks `{here}`\nspec: {spec:#?}\nours: {ours:#?}"
                    );
                };
                has_fields(place, value, mine, &here);
            }
        }
        (Value::Array(spec), Value::Array(ours)) => {
            if let (Some(a), Some(b)) = (spec.first(), ours.first()) {
                has_fields(place, a, b, &format!("{path}[0]"));
            }
        }
        _ => {}
    }
}

/// A translator past its handshake, and the `initialize` it sent.
fn ready() -> (Translator, Value) {
    let mut t = Translator::new();
    let init = t.outbound(&hello()).remove(0);
    let answer = json!({"jsonrpc": "2.0", "id": init["id"], "result": {"accepted_capabilities": ["fileops", "shell", "process", "shell_session", "tools", "resources", "artifacts"]}});
    let got = frames(
        t.inbound(answer.to_string().as_bytes(), MAX).unwrap(),
        "ready",
    );
    let Some(Frame::Ping(Heartbeat { id: Some(id), .. })) = got.get(1) else {
        panic!("{got:?}")
    };
    out(
        &mut t,
        &Frame::Pong(Heartbeat {
            id: Some(id.clone()),
            ts: None,
        }),
    );
    (t, init)
}

/// The relay request a runtime's message becomes.
fn relay_request(
    t: &mut Translator,
    place: &str,
    message: &Value,
) -> portcullis_wire::frame::Request {
    let got = frames(
        t.inbound(message.to_string().as_bytes(), MAX).unwrap(),
        place,
    );
    match got.into_iter().next() {
        Some(Frame::Request(request)) => request,
        other => panic!("{place}: not a request: {other:?}"),
    }
}

#[test]
fn every_example_of_the_0_92_spec_is_a_fixture() {
    let mut blocks = Vec::new();
    for file in [
        "01-overview.md",
        "02-protocol.md",
        "03-environment.md",
        "04-security-and-policy.md",
        "05-implementation-plan.md",
        "06-desktop-local-pc-provider.md",
        "07-ya-envd.md",
    ] {
        blocks.extend(json_blocks(file));
    }
    assert!(blocks.len() >= 27, "found {} examples", blocks.len());
    let (_, our_init) = ready();
    let mut checked = 0;
    for (place, example) in &blocks {
        let (mut t, _) = ready();
        let method = example.get("method").and_then(Value::as_str);
        let rpc = example.get("jsonrpc").is_some();
        match (rpc, method, example.get("id")) {
            // The provider's initialize: ours carries every field.
            (true, Some("initialize"), Some(_)) => has_fields(place, example, &our_init, ""),
            // A runtime's request: mapped, never refused.
            (true, Some("$/ping"), Some(id)) => {
                let got = frames(
                    t.inbound(example.to_string().as_bytes(), MAX).unwrap(),
                    place,
                );
                let Some(Frame::Ping(Heartbeat { id: Some(ping), .. })) = got.first() else {
                    panic!("{place}: {got:?}")
                };
                let said = out(
                    &mut t,
                    &Frame::Pong(Heartbeat {
                        id: Some(ping.clone()),
                        ts: None,
                    }),
                );
                assert_eq!(&said[0]["id"], id, "{place}");
                assert_eq!(said[0]["result"]["ts"], example["params"]["ts"], "{place}");
            }
            (true, Some(method), Some(_)) => {
                let request = relay_request(&mut t, place, example);
                assert_eq!(request.method, method, "{place}");
                if let Some(context) = example.get("context") {
                    assert_eq!(
                        request.context.as_ref().and_then(|c| c.run_id.as_deref()),
                        context["run_id"].as_str(),
                        "{place}"
                    );
                }
            }
            // Notifications: the runtime's cancel; the provider's event
            // and stream carry the example's fields.
            (true, Some("$/cancelRequest"), None) => {
                let target = example["params"]["id"].clone();
                relay_request(
                    &mut t,
                    place,
                    &json!({"jsonrpc": "2.0", "id": target, "method": "shell.exec", "params": {"command": "sleep 9"}}),
                );
                let got = frames(
                    t.inbound(example.to_string().as_bytes(), MAX).unwrap(),
                    place,
                );
                let Some(Frame::Cancel(cancel)) = got.first() else {
                    panic!("{place}: {got:?}")
                };
                assert_eq!(Some(cancel.id.as_str()), target.as_str(), "{place}");
                assert_eq!(
                    cancel.reason.as_deref(),
                    example["params"]["reason"].as_str()
                );
            }
            (true, Some("$/event"), None) => {
                let p = &example["params"];
                let event = portcullis_wire::frame::Event {
                    event: p["event"].as_str().unwrap().into(),
                    payload: p["payload"].clone(),
                };
                let said = out(&mut t, &Frame::Event(event));
                has_fields(place, example, &said[0], "");
            }
            (true, Some("$/stream"), None) => {
                let p = &example["params"];
                let id = p["id"].clone();
                let start = json!({"jsonrpc": "2.0", "id": id, "method": "shell.exec", "params": {"command": "pytest"}});
                let relay = relay_request(&mut t, place, &start);
                let stream = Stream {
                    id: relay.id,
                    event: p["event"].as_str().unwrap().into(),
                    data: p["data"].clone(),
                    sequence: p["sequence"].as_u64(),
                    encoding: None,
                };
                let said = out(&mut t, &Frame::Stream(stream));
                has_fields(place, example, &said[0], "");
                assert_eq!(said[0]["params"], example["params"], "{place}");
            }
            // Responses: the runtime's answer to initialize is accepted;
            // the provider's answers carry the example's fields.
            (true, None, Some(id))
                if example
                    .get("result")
                    .is_some_and(|r| r.get("accepted_capabilities").is_some()) =>
            {
                let mut t = Translator::new();
                let init = t.outbound(&hello()).remove(0);
                let mut answer = example.clone();
                answer["id"] = init["id"].clone();
                let _ = id;
                let got = frames(
                    t.inbound(answer.to_string().as_bytes(), MAX).unwrap(),
                    place,
                );
                let Some(Frame::Event(accepted)) = got.first() else {
                    panic!("{place}: {got:?}")
                };
                assert_eq!(accepted.event, "relay.accepted");
                assert_eq!(
                    accepted.payload["connection_id"],
                    example["result"]["connection_id"]
                );
                // process and shell_session are the relay's shell.
                assert_eq!(
                    accepted.payload["accepted_capabilities"],
                    json!(["fileops", "shell", "resources"]),
                    "{place}"
                );
            }
            (true, None, Some(id)) if id.as_str().is_some_and(|i| i.starts_with("ping")) => {
                let (mut t, _) = ready();
                let request = json!({"jsonrpc": "2.0", "id": id, "method": "$/ping", "params": {"ts": example["result"]["ts"]}});
                let got = frames(
                    t.inbound(request.to_string().as_bytes(), MAX).unwrap(),
                    place,
                );
                let Some(Frame::Ping(Heartbeat { id: Some(ping), .. })) = got.first() else {
                    panic!()
                };
                let said = out(
                    &mut t,
                    &Frame::Pong(Heartbeat {
                        id: Some(ping.clone()),
                        ts: None,
                    }),
                );
                assert_eq!(&said[0], example, "{place}");
            }
            (true, None, Some(id)) => {
                let request = json!({"jsonrpc": "2.0", "id": id, "method": "file.read", "params": {"mount_id": "main", "path": "README.md"}});
                let relay = relay_request(&mut t, place, &request);
                let answer = match (example.get("result"), example.get("error")) {
                    (Some(result), _) => Response::ok(relay.id, result.clone()),
                    (None, Some(error)) => {
                        let code =
                            serde_json::from_value::<ErrorCode>(error["data"]["name"].clone())
                                .unwrap();
                        Response::err(
                            relay.id,
                            ErrorBody::new(code, error["message"].as_str().unwrap()),
                        )
                    }
                    _ => panic!("{place}: neither result nor error"),
                };
                let said = out(&mut t, &Frame::Response(answer));
                has_fields(place, example, &said[0], "");
                if let Some(error) = example.get("error") {
                    assert_eq!(
                        said[0]["error"]["code"], error["code"],
                        "{place}: the spec's number"
                    );
                }
            }
            // A method and params without the envelope: as a request.
            (false, Some(method), None) => {
                let message = json!({"jsonrpc": "2.0", "id": "fixture", "method": method, "params": example["params"]});
                let request = relay_request(&mut t, place, &message);
                let expected = match method {
                    "process.start" => "shell.start",
                    "shell_session.open" => "shell.start",
                    other => other,
                };
                assert_eq!(request.method, expected, "{place}");
                if example["params"].get("mount_id").is_some() {
                    assert_eq!(
                        request.params["root_id"], example["params"]["mount_id"],
                        "{place}"
                    );
                }
                if let Some(line) = example["params"]["command"].as_str() {
                    assert_eq!(
                        request.params["command"],
                        json!(["sh", "-c", line]),
                        "{place}"
                    );
                }
            }
            // Results without the envelope: the answer to the method the
            // example before it shows; ours carries every field.
            (false, None, None) if example.get("exit_code").is_some() => {
                let relay = relay_request(
                    &mut t,
                    place,
                    &json!({"jsonrpc": "2.0", "id": 1, "method": "shell.exec", "params": {"command": "true"}}),
                );
                let relay_result = json!({"exit_code": 0, "signal": null, "timed_out": false, "duration_ms": 1234, "encoding": "utf8",
                    "stdout": "...", "stdout_bytes": 3, "stdout_truncated": false, "stderr": "", "stderr_bytes": 0, "stderr_truncated": false});
                let said = out(
                    &mut t,
                    &Frame::Response(Response::ok(relay.id, relay_result)),
                );
                has_fields(place, example, &said[0]["result"], "");
            }
            (false, None, None)
                if example.get("process_id").is_some() || example.get("session_id").is_some() =>
            {
                let session = example.get("session_id").is_some();
                let method = if session {
                    "shell_session.open"
                } else {
                    "process.start"
                };
                let relay = relay_request(
                    &mut t,
                    place,
                    &json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"command": "make web-dev"}}),
                );
                let stream = Stream {
                    id: relay.id,
                    event: "started".into(),
                    data: json!({"process_id": "p1-abcd1234", "pid": 7, "terminal": session, "persist": true}),
                    sequence: None,
                    encoding: None,
                };
                let said = out(&mut t, &Frame::Stream(stream));
                has_fields(place, example, &said[0]["result"], "");
            }
            (false, None, None) if example.get("artifact_id").is_some() => {
                // The runtime's answer to the provider's artifact.reserve:
                // handed back to the call that asked, as it is.
                let ask = portcullis_wire::frame::Request {
                    id: RequestId::new("gw-1").unwrap(),
                    method: "artifact.reserve".into(),
                    params: serde_json::Map::new(),
                    context: None,
                };
                out(&mut t, &Frame::Request(ask));
                let answer = json!({"jsonrpc": "2.0", "id": "gw-1", "result": example});
                let got = frames(
                    t.inbound(answer.to_string().as_bytes(), MAX).unwrap(),
                    place,
                );
                let Some(Frame::Response(response)) = got.first() else {
                    panic!("{place}: {got:?}")
                };
                assert_eq!(response.result.as_ref(), Some(example), "{place}");
            }
            // Descriptors (03): a mount and a target as initialize has them.
            (false, None, None) if example.get("target_id").is_some() => {
                has_fields(
                    place,
                    example,
                    &our_init["params"]["capabilities"]["shell"]["targets"][0],
                    "",
                );
            }
            (false, None, None) if example.get("virtual_path").is_some() => {
                has_fields(
                    place,
                    example,
                    &our_init["params"]["capabilities"]["fileops"]["mounts"][0],
                    "",
                );
            }
            (false, None, None)
                if example.get("mount_id").is_some() && example.get("path").is_some() =>
            {
                let message =
                    json!({"jsonrpc": "2.0", "id": 1, "method": "file.stat", "params": example});
                let request = relay_request(&mut t, place, &message);
                assert_eq!(request.params["root_id"], example["mount_id"], "{place}");
                assert_eq!(request.params["path"], example["path"], "{place}");
            }
            // A tool descriptor: `tool.list` passes the gateway's
            // descriptors through (docs/PROTOCOL.md §9), whose fields are these.
            (false, None, None) if example.get("input_schema").is_some() => {
                let ours = [
                    "name",
                    "title",
                    "description",
                    "input_schema",
                    "capability",
                    "risk",
                    "approval_policy",
                ];
                for key in example.as_object().unwrap().keys() {
                    assert!(
                        ours.contains(&key.as_str()),
                        "{place}: a tool descriptor field `{key}` the gateway's lack"
                    );
                }
            }
            // ya-envd's own configuration (07): portcullis's counterparts.
            (false, None, None) if example.get("shell_targets").is_some() => {
                let counterparts = [
                    ("provider_id", "portcullis.toml provider_id"),
                    ("environment_id", "context.workspace_id (not configured)"),
                    ("display_name", "provider_id"),
                    ("mounts", "[[root]] in the policy"),
                    ("shell_targets", "[grant.shell] in the policy"),
                ];
                for key in example.as_object().unwrap().keys() {
                    assert!(
                        counterparts.iter().any(|(k, _)| k == key),
                        "{place}: `{key}` has no counterpart"
                    );
                }
                let mount = &example["mounts"][0];
                for key in mount.as_object().unwrap().keys() {
                    let root = [
                        "mount_id",
                        "label",
                        "host_path",
                        "virtual_path",
                        "mode",
                        "follow_symlinks",
                        "watch_supported",
                    ];
                    assert!(root.contains(&key.as_str()), "{place}: mount `{key}`");
                }
            }
            _ => panic!("{place}: an example no check claims:\n{example:#}"),
        }
        checked += 1;
    }
    assert_eq!(checked, blocks.len());
}

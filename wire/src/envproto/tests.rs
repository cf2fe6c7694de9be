//! The mapping, message by message (the translator is pure: JSON in,
//! records and JSON out).

use serde_json::{Value, json};

use super::Translator;
use crate::frame::{ErrorBody, ErrorCode, Frame, Heartbeat, RequestId, Response, Stream};
use crate::record::{self, Record};

const MAX: usize = 1 << 20;

fn hello() -> Vec<u8> {
    json!({
        "type": "hello", "protocol": "ya-environment-relay.v1", "provider_id": "gw-test",
        "client_version": "0.1.0", "instance_id": "inst-1", "principal": "agent", "max_frame": 16777216,
        "capabilities": {
            "fileops": {"enabled": true, "generation": "2a77e2b6c1ff00112233",
                        "roots": [{"root_id": "main", "label": "main", "virtual_path": "/workspace/main", "mode": "rw", "follow_symlinks": false},
                                  {"root_id": "docs", "label": "docs", "virtual_path": "/workspace/main/docs", "mode": "ro", "follow_symlinks": true}]},
            "shell": {"enabled": true, "runtime": "portcullis", "interactive": true, "persist": true, "cwd_roots": ["main"]},
            "tools": {"enabled": true, "tool_count": 1},
            "resources": {"enabled": true}
        }
    })
    .to_string()
    .into_bytes()
}

fn frames(records: Vec<Vec<u8>>) -> Vec<Frame> {
    records
        .iter()
        .map(|r| match record::decode(r) {
            Ok(Record::Frame(frame)) => frame,
            other => panic!("not a frame record: {other:?}"),
        })
        .collect()
}

fn out(t: &mut Translator, frame: &Frame) -> Vec<Value> {
    let mut json = Vec::new();
    crate::frame::encode_frame_json(frame, &mut json);
    t.outbound(&json)
}

fn inbound(t: &mut Translator, message: Value) -> Vec<Frame> {
    frames(
        t.inbound(message.to_string().as_bytes(), MAX)
            .expect("not fatal"),
    )
}

/// A translator past the handshake: hello out, `initialize` answered.
fn ready() -> Translator {
    let mut t = Translator::new();
    let said = t.outbound(&hello());
    assert_eq!(said.len(), 1);
    let accepted = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "initialize", "result": {"accepted_protocol": "ya-environment-protocol.v1",
            "connection_id": "conn_1", "token": "tok-1", "accepted_capabilities": ["fileops", "shell", "process", "shell_session", "resources"]}}),
    );
    let Frame::Event(event) = &accepted[0] else {
        panic!("{accepted:?}")
    };
    assert_eq!(event.event, "relay.accepted");
    assert_eq!(
        event.payload["accepted_capabilities"],
        json!(["fileops", "shell", "resources"])
    );
    assert_eq!(event.payload["connection_id"], "conn_1");
    // For the session to check, where its transport asks for a token.
    assert_eq!(event.payload["token"], "tok-1");
    assert_eq!(event.payload["output"], "frames");
    // provider.online, in order, when the session's pong passes.
    let online = pong(&mut t, &accepted[1]);
    assert_eq!(online[0]["method"], "$/event");
    assert_eq!(online[0]["params"]["event"], "provider.online");
    assert_eq!(online[0]["params"]["payload"]["instance_id"], "inst-1");
    t
}

/// The session's pong to one of the translator's pings (`frame`): what
/// the translator then says.
fn pong(t: &mut Translator, frame: &Frame) -> Vec<Value> {
    let Frame::Ping(Heartbeat { id: Some(id), .. }) = frame else {
        panic!("not a ping: {frame:?}")
    };
    out(
        t,
        &Frame::Pong(Heartbeat {
            id: Some(id.clone()),
            ts: None,
        }),
    )
}

fn request(frame: &Frame) -> &crate::frame::Request {
    match frame {
        Frame::Request(request) => request,
        other => panic!("not a request: {other:?}"),
    }
}

fn respond(t: &mut Translator, id: &str, result: Value) -> Vec<Value> {
    out(
        t,
        &Frame::Response(Response::ok(RequestId::new(id).unwrap(), result)),
    )
}

fn stream(
    t: &mut Translator,
    id: &str,
    event: &str,
    data: Value,
    sequence: Option<u64>,
) -> Vec<Value> {
    let stream = Stream {
        id: RequestId::new(id).unwrap(),
        event: event.into(),
        data,
        sequence,
        encoding: None,
    };
    out(t, &Frame::Stream(stream))
}

#[test]
fn the_hello_becomes_initialize_with_mounts_a_target_and_honest_persistence() {
    let mut t = Translator::new();
    let said = t.outbound(&hello());
    let init = &said[0];
    assert_eq!(init["jsonrpc"], "2.0");
    assert_eq!(init["id"], "initialize");
    assert_eq!(init["method"], "initialize");
    let p = &init["params"];
    assert_eq!(p["protocol"], "ya-environment-protocol.v1");
    assert_eq!(p["provider"]["provider_id"], "gw-test");
    assert_eq!(p["provider"]["instance_id"], "inst-1");
    assert_eq!(p["provider"]["provider_kind"], "ya_envd");
    let mount = &p["capabilities"]["fileops"]["mounts"][0];
    assert_eq!(mount["mount_id"], "main");
    assert_eq!(mount["virtual_path"], "/workspace/main");
    assert_eq!(mount["mode"], "rw");
    assert_eq!(mount["state"], "online");
    assert_eq!(mount["generation"], 0x2a77e2b6c1ff_u64);
    assert_eq!(mount["watch_supported"], true);
    assert_eq!(
        p["capabilities"]["fileops"]["mounts"][1]["follow_symlinks"],
        true
    );
    let target = &p["capabilities"]["shell"]["targets"][0];
    assert_eq!(target["target_id"], "local");
    assert_eq!(target["default_cwd"], "/workspace/main");
    assert_eq!(target["process_persistence"], "provider");
    assert_eq!(target["session_persistence"], "provider");
    assert_eq!(target["supports_pty"], true);
    assert_eq!(p["capabilities"]["shell_session"]["enabled"], true);
    assert_eq!(p["capabilities"]["computer"]["enabled"], false);
    // Never durable: a restart loses processes.
    assert!(!init.to_string().contains("durable"));
}

#[test]
fn without_persist_processes_are_only_connection_persistent() {
    let mut t = Translator::new();
    let hello = String::from_utf8(hello())
        .unwrap()
        .replace("\"persist\":true", "\"persist\":false");
    let said = t.outbound(hello.as_bytes());
    let target = &said[0]["params"]["capabilities"]["shell"]["targets"][0];
    assert_eq!(target["process_persistence"], "connection");
}

#[test]
fn file_requests_name_a_root_and_carry_context_and_mode() {
    let mut t = ready();
    // 02-protocol.md's first example, as written.
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "req_123", "method": "file.read",
               "params": {"mount_id": "main", "path": "README.md", "encoding": "utf-8"},
               "context": {"session_id": "session_abc", "run_id": "run_def", "tool_call_id": "call_ghi", "workspace_id": "workspace_xyz"}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.id.as_str(), "req_123");
    assert_eq!(r.method, "file.read");
    assert_eq!(r.params["root_id"], "main");
    assert_eq!(r.params["path"], "README.md");
    assert!(!r.params.contains_key("mount_id"));
    let context = r.context.as_ref().unwrap();
    assert_eq!(context.run_id.as_deref(), Some("run_def"));
    assert_eq!(context.tool_call_id.as_deref(), Some("call_ghi"));
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": 7, "method": "file.read", "params": {"mount_id": "main", "path": "a.bin", "mode": "bytes", "stream": true}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.id.as_str(), "7");
    assert_eq!(r.params["encoding"], "base64");
    assert!(
        !r.params.contains_key("stream"),
        "no chunks in this profile"
    );
    // The answer goes back under the runtime's own id, a number.
    let said = respond(
        &mut t,
        "7",
        json!({"content": "AAE=", "encoding": "base64"}),
    );
    assert_eq!(said[0]["id"], 7);
    assert_eq!(said[0]["result"]["content"], "AAE=");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "l", "method": "file.list", "params": {"mount_id": "main", "path": ".", "include_hidden": false}}),
    );
    assert_eq!(request(&got[0]).params["hidden"], false);
}

#[test]
fn a_command_line_runs_under_sh_in_the_mount_its_cwd_is_under() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "x", "method": "shell.exec", "params": {"target_id": "local", "command": "pwd && pytest",
               "cwd": "/workspace/main/docs/api", "env": {"PYTHONUNBUFFERED": "1"}, "timeout_ms": 180000}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.exec");
    assert_eq!(r.params["command"], json!(["sh", "-c", "pwd && pytest"]));
    // The longest mount the path is under.
    assert_eq!(r.params["root_id"], "docs");
    assert_eq!(r.params["cwd"], "/workspace/main/docs/api");
    assert_eq!(r.params["target_id"], "local");
    let said = respond(
        &mut t,
        "x",
        json!({"exit_code": 0, "stdout": "ok", "stderr": "", "duration_ms": 3, "stdout_truncated": false, "stderr_truncated": true}),
    );
    assert_eq!(said[0]["result"]["truncated"], true);
    // An argv stays an argv; no cwd is the first mount.
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "y", "method": "shell.exec", "params": {"command": ["ls", "-l"]}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.params["command"], json!(["ls", "-l"]));
    assert_eq!(r.params["root_id"], "main");
    // A cwd outside every mount still names one: the policy refuses it.
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "z", "method": "shell.exec", "params": {"command": "true", "cwd": "/etc"}}),
    );
    assert_eq!(request(&got[0]).params["root_id"], "main");
}

#[test]
fn a_started_process_is_answered_at_once_and_its_output_streams_under_the_request_id() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "p1", "method": "process.start", "params": {"target_id": "local", "command": "make web-dev", "cwd": "/workspace/main", "env": {}, "output_limit_bytes": 1048576}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.start");
    assert!(!r.params.contains_key("output_limit_bytes"));
    let said = stream(
        &mut t,
        "p1",
        "started",
        json!({"process_id": "p3-abcd1234", "pid": 42, "terminal": false, "persist": true}),
        None,
    );
    assert_eq!(said[0]["id"], "p1");
    assert_eq!(said[0]["result"]["process_id"], "p3-abcd1234");
    assert_eq!(said[0]["result"]["persistence"], "provider");
    assert!(
        said[0]["result"]["started_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let said = stream(&mut t, "p1", "stdout", json!("hello\n"), Some(0));
    assert_eq!(said[0]["method"], "$/stream");
    assert_eq!(said[0]["params"]["id"], "p1");
    assert_eq!(said[0]["params"]["event"], "stdout");
    assert_eq!(said[0]["params"]["sequence"], 0);
    assert_eq!(said[0]["params"]["data"], "hello\n");
    // The id is free again for the runtime; the relay id is still busy.
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "p1", "method": "process.status", "params": {"process_id": "p3-abcd1234"}}),
    );
    let status = request(&got[0]);
    assert_ne!(status.id.as_str(), "p1");
    assert_eq!(status.method, "shell.status");
    // A cancel of the answered start does nothing (JSON-RPC: it is done).
    assert!(
        inbound(
            &mut t,
            json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "x-unknown"}})
        )
        .is_empty()
    );
    // The start's own terminal response is not sent again.
    assert!(
        respond(
            &mut t,
            "p1",
            json!({"process_id": "p3-abcd1234", "exit_code": 0})
        )
        .is_empty()
    );
    let said = respond(
        &mut t,
        status.id.as_str(),
        json!({"process_id": "p3-abcd1234", "command": ["sh", "-c", "make web-dev"], "state": "exited", "ended_by": "exit", "exit_code": 0, "persist": true}),
    );
    let r = &said[0]["result"];
    assert_eq!(said[0]["id"], "p1");
    assert_eq!(r["status"], "exited");
    assert_eq!(r["command"], "make web-dev");
    assert_eq!(r["target_id"], "local");
    assert_eq!(r["persistence"], "provider");
}

#[test]
fn a_cancel_names_the_relay_request_of_the_runtime_s_id() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": 5, "method": "shell.exec", "params": {"command": "sleep 9"}}),
    );
    assert_eq!(request(&got[0]).id.as_str(), "5");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 5, "reason": "user_cancelled"}}),
    );
    let Frame::Cancel(cancel) = &got[0] else {
        panic!("{got:?}")
    };
    assert_eq!(cancel.id.as_str(), "5");
    assert_eq!(cancel.reason.as_deref(), Some("user_cancelled"));
    // A string "5" is another request.
    assert!(
        inbound(
            &mut t,
            json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": "5"}})
        )
        .is_empty()
    );
    let said = out(
        &mut t,
        &Frame::Response(Response::err(
            RequestId::new("5").unwrap(),
            ErrorBody::new(ErrorCode::Cancelled, "cancelled"),
        )),
    );
    assert_eq!(said[0]["id"], 5);
    assert_eq!(said[0]["error"]["code"], -32800);
    assert_eq!(said[0]["error"]["data"]["name"], "cancelled");
}

#[test]
fn a_wait_gathers_the_output_and_reports_how_the_process_ended() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "w", "method": "process.wait", "params": {"process_id": "p3-abcd1234", "timeout_ms": 5000}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.attach");
    assert_eq!(r.params["wait_ms"], 5000);
    assert!(stream(&mut t, "w", "attached", json!({"process_id": "p3-abcd1234", "from_seq": 0, "first_seq": 0, "next_seq": 9, "truncated": false}), None).is_empty());
    assert!(stream(&mut t, "w", "stdout", json!("one\n"), Some(0)).is_empty());
    assert!(stream(&mut t, "w", "stderr", json!("two\n"), Some(4)).is_empty());
    let said = respond(
        &mut t,
        "w",
        json!({"process_id": "p3-abcd1234", "exit_code": 3, "signal": null, "ended_by": "exit", "output_truncated": false}),
    );
    let r = &said[0]["result"];
    assert_eq!(r["status"], "exited");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["stdout"], "one\n");
    assert_eq!(r["stderr"], "two\n");
    assert_eq!(r["next_seq"], 8);
    assert_eq!(r["output_truncated"], false);
    // A wait that ends before the process says so.
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "w2", "method": "process.wait", "params": {"process_id": "p3-abcd1234", "timeout_ms": 10}}),
    );
    let said = respond(
        &mut t,
        "w2",
        json!({"process_id": "p3-abcd1234", "state": "running"}),
    );
    assert_eq!(said[0]["result"]["status"], "running");
    // Killed at its time limit: a result, not an error.
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "w3", "method": "process.wait", "params": {"process_id": "p3-abcd1234"}}),
    );
    let body = ErrorBody::new(ErrorCode::Timeout, "killed at its time limit").with_details(
        json!({"process_id": "p3-abcd1234", "ended_by": "timeout", "exit_code": null}),
    );
    let said = out(
        &mut t,
        &Frame::Response(Response::err(RequestId::new("w3").unwrap(), body)),
    );
    assert_eq!(said[0]["result"]["status"], "killed");
}

#[test]
fn output_gathered_for_a_wait_is_bounded() {
    let mut t = ready();
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "w", "method": "process.wait", "params": {"process_id": "p"}}),
    );
    let chunk = "x".repeat(64 * 1024);
    for i in 0..40u64 {
        stream(&mut t, "w", "stdout", json!(chunk), Some(i * 65536));
    }
    let said = respond(
        &mut t,
        "w",
        json!({"process_id": "p", "ended_by": "exit", "exit_code": 0}),
    );
    assert_eq!(said[0]["result"]["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(said[0]["result"]["output_truncated"], true);
    assert_eq!(said[0]["result"]["next_seq"], 40 * 65536);
}

#[test]
fn a_shell_session_is_a_terminal_process_with_session_names() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "s", "method": "shell_session.open", "params": {"target_id": "local", "cwd": "/workspace/main", "env": {}, "pty": {"cols": 120, "rows": 30}, "persistence": "provider"}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.start");
    assert_eq!(r.params["command"], json!(["sh"]));
    assert_eq!(r.params["pty"], true);
    assert_eq!(r.params["cols"], 120);
    assert_eq!(r.params["rows"], 30);
    let said = stream(
        &mut t,
        "s",
        "started",
        json!({"process_id": "p4-abcd1234", "terminal": true, "persist": true}),
        None,
    );
    assert_eq!(said[0]["result"]["session_id"], "p4-abcd1234");
    assert_eq!(said[0]["result"]["resource_id"], "p4-abcd1234");
    assert_eq!(said[0]["result"]["persistence"], "provider");
    let said = stream(&mut t, "s", "stdout", json!("$ "), Some(0));
    assert_eq!(said[0]["params"]["event"], "pty_output");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "e", "method": "shell_session.exec", "params": {"session_id": "p4-abcd1234", "command": "cd src"}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.input");
    assert_eq!(r.params["process_id"], "p4-abcd1234");
    assert_eq!(r.params["data"], "cd src\n");
    let said = respond(
        &mut t,
        "e",
        json!({"process_id": "p4-abcd1234", "written": 7, "eof": false}),
    );
    assert_eq!(said[0]["result"]["session_id"], "p4-abcd1234");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "r", "method": "shell_session.resize", "params": {"session_id": "p4-abcd1234", "cols": 100, "rows": 40}}),
    );
    assert_eq!(request(&got[0]).method, "shell.resize");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "snap", "method": "shell_session.snapshot", "params": {"session_id": "p4-abcd1234"}}),
    );
    let r = request(&got[0]);
    assert_eq!(r.method, "shell.attach");
    assert_eq!(r.params["wait_ms"], 0);
    stream(
        &mut t,
        "snap",
        "attached",
        json!({"from_seq": 0, "first_seq": 0}),
        None,
    );
    stream(&mut t, "snap", "stdout", json!("$ cd src\n$ "), Some(0));
    let said = respond(
        &mut t,
        "snap",
        json!({"process_id": "p4-abcd1234", "state": "running"}),
    );
    assert_eq!(said[0]["result"]["output"], "$ cd src\n$ ");
    assert_eq!(said[0]["result"]["status"], "open");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "ls", "method": "shell_session.list"}),
    );
    assert_eq!(request(&got[0]).method, "shell.list");
    let said = respond(
        &mut t,
        "ls",
        json!({"processes": [{"process_id": "p4-abcd1234", "terminal": true, "state": "running"}, {"process_id": "p3", "terminal": false, "state": "running"}]}),
    );
    let sessions = said[0]["result"]["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["session_id"], "p4-abcd1234");
    assert_eq!(sessions[0]["status"], "open");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "c", "method": "shell_session.close", "params": {"session_id": "p4-abcd1234"}}),
    );
    assert_eq!(request(&got[0]).method, "shell.cancel");
    let said = respond(
        &mut t,
        "c",
        json!({"process_id": "p4-abcd1234", "cancelled": true}),
    );
    assert_eq!(said[0]["result"]["status"], "closed");
}

#[test]
fn a_handle_of_an_earlier_run_is_lost_not_missing() {
    let mut t = ready();
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "w", "method": "process.wait", "params": {"process_id": "p1-00000000"}}),
    );
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "s", "method": "shell_session.status", "params": {"session_id": "p2-00000000"}}),
    );
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "n", "method": "process.status", "params": {"process_id": "nope"}}),
    );
    let lost = ErrorBody::new(ErrorCode::NotFound, "started by an earlier run")
        .with_details(json!({"lost": true}));
    let said = out(
        &mut t,
        &Frame::Response(Response::err(RequestId::new("w").unwrap(), lost.clone())),
    );
    assert_eq!(said[0]["error"]["code"], -32061);
    assert_eq!(said[0]["error"]["data"]["name"], "process_lost");
    let said = out(
        &mut t,
        &Frame::Response(Response::err(RequestId::new("s").unwrap(), lost)),
    );
    assert_eq!(said[0]["error"]["data"]["name"], "session_lost");
    let said = out(
        &mut t,
        &Frame::Response(Response::err(
            RequestId::new("n").unwrap(),
            ErrorBody::new(ErrorCode::NotFound, "no such process"),
        )),
    );
    assert_eq!(said[0]["error"]["code"], -32044);
    assert_eq!(said[0]["error"]["data"]["name"], "not_found");
}

#[test]
fn what_is_not_json_rpc_goes_to_the_session_to_be_refused_then_is_answered() {
    let mut t = ready();
    for (message, id, code) in [
        (&b"{not json"[..], Value::Null, -32700),
        (b"[1, 2]", Value::Null, -32600),
        (
            b"{\"jsonrpc\": \"1.0\", \"id\": 3, \"method\": \"x\"}",
            json!(3),
            -32600,
        ),
        (
            b"{\"jsonrpc\": \"2.0\", \"id\": \"q\", \"method\": \"file.read\", \"params\": [1]}",
            json!("q"),
            -32600,
        ),
        (
            b"{\"jsonrpc\": \"2.0\", \"id\": {\"a\": 1}, \"method\": \"file.read\"}",
            Value::Null,
            -32600,
        ),
    ] {
        let records = t.inbound(message, MAX).unwrap();
        assert_eq!(records.len(), 1);
        // The session cannot read it as a frame: it refuses and audits it.
        assert!(record::decode(&records[0]).is_err());
        let said = out(
            &mut t,
            &Frame::Event(crate::frame::Event {
                event: "relay.error".into(),
                payload: json!({"code": "invalid_request"}),
            }),
        );
        assert_eq!(said[0]["id"], id, "{}", String::from_utf8_lossy(message));
        assert_eq!(said[0]["error"]["code"], code);
        assert!(
            said[0]["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}

#[test]
fn pings_either_way_and_protocol_messages_answered_in_order() {
    let mut t = ready();
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "ping_1", "method": "$/ping", "params": {"ts": "2026-06-15T12:00:00Z"}}),
    );
    let said = pong(&mut t, &got[0]);
    assert_eq!(
        said[0],
        json!({"jsonrpc": "2.0", "id": "ping_1", "result": {"ts": "2026-06-15T12:00:00Z"}})
    );
    // The session's idle ping, and the runtime's answer.
    let said = out(
        &mut t,
        &Frame::Ping(Heartbeat {
            id: Some("idle-1".into()),
            ts: None,
        }),
    );
    assert_eq!(said[0]["method"], "$/ping");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "idle-1", "result": {}}),
    );
    assert!(matches!(&got[0], Frame::Pong(Heartbeat { id: Some(id), .. }) if id == "idle-1"));
    for (method, check) in [
        ("provider.status", "state"),
        ("provider.capabilities", "capabilities"),
        ("shutdown", ""),
    ] {
        let got = inbound(
            &mut t,
            json!({"jsonrpc": "2.0", "id": method, "method": method}),
        );
        let said = pong(&mut t, &got[0]);
        assert_eq!(said[0]["id"], method);
        if !check.is_empty() {
            assert!(said[0]["result"].get(check).is_some(), "{said:?}");
        }
    }
}

#[test]
fn a_runtime_that_speaks_first_is_answered_with_the_descriptor() {
    let mut t = Translator::new();
    t.outbound(&hello());
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocol": "ya-environment-protocol.v1", "accepted_capabilities": ["fileops"]}}),
    );
    let Frame::Event(accepted) = &got[0] else {
        panic!()
    };
    assert_eq!(
        accepted.payload["accepted_capabilities"],
        json!(["fileops"])
    );
    let mut said = Vec::new();
    for frame in &got[1..] {
        said.extend(pong(&mut t, frame));
    }
    let answer = said.iter().find(|m| m["id"] == 1).unwrap();
    assert_eq!(
        answer["result"]["accepted_protocol"],
        "ya-environment-protocol.v1"
    );
    assert_eq!(answer["result"]["provider"]["provider_id"], "gw-test");
    assert_eq!(
        answer["result"]["capabilities"]["fileops"]["mounts"][0]["mount_id"],
        "main"
    );
    // Another protocol is refused.
    let mut t = Translator::new();
    t.outbound(&hello());
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocol": "ya-environment-protocol.v2"}}),
    );
    let said = pong(&mut t, &got[0]);
    assert_eq!(said[0]["error"]["data"]["name"], "unsupported_protocol");
}

#[test]
fn a_refused_initialize_ends_the_channel() {
    let mut t = Translator::new();
    t.outbound(&hello());
    let refused = t.inbound(br#"{"jsonrpc": "2.0", "id": "initialize", "error": {"code": -32040, "message": "not this provider"}}"#, MAX);
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("not this provider")
    );
}

#[test]
fn errors_carry_a_stable_number_and_the_spec_s_name() {
    let mut t = ready();
    inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "req_123", "method": "file.read", "params": {"mount_id": "main", "path": "../x"}}),
    );
    let body = ErrorBody::new(
        ErrorCode::PermissionDenied,
        "The path is outside the selected mount.",
    );
    let said = out(
        &mut t,
        &Frame::Response(Response::err(RequestId::new("req_123").unwrap(), body)),
    );
    // 02-protocol.md, "Error Codes".
    assert_eq!(said[0]["error"]["code"], -32040);
    assert_eq!(
        said[0]["error"]["message"],
        "The path is outside the selected mount."
    );
    assert_eq!(said[0]["error"]["data"]["name"], "permission_denied");
    assert_eq!(said[0]["error"]["data"]["recoverable"], true);
}

#[test]
fn events_keep_the_spec_s_names_and_watch_changes_are_mount_changes() {
    let mut t = ready();
    let said = out(
        &mut t,
        &Frame::Event(crate::frame::Event {
            event: "file.changed".into(),
            payload: json!({"watch": "w1", "root_id": "main", "path": "/workspace/main/a", "kind": "removed"}),
        }),
    );
    assert_eq!(said[0]["params"]["event"], "mount.changed");
    let p = &said[0]["params"]["payload"];
    assert_eq!(p["mount_id"], "main");
    assert_eq!(p["kind"], "deleted");
    assert_eq!(p["generation"], 0x2a77e2b6c1ff_u64);
    let said = out(
        &mut t,
        &Frame::Event(crate::frame::Event {
            event: "process.exited".into(),
            payload: json!({"process_id": "p1"}),
        }),
    );
    assert_eq!(
        said[0],
        json!({"jsonrpc": "2.0", "method": "$/event", "params": {"event": "process.exited", "payload": {"process_id": "p1"}}})
    );
    // A lost terminal is a lost shell session, by its session id.
    for (terminal, name, field) in [
        (false, "process.lost", "process_id"),
        (true, "shell_session.lost", "session_id"),
    ] {
        let said = out(
            &mut t,
            &Frame::Event(crate::frame::Event {
                event: "process.lost".into(),
                payload: json!({"process_id": "p2-aaaa", "terminal": terminal, "reason": "gateway_restarted"}),
            }),
        );
        assert_eq!(said[0]["params"]["event"], name, "{said:?}");
        assert_eq!(said[0]["params"]["payload"][field], "p2-aaaa", "{said:?}");
        assert_eq!(said[0]["params"]["payload"]["reason"], "gateway_restarted");
    }
}

#[test]
fn requests_to_the_runtime_and_their_answers() {
    let mut t = ready();
    let ask = crate::frame::Request {
        id: RequestId::new("gw-1").unwrap(),
        method: "artifact.reserve".into(),
        params: serde_json::Map::new(),
        context: None,
    };
    let said = out(&mut t, &Frame::Request(ask));
    assert_eq!(said[0]["method"], "artifact.reserve");
    assert_eq!(said[0]["id"], "gw-1");
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": "gw-1", "error": {"code": -32070, "message": "full", "data": {"name": "artifact_error"}}}),
    );
    let Frame::Response(response) = &got[0] else {
        panic!()
    };
    assert_eq!(
        response.error.as_ref().unwrap().code,
        ErrorCode::ArtifactError
    );
    // An answer to nothing asked is dropped.
    assert!(
        inbound(
            &mut t,
            json!({"jsonrpc": "2.0", "id": "gw-9", "result": {}})
        )
        .is_empty()
    );
}

#[test]
fn hostile_messages_never_panic() {
    let mut t = ready();
    for message in [
        &b""[..],
        b"null",
        b"\"x\"",
        b"{}",
        b"{\"jsonrpc\": \"2.0\"}",
        b"{\"jsonrpc\": \"2.0\", \"method\": 5}",
        b"{\"jsonrpc\": \"2.0\", \"id\": \"\", \"method\": \"file.read\"}",
        b"{\"jsonrpc\": \"2.0\", \"id\": \"x\", \"method\": \"BAD NAME\"}",
        b"{\"jsonrpc\": \"2.0\", \"id\": \"x\", \"method\": \"process.start\", \"params\": {\"command\": 5, \"cwd\": 7}}",
        b"{\"jsonrpc\": \"2.0\", \"id\": \"x\", \"method\": \"shell_session.open\", \"params\": {\"pty\": \"big\"}}",
        b"{\"jsonrpc\": \"2.0\", \"method\": \"$/cancelRequest\", \"params\": {\"id\": [1]}}",
        b"{\"jsonrpc\": \"2.0\", \"id\": null, \"result\": 1}",
    ] {
        let _ = t.inbound(message, MAX);
    }
    let long_id = "i".repeat(500);
    let got = inbound(
        &mut t,
        json!({"jsonrpc": "2.0", "id": long_id, "method": "file.stat", "params": {"mount_id": "main", "path": "a"}}),
    );
    let r = request(&got[0]);
    assert!(r.id.as_str().starts_with("rpc-"));
    let said = respond(&mut t, r.id.as_str(), json!({}));
    assert_eq!(said[0]["id"], json!("i".repeat(500)));
}

/// A sink that records what is written and when it is flushed.
#[derive(Default, Clone)]
struct Recorded(std::sync::Arc<std::sync::Mutex<(Vec<Vec<u8>>, usize)>>);

impl super::MessageSink for Recorded {
    async fn write(
        &mut self,
        message: &[u8],
        flush: bool,
    ) -> Result<(), crate::channel::ChannelError> {
        let mut seen = self.0.lock().unwrap();
        seen.0.push(message.to_vec());
        seen.1 += usize::from(flush);
        Ok(())
    }
    async fn flush(&mut self) -> Result<(), crate::channel::ChannelError> {
        self.0.lock().unwrap().1 += 1;
        Ok(())
    }
    async fn close(&mut self, _policy: bool, _reason: &str) {}
}

struct NoInput;

impl super::MessageSource for NoInput {
    async fn next(&mut self) -> Result<Vec<u8>, crate::channel::ChannelError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_flush_is_kept_when_the_frame_that_asks_for_it_says_nothing() {
    use crate::channel::RecordSink;
    let sink = Recorded::default();
    let (mut writer, _reader) = super::split(NoInput, sink.clone(), MAX);
    let mut record = vec![record::KIND_FRAME];
    record.extend_from_slice(&hello());
    writer.send(record, false).await.unwrap();
    assert_eq!(sink.0.lock().unwrap().0.len(), 1, "initialize written");
    assert_eq!(sink.0.lock().unwrap().1, 0, "not flushed yet");
    // An answer to nothing the runtime asked: no message, but the flush
    // the session asked for still happens, for what was queued before.
    let mut answer = vec![record::KIND_FRAME];
    crate::frame::encode_frame_json(
        &Frame::Response(Response::ok(RequestId::new("nobody").unwrap(), json!({}))),
        &mut answer,
    );
    writer.send(answer, true).await.unwrap();
    let seen = sink.0.lock().unwrap();
    assert_eq!(seen.0.len(), 1);
    assert_eq!(seen.1, 1);
}

#[test]
fn a_policy_change_is_told_in_the_profile_s_terms_with_mounts_offline_and_online() {
    let mut t = ready();
    let caps = json!({
        "fileops": {"enabled": true, "generation": "00000000000900000000",
                    "roots": [{"root_id": "main", "label": "main", "virtual_path": "/workspace/main", "mode": "ro", "follow_symlinks": false},
                              {"root_id": "data", "label": "data", "virtual_path": "/data", "mode": "rw", "follow_symlinks": false}]},
        "resources": {"enabled": true}
    });
    let said = out(
        &mut t,
        &Frame::Event(crate::frame::Event {
            event: "capability.updated".into(),
            payload: json!({"capability": "fileops", "state": "changed", "capabilities": caps}),
        }),
    );
    let events: Vec<&str> = said
        .iter()
        .map(|m| m["params"]["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["mount.offline", "mount.online", "capability.updated"]
    );
    assert_eq!(said[0]["params"]["payload"]["mount_id"], "docs");
    assert_eq!(said[1]["params"]["payload"]["mount_id"], "data");
    assert_eq!(said[1]["params"]["payload"]["generation"], 9);
    let updated = &said[2]["params"]["payload"];
    assert_eq!(updated["capability"], "fileops");
    let mounts = updated["capabilities"]["fileops"]["mounts"]
        .as_array()
        .unwrap();
    assert_eq!(mounts.len(), 2, "{updated}");
    assert_eq!(mounts[0]["mode"], "ro");
    // The shell was taken away: no target is offered any more, and
    // provider.capabilities says the same from now on.
    assert!(updated["capabilities"].get("shell").is_none(), "{updated}");
    assert_eq!(
        t.capabilities()["fileops"],
        updated["capabilities"]["fileops"]
    );
}

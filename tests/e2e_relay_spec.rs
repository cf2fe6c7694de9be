//! A runtime written from the relay spec (`../shared/specs/relay-0.74/`)
//! alone, apart from the Noise channel that carries its frames: its own
//! small client, JSON frames in and out, never a binary chunk. It runs a
//! command and reads its output from `stream` frames, reattaches to a
//! process exactly where it left off, and hands a file to runtime-owned
//! storage as an artifact.

mod common;

use std::time::Duration;

use common::{Gateway, key_b64};
use futures_util::{SinkExt, StreamExt};
use portcullis_crypto::{StaticKeypair, Transport};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// The spec's frames over the Noise channel: a record is a kind byte
/// (0x01, a frame) and the frame's JSON.
struct SpecClient {
    ws: WebSocketStream<TcpStream>,
    transport: Transport,
    hello: Value,
    /// A frame arriving in parts, so far.
    parts: Vec<u8>,
}

impl SpecClient {
    async fn connect(gw: &Gateway, identity: &StaticKeypair) -> Self {
        Self::connect_accepting(gw, identity, &["fileops", "shell"]).await
    }

    /// Connects, and accepts these of the capabilities the hello offers.
    async fn connect_accepting(gw: &Gateway, identity: &StaticKeypair, accepted: &[&str]) -> Self {
        // The Noise channel is portcullis's (the one part not from the
        // spec); its first record is the hello.
        let (ws, transport, hello) = gw.raw_with_hello(identity).await;
        assert_eq!(hello.first(), Some(&0x01), "the hello is a frame record");
        let mut client = Self {
            ws,
            transport,
            hello: serde_json::from_slice(&hello[1..]).unwrap(),
            parts: Vec::new(),
        };
        assert_spec_shape(&client.hello);
        assert_eq!(client.hello["type"], "hello", "{}", client.hello);
        assert_eq!(client.hello["protocol"], "ya-environment-relay.v1");
        // The spec's relay.accepted, as its example writes it.
        client
            .send(json!({
                "type": "event",
                "event": "relay.accepted",
                "payload": {
                    "connection_id": "relay_conn_123",
                    "accepted_capabilities": accepted,
                    "server_time": "2026-05-11T15:40:00Z"
                }
            }))
            .await;
        client
    }

    async fn send(&mut self, frame: Value) {
        let mut record = vec![0x01];
        record.extend(serde_json::to_vec(&frame).unwrap());
        self.send_record(&record).await;
    }

    async fn send_record(&mut self, record: &[u8]) {
        let sealed = self.transport.seal(record).unwrap();
        self.ws.send(Message::Binary(sealed.into())).await.unwrap();
    }

    /// The next frame (pings answered on the way).
    async fn recv(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.ws.next())
                .await
                .expect("a frame within 20 s");
            let Some(Ok(Message::Binary(sealed))) = message else {
                panic!("the connection ended: {message:?}")
            };
            let record = self.transport.open(&sealed).unwrap();
            // A frame larger than one record comes in parts (0x03, then
            // 0 or 1 for the last), joined here.
            let json = match record.first() {
                Some(0x01) => record[1..].to_vec(),
                Some(0x03) => {
                    self.parts.extend_from_slice(&record[2..]);
                    if record[1] == 0 {
                        continue;
                    }
                    std::mem::take(&mut self.parts)
                }
                other => panic!(
                    "record kind {other:?}: a binary chunk, which this client never asked for"
                ),
            };
            let frame: Value = serde_json::from_slice(&json).unwrap();
            assert_spec_shape(&frame);
            if frame["type"] == "ping" {
                self.send(json!({"type": "pong", "id": frame["id"], "ts": frame["ts"]}))
                    .await;
                continue;
            }
            return frame;
        }
    }

    /// Sends a request and collects its stream frames until the terminal
    /// response; also returns after `until` says so of a stream frame.
    async fn call(
        &mut self,
        id: &str,
        method: &str,
        params: Value,
        until: impl Fn(&[Value]) -> bool,
    ) -> (Vec<Value>, Option<Value>) {
        let request = json!({"type": "request", "id": id, "method": method, "params": params});
        self.send(request).await;
        let mut streams = Vec::new();
        loop {
            let frame = self.recv().await;
            if frame["id"] != id {
                continue;
            }
            match frame["type"].as_str() {
                Some("stream") => {
                    streams.push(frame);
                    if until(&streams) {
                        return (streams, None);
                    }
                }
                Some("response") => return (streams, Some(frame)),
                other => panic!("unexpected frame {other:?}: {frame}"),
            }
        }
    }
}

/// The error codes 02-protocol.md lists.
const SPEC_CODES: &[&str] = &[
    "invalid_request",
    "unknown_method",
    "capability_unavailable",
    "permission_denied",
    "approval_required",
    "policy_blocked",
    "not_found",
    "timeout",
    "cancelled",
    "provider_error",
    "relay_disconnected",
    "artifact_error",
];

/// Every frame the gateway sends has the shape 02-protocol.md gives its
/// type (fields beyond it are additions a spec client ignores).
fn assert_spec_shape(frame: &Value) {
    let string = |field: &str| frame[field].is_string();
    let ok = match frame["type"].as_str() {
        Some("hello") => {
            frame["protocol"] == "ya-environment-relay.v1" && frame["capabilities"].is_object()
        }
        Some("event") => string("event") && frame.get("payload").is_some(),
        Some("request") => string("id") && string("method") && frame["params"].is_object(),
        Some("response") => {
            string("id")
                && match (frame.get("result"), frame.get("error")) {
                    (Some(_), None) => true,
                    (None, Some(error)) => {
                        error["message"].is_string()
                            && SPEC_CODES.contains(&error["code"].as_str().unwrap_or(""))
                    }
                    _ => false,
                }
        }
        Some("stream") => {
            string("id")
                && string("event")
                && (!matches!(frame["event"].as_str(), Some("stdout" | "stderr")) || string("data"))
        }
        Some("cancel") => string("id"),
        Some("ping" | "pong") => true,
        _ => false,
    };
    assert!(ok, "not the spec's shape: {frame}");
    if frame["type"] == "event" && frame["event"] == "relay.error" {
        assert!(
            SPEC_CODES.contains(&frame["payload"]["code"].as_str().unwrap_or("")),
            "{frame}"
        );
    }
}

/// The output of `event` in these stream frames, decoded, checking that
/// each frame's `sequence` is where the output before it ends (counting
/// from `from`, both streams together).
fn output(frames: &[Value], from: u64) -> (Vec<u8>, Vec<u8>, u64) {
    use base64::Engine as _;
    let (mut out, mut err, mut at) = (Vec::new(), Vec::new(), from);
    for frame in frames {
        let event = frame["event"].as_str().unwrap();
        if event != "stdout" && event != "stderr" {
            continue;
        }
        let data = frame["data"].as_str().expect("output data is a string");
        let bytes = match frame["encoding"].as_str() {
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap(),
            None => data.as_bytes().to_vec(),
            Some(other) => panic!("encoding {other}"),
        };
        assert_eq!(frame["sequence"], at, "{frame}");
        at += bytes.len() as u64;
        match event {
            "stdout" => out.extend(bytes),
            _ => err.extend(bytes),
        }
    }
    (out, err, at)
}

fn setup() -> (Gateway, StaticKeypair) {
    setup_with("")
}

/// alice may read and write files, run a few programs and call `big`.
fn setup_with(limits: &str) -> (Gateway, StaticKeypair) {
    let alice = StaticKeypair::generate().unwrap();
    let policy = format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[grant]]
id = "alice"
principals = ["alice"]
fileops = {{ main = "rw" }}
shell = {{ commands = ["sh", "printf", "sleep", "cat", "head", "tr"], cwd_roots = ["main"], env_set = {{ PATH = "/usr/bin:/bin" }}, persist = true, approval = {{ "printf approve*" = "always_ask", "sleep 9*" = "block" }} }}
tools = {{ allow = ["big"] }}
artifacts = {{ mime_types = ["text/*", "application/octet-stream"], max_size = "8MiB", destinations = ["127.0.0.1:*"] }}
scripts = {{ runtime_tools = true, max_wall_time = "5s" }}

[[tool]]
name = "big"
description = "Prints 200 KB, returns 512 KiB."
input_schema = {{ type = "object" }}
risk = "low"
approval_policy = "allow"
script = "tools/big.rhai"
"#,
        alice = key_b64(&alice),
    );
    let gw = Gateway::start(&policy, limits);
    for dir in ["workspace", "tools"] {
        std::fs::create_dir_all(gw.dir.join(dir)).unwrap();
    }
    std::fs::write(
        gw.dir.join("tools/big.rhai"),
        "let s = \"x\"; while s.len() < 524288 { s += s; }\nprint(s.sub_string(0, 200000));\ns",
    )
    .unwrap();
    (gw, alice)
}

#[tokio::test]
async fn a_command_s_output_arrives_as_stream_frames() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    assert_eq!(client.hello["capabilities"]["shell"]["enabled"], true);
    // Text on both streams, a character the pipe may cut, and bytes that
    // are not UTF-8.
    let script = r"printf 'Running tests...\n'; printf 'warn\n' >&2; printf 'caf\303\251 \342\202\254\n'; printf 'bin\377\376\n'";
    let params = json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""});
    let (frames, response) = client
        .call("req_shell_1", "shell.start", params, |_| false)
        .await;
    let response = response.unwrap();
    assert_eq!(response["result"]["exit_code"], 0, "{response}");
    assert_eq!(frames[0]["event"], "started", "{frames:?}");
    let (out, err, end) = output(&frames, 0);
    assert_eq!(
        out,
        b"Running tests...\ncaf\xc3\xa9 \xe2\x82\xac\nbin\xff\xfe\n"
    );
    assert_eq!(err, b"warn\n");
    assert_eq!(
        end,
        response["result"]["stdout_bytes"].as_u64().unwrap()
            + response["result"]["stderr_bytes"].as_u64().unwrap()
    );
    // Text frames are text: only the frame with the bytes that are not
    // UTF-8 is base64.
    let base64: Vec<&Value> = frames
        .iter()
        .filter(|f| f["encoding"] == "base64")
        .collect();
    assert!(base64.len() <= 1, "{frames:?}");
    assert!(
        frames.iter().any(|f| f["event"] == "stdout"
            && f["encoding"].is_null()
            && f["data"]
                .as_str()
                .unwrap()
                .starts_with("Running tests...\n")),
        "{frames:?}"
    );
}

#[tokio::test]
async fn a_client_that_reattaches_resumes_at_the_next_byte() {
    let (gw, alice) = setup();
    let mut first = SpecClient::connect(&gw, &alice).await;
    // One line now; the rest once the first client is gone.
    let script = "printf 'one\\n'; sleep 1; printf 'two\\n'; printf 'three\\n' >&2; sleep 0.5";
    let params = json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""});
    let (frames, response) = first
        .call("start_1", "shell.start", params, |frames| {
            frames.iter().any(|f| f["event"] == "stdout")
        })
        .await;
    assert!(response.is_none());
    let process_id = frames[0]["data"]["process_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (out, _, resume_at) = output(&frames, 0);
    assert_eq!(out, b"one\n");
    drop(first);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut second = SpecClient::connect(&gw, &alice).await;
    let params = json!({"process_id": process_id, "from_seq": resume_at});
    let (frames, response) = second
        .call("attach_1", "shell.attach", params, |_| false)
        .await;
    let response = response.unwrap();
    assert!(response["result"].is_object(), "{response}");
    let attached = frames.iter().find(|f| f["event"] == "attached").unwrap();
    assert_eq!(attached["data"]["from_seq"], resume_at, "{attached}");
    let (out, err, _) = output(&frames, resume_at);
    assert_eq!(out, b"two\n");
    assert_eq!(err, b"three\n");
}

#[tokio::test]
async fn a_5_mib_exec_result_arrives_whole() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    assert_eq!(client.hello["max_frame"], 16 << 20, "{}", client.hello);
    let script = "head -c 5242880 /dev/zero | tr '\\0' y";
    let params = json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""});
    let (_, response) = client.call("exec_1", "shell.exec", params, |_| false).await;
    let result = &response.unwrap()["result"];
    assert_eq!(result["stdout_bytes"], 5 << 20);
    assert_eq!(result["stdout_truncated"], false);
    assert_eq!(result["stdout"].as_str().unwrap().len(), 5 << 20);
    assert!(
        result["stdout"]
            .as_str()
            .unwrap()
            .bytes()
            .all(|b| b == b'y')
    );
}

#[tokio::test]
async fn requests_and_results_larger_than_a_record_go_in_parts() {
    let (gw, alice) = setup();
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    // A 1 MiB inline write (the request in parts), read back inline.
    let content: String = (0..(1 << 20))
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let wrote = client
        .request(
            "file.write",
            json!({"root_id": "main", "path": "big.txt", "content": content}),
        )
        .await
        .unwrap();
    assert_eq!(wrote["size"], 1 << 20, "{wrote}");
    let read = client
        .request("file.read", json!({"root_id": "main", "path": "big.txt"}))
        .await
        .unwrap();
    assert_eq!(read["eof"], true);
    assert!(read["content"] == content.as_str(), "read back differs");
    // A tool that prints 200 KB and returns 512 KiB.
    let mut handle = client
        .start("tool.call", json!({"name": "big", "arguments": {}}))
        .await
        .unwrap();
    let mut printed = String::new();
    while let Some(item) = handle.next().await {
        if let portcullis_client::StreamItem::Stream { event, data } = item {
            assert_eq!(event, "stdout");
            printed.push_str(data.as_str().unwrap());
        }
    }
    let result = handle.response().await.unwrap();
    assert_eq!(printed.len(), 200_001);
    assert_eq!(result["value"].as_str().unwrap().len(), 524_288);
}

#[tokio::test]
async fn past_max_frame_a_result_is_refused_and_a_request_too() {
    let (gw, alice) = setup_with("[limits]\nmax_frame = \"128 KiB\"");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    assert_eq!(client.hello().max_frame, Some(128 << 10));
    // exec keeps what fits; a tool's result that does not is an error
    // that says which limit.
    let r = client
        .request(
            "shell.exec",
            json!({"command": ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' z"]}),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout_truncated"], true);
    assert!(r["stdout"].as_str().unwrap().len() < 64 << 10);
    let big = client
        .request("tool.call", json!({"name": "big", "arguments": {}}))
        .await
        .unwrap_err();
    assert!(big.to_string().contains("max_frame"), "{big}");
    // The client will not send what the gateway said it will not take.
    let content = "q".repeat(200_000);
    let refused = client
        .request(
            "file.write",
            json!({"root_id": "main", "path": "q.txt", "content": content}),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("131072"), "{refused}");

    // A peer that sends it anyway: dropped as it comes, reported once,
    // and the session goes on.
    let mut raw = SpecClient::connect(&gw, &alice).await;
    let frame = json!({"type": "request", "id": "huge", "method": "file.write",
        "params": {"root_id": "main", "path": "q.txt", "content": content}});
    let json = serde_json::to_vec(&frame).unwrap();
    let pieces: Vec<&[u8]> = json.chunks(60_000).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let mut record = vec![0x03, u8::from(i + 1 == pieces.len())];
        record.extend_from_slice(piece);
        raw.send_record(&record).await;
    }
    let error = raw.recv().await;
    assert_eq!(error["event"], "relay.error", "{error}");
    assert_eq!(error["payload"]["code"], "invalid_request");
    assert!(
        error["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("131072"),
        "{error}"
    );
    raw.send(json!({"type": "ping", "id": "still-there"})).await;
    let pong = raw.recv().await;
    assert_eq!(pong["type"], "pong");
    assert!(!gw.dir.join("workspace/q.txt").exists());
}

#[tokio::test]
async fn the_spec_s_file_read_example_is_answered_as_its_example_response() {
    let (gw, alice) = setup();
    std::fs::write(gw.dir.join("workspace/README.md"), "# Project\n...").unwrap();
    let mut client = SpecClient::connect(&gw, &alice).await;
    // 02-protocol.md, "Request", verbatim.
    client
        .send(json!({
            "type": "request",
            "id": "req_123",
            "method": "file.read",
            "params": {"root_id": "main", "path": "README.md", "encoding": "utf-8"},
            "context": {"session_id": "session_abc", "run_id": "run_def", "tool_call_id": "call_ghi"}
        }))
        .await;
    let response = client.recv().await;
    // 02-protocol.md, "Response": these fields, these values (portcullis
    // adds its own beside them).
    assert_eq!(response["type"], "response");
    assert_eq!(response["id"], "req_123");
    assert_eq!(response["result"]["content"], "# Project\n...");
    assert_eq!(response["result"]["encoding"], "utf-8");

    // Its audit entry carries the spec's RelayAuditEntry fields by their
    // names (04-security-and-policy.md), and the log is queried by them.
    let list = |filter: &[&str]| -> Vec<Value> {
        let mut args = vec!["audit", "list", "--json"];
        args.extend_from_slice(filter);
        let out = gw.cli_config(&args);
        assert!(out.status.success(), "{out:?}");
        // One entry per line.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let entries = list(&["--run", "run_def"]);
    let entry = entries
        .iter()
        .find(|e| e["kind"] == "request")
        .expect("the request's entry");
    let provider = client.hello["provider_id"].clone();
    let expected = json!({
        "id": "req_123",
        "connection_id": "relay_conn_123",
        "client_id": provider,
        "method": "file.read",
        "session_id": "session_abc",
        "run_id": "run_def",
        "tool_call_id": "call_ghi",
        "capability": "fileops",
        "policy_decision": "allowed",
        "status": "succeeded",
    });
    for (field, value) in expected.as_object().unwrap() {
        assert_eq!(&entry[field], value, "{field}: {entry}");
    }
    assert!(entry["started_at"].is_string() && entry["completed_at"].is_string());
    for filter in [
        ["--session", "session_abc"],
        ["--tool-call", "call_ghi"],
        ["--connection", "relay_conn_123"],
    ] {
        let found = list(&filter);
        assert!(
            found.iter().any(|e| e["id"] == "req_123"),
            "{filter:?}: {found:?}"
        );
    }
    assert!(list(&["--run", "another_run"]).is_empty());
}

/// The tool descriptor example of 03-environment.md.
fn spec_tool_descriptor() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/specs/relay-0.74/03-environment.md");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (the spec lives in ../shared)", path.display()));
    text.split("```json")
        .skip(1)
        .filter_map(|block| serde_json::from_str::<Value>(block.split("```").next()?).ok())
        .find(|value| value.get("input_schema").is_some())
        .expect("the spec's tool descriptor")
}

#[tokio::test]
async fn a_tool_descriptor_has_every_field_of_the_spec_s() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    client
        .send(json!({
            "type": "event",
            "event": "relay.accepted",
            "payload": {"accepted_capabilities": ["tools"]}
        }))
        .await;
    let (_, response) = client
        .call("list_1", "tool.list", json!({}), |_| false)
        .await;
    let response = response.unwrap();
    let tool = &response["result"]["tools"][0];
    assert_eq!(tool["name"], "big", "{response}");
    let spec = spec_tool_descriptor();
    for field in spec.as_object().unwrap().keys() {
        assert!(tool.get(field).is_some(), "`{field}` missing: {tool}");
    }
    assert_eq!(tool["capability"], "tools");
    assert_eq!(tool["approval_policy"], "allow");
}

#[tokio::test]
async fn a_process_reports_its_state_and_a_time_limit_is_the_timeout_code() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    let params = json!({"command": ["sh", "-c", "printf 'a\\n'; sleep 30"], "timeout_ms": 400});
    let (frames, response) = client
        .call("req_limit", "shell.start", params, |_| false)
        .await;
    let states: Vec<&Value> = frames
        .iter()
        .filter(|f| f["event"] == "status")
        .map(|f| &f["data"]["state"])
        .collect();
    assert_eq!(states, [&json!("running"), &json!("exited")], "{frames:?}");
    let exited = frames.iter().rfind(|f| f["event"] == "status").unwrap();
    assert_eq!(exited["data"]["ended_by"], "timeout", "{exited}");
    let error = &response.unwrap()["error"];
    assert_eq!(error["code"], "timeout", "{error}");
    assert_eq!(error["details"]["ended_by"], "timeout");
    assert_eq!(error["details"]["signal"], "SIGKILL");
}

#[tokio::test]
async fn file_access_alone_lists_and_disposes_its_watches_up_to_max_resources() {
    let (reader, capped) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let policy = format!(
        r#"
[[principal]]
id = "reader"
public_key = "{reader}"

[[principal]]
id = "capped"
public_key = "{capped}"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[grant]]
id = "reader"
principals = ["reader"]
fileops = {{ main = "ro" }}

[[grant]]
id = "capped"
principals = ["capped"]
fileops = {{ main = "ro" }}
resources = {{ max_resources = 2 }}
"#,
        reader = key_b64(&reader),
        capped = key_b64(&capped),
    );
    let gw = Gateway::start(&policy, "");
    std::fs::create_dir_all(gw.dir.join("workspace")).unwrap();
    let watch = json!({"root_id": "main", "path": ""});

    // Only file access: the watch it makes, it may list and dispose of.
    let client = gw.connect(&reader).await.unwrap();
    assert!(client.offered().contains(&"resources".to_string()));
    client.accept_all().await.unwrap();
    let made = client.request("file.watch", watch.clone()).await.unwrap();
    let id = made["watch"].as_str().unwrap().to_string();
    let listed = client.request("resource.list", json!({})).await.unwrap();
    assert!(listed.to_string().contains(&id), "{listed}");
    client
        .request("resource.dispose", json!({"id": id}))
        .await
        .unwrap();

    // max_resources holds: a third watch is refused, naming the limit.
    let client = gw.connect(&capped).await.unwrap();
    client.accept_all().await.unwrap();
    for _ in 0..2 {
        client.request("file.watch", watch.clone()).await.unwrap();
    }
    let Err(portcullis_client::ClientError::Remote(e)) =
        client.request("file.watch", watch.clone()).await
    else {
        panic!("a third watch past max_resources = 2")
    };
    assert_eq!(e.code, portcullis_wire::frame::ErrorCode::PolicyBlocked);
    assert!(e.message.contains("max_resources (2)"), "{}", e.message);
}

#[tokio::test]
async fn a_long_transfer_reports_its_progress() {
    let (gw, alice) = setup();
    let file = gw.dir.join("workspace/large.bin");
    std::fs::write(&file, vec![7u8; 48 << 20]).unwrap();
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    let params = json!({"root_id": "main", "path": "large.bin", "stream": true});
    let mut handle = client.start("file.read", params).await.unwrap();
    // A reader that stops for longer than a progress interval after its
    // first chunk: the gateway, held up by the full pipe (the file is far
    // larger than the buffers between), sends the rest after it.
    let (mut received, mut reports) = (0u64, Vec::new());
    while let Some(item) = handle.next().await {
        match item {
            portcullis_client::StreamItem::Chunk { data, .. } => {
                if received == 0 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                received += data.len() as u64;
            }
            portcullis_client::StreamItem::Stream { event, data } => {
                assert_eq!(event, "progress");
                reports.push(data);
            }
        }
    }
    assert_eq!(handle.response().await.unwrap()["length"], 48 << 20);
    assert_eq!(received, 48 << 20);
    assert!(!reports.is_empty(), "no progress in {received} bytes");
    let sent: Vec<u64> = reports
        .iter()
        .map(|r| r["bytes_sent"].as_u64().unwrap())
        .collect();
    assert!(sent.windows(2).all(|w| w[0] < w[1]), "{sent:?}");
    assert!(reports.iter().all(|r| r["bytes_total"] == 48 << 20));
}

/// The runtime's storage: a plain HTTP server on 127.0.0.1 that takes
/// uploads, answering each with `status`; what it received comes back on
/// the channel (request head, body).
async fn storage(status: &'static str) -> (String, tokio::sync::mpsc::Receiver<(String, Vec<u8>)>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        // Bounded: a test makes at most a few uploads.
        for _ in 0..4 {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut seen = Vec::new();
            let mut buffer = [0u8; 65536];
            let head_end = loop {
                let n = socket.read(&mut buffer).await.unwrap();
                assert!(n > 0, "the upload ended inside its head");
                seen.extend_from_slice(&buffer[..n]);
                if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
            };
            let head = String::from_utf8_lossy(&seen[..head_end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a Content-Length");
            let mut body = seen[head_end..].to_vec();
            // A redirect is answered before the body is read.
            if !status.starts_with('3') {
                while body.len() < length {
                    let n = socket.read(&mut buffer).await.unwrap();
                    assert!(n > 0, "the upload ended early");
                    body.extend_from_slice(&buffer[..n]);
                }
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\nLocation: http://elsewhere.invalid/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
            let _ = tx.send((head, body)).await;
        }
    });
    (format!("http://{address}"), rx)
}

/// Plays the runtime's side of artifact coordination (02-protocol.md,
/// "Artifact Coordination") until request `id` is answered: reserves with
/// an upload URL under `storage` and a bearer header, records what the
/// gateway asked, and completes. Returns the gateway's requests, the
/// request's stream frames, the events and its response.
async fn serve_artifacts(
    client: &mut SpecClient,
    id: &str,
    storage: &str,
) -> (Vec<Value>, Vec<Value>, Vec<Value>, Value) {
    let (mut asked, mut streams, mut events) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let frame = client.recv().await;
        match frame["type"].as_str() {
            Some("request") => {
                let result = match frame["method"].as_str() {
                    Some("artifact.reserve") => json!({
                        "artifact_id": "art_123",
                        "upload_url": format!("{storage}/upload/art_123?sig=s3cr3t"),
                        "headers": {"Authorization": "Bearer upload-token"}
                    }),
                    Some("artifact.complete" | "artifact.abort") => json!({}),
                    other => panic!("the gateway asked {other:?}"),
                };
                client
                    .send(json!({"type": "response", "id": frame["id"], "result": result}))
                    .await;
                asked.push(frame);
            }
            Some("stream") if frame["id"] == id => streams.push(frame),
            Some("event") => events.push(frame),
            Some("response") if frame["id"] == id => return (asked, streams, events, frame),
            _ => panic!("unexpected frame {frame}"),
        }
    }
}

#[tokio::test]
async fn a_file_goes_to_runtime_storage_as_an_artifact() {
    use sha2::Digest as _;
    let (gw, alice) = setup();
    let content: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(gw.dir.join("workspace/build.log"), &content).unwrap();
    let (storage, mut uploads) = storage("201 Created").await;
    let mut client = SpecClient::connect_accepting(&gw, &alice, &["fileops", "artifacts"]).await;
    assert_eq!(client.hello["capabilities"]["artifacts"]["enabled"], true);
    client
        .send(json!({
            "type": "request", "id": "req_art", "method": "file.read",
            "params": {"root_id": "main", "path": "build.log",
                       "artifact": {"kind": "log", "mime_type": "text/plain", "metadata": {"step": "build"}}},
            "context": {"run_id": "run_123"}
        }))
        .await;
    let (asked, streams, events, response) =
        serve_artifacts(&mut client, "req_art", &storage).await;
    let sha256 = hex::encode(sha2::Sha256::digest(&content));

    // reserve, as the spec's example, then complete with size and hash.
    let methods: Vec<&str> = asked
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["artifact.reserve", "artifact.complete"],
        "{asked:?}"
    );
    let reserve = &asked[0]["params"];
    assert_eq!(reserve["run_id"], "run_123");
    assert_eq!(reserve["kind"], "log");
    assert_eq!(reserve["mime_type"], "text/plain");
    assert_eq!(reserve["metadata"]["step"], "build");
    assert_eq!(reserve["metadata"]["path"], "/workspace/main/build.log");
    let complete = &asked[1]["params"];
    assert_eq!(complete["artifact_id"], "art_123");
    assert_eq!(complete["size_bytes"], content.len());
    assert_eq!(complete["sha256"], sha256);

    // The bytes went to the URL the runtime gave, with its header.
    let (head, body) = uploads.recv().await.unwrap();
    assert!(
        head.starts_with("PUT /upload/art_123?sig=s3cr3t HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("authorization: Bearer upload-token\r\n"),
        "{head}"
    );
    assert!(head.contains("content-type: text/plain\r\n"), "{head}");
    assert!(
        body == content,
        "the upload differs from the file ({} bytes)",
        body.len()
    );

    // The answer, the `artifact` stream frame and `artifact.uploaded`.
    let artifact = &response["result"]["artifact"];
    assert_eq!(artifact["artifact_id"], "art_123");
    assert_eq!(artifact["sha256"], sha256);
    assert_eq!(artifact["size_bytes"], content.len());
    assert!(response["result"].get("content").is_none(), "{response}");
    assert!(
        streams
            .iter()
            .any(|s| s["event"] == "artifact" && s["data"]["artifact_id"] == "art_123"),
        "{streams:?}"
    );
    let uploaded = events
        .iter()
        .find(|e| e["event"] == "artifact.uploaded")
        .expect("artifact.uploaded");
    assert_eq!(uploaded["payload"]["run_id"], "run_123");
    assert_eq!(uploaded["payload"]["request_id"], "req_art");

    // Audited: each request to the runtime, and the upload's intent before
    // it and its outcome after, naming the file.read; never the URL's
    // path, query or header.
    let mut entries = gw.audit_entries();
    entries.sort_by_key(|e| e.seq);
    let to_runtime: Vec<_> = entries
        .iter()
        .filter(|e| e.record.kind == portcullis_store::Kind::ToRuntime)
        .collect();
    assert_eq!(to_runtime.len(), 2, "{to_runtime:?}");
    for e in &to_runtime {
        assert_eq!(e.record.parent_request_id.as_deref(), Some("req_art"));
        assert_eq!(e.record.status, Some(portcullis_store::Status::Succeeded));
        assert_eq!(e.record.capability.as_deref(), Some("artifacts"));
    }
    let upload: Vec<_> = entries
        .iter()
        .filter(|e| e.record.method.as_deref() == Some("artifact.upload"))
        .collect();
    assert_eq!(upload.len(), 2, "a start entry and its outcome: {upload:?}");
    assert_eq!(upload[0].record.kind, portcullis_store::Kind::RequestStart);
    assert_eq!(upload[1].record.start_seq, Some(upload[0].seq));
    assert!(
        upload[0].seq < to_runtime[1].seq,
        "the intent is written before complete is asked"
    );
    assert_eq!(upload[1].record.bytes_out, content.len() as u64);
    assert_eq!(
        upload[1].record.destination.as_deref(),
        Some(storage.as_str())
    );
    let all = format!("{entries:?}");
    assert!(
        !all.contains("s3cr3t") && !all.contains("upload-token"),
        "a secret of the runtime's was logged"
    );
}

/// `file.read` of `path` as an artifact, the runtime's side played by
/// [`serve_artifacts`] with `storage`: the methods the gateway asked of
/// the runtime, checked to be `asked`, and the error the read ended with,
/// checked to be `code` and to say `says`.
async fn refused_artifact(
    client: &mut SpecClient,
    (id, path, storage): (&str, &str, &str),
    asked: &[&str],
    (code, says): (&str, &str),
) {
    client
        .send(json!({"type": "request", "id": id, "method": "file.read",
                     "params": {"root_id": "main", "path": path, "artifact": true}}))
        .await;
    let (requests, _, _, response) = serve_artifacts(client, id, storage).await;
    let methods: Vec<&str> = requests
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, asked, "{requests:?}");
    assert_eq!(response["error"]["code"], code, "{response}");
    let message = response["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{response}");
}

#[tokio::test]
async fn an_artifact_outside_the_grant_or_redirected_is_refused() {
    let (gw, alice) = setup();
    std::fs::write(gw.dir.join("workspace/shot.png"), b"not really a png").unwrap();
    std::fs::write(gw.dir.join("workspace/notes.txt"), b"notes").unwrap();
    let (storage, mut uploads) = storage("302 Found").await;
    let mut client = SpecClient::connect_accepting(&gw, &alice, &["fileops", "artifacts"]).await;
    let reserved_then_aborted = ["artifact.reserve", "artifact.abort"];

    // image/png is not among the grant's types: refused before the
    // runtime is asked anything.
    let png = ("png", "shot.png", storage.as_str());
    refused_artifact(&mut client, png, &[], ("permission_denied", "image/png")).await;

    // The storage redirects: not followed; the artifact is aborted.
    let txt = ("txt", "notes.txt", storage.as_str());
    let redirect = ("artifact_error", "redirects are not followed");
    refused_artifact(&mut client, txt, &reserved_then_aborted, redirect).await;
    let (head, _) = uploads.recv().await.unwrap();
    assert!(head.starts_with("PUT /upload/art_123"), "{head}");
    assert!(uploads.try_recv().is_err(), "the redirect was followed");

    // An upload URL outside the grant's destinations (127.0.0.2 is not
    // 127.0.0.1): refused before a byte leaves, and the artifact aborted.
    let elsewhere = storage.replace("127.0.0.1", "127.0.0.2");
    let far = ("far", "notes.txt", elsewhere.as_str());
    let unlisted = ("permission_denied", "artifacts.destinations");
    refused_artifact(&mut client, far, &reserved_then_aborted, unlisted).await;
    assert!(
        uploads.try_recv().is_err(),
        "bytes went to an unlisted destination"
    );

    // A runtime that did not accept `artifacts` is never asked.
    let mut plain = SpecClient::connect(&gw, &alice).await;
    let no = ("no", "notes.txt", storage.as_str());
    refused_artifact(&mut plain, no, &[], ("capability_unavailable", "")).await;
}

#[tokio::test]
async fn a_script_reaches_a_tool_the_runtime_holds() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect_accepting(&gw, &alice, &["scripts", "tools"]).await;
    // `weather` is the runtime's; `big` the gateway's.
    let source = r#"
        let w = call_tool("weather", #{city: "Oslo"});
        let missing = "called";
        try { call_tool("nowhere"); } catch (e) { missing = e.code; }
        let big = call_tool("big");
        w.forecast + " " + missing + " " + big.len()
    "#;
    client
        .send(json!({"type": "request", "id": "s1", "method": "script.run", "params": {"source": source}}))
        .await;
    let mut asked = Vec::new();
    let response = loop {
        let frame = client.recv().await;
        match (frame["type"].as_str(), frame["method"].as_str()) {
            (Some("request"), Some("tool.call")) => {
                let answer = match frame["params"]["name"].as_str() {
                    Some("weather") => {
                        json!({"type": "response", "id": frame["id"], "result": {"forecast": "rain"}})
                    }
                    _ => json!({"type": "response", "id": frame["id"],
                                "error": {"code": "not_found", "message": "no such tool"}}),
                };
                client.send(answer).await;
                asked.push(frame);
            }
            (Some("response"), _) if frame["id"] == "s1" => break frame,
            _ => {}
        }
    };
    assert_eq!(
        response["result"]["value"], "rain not_found 524288",
        "{response}"
    );
    let names: Vec<&str> = asked
        .iter()
        .map(|f| f["params"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["weather", "nowhere"],
        "the gateway's own tool stays here"
    );
    assert_eq!(asked[0]["params"]["arguments"], json!({"city": "Oslo"}));

    // Audited as the script's own requests.
    let entries = gw.audit_entries();
    let to_runtime: Vec<_> = entries
        .iter()
        .filter(|e| e.record.kind == portcullis_store::Kind::ToRuntime)
        .collect();
    assert_eq!(to_runtime.len(), 2, "{to_runtime:?}");
    assert!(
        to_runtime
            .iter()
            .all(|e| e.record.parent_request_id.as_deref() == Some("s1")
                && e.record.method.as_deref() == Some("tool.call"))
    );
    assert!(
        to_runtime
            .iter()
            .any(|e| e.record.error_code.as_deref() == Some("not_found"))
    );

    // A runtime that does not answer holds the script no longer than its
    // deadline, and is told to cancel.
    client
        .send(json!({"type": "request", "id": "s2", "method": "script.run",
                     "params": {"source": "call_tool(\"slow\")", "limits": {"max_wall_time_ms": 1000}}}))
        .await;
    let (mut cancelled, started) = (false, std::time::Instant::now());
    let response = loop {
        let frame = client.recv().await;
        match frame["type"].as_str() {
            Some("cancel") => cancelled = true,
            Some("response") if frame["id"] == "s2" => break frame,
            _ => {}
        }
    };
    assert!(cancelled, "the gateway sent no cancel for its tool.call");
    assert!(response["error"].is_object(), "{response}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_command_the_grant_asks_about_waits_for_the_operator_visibly() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    let params = json!({"command": ["printf", "approve-me"], "root_id": "main", "cwd": ""});
    let (parked, _) = client
        .call("ask_1", "shell.exec", params.clone(), |s| !s.is_empty())
        .await;
    // The runtime sees what waits, bound to the exact arguments.
    let status = &parked[0];
    assert_eq!(status["event"], "status", "{status}");
    let view = &status["data"];
    assert_eq!(view["state"], "awaiting_approval", "{view}");
    assert_eq!(view["method"], "shell.exec");
    assert_eq!(view["command"], "printf approve-me");
    assert_eq!(view["approval_policy"], "always_ask");
    assert_eq!(view["arguments_sha256"].as_str().unwrap().len(), 64);

    // The operator sees the command and approves it.
    let listed = gw.cli(&["approvals", "list", "--json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let pending = &listed["approvals"][0];
    assert_eq!(pending["command"], "printf approve-me", "{listed}");
    assert_eq!(
        pending["arguments"]["command"],
        json!(["printf", "approve-me"])
    );
    let id = pending["id"].to_string();
    assert!(gw.cli(&["approvals", "approve", &id]).status.success());
    let response = loop {
        let frame = client.recv().await;
        if frame["type"] == "response" && frame["id"] == "ask_1" {
            break frame;
        }
    };
    assert_eq!(response["result"]["exit_code"], 0, "{response}");
    assert_eq!(response["result"]["stdout"], "approve-me");
    let entries = gw.audit_entries();
    let entry = entries
        .iter()
        .find(|e| e.record.request_id.as_deref() == Some("ask_1") && e.record.status.is_some())
        .expect("the command's entry");
    assert_eq!(
        entry.record.policy_decision,
        Some(portcullis_store::Decision::Approved)
    );
    assert!(
        entry
            .record
            .rule
            .as_deref()
            .unwrap()
            .contains("printf approve*"),
        "{entry:?}"
    );

    // always_ask: the same command asks again (and is denied this time);
    // another command is not asked about; a blocked one never runs.
    let (parked, _) = client
        .call("ask_2", "shell.exec", params, |s| !s.is_empty())
        .await;
    assert_eq!(parked[0]["data"]["state"], "awaiting_approval");
    let listed: Value =
        serde_json::from_slice(&gw.cli(&["approvals", "list", "--json"]).stdout).unwrap();
    let id = listed["approvals"][0]["id"].to_string();
    assert!(gw.cli(&["approvals", "deny", &id]).status.success());
    let response = loop {
        let frame = client.recv().await;
        if frame["type"] == "response" && frame["id"] == "ask_2" {
            break frame;
        }
    };
    assert_eq!(response["error"]["code"], "approval_required", "{response}");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("command `printf approve-me`")
    );
    let free = json!({"command": ["printf", "free"], "root_id": "main", "cwd": ""});
    let (_, response) = client.call("free", "shell.exec", free, |_| false).await;
    assert_eq!(response.unwrap()["result"]["stdout"], "free");
    let blocked = json!({"command": ["sleep", "99"], "root_id": "main", "cwd": ""});
    let (_, response) = client
        .call("blocked", "shell.exec", blocked, |_| false)
        .await;
    let response = response.unwrap();
    assert_eq!(response["error"]["code"], "policy_blocked", "{response}");
}

/// A frame's JSON as part records of at most 60,000 bytes each.
fn in_parts(frame: &Value) -> Vec<Vec<u8>> {
    let json = serde_json::to_vec(frame).unwrap();
    let pieces: Vec<&[u8]> = json.chunks(60_000).collect();
    pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            let mut record = vec![0x03, u8::from(i + 1 == pieces.len())];
            record.extend_from_slice(piece);
            record
        })
        .collect()
}

#[tokio::test]
async fn frames_in_parts_share_one_bound_across_sessions() {
    let (gw, alice) =
        setup_with("[limits]\nmax_frame = \"1 MiB\"\nmax_frames_in_parts = \"1 MiB\"");
    let write = |id: &str, path: &str| {
        json!({"type": "request", "id": id, "method": "file.write",
               "params": {"root_id": "main", "path": path, "content": "w".repeat(700_000)}})
    };
    // One session holds most of the bound with a frame not yet whole.
    let mut first = SpecClient::connect(&gw, &alice).await;
    let first_parts = in_parts(&write("w1", "one.txt"));
    let (last, held) = first_parts.split_last().unwrap();
    for record in held {
        first.send_record(record).await;
    }
    first.send(json!({"type": "ping", "id": "sync"})).await;
    assert_eq!(first.recv().await["type"], "pong");

    // Another's frame, within its own max_frame, does not fit beside it:
    // refused as the gateway's shortage, and the session goes on.
    let mut second = SpecClient::connect(&gw, &alice).await;
    for record in in_parts(&write("w2", "two.txt")) {
        second.send_record(&record).await;
    }
    let error = second.recv().await;
    assert_eq!(error["event"], "relay.error", "{error}");
    assert_eq!(error["payload"]["code"], "provider_error", "{error}");
    assert!(
        error["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("1048576"),
        "{error}"
    );
    assert!(!gw.dir.join("workspace/two.txt").exists());

    // The first frame completes; once it is whole the room is back.
    first.send_record(last).await;
    let done = first.recv().await;
    assert_eq!(
        (done["id"].as_str(), done["result"].is_object()),
        (Some("w1"), true),
        "{done}"
    );
    for record in in_parts(&write("w3", "three.txt")) {
        second.send_record(&record).await;
    }
    let done = second.recv().await;
    assert_eq!(
        (done["id"].as_str(), done["result"].is_object()),
        (Some("w3"), true),
        "{done}"
    );

    // A session that leaves with a frame half sent gives its room back.
    let mut leaving = SpecClient::connect(&gw, &alice).await;
    for record in &in_parts(&write("w4", "four.txt"))[..5] {
        leaving.send_record(record).await;
    }
    leaving.send(json!({"type": "ping", "id": "sync"})).await;
    assert_eq!(leaving.recv().await["type"], "pong");
    drop(leaving);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        for record in in_parts(&write("w5", "five.txt")) {
            second.send_record(&record).await;
        }
        let answer = second.recv().await;
        if answer["id"] == "w5" {
            assert!(answer["result"].is_object(), "{answer}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the room never came back: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn resources_are_created_exported_and_restored_in_another_session() {
    let (gw, alice) = setup();
    std::fs::create_dir_all(gw.dir.join("workspace/src")).unwrap();
    let mut client =
        SpecClient::connect_accepting(&gw, &alice, &["fileops", "shell", "resources"]).await;
    let (_, made) = client
        .call(
            "c1",
            "resource.create",
            json!({"kind": "watch", "params": {"root_id": "main", "path": "src"}}),
            |_| false,
        )
        .await;
    let made = made.unwrap();
    let watch = made["result"]["id"]
        .as_str()
        .expect("a watch id")
        .to_string();
    assert_eq!(made["result"]["kind"], "watch", "{made}");
    let (_, refused) = client
        .call(
            "c2",
            "resource.create",
            json!({"kind": "process", "params": {}}),
            |_| false,
        )
        .await;
    assert_eq!(refused.unwrap()["error"]["code"], "invalid_request");
    // A persistent process that will still run, and one that exits.
    let start = |cmd: &[&str]| json!({"command": cmd, "root_id": "main", "cwd": ""});
    let (_, long) = client
        .call("p1", "shell.start", start(&["sleep", "30"]), |s| {
            !s.is_empty()
        })
        .await;
    assert!(long.is_none());
    let (_, short) = client
        .call("p2", "shell.start", start(&["printf", "x"]), |_| false)
        .await;
    assert!(
        short.unwrap()["result"].is_object(),
        "printf ran to its end"
    );
    let (_, exported) = client
        .call("e1", "resource.export_state", json!({}), |_| false)
        .await;
    let state = exported.unwrap()["result"]["state"].clone();
    let kinds: Vec<&str> = state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "watch").count(),
        1,
        "{state}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "process").count(),
        2,
        "{state}"
    );
    let processes: Vec<Value> = state["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "process")
        .cloned()
        .collect();
    let running = processes
        .iter()
        .find(|p| p["state"] == "running")
        .expect("sleep runs")["id"]
        .clone();
    drop(client);

    // Another session restores it: the watch made again (a new entry of
    // its own), the running process kept, the exited one reported lost.
    let mut again =
        SpecClient::connect_accepting(&gw, &alice, &["fileops", "shell", "resources"]).await;
    let (_, restored) = again
        .call(
            "r1",
            "resource.restore_state",
            json!({"state": state}),
            |_| false,
        )
        .await;
    let result = restored.unwrap()["result"].clone();
    let restored_list = result["restored"].as_array().unwrap();
    let watch_again = restored_list
        .iter()
        .find(|r| r["kind"] == "watch")
        .expect("the watch, again");
    assert_eq!(watch_again["previous_id"], watch.as_str());
    assert!(
        restored_list
            .iter()
            .any(|r| r["kind"] == "process" && r["id"] == running && r["kept"] == true),
        "{result}"
    );
    let lost = result["lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{result}");
    assert!(
        lost[0]["reason"]
            .as_str()
            .unwrap()
            .contains("not restarted"),
        "{result}"
    );
    // The watch works: a change in src is announced to this session.
    std::fs::write(gw.dir.join("workspace/src/new.txt"), "x").unwrap();
    loop {
        let frame = again.recv().await;
        if frame["type"] == "event" && frame["event"] == "file.changed" {
            break;
        }
    }
    // Each watch made through file.watch, audited as the call's own.
    let entries = gw.audit_entries();
    for parent in ["c1", "r1"] {
        assert!(
            entries
                .iter()
                .any(|e| e.record.method.as_deref() == Some("file.watch")
                    && e.record.parent_request_id.as_deref() == Some(parent)),
            "no file.watch entry under {parent}"
        );
    }
    // A state that is not one is refused.
    let (_, bad) = again
        .call(
            "r2",
            "resource.restore_state",
            json!({"state": {"version": 9}}),
            |_| false,
        )
        .await;
    assert_eq!(bad.unwrap()["error"]["code"], "invalid_request");
}

#[tokio::test]
async fn an_exec_s_stdin_streams_as_chunks_on_channel_3() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    let params = json!({"command": ["cat"], "root_id": "main", "cwd": "", "stdin_stream": true});
    client
        .send(json!({"type": "request", "id": "in_1", "method": "shell.exec", "params": params}))
        .await;
    // A chunk record (docs/PROTOCOL.md §3): kind 0x02, the id's length
    // and the id, the channel, the data; an empty chunk ends the input.
    let chunk = |data: &[u8]| {
        let mut record = vec![0x02, 0, 4];
        record.extend_from_slice(b"in_1");
        record.push(3);
        record.extend_from_slice(data);
        record
    };
    let big = vec![b'z'; 200_000];
    client.send_record(&chunk(b"hello ")).await;
    for piece in big.chunks(60_000) {
        client.send_record(&chunk(piece)).await;
    }
    client.send_record(&chunk(b" world")).await;
    client.send_record(&chunk(b"")).await;
    let response = loop {
        let frame = client.recv().await;
        assert_ne!(frame["event"], "relay.error", "{frame}");
        if frame["type"] == "response" && frame["id"] == "in_1" {
            break frame;
        }
    };
    let stdout = response["result"]["stdout"]
        .as_str()
        .expect("stdout")
        .to_string();
    assert_eq!(stdout.len(), 6 + 200_000 + 6, "{response:.300}");
    assert!(stdout.starts_with("hello zzz") && stdout.ends_with("zzz world"));
    // Both at once is a mistake the gateway names.
    let both = json!({"command": ["cat"], "stdin": "x", "stdin_stream": true});
    let (_, refused) = client.call("in_2", "shell.exec", both, |_| false).await;
    let refused = refused.unwrap();
    assert_eq!(refused["error"]["code"], "invalid_request", "{refused}");
}

#[tokio::test]
async fn tools_the_runtime_registers_are_the_ones_a_script_asks_it_for() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect_accepting(&gw, &alice, &["scripts", "tools"]).await;
    let tool = json!({"name": "weather", "description": "Forecast.",
                      "input_schema": {"type": "object"}});
    let (_, registered) = client
        .call("reg", "tool.register", json!({"tool": tool}), |_| false)
        .await;
    assert_eq!(registered.unwrap()["result"]["registered"], true);
    let (_, bad) = client
        .call(
            "bad",
            "tool.register",
            json!({"tool": {"name": "no spaces"}}),
            |_| false,
        )
        .await;
    assert_eq!(bad.unwrap()["error"]["code"], "invalid_request");

    // Registered: `weather` goes to the runtime; `nowhere` is not asked.
    let source = r#"
        let missing = "called";
        try { call_tool("nowhere"); } catch (e) { missing = e.code; }
        call_tool("weather", #{}).forecast + " " + missing
    "#;
    client
        .send(json!({"type": "request", "id": "s1", "method": "script.run", "params": {"source": source}}))
        .await;
    let mut asked = Vec::new();
    let response = loop {
        let frame = client.recv().await;
        if frame["type"] == "request" {
            asked.push(frame["params"]["name"].clone());
            client
                .send(json!({"type": "response", "id": frame["id"], "result": {"forecast": "sun"}}))
                .await;
        } else if frame["type"] == "response" && frame["id"] == "s1" {
            break frame;
        }
    };
    assert_eq!(response["result"]["value"], "sun not_found", "{response}");
    assert_eq!(asked, [json!("weather")]);

    let (_, gone) = client
        .call(
            "unreg",
            "tool.unregister",
            json!({"name": "weather"}),
            |_| false,
        )
        .await;
    assert_eq!(gone.unwrap()["result"]["unregistered"], true);
    let (_, again) = client
        .call(
            "unreg2",
            "tool.unregister",
            json!({"name": "weather"}),
            |_| false,
        )
        .await;
    assert_eq!(again.unwrap()["error"]["code"], "not_found");
}

#[tokio::test]
async fn exec_output_past_the_inline_cap_goes_to_an_artifact_when_asked() {
    use sha2::Digest as _;
    let (gw, alice) = setup_with("[limits]\nmax_frame = \"1 MiB\"");
    let (storage, mut uploads) = storage("200 OK").await;
    let mut client =
        SpecClient::connect_accepting(&gw, &alice, &["fileops", "shell", "artifacts"]).await;
    let script = "head -c 900000 /dev/zero | tr '\\0' a; printf small >&2";
    client
        .send(json!({"type": "request", "id": "x1", "method": "shell.exec",
                     "params": {"command": ["sh", "-c", script], "root_id": "main", "cwd": "", "artifact": true}}))
        .await;
    let (asked, _, _, response) = serve_artifacts(&mut client, "x1", &storage).await;
    let result = &response["result"];
    // Inline, as much as fits; the whole of stdout as an artifact; stderr
    // fits, so it has none.
    assert_eq!(
        result["stdout_truncated"],
        true,
        "{:.300}",
        response.to_string()
    );
    assert_eq!(result["stdout_bytes"], 900_000);
    let artifact = &result["stdout_artifact"];
    assert_eq!(artifact["size_bytes"], 900_000, "{artifact}");
    assert_eq!(artifact["kind"], "stdout");
    assert_eq!(artifact["mime_type"], "text/plain; charset=utf-8");
    assert!(result.get("stderr_artifact").is_none());
    assert_eq!(result["stderr"], "small");
    let (_, body) = uploads.recv().await.unwrap();
    assert_eq!(body.len(), 900_000);
    assert!(body.iter().all(|&b| b == b'a'));
    assert_eq!(artifact["sha256"], hex::encode(sha2::Sha256::digest(&body)));
    let methods: Vec<&str> = asked
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, ["artifact.reserve", "artifact.complete"]);
    assert_eq!(asked[0]["params"]["metadata"]["source"], "shell.exec");
}

#[tokio::test]
async fn a_process_that_exits_is_an_updated_resource() {
    let (gw, alice) = setup();
    let mut client = SpecClient::connect(&gw, &alice).await;
    let params = json!({"command": ["printf", "done"], "root_id": "main", "cwd": ""});
    client
        .send(json!({"type": "request", "id": "p1", "method": "shell.start", "params": params}))
        .await;
    let mut process_id = Value::Null;
    let updated = loop {
        let frame = client.recv().await;
        if frame["type"] == "stream" && frame["event"] == "started" {
            process_id = frame["data"]["process_id"].clone();
        }
        if frame["type"] == "event" && frame["event"] == "resource.updated" {
            break frame;
        }
    };
    let payload = &updated["payload"];
    assert_eq!(payload["id"], process_id, "{updated}");
    assert_eq!(payload["kind"], "process");
    assert_eq!(payload["state"], "exited");
    assert_eq!(payload["exit_code"], 0);
}

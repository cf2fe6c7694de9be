//! ya-environment-protocol.v1 (the 0.92 spec) end to end: the real
//! binary as a child over stdio with LSP framing, spoken to by a client
//! written from the spec's texts alone — JSON-RPC messages by hand, no
//! portcullis crate. Every request it makes is found in the audit log.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::keyfile;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

const POLICY: &str = r#"
[[principal]]
id = "runtime"
public_key = "KEY"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[grant]]
id = "runtime"
principals = ["runtime"]
fileops = { main = "rw" }
shell = { commands = ["sh", "cat", "sleep", "echo", "true", "pwd"], cwd_roots = ["main"], env_set = { PATH = "/usr/bin:/bin" }, persist = true, pty = true }
"#;

/// A provider directory: config, gateway key, policy, workspace.
struct Provider {
    dir: PathBuf,
}

impl Provider {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("portcullis-envproto-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("workspace")).unwrap();
        keyfile::generate(&dir.join("gateway.key"), false).unwrap();
        let client = StaticKeypair::generate().unwrap();
        let policy = POLICY
            .replace("KEY", &common::key_b64(&client))
            .replace("GWDIR", &dir.display().to_string());
        std::fs::write(dir.join("policy.toml"), policy).unwrap();
        std::fs::write(
            dir.join("portcullis.toml"),
            "key_file = \"gateway.key\"\npolicy = \"policy.toml\"\nstate_dir = \"state\"\n\
             admin_socket = \"admin.sock\"\n",
        )
        .unwrap();
        Self { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.join("portcullis.toml")
    }

    /// `portcullis stdio` as the runtime's child.
    fn launch(&self) -> Rpc {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(["stdio", "--principal", "runtime", "--config"])
            .arg(self.config())
            .env("RUST_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start portcullis stdio");
        let stdin: Box<dyn AsyncWrite + Unpin + Send> = Box::new(child.stdin.take().unwrap());
        let stdout: Box<dyn AsyncRead + Unpin + Send> = Box::new(child.stdout.take().unwrap());
        Rpc::over(stdout, stdin, Some(child))
    }

    /// Every audit entry (the provider has exited: the store is free).
    fn audit(&self) -> Vec<Value> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(["audit", "list", "--json", "--limit", "100000", "--config"])
            .arg(self.config())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The runtime's end: LSP-framed JSON-RPC on the child's pipes or a
/// Unix socket.
struct Rpc {
    /// The provider, when it is the runtime's child.
    child: Option<Child>,
    stdin: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    stdout: BufReader<Box<dyn AsyncRead + Unpin + Send>>,
    /// Inside the Noise channel instead: a WebSocket whose records carry
    /// the messages (`stdin`/`stdout` unused).
    noise: Option<(WebSocketStream<TcpStream>, portcullis_crypto::Transport)>,
    /// Or the spec's own WebSocket profile: one text message a message.
    text: Option<WebSocketStream<TcpStream>>,
    /// Notifications (and requests) received while waiting for answers.
    notes: Vec<Value>,
    next: u64,
    /// Sent in the answer to `initialize` (the socket's second factor).
    token: Option<String>,
}

impl Rpc {
    fn over(
        read: Box<dyn AsyncRead + Unpin + Send>,
        write: Box<dyn AsyncWrite + Unpin + Send>,
        child: Option<Child>,
    ) -> Self {
        Rpc {
            stdin: Some(write),
            stdout: BufReader::new(read),
            noise: None,
            text: None,
            child,
            notes: Vec::new(),
            next: 0,
            token: None,
        }
    }

    /// `/api/v1/environment/connect` with the Noise handshake of the relay
    /// channel (docs/PROTOCOL.md §1–3), the gateway's key pinned.
    async fn noise(gateway: &common::Gateway, identity: &StaticKeypair) -> Self {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let tcp = TcpStream::connect(gateway.addr).await.unwrap();
        let request = format!("{}/api/v1/environment/connect", gateway.url)
            .into_client_request()
            .unwrap();
        let (ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        Rpc::noise_over(ws, gateway.key, identity).await
    }

    /// The runtime's side of the handshake on a WebSocket either side
    /// opened: the initiator, the gateway's key pinned.
    async fn noise_over(
        mut ws: WebSocketStream<TcpStream>,
        key: portcullis_crypto::PublicKey,
        identity: &StaticKeypair,
    ) -> Self {
        use portcullis_crypto::{Handshake, PROLOGUE};
        let mut hs = Handshake::initiator(identity, PROLOGUE).pin_remote_static(key);
        ws.send(Message::Binary(hs.write_message(&[]).unwrap().into()))
            .await
            .unwrap();
        let Some(Ok(Message::Binary(m2))) = ws.next().await else {
            panic!("no message 2")
        };
        hs.read_message(&m2).unwrap();
        ws.send(Message::Binary(hs.write_message(b"{}").unwrap().into()))
            .await
            .unwrap();
        let transport = hs.into_transport().unwrap();
        let mut rpc = Rpc::over(
            Box::new(tokio::io::empty()),
            Box::new(tokio::io::sink()),
            None,
        );
        rpc.noise = Some((ws, transport));
        rpc
    }

    /// [`unix`](Self::unix) once the (re)started daemon has made the socket.
    async fn unix_when_ready(path: &std::path::Path) -> Self {
        for _ in 0..200 {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self::unix(path).await
    }

    async fn unix(path: &std::path::Path) -> Self {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .expect("connect to the environment socket");
        let (read, write) = stream.into_split();
        Rpc::over(Box::new(read), Box::new(write), None)
    }

    async fn send(&mut self, message: &Value) {
        self.send_raw(message.to_string().as_bytes()).await;
    }

    async fn send_raw(&mut self, body: &[u8]) {
        eprintln!("-> {}", String::from_utf8_lossy(body));
        if let Some(ws) = self.text.as_mut() {
            let text = String::from_utf8(body.to_vec()).unwrap();
            ws.send(Message::Text(text.into())).await.unwrap();
            return;
        }
        if let Some((ws, transport)) = self.noise.as_mut() {
            // One frame record per message (these are all small).
            let mut record = vec![0x01];
            record.extend_from_slice(body);
            let sealed = transport.seal(&record).unwrap();
            ws.send(Message::Binary(sealed.into())).await.unwrap();
            return;
        }
        let stdin = self.stdin.as_mut().unwrap();
        let header = format!("Content-Length: {}\r\n\r\n", body.len());
        stdin.write_all(header.as_bytes()).await.unwrap();
        stdin.write_all(body).await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// The next message, within 20 s. (What comes is printed: a failing
    /// test shows the conversation.)
    async fn recv(&mut self) -> Value {
        let message = tokio::time::timeout(Duration::from_secs(20), self.read())
            .await
            .expect("no message from the provider in 20 s")
            .expect("the provider closed its output");
        eprintln!("<- {message}");
        message
    }

    async fn read(&mut self) -> Option<Value> {
        if let Some(ws) = self.text.as_mut() {
            return match ws.next().await {
                Some(Ok(Message::Text(text))) => Some(serde_json::from_str(&text).expect("JSON")),
                _ => None,
            };
        }
        if let Some((ws, transport)) = self.noise.as_mut() {
            let mut whole = Vec::new();
            loop {
                let Some(Ok(Message::Binary(sealed))) = ws.next().await else {
                    return None;
                };
                let record = transport
                    .open(&sealed)
                    .expect("a record the channel authenticates");
                match record[0] {
                    0x01 => {
                        return Some(serde_json::from_slice(&record[1..]).expect("a JSON message"));
                    }
                    0x03 => {
                        whole.extend_from_slice(&record[2..]);
                        if record[1] == 1 {
                            return Some(serde_json::from_slice(&whole).expect("a JSON message"));
                        }
                    }
                    kind => panic!("a record of kind {kind} in ya-environment-protocol.v1"),
                }
            }
        }
        let mut length = None;
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').expect("a header");
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.trim().parse::<usize>().unwrap());
            }
        }
        let mut body = vec![0; length.expect("Content-Length")];
        self.stdout.read_exact(&mut body).await.ok()?;
        Some(serde_json::from_slice(&body).expect("a JSON message"))
    }

    /// The answer to the message with `id`, keeping what comes before it.
    async fn answer(&mut self, id: &Value) -> Value {
        loop {
            let message = self.recv().await;
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return message;
            }
            self.notes.push(message);
        }
    }

    /// A request with a fresh id and this context; its whole answer. The
    /// params (when meant to be valid) and a result must match
    /// `portcullis protocol schema`, and so must every notification that
    /// came meanwhile.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = json!(self.next);
        let context = json!({"session_id": "sess-1", "run_id": "run-42", "tool_call_id": format!("call-{}", self.next)});
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params, "context": context}))
            .await;
        let seen = self.notes.len();
        let answer = self.answer(&id).await;
        assert_eq!(answer["jsonrpc"], "2.0");
        if let Some(result) = answer.get("result") {
            conforms(method, "params", &params);
            conforms(method, "result", result);
        }
        for note in &self.notes[seen..] {
            if let Some(name) = note["method"].as_str() {
                conforms(name, "params", &note["params"]);
            }
        }
        answer
    }

    /// A request that must succeed: its `result`.
    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// The handshake as 02-protocol.md has it: the provider sends
    /// `initialize`, the runtime answers with what it accepts.
    async fn initialize(&mut self) -> Value {
        let init = self.recv().await;
        assert_eq!(init["jsonrpc"], "2.0");
        assert_eq!(init["method"], "initialize");
        conforms("initialize", "params", &init["params"]);
        let params = init["params"].clone();
        assert_eq!(params["protocol"], "ya-environment-protocol.v1");
        let answer = json!({"jsonrpc": "2.0", "id": init["id"], "result": {
            "accepted_protocol": "ya-environment-protocol.v1", "connection_id": "conn_123",
            "accepted_capabilities": ["fileops", "shell", "process", "shell_session", "resources"],
            "server_time": "2026-06-15T12:00:00Z",
            "policy": {"grant_id": "grant_abc", "accepted_mount_ids": ["main"], "accepted_target_ids": ["local"]}}});
        let mut answer = answer;
        if let Some(token) = &self.token {
            answer["result"]["token"] = json!(token);
        }
        self.send(&answer).await;
        // What the session tells first (processes an earlier run lost)
        // may come before `provider.online`.
        let online = loop {
            let message = self.recv().await;
            if message["params"]["event"] == "provider.online" {
                break message;
            }
            assert_eq!(message["method"], "$/event", "{message}");
            self.notes.push(message);
        };
        assert_eq!(
            online["params"]["payload"]["instance_id"],
            params["provider"]["instance_id"]
        );
        params
    }

    /// Closes the provider's input and waits for it to exit.
    async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let mut child = self.child.take().expect("a child provider");
        tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("the provider did not exit after its input closed")
            .unwrap()
    }
}

/// `value` matches the schema `portcullis protocol schema` gives for
/// `method`'s `part`; a method the schema lacks fails too.
fn conforms(method: &str, part: &str, value: &Value) {
    let schema = portcullis_wire::envproto::schema::of(method, part)
        .unwrap_or_else(|| panic!("the schema has no {part} for `{method}`"));
    let validator = jsonschema::validator_for(&schema).expect("a valid JSON Schema");
    let problems: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        problems.is_empty(),
        "{method} {part} does not match its schema: {problems:#?}\n{value:#}"
    );
}

fn error_name(answer: &Value) -> &str {
    answer["error"]["data"]["name"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_runtime_from_the_spec_alone_uses_files_commands_processes_and_sessions_over_stdio() {
    let provider = Provider::new("flow");
    let mut rpc = provider.launch();
    exercise(&mut rpc).await;
    let exit = rpc.close().await;
    assert!(exit.success(), "{exit:?}\n{}", provider.log());
    all_audited(&provider.audit(), "stdio v1-jsonrpc");
    // `audit list` shows how each entry came, and filters by it.
    let list = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(["audit", "list", "--limit", "1000", "--config"])
            .arg(provider.config())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = list(&[
        "--transport",
        "stdio",
        "--profile",
        "ya-environment-protocol.v1",
    ]);
    assert!(table.lines().next().unwrap().contains("VIA"), "{table}");
    assert!(
        table.lines().nth(1).unwrap().contains("stdio 0.92"),
        "{table}"
    );
    assert!(table.lines().count() > 20, "{table}");
    let none = list(&["--transport", "unix"]);
    assert_eq!(none.lines().count(), 1, "only the header: {none}");
}

/// The test policy with this process's uid as the principal's
/// `unix_uid` (the environment socket's peer).
fn policy_with_my_uid() -> String {
    let uid = my_uid();
    POLICY.replace(
        "KEY\"",
        &format!(
            "{}\"\nunix_uid = {uid}",
            common::key_b64(&StaticKeypair::generate().unwrap())
        ),
    )
}

#[tokio::test]
async fn the_same_client_over_the_environment_socket_of_a_running_daemon() {
    let uid = my_uid();
    let policy = policy_with_my_uid();
    let mut gateway = common::Gateway::start(&policy, "environment_socket = \"env.sock\"");
    let socket = gateway.dir.join("env.sock");
    let mut rpc = Rpc::unix(&socket).await;
    exercise(&mut rpc).await;
    drop(rpc);
    // The daemon goes on; another connection of the same user is served.
    let mut again = Rpc::unix(&socket).await;
    again.initialize().await;
    again
        .ok(
            "file.stat",
            json!({"mount_id": "main", "path": "notes/a.txt"}),
        )
        .await;
    drop(again);

    // A policy change is told in this profile's terms.
    let mut watcher = Rpc::unix(&socket).await;
    watcher.initialize().await;
    reload(
        &gateway,
        &policy.replace("fileops = { main = \"rw\" }", "fileops = { main = \"ro\" }"),
    )
    .await;
    let updated = loop {
        let message = watcher.recv().await;
        if message["params"]["event"] == "capability.updated" {
            break message;
        }
    };
    conforms("$/event", "params", &updated["params"]);
    let mounts = &updated["params"]["payload"]["capabilities"]["fileops"]["mounts"];
    assert_eq!(mounts[0]["mode"], "ro", "{updated}");
    let caps = watcher.ok("provider.capabilities", json!({})).await;
    assert_eq!(caps["capabilities"]["fileops"]["mounts"], *mounts);
    drop(watcher);
    reload(&gateway, &policy).await;

    // A principal with a token_hash proves the token in initialize too.
    let token = "socket-second-factor-0123456789";
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
    let with_token = policy.replace(
        &format!("unix_uid = {uid}"),
        &format!("unix_uid = {uid}\ntoken_hash = \"sha256:{hash}\""),
    );
    reload(&gateway, &with_token).await;
    for wrong in [None, Some("not-the-token")] {
        let mut rpc = Rpc::unix(&socket).await;
        rpc.token = wrong.map(str::to_string);
        let init = rpc.recv().await;
        let mut answer = json!({"jsonrpc": "2.0", "id": init["id"], "result": {"accepted_capabilities": ["fileops"]}});
        if let Some(wrong) = wrong {
            answer["result"]["token"] = json!(wrong);
        }
        rpc.send(&answer).await;
        let goodbye = rpc.recv().await;
        assert_eq!(goodbye["params"]["event"], "provider.revoked", "{goodbye}");
        assert!(rpc.read().await.is_none(), "closed without its token");
    }
    let mut proven = Rpc::unix(&socket).await;
    proven.token = Some(token.to_string());
    proven.initialize().await;
    proven
        .ok(
            "file.stat",
            json!({"mount_id": "main", "path": "notes/a.txt"}),
        )
        .await;
    drop(proven);

    // A user no principal names is refused before any session.
    reload(
        &gateway,
        &policy.replace(&format!("unix_uid = {uid}"), "unix_uid = 4242"),
    )
    .await;
    let mut stranger = Rpc::unix(&socket).await;
    let refused = stranger.recv().await;
    assert_eq!(refused["params"]["event"], "provider.revoked", "{refused}");
    assert!(
        stranger.read().await.is_none(),
        "the socket is closed after the refusal"
    );

    // A security event is written beside the refusal, not before it:
    // wait for it.
    let refused_for = |entries: &[Value], why: &str| {
        entries.iter().any(|e| {
            e["event"] == "auth_refused" && e["detail"].as_str().is_some_and(|d| d.contains(why))
        })
    };
    let refusal_logged = |entries: &[Value]| {
        refused_for(entries, "no principal has unix_uid")
            && refused_for(entries, "did not carry its token")
    };
    let mut entries = Vec::new();
    for _ in 0..50 {
        entries = gateway
            .audit_entries()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        if refusal_logged(&entries) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refusal_logged(&entries), "no auth_refused entry");
    all_audited(&entries, "unix v1-jsonrpc (uid ");

    // A handle from before the daemon crashed is lost, over the socket too;
    // the socket is made again (a stale one replaced) on each start.
    gateway.write_policy(&policy);
    gateway.restart();
    let mut rpc = Rpc::unix_when_ready(&socket).await;
    rpc.initialize().await;
    let started = rpc
        .ok("process.start", json!({"command": "sleep 30"}))
        .await;
    drop(rpc);
    gateway.crash_and_restart();
    let mut rpc = Rpc::unix_when_ready(&socket).await;
    rpc.initialize().await;
    let lost = rpc
        .call("process.wait", json!({"process_id": started["process_id"]}))
        .await;
    assert_eq!(error_name(&lost), "process_lost", "{lost}");
    assert!(
        rpc.notes
            .iter()
            .any(|n| n["params"]["event"] == "process.lost"
                && n["params"]["payload"]["process_id"] == started["process_id"]),
        "{:#?}",
        rpc.notes
    );
}

#[tokio::test]
async fn the_same_client_inside_the_noise_channel_dialing_in() {
    let client = StaticKeypair::generate().unwrap();
    let policy = POLICY.replace("KEY", &common::key_b64(&client));
    let gateway = common::Gateway::start(&policy, "");
    let mut rpc = Rpc::noise(&gateway, &client).await;
    exercise(&mut rpc).await;
    drop(rpc);
    // A client whose key no principal has is refused after the handshake.
    let stranger = StaticKeypair::generate().unwrap();
    let mut refused = Rpc::noise(&gateway, &stranger).await;
    let goodbye = refused.recv().await;
    assert_eq!(goodbye["params"]["event"], "provider.revoked", "{goodbye}");
    assert_eq!(
        goodbye["params"]["payload"]["reason"],
        "authentication failed"
    );
    assert!(
        refused.read().await.is_none(),
        "an unknown key gets no session"
    );
    let entries: Vec<Value> = gateway
        .audit_entries()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    all_audited(&entries, "127.0.0.1:");
    assert!(entries.iter().filter(|e| e["kind"] == "request").all(|e| {
        e["peer"]
            .as_str()
            .is_some_and(|p| p.ends_with(" v1-jsonrpc"))
    }));

    // The same command from a relay.v1 client leaves an entry with the
    // same fields: only where it came from and its values differ.
    let relay = gateway.connect(&client).await.unwrap();
    relay.accept_all().await.unwrap();
    let answer = relay
        .request(
            "shell.exec",
            json!({"command": ["sh", "-c", "echo relay"], "root_id": "main"}),
        )
        .await;
    drop(relay);
    let entries: Vec<Value> = gateway
        .audit_entries()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let exec_of = |profile: &str| {
        entries
            .iter()
            .rfind(|e| {
                e["kind"] == "request"
                    && e["method"] == "shell.exec"
                    && e["profile"] == profile
                    && e["status"] == "succeeded"
            })
            .unwrap_or_else(|| panic!("no shell.exec of {profile} ({answer:?}): {entries:#?}"))
            .clone()
    };
    let (relay, jsonrpc) = (exec_of("relay.v1"), exec_of("ya-environment-protocol.v1"));
    // The runtime's context ids are its own to send or not.
    let fields = |e: &Value| {
        let mut keys: Vec<String> = e.as_object().unwrap().keys().cloned().collect();
        keys.retain(|k| {
            !["context", "session_id", "run_id", "tool_call_id", "path"].contains(&k.as_str())
        });
        keys.sort();
        keys
    };
    assert_eq!(fields(&relay), fields(&jsonrpc), "{relay:#}\n{jsonrpc:#}");
    assert_eq!(relay["transport"], "websocket");
    assert_eq!(relay["mount_ids"], json!(["main"]));
    assert_eq!(relay["target_id"], jsonrpc["target_id"]);
}

#[tokio::test]
async fn the_same_client_dialed_out_to_in_the_noise_channel_and_as_text_messages() {
    for plain in [false, true] {
        let client = StaticKeypair::generate().unwrap();
        let runtime = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = runtime.local_addr().unwrap().port();
        let token_dir = tempfile::tempdir().unwrap();
        let token_file = token_dir.path().join("relay.token");
        std::fs::write(&token_file, "dial-token").unwrap();
        let profile = match plain {
            true => "profile = \"plain\"\nprincipal = \"runtime\"\n",
            false => "",
        };
        let relay = format!(
            "[[relay]]\nurl = \"ws://127.0.0.1:{port}/api/v1/environment/connect\"\n\
             token_file = \"{}\"\nprotocol = \"ya-environment-protocol.v1\"\n{profile}",
            token_file.display()
        );
        let policy = POLICY.replace("KEY", &common::key_b64(&client));
        let gateway = common::Gateway::start(&policy, &relay);
        // The runtime's endpoint: the bearer token, then the protocol.
        let ws = accept_dial(&runtime, "dial-token", &gateway.log()).await;
        let mut rpc = match plain {
            false => Rpc::noise_over(ws, gateway.key, &client).await,
            true => {
                let mut rpc = Rpc::over(
                    Box::new(tokio::io::empty()),
                    Box::new(tokio::io::sink()),
                    None,
                );
                rpc.text = Some(ws);
                rpc
            }
        };
        exercise(&mut rpc).await;
        drop(rpc);
        let entries: Vec<Value> = gateway
            .audit_entries()
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect();
        let peer = match plain {
            true => format!("plain ws://127.0.0.1:{port}/api/v1/environment/connect v1-jsonrpc"),
            false => format!("ws://127.0.0.1:{port}/api/v1/environment/connect v1-jsonrpc"),
        };
        all_audited(&entries, &peer);
    }
}

#[tokio::test]
async fn portcullis_websocket_connect_dials_one_endpoint_and_serves_it() {
    let provider = Provider::new("websocket");
    let runtime = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = runtime.local_addr().unwrap().port();
    std::fs::write(provider.dir.join("relay.token"), "verb-token").unwrap();
    let policy = std::fs::read_to_string(provider.dir.join("policy.toml")).unwrap();
    let client = StaticKeypair::generate().unwrap();
    let key_line = policy
        .lines()
        .find(|l| l.starts_with("public_key"))
        .unwrap()
        .to_string();
    std::fs::write(
        provider.dir.join("policy.toml"),
        policy.replace(
            &key_line,
            &format!("public_key = \"{}\"", common::key_b64(&client)),
        ),
    )
    .unwrap();
    let gateway_key = keyfile::load(&provider.dir.join("gateway.key")).unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["websocket", "--config"])
        .arg(provider.config())
        .args([
            "--connect",
            &format!("ws://127.0.0.1:{port}/api/v1/environment/connect"),
        ])
        .arg("--token-file")
        .arg(provider.dir.join("relay.token"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(provider.dir.join("stderr.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let ws = accept_dial(&runtime, "verb-token", &provider.log()).await;
    let mut rpc = Rpc::noise_over(ws, *gateway_key.public(), &client).await;
    rpc.initialize().await;
    let exec = rpc
        .ok("shell.exec", json!({"command": "echo dialed"}))
        .await;
    assert_eq!(exec["stdout"], "dialed\n");
    drop(rpc);
    daemon.start_kill().unwrap();
    daemon.wait().await.unwrap();
    let entries = provider.audit();
    assert!(entries.iter().any(|e| {
        e["method"] == "shell.exec"
            && e["peer"]
                .as_str()
                .is_some_and(|p| p.ends_with("/api/v1/environment/connect v1-jsonrpc"))
    }));
    // The command line is checked as a config's [[relay]] is.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["websocket", "--config"])
        .arg(provider.config())
        .args(["--connect", "ws://runtime.example/x", "--token-file", "t"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("loopback"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[tokio::test]
async fn the_environment_socket_refuses_a_peer_in_another_namespace() {
    // As a sandboxed command would reach it: the same uid (the principal's
    // unix_uid), but a user namespace that is not the daemon's.
    let policy = policy_with_my_uid();
    let gateway = common::Gateway::start(&policy, "environment_socket = \"env.sock\"");
    let first_line = |prefix: &[&str]| {
        let program = format!(
            "import socket\n\
             try:\n\
             \x20   s = socket.socket(socket.AF_UNIX); s.connect({socket:?})\n\
             \x20   print(s.recv(64).decode(errors='replace').split('\\r\\n')[0] or 'CLOSED')\n\
             except OSError: print('CLOSED')",
            socket = gateway.dir.join("env.sock").display().to_string()
        );
        let out = std::process::Command::new(prefix[0])
            .args(&prefix[1..])
            .args(["python3", "-c", &program])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(first_line(&["env"]).starts_with("Content-Length: "));
    assert_eq!(
        first_line(&["unshare", "--user", "--map-current-user"]),
        "CLOSED"
    );
    let log = gateway.log();
    assert!(log.contains("user namespace"), "{log}");
}

/// A runtime's endpoint taking the gateway's dial: the WebSocket upgrade
/// to `/api/v1/environment/connect` with `Bearer TOKEN`.
async fn accept_dial(
    runtime: &tokio::net::TcpListener,
    token: &str,
    log: &str,
) -> WebSocketStream<TcpStream> {
    let (tcp, _) = tokio::time::timeout(Duration::from_secs(20), runtime.accept())
        .await
        .unwrap_or_else(|_| panic!("the gateway did not dial:\n{log}"))
        .unwrap();
    let expected = format!("Bearer {token}");
    #[allow(clippy::result_large_err)]
    let check =
        |request: &tokio_tungstenite::tungstenite::handshake::server::Request,
         response: tokio_tungstenite::tungstenite::handshake::server::Response| {
            let bearer = request
                .headers()
                .get("authorization")
                .map(|v| v.as_bytes().to_vec());
            assert_eq!(bearer.as_deref(), Some(expected.as_bytes()));
            assert_eq!(request.uri().path(), "/api/v1/environment/connect");
            Ok(response)
        };
    tokio_tungstenite::accept_hdr_async(tcp, check)
        .await
        .unwrap()
}

/// This process's user (the owner of a file it makes).
fn my_uid() -> u32 {
    let probe = tempfile::NamedTempFile::new().unwrap();
    probe.as_file().metadata().unwrap().uid()
}

/// Writes the policy and waits until the daemon has reloaded it.
async fn reload(gateway: &common::Gateway, policy: &str) {
    let reloads = || gateway.log().matches("policy reloaded").count();
    let before = reloads();
    gateway.write_policy(policy);
    gateway.signal("HUP");
    for _ in 0..100 {
        if reloads() > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the policy was not reloaded:\n{}", gateway.log());
}

/// The flow every transport must carry, as a runtime written from the
/// spec would drive it.
async fn exercise(rpc: &mut Rpc) {
    let params = rpc.initialize().await;

    // The descriptor: a mount, a target, honest persistence.
    let provider_desc = &params["provider"];
    assert_eq!(provider_desc["provider_kind"], "ya_envd");
    assert!(
        provider_desc["instance_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    let mount = &params["capabilities"]["fileops"]["mounts"][0];
    assert_eq!(mount["mount_id"], "main");
    assert_eq!(mount["virtual_path"], "/workspace/main");
    assert_eq!(mount["mode"], "rw");
    assert_eq!(mount["state"], "online");
    assert!(mount["generation"].is_u64());
    let target = &params["capabilities"]["shell"]["targets"][0];
    assert_eq!(target["target_id"], "local");
    assert_eq!(target["allowed_mount_ids"], json!(["main"]));
    assert_eq!(target["process_persistence"], "provider");
    assert_eq!(target["session_persistence"], "provider");
    assert!(!params.to_string().contains("durable"));

    // Files, by mount and mount-relative path.
    let wrote = rpc.ok("file.write", json!({"mount_id": "main", "path": "notes/a.txt", "content": "alpha\nbeta\n", "create_parents": true})).await;
    assert_eq!(wrote["path"], "/workspace/main/notes/a.txt");
    let read = rpc.ok("file.read", json!({"mount_id": "main", "path": "notes/a.txt", "mode": "text", "encoding": "utf-8", "offset": 0, "length": 60000})).await;
    assert_eq!(read["content"], "alpha\nbeta\n");
    let listed = rpc
        .ok(
            "file.list",
            json!({"mount_id": "main", "path": "notes", "include_hidden": false}),
        )
        .await;
    assert_eq!(listed["entries"][0]["name"], "a.txt");
    let stat = rpc
        .ok(
            "file.stat",
            json!({"mount_id": "main", "path": "notes/a.txt"}),
        )
        .await;
    assert_eq!(stat["size"], 11);
    // The rest of file.*, each answer checked against the schema.
    let f = |path: &str| json!({"mount_id": "main", "path": path});
    rpc.ok(
        "file.mkdir",
        json!({"mount_id": "main", "path": "more/deep", "parents": true}),
    )
    .await;
    rpc.ok(
        "file.append",
        json!({"mount_id": "main", "path": "more/log", "content": "x\n"}),
    )
    .await;
    rpc.ok(
        "file.copy",
        json!({"mount_id": "main", "path": "more/log", "to_path": "more/copy"}),
    )
    .await;
    rpc.ok(
        "file.move",
        json!({"mount_id": "main", "path": "more/copy", "to_path": "more/moved"}),
    )
    .await;
    let found = rpc
        .ok(
            "file.search",
            json!({"mount_id": "main", "path": "more", "pattern": "x"}),
        )
        .await;
    assert_eq!(found["matches"], 2, "{found}");
    let watch = rpc
        .ok(
            "file.watch",
            json!({"mount_id": "main", "path": "more", "recursive": true}),
        )
        .await;
    let resources = rpc.ok("resource.list", json!({})).await;
    assert!(
        resources["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == watch["resource_id"]),
        "{resources}"
    );
    rpc.ok("resource.dispose", json!({"id": watch["resource_id"]}))
        .await;
    rpc.ok(
        "file.delete",
        json!({"mount_id": "main", "path": "more", "recursive": true}),
    )
    .await;
    let gone = rpc.call("file.stat", f("more")).await;
    assert_eq!(error_name(&gone), "not_found", "{gone}");
    let outside = rpc
        .call(
            "file.read",
            json!({"mount_id": "main", "path": "../../etc/passwd"}),
        )
        .await;
    assert_eq!(outside["error"]["code"], -32040, "{outside}");
    assert_eq!(error_name(&outside), "permission_denied");
    assert_eq!(outside["error"]["data"]["mount_id"], "main");
    assert_eq!(outside["id"], rpc.next);

    // Stateless shell.exec: a command line, a cwd under the mount.
    let exec = rpc.ok("shell.exec", json!({"target_id": "local", "command": "cat a.txt && pwd", "cwd": "/workspace/main/notes", "env": {"PYTHONUNBUFFERED": "1"}, "timeout_ms": 30000})).await;
    assert_eq!(exec["exit_code"], 0, "{exec}");
    assert!(
        exec["stdout"]
            .as_str()
            .unwrap()
            .starts_with("alpha\nbeta\n"),
        "{exec}"
    );
    assert_eq!(exec["truncated"], false);
    assert!(exec["duration_ms"].is_u64());
    let elsewhere = rpc
        .call(
            "shell.exec",
            json!({"target_id": "gpu-box", "command": "true"}),
        )
        .await;
    assert_eq!(error_name(&elsewhere), "not_found", "{elsewhere}");
    let refused = rpc
        .call("shell.exec", json!({"command": ["rm", "-rf", "notes"]}))
        .await;
    assert_eq!(error_name(&refused), "permission_denied", "{refused}");

    // A background process, then waiting on it (its output drained).
    let started = rpc.ok("process.start", json!({"target_id": "local", "command": "echo one; sleep 0.3; echo two >&2; exit 3", "cwd": "/workspace/main", "env": {}, "output_limit_bytes": 1048576})).await;
    let process_id = started["process_id"].as_str().unwrap().to_string();
    assert_eq!(started["persistence"], "provider");
    assert!(started["started_at"].as_str().unwrap().ends_with('Z'));
    let waited = rpc
        .ok(
            "process.wait",
            json!({"process_id": process_id, "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(waited["status"], "exited", "{waited}");
    assert_eq!(waited["exit_code"], 3);
    assert_eq!(waited["stdout"], "one\n");
    assert_eq!(waited["stderr"], "two\n");
    let status = rpc
        .ok("process.status", json!({"process_id": process_id}))
        .await;
    assert_eq!(status["status"], "exited");
    assert_eq!(
        status["command"],
        "echo one; sleep 0.3; echo two >&2; exit 3"
    );
    // Its output came as $/stream under the start's id, with sequences.
    let streamed: Vec<&Value> = rpc
        .notes
        .iter()
        .filter(|m| m["method"] == "$/stream" && m["params"]["event"] == "stdout")
        .collect();
    assert!(
        streamed
            .iter()
            .any(|m| m["params"]["data"] == "one\n" && m["params"]["sequence"] == 0),
        "{:?}",
        rpc.notes
    );
    assert!(
        rpc.notes
            .iter()
            .any(|m| m["params"]["event"] == "process.exited"
                && m["params"]["payload"]["process_id"] == process_id.as_str())
    );

    // A wait that ends before the process does; then kill.
    let sleeper = rpc
        .ok("process.start", json!({"command": "sleep 30"}))
        .await;
    let sleeper_id = sleeper["process_id"].as_str().unwrap().to_string();
    let polled = rpc
        .ok(
            "process.wait",
            json!({"process_id": sleeper_id, "timeout_ms": 200}),
        )
        .await;
    assert_eq!(polled["status"], "running", "{polled}");
    let signalled = rpc
        .ok(
            "process.signal",
            json!({"process_id": sleeper_id, "signal": 18}),
        )
        .await;
    assert_eq!(signalled["signal"], "CONT", "{signalled}");
    // Input, then the end of it.
    let cat = rpc.ok("process.start", json!({"command": ["cat"]})).await;
    let cat_id = cat["process_id"].clone();
    rpc.ok(
        "process.input",
        json!({"process_id": cat_id, "data": "typed\n"}),
    )
    .await;
    rpc.ok("process.close_stdin", json!({"process_id": cat_id}))
        .await;
    let echoed = rpc
        .ok(
            "process.wait",
            json!({"process_id": cat_id, "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(echoed["stdout"], "typed\n", "{echoed}");
    assert_eq!(echoed["status"], "exited", "{echoed}");
    let listed = rpc.ok("process.list", json!({})).await;
    assert!(
        listed["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["process_id"] == sleeper_id.as_str() && p["status"] == "running")
    );
    let killed = rpc
        .ok("process.kill", json!({"process_id": sleeper_id}))
        .await;
    assert_eq!(killed["killed"], true);
    let after = rpc
        .ok("process.status", json!({"process_id": sleeper_id}))
        .await;
    assert_eq!(after["status"], "killed", "{after}");

    // A stateful shell session: open, exec, resize, snapshot, close.
    let opened = rpc.ok("shell_session.open", json!({"target_id": "local", "cwd": "/workspace/main", "env": {}, "pty": {"cols": 120, "rows": 30}, "persistence": "provider"})).await;
    let session_id = opened["session_id"].as_str().unwrap().to_string();
    assert_eq!(opened["resource_id"], session_id.as_str());
    assert_eq!(opened["persistence"], "provider");
    rpc.ok(
        "shell_session.exec",
        json!({"session_id": session_id, "command": "cd notes && export MARK=kept"}),
    )
    .await;
    rpc.ok(
        "shell_session.exec",
        json!({"session_id": session_id, "command": "echo \"$MARK in $(pwd)\""}),
    )
    .await;
    let resized = rpc
        .ok(
            "shell_session.resize",
            json!({"session_id": session_id, "cols": 100, "rows": 40}),
        )
        .await;
    assert_eq!(resized["cols"], 100);
    // The shell keeps its state between execs: the snapshot shows it.
    // (Inside a command a root is at its host path: docs/OPERATIONS.md.)
    let kept = |s: &Value| {
        s["output"]
            .as_str()
            .unwrap_or("")
            .contains("workspace/notes\r\n")
    };
    let mut snapshot = Value::Null;
    for _ in 0..50 {
        snapshot = rpc
            .ok("shell_session.snapshot", json!({"session_id": session_id}))
            .await;
        if kept(&snapshot) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        kept(&snapshot) && snapshot["output"].as_str().unwrap().contains("kept in /"),
        "{snapshot}"
    );
    assert_eq!(snapshot["status"], "open");
    let sessions = rpc.ok("shell_session.list", json!({})).await;
    assert!(
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["session_id"] == session_id.as_str())
    );
    let closed = rpc
        .ok("shell_session.close", json!({"session_id": session_id}))
        .await;
    assert_eq!(closed["status"], "closed");
    let gone = rpc
        .ok("shell_session.status", json!({"session_id": session_id}))
        .await;
    assert_eq!(gone["status"], "closed");

    // $/cancelRequest ends a running request with a terminal response.
    rpc.next += 1;
    let id = json!(format!("req_shell_{}", rpc.next));
    rpc.send(&json!({"jsonrpc": "2.0", "id": id, "method": "shell.exec", "params": {"command": "sleep 30"}})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    rpc.send(&json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": id, "reason": "user_cancelled"}})).await;
    let cancelled = rpc.answer(&id).await;
    assert_eq!(error_name(&cancelled), "cancelled", "{cancelled}");

    // The protocol's own messages.
    let ping = rpc
        .call("$/ping", json!({"ts": "2026-06-15T12:00:00Z"}))
        .await;
    assert_eq!(ping["result"]["ts"], "2026-06-15T12:00:00Z");
    let status = rpc.ok("provider.status", json!({})).await;
    assert_eq!(status["state"], "online");
    assert_eq!(status["instance_id"], provider_desc["instance_id"]);
    let caps = rpc.ok("provider.capabilities", json!({})).await;
    assert_eq!(
        caps["capabilities"]["fileops"]["mounts"][0]["mount_id"],
        "main"
    );
    let unknown = rpc.call("computer.see", json!({})).await;
    assert_eq!(error_name(&unknown), "capability_unavailable", "{unknown}");
    let unknown = rpc.call("nothing.here", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");

    // Not JSON-RPC: answered, and the session goes on.
    rpc.send_raw(b"{this is not json").await;
    let parse = rpc.answer(&Value::Null).await;
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    rpc.ok("file.stat", json!({"mount_id": "main", "path": "notes"}))
        .await;
}

/// Every request went through the one path: decided, audited with the
/// runtime's context, under a peer that names the transport and profile.
fn all_audited(entries: &[Value], peer: &str) {
    let requests: Vec<&Value> = entries.iter().filter(|e| e["kind"] == "request").collect();
    assert!(
        requests
            .iter()
            .any(|e| e["method"] == "shell.start" && e["run_id"] == "run-42"),
        "{requests:#?}"
    );
    assert!(
        requests
            .iter()
            .any(|e| e["method"] == "file.read" && e["decision"] == "blocked")
    );
    assert!(
        requests
            .iter()
            .all(|e| e["peer"].as_str().is_some_and(|p| p.starts_with(peer))),
        "{requests:#?}"
    );
    // The message that was not JSON was refused on the record too.
    assert!(
        requests.iter().any(|e| e["detail"]
            .as_str()
            .is_some_and(|d| d.contains("not valid"))),
        "{requests:#?}"
    );
    // The 0.92 spec's audit fields, and how the peer came.
    for e in &requests {
        assert_eq!(e["profile"], "ya-environment-protocol.v1", "{e:#}");
        assert!(
            e["transport"].is_string() && e["provider_id"].is_string(),
            "{e:#}"
        );
        assert!(e["instance_id"].is_string(), "{e:#}");
    }
    let exec = requests
        .iter()
        .find(|e| e["method"] == "shell.exec" && e["status"] == "succeeded")
        .expect("a shell.exec entry");
    assert_eq!(exec["target_id"], "local", "{exec:#}");
    assert_eq!(exec["mount_ids"], json!(["main"]), "{exec:#}");
    assert_eq!(exec["output_truncated"], false, "{exec:#}");
    let start = requests
        .iter()
        .find(|e| e["method"] == "shell.start")
        .expect("a shell.start entry");
    assert!(
        start["resource_id"]
            .as_str()
            .is_some_and(|id| id.starts_with('p')),
        "{start:#}"
    );
    let blocked = requests
        .iter()
        .find(|e| e["decision"] == "blocked" && e["method"] == "file.read")
        .unwrap();
    assert_eq!(blocked["error_name"], "permission_denied", "{blocked:#}");
}

#[tokio::test]
async fn a_process_from_before_a_restart_is_lost_not_missing() {
    let provider = Provider::new("restart");
    let mut rpc = provider.launch();
    let first = rpc.initialize().await;
    let started = rpc
        .ok("process.start", json!({"command": "sleep 30"}))
        .await;
    let process_id = started["process_id"].as_str().unwrap().to_string();
    let opened = rpc
        .ok(
            "shell_session.open",
            json!({"pty": {"cols": 80, "rows": 24}}),
        )
        .await;
    let session_id = opened["session_id"].as_str().unwrap().to_string();
    assert!(rpc.close().await.success(), "{}", provider.log());

    let mut rpc = provider.launch();
    let second = rpc.initialize().await;
    assert_ne!(
        first["provider"]["instance_id"],
        second["provider"]["instance_id"]
    );
    let lost = rpc
        .call("process.wait", json!({"process_id": process_id}))
        .await;
    assert_eq!(lost["error"]["code"], -32061, "{lost}");
    assert_eq!(error_name(&lost), "process_lost");
    let lost = rpc
        .call("shell_session.status", json!({"session_id": session_id}))
        .await;
    assert_eq!(error_name(&lost), "session_lost", "{lost}");
    let missing = rpc
        .call("process.status", json!({"process_id": "nothing"}))
        .await;
    assert_eq!(error_name(&missing), "not_found", "{missing}");
    // An id shaped like an earlier run's that no run gave out is not a
    // lost handle: the store knows which were.
    let made_up = format!("p9-{}", &process_id[process_id.len() - 8..]);
    let missing = rpc
        .call("process.status", json!({"process_id": made_up}))
        .await;
    assert_eq!(error_name(&missing), "not_found", "{missing}");
    // Told once, as the spec's events, when the session began.
    let told = |event: &str, field: &str, id: &str| {
        rpc.notes
            .iter()
            .any(|n| n["params"]["event"] == event && n["params"]["payload"][field] == id)
    };
    assert!(
        told("process.lost", "process_id", &process_id),
        "{:#?}",
        rpc.notes
    );
    assert!(
        told("shell_session.lost", "session_id", &session_id),
        "{:#?}",
        rpc.notes
    );
    assert!(rpc.close().await.success());
    let mut rpc = provider.launch();
    rpc.initialize().await;
    let lost = rpc
        .call("process.wait", json!({"process_id": process_id}))
        .await;
    assert_eq!(error_name(&lost), "process_lost", "{lost}");
    assert!(
        !rpc.notes
            .iter()
            .any(|n| n["params"]["event"] == "process.lost"),
        "told twice: {:#?}",
        rpc.notes
    );
    assert!(rpc.close().await.success());
    // The audit log says lost, in the spec's terms.
    let entries = provider.audit();
    let lost: Vec<&Value> = entries.iter().filter(|e| e["status"] == "lost").collect();
    assert!(
        lost.iter()
            .any(|e| e["error_name"] == "process_lost" && e["resource_id"] == process_id.as_str()),
        "{lost:#?}"
    );
    assert!(
        lost.iter().any(|e| e["error_name"] == "session_lost"),
        "{lost:#?}"
    );
    // Nothing of the first run outlived it.
    assert!(common::processes_with(&provider.dir.display().to_string()).is_empty());
}

#[tokio::test]
async fn hostile_framing_ends_the_provider_cleanly() {
    let provider = Provider::new("hostile");
    for garbage in [
        &b"Content-Length: 999999999999\r\n\r\n"[..],
        b"no header at all\r\n\r\n",
        b"Content-Length: 5\r\n\r\n{",
    ] {
        let mut rpc = provider.launch();
        rpc.initialize().await;
        rpc.send_raw(b"{}").await;
        let answer = rpc.answer(&Value::Null).await;
        assert_eq!(
            answer["error"]["data"]["name"], "invalid_request",
            "{answer}"
        );
        rpc.stdin
            .as_mut()
            .unwrap()
            .write_all(garbage)
            .await
            .unwrap();
        let exit = rpc.close().await;
        assert!(exit.success(), "{exit:?}");
    }
}

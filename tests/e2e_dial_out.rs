//! Dial-out: the gateway connects to a runtime's relay endpoint
//! (`[[relay]]`), the runtime (portcullis-client's `ProviderListener`)
//! checks the bearer token and runs the Noise handshake as the initiator,
//! and the session is the same as one the runtime dialed. The runtime goes
//! away and comes back; the gateway reconnects, and a persistent process
//! is reattached from sequence 0.

mod common;

use std::time::Duration;

use common::{Gateway, principal};
use portcullis_client::listen::ProviderListener;
use portcullis_client::{Client, ClientError, ClientOptions, StreamItem};
use portcullis_crypto::StaticKeypair;
use serde_json::{Value, json};
use zeroize::Zeroizing;

const TOKEN: &str = "relay-token-for-tests";

fn policy(alice: &StaticKeypair) -> String {
    format!(
        r#"{alice}
[[root]]
id = "main"
path = "WORKSPACE"
virtual_path = "/workspace/main"

[[grant]]
id = "alice"
principals = ["alice"]
fileops = {{ main = "rw" }}
shell = {{ commands = ["sh", "printf", "sleep"], cwd_roots = ["main"], env_set = {{ PATH = "/usr/bin:/bin" }}, persist = true }}
"#,
        alice = principal("alice", alice)
    )
}

/// A gateway that listens as usual and dials `port` on 127.0.0.1.
fn gateway_dialing(alice: &StaticKeypair, port: u16, token_file: &std::path::Path) -> Gateway {
    let relay = format!(
        "[[relay]]\nurl = \"ws://127.0.0.1:{port}/api/v1/relay/connect\"\ntoken_file = \"{}\"\n",
        token_file.display()
    );
    Gateway::start(&policy(alice), &relay)
}

fn options(gw: &Gateway, alice: &StaticKeypair) -> ClientOptions {
    let mut options = ClientOptions::new("ws://unused", gw.key, alice.clone());
    options.timeout = Duration::from_secs(20);
    options
}

/// The completing entry of request `left-running`, which was in flight
/// when its connection was lost: it ended `relay_disconnected`.
fn lost_request(gw: &Gateway) -> portcullis_store::Entry {
    let lost = gw
        .audit_entries()
        .into_iter()
        .find(|e| {
            e.record.request_id.as_deref() == Some("left-running") && e.record.status.is_some()
        })
        .expect("the lost request's entry");
    assert_eq!(
        lost.record.error_code.as_deref(),
        Some("relay_disconnected"),
        "{lost:?}"
    );
    lost
}

/// `portcullis status` once it says `needle` (or after 10 s, whatever it
/// says then).
async fn status_saying(gw: &Gateway, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = gw.cli(&["status"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if text.contains(needle) || std::time::Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The next gateway to dial in and prove its key.
async fn next_gateway(listener: &ProviderListener, options: ClientOptions) -> Client {
    let client = listener
        .accept(options)
        .await
        .expect("the gateway dials in");
    client.accept_all().await.unwrap();
    client
}

/// Output of a started or attached process until `until` is in it.
async fn read_output(
    request: &mut portcullis_client::RequestHandle<'_>,
    until: &str,
) -> (String, Vec<Value>) {
    let (mut out, mut frames) = (String::new(), Vec::new());
    while !out.contains(until) {
        match tokio::time::timeout(Duration::from_secs(20), request.next()).await {
            Ok(Some(StreamItem::Chunk { data, .. })) => {
                out.push_str(&String::from_utf8_lossy(&data))
            }
            Ok(Some(StreamItem::Stream { event, data })) => {
                if let Some(text) = data.as_str().filter(|_| event == "stdout") {
                    out.push_str(text);
                }
                frames.push(json!({"event": event, "data": data}));
            }
            other => panic!("the output ended before {until:?}: {other:?} (so far {out:?})"),
        }
    }
    (out, frames)
}

#[tokio::test]
async fn the_gateway_dials_the_runtime_and_comes_back_after_it_restarts() {
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let listener = ProviderListener::bind("127.0.0.1:0", Zeroizing::new(TOKEN.into()))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let gw = gateway_dialing(&alice, port, &token_file);

    // The runtime's side: the same client as a dial-in one.
    let runtime = next_gateway(&listener, options(&gw, &alice)).await;
    assert_eq!(runtime.hello().principal.as_deref(), Some("alice"));
    let first_hello = runtime.hello().clone();
    let ran = runtime
        .request(
            "shell.exec",
            json!({"command": ["printf", "over a dialed socket"]}),
        )
        .await
        .unwrap();
    assert_eq!(ran["stdout"], "over a dialed socket");
    let metrics = gw.cli(&["metrics"]);
    let metrics = String::from_utf8_lossy(&metrics.stdout).to_string();
    assert!(
        metrics.contains(&format!(
            "portcullis_relay_connected{{url=\"ws://127.0.0.1:{port}/api/v1/relay/connect\"}} 1"
        )),
        "{metrics}"
    );
    let status = gw.cli(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(
        status.contains(&format!(
            "relay ws://127.0.0.1:{port}/api/v1/relay/connect: connected"
        )),
        "{status}"
    );

    // A persistent process, and a request still running when the runtime
    // goes away.
    let script = "printf one; sleep 0.3; printf two; sleep 30";
    let mut started = runtime
        .start("shell.start", json!({"command": ["sh", "-c", script]}))
        .await
        .unwrap();
    let (_, frames) = read_output(&mut started, "one").await;
    let process_id = frames
        .iter()
        .find(|f| f["event"] == "started")
        .expect("a started frame")["data"]["process_id"]
        .as_str()
        .unwrap()
        .to_string();
    let running = runtime
        .start_with_id(
            portcullis_wire::frame::RequestId::new("left-running").unwrap(),
            "shell.exec",
            json!({"command": ["sleep", "20"]}),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(started);
    drop(running);
    drop(runtime);
    drop(listener);

    // The runtime restarts on the same port; the gateway is back within
    // its backoff (1 s, 2 s, … with jitter).
    let back = std::time::Instant::now();
    let listener = loop {
        match ProviderListener::bind(&format!("127.0.0.1:{port}"), Zeroizing::new(TOKEN.into()))
            .await
        {
            Ok(listener) => break listener,
            Err(_) if back.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the port stayed taken: {e}"),
        }
    };
    let runtime = next_gateway(&listener, options(&gw, &alice)).await;
    assert!(
        back.elapsed() < Duration::from_secs(15),
        "{:?}",
        back.elapsed()
    );
    // The same provider and daemon run: only the connection is new.
    assert_eq!(runtime.hello().instance_id, first_hello.instance_id);
    assert_eq!(runtime.hello().provider_id, first_hello.provider_id);
    let mut attached = runtime
        .start(
            "shell.attach",
            json!({"process_id": process_id, "from_seq": 0}),
        )
        .await
        .unwrap();
    let (replayed, _) = read_output(&mut attached, "onetwo").await;
    assert!(
        replayed.starts_with("onetwo"),
        "exactly from sequence 0: {replayed:?}"
    );

    // The request the lost connection had running ended relay_disconnected.
    let lost = lost_request(&gw);
    assert!(
        lost.record
            .peer
            .as_deref()
            .unwrap_or("")
            .starts_with("ws://127.0.0.1"),
        "{lost:?}"
    );

    // A reload that disables the principal revokes a dialed session as it
    // does an accepted one.
    let policy_file = gw.dir.join("policy.toml");
    let text = std::fs::read_to_string(&policy_file).unwrap();
    let disabled = text.replacen("id = \"alice\"\n", "id = \"alice\"\ndisabled = true\n", 1);
    assert_ne!(disabled, text);
    std::fs::write(&policy_file, disabled).unwrap();
    assert!(gw.cli(&["policy", "reload"]).status.success());
    let closed = tokio::time::timeout(Duration::from_secs(10), runtime.closed())
        .await
        .expect("the dialed session is closed by the reload");
    assert!(closed.contains("revoked"), "{closed}");
}

#[tokio::test]
async fn a_refused_token_stops_the_retries_until_a_reload() {
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, "not-the-token").unwrap();
    let listener = ProviderListener::bind("127.0.0.1:0", Zeroizing::new(TOKEN.into()))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let gw = gateway_dialing(&alice, port, &token_file);
    // The listener refuses it (401) and says so.
    let refused = listener.accept(options(&gw, &alice)).await;
    assert!(
        matches!(refused, Err(ClientError::Upgrade(_))),
        "{:?}",
        refused.err()
    );
    let status = status_saying(&gw, "token_refused").await;
    assert!(
        status.contains("token_refused") && status.contains("401"),
        "{status}"
    );
    // No retry while refused: nothing dials in for a while.
    let quiet = tokio::time::timeout(
        Duration::from_secs(3),
        listener.accept(options(&gw, &alice)),
    )
    .await;
    assert!(quiet.is_err(), "the gateway retried a refused token");
    // The right token and a reload: it connects.
    std::fs::write(&token_file, TOKEN).unwrap();
    assert!(gw.cli(&["policy", "reload"]).status.success());
    let runtime = next_gateway(&listener, options(&gw, &alice)).await;
    let listed = runtime
        .request("file.list", json!({"root_id": "main", "path": ""}))
        .await
        .unwrap();
    assert!(listed["entries"].is_array(), "{listed}");
    let audited = gw.audit_entries();
    assert!(audited.iter().any(|e| {
        e.record.event.as_deref() == Some("relay_failed")
            && e.record
                .detail
                .as_deref()
                .unwrap_or("")
                .contains("refused the bearer token")
    }));
}

/// A runtime's TLS endpoint: a self-signed certificate for `localhost`
/// (its own CA), as PEM and as DER, and an acceptor serving it.
fn tls_endpoint() -> (String, Vec<u8>, tokio_rustls::TlsAcceptor) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let der = certified.cert.der().clone();
    let key =
        rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der()).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![der.clone()], key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
    (certified.cert.pem(), der.to_vec(), acceptor)
}

/// A runtime written from the relay spec alone: a TLS WebSocket endpoint
/// that takes the gateway's upgrade with the bearer token, then speaks
/// JSON text frames — no Noise. Serves one connection.
async fn spec_runtime(
    listener: &tokio::net::TcpListener,
    acceptor: &tokio_rustls::TlsAcceptor,
) -> tokio_tungstenite::WebSocketStream<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
    let (tcp, _) = listener.accept().await.unwrap();
    let tls = acceptor.accept(tcp).await.expect("TLS from the gateway");
    #[allow(clippy::result_large_err)] // tungstenite's callback type
    let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        assert_eq!(request.uri().path(), "/api/v1/relay/connect");
        let auth = request.headers().get("authorization").unwrap();
        assert_eq!(auth, &format!("Bearer {TOKEN}"));
        Ok(response)
    };
    tokio_tungstenite::accept_hdr_async(tls, check)
        .await
        .unwrap()
}

async fn next_text(
    ws: &mut tokio_tungstenite::WebSocketStream<
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    >,
) -> Value {
    use futures_util::StreamExt;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a frame within 20 s")
            .expect("the connection is open")
            .unwrap();
        match message {
            tokio_tungstenite::tungstenite::Message::Text(text) => {
                return serde_json::from_str(text.as_str()).unwrap();
            }
            tokio_tungstenite::tungstenite::Message::Binary(_) => {
                panic!("a binary message in the plain profile")
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn the_plain_profile_speaks_the_spec_s_json_over_tls_to_a_configured_principal() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, _, acceptor) = tls_endpoint();
    let (cert_file, token_file) = (dir.path().join("ca.pem"), dir.path().join("relay.token"));
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&token_file, TOKEN).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let relay = format!(
        "[[relay]]\nurl = \"wss://localhost:{port}/api/v1/relay/connect\"\ntoken_file = \"{}\"\n\
         ca_file = \"{}\"\nprofile = \"plain\"\nprincipal = \"alice\"\n",
        token_file.display(),
        cert_file.display()
    );
    let gw = Gateway::start(&policy(&alice), &relay);

    let mut ws = spec_runtime(&listener, &acceptor).await;
    let hello = next_text(&mut ws).await;
    assert_eq!(hello["type"], "hello", "{hello}");
    assert_eq!(hello["protocol"], "ya-environment-relay.v1");
    assert_eq!(hello["principal"], "alice");
    let send = |frame: Value| Message::Text(frame.to_string().into());
    ws.send(send(json!({"type": "event", "event": "relay.accepted",
                        "payload": {"connection_id": "plain_conn", "accepted_capabilities": ["shell"]}})))
        .await
        .unwrap();
    ws.send(send(
        json!({"type": "request", "id": "req_1", "method": "shell.exec",
                        "params": {"command": ["printf", "plain and simple"]}}),
    ))
    .await
    .unwrap();
    let response = loop {
        let frame = next_text(&mut ws).await;
        if frame["type"] == "response" {
            break frame;
        }
    };
    assert_eq!(response["id"], "req_1");
    assert_eq!(response["result"]["exit_code"], 0, "{response}");
    assert_eq!(response["result"]["stdout"], "plain and simple");

    // Every entry of the session says it was plain.
    let entries = gw.audit_entries();
    let entry = entries
        .iter()
        .find(|e| e.record.request_id.as_deref() == Some("req_1") && e.record.status.is_some())
        .expect("the request's entry");
    let peer = entry.record.peer.as_deref().unwrap_or("");
    assert!(peer.starts_with("plain wss://localhost:"), "{peer}");
    assert_eq!(entry.record.principal.as_deref(), Some("alice"));
    assert_eq!(entry.record.connection_id.as_deref(), Some("plain_conn"));

    // A persistent process, and a request still running when the runtime
    // goes away.
    let script = "printf one; sleep 0.3; printf two; sleep 30";
    ws.send(send(
        json!({"type": "request", "id": "start_1", "method": "shell.start",
                        "params": {"command": ["sh", "-c", script]}}),
    ))
    .await
    .unwrap();
    let process_id = loop {
        let frame = next_text(&mut ws).await;
        if frame["type"] == "stream" && frame["event"] == "started" {
            break frame["data"]["process_id"].clone();
        }
    };
    ws.send(send(
        json!({"type": "request", "id": "left-running", "method": "shell.exec",
                        "params": {"command": ["sleep", "20"]}}),
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(ws);

    // The runtime is back; so is the gateway, and the process replays
    // exactly from sequence 0, as stream frames.
    let mut ws = spec_runtime(&listener, &acceptor).await;
    assert_eq!(next_text(&mut ws).await["type"], "hello");
    ws.send(send(json!({"type": "event", "event": "relay.accepted",
                        "payload": {"connection_id": "plain_conn_2", "accepted_capabilities": ["shell"]}})))
        .await
        .unwrap();
    ws.send(send(
        json!({"type": "request", "id": "attach_1", "method": "shell.attach",
                        "params": {"process_id": process_id, "from_seq": 0}}),
    ))
    .await
    .unwrap();
    let mut replayed = String::new();
    while !replayed.contains("onetwo") {
        let frame = next_text(&mut ws).await;
        if frame["type"] == "stream" && frame["event"] == "stdout" {
            assert_eq!(frame["sequence"], replayed.len(), "{frame}");
            replayed.push_str(frame["data"].as_str().unwrap());
        }
    }
    assert!(replayed.starts_with("onetwo"), "{replayed:?}");
    lost_request(&gw);
}

#[tokio::test]
async fn hostile_endpoints_are_failures_to_retry_not_a_crash() {
    use futures_util::SinkExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let relay = format!(
        "[limits]\nheader_timeout = \"1s\"\nhandshake_timeout = \"2s\"\n\
         [[relay]]\nurl = \"ws://127.0.0.1:{port}/api/v1/relay/connect\"\ntoken_file = \"{}\"\n",
        token_file.display()
    );
    let gw = Gateway::start(&policy(&alice), &relay);
    let mut buffer = [0u8; 4096];
    // Garbage instead of an HTTP answer; a 500; an upgrade that never
    // comes; an upgrade, then a text message where the Noise handshake's
    // first binary message belongs.
    let (mut tcp, _) = listener.accept().await.unwrap();
    let _ = tcp.read(&mut buffer).await;
    tcp.write_all(b"\x00\xffgarbage\r\n\r\n").await.unwrap();
    drop(tcp);
    let (mut tcp, _) = listener.accept().await.unwrap();
    let _ = tcp.read(&mut buffer).await;
    tcp.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    drop(tcp);
    let (mut stalled, _) = listener.accept().await.unwrap();
    let _ = stalled.read(&mut buffer).await;
    let (tcp, _) = listener.accept().await.unwrap();
    drop(stalled);
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    ws.send(tokio_tungstenite::tungstenite::Message::Text("{}".into()))
        .await
        .unwrap();
    // A flood of binary garbage where the handshake belongs: the first
    // message fails it, and the connection is dropped, not read on.
    let (tcp, _) = listener.accept().await.unwrap();
    let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
    let garbage = vec![0xa5u8; 60_000];
    for _ in 0..2_000 {
        if ws
            .send(tokio_tungstenite::tungstenite::Message::Binary(
                garbage.clone().into(),
            ))
            .await
            .is_err()
        {
            break;
        }
    }
    drop(ws);
    // And still it comes back, to a runtime that is one.
    let runtime =
        ProviderListener::from_std(listener.into_std().unwrap(), Zeroizing::new(TOKEN.into()))
            .unwrap();
    let client = next_gateway(&runtime, options(&gw, &alice)).await;
    client
        .request("file.list", json!({"root_id": "main", "path": ""}))
        .await
        .unwrap();

    let entries = gw.audit_entries();
    let failed: Vec<String> = entries
        .iter()
        .filter(|e| e.record.event.as_deref() == Some("relay_failed"))
        .filter_map(|e| e.record.detail.clone())
        .collect();
    for says in ["upgrade: ", "answered 500", "upgrade: no answer in time"] {
        assert!(
            failed.iter().any(|d| d.contains(says)),
            "no failure saying {says:?}: {failed:?}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e.record.event.as_deref() == Some("handshake_failed")),
        "the text message in the handshake was not a handshake failure"
    );
}

#[tokio::test]
async fn doctor_checks_each_endpoint_as_the_daemon_connects() {
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (dir.path().join("good.token"), dir.path().join("bad.token"));
    std::fs::write(&good, TOKEN).unwrap();
    std::fs::write(&bad, "wrong").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
    let runtime = ProviderListener::bind("127.0.0.1:0", Zeroizing::new(TOKEN.into()))
        .await
        .unwrap();
    let port = runtime.local_addr().unwrap().port();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = |port: u16| format!("ws://127.0.0.1:{port}/api/v1/relay/connect");
    let relays = format!(
        "[[relay]]\nurl = \"{}\"\ntoken_file = \"{}\"\n[[relay]]\nurl = \"{}\"\ntoken_file = \"{}\"\n\
         [[relay]]\nurl = \"{}\"\ntoken_file = \"{}\"\n",
        url(port),
        good.display(),
        url(port),
        bad.display(),
        url(closed),
        good.display()
    );
    let gw = Gateway::start(&policy(&alice), &relays);
    let key = gw.key;
    // The listener answers the daemon's own dials and the doctor's alike:
    // keep taking connections while the doctor runs.
    let accepting = tokio::spawn(async move {
        loop {
            let _ = runtime
                .accept(ClientOptions::new(
                    "ws://unused",
                    key,
                    StaticKeypair::generate().unwrap(),
                ))
                .await;
        }
    });
    let out = tokio::task::spawn_blocking({
        let config = gw.dir.join("portcullis.toml");
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
                .args(["doctor", "--json", "--config"])
                .arg(config)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    accepting.abort();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = report["checks"].as_array().unwrap();
    let relay_checks: Vec<&Value> = checks
        .iter()
        .filter(|c| c["check"].as_str().unwrap_or("").starts_with("relay "))
        .collect();
    // The bad token's file is readable by others: said, as a warning.
    let token_warnings: Vec<&&Value> = relay_checks
        .iter()
        .filter(|c| c["check"].as_str().unwrap().ends_with(" token"))
        .collect();
    assert_eq!(token_warnings.len(), 1, "{report}");
    assert!(
        token_warnings[0]["detail"]
            .as_str()
            .unwrap()
            .contains("bad.token")
    );
    let relay_checks: Vec<&Value> = relay_checks
        .into_iter()
        .filter(|c| !c["check"].as_str().unwrap().ends_with(" token"))
        .collect();
    assert_eq!(relay_checks.len(), 3, "{report}");
    assert_eq!(relay_checks[0]["status"], "ok", "{report}");
    assert_eq!(relay_checks[1]["status"], "fail");
    assert!(
        relay_checks[1]["detail"].as_str().unwrap().contains("401"),
        "{report}"
    );
    assert_eq!(relay_checks[2]["status"], "fail");
    assert!(
        relay_checks[2]["detail"]
            .as_str()
            .unwrap()
            .starts_with("TCP: "),
        "{report}"
    );
}

#[tokio::test]
async fn every_verb_takes_a_gateway_that_dials_in_with_listen_urls() {
    let dir = tempfile::tempdir().unwrap();
    let identity_file = dir.path().join("alice.key");
    let alice = portcullis_wire::keyfile::generate(&identity_file, false).unwrap();
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gw = gateway_dialing(&alice, port, &token_file);
    std::fs::write(gw.dir.join("workspace/note.txt"), "dialed in").unwrap();
    let verb = |args: &[&str]| {
        let (key, identity, token) = (
            gw.key.to_base64(),
            identity_file.clone(),
            token_file.clone(),
        );
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let url = format!("listen://127.0.0.1:{port}");
        tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"));
            command
                .arg(&args[0])
                .arg(&url)
                .args(["--gateway-key", &key, "--identity"])
                .arg(&identity)
                .arg("--relay-token-file")
                .arg(&token)
                .args(&args[1..]);
            (command.output().unwrap(), started.elapsed())
        })
    };
    let (out, _) = verb(&["exec", "--", "printf", "by hand"]).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "by hand");
    // The next verb is answered at once: a runtime that proved its key
    // resets the gateway's backoff.
    let (out, took) = verb(&["cat", "main:note.txt"]).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "dialed in");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn a_pinned_certificate_is_the_only_one_accepted() {
    use sha2::Digest as _;
    let alice = StaticKeypair::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (_, der, acceptor) = tls_endpoint();
    let token_file = dir.path().join("relay.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let pin = hex::encode(sha2::Sha256::digest(&der));
    for (pinned, accepted) in [(pin.clone(), true), ("ab".repeat(32), false)] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let relay = format!(
            "[[relay]]\nurl = \"wss://localhost:{port}/api/v1/relay/connect\"\ntoken_file = \"{}\"\n\
             cert_sha256 = \"{pinned}\"\nprofile = \"plain\"\nprincipal = \"alice\"\n",
            token_file.display()
        );
        let gw = Gateway::start(&policy(&alice), &relay);
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await;
        assert_eq!(tls.is_ok(), accepted, "pin {pinned}");
        if !accepted {
            let status = status_saying(&gw, "not the pinned one").await;
            assert!(status.contains("not the pinned one"), "{status}");
        }
    }
}

//! The gateway end to end: the real binary on 127.0.0.1, the real client
//! library, the real protocol. Covers authentication, the hello, the
//! request rules, reload and revocation, SIGTERM, and hostile input.

mod common;

use std::time::Duration;

use common::{Gateway, closed_by_gateway, key_b64};
use futures_util::SinkExt;
use portcullis_client::ClientError;
use portcullis_crypto::{Error as NoiseError, StaticKeypair};
use portcullis_wire::frame::{ErrorCode, RequestId};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::Message;

const SECOND: Duration = Duration::from_secs(1);

// sha256("e2e-token"), computed with Python hashlib.
const TOKEN: &str = "e2e-token";
const TOKEN_HASH: &str = "sha256:cc318af2129b329b084ebdf17f2608bf3d8a7da6082f345cebf205833876fd88";

struct Keys {
    alice: StaticKeypair,
    bob: StaticKeypair,
    stranger: StaticKeypair,
}

fn keys() -> Keys {
    Keys {
        alice: StaticKeypair::generate().unwrap(),
        bob: StaticKeypair::generate().unwrap(),
        stranger: StaticKeypair::generate().unwrap(),
    }
}

/// alice: files (rw) and resources; bob: shell only; carol: by token,
/// resources; dave: disabled.
fn policy(k: &Keys, alice_grant: bool) -> String {
    let alice_grant = if alice_grant {
        "[[grant]]\nid = \"alice-files\"\nprincipals = [\"alice\"]\nfileops = { main = \"rw\" }\nresources = {}\n"
    } else {
        ""
    };
    format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[principal]]
id = "bob"
public_key = "{bob}"

[[principal]]
id = "carol"
token_hash = "{token_hash}"

[[principal]]
id = "dave"
public_key = "{stranger}"
disabled = true

[[root]]
id = "main"
path = "WORKSPACE"
virtual_path = "/workspace/main"

{alice_grant}
[[grant]]
id = "bob-shell"
principals = ["bob"]
shell = {{ commands = ["ls"] }}

[[grant]]
id = "carol-resources"
principals = ["carol"]
resources = {{}}
"#,
        alice = key_b64(&k.alice),
        bob = key_b64(&k.bob),
        stranger = key_b64(&k.stranger),
        token_hash = TOKEN_HASH,
    )
}

fn remote_code(result: Result<serde_json::Value, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Remote(error)) => error.code,
        other => panic!("expected an error response, got {other:?}"),
    }
}

#[tokio::test]
async fn hello_is_narrowed_to_the_principals_grants() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");

    let alice = gw.connect(&k.alice).await.unwrap();
    let hello = alice.hello();
    assert_eq!(hello.protocol, "ya-environment-relay.v1");
    assert_eq!(hello.principal.as_deref(), Some("alice"));
    assert_eq!(
        hello.client_id, hello.provider_id,
        "the spec's client is the provider"
    );
    let mut offered = alice.offered();
    offered.sort();
    assert_eq!(offered, ["fileops", "resources"]);
    assert_eq!(
        hello.capabilities["fileops"]["roots"][0]["virtual_path"],
        "/workspace/main"
    );
    assert_eq!(hello.capabilities["fileops"]["roots"][0]["mode"], "rw");
    assert!(
        !hello.capabilities["fileops"]
            .to_string()
            .contains(&gw.dir.display().to_string()),
        "host paths never leave"
    );
    assert_eq!(alice.gateway_info()["protocol"], "ya-environment-relay.v1");

    let bob = gw.connect(&k.bob).await.unwrap();
    assert_eq!(bob.offered(), ["shell"]);

    alice.accept_all().await.unwrap();
    assert_eq!(
        alice.request("resource.list", json!({})).await.unwrap(),
        json!({"resources": []})
    );
    assert!(alice.ping().await.unwrap() < 5 * SECOND);
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn the_client_refuses_a_gateway_with_another_key() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let mut options =
        portcullis_client::ClientOptions::new(&gw.url, *k.stranger.public(), k.alice.clone());
    options.token = Some(zeroize::Zeroizing::new(TOKEN.into()));
    let err = portcullis_client::Client::connect(options)
        .await
        .err()
        .expect("must fail");
    assert!(
        matches!(
            err,
            ClientError::Channel(portcullis_wire::channel::ChannelError::Noise(
                NoiseError::RemoteKeyMismatch { .. }
            ))
        ),
        "{err}"
    );
    // Message 3 (with the token) was never sent, so the gateway saw no session.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!gw.log().contains("session authenticated"), "{}", gw.log());
    gw.assert_requests_audited(0);
}

#[tokio::test]
async fn unknown_keys_tokens_and_disabled_principals_are_refused() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    for (who, result) in [
        (
            "an unknown key",
            gw.connect(&StaticKeypair::generate().unwrap()).await,
        ),
        ("a disabled principal", gw.connect(&k.stranger).await),
        (
            "an unknown token",
            gw.connect_with_token("wrong-token").await,
        ),
    ] {
        let err = result.err().unwrap_or_else(|| panic!("{who} was let in"));
        assert!(
            err.to_string().contains("authentication failed"),
            "{who}: {err}"
        );
    }
    let carol = gw.connect_with_token(TOKEN).await.unwrap();
    assert_eq!(carol.hello().principal.as_deref(), Some("carol"));
    assert!(
        gw.wait_log("authentication refused: unknown token", SECOND)
            .await
    );
    assert!(!gw.log().contains(TOKEN), "the token must never be logged");
    gw.assert_requests_audited(0);
}

#[tokio::test]
async fn request_rules_before_and_after_relay_accepted() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let alice = gw.connect(&k.alice).await.unwrap();

    assert_eq!(
        remote_code(alice.request("resource.list", json!({})).await),
        ErrorCode::InvalidRequest
    );

    alice.accept(&["fileops"]).await.unwrap();
    assert_eq!(
        remote_code(alice.request("resource.list", json!({})).await),
        ErrorCode::CapabilityUnavailable,
        "resources were granted but not accepted"
    );
    assert_eq!(
        remote_code(alice.request("file.teleport", json!({})).await),
        ErrorCode::UnknownMethod
    );
    assert_eq!(
        remote_code(alice.request("computer.see", json!({})).await),
        ErrorCode::CapabilityUnavailable
    );
    assert_eq!(
        remote_code(alice.request("file.read", json!({"root_id": 1})).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        remote_code(
            alice
                .request("file.read", json!({"root_id": "main", "path": "a"}))
                .await
        ),
        ErrorCode::NotFound,
        "granted and served; there is no such file"
    );
    assert_eq!(
        remote_code(alice.request("tool.list", json!({})).await),
        ErrorCode::PermissionDenied,
        "served, but alice holds no tools grant"
    );

    // An id may be reused once its request has finished.
    alice.accept_all().await.unwrap();
    let id = RequestId::new("same").unwrap();
    let first = alice
        .start_with_id(id.clone(), "resource.list", json!({}))
        .await
        .unwrap();
    first.response().await.unwrap();
    let again = alice
        .start_with_id(id, "resource.list", json!({}))
        .await
        .unwrap();
    again.response().await.unwrap();
    gw.assert_requests_audited(9);
}

#[tokio::test]
async fn a_malformed_request_is_answered_by_id() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let alice = gw.connect(&k.alice).await.unwrap();
    alice.accept_all().await.unwrap();
    // The method name is invalid, so the frame does not decode; the gateway
    // still reads its id and answers that request.
    let pending = alice
        .start_with_id(RequestId::new("bad-1").unwrap(), "Bad.Method", json!({}))
        .await;
    let err = pending.unwrap().response().await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Remote(e) if e.code == ErrorCode::InvalidRequest && e.message.contains("method")),
        "{err}"
    );
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn a_reload_that_removes_a_grant_closes_the_session_and_others_hear_of_changes() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let alice = gw.connect(&k.alice).await.unwrap();
    alice.accept_all().await.unwrap();
    let bob = gw.connect(&k.bob).await.unwrap();
    bob.accept_all().await.unwrap();

    // An invalid file keeps the old policy.
    std::fs::write(gw.dir.join("policy.toml"), "this is = not a policy").unwrap();
    gw.signal("HUP");
    assert!(
        gw.wait_log("policy reload failed", 5 * SECOND).await,
        "{}",
        gw.log()
    );
    alice.request("resource.list", json!({})).await.unwrap();

    // Remove alice's grant and widen bob's: alice is closed, bob is told.
    let widened = policy(&k, false).replace(
        r#"shell = { commands = ["ls"] }"#,
        "shell = { commands = [\"ls\"] }\nresources = {}",
    );
    gw.write_policy(&widened);
    gw.signal("HUP");
    let reason = tokio::time::timeout(5 * SECOND, alice.closed())
        .await
        .expect("alice's session was not closed");
    assert!(reason.contains("revoked"), "{reason}");
    let event = bob.next_event(5 * SECOND).await.expect("bob heard nothing");
    assert_eq!(event.event, "capability.updated");
    // The spec's payload, and the whole new set beside it.
    assert_eq!(
        event.payload["capability"], "resources",
        "{}",
        event.payload
    );
    assert_eq!(event.payload["state"], "available", "{}", event.payload);
    assert!(
        event.payload["capabilities"].get("resources").is_some(),
        "{}",
        event.payload
    );

    // And alice cannot come back.
    let err = gw
        .connect(&k.alice)
        .await
        .err()
        .expect("alice has no grants");
    assert!(
        err.to_string().contains("authentication failed") || matches!(err, ClientError::Channel(_)),
        "{err}"
    );
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn sigterm_closes_sessions_and_exits_cleanly() {
    let k = keys();
    let mut gw = Gateway::start(&policy(&k, true), "[limits]\nshutdown_grace = \"2s\"");
    let alice = gw.connect(&k.alice).await.unwrap();
    alice.accept_all().await.unwrap();
    gw.signal("TERM");
    let reason = tokio::time::timeout(5 * SECOND, alice.closed())
        .await
        .expect("session not closed");
    assert!(reason.contains("shutting down"), "{reason}");
    let status = gw.wait_exit(10 * SECOND).expect("gateway did not exit");
    assert!(status.success(), "{status}");
    assert!(gw.log().contains("stopped"));
}

#[tokio::test]
async fn a_text_message_closes_the_connection() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let (mut ws, _) = gw.raw(&k.alice).await;
    ws.send(Message::Text("{\"type\":\"ping\"}".into()))
        .await
        .unwrap();
    assert!(closed_by_gateway(&mut ws, 5 * SECOND).await);
    still_serves(&gw, &k).await;
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn garbage_and_flipped_bits_after_the_handshake_close_the_connection() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");

    let (mut ws, _) = gw.raw(&k.alice).await;
    ws.send(Message::Binary(vec![0x42; 300].into()))
        .await
        .unwrap();
    assert!(closed_by_gateway(&mut ws, 5 * SECOND).await, "garbage");

    let (mut ws, mut transport) = gw.raw(&k.alice).await;
    let mut record = vec![0x01];
    record.extend_from_slice(br#"{"type":"ping","id":"p"}"#);
    let mut sealed = transport.seal(&record).unwrap();
    sealed[5] ^= 0x10;
    ws.send(Message::Binary(sealed.into())).await.unwrap();
    assert!(closed_by_gateway(&mut ws, 5 * SECOND).await, "flipped bit");
    assert!(
        gw.wait_log("decryption failed", 5 * SECOND).await,
        "{}",
        gw.log()
    );

    // A replayed record is refused the same way.
    let (mut ws, mut transport) = gw.raw(&k.alice).await;
    let sealed = transport.seal(&record).unwrap();
    ws.send(Message::Binary(sealed.clone().into()))
        .await
        .unwrap();
    ws.send(Message::Binary(sealed.into())).await.unwrap();
    assert!(closed_by_gateway(&mut ws, 5 * SECOND).await, "replay");
    still_serves(&gw, &k).await;
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn a_ten_megabyte_message_is_refused_without_harm() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let (mut ws, _) = gw.raw(&k.alice).await;
    let huge = vec![0u8; 10 * 1024 * 1024];
    // The gateway may close while we are still sending; either way it must close.
    let _ = ws.send(Message::Binary(huge.into())).await;
    assert!(closed_by_gateway(&mut ws, 10 * SECOND).await);
    still_serves(&gw, &k).await;
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn five_hundred_idle_connections_do_not_block_a_real_client() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "[limits]\nheader_timeout = \"30s\"");
    let mut idle = Vec::new();
    for i in 0..500 {
        let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        if i % 2 == 0 {
            // Half of them send half a request head and stall.
            tcp.write_all(b"GET /api/v1/relay/connect HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        idle.push(tcp);
    }
    let started = std::time::Instant::now();
    still_serves(&gw, &k).await;
    assert!(
        started.elapsed() < 5 * SECOND,
        "a real client waited {:?}",
        started.elapsed()
    );
    gw.assert_requests_audited(1);
    drop(idle);
}

#[tokio::test]
async fn health_and_other_paths() {
    let k = keys();
    let gw = Gateway::start(&policy(&k, true), "");
    let get = |path: &'static str| {
        let addr = gw.addr;
        async move {
            let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tcp.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut tcp, &mut out)
                .await
                .unwrap();
            out
        }
    };
    let health = get("/healthz").await;
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    assert!(get("/api/v1/other").await.starts_with("HTTP/1.1 404"));
    // The relay path without an upgrade is a bad request, not a hang.
    assert!(
        get("/api/v1/relay/connect")
            .await
            .starts_with("HTTP/1.1 400")
    );
    gw.assert_requests_audited(0);
}

/// A normal client still gets in and is served.
async fn still_serves(gw: &Gateway, k: &Keys) {
    let alice = gw
        .connect(&k.alice)
        .await
        .expect("a normal client must still connect");
    alice.accept_all().await.unwrap();
    alice
        .request("resource.list", json!({}))
        .await
        .expect("and be served");
}

#[tokio::test]
async fn sessions_per_principal_and_connections_are_capped() {
    let k = keys();
    let gw = Gateway::start(
        &policy(&k, true),
        "[limits]\nmax_sessions_per_principal = 2\nmax_connections = 8",
    );
    let first = gw.connect(&k.alice).await.unwrap();
    let _second = gw.connect(&k.alice).await.unwrap();
    let third = gw
        .connect(&k.alice)
        .await
        .err()
        .expect("a third session for alice");
    assert!(third.to_string().contains("too many sessions"), "{third}");
    // Another principal is not affected, and a closed session frees its place.
    gw.connect(&k.bob).await.expect("bob has his own allowance");
    drop(first);
    let mut admitted = None;
    for _ in 0..50 {
        if let Ok(client) = gw.connect(&k.alice).await {
            admitted = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted.is_some(), "alice's place was not freed");

    // Fill the remaining connection permits with idle sockets: the next
    // connection is closed at once, and served again once they go away.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(tokio::net::TcpStream::connect(gw.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        gw.connect(&k.bob).await.is_err(),
        "max_connections must refuse"
    );
    drop(idle);
    let mut served = false;
    for _ in 0..50 {
        if gw.connect(&k.bob).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "permits were not released");
    gw.assert_requests_audited(0);
}

/// What a raw connection receives until the gateway closes it (within
/// `within`): the records' plaintexts, and the close frame's reason.
async fn until_closed(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    transport: &mut portcullis_crypto::Transport,
    within: Duration,
) -> (Vec<String>, Option<String>) {
    use futures_util::StreamExt;
    let mut records = Vec::new();
    let closed = tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(sealed))) => {
                    let plain = transport.open(&sealed).unwrap();
                    records.push(String::from_utf8_lossy(&plain).into_owned());
                }
                Some(Ok(Message::Close(frame))) => {
                    return frame.map(|f| f.reason.to_string());
                }
                None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    (
        records,
        closed.expect("the gateway did not close the connection"),
    )
}

#[tokio::test]
async fn a_session_that_never_accepts_is_closed_at_the_handshake_timeout() {
    let k = keys();
    let gw = Gateway::start(
        &policy(&k, true),
        "[limits]\nhandshake_timeout = \"1s\"\nidle_timeout = \"60s\"",
    );
    let (mut ws, mut transport) = gw.raw(&k.alice).await;
    let (_, reason) = until_closed(&mut ws, &mut transport, 10 * SECOND).await;
    assert_eq!(reason.as_deref(), Some("no relay.accepted in time"));
    still_serves(&gw, &k).await;
}

#[tokio::test]
async fn a_silent_session_is_pinged_and_then_closed_as_idle() {
    let k = keys();
    let gw = Gateway::start(
        &policy(&k, true),
        "[limits]\nhandshake_timeout = \"60s\"\nidle_timeout = \"1s\"",
    );
    let (mut ws, mut transport) = gw.raw(&k.alice).await;
    let (records, reason) = until_closed(&mut ws, &mut transport, 10 * SECOND).await;
    assert_eq!(reason.as_deref(), Some("idle"));
    let pings: Vec<_> = records
        .iter()
        .filter(|r| r.contains("\"ping\"") && r.contains("idle-"))
        .collect();
    assert_eq!(pings.len(), 1, "{records:?}");

    // A peer that answers the ping stays connected (the client library
    // answers pings itself): still open well after three idle periods.
    let client = gw.connect(&k.alice).await.unwrap();
    client.accept_all().await.unwrap();
    tokio::time::sleep(4 * SECOND).await;
    client
        .request("file.stat", json!({"root_id": "main", "path": "."}))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_grant_that_expires_mid_session_ends_it() {
    let k = keys();
    let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4);
    let policy = policy(&k, false).replace(
        "[[grant]]\nid = \"bob-shell\"",
        &format!(
            "[[grant]]\nid = \"alice-files\"\nprincipals = [\"alice\"]\nfileops = {{ main = \"rw\" }}\n\
             expires_at = \"{expires}\"\n\n[[grant]]\nid = \"bob-shell\""
        ),
    );
    let gw = Gateway::start(&policy, "");
    let client = gw.connect(&k.alice).await.unwrap();
    client.accept_all().await.unwrap();
    client
        .request("file.stat", json!({"root_id": "main", "path": "."}))
        .await
        .unwrap();
    let reason = tokio::time::timeout(20 * SECOND, client.closed())
        .await
        .expect("the session outlived its only grant");
    assert!(reason.contains("revoked"), "{reason}");
    assert!(jiff::Timestamp::now() >= expires);
}

#[tokio::test]
async fn limits_too_long_for_the_clock_serve_as_very_long() {
    let k = keys();
    let huge = "\"200000000000000d\"";
    let gw = Gateway::start(
        &policy(&k, true),
        &format!(
            "[limits]\nhandshake_timeout = {huge}\nidle_timeout = {huge}\nshutdown_grace = {huge}"
        ),
    );
    still_serves(&gw, &k).await;
    still_serves(&gw, &k).await;
}

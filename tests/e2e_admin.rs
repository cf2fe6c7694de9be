//! The admin socket through the real CLI: status, sessions and kill, policy
//! reload, and the emergency stop surviving a restart.

mod common;

use std::time::Duration;

use common::{Gateway, key_b64};
use portcullis_client::{Client, ClientError, ClientOptions};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use serde_json::{Value, json};

const SECOND: Duration = Duration::from_secs(1);

fn policy(alice: &StaticKeypair, granted: bool) -> String {
    let grant = if granted {
        "[[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nresources = {}\n"
    } else {
        ""
    };
    format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n\n{grant}",
        key_b64(alice)
    )
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The name of the next event the client hears within five seconds.
async fn next_event_name(client: &portcullis_client::Client) -> Option<String> {
    client.next_event(5 * SECOND).await.map(|e| e.event)
}

fn json_of(output: &std::process::Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", stdout(output)))
}

#[tokio::test]
async fn status_sessions_and_kill() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, true), "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();

    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(gw.admin_socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(
        mode, 0o660,
        "the admin socket is for its owner and group only"
    );

    let status = gw.cli(&["status", "--json"]);
    assert!(status.status.success(), "{status:?}");
    let status = json_of(&status);
    assert_eq!(
        (status["sessions"].as_u64(), status["paused"].as_bool()),
        (Some(1), Some(false))
    );
    assert_eq!(
        status["instance_id"].as_str(),
        client.hello().instance_id.as_deref()
    );

    // The daemon's configuration names the socket, as for `audit`; a
    // configuration that does not load is said so.
    let by_config = json_of(&gw.cli_config(&["status", "--json"]));
    assert_eq!(by_config["instance_id"], status["instance_id"]);
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["status", "--config", "/nonexistent/portcullis.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/portcullis.toml"),
        "{missing:?}"
    );

    let listed = json_of(&gw.cli(&["sessions", "--json"]));
    let id = listed["sessions"][0]["id"].as_u64().unwrap();
    assert_eq!(listed["sessions"][0]["principal"], "alice");
    let table = stdout(&gw.cli(&["sessions"]));
    assert!(
        table.contains("alice") && table.contains("PRINCIPAL"),
        "{table}"
    );

    let kill = gw.cli(&["sessions", "kill", &id.to_string()]);
    assert!(kill.status.success(), "{kill:?}");
    let reason = tokio::time::timeout(5 * SECOND, client.closed())
        .await
        .unwrap();
    assert!(reason.contains("operator"), "{reason}");
    assert!(!gw.cli(&["sessions", "kill", "999"]).status.success());
    gw.assert_requests_audited(0);
}

#[tokio::test]
async fn reload_through_the_admin_socket() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, true), "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();

    std::fs::write(
        gw.dir.join("policy.toml"),
        "[[principal]]\nid = \"alice\"\nbogus = 1\n",
    )
    .unwrap();
    let failed = gw.cli(&["policy", "reload"]);
    assert_eq!(failed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("policy.toml:3:1: unknown field `bogus`"),
        "{stderr}"
    );
    client
        .request("resource.list", json!({}))
        .await
        .expect("the old policy still applies");

    gw.write_policy(&policy(&alice, false));
    let reloaded = gw.cli(&["policy", "reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    assert!(stdout(&reloaded).starts_with("policy reloaded"));
    let reason = tokio::time::timeout(5 * SECOND, client.closed())
        .await
        .unwrap();
    assert!(reason.contains("revoked"), "{reason}");
    gw.assert_requests_audited(1);
}

#[tokio::test]
async fn a_soft_pause_refuses_new_requests_and_survives_a_restart() {
    let alice = StaticKeypair::generate().unwrap();
    let mut gw = Gateway::start(&policy(&alice, true), "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();

    assert!(gw.cli(&["pause", "--soft"]).status.success());
    assert_eq!(
        next_event_name(&client).await.as_deref(),
        Some("provider.paused")
    );
    let refused = client.request("resource.list", json!({})).await;
    assert!(
        matches!(&refused, Err(ClientError::Remote(e)) if e.code == ErrorCode::PolicyBlocked && e.message.contains("paused")),
        "{refused:?}"
    );
    drop(client);

    gw.restart();
    assert_eq!(
        json_of(&gw.cli(&["status", "--json"]))["paused"],
        true,
        "the pause must survive a restart"
    );
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    assert!(client.request("resource.list", json!({})).await.is_err());

    assert!(gw.cli(&["resume"]).status.success());
    assert_eq!(
        next_event_name(&client).await.as_deref(),
        Some("provider.resumed")
    );
    client
        .request("resource.list", json!({}))
        .await
        .expect("served again after resume");
    gw.assert_requests_audited(3);
}

#[tokio::test]
async fn the_admin_cli_explains_an_unreachable_daemon() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["status", "--admin-socket", "/nonexistent/admin.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the daemon"));
}

/// The value of the sample `name` (with its labels) in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_count_sessions_requests_and_failed_handshakes() {
    use futures_util::SinkExt;
    let alice = StaticKeypair::generate().unwrap();
    let scrape = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let scrape_addr = scrape.local_addr().unwrap();
    drop(scrape);
    let gw = Gateway::start(
        &policy(&alice, true),
        &format!("metrics_listen = \"{scrape_addr}\""),
    );
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    for _ in 0..3 {
        client.request("resource.list", json!({})).await.unwrap();
    }
    // A method nobody serves, three times under different names: one label.
    for name in ["no.such", "made.up", "x"] {
        let refused = client.request(name, json!({})).await;
        assert!(
            matches!(refused, Err(ClientError::Remote(_))),
            "{refused:?}"
        );
    }
    // Garbage instead of handshake message 1.
    let tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let url = format!("{}/api/v1/relay/connect", gw.url);
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tcp)
        .await
        .unwrap();
    let garbage = tokio_tungstenite::tungstenite::Message::Binary(vec![7u8; 40].into());
    let _ = ws.send(garbage).await;
    assert!(common::closed_by_gateway(&mut ws, 5 * SECOND).await);

    let deadline = std::time::Instant::now() + 5 * SECOND;
    let text = loop {
        let out = gw.cli(&["metrics"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = stdout(&out);
        // The security event is counted by a task; wait for it.
        if sample(&text, "portcullis_handshake_failures_total") == Some(1.0)
            || std::time::Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        text.contains("# TYPE portcullis_requests_total counter"),
        "{text}"
    );
    assert_eq!(sample(&text, "portcullis_sessions"), Some(1.0), "{text}");
    assert_eq!(
        sample(
            &text,
            "portcullis_requests_total{method=\"resource.list\",decision=\"allowed\"}"
        ),
        Some(3.0),
        "{text}"
    );
    let unknown: f64 = text
        .lines()
        .filter(|l| l.starts_with("portcullis_requests_total{method=\"unknown\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(unknown, 3.0, "{text}");
    assert!(
        !text.contains("no.such") && !text.contains("made.up"),
        "{text}"
    );
    assert_eq!(
        sample(&text, "portcullis_handshake_failures_total"),
        Some(1.0),
        "{text}"
    );
    let commits = sample(&text, "portcullis_audit_commit_seconds_count").unwrap_or(0.0);
    assert!(commits >= 1.0, "{text}");
    assert_eq!(
        sample(&text, "portcullis_audit_commit_seconds_bucket{le=\"+Inf\"}"),
        Some(commits),
        "{text}"
    );
    assert!(
        sample(&text, "portcullis_audit_entries_total").unwrap_or(0.0) >= 6.0,
        "{text}"
    );

    // The same text over plain HTTP on metrics_listen.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(scrape_addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut scraped = String::new();
    tcp.read_to_string(&mut scraped).await.unwrap();
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(scraped.contains("text/plain; version=0.0.4"), "{scraped}");
    assert!(scraped.contains("\nportcullis_sessions 1\n"), "{scraped}");
}

/// A client that reads no events while they arrive loses the newest ones
/// past its queue, is told how many where they would have stood, and its
/// requests are answered meanwhile (the reader never waits for it).
#[tokio::test]
async fn a_full_event_queue_reports_what_it_lost_in_place() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, true), "");
    let mut options = ClientOptions::new(&gw.url, gw.key, alice.clone());
    options.event_queue = 2;
    let client = Client::connect(options).await.unwrap();
    client.accept_all().await.unwrap();
    for _ in 0..5 {
        assert!(gw.cli(&["pause", "--soft"]).status.success());
        assert!(gw.cli(&["resume"]).status.success());
    }
    // Ten events sent, none read: a request is still answered.
    client
        .request("resource.list", json!({}))
        .await
        .expect("answered while events were unread");
    let mut seen = Vec::new();
    while let Some(event) = client.next_event(Duration::from_millis(300)).await {
        seen.push((event.event, event.payload["count"].as_u64()));
    }
    assert_eq!(
        seen,
        [
            ("provider.paused".to_string(), None),
            ("provider.resumed".to_string(), None),
            (portcullis_client::EVENTS_LOST.to_string(), Some(8)),
        ]
    );
    assert_eq!(client.events_lost(), 8);
    gw.assert_requests_audited(1);
}

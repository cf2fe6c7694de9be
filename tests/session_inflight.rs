//! Requests in flight: cancel, duplicate ids, the in-flight cap, draining on
//! shutdown, and revocation. No served method runs long yet, so these run the
//! gateway in-process (real listener, real WebSocket, real Noise, the real
//! client library) with a test provider plugged into `tool.call`, the
//! extension point the capability providers use.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use portcullis::config::Config;
use portcullis::provider::{Call, Method, Provider, Providers, Reply};
use portcullis::server::{self, Gateway};
use portcullis_client::{Client, ClientError, ClientOptions, StreamItem};
use portcullis_crypto::StaticKeypair;
use portcullis_policy::{Capability, Target};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Frame, Request, RequestId};
use serde_json::{Value, json};

const SECOND: Duration = Duration::from_secs(1);

/// Sleeps for `arguments.ms`, after a `progress` stream event; counts the
/// calls that were dropped (cancelled) before finishing.
struct SlowTool {
    dropped_early: Arc<AtomicUsize>,
}

struct DropWitness {
    finished: bool,
    dropped_early: Arc<AtomicUsize>,
}

impl Drop for DropWitness {
    fn drop(&mut self) {
        if !self.finished {
            self.dropped_early.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Provider for SlowTool {
    fn methods(&self) -> &'static [Method] {
        const METHODS: &[Method] = &[Method {
            start_entry: true,
            target: tool_target,
            ..Method::plain("tool.call", Capability::Tools)
        }];
        METHODS
    }

    fn call(&self, call: Call) -> Reply {
        let ms = call
            .request
            .params
            .get("arguments")
            .and_then(|a| a["ms"].as_u64())
            .unwrap_or(0);
        let witness = DropWitness {
            finished: false,
            dropped_early: self.dropped_early.clone(),
        };
        Box::pin(async move {
            // Move the whole witness in: a closure that only assigned the
            // field would capture the bool alone and drop the witness now.
            let mut witness = witness;
            let _ = call
                .stream
                .event("progress", json!({"started": true}))
                .await;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            witness.finished = true;
            Ok(json!({ "slept_ms": ms }))
        })
    }
}

fn tool_target(request: &Request) -> Result<Target, ErrorBody> {
    Ok(Target::Tool {
        name: portcullis::provider::params::string(&request.params, "name")?,
    })
}

fn policy_text(alice: &StaticKeypair, granted: bool) -> String {
    let grant = if granted {
        "[[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\ntools = { allow = [\"sleep\"] }\n"
    } else {
        ""
    };
    format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n\n{grant}\n[[tool]]\nname = \"sleep\"\ndescription = \"s\"\n\
         risk = \"low\"\napproval_policy = \"allow\"\nscript = \"sleep.rhai\"\ninput_schema = {{}}\n",
        alice.public().to_base64()
    )
}

struct Fixture {
    gateway: Arc<Gateway>,
    client: Client,
    dropped_early: Arc<AtomicUsize>,
    alice: StaticKeypair,
    /// The gateway's config, keys and store; removed with the fixture.
    _dir: tempfile::TempDir,
}

async fn fixture(max_in_flight: usize) -> Fixture {
    let alice = StaticKeypair::generate().unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("portcullis-inflight-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let config = format!(
        "listen = [\"127.0.0.1:0\"]\nkey_file = \"k\"\npolicy = \"p\"\nstate_dir = \"s\"\nadmin_socket = \"a\"\n\
         [limits]\nmax_in_flight = {max_in_flight}\nshutdown_grace = \"5s\"\n"
    );
    let config = Config::parse(&config, &dir.join("portcullis.toml")).unwrap();
    let policy = portcullis_policy::parse(&policy_text(&alice, true), "p", Path::new("/")).unwrap();
    let key = StaticKeypair::generate().unwrap();
    let gateway_key = *key.public();
    let store = portcullis_store::Store::open(&dir.join("store")).unwrap();
    let dropped_early = Arc::new(AtomicUsize::new(0));
    let providers = Providers::new().with(Arc::new(SlowTool {
        dropped_early: dropped_early.clone(),
    }));
    let audit = store.audit(None).unwrap();
    let gateway = Gateway::new(config, key, policy, audit, providers, "inflight".into());
    let gateway = Arc::new(gateway);
    let listener = server::bind(&gateway, Vec::new()).await.unwrap().remove(0);
    let url = format!("ws://{}", listener.local_addr().unwrap());
    tokio::spawn(server::serve(gateway.clone(), listener));
    let client = Client::connect(ClientOptions::new(&url, gateway_key, alice.clone()))
        .await
        .unwrap();
    client.accept_all().await.unwrap();
    Fixture {
        gateway,
        client,
        dropped_early,
        alice,
        _dir: tmp,
    }
}

fn sleep_params(ms: u64) -> Value {
    json!({ "name": "sleep", "arguments": { "ms": ms } })
}

fn code(result: Result<Value, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Remote(e)) => e.code,
        other => panic!("expected an error response, got {other:?}"),
    }
}

#[tokio::test]
async fn cancel_reaches_the_handler_and_answers_cancelled() {
    let f = fixture(8).await;
    let mut handle = f
        .client
        .start("tool.call", sleep_params(60_000))
        .await
        .unwrap();
    assert!(
        matches!(handle.next().await, Some(StreamItem::Stream { event, .. }) if event == "progress")
    );
    handle.cancel().await.unwrap();
    let result = tokio::time::timeout(5 * SECOND, handle.response())
        .await
        .expect("no answer to cancel");
    assert_eq!(code(result), ErrorCode::Cancelled);
    assert_eq!(
        f.dropped_early.load(Ordering::SeqCst),
        1,
        "the handler's work was stopped"
    );
    // The session goes on.
    assert_eq!(
        f.client
            .request("tool.call", sleep_params(1))
            .await
            .unwrap(),
        json!({"slept_ms": 1})
    );
}

#[tokio::test]
async fn a_duplicate_id_in_flight_is_refused_without_touching_the_first() {
    let f = fixture(8).await;
    let id = RequestId::new("dup").unwrap();
    let first = f
        .client
        .start_with_id(id.clone(), "tool.call", sleep_params(300))
        .await
        .unwrap();
    // Sent raw, so the client library does not take the id over.
    let params = sleep_params(1).as_object().unwrap().clone();
    f.client
        .send(Frame::Request(Request {
            id,
            method: "tool.call".into(),
            params,
            context: None,
        }))
        .await
        .unwrap();
    let event = f
        .client
        .next_event(5 * SECOND)
        .await
        .expect("no relay.error");
    assert_eq!(event.event, "relay.error");
    assert_eq!(event.payload["id"], "dup");
    assert!(
        event.payload["message"]
            .as_str()
            .unwrap()
            .contains("already in flight")
    );
    assert_eq!(
        first.response().await.unwrap(),
        json!({"slept_ms": 300}),
        "exactly one answer, the first's"
    );
}

#[tokio::test]
async fn the_in_flight_cap_refuses_the_excess_only() {
    let f = fixture(2).await;
    let a = f
        .client
        .start("tool.call", sleep_params(400))
        .await
        .unwrap();
    let b = f
        .client
        .start("tool.call", sleep_params(400))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = f.client.request("tool.call", sleep_params(1)).await;
    assert!(
        matches!(&refused, Err(ClientError::Remote(e)) if e.code == ErrorCode::ProviderError && e.message.contains("limit 2")),
        "{refused:?}"
    );
    a.response().await.unwrap();
    b.response().await.unwrap();
    f.client
        .request("tool.call", sleep_params(1))
        .await
        .expect("room again");
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish_then_closes() {
    let f = fixture(8).await;
    let running = f
        .client
        .start("tool.call", sleep_params(500))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    f.gateway.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        code(f.client.request("tool.call", sleep_params(1)).await),
        ErrorCode::RelayDisconnected
    );
    assert_eq!(
        running.response().await.unwrap(),
        json!({"slept_ms": 500}),
        "the request in flight finished"
    );
    let reason = tokio::time::timeout(5 * SECOND, f.client.closed())
        .await
        .unwrap();
    assert!(reason.contains("shutting down"), "{reason}");
    assert_eq!(f.dropped_early.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn revocation_fails_requests_in_flight_with_permission_denied() {
    let f = fixture(8).await;
    let mut running = f
        .client
        .start("tool.call", sleep_params(60_000))
        .await
        .unwrap();
    assert!(running.next().await.is_some());
    let revoked =
        portcullis_policy::parse(&policy_text(&f.alice, false), "p", Path::new("/")).unwrap();
    f.gateway.policy.send_replace(Arc::new(revoked));
    let result = tokio::time::timeout(5 * SECOND, running.response())
        .await
        .expect("no answer");
    assert_eq!(code(result), ErrorCode::PermissionDenied);
    let reason = tokio::time::timeout(5 * SECOND, f.client.closed())
        .await
        .unwrap();
    assert!(reason.contains("revoked"), "{reason}");
    assert_eq!(
        f.dropped_early.load(Ordering::SeqCst),
        1,
        "the work was stopped"
    );
}

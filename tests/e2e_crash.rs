//! Crash safety of the audit log: under concurrent requests the daemon is
//! killed with SIGKILL and restarted, 20 times (PORTCULLIS_CRASH_ROUNDS for
//! more). Every request whose response a client received must have its
//! entry, the store must reopen each time (putting back from the audit
//! journal what sled lost), and the chain must verify.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{Gateway, alice_policy};
use portcullis_crypto::StaticKeypair;
use portcullis_store::Entry;
use portcullis_wire::frame::RequestId;
use serde_json::json;
use tokio::sync::Mutex;

const TASKS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_requests_survive_sigkill() {
    let rounds: usize = std::env::var("PORTCULLIS_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let alice = StaticKeypair::generate().unwrap();
    let policy = alice_policy(&alice);
    let mut gw = Gateway::start(&policy, "[limits]\nmax_sessions_per_principal = 64");
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();

    for round in 0..rounds {
        let client = Arc::new(gw.connect(&alice).await.expect("the gateway came back"));
        client.accept_all().await.unwrap();
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let (client, acked) = (client.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                for n in 0.. {
                    let id = RequestId::new(format!("r{round}-t{task}-{n}")).unwrap();
                    let Ok(handle) = client
                        .start_with_id(id.clone(), "resource.list", json!({}))
                        .await
                    else {
                        return;
                    };
                    match handle.response().await {
                        Ok(_) => {
                            acked.lock().await.insert(id.to_string());
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        // Let the load run, then crash mid-flight.
        tokio::time::sleep(Duration::from_millis(150 + 37 * (round as u64 % 5))).await;
        gw.crash_and_restart();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    let acked = acked.lock().await.clone();
    assert!(
        acked.len() > rounds * 10,
        "too little load to mean anything: {} acknowledged",
        acked.len()
    );
    let recorded: Vec<Entry> = gw.audit_entries();
    let mut seen = HashSet::new();
    for entry in &recorded {
        if let Some(id) = &entry.record.request_id {
            assert!(seen.insert(id.clone()), "request {id} has two entries");
        }
    }
    let missing: Vec<&String> = acked.iter().filter(|id| !seen.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged requests have no entry, e.g. {:?}",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );

    // The journal put back what sled had not written out when it was killed
    // (it is flushed only every 1,000 entries or 4 MiB of journal).
    let restarts = gw.log().matches("the audit log recovered").count();
    assert!(
        restarts > 0,
        "no restart recovered entries from the journal"
    );

    let verify = gw.cli_config(&["audit", "verify"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    eprintln!(
        "crash test: {rounds} SIGKILLs ({restarts} restarts recovered from the journal), {} acknowledged requests, {} entries, {}",
        acked.len(),
        recorded.len(),
        String::from_utf8_lossy(&verify.stdout).trim()
    );
}

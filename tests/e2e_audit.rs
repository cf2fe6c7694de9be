//! The audit log end to end: every request ends in exactly one completing
//! entry, security events are recorded, and `portcullis audit` reads the
//! same log through the running daemon and, once it stops, from the store.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{Gateway, alice_policy, key_b64};
use portcullis_crypto::StaticKeypair;
use portcullis_store::{Decision, Entry, Kind, Status};
use portcullis_wire::frame::RequestId;
use serde_json::json;

/// `audit verify --file EXPORT --key KEY` passes.
fn assert_export_verifies(gw: &Gateway, export: &std::path::Path, key: &str) {
    let checked = cli(
        gw,
        &[
            "audit",
            "verify",
            "--file",
            export.to_str().unwrap(),
            "--key",
            key,
        ],
    );
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );
}

fn entries(gw: &Gateway) -> Vec<Entry> {
    gw.audit_entries()
}

fn cli(gw: &Gateway, args: &[&str]) -> std::process::Output {
    gw.cli_config(args)
}

#[tokio::test]
async fn every_request_ends_in_exactly_one_entry() {
    let (alice, bob) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let policy = format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n[[principal]]\nid = \"bob\"\npublic_key = \"{}\"\n\
         [[root]]\nid = \"main\"\npath = \"WORKSPACE\"\nvirtual_path = \"/w\"\n\
         [[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nresources = {{}}\nfileops = {{ main = \"ro\" }}\n\
         [[grant]]\nid = \"b\"\nprincipals = [\"bob\"]\nfileops = {{ main = \"ro\" }}\n",
        key_b64(&alice),
        key_b64(&bob)
    );
    let mut gw = Gateway::start(&policy, "");
    let client = gw.connect(&alice).await.unwrap();

    let mut sent = 0;
    let mut send = |method: &'static str, params: serde_json::Value| {
        sent += 1;
        (method, params)
    };
    let before_accept = send("resource.list", json!({}));
    assert!(
        client
            .request(before_accept.0, before_accept.1)
            .await
            .is_err()
    );
    client.accept_all().await.unwrap();
    for _ in 0..3 {
        let (m, p) = send("resource.list", json!({}));
        client.request(m, p).await.unwrap();
    }
    for (m, p) in [
        send("file.write", json!({"root_id": "main", "path": "a"})),
        send(
            "file.read",
            json!({"root_id": "main", "path": "../../etc/passwd"}),
        ),
        send("no.such", json!({})),
        send("computer.see", json!({})),
        send("file.read", json!({"root_id": 7})),
    ] {
        assert!(client.request(m, p).await.is_err());
    }
    sent += 1;
    let malformed = client
        .start_with_id(RequestId::new("bad-1").unwrap(), "Bad.Method", json!({}))
        .await
        .unwrap();
    assert!(malformed.response().await.is_err());
    // Bob may list his resources (his file access makes watches), but not
    // run a command: blocked by policy.
    let bob_client = gw.connect(&bob).await.unwrap();
    bob_client.accept_all().await.unwrap();
    assert!(bob_client.offered().contains(&"resources".to_string()));
    bob_client
        .request("resource.list", json!({}))
        .await
        .unwrap();
    assert!(
        bob_client
            .request("shell.exec", json!({"command": ["ls"]}))
            .await
            .is_err()
    );
    // Someone without a key knocks.
    assert!(
        gw.connect(&StaticKeypair::generate().unwrap())
            .await
            .is_err()
    );

    // Security events are written without waiting; give the writer a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = entries(&gw);
    let requests: Vec<&Entry> = all
        .iter()
        .filter(|e| {
            e.record.kind == Kind::Request && e.record.principal.as_deref() == Some("alice")
        })
        .collect();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for e in &requests {
        *per_id
            .entry(
                e.record
                    .request_id
                    .clone()
                    .expect("request entries carry the request id"),
            )
            .or_default() += 1;
    }
    assert_eq!(
        requests.len(),
        sent,
        "one entry per request sent: {requests:#?}"
    );
    assert!(per_id.values().all(|n| *n == 1), "{per_id:?}");
    for e in &requests {
        assert!(
            e.record.completed_at.is_some() && e.record.status.is_some(),
            "{e:?}"
        );
    }
    let allowed: Vec<_> = requests
        .iter()
        .filter(|e| e.record.decision == Some(Decision::Allowed))
        .collect();
    assert_eq!(allowed.len(), 3);
    assert!(
        allowed
            .iter()
            .all(|e| e.record.status == Some(Status::Succeeded)
                && e.record.method.as_deref() == Some("resource.list"))
    );
    // A write to a read-only root: blocked, with the rule and what was asked.
    let write = requests
        .iter()
        .find(|e| e.record.method.as_deref() == Some("file.write"))
        .unwrap();
    assert_eq!(
        write.record.error_code.as_deref(),
        Some("permission_denied")
    );
    assert_eq!(write.record.decision, Some(Decision::Blocked));
    assert!(
        write.record.rule.as_deref().unwrap().contains("read-only"),
        "{:?}",
        write.record.rule
    );
    assert_eq!(
        (write.record.root.as_deref(), write.record.path.as_deref()),
        (Some("main"), Some("a"))
    );
    let blocked: Vec<&Entry> = all
        .iter()
        .filter(|e| {
            e.record.principal.as_deref() == Some("bob")
                && e.record.kind == Kind::Request
                && e.record.decision == Some(Decision::Blocked)
        })
        .collect();
    assert_eq!(blocked.len(), 1);
    let read_only = blocked[0];
    assert_eq!(read_only.record.decision, Some(Decision::Blocked));
    assert_eq!(
        read_only.record.error_code.as_deref(),
        Some("permission_denied")
    );
    assert!(
        read_only
            .record
            .rule
            .as_deref()
            .unwrap()
            .contains("no grant gives principal `bob` shell"),
        "{:?}",
        read_only.record.rule
    );
    let malformed = requests
        .iter()
        .find(|e| e.record.request_id.as_deref() == Some("bad-1"))
        .unwrap();
    assert_eq!(
        malformed.record.error_code.as_deref(),
        Some("invalid_request")
    );
    assert!(
        all.iter()
            .any(|e| e.record.event.as_deref() == Some("auth_refused")),
        "security events are recorded"
    );
    assert!(
        !all.iter().any(|e| serde_json::to_string(e)
            .unwrap()
            .contains(&gw.dir.display().to_string())),
        "no host path in the log"
    );

    let online = cli(&gw, &["audit", "verify"]);
    assert!(
        online.status.success(),
        "{}",
        String::from_utf8_lossy(&online.stdout)
    );
    let table = String::from_utf8_lossy(
        &cli(
            &gw,
            &[
                "audit",
                "list",
                "--principal",
                "alice",
                "--method",
                "file.*",
            ],
        )
        .stdout,
    )
    .to_string();
    assert_eq!(table.lines().count(), 1 + 3, "{table}");

    // Running, an export streams through the admin socket and verifies.
    let key = String::from_utf8(cli(&gw, &["audit", "key"]).stdout).unwrap();
    let live_export = gw.dir.join("live-export.jsonl");
    let exported = cli(
        &gw,
        &["audit", "export", "--output", live_export.to_str().unwrap()],
    );
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    assert_export_verifies(&gw, &live_export, key.trim());
    let exported_entries = std::fs::read_to_string(&live_export)
        .unwrap()
        .lines()
        .filter(|l| l.contains(r#""type":"entry""#))
        .count();
    assert!(
        exported_entries >= all.len(),
        "{exported_entries} < {}",
        all.len()
    );

    // Stopped, the CLI reads the store itself, with the same answers.
    drop((client, bob_client));
    gw.signal("TERM");
    gw.wait_exit(Duration::from_secs(15)).expect("stopped");
    let offline_entries = entries(&gw);
    assert!(
        offline_entries.len() >= all.len(),
        "nothing acknowledged is lost"
    );
    assert!(all.iter().all(|e| offline_entries.contains(e)));
    let offline = cli(&gw, &["audit", "verify", "--json"]);
    assert!(
        offline.status.success(),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&offline.stdout).unwrap();
    assert_eq!(
        report["signed_through"], report["last_seq"],
        "a clean stop signs the whole log: {report}"
    );

    // An export verifies anywhere with the audit public key alone.
    let export = gw.dir.join("export.jsonl");
    assert!(
        cli(
            &gw,
            &["audit", "export", "--output", export.to_str().unwrap()]
        )
        .status
        .success()
    );
    assert_export_verifies(&gw, &export, key.trim());
    // Its header names the key, as a live export's does.
    for file in [&export, &live_export] {
        let text = std::fs::read_to_string(file).unwrap();
        let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["public_key"], key.trim(), "{}", file.display());
    }
    let other = portcullis_store::AuditSigner::load_or_create(&gw.dir.join("other.key"))
        .unwrap()
        .public_key_base64();
    let forged = cli(
        &gw,
        &[
            "audit",
            "verify",
            "--file",
            export.to_str().unwrap(),
            "--key",
            &other,
        ],
    );
    assert_eq!(
        forged.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&forged.stdout)
    );
    let shown = cli(
        &gw,
        &["audit", "show", &read_only.seq.to_string(), "--json"],
    );
    let shown: Entry = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(&shown, read_only);
}

#[tokio::test]
async fn tail_shows_the_last_entries_and_follows_new_ones() {
    use std::io::BufRead as _;
    let alice = StaticKeypair::generate().unwrap();
    let policy = alice_policy(&alice);
    let gw = Gateway::start(&policy, "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    for _ in 0..5 {
        client.request("resource.list", json!({})).await.unwrap();
    }
    let out = cli(&gw, &["audit", "tail", "-n", "3", "--json"]);
    let seqs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Entry>(l).unwrap().seq)
        .collect();
    assert_eq!(seqs.len(), 3);
    assert!(
        seqs.windows(2).all(|w| w[0] + 1 == w[1]),
        "oldest first, consecutive: {seqs:?}"
    );

    let mut follow = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["audit", "tail", "-n", "0", "-f", "--json", "--config"])
        .arg(gw.dir.join("portcullis.toml"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    client
        .request("resource.list", json!({"marker": 1}))
        .await
        .unwrap();
    let mut line = String::new();
    let mut reader = std::io::BufReader::new(follow.stdout.take().unwrap());
    let read = std::thread::spawn(move || {
        reader.read_line(&mut line).unwrap();
        line
    });
    let started = std::time::Instant::now();
    while !read.is_finished() && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let line = read.join().unwrap();
    let entry: Entry = serde_json::from_str(&line).expect("tail -f printed the new entry");
    assert_eq!(entry.record.method.as_deref(), Some("resource.list"));
}

#[tokio::test]
async fn prune_through_the_daemon_keeps_the_log_verifiable() {
    let alice = StaticKeypair::generate().unwrap();
    let policy = alice_policy(&alice);
    let gw = Gateway::start(&policy, "[audit]\nmax_age = \"90d\"");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    for _ in 0..5 {
        client.request("resource.list", json!({})).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let pruned = cli(&gw, &["audit", "prune", "--before", "1s"]);
    assert!(
        pruned.status.success(),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    let removed: u64 = String::from_utf8_lossy(&pruned.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(removed >= 5, "{removed}");
    client.request("resource.list", json!({})).await.unwrap();
    let verify = cli(&gw, &["audit", "verify", "--json"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&verify.stdout).unwrap();
    assert!(
        report["pruned_before"].as_u64().unwrap() > removed,
        "{report}"
    );
    assert!(
        entries(&gw)
            .iter()
            .any(|e| e.record.event.as_deref() == Some("audit_pruned"))
    );
}

#[tokio::test]
async fn max_entries_bounds_the_log_at_start_and_every_minute() {
    let alice = StaticKeypair::generate().unwrap();
    let policy = alice_policy(&alice);
    let mut gw = Gateway::start(&policy, "[audit]\nmax_entries = 8");
    {
        let client = gw.connect(&alice).await.unwrap();
        client.accept_all().await.unwrap();
        for _ in 0..20 {
            client.request("resource.list", json!({})).await.unwrap();
        }
    }
    assert!(entries(&gw).len() >= 20);
    // Retention runs as the daemon starts, then every minute.
    gw.restart();
    assert!(
        gw.wait_log("audit retention: pruned", Duration::from_secs(10))
            .await
    );
    let kept = entries(&gw);
    // The newest 8, plus what was written since (the prune's own event).
    assert!(kept.len() <= 8 + 2, "{} entries kept", kept.len());
    assert!(
        kept.iter()
            .any(|e| e.record.event.as_deref() == Some("audit_pruned"))
    );
    let verify = cli(&gw, &["audit", "verify"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}

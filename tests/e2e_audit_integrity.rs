//! No effect without a durable entry first. A store whose file system fills
//! up: every request is refused before it acts, nothing under the root
//! changes, and the log writes again by itself once there is room. A
//! daemon killed with SIGKILL while writing files: every file in the root
//! has its start entry, and every start entry its completion (`interrupted`
//! for the requests the kill cut short).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gateway, key_b64};
use portcullis_client::{Client, ClientError};
use portcullis_crypto::StaticKeypair;
use portcullis_store::{Entry, Kind, Status};
use portcullis_wire::frame::{ErrorCode, RequestId};
use serde_json::{Value, json};
use tokio::sync::Mutex;

fn policy(alice: &StaticKeypair) -> String {
    format!(
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
shell = {{ commands = ["touch"], cwd_roots = ["main"], env_set = {{ PATH = "/usr/bin:/bin" }} }}
resources = {{}}
"#,
        alice = key_b64(alice)
    )
}

/// Every file under `dir`: its path, size and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            }
            files.insert(entry.path(), (meta.len(), meta.modified().unwrap()));
        }
    }
    files
}

/// A tmpfs of `size` at `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test mounts a tmpfs for the store: run the suite as root (as .ci/run does)"
        );
        std::fs::create_dir_all(&dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed");
        Self(dir)
    }

    /// Writes a file until the file system is full; returns its path.
    /// Fills the file system to the last byte (again, if called again:
    /// what the log freed meanwhile, rewinding a write that failed).
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        for size in [64 * 1024, 4096, 1] {
            let block = vec![0x55u8; size];
            loop {
                match file.write(&block) {
                    Ok(n) if n > 0 => continue,
                    Ok(_) => break,
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(28), "{e}"); // ENOSPC
                        break;
                    }
                }
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `result` is the refusal of a request the log could not record
/// before it acted.
fn refused_unrecorded(result: &Result<Value, ClientError>) -> bool {
    match result {
        Err(ClientError::Remote(e)) => {
            e.code == ErrorCode::ProviderError
                && e.details
                    .as_ref()
                    .is_some_and(|d| d["audit"] == "unavailable" && d["ran"] == false)
        }
        _ => false,
    }
}

fn status_json(gw: &Gateway) -> Value {
    let out = gw.cli(&["status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The events received so far, by name.
async fn events(client: &Client, within: Duration) -> Vec<(String, Value)> {
    let mut seen = Vec::new();
    while let Some(event) = client.next_event(within).await {
        seen.push((event.event, event.payload));
    }
    seen
}

/// Every start entry completed by exactly one later entry naming it.
fn assert_every_start_completed(entries: &[Entry]) {
    for start in entries
        .iter()
        .filter(|e| e.record.kind == Kind::RequestStart)
    {
        let completions: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.record.kind == Kind::Request && e.record.start_seq == Some(start.seq))
            .collect();
        assert!(
            completions.len() == 1 && completions[0].seq > start.seq,
            "start entry {} ({:?} {:?}) completed by {completions:#?}",
            start.seq,
            start.record.method,
            start.record.path
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_every_request_before_it_acts_and_the_log_resumes_by_itself() {
    let alice = StaticKeypair::generate().unwrap();
    let store = Tmpfs::mount(
        std::env::temp_dir().join(format!("portcullis-full-store-{}", std::process::id())),
        "16m",
    );
    let gw = Gateway::start_in(&policy(&alice), "", &[], &store.0.display().to_string());
    let root = gw.dir.join("workspace");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    let write = |path: String| json!({"root_id": "main", "path": path, "content": "x\n"});
    client
        .request("file.write", write("before.txt".into()))
        .await
        .unwrap();
    std::fs::write(root.join("old.txt"), "old\n").unwrap();

    let filler = store.fill();
    // The log's files may have room left in their last pages: write until
    // the log stops. Each write that was answered was audited as usual.
    // The entry that says the log resumed is smaller than a request's, and
    // may fit the journal's last page where the request's did not: then
    // the log writes again (rightly) and the next request stops it again.
    // So write until it stays stopped past a retry; each stop is an outage.
    let mut stopped = false;
    let mut outages = 0;
    let mut n = 0;
    'outage: for _ in 0..50 {
        while n < 5000 {
            n += 1;
            let result = client
                .request("file.write", write(format!("w{n}.txt")))
                .await;
            if refused_unrecorded(&result) {
                assert!(
                    !root.join(format!("w{n}.txt")).exists(),
                    "w{n}.txt was written"
                );
                outages += 1;
                tokio::time::sleep(Duration::from_millis(1500)).await;
                if status_json(&gw)["audit"]["writing"] == false {
                    stopped = true;
                    break 'outage;
                }
                continue 'outage;
            }
            if let Err(ClientError::Remote(e)) = &result
                && e.details.as_ref().is_some_and(|d| d["ran"] == true)
            {
                // Its start entry was written, its outcome not: it ran.
                continue;
            }
            result.unwrap();
        }
    }
    assert!(stopped, "the log never stopped on a full file system");
    let status = status_json(&gw);
    assert_eq!(status["audit"]["writing"], false, "{status}");
    assert!(
        status["audit"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{status}"
    );
    let metrics = String::from_utf8_lossy(&gw.cli(&["metrics"]).stdout).to_string();
    assert!(metrics.contains("portcullis_audit_writing 0"), "{metrics}");
    assert!(
        gw.wait_log("the audit log cannot write", Duration::from_secs(5))
            .await,
        "{}",
        gw.log()
    );

    // Everything is refused before it acts, and nothing under the root
    // changes.
    let before = snapshot(&root);
    let battery: Vec<(&str, Value)> = vec![
        ("file.write", write("new.txt".into())),
        ("file.write", write("old.txt".into())),
        (
            "file.append",
            json!({"root_id": "main", "path": "old.txt", "content": "more\n"}),
        ),
        ("file.mkdir", json!({"root_id": "main", "path": "dir"})),
        ("file.delete", json!({"root_id": "main", "path": "old.txt"})),
        (
            "file.move",
            json!({"root_id": "main", "path": "old.txt", "to_path": "moved.txt"}),
        ),
        (
            "file.copy",
            json!({"root_id": "main", "path": "old.txt", "to_path": "copied.txt"}),
        ),
        (
            "shell.exec",
            json!({"command": ["touch", "touched.txt"], "root_id": "main"}),
        ),
        (
            "shell.start",
            json!({"command": ["touch", "started.txt"], "root_id": "main"}),
        ),
        ("file.read", json!({"root_id": "main", "path": "old.txt"})),
        ("file.watch", json!({"root_id": "main", "path": ""})),
    ];
    for (method, params) in &battery {
        let result = client.request(method, params.clone()).await;
        assert!(refused_unrecorded(&result), "{method}: {result:?}");
    }
    // The retries while the disk stays full change nothing either.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(snapshot(&root), before, "a file under the root changed");
    // Said once, however often the writer retried meanwhile.
    let seen = events(&client, Duration::from_millis(200)).await;
    let stopped: Vec<_> = seen
        .iter()
        .filter(|(name, _)| name == "provider.audit_stopped")
        .collect();
    assert!(
        stopped.len() == outages && stopped.iter().all(|s| s.1["reason"].as_str().is_some()),
        "{outages} outages: {seen:?}"
    );
    let said = gw
        .log()
        .matches("every request is refused until it can")
        .count();
    assert_eq!(said, outages, "{}", gw.log());

    // Room again: the log resumes without a restart.
    std::fs::remove_file(filler).unwrap();
    let resumed_by = Instant::now() + Duration::from_secs(15);
    while status_json(&gw)["audit"]["writing"] != true {
        assert!(
            Instant::now() < resumed_by,
            "the log did not resume: {}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        events(&client, Duration::from_secs(2))
            .await
            .first()
            .map(|(n, _)| n.clone()),
        Some("provider.audit_resumed".to_string())
    );
    client
        .request("file.write", write("after.txt".into()))
        .await
        .unwrap();
    assert!(
        gw.wait_log("the audit log writes again", Duration::from_secs(5))
            .await
    );

    let entries = gw.audit_entries();
    let resumed: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.record.event.as_deref() == Some("audit_resumed"))
        .collect();
    // One per outage (the last, after the test freed the disk).
    assert_eq!(resumed.len(), outages, "{resumed:#?}");
    let detail = resumed[outages - 1]
        .record
        .detail
        .as_deref()
        .unwrap_or_default();
    assert!(
        detail.contains("records were refused meanwhile"),
        "{detail}"
    );
    // Each file in the root has the start entry of a write.
    for path in snapshot(&root).keys() {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "old.txt" {
            continue; // put there by the test
        }
        assert!(
            entries.iter().any(|e| e.record.kind == Kind::RequestStart
                && e.record.method.as_deref() == Some("file.write")
                && e.record.path.as_deref().is_some_and(|p| p.ends_with(&name))),
            "{name} has no start entry"
        );
    }
    let out = gw.cli_config(&["audit", "verify"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // After a restart, a write whose outcome could not be recorded is
    // completed as interrupted: every start entry has its completion.
    let mut gw = gw;
    gw.restart();
    assert_every_start_completed(&gw.audit_entries());
}

const TASKS: usize = 8;

/// SIGKILL while files are written, 8 rounds: every file under the root
/// has a start entry, durable before it was written; every start entry
/// has exactly one completion (the kill's victims `interrupted`, written
/// when the log reopens); every acknowledged write has its entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_file_changes_without_its_start_entry_across_sigkill() {
    let rounds = 8;
    let alice = StaticKeypair::generate().unwrap();
    let mut gw = Gateway::start(&policy(&alice), "[limits]\nmax_sessions_per_principal = 64");
    let root = gw.dir.join("workspace");
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    for round in 0..rounds {
        let client = Arc::new(gw.connect(&alice).await.expect("the gateway came back"));
        client.accept_all().await.unwrap();
        let mut tasks = Vec::new();
        for task in 0..TASKS {
            let (client, acked) = (client.clone(), acked.clone());
            tasks.push(tokio::spawn(async move {
                for n in 0.. {
                    let name = format!("r{round}-t{task}-{n}.txt");
                    let id = RequestId::new(name.clone()).unwrap();
                    let params = json!({"root_id": "main", "path": name, "content": "x"});
                    let Ok(handle) = client.start_with_id(id, "file.write", params).await else {
                        return;
                    };
                    match handle.response().await {
                        Ok(_) => {
                            acked.lock().await.insert(name);
                        }
                        Err(_) => return,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150 + 41 * (round as u64 % 4))).await;
        gw.crash_and_restart();
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
    let acked = acked.lock().await.clone();
    assert!(
        acked.len() > rounds * 10,
        "too little load: {} writes",
        acked.len()
    );
    let entries = gw.audit_entries();
    let started: HashSet<String> = entries
        .iter()
        .filter(|e| e.record.kind == Kind::RequestStart)
        .filter_map(|e| e.record.request_id.clone())
        .collect();
    let written: Vec<String> = snapshot(&root)
        .keys()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .filter(|name| !name.starts_with('.')) // an upload's temporary file
        .collect();
    for name in &written {
        assert!(
            started.contains(name),
            "{name} was written without a start entry"
        );
    }
    for name in &acked {
        assert!(
            entries.iter().any(|e| e.record.kind == Kind::Request
                && e.record.request_id.as_deref() == Some(name)
                && e.record.status == Some(Status::Succeeded)),
            "acknowledged write {name} has no entry"
        );
    }
    assert_every_start_completed(&entries);
    let interrupted = entries
        .iter()
        .filter(|e| e.record.status == Some(Status::Interrupted))
        .count();
    eprintln!(
        "{} files written, {} acknowledged, {interrupted} interrupted by the kills",
        written.len(),
        acked.len()
    );
    let out = gw.cli_config(&["audit", "verify", "--json"]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // verify counts them as interrupted, not as missing.
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["interrupted"], interrupted as u64, "{report}");
}

/// `audit checkpoint` prints a signed note to keep off the host; `audit
/// verify --checkpoint` proves the log (live, or an export) still extends
/// it — and catches entries deleted from an export's end even when its
/// checkpoints were signed again with the host's own key.
#[tokio::test]
async fn a_checkpoint_kept_off_the_host_catches_a_truncated_and_resigned_log() {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice), "");
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    let write = |n: usize| json!({"root_id": "main", "path": format!("f{n}.txt"), "content": "x"});
    for n in 0..5 {
        client.request("file.write", write(n)).await.unwrap();
    }
    let out = gw.cli_config(&["audit", "checkpoint"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let note = String::from_utf8(out.stdout).unwrap();
    assert!(note.starts_with("portcullis-audit/"), "{note}");
    assert!(note.contains("\n\n\u{2014} portcullis-audit/"), "{note}");
    let note_path = gw.dir.join("kept.note");
    std::fs::write(&note_path, &note).unwrap();
    let kept_seq: u64 = note.lines().nth(1).unwrap().parse().unwrap();

    for n in 5..8 {
        client.request("file.write", write(n)).await.unwrap();
    }
    let note_arg = note_path.to_str().unwrap();
    let out = gw.cli_config(&["audit", "verify", "--checkpoint", note_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("still extends the checkpoint kept off the host"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let export = gw.dir.join("export.jsonl");
    let out = gw.cli_config(&["audit", "export", "--output", export.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(gw.cli_config(&["audit", "key"]).stdout).unwrap();
    let key = key.trim();
    let verify_export = |file: &Path, kept: bool| {
        let mut args = vec![
            "audit",
            "verify",
            "--file",
            file.to_str().unwrap(),
            "--key",
            key,
        ];
        if kept {
            args.extend(["--checkpoint", note_arg]);
        }
        gw.cli_config(&args)
    };
    assert!(verify_export(&export, true).status.success());

    // Cut the export below the kept checkpoint, and sign its new end with
    // the host's own key, as whoever holds the host could.
    let cut = kept_seq - 2;
    let mut kept_lines = Vec::new();
    let mut last_hash = String::new();
    for line in std::fs::read_to_string(&export).unwrap().lines() {
        let value: Value = serde_json::from_str(line).unwrap();
        let seq = match value["type"].as_str() {
            Some("entry") => value["entry"]["seq"].as_u64(),
            Some("checkpoint") => value["checkpoint"]["seq"].as_u64(),
            _ => None,
        };
        if seq.is_some_and(|seq| seq > cut) {
            continue;
        }
        if value["type"] == "entry" {
            last_hash = value["entry"]["hash"].as_str().unwrap().to_string();
        }
        kept_lines.push(line.to_string());
    }
    let signer =
        portcullis_store::AuditSigner::load_or_create(&gw.dir.join("state/audit.key")).unwrap();
    let resigned = signer.sign(cut, &last_hash);
    kept_lines.push(json!({"type": "checkpoint", "checkpoint": resigned}).to_string());
    let tampered = gw.dir.join("tampered.jsonl");
    std::fs::write(&tampered, kept_lines.join("\n") + "\n").unwrap();

    let out = verify_export(&tampered, false);
    assert!(
        out.status.success(),
        "re-signed, it verifies on its own: {out:?}"
    );
    let out = verify_export(&tampered, true);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("entries were deleted from its end"), "{said}");

    // A note that was changed is refused before anything is checked.
    let forged = gw.dir.join("forged.note");
    std::fs::write(
        &forged,
        note.replacen(&format!("\n{kept_seq}\n"), "\n1\n", 1),
    )
    .unwrap();
    let out = gw.cli_config(&["audit", "verify", "--checkpoint", forged.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("signature"),
        "{out:?}"
    );
    gw.assert_requests_audited(8);
}

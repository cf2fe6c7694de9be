//! `file.*` end to end: the real binary, the real client. Confinement (an
//! escape corpus and a symlink race), read-only roots, streaming transfer
//! with sha256, cancellation, and the audit entries they leave.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::{Gateway, code, key_b64};
use portcullis_client::UploadOptions;
use portcullis_client::{Client, ClientError};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const SECRET: &str = "TOP SECRET, outside every root";

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

[[root]]
id = "docs"
path = "GWDIR/docs"
virtual_path = "/workspace/docs"

[[root]]
id = "linked"
path = "GWDIR/linked"
virtual_path = "/workspace/linked"
follow_symlinks = true

[[grant]]
id = "alice-files"
principals = ["alice"]
fileops = {{ main = "rw", docs = "ro", linked = "rw" }}
resources = {{}}
"#,
        alice = key_b64(alice)
    )
}

/// The gateway, alice's client, and the trap: `outside/` next to the roots
/// holds a secret, and each root holds links that point at it.
async fn setup() -> (Gateway, Client) {
    let alice = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice), "");
    let d = &gw.dir;
    for dir in ["outside/dir", "docs/sub", "linked/sub", "workspace/sub"] {
        std::fs::create_dir_all(d.join(dir)).unwrap();
    }
    std::fs::write(d.join("outside/secret.txt"), SECRET).unwrap();
    std::fs::write(d.join("outside/dir/secret.txt"), SECRET).unwrap();
    std::fs::write(d.join("docs/readme.md"), "read me").unwrap();
    for root in ["workspace", "linked"] {
        let r = d.join(root);
        std::fs::write(r.join("victim.txt"), "victim").unwrap();
        std::fs::write(r.join("sub/inner.txt"), "inner").unwrap();
        symlink(d.join("outside"), r.join("link_out")).unwrap();
        symlink("../outside", r.join("link_out_rel")).unwrap();
        symlink("link_out", r.join("chain_dir")).unwrap();
        symlink("..", r.join("link_parent")).unwrap();
        symlink("/proc/self/root", r.join("link_proc_root")).unwrap();
        symlink(d.join("outside/secret.txt"), r.join("link_abs")).unwrap();
        symlink("../outside/secret.txt", r.join("link_rel_up")).unwrap();
        symlink("link_abs", r.join("chain1")).unwrap();
        symlink("/proc/self/cwd/secret.txt", r.join("link_proc")).unwrap();
        std::fs::hard_link(
            d.join("outside/secret.txt"),
            r.join(format!("hardlink-{root}")),
        )
        .unwrap();
    }
    symlink("sub/inner.txt", d.join("workspace/link_in")).unwrap();
    let client = gw.connect(&alice).await.unwrap();
    client.accept_all().await.unwrap();
    (gw, client)
}

/// Every file under `dir` with its contents (symlinks as their target).
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let key = path.strip_prefix(dir).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_symlink() {
                out.insert(
                    key,
                    format!("-> {}", std::fs::read_link(&path).unwrap().display()),
                );
            } else if meta.is_dir() {
                out.insert(key, "dir".into());
                stack.push(path);
            } else {
                out.insert(key, std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    out
}

/// The requests one path is tried with: every method, both ends of a
/// transfer.
fn attempts(root: &str, path: &str) -> Vec<(&'static str, Value)> {
    let p = |extra: Value| {
        let mut v = json!({"root_id": root, "path": path});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    vec![
        ("file.read", p(json!({}))),
        ("file.read", p(json!({"stream": true}))),
        ("file.read", p(json!({"encoding": "base64"}))),
        ("file.stat", p(json!({}))),
        ("file.list", p(json!({}))),
        ("file.write", p(json!({"content": "pwned"}))),
        ("file.append", p(json!({"content": "pwned"}))),
        (
            "file.edit",
            p(json!({"edits": [{"old_text": "TOP SECRET", "new_text": "pwned"}]})),
        ),
        ("file.mkdir", p(json!({"parents": true}))),
        ("file.delete", p(json!({"recursive": true}))),
        ("file.move", p(json!({"to_path": "moved"}))),
        ("file.copy", p(json!({"to_path": "copied"}))),
        ("file.search", p(json!({"pattern": "SECRET"}))),
        ("file.watch", p(json!({"recursive": true}))),
        (
            "file.move",
            json!({"root_id": root, "path": "victim.txt", "to_path": path, "overwrite": true}),
        ),
        (
            "file.copy",
            json!({"root_id": root, "path": "victim.txt", "to_path": path, "overwrite": true}),
        ),
    ]
}

#[tokio::test]
async fn the_escape_corpus_fails_and_leaves_the_outside_untouched() {
    let (gw, client) = setup().await;
    let outside = snapshot(&gw.dir.join("outside"));
    let mut cases = 0;
    let mut expect_denied = |method: &str, params: Value, result: Result<Value, ClientError>| {
        cases += 1;
        assert_eq!(
            code(&result),
            Some(ErrorCode::PermissionDenied),
            "{method} {params} was not refused: {result:?}"
        );
        if let Err(ClientError::Remote(e)) = &result {
            assert!(
                !e.message.contains(&gw.dir.display().to_string()),
                "a host path leaked: {}",
                e.message
            );
        }
    };
    // Paths that leave the root before their last component: every method
    // fails, in both roots (symlinks followed or not).
    let through = [
        "../outside/secret.txt",
        "../../etc/passwd",
        "sub/../../outside/secret.txt",
        "/etc/passwd",
        "/workspace/main/../../etc/passwd",
        "/workspace/mainx/secret.txt",
        "sub/\0/x",
        "link_out/secret.txt",
        "link_out/dir/secret.txt",
        "link_out_rel/secret.txt",
        "chain_dir/secret.txt",
        "link_parent/outside/secret.txt",
        "link_proc_root/etc/passwd",
    ];
    for root in ["main", "linked"] {
        for path in through {
            for (method, params) in attempts(root, path) {
                let result = client.request(method, params.clone()).await;
                expect_denied(method, params, result);
            }
        }
    }
    // A last component that is a link out (or, in a strict root, any
    // symlink; or a hard link to an outside file): nothing reads or writes
    // through it. (stat, delete and move act on the link itself, inside.)
    let mut finals = vec![
        ("main", "link_abs"),
        ("main", "link_rel_up"),
        ("main", "chain1"),
        ("main", "link_proc"),
        ("main", "link_in"),
        ("linked", "link_abs"),
        ("linked", "link_rel_up"),
        ("linked", "chain1"),
        ("linked", "link_proc"),
    ];
    for (root, path) in finals.drain(..) {
        for (method, params) in attempts(root, path).into_iter().filter(|(m, p)| {
            matches!(
                *m,
                "file.read"
                    | "file.write"
                    | "file.append"
                    | "file.edit"
                    | "file.list"
                    | "file.search"
                    | "file.watch"
            ) || (*m == "file.copy" && p["path"] == path)
        }) {
            let result = client.request(method, params.clone()).await;
            expect_denied(method, params, result);
        }
    }
    for (root, path) in [
        ("main", "hardlink-workspace"),
        ("linked", "hardlink-linked"),
    ] {
        for (method, params) in [
            ("file.read", json!({"root_id": root, "path": path})),
            (
                "file.read",
                json!({"root_id": root, "path": path, "stream": true}),
            ),
            (
                "file.append",
                json!({"root_id": root, "path": path, "content": "x"}),
            ),
            (
                "file.edit",
                json!({"root_id": root, "path": path, "edits": [{"old_text": "TOP", "new_text": "x"}]}),
            ),
            (
                "file.search",
                json!({"root_id": root, "path": path, "pattern": "SECRET"}),
            ),
            ("file.watch", json!({"root_id": root, "path": path})),
            (
                "file.copy",
                json!({"root_id": root, "path": path, "to_path": "c"}),
            ),
        ] {
            let result = client.request(method, params.clone()).await;
            expect_denied(method, params, result);
        }
    }
    assert!(cases >= 60, "{cases} cases");
    assert_eq!(
        snapshot(&gw.dir.join("outside")),
        outside,
        "the outside changed"
    );
    for root in ["workspace", "linked"] {
        assert_eq!(
            std::fs::read_to_string(gw.dir.join(root).join("victim.txt")).unwrap(),
            "victim"
        );
    }
    gw.assert_requests_audited(cases);
    println!("{cases} escape attempts refused");
}

#[tokio::test]
async fn a_symlink_swapped_in_during_reads_and_writes_never_leads_out() {
    let (gw, client) = setup().await;
    let outside = snapshot(&gw.dir.join("outside"));
    for root in ["workspace", "linked"] {
        let r = gw.dir.join(root);
        std::fs::create_dir(r.join("race")).unwrap();
        std::fs::write(r.join("race/secret.txt"), "inside").unwrap();
        symlink(gw.dir.join("outside"), r.join("race_swap")).unwrap();
    }
    // A thread swaps `race` (a real directory) with `race_swap` (a link to
    // the outside) as fast as it can, atomically, in both roots.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (stop, dir) = (stop.clone(), gw.dir.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && swaps < 5_000_000 {
                for root in ["workspace", "linked"] {
                    let r = dir.join(root);
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        r.join("race"),
                        rustix::fs::CWD,
                        r.join("race_swap"),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap();
                }
                swaps += 1;
            }
            swaps
        })
    };
    let (mut inside, mut refused) = (0, 0);
    let mut requests = 0;
    for i in 0..400 {
        let root = if i % 2 == 0 { "main" } else { "linked" };
        let read = client
            .request(
                "file.read",
                json!({"root_id": root, "path": "race/secret.txt"}),
            )
            .await;
        let write = client
            .request(
                "file.write",
                json!({"root_id": root, "path": format!("race/new-{i}"), "content": "x"}),
            )
            .await;
        requests += 2;
        match &read {
            Ok(v) => {
                assert_eq!(v["content"], "inside", "read through the swapped link");
                inside += 1;
            }
            Err(ClientError::Remote(e)) => {
                assert!(
                    matches!(e.code, ErrorCode::PermissionDenied | ErrorCode::NotFound),
                    "{e:?}"
                );
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
        if let Err(e) = &write {
            assert!(
                matches!(
                    code(&write),
                    Some(ErrorCode::PermissionDenied | ErrorCode::NotFound)
                ),
                "{e}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert_eq!(
        snapshot(&gw.dir.join("outside")),
        outside,
        "the outside changed"
    );
    println!("race: {swaps} swaps; {inside} reads inside, {refused} refused");
    assert!(swaps > 100, "the swapper barely ran ({swaps})");
    gw.assert_requests_audited(requests);
}

#[tokio::test]
async fn read_only_roots_are_never_modified() {
    let (gw, client) = setup().await;
    let before = snapshot(&gw.dir.join("docs"));
    let docs = |extra: Value| {
        let mut v = json!({"root_id": "docs", "path": "readme.md"});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let mutations = [
        ("file.write", docs(json!({"content": "changed"}))),
        (
            "file.write",
            docs(json!({"path": "new.md", "content": "new"})),
        ),
        ("file.append", docs(json!({"content": "more"}))),
        (
            "file.edit",
            docs(json!({"edits": [{"old_text": "read", "new_text": "edit"}]})),
        ),
        ("file.mkdir", docs(json!({"path": "newdir"}))),
        ("file.delete", docs(json!({}))),
        (
            "file.delete",
            docs(json!({"path": "sub", "recursive": true})),
        ),
        ("file.move", docs(json!({"to_path": "renamed.md"}))),
        (
            "file.move",
            json!({"root_id": "main", "path": "victim.txt", "to_root_id": "docs", "to_path": "v.txt"}),
        ),
        (
            "file.move",
            docs(json!({"to_root_id": "main", "to_path": "stolen.md"})),
        ),
        (
            "file.copy",
            json!({"root_id": "main", "path": "victim.txt", "to_root_id": "docs", "to_path": "v.txt"}),
        ),
        ("file.copy", docs(json!({"to_path": "copy.md"}))),
    ];
    for (method, params) in &mutations {
        let result = client.request(method, params.clone()).await;
        assert_eq!(
            code(&result),
            Some(ErrorCode::PermissionDenied),
            "{method} {params}: {result:?}"
        );
    }
    // Reading is what ro is for; copying out of it is reading.
    let read = client.request("file.read", docs(json!({}))).await.unwrap();
    assert_eq!(read["content"], "read me");
    let copied = client
        .request(
            "file.copy",
            docs(json!({"to_root_id": "main", "to_path": "from-docs.md"})),
        )
        .await
        .unwrap();
    assert_eq!(copied["path"], "/workspace/main/from-docs.md");
    assert_eq!(snapshot(&gw.dir.join("docs")), before);
    gw.assert_requests_audited(mutations.len() + 2);
}

#[tokio::test]
async fn the_file_methods_work_and_are_audited_with_root_and_path() {
    let (gw, client) = setup().await;
    let call = |method: &'static str, params: Value| {
        let client = &client;
        async move { client.request(method, params).await }
    };
    let wrote = call(
        "file.write",
        json!({"root_id": "main", "path": "notes/today.txt", "content": "hello\n", "create_parents": true}),
    )
    .await
    .unwrap();
    assert_eq!(wrote["size"], 6);
    assert_eq!(wrote["path"], "/workspace/main/notes/today.txt");
    assert_eq!(wrote["sha256"], hex::encode(Sha256::digest(b"hello\n")));
    call(
        "file.append",
        json!({"root_id": "main", "path": "/workspace/main/notes/today.txt", "content": "d29ybGQK", "encoding": "base64"}),
    )
    .await
    .unwrap();
    let read = call(
        "file.read",
        json!({"root_id": "main", "path": "notes/today.txt"}),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            read["content"].as_str(),
            read["size"].as_u64(),
            read["eof"].as_bool()
        ),
        (Some("hello\nworld\n"), Some(12), Some(true))
    );
    let part = call(
        "file.read",
        json!({"root_id": "main", "path": "notes/today.txt", "offset": 6, "length": 3}),
    )
    .await
    .unwrap();
    assert_eq!(
        (part["content"].as_str(), part["eof"].as_bool()),
        (Some("wor"), Some(false))
    );
    let stat = call("file.stat", json!({"root_id": "main", "path": "notes"}))
        .await
        .unwrap();
    assert_eq!(stat["kind"], "dir");
    call(
        "file.mkdir",
        json!({"root_id": "main", "path": "a/b/c", "parents": true}),
    )
    .await
    .unwrap();
    let exists = call("file.mkdir", json!({"root_id": "main", "path": "a"})).await;
    assert_eq!(code(&exists), Some(ErrorCode::InvalidRequest));
    call(
        "file.copy",
        json!({"root_id": "main", "path": "notes/today.txt", "to_path": "a/b/c/copy.txt"}),
    )
    .await
    .unwrap();
    call(
        "file.move",
        json!({"root_id": "main", "path": "a/b/c/copy.txt", "to_root_id": "linked", "to_path": "moved.txt"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(gw.dir.join("linked/moved.txt")).unwrap(),
        "hello\nworld\n"
    );
    let listed = call(
        "file.list",
        json!({"root_id": "main", "path": "", "depth": 3}),
    )
    .await
    .unwrap();
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"/workspace/main/a/b/c"), "{names:?}");
    assert!(
        names.contains(&"/workspace/main/notes/today.txt"),
        "{names:?}"
    );
    let paged = call(
        "file.list",
        json!({"root_id": "main", "path": "", "depth": 3, "limit": 2}),
    )
    .await
    .unwrap();
    assert_eq!(paged["entries"].as_array().unwrap().len(), 2);
    assert_eq!(
        (paged["truncated"].as_bool(), paged["next_offset"].as_u64()),
        (Some(true), Some(2))
    );
    let removed = call(
        "file.delete",
        json!({"root_id": "main", "path": "a", "recursive": true}),
    )
    .await
    .unwrap();
    assert_eq!(removed["removed"], 3);
    let missing = call("file.stat", json!({"root_id": "main", "path": "a"})).await;
    assert_eq!(code(&missing), Some(ErrorCode::NotFound));
    let binary = std::fs::write(gw.dir.join("workspace/bin"), [0xff, 0xfe, 0]);
    binary.unwrap();
    let not_text = call("file.read", json!({"root_id": "main", "path": "bin"})).await;
    assert_eq!(code(&not_text), Some(ErrorCode::InvalidRequest));
    let as_base64 = call(
        "file.read",
        json!({"root_id": "main", "path": "bin", "encoding": "base64"}),
    )
    .await
    .unwrap();
    assert_eq!(as_base64["content"], "//4A");
    gw.assert_requests_audited(15);

    let entries = gw.audit_entries();
    let write = entries
        .iter()
        .find(|e| e.record.method.as_deref() == Some("file.write"))
        .unwrap();
    assert_eq!(
        (
            write.record.root.as_deref(),
            write.record.path.as_deref(),
            write.record.bytes_in
        ),
        (Some("main"), Some("notes/today.txt"), 6)
    );
    let read = entries
        .iter()
        .find(|e| e.record.method.as_deref() == Some("file.read"))
        .unwrap();
    assert!(read.record.bytes_out > 0);
}

/// Deterministic bytes, generated as they are read (no file is kept).
struct Pattern {
    left: u64,
    state: u64,
    /// Shared with the test: the upload reads on a thread of its own.
    hasher: std::sync::Arc<std::sync::Mutex<Sha256>>,
}

impl std::io::Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.left as usize);
        for chunk in buf[..n].chunks_mut(8) {
            self.state = self
                .state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bytes = self.state.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        self.hasher.lock().unwrap().update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

struct HashingSink(Sha256, u64);

impl std::io::Write for HashingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        self.1 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A reader that hands out at most 1,000 bytes per read, as a pipe may.
struct Trickle(std::io::Cursor<Vec<u8>>);

impl std::io::Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(1000);
        self.0.read(&mut buf[..n])
    }
}

/// Local I/O that waits for the test's word: a transfer must leave the
/// async runtime free meanwhile (this test runs on a current-thread
/// runtime, so one blocked call would stall the client's socket too).
struct Gated<T> {
    gate: Option<std::sync::mpsc::Receiver<()>>,
    inner: T,
}

impl<T> Gated<T> {
    fn wait(&mut self) -> std::io::Result<()> {
        match self.gate.take() {
            Some(gate) => gate.recv_timeout(Duration::from_secs(10)).map_err(|_| {
                std::io::Error::other("the gate never opened: the runtime was blocked")
            }),
            None => Ok(()),
        }
    }
}

impl std::io::Read for Gated<std::io::Cursor<Vec<u8>>> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.wait()?;
        self.inner.read(buf)
    }
}

impl std::io::Write for Gated<Vec<u8>> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.wait()?;
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn transfers_leave_the_runtime_free_while_local_io_waits() {
    let (gw, client) = setup().await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut quiet = |_| {};
    let (open, gate) = std::sync::mpsc::channel();
    let input = Gated {
        gate: Some(gate),
        inner: std::io::Cursor::new(data.clone()),
    };
    let upload = client.upload("main", "gated.bin", input, Default::default(), &mut quiet);
    let meanwhile = async {
        client
            .ping()
            .await
            .expect("a ping while the upload's input waits");
        open.send(()).unwrap();
    };
    let (up, ()) = tokio::join!(upload, meanwhile);
    up.unwrap();
    assert_eq!(
        std::fs::read(gw.dir.join("workspace/gated.bin")).unwrap(),
        data
    );

    let (open, gate) = std::sync::mpsc::channel();
    let output = Gated {
        gate: Some(gate),
        inner: Vec::new(),
    };
    let download = client.download("main", "gated.bin", output, false, &mut quiet);
    let meanwhile = async {
        client
            .ping()
            .await
            .expect("a ping while the download's output waits");
        open.send(()).unwrap();
    };
    let (down, ()) = tokio::join!(download, meanwhile);
    assert_eq!(down.unwrap().1.inner, data);
    gw.assert_requests_audited(2);
}

/// An upload fills each record from short reads (stdin from a pipe) and
/// sends full records: the file arrives whole, and the progress reports
/// whole records until the last.
#[tokio::test]
async fn an_upload_from_short_reads_arrives_whole_in_full_records() {
    let (gw, client) = setup().await;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 253) as u8).collect();
    let mut progress = Vec::new();
    let up = client
        .upload(
            "main",
            "trickle.bin",
            Trickle(std::io::Cursor::new(data.clone())),
            UploadOptions::default(),
            &mut |n| progress.push(n),
        )
        .await
        .unwrap();
    assert_eq!(up["size"].as_u64(), Some(data.len() as u64), "{up}");
    assert_eq!(
        std::fs::read(gw.dir.join("workspace/trickle.bin")).unwrap(),
        data
    );
    // 200,000 bytes in records of about 65,500 data bytes: four records.
    assert_eq!(progress.len(), 4, "{progress:?}");
    assert_eq!(progress.last(), Some(&(data.len() as u64)));
    let steps: Vec<u64> = progress.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(steps[..2].iter().all(|&s| s == progress[0]), "{progress:?}");
    assert!(progress[0] > 60_000, "{progress:?}");
}

/// `sha256: false` on a streamed write and read: the same bytes, and no
/// digest in the results; asked for, the digest is the data's.
#[tokio::test]
async fn a_stream_without_sha256_moves_the_same_bytes_without_a_digest() {
    let (gw, client) = setup().await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let len = data.len() as u64;
    let up = client
        .upload(
            "main",
            "plain.bin",
            std::io::Cursor::new(data.clone()),
            UploadOptions {
                size: Some(len),
                ..Default::default()
            },
            &mut |_| {},
        )
        .await
        .unwrap();
    assert_eq!(up["size"].as_u64(), Some(len), "{up}");
    assert!(up.get("sha256").is_none(), "{up}");
    assert_eq!(
        std::fs::read(gw.dir.join("workspace/plain.bin")).unwrap(),
        data
    );
    let (got, down) = client
        .download("main", "plain.bin", Vec::new(), false, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(down, data);
    assert_eq!(got["length"].as_u64(), Some(len), "{got}");
    assert!(got.get("sha256").is_none(), "{got}");
    let (got, down) = client
        .download("main", "plain.bin", Vec::new(), true, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(down, data);
    assert_eq!(got["sha256"], hex::encode(Sha256::digest(&data)));
    gw.assert_requests_audited(3);
}

/// 1 GiB up and down by default (`PORTCULLIS_ROUNDTRIP_MIB` to change).
#[tokio::test]
async fn a_large_file_round_trips_with_matching_sha256() {
    let mib: u64 = std::env::var("PORTCULLIS_ROUNDTRIP_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let size = mib << 20;
    let (gw, client) = setup().await;
    let hasher = std::sync::Arc::new(std::sync::Mutex::new(Sha256::new()));
    let source = Pattern {
        left: size,
        state: 7,
        hasher: hasher.clone(),
    };
    let started = std::time::Instant::now();
    let up = client
        .upload(
            "main",
            "big.bin",
            source,
            UploadOptions {
                size: Some(size),
                sha256: true,
                ..Default::default()
            },
            &mut |_| {},
        )
        .await
        .unwrap();
    let upload_time = started.elapsed();
    let sent_hash = hex::encode(hasher.lock().unwrap().clone().finalize());
    assert_eq!(
        (up["size"].as_u64(), up["sha256"].as_str()),
        (Some(size), Some(sent_hash.as_str()))
    );
    assert_eq!(
        std::fs::metadata(gw.dir.join("workspace/big.bin"))
            .unwrap()
            .len(),
        size
    );

    // Every other 8 MiB out of the page cache (on a disk; tmpfs keeps
    // them): the stream reads some chunks on the runtime's worker and the
    // rest on blocking threads.
    let written = std::fs::File::open(gw.dir.join("workspace/big.bin")).unwrap();
    written.sync_all().unwrap();
    for start in (0..size).step_by(16 << 20) {
        let len = std::num::NonZeroU64::new(8 << 20);
        rustix::fs::fadvise(&written, start, len, rustix::fs::Advice::DontNeed).unwrap();
    }
    let started = std::time::Instant::now();
    let (down, sink) = client
        .download(
            "main",
            "big.bin",
            HashingSink(Sha256::new(), 0),
            true,
            &mut |_| {},
        )
        .await
        .unwrap();
    let download_time = started.elapsed();
    assert_eq!(sink.1, size);
    assert_eq!(hex::encode(sink.0.finalize()), sent_hash);
    assert_eq!(down["sha256"].as_str(), Some(sent_hash.as_str()));
    println!(
        "{mib} MiB: upload {:.0} MB/s, download {:.0} MB/s ({} build; figures belong to benches)",
        size as f64 / upload_time.as_secs_f64() / 1e6,
        size as f64 / download_time.as_secs_f64() / 1e6,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    std::fs::remove_file(gw.dir.join("workspace/big.bin")).unwrap();
    gw.assert_requests_audited(2);
    let entries = gw.audit_entries();
    assert!(entries.iter().any(|e| e.record.bytes_in == size));
    assert!(entries.iter().any(|e| e.record.bytes_out == size));
}

/// Files in `dir` (not recursive), by name.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn cancelled_and_failed_uploads_leave_no_file() {
    let (gw, client) = setup().await;
    let before = names(&gw.dir.join("workspace"));
    // Cancel part-way: the chunks sent so far are dropped with the temp file.
    let mut handle = client
        .start(
            "file.write",
            json!({"root_id": "main", "path": "partial.bin", "stream": true}),
        )
        .await
        .unwrap();
    let piece = vec![0x5a; 60_000];
    for _ in 0..50 {
        let mut rec = Vec::new();
        portcullis_wire::record::encode_chunk(
            &handle.id,
            portcullis_wire::record::Channel::FileData,
            &piece,
            &mut rec,
        )
        .unwrap();
        client.send_record(rec).await.unwrap();
    }
    assert!(!handle.finished());
    handle.cancel().await.unwrap();
    let cancelled = handle.response().await;
    assert_eq!(
        code(&cancelled),
        Some(ErrorCode::Cancelled),
        "{cancelled:?}"
    );
    assert_eq!(
        names(&gw.dir.join("workspace")),
        before,
        "a partial file was left"
    );

    // A size that does not match: refused at the end, nothing written.
    let short = Pattern {
        left: 1000,
        state: 1,
        hasher: Default::default(),
    };
    let wrong = client
        .upload(
            "main",
            "sized.bin",
            short,
            UploadOptions {
                size: Some(2000),
                ..Default::default()
            },
            &mut |_| {},
        )
        .await;
    assert_eq!(code(&wrong), Some(ErrorCode::InvalidRequest), "{wrong:?}");
    assert_eq!(names(&gw.dir.join("workspace")), before);

    // A download cancelled part-way answers `cancelled` and the session goes on.
    std::fs::write(gw.dir.join("workspace/big.bin"), vec![1u8; 64 << 20]).unwrap();
    let mut handle = client
        .start(
            "file.read",
            json!({"root_id": "main", "path": "big.bin", "stream": true}),
        )
        .await
        .unwrap();
    for _ in 0..3 {
        handle.next().await.unwrap();
    }
    handle.cancel().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), handle.response())
        .await
        .expect("the cancelled download answered");
    assert_eq!(code(&result), Some(ErrorCode::Cancelled), "{result:?}");
    client
        .request("file.stat", json!({"root_id": "main", "path": "big.bin"}))
        .await
        .unwrap();
    gw.assert_requests_audited(4);
    let statuses: Vec<_> = gw
        .audit_entries()
        .into_iter()
        .filter_map(|e| e.record.status)
        .collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == portcullis_store::Status::Cancelled)
            .count(),
        2
    );
}

/// A file cut short or replaced while it streams, as another process of
/// the agent's could: a cut ends the stream at the new end with an answer
/// that says how much was sent (not `eof`), a replacement changes nothing
/// (the stream reads the file it opened); neither hangs.
#[tokio::test]
async fn a_file_cut_or_replaced_while_it_streams_ends_or_goes_on_cleanly() {
    let (gw, client) = setup().await;
    let size: usize = 64 << 20; // far beyond the outbox and the sockets' buffers
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let path = gw.dir.join("workspace/moving.bin");
    for replace in [false, true] {
        std::fs::write(&path, &data).unwrap();
        let params = json!({"root_id": "main", "path": "moving.bin", "stream": true});
        let mut handle = client.start("file.read", params).await.unwrap();
        let mut received = Vec::new();
        let mut changed = false;
        loop {
            let item = tokio::time::timeout(Duration::from_secs(30), handle.next())
                .await
                .expect("the stream stalled");
            let Some(item) = item else { break };
            if let portcullis_client::StreamItem::Chunk { data, .. } = item {
                received.extend_from_slice(&data);
            }
            if !changed {
                changed = true;
                match replace {
                    false => std::fs::File::options()
                        .write(true)
                        .open(&path)
                        .unwrap()
                        .set_len(1 << 20)
                        .unwrap(),
                    true => {
                        let new = gw.dir.join("workspace/moving.new");
                        std::fs::write(&new, b"something else").unwrap();
                        std::fs::rename(&new, &path).unwrap();
                    }
                }
            }
        }
        let result = handle.response().await.unwrap();
        assert_eq!(result["length"].as_u64(), Some(received.len() as u64));
        assert_eq!(received[..], data[..received.len()]);
        match replace {
            false => {
                assert!(received.len() < size, "{} bytes came", received.len());
                assert_eq!(result["eof"], json!(false));
            }
            true => {
                assert_eq!(received.len(), size);
                assert_eq!(result["eof"], json!(true));
            }
        }
    }
    gw.assert_requests_audited(2);
}

/// `match` events and the terminal result of one search.
async fn search(client: &Client, params: Value) -> (Vec<Value>, Value) {
    let mut handle = client.start("file.search", params).await.unwrap();
    let mut matches = Vec::new();
    while let Some(item) = handle.next().await {
        if let portcullis_client::StreamItem::Stream { event, data } = item {
            assert_eq!(event, "match");
            matches.push(data);
        }
    }
    (matches, handle.response().await.unwrap())
}

#[tokio::test]
async fn search_streams_matches_within_globs_and_caps_and_never_leaves_the_root() {
    let (gw, client) = setup().await;
    let w = gw.dir.join("workspace");
    for dir in ["src", ".hidden", "target"] {
        std::fs::create_dir_all(w.join(dir)).unwrap();
    }
    std::fs::write(
        w.join("src/a.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )
    .unwrap();
    std::fs::write(w.join("src/b.txt"), "hello world\nHELLO\nhelo\n").unwrap();
    std::fs::write(w.join(".hidden/h.rs"), "hello\n").unwrap();
    std::fs::write(w.join("target/t.rs"), "hello\n").unwrap();
    std::fs::write(w.join("bin.dat"), b"hello\0\x01\x02 hello").unwrap();
    let mut answered = 0;

    // A regex over the tree, only *.rs outside target/, hidden skipped.
    let (matches, result) = search(
        &client,
        json!({"root_id": "main", "path": "", "pattern": "hel+o", "globs": ["*.rs", "!target/"]}),
    )
    .await;
    answered += 1;
    assert_eq!(matches.len(), 1, "{matches:?}");
    assert_eq!(matches[0]["path"], "/workspace/main/src/a.rs");
    assert_eq!(matches[0]["line"], 2);
    assert_eq!(matches[0]["column"], 15);
    assert_eq!(matches[0]["text"], "    println!(\"hello\");");
    assert_eq!(result["matches"], 1);
    assert_eq!(result["files_matched"], 1);
    assert_eq!(result["truncated"], false);

    // Hidden files on request; a literal, case-insensitive, in one file.
    let (matches, _) = search(
        &client,
        json!({"root_id": "main", "path": "", "pattern": "hello", "hidden": true, "globs": [".hidden/**"]}),
    )
    .await;
    answered += 1;
    assert_eq!(matches.len(), 1, "{matches:?}");
    assert_eq!(matches[0]["path"], "/workspace/main/.hidden/h.rs");
    let (matches, result) = search(
        &client,
        json!({"root_id": "main", "path": "src/b.txt", "pattern": "HEL+O", "literal": true, "case_insensitive": true}),
    )
    .await;
    answered += 1;
    assert_eq!(matches.len(), 0, "a literal `+`: {matches:?}");
    assert_eq!(result["files_searched"], 1);
    let (matches, _) = search(
        &client,
        json!({"root_id": "main", "path": "src/b.txt", "pattern": "HELLO", "literal": true, "case_insensitive": true}),
    )
    .await;
    answered += 1;
    let lines: Vec<&Value> = matches.iter().map(|m| &m["line"]).collect();
    assert_eq!(lines, [1, 2]);

    // Caps: results and bytes; a binary file is reported, not dumped.
    let (matches, result) = search(
        &client,
        json!({"root_id": "main", "path": "", "pattern": "hello", "max_results": 2}),
    )
    .await;
    answered += 1;
    assert_eq!(matches.len(), 2);
    assert_eq!(result["truncated_by"], "max_results");
    let (matches, result) = search(
        &client,
        json!({"root_id": "main", "path": "", "pattern": "hello", "max_bytes": 12}),
    )
    .await;
    answered += 1;
    assert!(matches.len() <= 1, "{matches:?}");
    assert_eq!(result["truncated_by"], "max_bytes");
    let (_, result) = search(
        &client,
        json!({"root_id": "main", "path": "bin.dat", "pattern": "hello"}),
    )
    .await;
    answered += 1;
    assert_eq!(result["skipped"]["binary"], 1, "{result}");

    // The secret sits outside, behind symlinks and a hard link in the
    // root: a search of the whole root never finds it.
    let (matches, result) = search(
        &client,
        json!({"root_id": "main", "path": "", "pattern": "TOP SECRET", "hidden": true}),
    )
    .await;
    answered += 1;
    assert!(matches.is_empty(), "{matches:?}");
    assert_eq!(
        result["skipped"]["unreadable"], 1,
        "the hard link: {result}"
    );

    // Bad patterns and globs are the caller's error, with a reason.
    for params in [
        json!({"root_id": "main", "path": "", "pattern": "("}),
        json!({"root_id": "main", "path": "", "pattern": ""}),
        json!({"root_id": "main", "path": "", "pattern": "x", "globs": ["a[b"]}),
        json!({"root_id": "main", "path": "", "pattern": "x{1000}{1000}"}),
    ] {
        let result = client.request("file.search", params.clone()).await;
        answered += 1;
        assert_eq!(
            code(&result),
            Some(ErrorCode::InvalidRequest),
            "{params}: {result:?}"
        );
    }
    gw.assert_requests_audited(answered);
    // A search is recorded when it starts and when it ends, with its root
    // and path.
    let entries = gw.audit_entries();
    let of_b = entries
        .iter()
        .filter(|e| e.record.method.as_deref() == Some("file.search"))
        .filter(|e| e.record.root.as_deref() == Some("main"))
        .filter(|e| e.record.path.as_deref() == Some("src/b.txt"))
        .count();
    assert_eq!(of_b, 4, "2 searches of src/b.txt, each a start and an end");
}

/// The next `file.changed` event for `path`, skipping others.
async fn change_of(client: &Client, path: &str) -> Option<Value> {
    change_within(client, path, Duration::from_secs(5)).await
}

async fn change_within(client: &Client, path: &str, within: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + within;
    while let Some(wait) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        let event = client.next_event(wait).await?;
        if event.event == "file.changed" && event.payload["path"] == path {
            return Some(event.payload);
        }
    }
    None
}

#[tokio::test]
async fn a_watch_reports_changes_until_disposed_or_revoked() {
    let (gw, client) = setup().await;
    let w = gw.dir.join("workspace");
    let watch = client
        .request(
            "file.watch",
            json!({"root_id": "main", "path": "", "recursive": true}),
        )
        .await
        .unwrap();
    assert_eq!(watch["root_id"], "main");
    assert_eq!(watch["complete"], true);
    let id = watch["watch"].as_str().unwrap().to_string();
    let listed = client.request("resource.list", json!({})).await.unwrap();
    assert_eq!(listed["resources"][0]["id"], id.as_str());
    assert_eq!(listed["resources"][0]["kind"], "file.watch");
    assert_eq!(listed["resources"][0]["path"], "/workspace/main");

    // Changes by anyone: on the host, in a subdirectory, in a directory
    // made after the watch began, and through the gateway.
    std::fs::write(w.join("new.txt"), "x").unwrap();
    let event = change_of(&client, "/workspace/main/new.txt")
        .await
        .expect("new.txt");
    assert_eq!(event["kind"], "created");
    assert_eq!(event["watch"], id.as_str());
    assert_eq!(event["root_id"], "main");
    std::fs::write(w.join("sub/inner.txt"), "changed").unwrap();
    let event = change_of(&client, "/workspace/main/sub/inner.txt")
        .await
        .expect("inner");
    assert_eq!(event["kind"], "modified");
    std::fs::create_dir(w.join("later")).unwrap();
    change_of(&client, "/workspace/main/later")
        .await
        .expect("later/");
    std::fs::write(w.join("later/deep.txt"), "x").unwrap();
    change_of(&client, "/workspace/main/later/deep.txt")
        .await
        .expect("later/deep.txt");
    client
        .request(
            "file.delete",
            json!({"root_id": "main", "path": "victim.txt"}),
        )
        .await
        .unwrap();
    let event = change_of(&client, "/workspace/main/victim.txt")
        .await
        .expect("victim");
    assert_eq!(event["kind"], "removed");

    // A watch outside any root is refused; one on a file works.
    let file_watch = client
        .request("file.watch", json!({"root_id": "main", "path": "new.txt"}))
        .await
        .unwrap();
    std::fs::write(w.join("new.txt"), "y").unwrap();
    change_of(&client, "/workspace/main/new.txt")
        .await
        .expect("the watched file");
    // Two watches over one directory both hear of its changes.
    let sub_watch = client
        .request("file.watch", json!({"root_id": "main", "path": "sub"}))
        .await
        .unwrap();
    std::fs::write(w.join("sub/inner.txt"), "twice").unwrap();
    let mut heard = Vec::new();
    for _ in 0..2 {
        let event = change_of(&client, "/workspace/main/sub/inner.txt").await;
        heard.push(event.expect("inner.txt, twice")["watch"].clone());
    }
    heard.sort_by_key(|w| w.to_string());
    assert_eq!(heard, [json!(id), sub_watch["watch"].clone()], "w1 < w3");

    // Disposed: no more events from it, and it is gone from the list.
    let disposed = client
        .request("resource.dispose", json!({"id": id}))
        .await
        .unwrap();
    assert_eq!(disposed["disposed"], true);
    let again = client.request("resource.dispose", json!({"id": id})).await;
    assert_eq!(code(&again), Some(ErrorCode::NotFound));
    std::fs::write(w.join("after.txt"), "x").unwrap();
    let quiet = Duration::from_millis(800);
    let after = change_within(&client, "/workspace/main/after.txt", quiet).await;
    assert!(after.is_none(), "an event after dispose: {after:?}");
    let listed = client.request("resource.list", json!({})).await.unwrap();
    assert_eq!(listed["resources"].as_array().unwrap().len(), 2, "{listed}");
    // The other watch on `sub` still works.
    std::fs::write(w.join("sub/inner.txt"), "thrice").unwrap();
    let event = change_of(&client, "/workspace/main/sub/inner.txt").await;
    assert_eq!(
        event.expect("after the dispose")["watch"],
        sub_watch["watch"]
    );

    // The policy takes `main` away: the watches on it end, and the session
    // is told.
    gw.write_policy(&policy_without_main(&gw));
    gw.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut told = Vec::new();
    while let Some(wait) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        match client.next_event(wait).await {
            Some(e) if e.event == "resource.disposed" => {
                told.push(e.payload["id"].clone());
                if told.len() == 2 {
                    break;
                }
            }
            Some(_) => continue,
            None => break,
        }
    }
    told.sort_by_key(|w| w.to_string());
    assert_eq!(
        told,
        [file_watch["watch"].clone(), sub_watch["watch"].clone()]
    );
    let listed = client.request("resource.list", json!({})).await.unwrap();
    assert_eq!(listed["resources"], json!([]));

    // A watch still held when the session ends stops with it.
    client
        .request(
            "file.watch",
            json!({"root_id": "docs", "path": "", "recursive": true}),
        )
        .await
        .unwrap();
    assert!(inotify_watches(&gw) > 0, "the watch holds no inotify watch");
    drop(client);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while inotify_watches(&gw) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(inotify_watches(&gw), 0, "a watch outlived its session");
    // 4 watches, 3 lists, 2 disposes, 1 delete.
    gw.assert_requests_audited(10);
}

/// inotify watches the gateway process holds (the daemon keeps one
/// inotify instance; each watched directory is one `wd` in its fdinfo).
fn inotify_watches(gw: &Gateway) -> usize {
    let pid = gw.pid();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|fd| {
            let fd = fd.ok()?;
            let target = std::fs::read_link(fd.path()).ok()?;
            target.to_string_lossy().contains("inotify").then(|| {
                let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
                let info = std::fs::read_to_string(info).unwrap_or_default();
                info.lines()
                    .filter(|l| l.starts_with("inotify wd:"))
                    .count()
            })
        })
        .sum()
}

/// The test policy, with `main` no longer granted.
fn policy_without_main(gw: &Gateway) -> String {
    let text = std::fs::read_to_string(gw.dir.join("policy.toml")).unwrap();
    let narrowed = text.replace(r#"main = "rw", "#, "");
    assert_ne!(narrowed, text);
    narrowed
}

#[tokio::test]
async fn file_edit_replaces_exact_text_all_or_nothing() {
    let (gw, client) = setup().await;
    let file = gw.dir.join("workspace/conf.toml");
    std::fs::write(&file, "port = 80\nhost = \"a\"\nport2 = 80\n").unwrap();
    let edit = |edits: Value| {
        let client = &client;
        async move {
            client
                .request(
                    "file.edit",
                    json!({"root_id": "main", "path": "conf.toml", "edits": edits}),
                )
                .await
        }
    };
    let done = edit(json!([
        {"old_text": "host = \"a\"", "new_text": "host = \"b\""},
        {"old_text": "= 80", "new_text": "= 8080", "replace_all": true},
    ]))
    .await
    .unwrap();
    let now = "port = 8080\nhost = \"b\"\nport2 = 8080\n";
    assert_eq!(std::fs::read_to_string(&file).unwrap(), now);
    assert_eq!(done["replacements"], 3);
    assert_eq!(done["sha256"], hex::encode(Sha256::digest(now.as_bytes())));
    // The second edit does not apply: the first is not written either.
    let refused = edit(json!([
        {"old_text": "host = \"b\"", "new_text": "host = \"c\""},
        {"old_text": "8080", "new_text": "1"},
    ]))
    .await;
    assert_eq!(
        code(&refused),
        Some(ErrorCode::InvalidRequest),
        "{refused:?}"
    );
    let Err(ClientError::Remote(e)) = &refused else {
        unreachable!()
    };
    assert!(
        e.message.contains("edit 2: old_text occurs 2 times"),
        "{}",
        e.message
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), now);
    std::fs::write(gw.dir.join("workspace/blob.bin"), [0xff, 0xfe, 0x00]).unwrap();
    let binary = client
        .request(
            "file.edit",
            json!({"root_id": "main", "path": "blob.bin", "edits": [{"old_text": "x", "new_text": "y"}]}),
        )
        .await;
    assert_eq!(code(&binary), Some(ErrorCode::InvalidRequest), "{binary:?}");
    let none = edit(json!([])).await;
    assert_eq!(code(&none), Some(ErrorCode::InvalidRequest), "{none:?}");
    gw.assert_requests_audited(4);
}

//! `cargo bench -p portcullis-store`: durable audit appends per second with
//! 1, 16 and 256 concurrent writers, and the latency of one append (which is
//! the group-commit latency its caller waits for), with and without the
//! journal's fdatasync that makes them survive power loss, and with and
//! without the head checkpoint signed after every group commit. Printed, not
//! asserted.

use std::time::{Duration, Instant};

use portcullis_store::{AuditSigner, Decision, Durability, Record, Status, Store};

const RUN: Duration = Duration::from_secs(3);

fn record() -> Record {
    Record {
        started_at: "2026-11-21T12:00:00Z".into(),
        completed_at: Some("2026-11-21T12:00:00.000123Z".into()),
        connection: Some(42),
        peer: Some("127.0.0.1:50000".into()),
        principal: Some("agent".into()),
        request_id: Some("c12345".into()),
        method: Some("file.read".into()),
        capability: Some("fileops".into()),
        decision: Some(Decision::Allowed),
        rule: Some("grant `dev` gives root `main` rw".into()),
        policy_generation: Some(
            "3cf0601ba1fc2dec40fb7ed35ee14ce8b32f274be4b439a73901e4a499dad5c4".into(),
        ),
        status: Some(Status::Succeeded),
        root: Some("main".into()),
        path: Some("src/lib.rs".into()),
        bytes_out: 4096,
        ..Record::default()
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let base = std::env::temp_dir().join(format!("portcullis-audit-bench-{}", std::process::id()));
    // Signed: a checkpoint over the head after every group commit, as the
    // daemon's log does (it has a key); unsigned, the cost of that apart.
    let kinds = [
        (Durability::Fdatasync, true),
        (Durability::Fdatasync, false),
        (Durability::Written, true),
    ];
    for (durability, signed) in kinds {
        for writers in [1usize, 16, 256] {
            let dir = base.join(format!("{durability:?}-{signed}-{writers}"));
            let store = Store::open(&dir).unwrap();
            let signer =
                signed.then(|| AuditSigner::load_or_create(&dir.join("audit.key")).unwrap());
            let log = store.audit_with(durability, signer).unwrap();
            let (count, mut latencies) = runtime.block_on(async {
                let deadline = Instant::now() + RUN;
                let tasks: Vec<_> = (0..writers)
                    .map(|_| {
                        let log = log.clone();
                        tokio::spawn(async move {
                            let mut latencies = Vec::new();
                            while Instant::now() < deadline {
                                let started = Instant::now();
                                log.append(record()).await.unwrap();
                                latencies.push(started.elapsed());
                            }
                            latencies
                        })
                    })
                    .collect();
                let mut all = Vec::new();
                for task in tasks {
                    all.extend(task.await.unwrap());
                }
                (all.len(), all)
            });
            latencies.sort();
            let pick = |q: f64| {
                latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)]
            };
            println!(
                "{durability:?}, {}, {writers:>3} writers: {:>8.0} appends/s, append latency p50 {:.3} ms, p99 {:.3} ms",
                if signed { "signed" } else { "unsigned" },
                count as f64 / RUN.as_secs_f64(),
                pick(0.5).as_secs_f64() * 1e3,
                pick(0.99).as_secs_f64() * 1e3
            );
            assert_eq!(log.verify(None).unwrap().error, None);
            if writers == 256 {
                // For sizing `[audit] max_entries`.
                let stats = log.stats().unwrap();
                println!(
                    "  on disk: {} entries, {} bytes, {:.0} bytes/entry",
                    stats.entries,
                    stats.size_on_disk,
                    stats.size_on_disk as f64 / stats.entries.max(1) as f64
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(base);
}

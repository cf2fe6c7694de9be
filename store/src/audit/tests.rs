//! The audit log's unit tests: they tamper with the trees directly.
use super::codec;
use super::entry::{entry_hash, entry_json, stored_entry, unpack};
use super::prune::PRUNE_CHUNK;
use super::*;
use crate::Store;
use crate::checkpoint::{Checkpoint, PruneMarker};
use crate::journal;
use sha2::Digest as _;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("portcullis-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn record(i: u64) -> Record {
    Record {
        started_at: jiff::Timestamp::from_second(1_800_000_000 + i as i64)
            .unwrap()
            .to_string(),
        principal: Some(if i.is_multiple_of(2) { "alice" } else { "bob" }.into()),
        method: Some(
            if i.is_multiple_of(3) {
                "file.read"
            } else {
                "shell.exec"
            }
            .into(),
        ),
        decision: Some(if i.is_multiple_of(5) {
            Decision::Blocked
        } else {
            Decision::Allowed
        }),
        status: Some(Status::Succeeded),
        ..Record::default()
    }
}

/// The stored bytes are exactly `Entry`'s serialization, whatever the
/// record holds (quotes, control characters, non-ASCII, empty fields).
#[test]
fn a_stored_entry_is_the_hashed_json_with_the_hash_last() {
    let mut odd = record(7);
    odd.peer = Some("\"quoted\" \\ back\u{1}slash, ünïcode ✓".into());
    odd.rule = Some(String::new());
    for (seq, record) in [
        (1, record(1)),
        (2, record(2)),
        (3, odd),
        (4, Record::default()),
    ] {
        let prev = format!("prev-{seq}");
        let (hash, stored) = stored_entry(seq, &prev, &record);
        let entry = Entry {
            seq,
            prev,
            record,
            hash,
        };
        assert_eq!(
            String::from_utf8(stored).unwrap(),
            serde_json::to_string(&entry).unwrap()
        );
    }
}

/// A log with entries 1..=n, and its store (kept open).
fn log_with(name: &str, n: u64) -> (Store, AuditLog, std::path::PathBuf) {
    let dir = temp(name);
    let store = Store::open(&dir).unwrap();
    let log = store.audit(None).unwrap();
    for i in 1..=n {
        assert_eq!(log.append_blocking(record(i)).unwrap(), i);
    }
    (store, log, dir)
}

/// Entry `seq` as JSON (what its hash is over, with the hash).
fn json_at(log: &AuditLog, seq: u64) -> serde_json::Value {
    let key = seq.to_be_bytes();
    let value = log.entries().get(key).unwrap().unwrap();
    serde_json::from_slice(&entry_json(&key, &value, &log.strings).unwrap()).unwrap()
}

/// Stores `json` (an entry) as entry `seq` in the compact form, as the
/// writer would, but with every string in the entry.
fn put(log: &AuditLog, seq: u64, json: serde_json::Value) {
    let entry: Entry = serde_json::from_value(json).unwrap();
    let compact = codec::encode(
        entry.seq,
        &entry.prev,
        &entry.hash,
        &entry.record,
        None,
        &mut Vec::new(),
    );
    log.tree.insert(seq.to_be_bytes(), compact).unwrap();
}

fn edit(log: &AuditLog, seq: u64, change: impl FnOnce(&mut serde_json::Value)) {
    let mut json = json_at(log, seq);
    change(&mut json);
    put(log, seq, json);
}

#[test]
fn concurrent_appends_get_unique_sequence_numbers_and_a_valid_chain() {
    let (_store, log, dir) = log_with("concurrent", 0);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..50)
                    .map(|i| log.append_blocking(record(t * 50 + i)).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
    let report = log.verify(None).unwrap();
    assert_eq!(
        (report.entries, report.last_seq, report.error),
        (400, 400, None)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The writer answers before it inserts into sled; a reader who saw
/// the answer still finds the entry (and its whole group).
#[test]
fn an_acknowledged_entry_is_found_at_once() {
    let dir = temp("found-at-once");
    let store = Store::open(&dir).unwrap();
    let log = store.audit_with(Durability::Written, None).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let seq = log.append_blocking(record(t * 100 + i)).unwrap();
                    assert!(log.get(seq).unwrap().is_some(), "entry {seq}");
                    assert!(log.stats().unwrap().last_seq >= seq, "entry {seq}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_edited_entry_is_found() {
    let (_store, log, dir) = log_with("edited", 6);
    edit(&log, 3, |e| e["principal"] = "mallory".into());
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::Edited { seq: 3 })
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Entries name their repeated strings by number: a string changed in the
/// table changes every entry naming it, and the first of them is found.
#[test]
fn an_edited_string_is_found() {
    let (store, log, dir) = log_with("edited-string", 6);
    let strings = store.db.open_tree(super::STRINGS).unwrap();
    let (id, method) = strings
        .iter()
        .map(Result::unwrap)
        .find(|(_, value)| value.as_ref() == b"file.read")
        .unwrap();
    assert_eq!(log.verify(None).unwrap().error, None);
    strings.insert(&id, &b"file.wipe"[..]).unwrap();
    drop((log, strings, method, store));
    // The table as a reopened store reads it; entry 3 is the first
    // `file.read`.
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(
        log.get(3).unwrap().unwrap().record.method.as_deref(),
        Some("file.wipe")
    );
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::Edited { seq: 3 })
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// sled holds entries in the compact form, a fraction of their JSON, and
/// names each repeated string once.
#[test]
fn entries_are_stored_compact() {
    let (store, log, dir) = log_with("compact", 50);
    let stored: usize = log.entries().iter().map(|item| item.unwrap().1.len()).sum();
    let json: usize = (1..=50)
        .map(|seq| json_at(&log, seq).to_string().len())
        .sum();
    assert!(
        stored * 3 < json,
        "{stored} bytes stored for {json} of JSON"
    );
    let strings = store.db.open_tree(super::STRINGS).unwrap();
    let names: Vec<_> = strings.iter().map(|item| item.unwrap().1).collect();
    let reads = names
        .iter()
        .filter(|name| name.as_ref() == b"file.read")
        .count();
    assert_eq!(reads, 1, "{names:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_deleted_entry_is_found() {
    let (_store, log, dir) = log_with("deleted", 6);
    log.tree.remove(4u64.to_be_bytes()).unwrap();
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::MissingBefore {
            seq: 5,
            expected: 4
        })
    );
    let (_store, log, dir2) = log_with("deleted-first", 3);
    log.tree.remove(1u64.to_be_bytes()).unwrap();
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::MissingBefore {
            seq: 2,
            expected: 1
        })
    );
    let _ = (std::fs::remove_dir_all(dir), std::fs::remove_dir_all(dir2));
}

#[test]
fn reordered_entries_are_found() {
    // Swapped as stored.
    let (_store, log, dir) = log_with("swapped", 6);
    let (two, three) = (
        log.tree.get(2u64.to_be_bytes()).unwrap().unwrap(),
        log.tree.get(3u64.to_be_bytes()).unwrap().unwrap(),
    );
    log.tree.insert(2u64.to_be_bytes(), three).unwrap();
    log.tree.insert(3u64.to_be_bytes(), two).unwrap();
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::Moved { key: 2, seq: 3 })
    );
    // Swapped and renumbered: the hashes give it away.
    let (_store, log, dir2) = log_with("renumbered", 6);
    let (mut a, mut b) = (json_at(&log, 2), json_at(&log, 3));
    std::mem::swap(&mut a["seq"], &mut b["seq"]);
    put(&log, 2, b);
    put(&log, 3, a);
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::Edited { seq: 2 })
    );
    let _ = (std::fs::remove_dir_all(dir), std::fs::remove_dir_all(dir2));
}

/// Opens the store in `dir` again, once the last handle this process
/// dropped has let go: the store's writer thread holds the database until
/// its queue closes, and a test's own sled handle until its flusher stops
/// — a moment after the drop, long enough on a loaded machine for an open
/// at once to find it `Locked` (up to 10 s here).
pub(crate) fn reopen(dir: &std::path::Path) -> Store {
    for _ in 0..1000 {
        if let Ok(store) = Store::open(dir) {
            return store;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the store did not reopen");
}

/// The payload of the journal's frame at `at`; `None` at its end.
fn frame_at(path: &std::path::Path, at: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::File::open(path).unwrap();
    let mut header = [0u8; 8];
    file.read_exact_at(&mut header, at).ok()?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let mut payload = vec![0u8; len];
    file.read_exact_at(&mut payload, at + 8).ok()?;
    (len > 0).then_some(payload)
}

/// Where the journal's frames end (zeros follow).
fn end_of_frames(path: &std::path::Path) -> u64 {
    journal::decode(&std::fs::read(path).unwrap()).1 as u64
}

#[test]
fn the_chain_continues_after_reopening() {
    let (store, log, dir) = log_with("reopen", 5);
    drop(log);
    drop(store);
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(log.recovery(), Recovery::default());
    assert_eq!(log.append_blocking(record(6)).unwrap(), 6);
    let report = log.verify(None).unwrap();
    assert_eq!((report.entries, report.error), (6, None));
    let _ = std::fs::remove_dir_all(dir);
}

const CRASH_CHILD: &str = "PORTCULLIS_STORE_CRASH_CHILD";

/// A process appends entries and aborts right after the last one is
/// acknowledged, before sled is flushed: reopening puts them back from
/// the journal, and a torn write after them is cut off.
#[test]
fn acknowledged_entries_survive_a_crash() {
    const N: u64 = 300;
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        let store = Store::open(std::path::Path::new(&dir)).unwrap();
        let log = store.audit(None).unwrap();
        for i in 1..=N {
            log.append_blocking(record(i)).unwrap();
        }
        std::process::abort();
    }
    let dir = temp("crash");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "audit::tests::acknowledged_entries_survive_a_crash",
            "--exact",
            "--nocapture",
        ])
        .env(CRASH_CHILD, &dir)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborts");
    let sled_held = {
        let db = sled::open(&dir).unwrap();
        db.open_tree(TREE).unwrap().len() as u64
    };
    // A half-written next group.
    let mut torn = Vec::new();
    journal::frame(b"{\"seq\":301", &mut torn);
    torn.truncate(torn.len() - 3);
    // Where the next group would have gone: after the journal's frames.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(JOURNAL))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &torn, end_of_frames(&dir.join(JOURNAL)))
        .unwrap();

    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    let recovery = log.recovery();
    assert!(sled_held < N, "sled lost entries in the crash");
    assert_eq!(recovery.restored, N - sled_held);
    assert_eq!(recovery.discarded_bytes, torn.len() as u64);
    let report = log.verify(None).unwrap();
    assert_eq!((report.entries, report.error), (N, None));
    assert_eq!(log.append_blocking(record(N + 1)).unwrap(), N + 1);
    assert!(frame_at(&dir.join(JOURNAL), 0).is_some());
    let _ = std::fs::remove_dir_all(dir);
}

/// The journal is emptied once it reaches its limit, with sled written
/// out first: nothing is lost across a reopen.
#[test]
fn a_full_journal_is_emptied_into_sled() {
    let dir = temp("journal-limit");
    let store = Store::open(&dir).unwrap();
    let log = store.audit_with(Durability::Written, None).unwrap();
    let path = dir.join(JOURNAL);
    // The file keeps its length: the journal's is where its frames end.
    let (mut n, mut end, mut largest) = (0, 0, 0);
    let mut first = None;
    let mut emptied = false;
    while n < 200_000 && !emptied {
        n += 1;
        log.append_blocking(record(n)).unwrap();
        // The writer empties it just after answering, so this may see it
        // only at the next append (a later entry first).
        let now_first = frame_at(&path, 0);
        if first.is_none() {
            first = now_first.clone();
        }
        emptied = now_first != first;
        while let Some(payload) = frame_at(&path, end).filter(|_| !emptied) {
            end += 8 + payload.len() as u64;
            largest = end;
        }
    }
    assert!(emptied, "the journal was never emptied ({n} entries)");
    // Within an entry (< 1 KiB) of the limit when last seen.
    assert!(
        largest + 1024 >= JOURNAL_LIMIT,
        "emptied at {largest} bytes"
    );
    drop(log);
    drop(store);
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    let report = log.verify(None).unwrap();
    assert_eq!((report.entries, report.error), (n, None));
    let _ = std::fs::remove_dir_all(dir);
}

/// sled lost an entry but kept later ones: the journal puts it back.
#[test]
fn the_journal_fills_a_hole_sled_left() {
    let (store, log, dir) = log_with("hole", 5);
    let entries: Vec<Entry> = (3..=5).map(|seq| log.get(seq).unwrap().unwrap()).collect();
    drop(log);
    drop(store);
    drop(reopen(&dir));
    {
        let db = sled::open(&dir).unwrap();
        db.open_tree(TREE)
            .unwrap()
            .remove(3u64.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let mut bytes = Vec::new();
    for entry in &entries {
        journal::frame(&serde_json::to_vec(entry).unwrap(), &mut bytes);
    }
    std::fs::write(dir.join(JOURNAL), &bytes).unwrap();
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(log.recovery().restored, 1);
    let report = log.verify(None).unwrap();
    assert_eq!((report.entries, report.error), (5, None));
    let _ = std::fs::remove_dir_all(dir);
}

/// A journal whose entries do not continue the log (a gap, an edited
/// entry) is refused, not silently merged or dropped.
#[test]
fn a_journal_that_does_not_continue_the_log_is_refused() {
    let (store, log, dir) = log_with("foreign-journal", 3);
    let entry = |seq: u64, prev: &str| {
        let record = record(seq);
        Entry {
            seq,
            prev: prev.to_string(),
            hash: entry_hash(seq, prev, &record),
            record,
        }
    };
    let third = log.get(3).unwrap().unwrap();
    drop(log);
    drop(store);
    let store = reopen(&dir);
    drop(store);
    let cases = [
        ("a gap", entry(5, &third.hash)),
        ("a wrong prev", entry(4, GENESIS)),
        (
            "a wrong hash",
            Entry {
                hash: GENESIS.into(),
                ..entry(4, &third.hash)
            },
        ),
        ("a changed stored entry", {
            let mut changed = record(3);
            changed.detail = Some("edited".into());
            Entry {
                seq: 3,
                prev: third.prev.clone(),
                hash: entry_hash(3, &third.prev, &changed),
                record: changed,
            }
        }),
    ];
    for (what, bad) in cases {
        let mut bytes = Vec::new();
        journal::frame(&serde_json::to_vec(&bad).unwrap(), &mut bytes);
        std::fs::write(dir.join(JOURNAL), &bytes).unwrap();
        let store = reopen(&dir);
        match store.audit(None) {
            Err(StoreError::Corrupt { seq, .. }) => assert_eq!(seq, bad.seq, "{what}"),
            Err(other) => panic!("{what}: {other}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A log with a signer and at least one checkpoint (1000 entries).
fn signed_log(name: &str) -> (Store, AuditLog, std::path::PathBuf, Vec<u8>) {
    let dir = temp(name);
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit(Some(signer)).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..250).for_each(|i| {
                    log.append_blocking(record(t * 250 + i)).unwrap();
                })
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    // The checkpoint is written right after the group that reached 1000.
    for _ in 0..100 {
        if !log.checkpoints.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The tests on it edit, move and remove entries one at a time.
    ungroup(&log);
    (store, log, dir, key)
}

/// Stores every entry under a key of its own (a group commit's entries
/// share one value), as an attacker may store them: verification does not
/// depend on how entries are grouped.
fn ungroup(log: &AuditLog) {
    let values: Vec<_> = log.entries().iter().map(Result::unwrap).collect();
    for (key, value) in values {
        for (seq, bytes) in unpack(&key, &value).unwrap() {
            log.tree.insert(seq.to_be_bytes(), bytes).unwrap();
        }
    }
}

/// A group commit's entries share one value in sled: every reader finds
/// each of them, verification and export go through them in order, and
/// a prune whose cut falls inside a group keeps the group whole.
#[test]
fn a_group_commit_is_one_value() {
    let dir = temp("groups");
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit(Some(signer)).unwrap();
    // One alone; then queued faster than the writer syncs: it takes them
    // in groups (fewer than 100 values for 499 entries means a group of
    // three or more after the first entry).
    log.append_blocking(record(1)).unwrap();
    let submitted: Vec<_> = (2..=500).map(|i| log.submit(record(i)).unwrap()).collect();
    for (i, entry) in submitted.into_iter().enumerate() {
        assert_eq!(entry.wait().unwrap(), i as u64 + 2);
    }
    let values = log.entries().len();
    assert!(values < 100, "{values} values for 500 entries");
    for seq in 1..=500 {
        assert_eq!(log.get(seq).unwrap().unwrap().seq, seq);
    }
    assert_eq!(log.get(501).unwrap(), None);
    let seqs = |entries: Vec<Entry>| entries.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(
        seqs(log.after(250, 10).unwrap()),
        (251..=260).collect::<Vec<_>>()
    );
    let newest = Filter {
        limit: 3,
        ..Filter::default()
    };
    assert_eq!(seqs(log.list(&newest).unwrap()), [500, 499, 498]);
    let stats = log.stats().unwrap();
    assert_eq!(
        (stats.entries, stats.first_seq, stats.last_seq),
        (500, 1, 500)
    );
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!((report.entries, report.error), (500, None));
    let mut export = Vec::new();
    assert_eq!(log.export(&mut export).unwrap(), 500);
    let report = verify_export(export.as_slice(), &key).unwrap();
    assert_eq!((report.entries, report.error), (500, None));

    // Keeping the newest 500 - first would cut right after a group's first
    // entry: the group stays, and only the values before it go.
    let first = log
        .entries()
        .iter()
        .map(Result::unwrap)
        .map(|(k, v)| (key_seq(&k), unpack(&k, &v).unwrap().len()))
        .find(|(k, len)| *k > 1 && *len > 2)
        .map(|(k, _)| k)
        .unwrap();
    assert_eq!(
        log.prune_blocking(Retain::Newest(500 - first)).unwrap(),
        first - 1
    );
    let stats = log.stats().unwrap();
    assert_eq!((stats.first_seq, stats.entries), (first, 500 - first + 1));
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!((report.entries, report.error), (500 - first + 1, None));
    let _ = std::fs::remove_dir_all(dir);
}

/// Pruning every entry, then a restart before anything else is
/// written: the log continues after the prune marker.
#[test]
fn the_log_continues_after_pruning_everything_and_reopening() {
    let (store, log, dir, key) = signed_log("prune-all");
    assert_eq!(log.prune_blocking(Retain::Newest(0)).unwrap(), 1000);
    drop(log);
    drop(store);
    let store = reopen(&dir.join("store"));
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let log = store.audit(Some(signer)).unwrap();
    assert_eq!(log.append_blocking(record(1)).unwrap(), 1001);
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!((report.entries, report.error), (1, None));
    let _ = std::fs::remove_dir_all(dir);
}

/// Rewrites entries from `from` on as an attacker without the signing
/// key would: edited content, recomputed hashes and links.
fn rewrite_from(log: &AuditLog, from: u64) {
    let mut prev = log
        .get(from - 1)
        .unwrap()
        .map_or(GENESIS.to_string(), |e| e.hash);
    let last = log.tree.last().unwrap().map(|(k, _)| key_seq(&k)).unwrap();
    for seq in from..=last {
        let mut entry = log.get(seq).unwrap().unwrap();
        if seq == from {
            entry.record.principal = Some("mallory".into());
        }
        entry.prev = prev.clone();
        entry.hash = entry_hash(seq, &entry.prev, &entry.record);
        prev = entry.hash.clone();
        log.tree
            .insert(seq.to_be_bytes(), serde_json::to_vec(&entry).unwrap())
            .unwrap();
    }
}

#[test]
fn signed_checkpoints_catch_a_recomputed_chain() {
    let (_store, log, dir, key) = signed_log("checkpoints");
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!(report.error, None);
    assert!(
        report.checkpoints >= 1 && report.signed_through >= 1000,
        "{report:?}"
    );

    rewrite_from(&log, 5);
    let report = log.verify(Some(&key)).unwrap();
    let signed = report.entries; // the chain itself looks fine up to the checkpoint…
    assert!(
        matches!(report.error, Some(VerifyError::CheckpointMismatch { .. })),
        "{report:?} after {signed}"
    );

    // …and a forged checkpoint over the new head has no valid signature.
    let (ck, _) = log.checkpoints.first().unwrap().unwrap();
    let mut forged: Checkpoint =
        serde_json::from_slice(&log.checkpoints.get(&ck).unwrap().unwrap()).unwrap();
    forged.head = log.get(key_seq(&ck)).unwrap().unwrap().hash;
    log.checkpoints
        .insert(&ck, serde_json::to_vec(&forged).unwrap())
        .unwrap();
    assert!(matches!(
        log.verify(Some(&key)).unwrap().error,
        Some(VerifyError::CheckpointInvalid { .. })
    ));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_export_verifies_with_the_public_key_alone() {
    let (_store, log, dir, key) = signed_log("export");
    let mut export = Vec::new();
    assert_eq!(log.export(&mut export).unwrap(), log.tree.len() as u64);
    let report = verify_export(export.as_slice(), &key).unwrap();
    assert_eq!(report.error, None);
    assert!(report.checkpoints >= 1);

    let other = crate::AuditSigner::load_or_create(&dir.join("other.key")).unwrap();
    let wrong = verify_export(export.as_slice(), other.public_key()).unwrap();
    assert!(
        matches!(wrong.error, Some(VerifyError::CheckpointInvalid { .. })),
        "{wrong:?}"
    );

    let text = String::from_utf8(export)
        .unwrap()
        .replacen("\"alice\"", "\"mallory\"", 1);
    let edited = verify_export(text.as_bytes(), &key).unwrap();
    assert!(
        matches!(edited.error, Some(VerifyError::Edited { .. })),
        "{edited:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pruning_keeps_the_rest_verifiable() {
    let dir = temp("prune");
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit(Some(signer)).unwrap();
    for i in 1..=20 {
        log.append_blocking(record(i)).unwrap();
    }
    // Entries 1..=10 started before second 11.
    let before = jiff::Timestamp::from_second(1_800_000_011).unwrap();
    assert_eq!(log.prune_blocking(Retain::Since(before)).unwrap(), 10);
    assert_eq!(log.get(10).unwrap(), None);
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!(
        (report.error, report.entries, report.pruned_before),
        (None, 10, 11)
    );
    assert_eq!(
        log.append_blocking(record(21)).unwrap(),
        21,
        "the sequence goes on"
    );
    assert_eq!(log.verify(Some(&key)).unwrap().error, None);

    let mut export = Vec::new();
    log.export(&mut export).unwrap();
    let offline = verify_export(export.as_slice(), &key).unwrap();
    assert_eq!((offline.error, offline.pruned_before), (None, 11));
    let other = crate::AuditSigner::load_or_create(&dir.join("other.key")).unwrap();
    let wrong = verify_export(export.as_slice(), other.public_key()).unwrap();
    assert_eq!(
        wrong.error,
        Some(VerifyError::PruneInvalid { first_seq: 11 })
    );

    // Claiming the log starts later (hiding entries 11..) needs a signature.
    let mut forged: PruneMarker =
        serde_json::from_slice(&log.meta.get(PRUNE_KEY).unwrap().unwrap()).unwrap();
    forged.first_seq = 15;
    forged.prev = log.get(14).unwrap().unwrap().hash;
    log.meta
        .insert(PRUNE_KEY, serde_json::to_vec(&forged).unwrap())
        .unwrap();
    for seq in 11..15u64 {
        log.tree.remove(seq.to_be_bytes()).unwrap();
    }
    assert_eq!(
        log.verify(Some(&key)).unwrap().error,
        Some(VerifyError::PruneInvalid { first_seq: 15 })
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pruning_to_a_count_keeps_the_newest() {
    let dir = temp("prune-count");
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit(Some(signer)).unwrap();
    for i in 1..=25 {
        log.append_blocking(record(i)).unwrap();
    }
    assert_eq!(log.stats().unwrap().entries, 25);
    assert_eq!(log.prune_blocking(Retain::Newest(10)).unwrap(), 15);
    let stats = log.stats().unwrap();
    assert_eq!(
        (stats.entries, stats.first_seq, stats.last_seq),
        (10, 16, 25)
    );
    assert_eq!(
        log.prune_blocking(Retain::Newest(10)).unwrap(),
        0,
        "already within"
    );
    assert_eq!(log.prune_blocking(Retain::Newest(100)).unwrap(), 0);
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!((report.error, report.entries), (None, 10));
    assert_eq!(log.prune_blocking(Retain::Newest(0)).unwrap(), 10);
    assert_eq!(log.stats().unwrap().entries, 0);
    assert_eq!(log.append_blocking(record(26)).unwrap(), 26);
    assert_eq!(log.verify(Some(&key)).unwrap().error, None);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pruning_more_than_a_batch_removes_them_all_and_appends_go_on() {
    let dir = temp("prune-many");
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit_with(Durability::Written, Some(signer)).unwrap();
    let total = 3 * PRUNE_CHUNK as u64 + 7;
    for i in 1..=total {
        log.append_blocking(record(i)).unwrap();
    }
    let pruning = {
        let log = log.clone();
        std::thread::spawn(move || log.prune_blocking(Retain::Newest(10)))
    };
    // Appends are answered while the removal runs (or after it).
    let appended = log.append_blocking(record(total + 1)).unwrap();
    assert_eq!(appended, total + 1);
    let removed = pruning.join().unwrap().unwrap();
    let stats = log.stats().unwrap();
    // The append landed before or after the marker: 10 or 11 kept.
    assert_eq!(removed + stats.entries, total + 1);
    assert!((10..=11).contains(&stats.entries), "{stats:?}");
    assert_eq!(stats.last_seq, total + 1);
    let report = log.verify(Some(&key)).unwrap();
    assert_eq!((report.error, report.entries), (None, stats.entries));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn entries_left_below_a_prune_marker_are_not_counted_again_and_go() {
    let dir = temp("prune-leftover");
    let store = Store::open(&dir.join("store")).unwrap();
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    let key = signer.public_key().to_vec();
    let log = store.audit(Some(signer)).unwrap();
    for i in 1..=30 {
        log.append_blocking(record(i)).unwrap();
    }
    let entry_3 = log.entries().get(3u64.to_be_bytes()).unwrap().unwrap();
    assert_eq!(log.prune_blocking(Retain::Newest(20)).unwrap(), 10);
    // A removal a crash cut short leaves entries below the marker.
    log.entries().insert(3u64.to_be_bytes(), entry_3).unwrap();
    assert_eq!(log.verify(Some(&key)).unwrap().error, None);
    assert_eq!(log.prune_blocking(Retain::Newest(15)).unwrap(), 5);
    assert!(log.entries().get(3u64.to_be_bytes()).unwrap().is_none());
    let stats = log.stats().unwrap();
    assert_eq!((stats.entries, stats.first_seq), (15, 16));
    assert_eq!(log.verify(Some(&key)).unwrap().error, None);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pruning_without_the_key_is_refused() {
    let (_store, log, dir) = log_with("prune-unsigned", 3);
    assert!(log.prune_blocking(Retain::Newest(1)).is_err());
    let nothing_older = Retain::Since(jiff::Timestamp::UNIX_EPOCH);
    assert!(log.prune_blocking(nothing_older).is_err(), "refused, not 0");
    assert_eq!(log.verify(None).unwrap().entries, 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn list_filters_newest_first() {
    let (_store, log, dir) = log_with("list", 30);
    let all = log
        .list(&Filter {
            limit: 1000,
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(all.first().map(|e| e.seq), Some(30));
    assert_eq!(all.len(), 30);
    let alice_reads = log
        .list(&Filter {
            principal: Some("alice".into()),
            method: Some("file.*".into()),
            limit: 1000,
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(
        alice_reads.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [30, 24, 18, 12, 6]
    );
    let blocked = log
        .list(&Filter {
            decision: Some(Decision::Blocked),
            limit: 2,
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(blocked.iter().map(|e| e.seq).collect::<Vec<_>>(), [30, 25]);
    let since = jiff::Timestamp::from_second(1_800_000_028).unwrap();
    let recent = log
        .list(&Filter {
            since: Some(since),
            limit: 1000,
            ..Filter::default()
        })
        .unwrap();
    assert_eq!(
        recent.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [30, 29, 28]
    );
    assert_eq!(
        log.after(27, 10)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [28, 29, 30]
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Stores `hashed` (an entry's JSON without its hash) as entry `seq`, the
/// way the writer does: the hash over these bytes, appended last.
fn store_raw(log: &AuditLog, seq: u64, hashed: &str) -> String {
    let hash = hex::encode(sha2::Sha256::digest(hashed.as_bytes()));
    let stored = format!("{},\"hash\":\"{hash}\"}}", &hashed[..hashed.len() - 1]);
    log.tree
        .insert(seq.to_be_bytes(), stored.as_bytes())
        .unwrap();
    hash
}

/// Entries written by another build — a field this one does not know, its
/// own fields absent or in another order — verify over their stored bytes,
/// in the store and in an export; a change inside the unknown field is
/// still found. (Verifying by re-serializing the decoded record, as before,
/// dropped the unknown field and called the entry edited.)
#[test]
fn entries_of_another_shape_verify_over_their_bytes() {
    let (_store, log, dir) = log_with("shapes", 3);
    let mut prev = log.get(3).unwrap().unwrap().hash;
    let newer = format!(
        r#"{{"seq":4,"prev":"{prev}","kind":"request","started_at":"2026-11-24T10:00:00Z","principal":"alice","added_later":{{"limits":[1,2]}}}}"#
    );
    prev = store_raw(&log, 4, &newer);
    let reordered = format!(
        r#"{{"kind":"security","prev":"{prev}","started_at":"2026-11-24T10:00:01Z","seq":5}}"#
    );
    store_raw(&log, 5, &reordered);
    let report = log.verify(None).unwrap();
    assert_eq!(report.error, None, "{report:?}");
    assert_eq!(report.entries, 5);
    assert_eq!(
        log.get(4).unwrap().unwrap().record.principal.as_deref(),
        Some("alice")
    );

    let mut export = Vec::new();
    log.export(&mut export).unwrap();
    let any_key = [7u8; 32];
    let report = verify_export(export.as_slice(), &any_key).unwrap();
    assert_eq!(report.error, None, "{report:?}");
    assert_eq!(report.entries, 5);
    let text = String::from_utf8(export).unwrap();
    assert!(
        text.contains(&newer[..newer.len() - 1]),
        "the export keeps the stored bytes"
    );

    let edited = text.replace("[1,2]", "[1,3]");
    let report = verify_export(edited.as_bytes(), &any_key).unwrap();
    assert_eq!(report.error, Some(VerifyError::Edited { seq: 4 }));
    let stored = log.tree.get(4u64.to_be_bytes()).unwrap().unwrap();
    let tampered = String::from_utf8(stored.to_vec())
        .unwrap()
        .replace("[1,2]", "[1,3]");
    log.tree
        .insert(4u64.to_be_bytes(), tampered.as_bytes())
        .unwrap();
    assert_eq!(
        log.verify(None).unwrap().error,
        Some(VerifyError::Edited { seq: 4 })
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An export written before entries were exported verbatim (format v1:
/// each entry re-encoded with its keys sorted) still verifies, and an edit
/// in it is still found.
#[test]
fn a_version_1_export_still_verifies() {
    let (_store, log, dir, key) = signed_log("export-v1");
    let mut v2 = Vec::new();
    log.export(&mut v2).unwrap();
    let v1: String = String::from_utf8(v2)
        .unwrap()
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            if value["type"] == "header" {
                value["format"] = "portcullis-audit-export v1".into();
            }
            format!("{value}\n") // serde_json's maps sort their keys
        })
        .collect();
    assert!(v1.contains(r#""entry":{"bytes_in""#) || v1.contains(r#""entry":{"capability""#));
    let report = verify_export(v1.as_bytes(), &key).unwrap();
    assert_eq!(report.error, None, "{report:?}");
    assert!(report.checkpoints >= 1);
    let edited = v1.replacen("\"alice\"", "\"mallory\"", 1);
    let report = verify_export(edited.as_bytes(), &key).unwrap();
    assert!(
        matches!(report.error, Some(VerifyError::Edited { .. })),
        "{report:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn start(i: u64) -> Record {
    Record {
        kind: Kind::RequestStart,
        status: None,
        request_id: Some(format!("r{i}")),
        ..record(i)
    }
}

fn completion(i: u64, start_seq: u64) -> Record {
    Record {
        request_id: Some(format!("r{i}")),
        start_seq: Some(start_seq),
        ..record(i)
    }
}

/// Entries whose status is `interrupted`, as (its start entry, request id).
fn interrupted(log: &AuditLog) -> Vec<(u64, String)> {
    let everything = Filter {
        limit: usize::MAX,
        ..Filter::default()
    };
    let mut found: Vec<(u64, String)> = log
        .list(&everything)
        .unwrap()
        .into_iter()
        .filter(|e| e.record.status == Some(Status::Interrupted))
        .map(|e| {
            assert_eq!(e.record.kind, Kind::Request);
            assert!(e.record.completed_at.is_some());
            (e.record.start_seq.unwrap(), e.record.request_id.unwrap())
        })
        .collect();
    found.sort();
    found
}

#[test]
fn a_start_entry_left_open_is_completed_as_interrupted_on_open() {
    let dir = temp("interrupted");
    let store = Store::open(&dir).unwrap();
    let log = store.audit(None).unwrap();
    let first = log.append_blocking(start(1)).unwrap();
    let second = log.append_blocking(start(2)).unwrap();
    log.append_blocking(completion(1, first)).unwrap();
    let third = log.append_blocking(start(3)).unwrap();
    drop(log);
    drop(store);

    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(log.recovery().interrupted, 2);
    assert_eq!(
        interrupted(&log),
        vec![(second, "r2".to_string()), (third, "r3".to_string())]
    );
    let report = log.verify(None).unwrap();
    assert_eq!((report.error, report.interrupted), (None, 2));
    drop(log);
    drop(store);
    // Completed once: not again.
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(log.recovery().interrupted, 0);
    assert_eq!(interrupted(&log).len(), 2);
    let _ = std::fs::remove_dir_all(dir);
}

const INTENT_CRASH_CHILD: &str = "PORTCULLIS_STORE_INTENT_CRASH_CHILD";

/// A process that aborts with requests in flight, after sled lost some of
/// its entries: each request whose start entry was acknowledged and whose
/// completion was not is completed as interrupted on open, whether its
/// entries came back from sled or from the journal; no other is.
#[test]
fn start_entries_open_at_a_crash_are_completed_as_interrupted() {
    const REQUESTS: u64 = 200;
    if let Some(dir) = std::env::var_os(INTENT_CRASH_CHILD) {
        let store = Store::open(std::path::Path::new(&dir)).unwrap();
        let log = store.audit(None).unwrap();
        // Request i completes unless i is a multiple of 7.
        for i in 1..=REQUESTS {
            let seq = log.append_blocking(start(i)).unwrap();
            if !i.is_multiple_of(7) {
                log.append_blocking(completion(i, seq)).unwrap();
            }
        }
        std::process::abort();
    }
    let dir = temp("intent-crash");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "audit::tests::start_entries_open_at_a_crash_are_completed_as_interrupted",
            "--exact",
            "--nocapture",
        ])
        .env(INTENT_CRASH_CHILD, &dir)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborts");
    let store = Store::open(&dir).unwrap();
    let log = store.audit(None).unwrap();
    assert!(
        log.recovery().restored > 0,
        "sled lost entries in the crash"
    );
    let open: Vec<String> = (1..=REQUESTS)
        .filter(|i| i.is_multiple_of(7))
        .map(|i| format!("r{i}"))
        .collect();
    assert_eq!(log.recovery().interrupted, open.len() as u64);
    let found: Vec<String> = interrupted(&log).into_iter().map(|(_, id)| id).collect();
    let mut want = open.clone();
    want.sort();
    let mut found_sorted = found.clone();
    found_sorted.sort();
    assert_eq!(found_sorted, want);
    assert_eq!(log.verify(None).unwrap().error, None);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every acknowledged entry is covered by a signature: the head
/// checkpoint, signed after each group commit.
#[test]
fn the_head_checkpoint_covers_every_acknowledged_entry() {
    let (_store, log, dir, key) = signed_log("head");
    for i in 0..7 {
        log.append_blocking(record(1000 + i)).unwrap();
        let report = log.verify(Some(&key)).unwrap();
        assert_eq!(report.error, None);
        assert_eq!(report.signed_through, report.last_seq, "{report:?}");
    }
    // Entries deleted from the end (by someone without the key) show.
    let last = log.tree.last().unwrap().map(|(k, _)| key_seq(&k)).unwrap();
    for seq in last - 2..=last {
        log.tree.remove(seq.to_be_bytes()).unwrap();
    }
    assert_eq!(
        log.verify(Some(&key)).unwrap().error,
        Some(VerifyError::CheckpointOrphan { seq: last })
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The head checkpoint as a signed note: read back with the key, refused
/// when changed or signed by another key.
#[test]
fn a_checkpoint_note_round_trips_and_refuses_changes() {
    let (_store, log, dir, key) = signed_log("note");
    let head = log.head_checkpoint().unwrap().unwrap();
    let note = head.note().unwrap();
    assert!(
        note.starts_with(&format!("{}\n1000\n", crate::origin_of(&key))),
        "{note}"
    );
    assert_eq!(Checkpoint::from_note(&note, &key).unwrap(), head);
    let changed = note.replacen("\n1000\n", "\n999\n", 1);
    assert_eq!(
        Checkpoint::from_note(&changed, &key),
        Err(crate::NoteError::BadSignature)
    );
    let other = crate::AuditSigner::load_or_create(&dir.join("other.key")).unwrap();
    assert_eq!(
        Checkpoint::from_note(&note, other.public_key()),
        Err(crate::NoteError::NoSignature)
    );
    assert_eq!(
        Checkpoint::from_note("hello\n", &key),
        Err(crate::NoteError::Shape)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Re-signs every checkpoint with the log's own key, as an attacker with
/// the host (and so the key) would after rewriting the chain.
fn resign_everything(log: &AuditLog, dir: &std::path::Path) {
    let signer = crate::AuditSigner::load_or_create(&dir.join("audit.key")).unwrap();
    log.checkpoints.clear().unwrap();
    let (k, _) = log.tree.last().unwrap().unwrap();
    let last = log.get(key_seq(&k)).unwrap().unwrap();
    let head = signer.sign(last.seq, &last.hash);
    log.meta
        .insert(HEAD_CHECKPOINT_KEY, serde_json::to_vec(&head).unwrap())
        .unwrap();
}

/// A checkpoint kept off the host catches what the key on the host no
/// longer can: a rewritten chain, re-signed, and a log cut short,
/// re-signed; in the store and in an export.
#[test]
fn a_checkpoint_kept_off_the_host_catches_a_resigned_rewrite_or_truncation() {
    let (_store, log, dir, key) = signed_log("kept");
    let kept = log.head_checkpoint().unwrap().unwrap();
    for i in 0..5 {
        log.append_blocking(record(2000 + i)).unwrap();
    }
    let report = log.verify_against(Some(&key), Some(&kept)).unwrap();
    assert_eq!((report.error, report.kept_through), (None, Some(1000)));
    let mut export = Vec::new();
    log.export(&mut export).unwrap();
    let from_export = crate::verify_export_against(export.as_slice(), &key, Some(&kept)).unwrap();
    assert_eq!(
        (from_export.error, from_export.kept_through),
        (None, Some(1000))
    );
    // The export ends with a checkpoint over its last entry.
    let last_line = String::from_utf8_lossy(&export)
        .lines()
        .last()
        .unwrap()
        .to_string();
    assert!(last_line.contains(r#""type":"checkpoint""#), "{last_line}");
    assert_eq!(from_export.signed_through, from_export.last_seq);

    // Cut short below the kept checkpoint, and re-signed.
    let last = log.tree.last().unwrap().map(|(k, _)| key_seq(&k)).unwrap();
    for seq in 990..=last {
        log.tree.remove(seq.to_be_bytes()).unwrap();
    }
    resign_everything(&log, &dir);
    assert_eq!(
        log.verify(Some(&key)).unwrap().error,
        None,
        "re-signed: looks fine"
    );
    assert_eq!(
        log.verify_against(Some(&key), Some(&kept)).unwrap().error,
        Some(VerifyError::Truncated {
            seq: 1000,
            last: 989
        })
    );

    // Rewritten from entry 5 on, and re-signed.
    let (_store2, log2, dir2, key2) = signed_log("kept-rewrite");
    let kept2 = log2.head_checkpoint().unwrap().unwrap();
    rewrite_from(&log2, 5);
    resign_everything(&log2, &dir2);
    assert_eq!(
        log2.verify(Some(&key2)).unwrap().error,
        None,
        "re-signed: looks fine"
    );
    assert_eq!(
        log2.verify_against(Some(&key2), Some(&kept2))
            .unwrap()
            .error,
        Some(VerifyError::Rewritten { seq: 1000 })
    );
    let _ = (std::fs::remove_dir_all(dir), std::fs::remove_dir_all(dir2));
}

/// A store an earlier build wrote (entries as JSON) is read, continued in
/// the compact form, and verifies whole, in the store and exported.
#[test]
fn a_log_of_json_entries_continues_compact() {
    let (store, log, dir) = log_with("upgrade", 0);
    let mut prev = GENESIS.to_string();
    for seq in 1..=3 {
        let (hash, json) = stored_entry(seq, &prev, &record(seq));
        log.tree.insert(seq.to_be_bytes(), json).unwrap();
        prev = hash;
    }
    drop((log, store));
    let store = reopen(&dir);
    let log = store.audit(None).unwrap();
    assert_eq!(log.append_blocking(record(4)).unwrap(), 4);
    let first_byte = |seq: u64| log.entries().get(seq.to_be_bytes()).unwrap().unwrap()[0];
    assert_eq!((first_byte(3), first_byte(4)), (b'{', codec::COMPACT_V1));
    assert_eq!(log.get(4).unwrap().unwrap().prev, prev);
    let report = log.verify(None).unwrap();
    assert_eq!((report.entries, report.error), (4, None));
    let mut export = Vec::new();
    assert_eq!(log.export(&mut export).unwrap(), 4);
    let report = verify_export(export.as_slice(), &[7u8; 32]).unwrap();
    assert_eq!((report.entries, report.error), (4, None));
    let _ = std::fs::remove_dir_all(dir);
}

/// A group whose journal write fails is not in the log, and neither are
/// the strings it interned: once the log resumes, an entry naming the
/// same new string stores it afresh, and reads back and verifies, also
/// after the store is reopened.
#[test]
fn a_failed_group_leaves_no_string_behind() {
    let (store, log, dir) = log_with("failed-group", 2);
    let carol = Record {
        principal: Some("carol".into()),
        method: Some("file.stat.carol".into()),
        ..record(3)
    };
    journal::fault::fail_next_write(&dir.join(JOURNAL));
    assert!(matches!(
        log.append_blocking(carol.clone()),
        Err(StoreError::Failed { .. })
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while log.stopped().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "the log never resumed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let seq = log.append_blocking(carol).unwrap();
    let resumed = log.get(seq - 1).unwrap().unwrap();
    assert_eq!(resumed.record.event.as_deref(), Some("audit_resumed"));
    let read = |log: &AuditLog| {
        let entry = log.get(seq).unwrap().unwrap();
        let report = log.verify(None).unwrap();
        assert_eq!((report.entries, report.error), (seq, None));
        (entry.record.principal, entry.record.method)
    };
    let expected = (Some("carol".into()), Some("file.stat.carol".into()));
    assert_eq!(read(&log), expected);
    drop((log, store));
    let store = reopen(&dir);
    assert_eq!(read(&store.audit(None).unwrap()), expected);
    let _ = std::fs::remove_dir_all(dir);
}

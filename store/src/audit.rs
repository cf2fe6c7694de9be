//! The audit log: entries keyed by sequence number (8 bytes, big-endian) in
//! the sled tree `audit`. Each entry carries the hash of the previous one:
//!
//! ```text
//! hash(n) = SHA-256( JSON of {seq, prev, record} )   where prev = hash(n-1)
//! ```
//!
//! so an edited, deleted or reordered entry breaks the chain at a place
//! [`AuditLog::verify`] names. Appends go through one writer thread that
//! takes every queued record, writes them as one sled batch, flushes, and
//! `fdatasync`s sled's log file before answering: many concurrent requests
//! share one flush, and nothing is acknowledged before it is on disk.

use std::fs::File;
use std::path::Path;
use std::sync::mpsc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::StoreError;

const TREE: &str = "audit";
/// The `prev` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Records taken into one batch at most.
const MAX_BATCH: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A request, when it ends (or is refused).
    #[default]
    Request,
    /// A long-running request, when it starts.
    RequestStart,
    /// Handshake and authentication failures, reloads, revocations.
    Security,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    Approved,
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// What a caller records. No secret, token or file content belongs here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub kind: Kind,
    /// RFC 3339.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// The gateway's session (connection) number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<RequestContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The policy rule that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    /// For security events: what happened (`auth_refused`, `policy_reloaded`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A stored entry: the record, its place in the chain, and its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub prev: String,
    #[serde(flatten)]
    pub record: Record,
    pub hash: String,
}

/// The hashed part of an entry: everything but the hash itself.
#[derive(Serialize)]
struct Hashed<'a> {
    seq: u64,
    prev: &'a str,
    #[serde(flatten)]
    record: &'a Record,
}

fn entry_hash(seq: u64, prev: &str, record: &Record) -> String {
    let bytes = serde_json::to_vec(&Hashed { seq, prev, record }).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

type Reply = oneshot::Sender<Result<u64, StoreError>>;

/// How far a group commit goes before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// sled's flush, then `fdatasync` of its log file: survives power loss.
    Fdatasync,
    /// sled's flush alone (`sync_file_range`): survives a process crash, not
    /// necessarily power loss. For measuring what the fdatasync costs.
    SledFlush,
}

/// A handle to the audit log; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    tree: sled::Tree,
    jobs: mpsc::Sender<(Record, Reply)>,
}

impl AuditLog {
    pub(crate) fn open(
        db: &sled::Db,
        dir: &Path,
        durability: Durability,
    ) -> Result<Self, StoreError> {
        let tree = db
            .open_tree(TREE)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let (seq, hash) = match tree.last().map_err(|e| StoreError::Io(e.to_string()))? {
            Some((key, value)) => {
                let entry = decode(&key, &value)?;
                (entry.seq, entry.hash)
            }
            None => (0, GENESIS.to_string()),
        };
        // sled 0.34 persists with sync_file_range, which neither flushes the
        // drive's write cache nor the file's metadata: fdatasync its log too.
        let log_file = File::open(dir.join("db"))
            .map_err(|e| StoreError::Io(format!("sled log file: {e}")))?;
        let (jobs, queue) = mpsc::channel();
        let writer = Writer {
            db: db.clone(),
            tree: tree.clone(),
            log_file,
            durability,
            seq,
            head: hash,
            failed: false,
        };
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run(queue))
            .map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Self { tree, jobs })
    }

    /// Appends `record`; returns its sequence number once it is durable.
    pub async fn append(&self, record: Record) -> Result<u64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send((record, reply))
            .map_err(|_| StoreError::Failed)?;
        answer.await.map_err(|_| StoreError::Failed)?
    }

    /// [`append`](Self::append) for callers outside an async runtime.
    pub fn append_blocking(&self, record: Record) -> Result<u64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send((record, reply))
            .map_err(|_| StoreError::Failed)?;
        answer.blocking_recv().map_err(|_| StoreError::Failed)?
    }

    pub fn get(&self, seq: u64) -> Result<Option<Entry>, StoreError> {
        match self
            .tree
            .get(seq.to_be_bytes())
            .map_err(|e| StoreError::Io(e.to_string()))?
        {
            Some(value) => decode(&seq.to_be_bytes(), &value).map(Some),
            None => Ok(None),
        }
    }

    /// Entries matching `filter`, newest first, at most `filter.limit`.
    pub fn list(&self, filter: &Filter) -> Result<Vec<Entry>, StoreError> {
        let matcher = filter.method_matcher();
        let mut out = Vec::new();
        for item in self.tree.iter().rev() {
            let (key, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            let entry = decode(&key, &value)?;
            if filter
                .since
                .as_ref()
                .is_some_and(|since| !at_or_after(&entry.record.started_at, since))
            {
                break; // newest first: everything further is older
            }
            if filter.matches(&entry, matcher.as_ref()) {
                out.push(entry);
                if out.len() >= filter.limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Entries after `seq`, oldest first (for `audit tail -f`).
    pub fn after(&self, seq: u64, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        for item in self.tree.range((seq + 1).to_be_bytes()..).take(limit) {
            let (key, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            out.push(decode(&key, &value)?);
        }
        Ok(out)
    }

    /// Recomputes the whole chain. The first broken link is reported.
    pub fn verify(&self) -> Result<VerifyReport, StoreError> {
        let mut report = VerifyReport::default();
        let mut prev: Option<Entry> = None;
        for item in self.tree.iter() {
            let (key, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            let seq = key_seq(&key);
            let entry = match decode(&key, &value) {
                Ok(entry) => entry,
                Err(e) => {
                    report.error = Some(VerifyError::Unreadable {
                        seq,
                        message: e.to_string(),
                    });
                    return Ok(report);
                }
            };
            let problem = if entry.seq != seq {
                Some(VerifyError::Moved {
                    key: seq,
                    seq: entry.seq,
                })
            } else if entry_hash(entry.seq, &entry.prev, &entry.record) != entry.hash {
                Some(VerifyError::Edited { seq })
            } else {
                match &prev {
                    None if entry.seq != 1 || entry.prev != GENESIS => {
                        Some(VerifyError::MissingBefore { seq, expected: 1 })
                    }
                    Some(p) if entry.seq != p.seq + 1 => Some(VerifyError::MissingBefore {
                        seq,
                        expected: p.seq + 1,
                    }),
                    Some(p) if entry.prev != p.hash => Some(VerifyError::Unlinked { seq }),
                    _ => None,
                }
            };
            if let Some(problem) = problem {
                report.error = Some(problem);
                return Ok(report);
            }
            report.entries += 1;
            report.last_seq = entry.seq;
            report.head = entry.hash.clone();
            prev = Some(entry);
        }
        Ok(report)
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub entries: u64,
    pub last_seq: u64,
    pub head: String,
    /// The first broken link; `None` when the whole chain holds.
    pub error: Option<VerifyError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum VerifyError {
    #[error("entry {seq} was edited: its content does not match its hash")]
    Edited { seq: u64 },
    #[error("entry {seq} follows a gap: entry {expected} is missing (deleted)")]
    MissingBefore { seq: u64, expected: u64 },
    #[error("entry {seq} does not link to the entry before it (reordered or replaced)")]
    Unlinked { seq: u64 },
    #[error("the entry stored under {key} says it is entry {seq} (moved)")]
    Moved { key: u64, seq: u64 },
    #[error("entry {seq} is unreadable: {message}")]
    Unreadable { seq: u64, message: String },
}

/// What `audit list` selects.
#[derive(Debug, Clone)]
pub struct Filter {
    pub since: Option<jiff::Timestamp>,
    pub until: Option<jiff::Timestamp>,
    pub principal: Option<String>,
    /// A glob such as `file.*`.
    pub method: Option<String>,
    pub decision: Option<Decision>,
    pub status: Option<Status>,
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            since: None,
            until: None,
            principal: None,
            method: None,
            decision: None,
            status: None,
            limit: 100,
        }
    }
}

impl Filter {
    fn method_matcher(&self) -> Option<globset::GlobMatcher> {
        let pattern = self.method.as_ref()?;
        // An invalid glob matches literally.
        Some(
            globset::Glob::new(pattern)
                .or_else(|_| globset::Glob::new(&globset::escape(pattern)))
                .ok()?
                .compile_matcher(),
        )
    }

    fn matches(&self, entry: &Entry, method: Option<&globset::GlobMatcher>) -> bool {
        let r = &entry.record;
        self.until.as_ref().is_none_or(|until| {
            !at_or_after(&r.started_at, until) || r.started_at == until.to_string()
        }) && self
            .principal
            .as_ref()
            .is_none_or(|p| r.principal.as_ref() == Some(p))
            && method.is_none_or(|m| r.method.as_ref().is_some_and(|name| m.is_match(name)))
            && self.decision.is_none_or(|d| r.decision == Some(d))
            && self.status.is_none_or(|s| r.status == Some(s))
    }
}

fn at_or_after(time: &str, reference: &jiff::Timestamp) -> bool {
    time.parse::<jiff::Timestamp>()
        .is_ok_and(|t| t >= *reference)
}

fn key_seq(key: &[u8]) -> u64 {
    key.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

fn decode(key: &[u8], value: &[u8]) -> Result<Entry, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        seq: key_seq(key),
        message: e.to_string(),
    })
}

/// The single writer: sequence numbers and the chain head live here only.
struct Writer {
    db: sled::Db,
    tree: sled::Tree,
    log_file: File,
    durability: Durability,
    seq: u64,
    head: String,
    failed: bool,
}

impl Writer {
    fn run(mut self, queue: mpsc::Receiver<(Record, Reply)>) {
        while let Ok(first) = queue.recv() {
            let mut group = vec![first];
            group.extend(queue.try_iter().take(MAX_BATCH - 1));
            let results = self.commit(group.iter().map(|(record, _)| record));
            for ((_, reply), result) in group.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }

    /// Writes one group durably; every record gets its sequence number, or
    /// all get the error.
    fn commit<'a>(
        &mut self,
        records: impl Iterator<Item = &'a Record>,
    ) -> Vec<Result<u64, StoreError>> {
        let records: Vec<&Record> = records.collect();
        if self.failed {
            return records.iter().map(|_| Err(StoreError::Failed)).collect();
        }
        let (mut seq, mut head) = (self.seq, self.head.clone());
        let mut batch = sled::Batch::default();
        let mut seqs = Vec::with_capacity(records.len());
        for record in &records {
            seq += 1;
            let hash = entry_hash(seq, &head, record);
            let entry = Entry {
                seq,
                prev: head,
                record: (*record).clone(),
                hash: hash.clone(),
            };
            let value = serde_json::to_vec(&entry).unwrap_or_default();
            batch.insert(&seq.to_be_bytes(), value);
            seqs.push(seq);
            head = hash;
        }
        let durable = self
            .tree
            .apply_batch(batch)
            .and_then(|()| self.db.flush().map(|_| ()))
            .map_err(|e| e.to_string())
            .and_then(|()| match self.durability {
                Durability::Fdatasync => self.log_file.sync_data().map_err(|e| e.to_string()),
                Durability::SledFlush => Ok(()),
            });
        match durable {
            Ok(()) => {
                self.seq = seq;
                self.head = head;
                seqs.into_iter().map(Ok).collect()
            }
            Err(message) => {
                // Whether any of it reached the disk is unknown: stop, so no
                // request runs unaudited.
                self.failed = true;
                records
                    .iter()
                    .map(|_| Err(StoreError::Io(message.clone())))
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("portcullis-store-{name}-{}", std::process::id()));
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

    /// A log with entries 1..=n, and its store (kept open).
    fn log_with(name: &str, n: u64) -> (Store, AuditLog, std::path::PathBuf) {
        let dir = temp(name);
        let store = Store::open(&dir).unwrap();
        let log = store.audit().unwrap();
        for i in 1..=n {
            assert_eq!(log.append_blocking(record(i)).unwrap(), i);
        }
        (store, log, dir)
    }

    fn edit(log: &AuditLog, seq: u64, change: impl FnOnce(&mut serde_json::Value)) {
        let value = log.tree.get(seq.to_be_bytes()).unwrap().unwrap();
        let mut json: serde_json::Value = serde_json::from_slice(&value).unwrap();
        change(&mut json);
        log.tree
            .insert(seq.to_be_bytes(), serde_json::to_vec(&json).unwrap())
            .unwrap();
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
        let report = log.verify().unwrap();
        assert_eq!(
            (report.entries, report.last_seq, report.error),
            (400, 400, None)
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_edited_entry_is_found() {
        let (_store, log, dir) = log_with("edited", 6);
        edit(&log, 3, |e| e["principal"] = "mallory".into());
        assert_eq!(
            log.verify().unwrap().error,
            Some(VerifyError::Edited { seq: 3 })
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_deleted_entry_is_found() {
        let (_store, log, dir) = log_with("deleted", 6);
        log.tree.remove(4u64.to_be_bytes()).unwrap();
        assert_eq!(
            log.verify().unwrap().error,
            Some(VerifyError::MissingBefore {
                seq: 5,
                expected: 4
            })
        );
        let (_store, log, dir2) = log_with("deleted-first", 3);
        log.tree.remove(1u64.to_be_bytes()).unwrap();
        assert_eq!(
            log.verify().unwrap().error,
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
            log.verify().unwrap().error,
            Some(VerifyError::Moved { key: 2, seq: 3 })
        );
        // Swapped and renumbered: the hashes give it away.
        let (_store, log, dir2) = log_with("renumbered", 6);
        let mut a: serde_json::Value =
            serde_json::from_slice(&log.tree.get(2u64.to_be_bytes()).unwrap().unwrap()).unwrap();
        let mut b: serde_json::Value =
            serde_json::from_slice(&log.tree.get(3u64.to_be_bytes()).unwrap().unwrap()).unwrap();
        std::mem::swap(&mut a["seq"], &mut b["seq"]);
        log.tree
            .insert(2u64.to_be_bytes(), serde_json::to_vec(&b).unwrap())
            .unwrap();
        log.tree
            .insert(3u64.to_be_bytes(), serde_json::to_vec(&a).unwrap())
            .unwrap();
        assert_eq!(
            log.verify().unwrap().error,
            Some(VerifyError::Edited { seq: 2 })
        );
        let _ = (std::fs::remove_dir_all(dir), std::fs::remove_dir_all(dir2));
    }

    #[test]
    fn the_chain_continues_after_reopening() {
        let (store, log, dir) = log_with("reopen", 5);
        drop(log);
        drop(store);
        // The writer thread holds the database until it sees its queue close.
        let mut reopened = None;
        for _ in 0..200 {
            if let Ok(store) = Store::open(&dir) {
                reopened = Some(store);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let store = reopened.expect("the store reopens");
        let log = store.audit().unwrap();
        assert_eq!(log.append_blocking(record(6)).unwrap(), 6);
        let report = log.verify().unwrap();
        assert_eq!((report.entries, report.error), (6, None));
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
}

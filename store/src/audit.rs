//! The audit log: entries keyed by sequence number (8 bytes, big-endian) in
//! the sled tree `audit`. Each entry carries the hash of the previous one:
//!
//! ```text
//! hash(n) = SHA-256( JSON of {seq, prev, record} )   where prev = hash(n-1)
//! ```
//!
//! so an edited, deleted or reordered entry breaks the chain at a place
//! [`AuditLog::verify`] names. Appends go through one writer thread that
//! takes every queued record, writes them to the journal
//! ([`crate::journal`]) in one write and `fdatasync`s it before answering:
//! many concurrent requests share one sync, and nothing is acknowledged
//! before it is on disk. Then it inserts them into sled's tree — after
//! the answers, so that no request waits for sled; a reader waits for
//! those inserts instead ([`AuditLog::entries`]). sled itself is flushed
//! and synced when the journal has grown, at checkpoints and at shutdown;
//! then the journal is emptied.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::StoreError;
use crate::checkpoint::{AuditSigner, Checkpoint, PruneMarker};
use crate::journal::{self, Journal};

const TREE: &str = "audit";
const CHECKPOINTS: &str = "audit_checkpoints";
const META: &str = "audit_meta";
const PRUNE_KEY: &[u8] = b"prune";
/// A checkpoint is signed after this many entries…
const CHECKPOINT_EVERY: u64 = 1000;
/// …or this long after the last one, whichever comes first.
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// The `prev` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Records taken into one batch at most.
const MAX_BATCH: usize = 4096;
/// The journal's name in the store directory.
const JOURNAL: &str = "audit.journal";
/// sled is flushed, and the journal emptied, once the journal holds this
/// much (some thousands of entries).
const JOURNAL_LIMIT: u64 = 4 * 1024 * 1024;

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
    /// Something the operator should know about how the request ran (a
    /// command confined less than its grant asks, on a best-effort grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// For a call a script made: the `script.run` request it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<String>,
    /// For an approved call: who approved it (`uid 1000`, or `remembered`
    /// with the earlier approval's author).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
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
    stored_entry(seq, prev, record).0
}

/// An entry's hash and the entry as stored, from one serialization: the
/// stored JSON is the hashed JSON with `hash` added last, which is what
/// serializing [`Entry`] gives (a test holds them to it).
fn stored_entry(seq: u64, prev: &str, record: &Record) -> (String, Vec<u8>) {
    let mut json = serde_json::to_vec(&Hashed { seq, prev, record }).unwrap_or_default();
    let hash = hex::encode(Sha256::digest(&json));
    json.pop(); // the closing brace
    json.extend_from_slice(b",\"hash\":\"");
    json.extend_from_slice(hash.as_bytes());
    json.extend_from_slice(b"\"}");
    (hash, json)
}

type Reply = oneshot::Sender<Result<u64, StoreError>>;
/// An entry as sled stores it: its sequence number and its JSON.
type Stored = (u64, Vec<u8>);

/// What the writer thread is asked to do.
enum Job {
    Append(Box<Record>, Reply),
    /// Sign a checkpoint over everything written so far, now.
    Checkpoint(oneshot::Sender<()>),
    /// Remove the oldest entries, as far as the bound says.
    Prune(Cut, PruneReply),
}

/// What the writer is asked to prune: a [`Retain`] with its time resolved
/// to a sequence number beforehand (that takes a scan).
#[derive(Debug, Clone, Copy)]
enum Cut {
    Newest(u64),
    /// Everything up to and including this entry.
    Through(u64),
}

/// Which of the oldest entries a prune removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retain {
    /// Keep entries started at or after this time (and everything after
    /// the first of them: the log is pruned from its start only).
    Since(jiff::Timestamp),
    /// Keep at most this many of the newest entries.
    Newest(u64),
}

/// How big the log is, for retention and `audit status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LogStats {
    pub entries: u64,
    /// Sequence number of the oldest entry kept (0 when empty).
    pub first_seq: u64,
    pub last_seq: u64,
    /// Bytes sled occupies on disk (all trees; sled reclaims space lazily).
    pub size_on_disk: u64,
}

/// How far a group commit goes before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to the journal and `fdatasync`ed: survives power loss.
    Fdatasync,
    /// Written to the journal, not synced: survives a process crash, not
    /// power loss. For measuring what the fdatasync costs.
    Written,
}

/// What opening the log found in its journal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Entries the journal held that sled had lost (after a crash), now
    /// back in sled.
    pub restored: u64,
    /// Bytes of a half-written last group, never acknowledged, cut off.
    pub discarded_bytes: u64,
}

/// Upper bounds (seconds) of the group-commit latency histogram.
pub const COMMIT_BUCKETS: [f64; 10] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// What the writer has committed since the log was opened: group commits,
/// the entries in them, and how long each commit (journal write and
/// fdatasync) took. Shared between the writer thread and every
/// handle.
#[derive(Default)]
struct CommitCounters {
    commits: AtomicU64,
    entries: AtomicU64,
    micros: AtomicU64,
    /// Commits no slower than `COMMIT_BUCKETS[i]`, not cumulative.
    buckets: [AtomicU64; COMMIT_BUCKETS.len()],
}

impl CommitCounters {
    fn record(&self, entries: usize, took: std::time::Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.entries.fetch_add(entries as u64, Ordering::Relaxed);
        self.micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        let seconds = took.as_secs_f64();
        if let Some(i) = COMMIT_BUCKETS.iter().position(|&le| seconds <= le) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A reading of the group commits so far (see [`AuditLog::commit_stats`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CommitStats {
    pub commits: u64,
    pub entries: u64,
    pub seconds: f64,
    /// Cumulative: commits that took at most `COMMIT_BUCKETS[i]` seconds.
    pub at_most: [u64; COMMIT_BUCKETS.len()],
}

/// An entry queued by [`AuditLog::submit`].
#[must_use = "an entry is durable only once waited for"]
pub struct Submitted(oneshot::Receiver<Result<u64, StoreError>>);

impl Submitted {
    /// Blocks (outside an async runtime) until the entry is durable;
    /// returns its sequence number.
    pub fn wait(self) -> Result<u64, StoreError> {
        self.0.blocking_recv().map_err(|_| StoreError::WriterGone)?
    }

    /// Waits until the entry is durable; returns its sequence number.
    pub async fn durable(self) -> Result<u64, StoreError> {
        self.0.await.map_err(|_| StoreError::WriterGone)?
    }
}

/// A handle to the audit log; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    db: sled::Db,
    tree: sled::Tree,
    checkpoints: sled::Tree,
    meta: sled::Tree,
    jobs: mpsc::Sender<Job>,
    /// The public half of the signer, when this log signs.
    public_key: Option<Vec<u8>>,
    counters: Arc<CommitCounters>,
    /// Held by the writer from answering a group until its entries are in
    /// `tree` (see [`Self::entries`]).
    indexing: Arc<Mutex<()>>,
    recovery: Recovery,
}

impl AuditLog {
    pub(crate) fn open(
        db: &sled::Db,
        dir: &Path,
        durability: Durability,
        signer: Option<AuditSigner>,
    ) -> Result<Self, StoreError> {
        let tree = db
            .open_tree(TREE)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let checkpoints = db
            .open_tree(CHECKPOINTS)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let meta = db
            .open_tree(META)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        let signed_through = match checkpoints
            .last()
            .map_err(|e| StoreError::Io(e.to_string()))?
        {
            Some((key, _)) => key_seq(&key),
            None => 0,
        };
        // sled 0.34 persists with sync_file_range, which neither flushes the
        // drive's write cache nor the file's metadata: fdatasync its log too.
        let log_file = File::open(dir.join("db"))
            .map_err(|e| StoreError::Io(format!("sled log file: {e}")))?;
        let (journal, found) = Journal::open(&dir.join(JOURNAL))
            .map_err(|e| StoreError::Io(format!("audit journal {JOURNAL}: {e}")))?;
        let mut writer = Writer {
            db: db.clone(),
            tree: tree.clone(),
            log_file,
            journal,
            durability,
            seq: 0,
            head: GENESIS.to_string(),
            failed: None,
            checkpoints: checkpoints.clone(),
            meta: meta.clone(),
            public_key: signer.as_ref().map(|s| s.public_key().to_vec()),
            signer,
            signed_through,
            last_checkpoint: std::time::Instant::now(),
            counters: Arc::new(CommitCounters::default()),
            indexing: Arc::default(),
            removing: Arc::default(),
        };
        // A log pruned to nothing continues where its prune marker says.
        let marker = read_prune_marker(&meta)?.and_then(Result::ok);
        if let Some((key, value)) = tree.last().map_err(|e| StoreError::Io(e.to_string()))? {
            let entry = decode(&key, &value)?;
            (writer.seq, writer.head) = (entry.seq, entry.hash);
        } else if let Some(marker) = &marker {
            (writer.seq, writer.head) = (marker.first_seq.saturating_sub(1), marker.prev.clone());
        }
        let kept_from = marker.map_or(1, |marker| marker.first_seq);
        let recovery = Recovery {
            restored: writer.restore(found.frames, kept_from)?,
            discarded_bytes: found.discarded,
        };
        let (jobs, queue) = mpsc::channel::<Job>();
        let counters = writer.counters.clone();
        let indexing = writer.indexing.clone();
        let public_key = writer.public_key.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run(queue))
            .map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Self {
            db: db.clone(),
            tree,
            checkpoints,
            meta,
            jobs,
            public_key,
            counters,
            indexing,
            recovery,
        })
    }

    /// The entries' tree, holding every entry acknowledged so far: the
    /// writer answers a group once its journal is synced and inserts it
    /// into sled right after, holding `indexing` from before the first
    /// answer until the last insert. So whoever saw an answer and then
    /// reads waits here for that group's inserts (microseconds).
    fn entries(&self) -> &sled::Tree {
        drop(self.indexing.lock().unwrap_or_else(|e| e.into_inner()));
        &self.tree
    }

    /// What opening the log found in its journal (after a crash: entries
    /// put back into sled, a torn last write cut off).
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The group commits so far, for metrics.
    pub fn commit_stats(&self) -> CommitStats {
        let c = &self.counters;
        let mut at_most = [0; COMMIT_BUCKETS.len()];
        let mut sum = 0;
        for (total, bucket) in at_most.iter_mut().zip(&c.buckets) {
            sum += bucket.load(Ordering::Relaxed);
            *total = sum;
        }
        CommitStats {
            commits: c.commits.load(Ordering::Relaxed),
            entries: c.entries.load(Ordering::Relaxed),
            seconds: c.micros.load(Ordering::Relaxed) as f64 / 1e6,
            at_most,
        }
    }

    /// Appends `record`; returns its sequence number once it is durable.
    pub async fn append(&self, record: Record) -> Result<u64, StoreError> {
        self.submit(record)?.durable().await
    }

    /// Queues `record` for appending without waiting: entries are written
    /// in the order they are submitted, and [`Submitted::wait`] says when
    /// this one is durable. For a caller that must only have every entry
    /// durable before it next speaks (a script's nested requests), so a
    /// run of them shares one flush.
    pub fn submit(&self, record: Record) -> Result<Submitted, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Append(Box::new(record), reply))
            .map_err(|_| StoreError::WriterGone)?;
        Ok(Submitted(answer))
    }

    /// Removes the oldest entries — the longest run from the start whose
    /// `started_at` is before `before` — leaving a signed prune marker so the
    /// rest still verifies. Needs the audit key. Returns how many went.
    pub async fn prune(&self, before: jiff::Timestamp) -> Result<u64, StoreError> {
        self.prune_to(Retain::Since(before)).await
    }

    /// Removes the oldest entries beyond `bound`; see [`prune`](Self::prune).
    pub async fn prune_to(&self, bound: Retain) -> Result<u64, StoreError> {
        // Resolving an age takes a scan: on a thread of its own, not the
        // writer's (appends go on) nor the runtime's.
        let (log, (found, cut)) = (self.clone(), oneshot::channel());
        std::thread::Builder::new()
            .name("audit-prune".into())
            .spawn(move || {
                let _ = found.send(log.cut(bound));
            })
            .map_err(|e| StoreError::Io(format!("cannot start a thread to prune: {e}")))?;
        let Some(cut) = cut.await.map_err(|_| StoreError::WriterGone)?? else {
            return Ok(0);
        };
        let answer = self.send_prune(cut)?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }

    /// [`prune_to`](Self::prune_to) outside an async runtime.
    pub fn prune_blocking(&self, bound: Retain) -> Result<u64, StoreError> {
        let Some(cut) = self.cut(bound)? else {
            return Ok(0);
        };
        let answer = self.send_prune(cut)?;
        answer.blocking_recv().map_err(|_| StoreError::WriterGone)?
    }

    /// What the writer is to prune for `bound`; None when nothing goes.
    /// Refused without the key, before any work.
    fn cut(&self, bound: Retain) -> Result<Option<Cut>, StoreError> {
        self.can_prune()?;
        Ok(match bound {
            Retain::Newest(keep) => Some(Cut::Newest(keep)),
            Retain::Since(before) => {
                last_started_before(&self.tree, &self.meta, &before)?.map(Cut::Through)
            }
        })
    }

    fn send_prune(
        &self,
        cut: Cut,
    ) -> Result<oneshot::Receiver<Result<u64, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Prune(cut, reply))
            .map_err(|_| StoreError::WriterGone)?;
        Ok(answer)
    }

    /// Pruning signs a marker: without the key, refused before any work.
    fn can_prune(&self) -> Result<(), StoreError> {
        match self.public_key {
            Some(_) => Ok(()),
            None => Err(StoreError::Io(NO_PRUNING_KEY.into())),
        }
    }

    fn prune_marker(&self) -> Result<Option<Result<PruneMarker, String>>, StoreError> {
        read_prune_marker(&self.meta)
    }

    /// Signs a checkpoint over every entry written so far (if this log
    /// signs); for a clean shutdown.
    pub async fn checkpoint(&self) {
        let (done, wait) = oneshot::channel();
        if self.jobs.send(Job::Checkpoint(done)).is_ok() {
            let _ = wait.await;
        }
    }

    /// [`append`](Self::append) for callers outside an async runtime.
    pub fn append_blocking(&self, record: Record) -> Result<u64, StoreError> {
        self.submit(record)?.wait()
    }

    pub fn get(&self, seq: u64) -> Result<Option<Entry>, StoreError> {
        match self
            .entries()
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
        for item in self.entries().iter().rev() {
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
        for item in self.entries().range((seq + 1).to_be_bytes()..).take(limit) {
            let (key, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            out.push(decode(&key, &value)?);
        }
        Ok(out)
    }

    /// Entry count and disk use. Sequence numbers are contiguous from the
    /// oldest kept entry, so this reads two keys, not the whole log.
    pub fn stats(&self) -> Result<LogStats, StoreError> {
        let io = |e: sled::Error| StoreError::Io(e.to_string());
        let entries = self.entries();
        let first_seq = entries.first().map_err(io)?.map(|(k, _)| key_seq(&k));
        let last_seq = entries.last().map_err(io)?.map(|(k, _)| key_seq(&k));
        let size_on_disk = self.db.size_on_disk().map_err(io)?;
        Ok(match (first_seq, last_seq) {
            (Some(first_seq), Some(last_seq)) => LogStats {
                entries: last_seq - first_seq + 1,
                first_seq,
                last_seq,
                size_on_disk,
            },
            _ => LogStats {
                entries: 0,
                first_seq: 0,
                last_seq: 0,
                size_on_disk,
            },
        })
    }

    /// The public key that signs this log's checkpoints, if it signs.
    pub fn public_key(&self) -> Option<&[u8]> {
        self.public_key.as_deref()
    }

    /// Recomputes the whole chain and checks every checkpoint's signature
    /// with `key` (raw Ed25519 public key). The first problem is reported.
    pub fn verify(&self, key: Option<&[u8]>) -> Result<VerifyReport, StoreError> {
        let mut verifier = ChainVerifier::new(key);
        if let Some(marker) = self.prune_marker()?
            && !verifier.start(marker)
        {
            return Ok(verifier.finish());
        }
        let mut checkpoints = self.checkpoints.iter().peekable();
        for item in self.entries().iter() {
            let (k, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            if !verifier.entry(key_seq(&k), decode(&k, &value)) {
                return Ok(verifier.finish());
            }
            while let Some(Ok((ck, _))) = checkpoints.peek() {
                if key_seq(ck) > verifier.report.last_seq {
                    break;
                }
                let (ck, cv) = checkpoints
                    .next()
                    .and_then(Result::ok)
                    .ok_or(StoreError::Io("checkpoint read".into()))?;
                let checkpoint = serde_json::from_slice(&cv).map_err(|e| e.to_string());
                if !verifier.checkpoint(key_seq(&ck), checkpoint) {
                    return Ok(verifier.finish());
                }
            }
        }
        if let Some(Ok((ck, _))) = checkpoints.peek() {
            verifier.fail(VerifyError::CheckpointOrphan { seq: key_seq(ck) });
        }
        Ok(verifier.finish())
    }

    /// Writes the log as JSON Lines: a header, then every entry, each
    /// checkpoint right after the entry it covers. Verifiable offline with
    /// [`verify_export`] and the audit public key. Returns the entry count.
    pub fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        let io = |e: std::io::Error| StoreError::Io(e.to_string());
        let header = serde_json::json!({"type": "header", "format": EXPORT_FORMAT,
            "public_key": self.public_key.as_ref().map(|k| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, k))});
        writeln!(out, "{header}").map_err(io)?;
        if let Some(Ok(marker)) = self.prune_marker()? {
            writeln!(
                out,
                "{}",
                serde_json::json!({"type": "prune", "prune": marker})
            )
            .map_err(io)?;
        }
        let mut checkpoints = self.checkpoints.iter().peekable();
        let mut count = 0;
        for item in self.entries().iter() {
            let (k, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
            let seq = key_seq(&k);
            let entry: serde_json::Value =
                serde_json::from_slice(&value).map_err(|e| StoreError::Corrupt {
                    seq,
                    message: e.to_string(),
                })?;
            writeln!(
                out,
                "{}",
                serde_json::json!({"type": "entry", "entry": entry})
            )
            .map_err(io)?;
            count += 1;
            while let Some(Ok((ck, _))) = checkpoints.peek() {
                if key_seq(ck) > seq {
                    break;
                }
                if let Some(Ok((_, cv))) = checkpoints.next() {
                    let checkpoint: serde_json::Value =
                        serde_json::from_slice(&cv).unwrap_or_default();
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({"type": "checkpoint", "checkpoint": checkpoint})
                    )
                    .map_err(io)?;
                }
            }
        }
        Ok(count)
    }
}

/// The first line of an export.
pub const EXPORT_FORMAT: &str = "portcullis-audit-export v1";

/// Verifies an export (see [`AuditLog::export`]) with only the audit public
/// key: the chain, and every checkpoint's signature.
pub fn verify_export(input: impl std::io::BufRead, key: &[u8]) -> Result<VerifyReport, StoreError> {
    let mut verifier = ChainVerifier::new(Some(key));
    for (index, line) in input.lines().enumerate() {
        let line = line.map_err(|e| StoreError::Io(e.to_string()))?;
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| StoreError::Io(format!("export line {}: {e}", index + 1)))?;
        let ok = match value["type"].as_str() {
            Some("header") if value["format"] == EXPORT_FORMAT => true,
            Some("prune") if verifier.report.entries == 0 => verifier
                .start(serde_json::from_value(value["prune"].clone()).map_err(|e| e.to_string())),
            Some("entry") => {
                let entry: Result<Entry, String> =
                    serde_json::from_value(value["entry"].clone()).map_err(|e| e.to_string());
                let seq = entry
                    .as_ref()
                    .map_or(verifier.report.last_seq + 1, |e| e.seq);
                verifier.entry(
                    seq,
                    entry.map_err(|message| StoreError::Corrupt { seq, message }),
                )
            }
            Some("checkpoint") => {
                let checkpoint: Result<Checkpoint, String> =
                    serde_json::from_value(value["checkpoint"].clone()).map_err(|e| e.to_string());
                let seq = checkpoint.as_ref().map_or(0, |c| c.seq);
                verifier.checkpoint(seq, checkpoint)
            }
            _ => {
                return Err(StoreError::Io(format!(
                    "export line {}: not a {EXPORT_FORMAT} line",
                    index + 1
                )));
            }
        };
        if !ok {
            break;
        }
    }
    Ok(verifier.finish())
}

/// Checks a chain fed in order, entry by entry, with checkpoints after the
/// entries they cover. Stops at the first problem.
struct ChainVerifier<'k> {
    key: Option<&'k [u8]>,
    prev_hash: Option<String>,
    /// Entries below this were pruned (a crash may leave some behind).
    first_seq: u64,
    report: VerifyReport,
}

impl<'k> ChainVerifier<'k> {
    fn new(key: Option<&'k [u8]>) -> Self {
        Self {
            key,
            prev_hash: None,
            first_seq: 1,
            report: VerifyReport::default(),
        }
    }

    /// The log starts after a prune: check the marker, continue from it.
    fn start(&mut self, marker: Result<PruneMarker, String>) -> bool {
        let Ok(marker) = marker else {
            return self.fail(VerifyError::PruneInvalid { first_seq: 0 });
        };
        if marker.first_seq == 0 || self.key.is_some_and(|key| !marker.verify(key)) {
            return self.fail(VerifyError::PruneInvalid {
                first_seq: marker.first_seq,
            });
        }
        self.first_seq = marker.first_seq;
        self.report.last_seq = marker.first_seq - 1;
        self.report.pruned_before = marker.first_seq;
        self.prev_hash = Some(marker.prev);
        true
    }

    fn fail(&mut self, error: VerifyError) -> bool {
        self.report.error.get_or_insert(error);
        false
    }

    /// `stored_at` is where the entry was found (its key); false on a problem.
    fn entry(&mut self, stored_at: u64, entry: Result<Entry, StoreError>) -> bool {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                return self.fail(VerifyError::Unreadable {
                    seq: stored_at,
                    message: e.to_string(),
                });
            }
        };
        let seq = entry.seq;
        if seq < self.first_seq && stored_at < self.first_seq {
            return true; // left over from an interrupted prune
        }
        let expected = self.report.last_seq + 1;
        let problem = if seq != stored_at {
            Some(VerifyError::Moved {
                key: stored_at,
                seq,
            })
        } else if entry_hash(seq, &entry.prev, &entry.record) != entry.hash {
            Some(VerifyError::Edited { seq })
        } else if seq != expected {
            Some(VerifyError::MissingBefore { seq, expected })
        } else if entry.prev != self.prev_hash.as_deref().unwrap_or(GENESIS) {
            Some(VerifyError::Unlinked { seq })
        } else {
            None
        };
        if let Some(problem) = problem {
            return self.fail(problem);
        }
        self.report.entries += 1;
        self.report.last_seq = seq;
        self.report.head = entry.hash.clone();
        self.prev_hash = Some(entry.hash);
        true
    }

    fn checkpoint(&mut self, stored_at: u64, checkpoint: Result<Checkpoint, String>) -> bool {
        if stored_at < self.first_seq {
            return true; // covered pruned entries
        }
        let Ok(checkpoint) = checkpoint else {
            return self.fail(VerifyError::CheckpointInvalid { seq: stored_at });
        };
        if checkpoint.seq != self.report.last_seq || checkpoint.head != self.report.head {
            return self.fail(VerifyError::CheckpointMismatch {
                seq: checkpoint.seq,
            });
        }
        if let Some(key) = self.key
            && !checkpoint.verify(key)
        {
            return self.fail(VerifyError::CheckpointInvalid {
                seq: checkpoint.seq,
            });
        }
        self.report.checkpoints += 1;
        self.report.signed_through = checkpoint.seq;
        true
    }

    fn finish(self) -> VerifyReport {
        self.report
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub entries: u64,
    pub last_seq: u64,
    pub head: String,
    /// Checkpoints whose signature and head were checked.
    pub checkpoints: u64,
    /// The last entry covered by a good checkpoint; entries after it are
    /// chained but not yet signed.
    pub signed_through: u64,
    /// Entries before this one were pruned (0: never pruned).
    #[serde(default)]
    pub pruned_before: u64,
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
    #[error("the checkpoint at entry {seq} does not match the chain (the log was rewritten)")]
    CheckpointMismatch { seq: u64 },
    #[error("the checkpoint at entry {seq} has no valid signature from the audit key")]
    CheckpointInvalid { seq: u64 },
    #[error("a checkpoint covers entry {seq}, which is not in the log")]
    CheckpointOrphan { seq: u64 },
    #[error(
        "the prune marker (log starting at entry {first_seq}) has no valid signature from the audit key"
    )]
    PruneInvalid { first_seq: u64 },
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

/// The prune marker, if the log was ever pruned (or what is wrong with it).
fn read_prune_marker(meta: &sled::Tree) -> Result<Option<Result<PruneMarker, String>>, StoreError> {
    let value = meta
        .get(PRUNE_KEY)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    Ok(value.map(|v| serde_json::from_slice(&v).map_err(|e| e.to_string())))
}

type PruneReply = oneshot::Sender<Result<u64, StoreError>>;

const NO_PRUNING_KEY: &str = "pruning needs the audit key, to sign where the log now starts";

/// The first entry kept: the first at or after the prune marker (entries
/// below an earlier marker may still be being removed). None: empty.
fn first_kept(tree: &sled::Tree, meta: &sled::Tree) -> Result<Option<u64>, StoreError> {
    let kept_from = read_prune_marker(meta)?
        .and_then(Result::ok)
        .map_or(0, |marker| marker.first_seq);
    let first = tree.range(kept_from.to_be_bytes()..).next().transpose();
    let first = first.map_err(|e| StoreError::Io(e.to_string()))?;
    Ok(first.map(|(key, _)| key_seq(&key)))
}

/// The end of the run, from the log's start, of entries started before
/// `before`; None when the first entry kept is not. Reads only, so it runs
/// beside the writer.
fn last_started_before(
    tree: &sled::Tree,
    meta: &sled::Tree,
    before: &jiff::Timestamp,
) -> Result<Option<u64>, StoreError> {
    let Some(first_seq) = first_kept(tree, meta)? else {
        return Ok(None);
    };
    let mut last = None;
    for item in tree.range(first_seq.to_be_bytes()..) {
        let (key, value) = item.map_err(|e| StoreError::Io(e.to_string()))?;
        let entry = decode(&key, &value)?;
        if at_or_after(&entry.record.started_at, before) {
            break;
        }
        last = Some(entry.seq);
    }
    Ok(last)
}

fn send_once(slot: &Mutex<Option<PruneReply>>, result: Result<u64, StoreError>) {
    let reply = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

/// Keys removed per sled batch when pruning. One batch for all of them
/// held sled's whole rewrite in memory: removing 200,000 entries at once
/// took the process from 43 MiB to 1.5 GiB of RSS.
const PRUNE_CHUNK: usize = 1024;

/// Removes the keys up to `last_seq` from `tree`, a bounded batch at a
/// time. Not atomic, and need not be: the prune marker, written first, tells
/// verification to skip whatever a crash leaves below it.
fn remove_through(tree: &sled::Tree, last_seq: u64) -> Result<(), StoreError> {
    let io = |e: sled::Error| StoreError::Io(e.to_string());
    loop {
        let mut batch = sled::Batch::default();
        let mut taken = 0;
        for key in tree
            .range(..=last_seq.to_be_bytes())
            .keys()
            .take(PRUNE_CHUNK)
        {
            batch.remove(key.map_err(io)?);
            taken += 1;
        }
        if taken == 0 {
            return Ok(());
        }
        tree.apply_batch(batch).map_err(io)?;
    }
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
    journal: Journal,
    durability: Durability,
    seq: u64,
    head: String,
    /// Why the writer stopped, once a write failed: every later append is
    /// refused with this reason.
    failed: Option<String>,
    checkpoints: sled::Tree,
    meta: sled::Tree,
    signer: Option<AuditSigner>,
    public_key: Option<Vec<u8>>,
    /// The last entry covered by a checkpoint.
    signed_through: u64,
    last_checkpoint: std::time::Instant,
    counters: Arc<CommitCounters>,
    indexing: Arc<Mutex<()>>,
    /// Held by the thread removing pruned entries.
    removing: Arc<Mutex<()>>,
}

impl Writer {
    fn run(mut self, queue: mpsc::Receiver<Job>) {
        loop {
            let first = match queue.recv_timeout(CHECKPOINT_INTERVAL) {
                Ok(Job::Append(record, reply)) => (*record, reply),
                Ok(Job::Checkpoint(done)) => {
                    self.checkpoint_now();
                    let _ = done.send(());
                    continue;
                }
                Ok(Job::Prune(cut, done)) => {
                    self.prune(cut, done);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.maybe_checkpoint();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let mut group = vec![first];
            let mut asked_to_sign = Vec::new();
            let mut pruning = Vec::new();
            for job in queue.try_iter().take(MAX_BATCH - 1) {
                match job {
                    Job::Append(record, reply) => group.push((*record, reply)),
                    Job::Checkpoint(done) => asked_to_sign.push(done),
                    // Rare; after this group, in order.
                    Job::Prune(cut, done) => pruning.push((cut, done)),
                }
            }
            let started = std::time::Instant::now();
            let (results, values) = self.commit(group.iter().map(|(record, _)| record));
            self.counters.record(group.len(), started.elapsed());
            let indexing = self.indexing.clone();
            let inserting = indexing.lock().unwrap_or_else(|e| e.into_inner());
            for ((_, reply), result) in group.into_iter().zip(results) {
                let _ = reply.send(result);
            }
            self.index(values);
            drop(inserting);
            // After the answers: nobody waits for sled to be written out.
            if self.journal.len() >= JOURNAL_LIMIT
                && self.failed.is_none()
                && let Err(message) = self.settle()
            {
                // sled cannot be written: stop, as after a failed commit.
                self.failed = Some(format!("flushing sled: {message}"));
            }
            for (cut, done) in pruning {
                self.prune(cut, done);
            }
            if asked_to_sign.is_empty() {
                self.maybe_checkpoint();
            } else {
                self.checkpoint_now();
                for done in asked_to_sign {
                    let _ = done.send(());
                }
            }
        }
        self.checkpoint_now();
        // A checkpoint settled already; entries are all that can be left
        // (checkpoints and prunes settle at once).
        if self.failed.is_none() && self.journal.len() > 0 {
            let _ = self.settle();
        }
    }

    /// Prunes as far as `cut` says and answers `done` with how many
    /// entries went. Here, on the writer thread, only the signed marker,
    /// durable before anything is removed. The removal itself (about 20 µs
    /// an entry) runs on a thread of its own, so that appends are not held
    /// up for seconds; one removal at a time.
    fn prune(&mut self, cut: Cut, done: PruneReply) {
        let (through, count) = match self.mark_pruned(cut) {
            Ok(Some(marked)) => marked,
            Ok(None) => {
                let _ = done.send(Ok(0));
                return;
            }
            Err(e) => {
                let _ = done.send(Err(e));
                return;
            }
        };
        let (tree, checkpoints, removing) = (
            self.tree.clone(),
            self.checkpoints.clone(),
            self.removing.clone(),
        );
        let reply = Arc::new(Mutex::new(Some(done)));
        let answer = reply.clone();
        let remove = move || {
            let _one_at_a_time = removing.lock().unwrap_or_else(|e| e.into_inner());
            let removed = remove_through(&tree, through)
                .and_then(|()| remove_through(&checkpoints, through))
                // Not for durability (the marker has that); so that sled
                // writes out, and frees, without waiting for the next settle.
                .and_then(|()| {
                    tree.flush()
                        .map(drop)
                        .map_err(|e| StoreError::Io(e.to_string()))
                })
                .map(|()| count);
            send_once(&answer, removed);
        };
        let spawned = std::thread::Builder::new()
            .name("audit-prune".into())
            .spawn(remove);
        if let Err(e) = spawned {
            // The marker stands: the next prune removes these entries.
            let message = format!("cannot start a thread to remove pruned entries: {e}");
            send_once(&reply, Err(StoreError::Io(message)));
        }
    }

    /// Writes (durably) the prune marker for `cut`; returns the last
    /// sequence number to remove and how many entries that is, or None when
    /// nothing is to go.
    fn mark_pruned(&mut self, cut: Cut) -> Result<Option<(u64, u64)>, StoreError> {
        let io = |e: sled::Error| StoreError::Io(e.to_string());
        let Some(signer) = &self.signer else {
            return Err(StoreError::Io(NO_PRUNING_KEY.into()));
        };
        let Some(first_seq) = first_kept(&self.tree, &self.meta)? else {
            return Ok(None);
        };
        let last_removed_seq = match cut {
            Cut::Newest(keep) => self.seq.saturating_sub(keep),
            Cut::Through(seq) => seq,
        };
        if last_removed_seq < first_seq {
            return Ok(None);
        }
        let count = last_removed_seq - first_seq + 1;
        let last = match self.tree.get(last_removed_seq.to_be_bytes()).map_err(io)? {
            Some(value) => decode(&last_removed_seq.to_be_bytes(), &value)?,
            None => {
                return Err(StoreError::Io(format!(
                    "entry {last_removed_seq} is missing"
                )));
            }
        };
        // The marker first: after a crash between the two steps, verify
        // skips the leftovers below it.
        let marker = signer.sign_prune(last.seq + 1, &last.hash);
        self.meta
            .insert(PRUNE_KEY, serde_json::to_vec(&marker).unwrap_or_default())
            .map_err(io)?;
        self.settle().map_err(StoreError::Io)?;
        Ok(Some((last.seq, count)))
    }

    /// Makes sled durable (its flush, then fdatasync of its log file), and
    /// then empties the journal, whose entries sled now holds.
    fn settle(&mut self) -> Result<(), String> {
        self.db.flush().map_err(|e| e.to_string())?;
        self.log_file.sync_data().map_err(|e| e.to_string())?;
        self.journal
            .clear()
            .map_err(|e| format!("audit journal: {e}"))
    }

    /// Puts back into sled the journal's entries that it lost in a crash,
    /// after checking that they continue the chain; then settles. Entries
    /// before `kept_from` (the prune marker's first) were pruned. Returns
    /// how many were put back.
    fn restore(&mut self, frames: Vec<Vec<u8>>, kept_from: u64) -> Result<u64, StoreError> {
        let io = |e: sled::Error| StoreError::Io(e.to_string());
        let mut restored = 0;
        for payload in &frames {
            let entry: Entry =
                serde_json::from_slice(payload).map_err(|e| StoreError::Corrupt {
                    seq: self.seq + 1,
                    message: format!("in the journal: {e}"),
                })?;
            if entry.seq <= self.seq {
                // sled kept it (it must be the same), lost it while keeping
                // later ones (put it back), or it was pruned since (skip).
                let key = entry.seq.to_be_bytes();
                match self.tree.get(key).map_err(io)? {
                    Some(stored) if decode(&key, &stored)?.hash != entry.hash => {
                        return Err(StoreError::Corrupt {
                            seq: entry.seq,
                            message: "the journal and the log hold different entries".into(),
                        });
                    }
                    Some(_) => {}
                    None if entry.seq >= kept_from => {
                        self.tree.insert(key, payload.as_slice()).map_err(io)?;
                        restored += 1;
                    }
                    None => {}
                }
                continue;
            }
            if entry.seq != self.seq + 1
                || entry.prev != self.head
                || entry.hash != entry_hash(entry.seq, &entry.prev, &entry.record)
            {
                return Err(StoreError::Corrupt {
                    seq: entry.seq,
                    message: format!(
                        "the journal's entry does not continue the log (which ends at {})",
                        self.seq
                    ),
                });
            }
            self.tree
                .insert(entry.seq.to_be_bytes(), payload.as_slice())
                .map_err(io)?;
            (self.seq, self.head) = (entry.seq, entry.hash);
            restored += 1;
        }
        if !frames.is_empty() {
            self.settle().map_err(StoreError::Io)?;
        }
        Ok(restored)
    }

    fn checkpoint_now(&mut self) {
        self.last_checkpoint = std::time::Instant::now() - CHECKPOINT_INTERVAL;
        self.maybe_checkpoint();
    }

    /// Signs the head when enough entries or time have passed since the
    /// last checkpoint.
    fn maybe_checkpoint(&mut self) {
        let Some(signer) = &self.signer else { return };
        let pending = self.seq - self.signed_through;
        let due = pending >= CHECKPOINT_EVERY
            || (pending > 0 && self.last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL);
        if !due || self.failed.is_some() {
            return;
        }
        let checkpoint = signer.sign(self.seq, &self.head);
        let value = serde_json::to_vec(&checkpoint).unwrap_or_default();
        let written = self
            .checkpoints
            .insert(self.seq.to_be_bytes(), value)
            .map_err(|e| e.to_string())
            .and_then(|_| self.settle());
        if written.is_ok() {
            self.signed_through = self.seq;
            self.last_checkpoint = std::time::Instant::now();
        }
    }

    /// Writes one group durably; every record gets its sequence number, or
    /// all get the error. Returns too the entries to put into sled (see
    /// [`Self::index`]).
    fn commit<'a>(
        &mut self,
        records: impl Iterator<Item = &'a Record>,
    ) -> (Vec<Result<u64, StoreError>>, Vec<Stored>) {
        let records: Vec<&Record> = records.collect();
        if let Some(reason) = &self.failed {
            let failed = records
                .iter()
                .map(|_| {
                    Err(StoreError::Failed {
                        reason: reason.clone(),
                    })
                })
                .collect();
            return (failed, Vec::new());
        }
        let (mut seq, mut head) = (self.seq, self.head.clone());
        let mut frames = Vec::new();
        let mut values = Vec::with_capacity(records.len());
        for record in &records {
            seq += 1;
            let (hash, value) = stored_entry(seq, &head, record);
            journal::frame(&value, &mut frames);
            values.push((seq, value));
            head = hash;
        }
        let durable = self
            .journal
            .write(&frames)
            .map_err(|e| format!("audit journal: {e}"))
            .and_then(|()| match self.durability {
                Durability::Fdatasync => self
                    .journal
                    .sync()
                    .map_err(|e| format!("audit journal: {e}")),
                Durability::Written => Ok(()),
            });
        match durable {
            Ok(()) => {
                let committed = (self.seq + 1..=seq).map(Ok).collect();
                self.seq = seq;
                self.head = head;
                (committed, values)
            }
            Err(message) => {
                // Whether any of it reached the disk is unknown: stop, so no
                // request runs unaudited.
                self.failed = Some(message.clone());
                let failed = records
                    .iter()
                    .map(|_| Err(StoreError::Io(message.clone())))
                    .collect();
                (failed, Vec::new())
            }
        }
    }

    /// Puts a committed group into sled, which writes it out later
    /// (settle). One insert each, not a sled batch: in sled 0.34 every
    /// batch writes out sled's log buffer at once, which is the IO the
    /// journal avoids (the journal, not sled, makes a group atomic). If
    /// sled fails, the entries are safe in the journal (the next start puts
    /// them back) and the writer stops, as after a failed commit.
    fn index(&mut self, values: Vec<Stored>) {
        for (seq, value) in values {
            if let Err(e) = self.tree.insert(seq.to_be_bytes(), value) {
                self.failed = Some(format!("inserting entry {seq} into sled: {e}"));
                return;
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
            log.verify(None).unwrap().error,
            Some(VerifyError::Edited { seq: 2 })
        );
        let _ = (std::fs::remove_dir_all(dir), std::fs::remove_dir_all(dir2));
    }

    /// Opens the store in `dir` again, once the writer thread of the last
    /// handle (which holds the database until its queue closes) has let go.
    fn reopen(dir: &std::path::Path) -> Store {
        for _ in 0..200 {
            if let Ok(store) = Store::open(dir) {
                return store;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the store did not reopen");
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
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(JOURNAL))
            .unwrap();
        std::io::Write::write_all(&mut file, &torn).unwrap();

        let store = Store::open(&dir).unwrap();
        let log = store.audit(None).unwrap();
        let recovery = log.recovery();
        assert!(sled_held < N, "sled lost entries in the crash");
        assert_eq!(recovery.restored, N - sled_held);
        assert_eq!(recovery.discarded_bytes, torn.len() as u64);
        let report = log.verify(None).unwrap();
        assert_eq!((report.entries, report.error), (N, None));
        assert_eq!(log.append_blocking(record(N + 1)).unwrap(), N + 1);
        assert!(std::fs::metadata(dir.join(JOURNAL)).unwrap().len() > 0);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The journal is emptied once it reaches its limit, with sled written
    /// out first: nothing is lost across a reopen.
    #[test]
    fn a_full_journal_is_emptied_into_sled() {
        let dir = temp("journal-limit");
        let store = Store::open(&dir).unwrap();
        let log = store.audit_with(Durability::Written, None).unwrap();
        let size = || std::fs::metadata(dir.join(JOURNAL)).unwrap().len();
        let (mut n, mut largest) = (0, 0);
        let mut emptied = false;
        while n < 200_000 && !emptied {
            let before = size();
            largest = largest.max(before);
            n += 1;
            log.append_blocking(record(n)).unwrap();
            // The writer empties it just after answering, so this may see it
            // only at the next append.
            emptied = size() < before;
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
        (store, log, dir, key)
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
}

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

mod codec;
mod entry;
mod prune;
mod query;
mod recovery;
mod verify;
mod writer;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};

use tokio::sync::{oneshot, watch};

use crate::StoreError;
use crate::checkpoint::{AuditSigner, Checkpoint};
use crate::journal::Journal;
use codec::{Interner, Strings};
use entry::key_seq;
pub use entry::{Decision, Entry, Kind, Record, RequestContext, Status};
pub use prune::Retain;
use prune::{Cut, PruneReply, read_prune_marker};
pub use query::{Filter, LogStats};
pub use verify::{EXPORT_FORMAT, VerifyError, VerifyReport, verify_export, verify_export_against};
use writer::Writer;

const TREE: &str = "audit";
const CHECKPOINTS: &str = "audit_checkpoints";
/// Start entries whose request has not completed: key the start entry's
/// sequence number. What a crash leaves here is completed as interrupted
/// when the log is next opened.
const OPEN_INTENTS: &str = "audit_open_intents";
const META: &str = "audit_meta";
/// The strings entries name by number ([`codec`]): key the number (4
/// bytes, big-endian).
const STRINGS: &str = "audit_strings";
const PRUNE_KEY: &[u8] = b"prune";
/// The checkpoint signed after the last group commit (in `META`).
const HEAD_CHECKPOINT_KEY: &[u8] = b"head_checkpoint";
/// A checkpoint is signed after this many entries…
const CHECKPOINT_EVERY: u64 = 1000;
/// …or this long after the last one, whichever comes first.
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);
/// The `prev` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Records taken into one batch at most.
const MAX_BATCH: usize = 4096;
/// How often a stopped writer tries to write again.
const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The journal's name in the store directory.
const JOURNAL: &str = "audit.journal";
/// sled is flushed, and the journal emptied, once the journal holds this
/// much (some thousands of entries).
const JOURNAL_LIMIT: u64 = 4 * 1024 * 1024;

type Reply = oneshot::Sender<Result<u64, StoreError>>;
/// An entry as sled stores it: its sequence number and its compact form.
type Stored = (u64, Vec<u8>);

/// What the writer thread is asked to do.
enum Job {
    Append(Box<Record>, Reply),
    /// Sign a checkpoint over everything written so far, now.
    Checkpoint(oneshot::Sender<()>),
    /// Remove the oldest entries, as far as the bound says.
    Prune(Cut, PruneReply),
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
    /// Requests that had started and not completed when the log was last
    /// closed (a crash), now completed with status `interrupted`.
    pub interrupted: u64,
}

/// Whether the log accepts entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Health {
    #[default]
    Writing,
    /// A write failed (a full disk, an I/O error): every append is refused
    /// until the writer, which retries every second, writes again.
    Stopped {
        reason: String,
        /// RFC 3339.
        since: String,
    },
}

/// Opened by a start entry, closed by its request's completing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    Opened(u64),
    Closed(u64),
}

impl Intent {
    /// What `record`, written as entry `seq`, does to the open intents.
    fn of(seq: u64, record: &Record) -> Option<Self> {
        match (record.kind, record.start_seq) {
            (Kind::RequestStart, _) => Some(Self::Opened(seq)),
            (_, Some(start)) => Some(Self::Closed(start)),
            _ => None,
        }
    }
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

/// An entry queued by [`AuditLog::submit`]; as a future, resolves once it
/// is durable, to its sequence number.
#[must_use = "an entry is durable only once waited for"]
pub struct Submitted(oneshot::Receiver<Result<u64, StoreError>>);

impl Future for Submitted {
    type Output = Result<u64, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|answer| answer.map_err(|_| StoreError::WriterGone)?)
    }
}

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
    /// The strings entries name by number.
    strings: Strings,
    jobs: mpsc::Sender<Job>,
    /// The public half of the signer, when this log signs.
    public_key: Option<Vec<u8>>,
    counters: Arc<CommitCounters>,
    /// Held by the writer from answering a group until its entries are in
    /// `tree` (see [`Self::entries`]).
    indexing: Arc<Mutex<()>>,
    recovery: Recovery,
    health: watch::Receiver<Health>,
}

impl AuditLog {
    pub(crate) fn open(
        db: &sled::Db,
        dir: &Path,
        durability: Durability,
        signer: Option<AuditSigner>,
    ) -> Result<Self, StoreError> {
        let tree = db.open_tree(TREE).map_err(StoreError::Sled)?;
        let checkpoints = db.open_tree(CHECKPOINTS).map_err(StoreError::Sled)?;
        let meta = db.open_tree(META).map_err(StoreError::Sled)?;
        let open_intents = db.open_tree(OPEN_INTENTS).map_err(StoreError::Sled)?;
        let string_tree = db.open_tree(STRINGS).map_err(StoreError::Sled)?;
        let strings = Strings::load(&string_tree).map_err(StoreError::Sled)?;
        let signed_through = match checkpoints.last().map_err(StoreError::Sled)? {
            Some((key, _)) => key_seq(&key),
            None => 0,
        };
        // sled 0.34 persists with sync_file_range, which neither flushes the
        // drive's write cache nor the file's metadata: fdatasync its log too.
        let log_file =
            File::open(dir.join("db")).map_err(|e| StoreError::io("opening sled's log file", e))?;
        let (journal, found) = Journal::open(&dir.join(JOURNAL))
            .map_err(|e| StoreError::io(format!("opening the audit journal {JOURNAL}"), e))?;
        let (health_tx, health) = watch::channel(Health::Writing);
        let mut writer = Writer {
            db: db.clone(),
            tree: tree.clone(),
            open_intents,
            string_tree,
            interner: Interner::new(strings.clone()),
            strings: strings.clone(),
            log_file,
            journal,
            durability,
            seq: 0,
            head: GENESIS.to_string(),
            failed: None,
            health: health_tx,
            lost: 0,
            last_attempt: std::time::Instant::now(),
            unindexed: VecDeque::new(),
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
        if let Some(entry) = entry::last(&tree, &strings)? {
            (writer.seq, writer.head) = (entry.seq, entry.hash);
        } else if let Some(marker) = &marker {
            (writer.seq, writer.head) = (marker.first_seq.saturating_sub(1), marker.prev.clone());
        }
        let kept_from = marker.map_or(1, |marker| marker.first_seq);
        let restored = writer.restore(found.frames, kept_from)?;
        let recovery = Recovery {
            restored,
            discarded_bytes: found.discarded,
            interrupted: writer.complete_interrupted()?,
        };
        // A crash may have lost the last one (sled is written lazily).
        writer.sign_head();
        let (jobs, queue) = mpsc::channel::<Job>();
        let counters = writer.counters.clone();
        let indexing = writer.indexing.clone();
        let public_key = writer.public_key.clone();
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer.run(queue))
            .map_err(|e| StoreError::io("starting the audit writer", e))?;
        Ok(Self {
            db: db.clone(),
            tree,
            checkpoints,
            meta,
            strings,
            jobs,
            public_key,
            counters,
            indexing,
            recovery,
            health,
        })
    }

    /// Whether the log accepts entries now, and if not why.
    pub fn health(&self) -> Health {
        self.health.borrow().clone()
    }

    /// The checkpoint over the newest entry, signed after the group commit
    /// that wrote it (`None` for a log without a key, or an empty one).
    pub fn head_checkpoint(&self) -> Result<Option<Checkpoint>, StoreError> {
        let _ = self.entries(); // the last acknowledged group's is written
        let Some(value) = self
            .meta
            .get(HEAD_CHECKPOINT_KEY)
            .map_err(StoreError::Sled)?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&value)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                seq: 0,
                message: format!("the head checkpoint: {e}"),
            })
    }

    /// Why the log accepts no entries now, if it does not: the check a
    /// request passes before it may act.
    pub fn stopped(&self) -> Option<String> {
        match &*self.health.borrow() {
            Health::Writing => None,
            Health::Stopped { reason, .. } => Some(reason.clone()),
        }
    }

    /// Changes of [`health`](Self::health), for whoever reports them.
    pub fn watch_health(&self) -> watch::Receiver<Health> {
        self.health.clone()
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
            .send(Job::Append(Box::new(record.with_spec_names()), reply))
            .map_err(|_| StoreError::WriterGone)?;
        Ok(Submitted(answer))
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

    /// The public key that signs this log's checkpoints, if it signs.
    pub fn public_key(&self) -> Option<&[u8]> {
        self.public_key.as_deref()
    }
}

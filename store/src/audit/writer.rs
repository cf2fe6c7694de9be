//! The single writer thread and its group commit: every queued record is
//! written to the journal in one write and synced before any is answered;
//! sled's inserts follow, and checkpoints are signed as the log grows.

use std::fs::File;
use std::sync::{Arc, Mutex, mpsc};

use super::entry::{Record, stored_entry};
use super::{
    CHECKPOINT_EVERY, CHECKPOINT_INTERVAL, CommitCounters, Durability, JOURNAL_LIMIT, Job,
    MAX_BATCH, Stored,
};
use crate::StoreError;
use crate::checkpoint::AuditSigner;
use crate::journal::{self, Journal};

/// The single writer: sequence numbers and the chain head live here only.
pub(super) struct Writer {
    pub(super) db: sled::Db,
    pub(super) tree: sled::Tree,
    pub(super) log_file: File,
    pub(super) journal: Journal,
    pub(super) durability: Durability,
    pub(super) seq: u64,
    pub(super) head: String,
    /// Why the writer stopped, once a write failed: every later append is
    /// refused with this reason.
    pub(super) failed: Option<String>,
    pub(super) checkpoints: sled::Tree,
    pub(super) meta: sled::Tree,
    pub(super) signer: Option<AuditSigner>,
    pub(super) public_key: Option<Vec<u8>>,
    /// The last entry covered by a checkpoint.
    pub(super) signed_through: u64,
    pub(super) last_checkpoint: std::time::Instant,
    pub(super) counters: Arc<CommitCounters>,
    pub(super) indexing: Arc<Mutex<()>>,
    /// Held by the thread removing pruned entries.
    pub(super) removing: Arc<Mutex<()>>,
}

impl Writer {
    pub(super) fn run(mut self, queue: mpsc::Receiver<Job>) {
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
                && let Err(e) = self.settle()
            {
                // sled cannot be written: stop, as after a failed commit.
                self.failed = Some(format!("flushing sled: {e}"));
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

    /// Makes sled durable (its flush, then fdatasync of its log file), and
    /// then empties the journal, whose entries sled now holds.
    pub(super) fn settle(&mut self) -> Result<(), StoreError> {
        self.db.flush()?;
        self.log_file
            .sync_data()
            .map_err(|e| StoreError::io("syncing sled's log file", e))?;
        self.journal
            .clear()
            .map_err(|e| StoreError::io("emptying the audit journal", e))
    }

    pub(super) fn checkpoint_now(&mut self) {
        self.last_checkpoint = std::time::Instant::now() - CHECKPOINT_INTERVAL;
        self.maybe_checkpoint();
    }

    /// Signs the head when enough entries or time have passed since the
    /// last checkpoint.
    pub(super) fn maybe_checkpoint(&mut self) {
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
            .map_err(StoreError::Sled)
            .and_then(|_| self.settle());
        if written.is_ok() {
            self.signed_through = self.seq;
            self.last_checkpoint = std::time::Instant::now();
        }
    }

    /// Writes one group durably; every record gets its sequence number, or
    /// all get the error. Returns too the entries to put into sled (see
    /// [`Self::index`]).
    pub(super) fn commit<'a>(
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
                    .map(|_| {
                        Err(StoreError::Failed {
                            reason: message.clone(),
                        })
                    })
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
    pub(super) fn index(&mut self, values: Vec<Stored>) {
        for (seq, value) in values {
            if let Err(e) = self.tree.insert(seq.to_be_bytes(), value) {
                self.failed = Some(format!("inserting entry {seq} into sled: {e}"));
                return;
            }
        }
    }
}

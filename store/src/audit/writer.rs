//! The single writer thread and its group commit: every queued record is
//! written to the journal in one write and synced before any is answered;
//! sled's inserts follow, and checkpoints are signed as the log grows.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::watch;

use super::codec::{self, Interner, NewString, Strings};
use super::entry::{Kind, Record, Status, find, key_seq, stored_entry};
use super::{
    CHECKPOINT_EVERY, CHECKPOINT_INTERVAL, CommitCounters, Durability, HEAD_CHECKPOINT_KEY, Health,
    Intent, JOURNAL_LIMIT, Job, MAX_BATCH, RETRY_INTERVAL, Stored,
};
use crate::StoreError;
use crate::checkpoint::AuditSigner;
use crate::journal::{self, Journal};

/// A committed group on its way into sled (one value, under its first
/// entry's sequence number), with the strings it is the first to name
/// (sled must hold them first) and what its entries do to the open
/// intents, in order.
type Indexed = (Stored, Vec<NewString>, Vec<Intent>);

/// A group's entries per sled value, at most this many bytes (unless one
/// entry is larger): far below the size at which sled 0.34 keeps a leaf in
/// a file of its own (a quarter of its 512 KiB segment).
const MAX_VALUE: usize = 32 * 1024;

/// A committed group's entries (compact, each with what it does to the
/// open intents) as the values sled is to hold, in order; the group's new
/// strings go with the first.
fn values_of(
    first: u64,
    entries: Vec<(Vec<u8>, Option<Intent>)>,
    new: Vec<NewString>,
) -> Vec<Indexed> {
    let mut values: Vec<Indexed> = Vec::new();
    let (mut new, mut at, mut size) = (new, first, 0);
    let (mut compact, mut intents) = (Vec::new(), Vec::new());
    let mut entries = entries.into_iter().peekable();
    // An entry and its length (a varint of at most three bytes below 2 MiB).
    let framed = |entry: &Vec<u8>| entry.len() + 3;
    while let Some((entry, intent)) = entries.next() {
        size += framed(&entry);
        compact.push(entry);
        intents.extend(intent);
        let full = entries
            .peek()
            .is_none_or(|(next, _)| size + framed(next) > MAX_VALUE);
        if full {
            let count = compact.len() as u64;
            let value = codec::group(std::mem::take(&mut compact));
            values.push((
                (at, value),
                std::mem::take(&mut new),
                std::mem::take(&mut intents),
            ));
            (at, size) = (at + count, 0);
        }
    }
    values
}

/// The single writer: sequence numbers and the chain head live here only.
pub(super) struct Writer {
    pub(super) db: sled::Db,
    pub(super) tree: sled::Tree,
    /// Start entries not yet completed (see [`Intent`]).
    pub(super) open_intents: sled::Tree,
    /// The strings entries name by number, in sled…
    pub(super) string_tree: sled::Tree,
    /// …and in memory, for encoding…
    pub(super) interner: Interner,
    /// …and decoding.
    pub(super) strings: Strings,
    pub(super) log_file: File,
    pub(super) journal: Journal,
    pub(super) durability: Durability,
    pub(super) seq: u64,
    pub(super) head: String,
    /// Why the writer stopped, once a write failed: every append is
    /// refused with this reason until a retry writes again
    /// ([`Self::try_resume`]).
    pub(super) failed: Option<String>,
    /// `failed`, for readers outside this thread.
    pub(super) health: watch::Sender<Health>,
    /// Records refused since the writer stopped.
    pub(super) lost: u64,
    /// When the writer last tried to write again.
    pub(super) last_attempt: std::time::Instant,
    /// Committed entries, and what they do to the open intents, not yet
    /// in sled (sled failed to take them; the journal holds them).
    pub(super) unindexed: VecDeque<Indexed>,
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
            let wait = if self.failed.is_some() {
                RETRY_INTERVAL
            } else {
                CHECKPOINT_INTERVAL
            };
            let first = match queue.recv_timeout(wait) {
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
                    self.try_resume();
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
            self.try_resume();
            let started = std::time::Instant::now();
            let (results, values) = self.commit(group.iter().map(|(record, _)| record));
            self.counters.record(group.len(), started.elapsed());
            let indexing = self.indexing.clone();
            let inserting = indexing.lock().unwrap_or_else(|e| e.into_inner());
            for ((_, reply), result) in group.into_iter().zip(results) {
                let _ = reply.send(result);
            }
            self.index(values);
            self.sign_head();
            drop(inserting);
            // After the answers: nobody waits for sled to be written out.
            if self.journal.len() >= JOURNAL_LIMIT
                && self.failed.is_none()
                && let Err(e) = self.settle()
            {
                // sled cannot be written: stop, as after a failed commit.
                self.stop(format!("flushing sled: {e}"));
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
        if self.failed.is_none() {
            let _ = self.journal.shut();
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

    /// Signs the head checkpoint: every acknowledged entry is covered by a
    /// signature as soon as its group is in sled (not fsynced here: after
    /// a crash, opening signs it again). An Ed25519 signature, tens of µs
    /// per group commit.
    pub(super) fn sign_head(&mut self) {
        let Some(signer) = &self.signer else { return };
        if self.failed.is_some() || self.seq == 0 {
            return;
        }
        let checkpoint = signer.sign(self.seq, &self.head);
        let value = serde_json::to_vec(&checkpoint).unwrap_or_default();
        if let Err(e) = self.meta.insert(HEAD_CHECKPOINT_KEY, value) {
            self.stop(format!("writing the head checkpoint into sled: {e}"));
        }
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

    /// Stops the writer: every append is refused with `reason` until a
    /// retry writes again.
    pub(super) fn stop(&mut self, reason: String) {
        // Once per outage: a retry that fails again changes nothing
        // outside (no new event, journal line or `since`).
        if *self.health.borrow() == Health::Writing {
            let since = jiff::Timestamp::now().to_string();
            self.health.send_replace(Health::Stopped {
                reason: reason.clone(),
                since,
            });
        }
        self.last_attempt = std::time::Instant::now();
        self.failed = Some(reason);
    }

    /// Once a second while stopped: cuts the journal back to what was
    /// synced, puts into sled what it missed, and writes an entry saying
    /// how long the log was stopped, why, and how many records it refused
    /// meanwhile. Writing resumes if all of that succeeds.
    pub(super) fn try_resume(&mut self) {
        let Some(reason) = self.failed.clone() else {
            return;
        };
        if self.last_attempt.elapsed() < RETRY_INTERVAL {
            return;
        }
        self.last_attempt = std::time::Instant::now();
        if self.journal.rewind().is_err() || self.index_pending().is_err() {
            return;
        }
        if self.journal.len() >= JOURNAL_LIMIT && self.settle().is_err() {
            return;
        }
        let since = match &*self.health.borrow() {
            Health::Stopped { since, .. } => since.clone(),
            Health::Writing => String::new(),
        };
        let record = Record {
            kind: Kind::Security,
            started_at: since.clone(),
            completed_at: Some(jiff::Timestamp::now().to_string()),
            event: Some("audit_resumed".into()),
            detail: Some(format!(
                "the audit log could not write from {since} until now ({reason}); \
                 {} records were refused meanwhile, and no request acted without its entry",
                self.lost
            )),
            ..Record::default()
        };
        self.failed = None;
        let lost = self.lost;
        let (results, values) = self.commit(std::iter::once(&record));
        if results.iter().all(Result::is_ok) {
            self.index(values);
        }
        match self.failed {
            None => {
                self.lost = 0;
                self.health.send_replace(Health::Writing);
            }
            // The entry about the outage is not one of its refusals.
            Some(_) => self.lost = lost,
        }
    }

    /// Writes one group durably; every record gets its sequence number, or
    /// all get the error. Returns too the entries to put into sled (see
    /// [`Self::index`]).
    pub(super) fn commit<'a>(
        &mut self,
        records: impl Iterator<Item = &'a Record>,
    ) -> (Vec<Result<u64, StoreError>>, Vec<Indexed>) {
        let records: Vec<&Record> = records.collect();
        if let Some(reason) = &self.failed {
            self.lost += records.len() as u64;
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
        let (first, mut seq, mut head) = (self.seq + 1, self.seq, self.head.clone());
        let strings_before = self.interner.len();
        let mut frames = Vec::new();
        let (mut entries, mut new) = (Vec::with_capacity(records.len()), Vec::new());
        for record in &records {
            seq += 1;
            let (hash, json) = stored_entry(seq, &head, record);
            journal::frame(&json, &mut frames);
            let compact = codec::encode(
                seq,
                &head,
                &hash,
                record,
                Some(&mut self.interner),
                &mut new,
            );
            entries.push((compact, Intent::of(seq, record)));
            head = hash;
        }
        let values = values_of(first, entries, new);
        let durable = self
            .journal
            .write(&frames)
            .map_err(|e| format!("audit journal: {e}"))
            .and_then(|()| match self.durability {
                Durability::Fdatasync => self
                    .journal
                    .sync()
                    .map_err(|e| format!("audit journal: {e}")),
                Durability::Written => {
                    self.journal.acknowledge();
                    Ok(())
                }
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
                // request runs unaudited; a retry cuts it off first.
                self.journal.forget_unacknowledged();
                self.interner.forget_from(strings_before);
                self.lost += records.len() as u64;
                self.stop(message.clone());
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
    /// (settle): its new strings, its entries in one value, its intents.
    /// Inserts, not a sled batch: in sled 0.34 every batch writes out
    /// sled's log buffer at once, which is the IO the journal avoids (the
    /// journal, not sled, makes a group atomic). If sled fails, the entries
    /// are safe in the journal (the next start puts them back) and the
    /// writer stops, as after a failed commit.
    pub(super) fn index(&mut self, values: Vec<Indexed>) {
        self.unindexed.extend(values);
        if let Err(e) = self.index_pending() {
            self.stop(e);
        }
    }

    /// Puts what [`Self::unindexed`] holds into sled, in order, each
    /// group's new strings before it.
    fn index_pending(&mut self) -> Result<(), String> {
        while let Some(((seq, value), new, intents)) = self.unindexed.front() {
            let seq = *seq;
            self.insert_strings(new)
                .and_then(|()| self.tree.insert(seq.to_be_bytes(), value.as_slice()))
                .and_then(|_| {
                    intents
                        .iter()
                        .try_for_each(|intent| self.apply(Some(*intent)))
                })
                .map_err(|e| format!("inserting entry {seq} into sled: {e}"))?;
            self.unindexed.pop_front();
        }
        Ok(())
    }

    pub(super) fn insert_strings(&self, new: &[NewString]) -> sled::Result<()> {
        for (id, string) in new {
            self.string_tree
                .insert(id.to_be_bytes(), string.as_bytes())?;
        }
        Ok(())
    }

    /// Records in sled what an entry does to the open intents.
    pub(super) fn apply(&self, intent: Option<Intent>) -> sled::Result<()> {
        match intent {
            Some(Intent::Opened(seq)) => self.open_intents.insert(seq.to_be_bytes(), &[]).map(drop),
            Some(Intent::Closed(seq)) => self.open_intents.remove(seq.to_be_bytes()).map(drop),
            None => Ok(()),
        }
    }

    /// On open: every request whose start entry has no completing entry
    /// (the gateway stopped in between) is completed as interrupted, so
    /// the log says so rather than leaving it open. Returns how many.
    pub(super) fn complete_interrupted(&mut self) -> Result<u64, StoreError> {
        let now = jiff::Timestamp::now().to_string();
        let mut records = Vec::new();
        for item in self.open_intents.iter() {
            let (key, _) = item.map_err(StoreError::Sled)?;
            let seq = key_seq(&key);
            let Some(entry) = find(&self.tree, seq, &self.strings)? else {
                // Pruned since: nothing left to complete.
                self.open_intents.remove(&key).map_err(StoreError::Sled)?;
                continue;
            };
            let mut record = entry.record;
            record.kind = Kind::Request;
            record.completed_at = Some(now.clone());
            record.status = Some(Status::Interrupted);
            record.start_seq = Some(seq);
            record.detail = Some(
                "the gateway stopped (a crash, kill or power loss) after this request's start \
                 entry and before its answer: whether it took effect is unknown"
                    .into(),
            );
            records.push(record);
        }
        let count = records.len() as u64;
        for group in records.chunks(MAX_BATCH) {
            let (results, values) = self.commit(group.iter());
            if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
                return Err(e);
            }
            self.index(values);
            if let Some(reason) = self.failed.take() {
                return Err(StoreError::Failed { reason });
            }
        }
        if count > 0 {
            self.settle()?;
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large group goes into sled as values of bounded size, numbered on
    /// from its first entry, its new strings with the first value and each
    /// entry's intent with the value that holds it.
    #[test]
    fn a_large_group_is_split_into_bounded_values() {
        let entries: Vec<_> = (0..1000u64)
            .map(|i| {
                (
                    vec![codec::COMPACT_V1; 100],
                    (i == 700).then_some(Intent::Opened(707)),
                )
            })
            .collect();
        let values = values_of(7, entries, vec![(3, "x".into())]);
        let mut at = 7;
        for (i, ((key, value), new, intents)) in values.iter().enumerate() {
            assert_eq!(*key, at);
            assert!(value.len() <= MAX_VALUE, "{} bytes", value.len());
            assert_eq!(new.len(), usize::from(i == 0));
            let held = codec::members(value).unwrap().len() as u64;
            assert_eq!(!intents.is_empty(), (at..at + held).contains(&707));
            at += held;
        }
        assert_eq!(at, 1007);
        assert_eq!(values.len(), 4, "32 KiB values of 100-byte entries");
        let one = values_of(1, vec![(vec![codec::COMPACT_V1; 10], None)], Vec::new());
        assert_eq!(
            one[0].0.1,
            vec![codec::COMPACT_V1; 10],
            "alone, an entry is its value"
        );
    }
}

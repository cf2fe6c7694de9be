//! Retention: removing the oldest entries behind a signed prune marker, so
//! what is kept still verifies. The writer signs the marker; the removal
//! runs in bounded batches on a thread of its own.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::codec::Strings;
use super::entry::{decode, find, holding, key_seq, unpack};
use super::query::at_or_after;
use super::writer::Writer;
use super::{AuditLog, Job, PRUNE_KEY};
use crate::StoreError;
use crate::checkpoint::PruneMarker;

/// What the writer is asked to prune: a [`Retain`] with its time resolved
/// to a sequence number beforehand (that takes a scan).
#[derive(Debug, Clone, Copy)]
pub(super) enum Cut {
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
    /// Keep this many of the newest entries, and the rest of the group
    /// commit the oldest of them was written in (a group's entries share
    /// one value in sled, and go together).
    Newest(u64),
}

impl AuditLog {
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
            .map_err(|e| StoreError::io("starting a thread to prune", e))?;
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
                last_started_before(&self.tree, &self.meta, &self.strings, &before)?
                    .map(Cut::Through)
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
            None => Err(StoreError::NoPruningKey),
        }
    }

    pub(super) fn prune_marker(
        &self,
    ) -> Result<Option<Result<PruneMarker, serde_json::Error>>, StoreError> {
        read_prune_marker(&self.meta)
    }
}

/// The prune marker, if the log was ever pruned (or what is wrong with it).
pub(super) fn read_prune_marker(
    meta: &sled::Tree,
) -> Result<Option<Result<PruneMarker, serde_json::Error>>, StoreError> {
    let value = meta.get(PRUNE_KEY).map_err(StoreError::Sled)?;
    Ok(value.map(|v| serde_json::from_slice(&v)))
}

pub(super) type PruneReply = oneshot::Sender<Result<u64, StoreError>>;

/// The first entry kept: the first at or after the prune marker (entries
/// below an earlier marker may still be being removed). None: empty.
pub(super) fn first_kept(tree: &sled::Tree, meta: &sled::Tree) -> Result<Option<u64>, StoreError> {
    let kept_from = read_prune_marker(meta)?
        .and_then(Result::ok)
        .map_or(0, |marker| marker.first_seq);
    let first = tree.range(kept_from.to_be_bytes()..).next().transpose();
    let first = first.map_err(StoreError::Sled)?;
    Ok(first.map(|(key, _)| key_seq(&key)))
}

/// The end of the run, from the log's start, of entries started before
/// `before`; None when the first entry kept is not. Reads only, so it runs
/// beside the writer.
pub(super) fn last_started_before(
    tree: &sled::Tree,
    meta: &sled::Tree,
    strings: &Strings,
    before: &jiff::Timestamp,
) -> Result<Option<u64>, StoreError> {
    let Some(first_seq) = first_kept(tree, meta)? else {
        return Ok(None);
    };
    let mut last = None;
    for item in tree.range(first_seq.to_be_bytes()..) {
        let (key, value) = item.map_err(StoreError::Sled)?;
        for (at, bytes) in unpack(&key, &value)? {
            let entry = decode(&at.to_be_bytes(), bytes, strings)?;
            if at_or_after(&entry.record.started_at, before) {
                return Ok(last);
            }
            last = Some(entry.seq);
        }
    }
    Ok(last)
}

pub(super) fn send_once(slot: &Mutex<Option<PruneReply>>, result: Result<u64, StoreError>) {
    let reply = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(reply) = reply {
        let _ = reply.send(result);
    }
}

/// Keys removed per sled batch when pruning. One batch for all of them
/// held sled's whole rewrite in memory: removing 200,000 entries at once
/// took the process from 43 MiB to 1.5 GiB of RSS.
pub(super) const PRUNE_CHUNK: usize = 1024;

/// Removes the keys up to `last_seq` from `tree`, a bounded batch at a
/// time. Not atomic, and need not be: the prune marker, written first, tells
/// verification to skip whatever a crash leaves below it.
pub(super) fn remove_through(tree: &sled::Tree, last_seq: u64) -> Result<(), StoreError> {
    let io = StoreError::Sled;
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

impl Writer {
    /// Prunes as far as `cut` says and answers `done` with how many
    /// entries went. Here, on the writer thread, only the signed marker,
    /// durable before anything is removed. The removal itself (about 20 µs
    /// an entry) runs on a thread of its own, so that appends are not held
    /// up for seconds; one removal at a time.
    pub(super) fn prune(&mut self, cut: Cut, done: PruneReply) {
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
                .and_then(|()| tree.flush().map(drop).map_err(StoreError::Sled))
                .map(|()| count);
            send_once(&answer, removed);
        };
        let spawned = std::thread::Builder::new()
            .name("audit-prune".into())
            .spawn(remove);
        if let Err(e) = spawned {
            // The marker stands: the next prune removes these entries.
            let error = StoreError::io("starting a thread to remove pruned entries", e);
            send_once(&reply, Err(error));
        }
    }

    /// Writes (durably) the prune marker for `cut`; returns the last
    /// sequence number to remove and how many entries that is, or None when
    /// nothing is to go.
    pub(super) fn mark_pruned(&mut self, cut: Cut) -> Result<Option<(u64, u64)>, StoreError> {
        let io = StoreError::Sled;
        let Some(signer) = &self.signer else {
            return Err(StoreError::NoPruningKey);
        };
        let Some(first_seq) = first_kept(&self.tree, &self.meta)? else {
            return Ok(None);
        };
        let mut last_removed_seq = match cut {
            Cut::Newest(keep) => self.seq.saturating_sub(keep),
            Cut::Through(seq) => seq,
        };
        // A group commit's entries share one value: the log is cut between
        // values, so a group the cut falls in is kept whole.
        if let Some((key, value)) = holding(&self.tree, last_removed_seq)?
            && unpack(&key, &value)?
                .last()
                .is_some_and(|(at, _)| *at > last_removed_seq)
        {
            last_removed_seq = key_seq(&key).saturating_sub(1);
        }
        if last_removed_seq < first_seq {
            return Ok(None);
        }
        let count = last_removed_seq - first_seq + 1;
        let Some(last) = find(&self.tree, last_removed_seq, &self.strings)? else {
            return Err(StoreError::Corrupt {
                seq: last_removed_seq,
                message: "missing".into(),
            });
        };
        // The marker first: after a crash between the two steps, verify
        // skips the leftovers below it.
        let marker = signer.sign_prune(last.seq + 1, &last.hash);
        self.meta
            .insert(PRUNE_KEY, serde_json::to_vec(&marker).unwrap_or_default())
            .map_err(io)?;
        self.settle()?;
        Ok(Some((last.seq, count)))
    }
}

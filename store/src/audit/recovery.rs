//! Recovery on open: the journal's entries that sled lost in a crash are
//! put back, once they are checked to continue the chain.

use super::Intent;
use super::codec;
use super::entry::{Entry, entry_hash, find};
use super::writer::Writer;
use crate::StoreError;

impl Writer {
    /// Puts back into sled the journal's entries that it lost in a crash,
    /// after checking that they continue the chain, with what they did to
    /// the open intents; then settles. Entries
    /// before `kept_from` (the prune marker's first) were pruned. Returns
    /// how many were put back.
    pub(super) fn restore(
        &mut self,
        frames: Vec<Vec<u8>>,
        kept_from: u64,
    ) -> Result<u64, StoreError> {
        let io = StoreError::Sled;
        let mut restored = 0;
        for payload in &frames {
            let entry: Entry =
                serde_json::from_slice(payload).map_err(|e| StoreError::Corrupt {
                    seq: self.seq + 1,
                    message: format!("in the journal: {e}"),
                })?;
            // In order, kept or put back: the open intents end as they
            // were after the last acknowledged group.
            self.apply(Intent::of(entry.seq, &entry.record))
                .map_err(io)?;
            if entry.seq <= self.seq {
                // sled kept it (it must be the same), lost it while keeping
                // later ones (put it back), or it was pruned since (skip).
                match find(&self.tree, entry.seq, &self.strings)? {
                    Some(stored) if stored.hash != entry.hash => {
                        return Err(StoreError::Corrupt {
                            seq: entry.seq,
                            message: "the journal and the log hold different entries".into(),
                        });
                    }
                    Some(_) => {}
                    None if entry.seq >= kept_from => {
                        self.insert_compact(&entry)?;
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
            self.insert_compact(&entry)?;
            (self.seq, self.head) = (entry.seq, entry.hash);
            restored += 1;
        }
        if !frames.is_empty() {
            self.settle()?;
        }
        Ok(restored)
    }

    /// Puts a journal's entry into sled in the compact form, its new
    /// strings first.
    fn insert_compact(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let mut new = Vec::new();
        let compact = codec::encode(
            entry.seq,
            &entry.prev,
            &entry.hash,
            &entry.record,
            Some(&mut self.interner),
            &mut new,
        );
        self.insert_strings(&new)
            .and_then(|()| self.tree.insert(entry.seq.to_be_bytes(), compact))
            .map(drop)
            .map_err(StoreError::Sled)
    }
}

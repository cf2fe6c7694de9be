//! The audit log's journal: an append-only file in front of sled.
//!
//! A group commit writes its entries here in one `write` and `fdatasync`s
//! this file alone before anyone is answered; the same entries go into
//! sled's tree, unflushed, for queries. Once sled has been flushed and
//! acknowledged ([`Journal::clear`]'s caller does that) the journal is emptied.
//! On open, entries the journal holds and sled lost are put back.
//!
//! Why not sled's flush per commit: in sled 0.34 it costs two to three
//! times an `fdatasync` of one small file and wakes every thread of its IO
//! pool, and it still needs an `fdatasync` of its own log afterwards.
//!
//! Format: frames of `len: u32 LE | crc32(payload): u32 LE | payload`. A
//! crash can leave only the last group half written (every earlier one was
//! acknowledged before the next was written), so the first frame that is cut short
//! or fails its checksum ends the journal; what follows was never
//! acknowledged and is cut off.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

/// Frame header: length and checksum.
const HEADER: usize = 8;
/// No entry comes near this; a larger length is a torn or foreign frame.
pub(crate) const MAX_FRAME: usize = 16 * 1024 * 1024;

pub(crate) struct Journal {
    file: File,
    #[cfg(test)]
    path: std::path::PathBuf,
    /// Bytes written.
    len: u64,
    /// Bytes written before the last acknowledged group ended (synced, or
    /// only written where the log is opened so).
    acknowledged: u64,
}

/// What [`Journal::open`] found.
pub(crate) struct Found {
    /// Payloads of the intact frames, in order.
    pub frames: Vec<Vec<u8>>,
    /// Bytes after them (a torn last write), now cut off.
    pub discarded: u64,
}

impl Journal {
    /// Opens (creating) the journal at `path`, reads its intact frames and
    /// cuts off anything after them.
    pub fn open(path: &Path) -> std::io::Result<(Self, Found)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (frames, valid) = decode(&bytes);
        let discarded = (bytes.len() - valid) as u64;
        if discarded > 0 {
            file.set_len(valid as u64)?;
            file.sync_data()?;
        }
        // The file's name must survive a crash as well as its contents.
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let journal = Self {
            file,
            #[cfg(test)]
            path: path.to_path_buf(),
            len: valid as u64,
            acknowledged: valid as u64,
        };
        Ok((journal, Found { frames, discarded }))
    }

    /// Appends `frames` (built with [`frame`]) in one write; not yet acknowledged.
    pub fn write(&mut self, frames: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if fault::take(&self.path) {
            return Err(std::io::Error::other("a write failure a test asked for"));
        }
        self.file.write_all(frames)?;
        self.len += frames.len() as u64;
        Ok(())
    }

    /// Makes everything written so far durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        self.acknowledge();
        Ok(())
    }

    /// Everything written so far is acknowledged (synced, or written is
    /// enough).
    pub fn acknowledge(&mut self) {
        self.acknowledged = self.len;
    }

    /// After a failed write or sync: what followed the last acknowledged
    /// group is unknown, and was never acknowledged; [`rewind`](Self::rewind) cuts
    /// it off.
    pub fn forget_unacknowledged(&mut self) {
        self.len = self.acknowledged;
    }

    /// Cuts the file back to the length known to be good (a no-op when
    /// nothing failed), and syncs that.
    pub fn rewind(&mut self) -> std::io::Result<()> {
        if self.file.metadata()?.len() != self.len {
            self.file.set_len(self.len)?;
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Empties the journal, once everything in it is durable elsewhere.
    pub fn clear(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.file.sync_data()?;
        self.len = 0;
        self.acknowledged = 0;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }
}

/// Failures tests ask for: the next write to a journal fails.
#[cfg(test)]
pub(crate) mod fault {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static FAIL_NEXT_WRITE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    /// The next write to the journal at `path` fails.
    pub(crate) fn fail_next_write(path: &Path) {
        let mut paths = FAIL_NEXT_WRITE.lock().unwrap_or_else(|e| e.into_inner());
        paths.push(path.to_path_buf());
    }

    /// Whether a write to the journal at `path` is to fail (once).
    pub(super) fn take(path: &Path) -> bool {
        let mut paths = FAIL_NEXT_WRITE.lock().unwrap_or_else(|e| e.into_inner());
        let found = paths.iter().position(|p| p == path);
        found.map(|at| paths.remove(at)).is_some()
    }
}

/// Appends one frame holding `payload` to `out`.
pub(crate) fn frame(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The payloads of the intact frames at the start of `bytes`, and how many
/// bytes they take.
pub(crate) fn decode(bytes: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len > MAX_FRAME {
            break;
        }
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        frames.push(payload.to_vec());
        at += HEADER + len;
    }
    (frames, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            frame(p, &mut out);
        }
        out
    }

    proptest! {
        #[test]
        fn frames_round_trip(payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let bytes = framed(&payloads);
            let (frames, valid) = decode(&bytes);
            prop_assert_eq!(valid, bytes.len());
            prop_assert_eq!(frames, payloads);
        }

        /// A write cut anywhere loses the cut frame and nothing before it.
        #[test]
        fn a_cut_write_keeps_every_whole_frame_before_it(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..20),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = framed(&payloads);
            let cut = cut.index(bytes.len());
            let (frames, valid) = decode(&bytes[..cut]);
            let whole = framed(&frames).len();
            prop_assert_eq!(valid, whole);
            prop_assert!(valid <= cut);
            prop_assert_eq!(&frames[..], &payloads[..frames.len()]);
            // Only the frame the cut fell in is lost.
            let next = framed(&payloads[..frames.len() + 1]).len();
            prop_assert!(cut < next);
        }

        /// A flipped byte ends the journal at the frame it hit.
        #[test]
        fn a_flipped_byte_ends_the_journal_at_its_frame(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 1..20),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
        ) {
            let mut bytes = framed(&payloads);
            let at = at.index(bytes.len());
            bytes[at] ^= flip;
            let (frames, valid) = decode(&bytes);
            prop_assert!(valid <= at);
            prop_assert_eq!(&frames[..], &payloads[..frames.len()]);
        }
    }

    #[test]
    fn open_cuts_a_torn_tail_and_appends_after_it() {
        let dir_dir = tempfile::Builder::new()
            .prefix("portcullis-journal-")
            .tempdir()
            .unwrap();
        let dir = dir_dir.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.journal");
        let mut bytes = framed(&[b"one".to_vec(), b"two".to_vec()]);
        bytes.extend_from_slice(&framed(&[b"three".to_vec()])[..6]);
        std::fs::write(&path, &bytes).unwrap();

        let (mut journal, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(found.discarded, 6);
        journal.write(&framed(&[b"four".to_vec()])).unwrap();
        journal.sync().unwrap();
        drop(journal);

        let (mut journal, found) = Journal::open(&path).unwrap();
        let want: Vec<Vec<u8>> = vec![b"one".to_vec(), b"two".to_vec(), b"four".to_vec()];
        assert_eq!(found.frames, want);
        assert_eq!(found.discarded, 0);
        journal.clear().unwrap();
        assert_eq!(journal.len(), 0);
        journal.write(&framed(&[b"five".to_vec()])).unwrap();
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"five".to_vec()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A failed write leaves bytes after the last acknowledged group;
    /// rewinding cuts them off, and the next write follows that group.
    #[test]
    fn rewind_cuts_off_what_was_never_acknowledged() {
        let dir = tempfile::Builder::new()
            .prefix("portcullis-journal-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("audit.journal");
        let (mut journal, _) = Journal::open(&path).unwrap();
        journal.write(&framed(&[b"one".to_vec()])).unwrap();
        journal.sync().unwrap();
        let acknowledged = journal.len();
        // As if the sync after this write had failed.
        journal.write(&framed(&[b"two".to_vec()])).unwrap();
        journal.forget_unacknowledged();
        assert_eq!(journal.len(), acknowledged);
        journal.rewind().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), acknowledged);
        journal.write(&framed(&[b"three".to_vec()])).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"one".to_vec(), b"three".to_vec()]);
    }
}

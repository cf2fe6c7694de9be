//! The audit log's journal: a file in front of sled, written in place
//! (see [`Journal::open`]).
//!
//! A group commit writes its entries here in one `write` and `fdatasync`s
//! this file alone before anyone is answered; the same entries go into
//! sled's tree, unflushed, for queries. Once sled has been flushed and
//! acknowledged ([`Journal::clear`]'s caller does that) the journal is emptied
//! (zeroed, not truncated).
//! On open, entries the journal holds and sled lost are put back.
//!
//! Why not sled's flush per commit: in sled 0.34 it costs two to three
//! times an `fdatasync` of one small file and wakes every thread of its IO
//! pool, and it still needs an `fdatasync` of its own log afterwards.
//!
//! Format: frames of `len: u32 LE | crc32(payload): u32 LE | payload`
//! (`len` never 0), then zeros. A crash can leave only the last group half
//! written (every earlier one was acknowledged before the next was
//! written), so the first frame that is cut short, fails its checksum or
//! has length 0 ends the journal; what follows was never acknowledged and
//! is zeroed. Invariant: past the last acknowledged group the file holds
//! zeros, except for a group being written (or one whose write or sync
//! failed, until [`Journal::rewind`]); so no frame of an earlier, emptied
//! journal is ever read as this one's. (Journals written before this
//! format, appended to and truncated, read the same.)

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// Frame header: length and checksum.
const HEADER: usize = 8;
/// No entry comes near this; a larger length is a torn or foreign frame.
pub(crate) const MAX_FRAME: usize = 16 * 1024 * 1024;
/// The file grows a block (of ext4's, and a page) at a time, written as
/// zeros with the group that reaches it. Not more: the journal must take
/// its blocks as it goes, as an appended file did, so that a full file
/// system fails the journal's write first (the log stops, and resumes by
/// itself once there is room) rather than sled's, which an I/O error
/// leaves failed until the daemon restarts.
const GROW: u64 = 4096;
/// Zeros are written this many bytes at a time.
const ZERO_CHUNK: u64 = 1 << 20;

pub(crate) struct Journal {
    file: File,
    #[cfg(test)]
    path: std::path::PathBuf,
    /// Bytes of frames written.
    len: u64,
    /// Bytes written before the last acknowledged group ended (synced, or
    /// only written where the log is opened so).
    acknowledged: u64,
    /// Where the bytes that may not be zeros end: beyond `len` only after
    /// a write that was not acknowledged, until [`Journal::rewind`].
    written: u64,
    /// The file's length; zeros from `written` on.
    size: u64,
}

/// What [`Journal::open`] found.
pub(crate) struct Found {
    /// Payloads of the intact frames, in order.
    pub frames: Vec<Vec<u8>>,
    /// Bytes after them (a torn last write), now zeroed.
    pub discarded: u64,
}

impl Journal {
    /// Opens (creating) the journal at `path`, reads its intact frames and
    /// zeroes anything after them.
    ///
    /// The file is written in place, never truncated: past the frames it
    /// holds zeros (a frame's length is never 0, so they end the journal),
    /// room for later groups made when it grows ([`GROW`]). A group written
    /// over that room changes none of the file's metadata, so its
    /// `fdatasync` writes the data alone; a file that grows with each group
    /// also makes ext4 commit its own journal every time (a third of a
    /// small group's commit on the disk measured, bench/README.md).
    pub fn open(path: &Path) -> std::io::Result<(Self, Found)> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (frames, valid) = decode(&bytes);
        let end = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |last| last + 1)
            .max(valid);
        let mut journal = Self {
            file,
            #[cfg(test)]
            path: path.to_path_buf(),
            len: valid as u64,
            acknowledged: valid as u64,
            written: end as u64,
            size: bytes.len() as u64,
        };
        let discarded = (end - valid) as u64;
        journal.rewind()?;
        // The file's name must survive a crash as well as its contents.
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok((journal, Found { frames, discarded }))
    }

    /// Writes `frames` (built with [`frame`]) after the last group, in one
    /// write; not yet acknowledged.
    pub fn write(&mut self, frames: &[u8]) -> std::io::Result<()> {
        let end = self.len + frames.len() as u64;
        // Should it fail, any of it may be there.
        self.written = self.written.max(end);
        #[cfg(test)]
        if fault::take(&self.path) {
            return Err(std::io::Error::other("a write failure a test asked for"));
        }
        self.file.write_all_at(frames, self.len)?;
        if end > self.size {
            let room = end.next_multiple_of(GROW);
            self.zero(end, room)?;
            self.size = room;
        }
        self.len = end;
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
    /// group is unknown, and was never acknowledged; [`rewind`](Self::rewind) zeroes
    /// it.
    pub fn forget_unacknowledged(&mut self) {
        self.len = self.acknowledged;
    }

    /// Zeroes what follows the frames known to be good (a no-op when
    /// nothing failed), and syncs that: the next group follows them.
    pub fn rewind(&mut self) -> std::io::Result<()> {
        if self.written > self.len {
            self.zero(self.len, self.written)?;
            self.file.sync_data()?;
            self.written = self.len;
        }
        Ok(())
    }

    /// Empties the journal, once everything in it is durable elsewhere:
    /// its first frame's header is zeroed and synced first, so that a
    /// crash while the rest is zeroed leaves an empty journal, never a
    /// part of this one; then the rest, synced before any later group is
    /// written over it.
    pub fn clear(&mut self) -> std::io::Result<()> {
        let end = self.written.max(self.len);
        if end > 0 {
            let first = end.min(HEADER as u64);
            self.zero(0, first)?;
            self.file.sync_data()?;
            if end > first {
                self.zero(first, end)?;
                self.file.sync_data()?;
            }
        }
        self.len = 0;
        self.acknowledged = 0;
        self.written = 0;
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// At a clean stop, an empty journal's file is cut to nothing, as
    /// versions before this format left it: one of them started on this
    /// state directory next (a downgrade) reads it as empty, where it
    /// would take zeros for frames and refuse to start.
    pub fn shut(&mut self) -> std::io::Result<()> {
        if self.len == 0 && self.written == 0 && self.size > 0 {
            self.file.set_len(0)?;
            self.file.sync_data()?;
            self.size = 0;
        }
        Ok(())
    }

    /// Writes zeros from `from` to `to`.
    fn zero(&self, from: u64, to: u64) -> std::io::Result<()> {
        let zeros = vec![0u8; (to - from).min(ZERO_CHUNK) as usize];
        let mut at = from;
        while at < to {
            let n = (to - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
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

/// Appends one frame holding `payload` (never empty: a length of 0 is
/// the zeros after the journal's last frame) to `out`.
pub(crate) fn frame(payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(
        !payload.is_empty(),
        "an empty frame reads as the journal's end"
    );
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// The payloads of the intact frames at the start of `bytes`, and how many
/// bytes they take; a length of 0 (the zeros after the last one) ends them.
pub(crate) fn decode(bytes: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len == 0 || len > MAX_FRAME {
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

    /// A journal's path in a directory of its own (gone with the first).
    fn journal_path() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("portcullis-journal-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("audit.journal");
        (dir, path)
    }

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            frame(p, &mut out);
        }
        out
    }

    proptest! {
        #[test]
        fn frames_round_trip(payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 0..20)) {
            let bytes = framed(&payloads);
            let (frames, valid) = decode(&bytes);
            prop_assert_eq!(valid, bytes.len());
            prop_assert_eq!(frames, payloads);
        }

        /// A write cut anywhere loses the cut frame and nothing before it.
        #[test]
        fn a_cut_write_keeps_every_whole_frame_before_it(
            payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 1..20),
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
    /// rewinding zeroes them, and the next write follows that group.
    #[test]
    fn rewind_zeroes_what_was_never_acknowledged() {
        let (_dir, path) = journal_path();
        let (mut journal, _) = Journal::open(&path).unwrap();
        journal.write(&framed(&[b"one".to_vec()])).unwrap();
        journal.sync().unwrap();
        let acknowledged = journal.len();
        // As if the sync after this write had failed.
        journal.write(&framed(&[b"two".to_vec()])).unwrap();
        journal.forget_unacknowledged();
        assert_eq!(journal.len(), acknowledged);
        journal.rewind().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes[acknowledged as usize..].iter().all(|&b| b == 0));
        journal.write(&framed(&[b"three".to_vec()])).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"one".to_vec(), b"three".to_vec()]);
    }

    /// Emptied and written again over the same bytes, the journal holds
    /// only the later groups: none of the earlier ones, longer, reads on.
    #[test]
    fn a_journal_written_over_never_reads_an_earlier_group() {
        let (_dir, path) = journal_path();
        let (mut journal, _) = Journal::open(&path).unwrap();
        let earlier: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("earlier {i}").into_bytes())
            .collect();
        journal.write(&framed(&earlier)).unwrap();
        journal.sync().unwrap();
        journal.clear().unwrap();
        journal.write(&framed(&[b"later".to_vec()])).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let (mut journal, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"later".to_vec()]);
        assert_eq!(found.discarded, 0);
        // Emptied with nothing written after: nothing at all, and at a
        // clean stop no file left to read as this format.
        journal.clear().unwrap();
        journal.shut().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert!(found.frames.is_empty());
    }

    /// A crash while the journal was being emptied, after its first
    /// header was zeroed: an empty journal, and what is left of the old
    /// one is zeroed before anything is written over it.
    #[test]
    fn a_journal_cut_off_at_its_first_header_is_empty() {
        let (_dir, path) = journal_path();
        let mut bytes = framed(&[b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);
        bytes[..HEADER].fill(0);
        std::fs::write(&path, &bytes).unwrap();
        let (mut journal, found) = Journal::open(&path).unwrap();
        assert!(found.frames.is_empty());
        assert!(found.discarded > 0);
        assert!(std::fs::read(&path).unwrap().iter().all(|&b| b == 0));
        journal.write(&framed(&[b"four".to_vec()])).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames, vec![b"four".to_vec()]);
    }

    /// The file grows a step at a time, zeros first: groups written within
    /// it leave its length (and so its metadata) alone.
    #[test]
    fn groups_are_written_within_the_room_the_file_has() {
        let (_dir, path) = journal_path();
        let (mut journal, _) = Journal::open(&path).unwrap();
        let size = || std::fs::metadata(&path).unwrap().len();
        journal.write(&framed(&[b"first".to_vec()])).unwrap();
        journal.sync().unwrap();
        assert_eq!(size(), GROW);
        for i in 0..100 {
            journal
                .write(&framed(&[format!("group {i}").into_bytes()]))
                .unwrap();
            journal.sync().unwrap();
        }
        assert_eq!(size(), GROW);
        // One larger than the room left: the file grows to the next step.
        journal.write(&framed(&[vec![7u8; GROW as usize]])).unwrap();
        journal.sync().unwrap();
        assert_eq!(size(), 2 * GROW);
        drop(journal);
        let (_, found) = Journal::open(&path).unwrap();
        assert_eq!(found.frames.len(), 102);
        assert_eq!(found.discarded, 0);
    }
}

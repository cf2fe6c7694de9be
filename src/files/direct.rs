//! The bulk of a large upload, written straight to the disk (`O_DIRECT`).
//!
//! Buffered writes cost the gateway a copy into the page cache (with
//! ext4's per-block bookkeeping), and the kernel's writeback then costs as
//! much again in its own threads before the upload's fsync can return: on
//! a 2-core host, CPU taken from the transfer itself. With `O_DIRECT` the
//! data goes from one page-aligned staging buffer to the device, so the
//! page cache is not touched; the fsync at the end still makes the file
//! durable. A file system that refuses `O_DIRECT` (at `fcntl` or at the
//! first write) gets the same data written the buffered way.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;

use memmap2::MmapMut;
use rustix::fs::OFlags;

/// Alignment of offsets, lengths and memory for direct writes: the page
/// size, which covers every logical block size in use (512 and 4096).
pub const ALIGN: usize = 4096;

/// Where in a file writes start to go straight to the disk: a multiple
/// of [`ALIGN`]. Smaller files are written the buffered way, as direct
/// I/O would only add the disk's latency to each write.
pub const DIRECT_FROM: u64 = 4 << 20;

/// The staging buffer of a direct write: each of its fills is one write
/// to the disk (1 MiB: as much as a session queues for one upload).
pub const STAGING_BUFFER: usize = 1 << 20;

/// Stages data for direct writes and writes each buffer that fills.
pub struct Staging {
    /// Page-aligned (an anonymous mapping), a multiple of [`ALIGN`] long.
    buffer: MmapMut,
    filled: usize,
    /// Where in the file `buffer[0]` goes.
    offset: u64,
    /// False once the file system refused a direct write: from then on
    /// the buffer is written the buffered way.
    direct: bool,
}

impl Staging {
    /// Turns on `O_DIRECT` for `file` and stages data for `offset` on
    /// (a multiple of [`ALIGN`]), through a buffer of `size` bytes
    /// (rounded up to [`ALIGN`]). `None` if the file system does not take
    /// direct I/O or no buffer could be mapped: write the buffered way.
    pub fn start(file: &File, offset: u64, size: usize) -> Option<Self> {
        let buffer = MmapMut::map_anon(size.max(1).next_multiple_of(ALIGN)).ok()?;
        set_direct(file, true).ok()?;
        Some(Self {
            buffer,
            filled: 0,
            offset,
            direct: true,
        })
    }

    /// Copies `data` in, writing the buffer each time it fills.
    pub fn push(&mut self, file: &File, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = data.len().min(self.buffer.len() - self.filled);
            self.buffer[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == self.buffer.len() {
                write(file, &self.buffer, self.offset, &mut self.direct)?;
                self.offset += self.filled as u64;
                self.filled = 0;
            }
        }
        Ok(())
    }

    /// Writes what is staged: the whole blocks directly, the partial one
    /// at the end (which `O_DIRECT` cannot write) the buffered way.
    pub fn finish(mut self, file: &File) -> io::Result<()> {
        let whole = self.filled - self.filled % ALIGN;
        write(file, &self.buffer[..whole], self.offset, &mut self.direct)?;
        if self.direct {
            set_direct(file, false)?;
        }
        let tail = &self.buffer[whole..self.filled];
        file.write_all_at(tail, self.offset + whole as u64)
    }
}

/// A new file written from its start, its whole blocks straight to the
/// disk where the file system takes direct I/O: what `portcullis get`
/// writes a large download into, so the client does not copy it into the
/// page cache (on a 2-core host, CPU taken from the transfer). Whatever
/// `write` gets is written; `flush` writes the staged tail, after which
/// writes go the buffered way behind it.
pub struct DirectFile {
    file: File,
    written: u64,
    staging: Option<Staging>,
}

impl DirectFile {
    /// `file`, empty, written through a staging buffer of `size` bytes
    /// (or the buffered way where the file system refuses direct I/O).
    pub fn new(file: File, size: usize) -> Self {
        let staging = Staging::start(&file, 0, size);
        Self {
            file,
            written: 0,
            staging,
        }
    }

    /// `file`, empty, written the buffered way.
    pub fn buffered(file: File) -> Self {
        Self {
            file,
            written: 0,
            staging: None,
        }
    }

    /// The file, once flushed.
    pub fn into_file(self) -> File {
        self.file
    }
}

impl io::Write for DirectFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.staging {
            Some(staging) => staging.push(&self.file, data)?,
            None => self.file.write_all_at(data, self.written)?,
        }
        self.written += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.staging.take() {
            Some(staging) => staging.finish(&self.file),
            None => Ok(()),
        }
    }
}

/// Writes `data` at `offset`, directly while `direct`. If the file system
/// refuses the direct write (`EINVAL`: an alignment it does not take, or
/// no direct I/O after all), `O_DIRECT` goes off for the file and `direct`
/// turns false; writing the same bytes again over a partial direct write
/// is safe.
fn write(file: &File, data: &[u8], offset: u64, direct: &mut bool) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    if *direct {
        match file.write_all_at(data, offset) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                set_direct(file, false)?;
                *direct = false;
            }
            done => return done,
        }
    }
    file.write_all_at(data, offset)
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(file, flags)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A scratch directory on the disk that holds the checkout: the
    /// kernel checks direct I/O's alignment there (tmpfs, which may hold
    /// the system's temporary directory, does not).
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("direct-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let statx = rustix::fs::statx(
            rustix::fs::CWD,
            &dir,
            rustix::fs::AtFlags::empty(),
            rustix::fs::StatxFlags::TYPE,
        );
        assert_ne!(
            statx.expect("statx").stx_dev_major,
            0,
            "{} is not on a block device",
            dir.display()
        );
        dir
    }

    /// `dir/f`, holding `head`.
    fn file_with(dir: &std::path::Path, head: &[u8]) -> File {
        let file = File::create(dir.join("f")).expect("create");
        file.write_all_at(head, 0).expect("head");
        file
    }

    fn flags(file: &File) -> OFlags {
        rustix::fs::fcntl_getfl(file).expect("fcntl")
    }

    /// Staged pieces of any size land at their offsets, the whole blocks
    /// written directly and the unaligned tail after `O_DIRECT` is off.
    #[test]
    fn staged_data_lands_behind_what_was_written_before() {
        let dir = scratch("staged");
        let head = data(2 * ALIGN, 1);
        let file = file_with(&dir, &head);
        let mut staging = Staging::start(&file, head.len() as u64, 3 * ALIGN).expect("O_DIRECT");
        assert!(flags(&file).contains(OFlags::DIRECT));
        let body = data(7 * ALIGN + 123, 2);
        for piece in body.chunks(1000) {
            staging.push(&file, piece).expect("push");
        }
        let on = flags(&file).contains(OFlags::DIRECT);
        assert!(on, "aligned direct writes were refused");
        staging.finish(&file).expect("finish");
        assert!(!flags(&file).contains(OFlags::DIRECT));
        let written = std::fs::read(dir.join("f")).expect("read");
        assert_eq!(written.len(), head.len() + body.len());
        assert!(written[..head.len()] == head[..] && written[head.len()..] == body[..]);
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    /// A direct write the kernel refuses (here: an offset it cannot
    /// align) is written the buffered way, and so is the rest.
    #[test]
    fn a_refused_direct_write_is_written_buffered() {
        let dir = scratch("refused");
        let head = data(100, 3);
        let file = file_with(&dir, &head);
        let mut staging = Staging::start(&file, 100, ALIGN).expect("O_DIRECT");
        let body = data(3 * ALIGN + 5, 4);
        staging.push(&file, &body).expect("push");
        let on = flags(&file).contains(OFlags::DIRECT);
        assert!(!on, "an unaligned offset was written directly");
        staging.finish(&file).expect("finish");
        let written = std::fs::read(dir.join("f")).expect("read");
        assert!(written[..100] == head[..] && written[100..] == body[..]);
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    /// Nothing staged: nothing written, and `O_DIRECT` is off again.
    #[test]
    fn an_empty_staging_writes_nothing() {
        let dir = scratch("empty");
        let file = file_with(&dir, &[]);
        let staging = Staging::start(&file, 0, ALIGN).expect("O_DIRECT");
        staging.finish(&file).expect("finish");
        assert!(!flags(&file).contains(OFlags::DIRECT));
        assert_eq!(std::fs::metadata(dir.join("f")).expect("stat").len(), 0);
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    /// A download written through [`DirectFile`]: the whole blocks
    /// directly, the tail at flush, and what comes after a flush behind
    /// it; the same bytes where the file system takes no direct I/O.
    #[test]
    fn a_direct_file_holds_what_was_written_in_order() {
        let dir = scratch("directfile");
        let body = data(5 * ALIGN + 321, 6);
        let late = data(ALIGN + 9, 7);
        for direct in [true, false] {
            let file = File::create(dir.join("f")).expect("create");
            let mut out = match direct {
                true => DirectFile::new(file, 2 * ALIGN),
                false => DirectFile::buffered(file),
            };
            assert_eq!(out.staging.is_some(), direct);
            for piece in body.chunks(777) {
                io::Write::write_all(&mut out, piece).expect("write");
            }
            if direct {
                let on = flags(&out.file).contains(OFlags::DIRECT);
                assert!(on, "aligned direct writes were refused");
            }
            io::Write::flush(&mut out).expect("flush");
            assert!(!flags(&out.file).contains(OFlags::DIRECT));
            io::Write::write_all(&mut out, &late).expect("write after flush");
            io::Write::flush(&mut out).expect("flush again");
            drop(out.into_file());
            let written = std::fs::read(dir.join("f")).expect("read");
            assert_eq!(written.len(), body.len() + late.len(), "direct {direct}");
            assert!(written[..body.len()] == body[..], "direct {direct}");
            assert!(written[body.len()..] == late[..], "direct {direct}");
        }
        std::fs::remove_dir_all(dir).expect("cleanup");
    }

    proptest::proptest! {
        /// Whatever the buffer's size, the pieces' sizes and where the
        /// staging starts, the file holds exactly what was pushed.
        #[test]
        fn staged_pieces_make_the_file(
            head_blocks in 0usize..3,
            buffer_blocks in 1usize..4,
            pieces in proptest::collection::vec(0usize..10_000, 0..12),
        ) {
            let dir = scratch("prop");
            let head = data(head_blocks * ALIGN, 5);
            let file = file_with(&dir, &head);
            let mut staging = Staging::start(&file, head.len() as u64, buffer_blocks * ALIGN)
                .expect("O_DIRECT");
            let mut body = Vec::new();
            for (i, len) in pieces.into_iter().enumerate() {
                let piece = data(len, i as u8);
                staging.push(&file, &piece).expect("push");
                body.extend_from_slice(&piece);
            }
            staging.finish(&file).expect("finish");
            let written = std::fs::read(dir.join("f")).expect("read");
            std::fs::remove_dir_all(dir).expect("cleanup");
            proptest::prop_assert_eq!(written.len(), head.len() + body.len());
            proptest::prop_assert!(written[..head.len()] == head[..]);
            proptest::prop_assert!(written[head.len()..] == body[..]);
        }
    }
}

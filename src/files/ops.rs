//! The file operations themselves: blocking, confined by [`Root`], and
//! answering in virtual paths. The provider (`mod.rs`) runs them on the
//! blocking pool and moves their data over the wire.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt as _;

use bytes::Bytes;
use portcullis_policy::FileTerms;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat, Statx};
use rustix::io::{Errno, ReadWriteFlags};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::direct::{DIRECT_FROM, STAGING_BUFFER, Staging};
use portcullis_confine::{FileError, Root, STAT_ATTRIBUTES};

/// Deepest directory nesting `list` and recursive `delete` walk into.
pub const MAX_DEPTH: usize = 64;

/// What `file.stat` and `file.list` tell of an entry, from `fstat` or
/// `statx`.
struct Attributes {
    mode: u32,
    size: i64,
    mtime: (i64, u32),
}

impl From<&Stat> for Attributes {
    fn from(stat: &Stat) -> Self {
        Self {
            mode: stat.st_mode,
            size: stat.st_size,
            mtime: (stat.st_mtime, stat.st_mtime_nsec as u32),
        }
    }
}

impl From<&Statx> for Attributes {
    fn from(statx: &Statx) -> Self {
        Self {
            mode: u32::from(statx.stx_mode),
            size: i64::try_from(statx.stx_size).unwrap_or(i64::MAX),
            mtime: (statx.stx_mtime.tv_sec, statx.stx_mtime.tv_nsec),
        }
    }
}

fn kind_name(mode: u32) -> &'static str {
    match FileType::from_raw_mode(mode) {
        FileType::RegularFile => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "other",
    }
}

fn describe(root: &Root, path: &str, attributes: &Attributes) -> Value {
    let (seconds, nanoseconds) = attributes.mtime;
    let mtime = jiff::Timestamp::new(seconds, nanoseconds as i32)
        .map(|t| t.to_string())
        .unwrap_or_default();
    json!({
        "path": root.virtual_path(path),
        "kind": kind_name(attributes.mode),
        "size": attributes.size,
        "mode": format!("{:04o}", attributes.mode & 0o7777),
        "mtime": mtime,
    })
}

/// `file.stat`: the entry itself (a symlink is described, not followed).
pub fn stat(root: &Root, path: &str) -> Result<Value, FileError> {
    let fd = root.open_at(path, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())?;
    let stat =
        rustix::fs::fstat(&fd).map_err(|e| FileError::from_errno(e, &root.virtual_path(path)))?;
    Ok(describe(root, path, &Attributes::from(&stat)))
}

/// `file.stat` answered on the calling thread (a runtime worker) from what
/// the kernel holds in memory, or `None` when that could wait on a disk or
/// a file server: then [`stat`] runs on a quick thread. Handing a stat to
/// a thread and back costs more than the stat (bench/README.md), and a
/// runtime worker must never block, or every session on it stalls:
/// - both lookups use `RESOLVE_CACHED`, a path walk that fails (EAGAIN)
///   rather than read a directory or revalidate an entry; network and
///   cluster file systems revalidate, so most of their lookups fall through;
/// - `AT_STATX_DONT_SYNC` keeps `statx` from asking a file server (NFS,
///   FUSE, CIFS and Ceph honour it);
/// - the answer is used only from a file system on a block device
///   (`stx_dev_major` not 0), whose attributes live in memory, so nothing
///   was skipped; tmpfs, btrfs, overlayfs and network file systems have
///   anonymous device numbers and go to the quick thread. The exception is
///   FUSE on a block device (`fuseblk`, e.g. ntfs-3g): it can answer from
///   attributes past their timeout while the name's entry is still valid
///   (both are usually 1 s), where `stat` would have asked its daemon.
///
/// Any error falls through as well, so [`stat`] words every error.
pub fn stat_cached(terms: &FileTerms, path: &str) -> Option<Value> {
    let root = Root::open_cached(&crate::files::root_spec(terms))?;
    let statx = root.statx_cached_at(path, STAT_ATTRIBUTES)?;
    (statx.stx_dev_major != 0).then(|| describe(&root, path, &Attributes::from(&statx)))
}

/// Opens a regular file for reading. A file with more than one hard link
/// is refused: another link may live outside the root, and reading through
/// this one would disclose it.
pub fn open_read(root: &Root, path: &str) -> Result<(File, u64), FileError> {
    let vpath = root.virtual_path(path);
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    let fd = root.open_at(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| FileError::from_errno(e, &vpath))?;
    regular_single_link(&stat, &vpath)?;
    Ok((File::from(fd), stat.st_size as u64))
}

pub(super) fn regular_single_link(stat: &Stat, vpath: &str) -> Result<(), FileError> {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(FileError::Invalid(format!("{vpath}: is a directory"))),
        _ => return Err(FileError::Denied(format!("{vpath}: not a regular file"))),
    }
    if stat.st_nlink > 1 {
        return Err(FileError::Denied(format!(
            "{vpath}: the file has {} hard links, and one may lead outside the root",
            stat.st_nlink
        )));
    }
    Ok(())
}

/// Reads up to `want` bytes at `offset`, stopping short at end of file.
pub fn read_at(file: &File, offset: u64, want: usize) -> Result<Vec<u8>, FileError> {
    let mut buf = Vec::with_capacity(want);
    read_at_into(file, offset, want, &mut buf)?;
    Ok(buf)
}

/// Appends up to `want` bytes at `offset` to `out`, stopping short at end
/// of file; returns how many. The bytes land in `out`'s spare capacity
/// without its being zeroed first, in one `pread` when the file has them
/// (std's `take(..).read_to_end` made a seek and four reads of a 64 KiB
/// piece, growing each from 8 KiB).
pub fn read_at_into(
    file: &File,
    offset: u64,
    want: usize,
    out: &mut Vec<u8>,
) -> Result<usize, FileError> {
    let start = out.len();
    out.reserve(want);
    while out.len() - start < want {
        let at = offset + (out.len() - start) as u64;
        match rustix::io::pread(file, rustix::buffer::spare_capacity(out), at) {
            Ok(0) => break,
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(FileError::from_errno(e, "")),
        }
    }
    // The spare capacity may be larger than `want` (room for a seal's tag).
    out.truncate(start + want);
    Ok(out.len() - start)
}

/// What [`read_cached_into`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum CachedRead {
    /// This many bytes, from the page cache.
    Read(usize),
    /// None of the bytes are cached (or the offset is at the end).
    Missing,
    /// The file system cannot read without waiting (`EOPNOTSUPP`: tmpfs,
    /// FUSE, procfs): no later chunk of the file will do better.
    Unsupported,
}

/// [`read_at_into`] only as far as the page cache has the bytes
/// (`RWF_NOWAIT`: nothing waits for a disk or a server), so that it may
/// run on the runtime's worker; the caller reads what is
/// [`CachedRead::Missing`] on a blocking thread. The room is zeroed first
/// (`preadv2` takes initialised buffers), a few microseconds per 64 KiB.
pub fn read_cached_into(file: &File, offset: u64, want: usize, out: &mut Vec<u8>) -> CachedRead {
    let start = out.len();
    out.resize(start + want, 0);
    let mut slices = [std::io::IoSliceMut::new(&mut out[start..])];
    let read = rustix::io::preadv2(file, &mut slices, offset, ReadWriteFlags::NOWAIT);
    let (n, found) = match read {
        Ok(0) => (0, CachedRead::Missing),
        Ok(n) => (n, CachedRead::Read(n)),
        Err(Errno::OPNOTSUPP) => (0, CachedRead::Unsupported),
        Err(_) => (0, CachedRead::Missing),
    };
    out.truncate(start + n);
    found
}

/// `file.list`: entries sorted by name, depth first, in pages.
pub struct Listing {
    pub depth: usize,
    pub hidden: bool,
    pub offset: usize,
    pub limit: usize,
    /// Bytes of JSON the entries may take (one response record).
    pub budget: usize,
}

pub fn list(
    root: &Root,
    path: &str,
    how: &Listing,
    cancel: &CancellationToken,
) -> Result<Value, FileError> {
    let vpath = root.virtual_path(path);
    let dir = root.open_at(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    let (mut index, mut used, mut entries, mut truncated) = (0, 0, Vec::new(), false);
    let tree = Tree {
        depth: how.depth,
        hidden: how.hidden,
    };
    tree.walk(root, &dir, path, cancel, &mut |entry| {
        if index >= how.offset {
            let mut value = describe(root, entry.path, &Attributes::from(entry.stat));
            value["name"] = Value::String(entry.name.to_string());
            let size = value.to_string().len() + 1;
            if entries.len() >= how.limit || used + size > how.budget {
                truncated = true;
                return Step::Stop;
            }
            used += size;
            entries.push(value);
        }
        index += 1;
        Step::Next
    })
    .map_err(|e| FileError::from_errno(e, &vpath))?;
    if cancel.is_cancelled() {
        return Err(FileError::Cancelled);
    }
    let next = truncated.then_some(index);
    Ok(json!({
        "path": vpath,
        "entries": entries,
        "truncated": truncated,
        "next_offset": next,
    }))
}

/// One entry a [`Tree::walk`] visits: `name` in the open directory `dir`,
/// at `path` relative to the root.
pub struct Entry<'a> {
    pub dir: &'a OwnedFd,
    pub name: &'a str,
    pub path: &'a str,
    pub stat: &'a Stat,
}

pub enum Step {
    Next,
    /// Go on, but not into this directory.
    Skip,
    Stop,
}

/// A walk of a directory tree: entries sorted by name, depth first, to
/// `depth` levels (at most [`MAX_DEPTH`]), never through a symlink
/// whatever the root allows, each directory opened beneath the root.
pub struct Tree {
    pub depth: usize,
    pub hidden: bool,
}

impl Tree {
    /// Visits everything under `dir` (which is `rel` in the root) until
    /// `visit` says stop or `cancel` fires. Entries that vanish meanwhile
    /// or whose names are not UTF-8 (no virtual path) are passed over.
    pub fn walk(
        &self,
        root: &Root,
        dir: &OwnedFd,
        rel: &str,
        cancel: &CancellationToken,
        visit: &mut dyn FnMut(&Entry) -> Step,
    ) -> Result<(), Errno> {
        self.level(root, dir, rel, 1, cancel, visit).map(drop)
    }

    /// `Ok(false)` once the walk must stop.
    fn level(
        &self,
        root: &Root,
        dir: &OwnedFd,
        rel: &str,
        depth: usize,
        cancel: &CancellationToken,
        visit: &mut dyn FnMut(&Entry) -> Step,
    ) -> Result<bool, Errno> {
        let mut names: Vec<String> = Vec::new();
        for entry in rustix::fs::Dir::read_from(dir)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." || (!self.hidden && name.starts_with('.')) {
                continue;
            }
            names.push(name.to_string());
        }
        names.sort_unstable();
        for name in names {
            if cancel.is_cancelled() {
                return Ok(false);
            }
            let Ok(stat) = rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let entry = Entry {
                dir,
                name: &name,
                path: &path,
                stat: &stat,
            };
            let descend = match visit(&entry) {
                Step::Stop => return Ok(false),
                Step::Skip => false,
                Step::Next => FileType::from_raw_mode(stat.st_mode) == FileType::Directory,
            };
            if descend && depth < self.depth.min(MAX_DEPTH) {
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
                if let Ok(sub) = root.open_beneath(dir, &name, flags, Mode::empty())
                    && !self.level(root, &sub, &path, depth + 1, cancel, visit)?
                {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}

pub fn mkdir(root: &Root, path: &str, parents: bool) -> Result<Value, FileError> {
    let vpath = root.virtual_path(path);
    let errno = |e| FileError::from_errno(e, &vpath);
    if !parents {
        let (dir, name) = root.parent(path)?;
        rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)).map_err(errno)?;
        return Ok(json!({ "path": vpath, "created": true }));
    }
    let mut dir = root.open_at("", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
    let mut created = false;
    for name in path.split('/').filter(|c| !c.is_empty()) {
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => created = true,
            Err(Errno::EXIST) => {}
            Err(e) => return Err(errno(e)),
        }
        dir = root
            .open_beneath(
                &dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )
            .map_err(errno)?;
    }
    Ok(json!({ "path": vpath, "created": created }))
}

/// `file.delete`: a file, a symlink (never its target), an empty
/// directory, or with `recursive` a whole tree. Returns how many entries
/// went.
pub fn delete(
    root: &Root,
    path: &str,
    recursive: bool,
    cancel: &CancellationToken,
) -> Result<Value, FileError> {
    let vpath = root.virtual_path(path);
    let (dir, name) = root.parent(path)?;
    let stat = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FileError::from_errno(e, &vpath))?;
    let removed = if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        if recursive {
            remove_tree(root, &dir, &name, 0, cancel)
                .map_err(|e| FileError::from_errno(e, &vpath))?
        } else {
            rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::REMOVEDIR)
                .map_err(|e| FileError::from_errno(e, &vpath))?;
            1
        }
    } else {
        rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::empty())
            .map_err(|e| FileError::from_errno(e, &vpath))?;
        1
    };
    Ok(json!({ "path": vpath, "removed": removed }))
}

fn remove_tree(
    root: &Root,
    parent: &OwnedFd,
    name: &str,
    depth: usize,
    cancel: &CancellationToken,
) -> Result<u64, Errno> {
    if depth > MAX_DEPTH || cancel.is_cancelled() {
        return Err(Errno::CANCELED);
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    let dir = match root.open_beneath(parent, name, flags, Mode::empty()) {
        // Not a directory (any more): remove the name itself.
        Err(Errno::NOTDIR | Errno::LOOP) => {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
            return Ok(1);
        }
        other => other?,
    };
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&dir)? {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    let mut removed = 0;
    for child in names {
        let is_dir = rustix::fs::statat(&dir, child.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory);
        if is_dir {
            let child = child.to_str().map_err(|_| Errno::INVAL)?;
            removed += remove_tree(root, &dir, child, depth + 1, cancel)?;
        } else {
            rustix::fs::unlinkat(&dir, child.as_c_str(), AtFlags::empty())?;
            removed += 1;
        }
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    Ok(removed + 1)
}

/// `file.move`: one rename, so it never leaves a half-moved file. Roots
/// on different filesystems cannot be moved between (`provider_error`).
pub fn rename(
    from_root: &Root,
    from: &str,
    to_root: &Root,
    to: &str,
    overwrite: bool,
) -> Result<Value, FileError> {
    let (from_dir, from_name) = from_root.parent(from)?;
    let (to_dir, to_name) = to_root.parent(to)?;
    let flags = if overwrite {
        RenameFlags::empty()
    } else {
        RenameFlags::NOREPLACE
    };
    let to_vpath = to_root.virtual_path(to);
    rustix::fs::renameat_with(
        &from_dir,
        from_name.as_str(),
        &to_dir,
        to_name.as_str(),
        flags,
    )
    .map_err(|e| match e {
        Errno::XDEV => FileError::Io(format!(
            "{to_vpath}: the two roots are on different filesystems; copy, then delete"
        )),
        Errno::NOENT => FileError::from_errno(e, &from_root.virtual_path(from)),
        other => FileError::from_errno(other, &to_vpath),
    })?;
    Ok(json!({ "path": from_root.virtual_path(from), "to_path": to_vpath }))
}

/// A file being written: a temporary name in the target's directory,
/// renamed over the target on [`commit`](Self::commit) after an fsync.
/// Dropped uncommitted (failure, cancel), it removes itself, so no partial
/// file is ever left under the target's name.
pub struct AtomicFile {
    dir: OwnedFd,
    temp: String,
    name: String,
    vpath: String,
    file: File,
    hash: Option<HashPipe>,
    writeback: Option<Writeback>,
    /// Where direct writes start; `None` once the file system refused them.
    direct_from: Option<u64>,
    staging: Option<Staging>,
    size: u64,
    committed: bool,
    /// Whether committing may replace an existing file.
    pub replace: bool,
}

impl AtomicFile {
    /// Starts replacing `path`. The final component must not be a symlink
    /// or a directory; an existing file's permissions are kept. With
    /// `hash`, the result carries the data's SHA-256.
    pub fn create(
        root: &Root,
        path: &str,
        create_parents: bool,
        hash: bool,
    ) -> Result<Self, FileError> {
        let vpath = root.virtual_path(path);
        if create_parents && let Some((parent, _)) = path.rsplit_once('/') {
            mkdir(root, parent, true)?;
        }
        let (dir, name) = root.parent(path)?;
        let mut mode = 0o644;
        let mut owner = None;
        match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => {
                    mode = stat.st_mode & 0o7777;
                    owner = Some((stat.st_uid, stat.st_gid));
                }
                FileType::Directory => {
                    return Err(FileError::Invalid(format!("{vpath}: is a directory")));
                }
                FileType::Symlink => {
                    return Err(FileError::Denied(format!(
                        "{vpath}: is a symlink; write to the file it points to"
                    )));
                }
                _ => return Err(FileError::Denied(format!("{vpath}: not a regular file"))),
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(FileError::from_errno(e, &vpath)),
        }
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|e| FileError::Io(e.to_string()))?;
        let temp = format!(".portcullis-{}.tmp", hex::encode(random));
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = root
            .open_beneath(&dir, &temp, flags, Mode::from_raw_mode(mode))
            .map_err(|e| FileError::from_errno(e, &vpath))?;
        // umask may have narrowed the mode; the old file's owner is kept
        // when the daemon may set it (as root).
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode));
        if let Some((uid, gid)) = owner {
            let _ = rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            );
        }
        Ok(Self {
            dir,
            temp,
            name,
            vpath,
            file: File::from(fd),
            hash: hash.then(HashPipe::new),
            writeback: None,
            direct_from: Some(DIRECT_FROM),
            staging: None,
            size: 0,
            committed: false,
            replace: true,
        })
    }

    /// Appends `data`: the first [`DIRECT_FROM`] bytes of the file the
    /// buffered way, the rest straight to the disk where the file system
    /// takes direct I/O (see `direct.rs`).
    pub fn write(&mut self, data: Bytes) -> Result<(), FileError> {
        let buffered = match self.direct_from {
            Some(from) => from.saturating_sub(self.size).min(data.len() as u64) as usize,
            None => data.len(),
        };
        self.write_buffered(&data[..buffered])?;
        let rest = &data[buffered..];
        if !rest.is_empty() {
            if self.staging.is_none() {
                self.staging = Staging::start(&self.file, self.size, STAGING_BUFFER);
            }
            match &mut self.staging {
                Some(staging) => {
                    staging
                        .push(&self.file, rest)
                        .map_err(|e| io_error(&self.vpath, e))?;
                    self.size += rest.len() as u64;
                }
                None => {
                    self.direct_from = None;
                    self.write_buffered(rest)?;
                }
            }
        }
        if let Some(hash) = &mut self.hash {
            hash.update(data);
        }
        Ok(())
    }

    /// Writes through the page cache, and has [`Writeback`] send each
    /// [`WRITEBACK_EVERY`] on to the disk while more arrives.
    fn write_buffered(&mut self, data: &[u8]) -> Result<(), FileError> {
        if data.is_empty() {
            return Ok(());
        }
        self.file
            .write_all_at(data, self.size)
            .map_err(|e| self.io(e))?;
        let before = self.size;
        self.size += data.len() as u64;
        if before / WRITEBACK_EVERY != self.size / WRITEBACK_EVERY {
            if self.writeback.is_none() {
                let second = self.file.try_clone().map_err(|e| self.io(e))?;
                self.writeback = Some(Writeback::start(second).map_err(|e| self.io(e))?);
            }
            if let Some(writeback) = &self.writeback {
                writeback.kick();
            }
        }
        Ok(())
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn io(&self, e: std::io::Error) -> FileError {
        io_error(&self.vpath, e)
    }

    /// fsync, rename over the target, fsync the directory. Returns the
    /// result a write answers with.
    pub fn commit(mut self) -> Result<Value, FileError> {
        if let Some(staging) = self.staging.take() {
            staging.finish(&self.file).map_err(|e| self.io(e))?;
        }
        if let Some(writeback) = self.writeback.take() {
            writeback.finish().map_err(|e| self.io(e))?;
        }
        self.file.sync_all().map_err(|e| self.io(e))?;
        let flags = if self.replace {
            RenameFlags::empty()
        } else {
            RenameFlags::NOREPLACE
        };
        let (dir, temp, name) = (&self.dir, self.temp.as_str(), self.name.as_str());
        rustix::fs::renameat_with(dir, temp, dir, name, flags)
            .map_err(|e| FileError::from_errno(e, &self.vpath))?;
        self.committed = true;
        let _ = rustix::fs::fsync(&self.dir);
        let mut result = json!({ "path": self.vpath, "size": self.size });
        if let Some(hash) = self.hash.take() {
            result["sha256"] = json!(hash.finish()?);
        }
        Ok(result)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = rustix::fs::unlinkat(&self.dir, self.temp.as_str(), AtFlags::empty());
        }
    }
}

/// Opens `path` to append to it (created if missing). Appends are not
/// atomic: a failed append may leave part of its data.
pub fn open_append(root: &Root, path: &str) -> Result<File, FileError> {
    let vpath = root.virtual_path(path);
    let flags =
        OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let fd = root.open_at(path, flags, Mode::from_raw_mode(0o644))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| FileError::from_errno(e, &vpath))?;
    regular_single_link(&stat, &vpath)?;
    Ok(File::from(fd))
}

/// `file.copy` of one regular file, written atomically at the target.
pub fn copy(
    from_root: &Root,
    from: &str,
    to_root: &Root,
    to: &str,
    overwrite: bool,
    cancel: &CancellationToken,
) -> Result<Value, FileError> {
    let (source, size) = open_read(from_root, from)?;
    if !overwrite {
        let (dir, name) = to_root.parent(to)?;
        match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => {
                return Err(FileError::Invalid(format!(
                    "{}: already exists (pass overwrite: true)",
                    to_root.virtual_path(to)
                )));
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(FileError::from_errno(e, &to_root.virtual_path(to))),
        }
    }
    let mut target = AtomicFile::create(to_root, to, false, true)?;
    target.replace = overwrite;
    let mut offset = 0;
    while offset < size {
        if cancel.is_cancelled() {
            return Err(FileError::Cancelled);
        }
        let block = read_at(&source, offset, 1 << 20)?;
        if block.is_empty() {
            break;
        }
        offset += block.len() as u64;
        target.write(Bytes::from(block))?;
    }
    let mut result = target.commit()?;
    result["from_path"] = Value::String(from_root.virtual_path(from));
    Ok(result)
}

/// An I/O error while working on `vpath`, named so.
pub fn io_error(vpath: &str, e: std::io::Error) -> FileError {
    FileError::from_errno(Errno::from_io_error(&e).unwrap_or(Errno::IO), vpath)
}

/// How much of a large write may wait in the page cache before
/// [`Writeback`] starts sending it to the disk.
const WRITEBACK_EVERY: u64 = 32 << 20;

/// Writes a large file's data back to the disk while more of it arrives,
/// so the fsync before the rename has only the tail left (for a 1 GiB
/// upload here that fsync took ~0.65 s, after the transfer). Each
/// [`kick`](Self::kick) asks a thread of its own for an `fdatasync` on a
/// second handle of the file, unless one is already asked for. Used where
/// a file system does not take direct I/O: elsewhere everything past
/// [`DIRECT_FROM`] goes to the disk as it is written.
struct Writeback {
    kick: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Writeback {
    fn start(file: File) -> std::io::Result<Self> {
        let (kick, kicks) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("portcullis-writeback".into())
            .spawn(move || {
                for () in kicks {
                    file.sync_data()?;
                }
                Ok(())
            })?;
        Ok(Self {
            kick: Some(kick),
            thread: Some(thread),
        })
    }

    fn kick(&self) {
        if let Some(kick) = &self.kick {
            // Full: a sync is asked for already. Gone: it failed, and
            // `finish` says why.
            let _ = kick.try_send(());
        }
    }

    /// Waits for the sync under way. Its error matters: the kernel reports
    /// a writeback error once per open file, so the final fsync on the
    /// other handle may no longer see it.
    fn finish(mut self) -> std::io::Result<()> {
        drop(self.kick.take());
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(std::io::Error::other("the writeback thread failed")),
            None => Ok(()),
        }
    }
}

/// SHA-256 of data as it is written. A small write is hashed on the
/// writing thread; once more than [`HASH_HERE_UP_TO`] has come, the hashing
/// moves to a thread of its own, so that for an upload it overlaps the
/// writing (each is a large share of an upload's CPU time, and together on
/// one thread they set its pace). A thread for a few bytes cost more than
/// the write's own system calls (bench/README.md).
pub struct HashPipe {
    state: HashState,
}

enum HashState {
    /// Hashing on the writing thread while `room` bytes more may come.
    Here { hasher: Sha256, room: usize },
    Thread {
        tx: std::sync::mpsc::SyncSender<Bytes>,
        thread: std::thread::JoinHandle<String>,
    },
}

impl Default for HashPipe {
    fn default() -> Self {
        Self::new()
    }
}

/// How much a [`HashPipe`] hashes on the writing thread before it moves the
/// hashing to a thread of its own.
pub const HASH_HERE_UP_TO: usize = 256 * 1024;

impl HashPipe {
    pub fn new() -> Self {
        Self {
            state: HashState::Here {
                hasher: Sha256::new(),
                room: HASH_HERE_UP_TO,
            },
        }
    }

    pub fn update(&mut self, data: Bytes) {
        match &mut self.state {
            HashState::Here { hasher, room } if data.len() <= *room => {
                hasher.update(&data);
                *room -= data.len();
            }
            HashState::Here { hasher, room } => match Self::thread(hasher.clone()) {
                Ok((tx, thread)) => {
                    let _ = tx.send(data);
                    self.state = HashState::Thread { tx, thread };
                }
                // No thread to be had: the rest is hashed here too, so the
                // write never fails for its digest.
                Err(e) => {
                    tracing::debug!("{e}; hashing on the writing thread");
                    hasher.update(&data);
                    *room = usize::MAX;
                }
            },
            HashState::Thread { tx, .. } => {
                let _ = tx.send(data);
            }
        }
    }

    /// A thread that goes on from `hasher` with what it is sent.
    fn thread(
        mut hasher: Sha256,
    ) -> Result<
        (
            std::sync::mpsc::SyncSender<Bytes>,
            std::thread::JoinHandle<String>,
        ),
        String,
    > {
        // 16 chunks of at most a record each: the memory it may hold.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(16);
        let thread = std::thread::Builder::new()
            .name("portcullis-sha256".into())
            .spawn(move || {
                for data in rx {
                    hasher.update(&data);
                }
                hex::encode(hasher.finalize())
            })
            .map_err(|e| format!("cannot start hashing: {e}"))?;
        Ok((tx, thread))
    }

    /// The hex digest of everything sent.
    pub fn finish(self) -> Result<String, FileError> {
        match self.state {
            HashState::Here { hasher, .. } => Ok(hex::encode(hasher.finalize())),
            HashState::Thread { tx, thread } => {
                drop(tx);
                thread
                    .join()
                    .map_err(|_| FileError::Io("hashing the data failed".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::terms;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    /// The digest is SHA-256 of everything sent, whether it was hashed
    /// here, on the thread, or partly on each.
    #[test]
    fn a_hash_pipe_digests_all_it_was_sent_wherever_it_hashed() {
        let data: Vec<u8> = (0..4 * HASH_HERE_UP_TO)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        for chunks in [
            vec![0],
            vec![6],
            vec![HASH_HERE_UP_TO],
            vec![HASH_HERE_UP_TO, 1],
            vec![HASH_HERE_UP_TO + 1],
            vec![1000, HASH_HERE_UP_TO, 5, 2 * HASH_HERE_UP_TO],
            vec![3 * HASH_HERE_UP_TO + 7],
        ] {
            let mut pipe = HashPipe::new();
            let mut at = 0;
            for len in &chunks {
                pipe.update(Bytes::copy_from_slice(&data[at..at + len]));
                at += len;
            }
            let expected = hex::encode(Sha256::digest(&data[..at]));
            assert_eq!(pipe.finish().unwrap(), expected, "chunks {chunks:?}");
        }
    }

    fn on_a_block_device(path: &Path) -> bool {
        let statx = rustix::fs::statx(
            rustix::fs::CWD,
            path,
            AtFlags::empty(),
            rustix::fs::StatxFlags::TYPE,
        );
        statx.unwrap().stx_dev_major != 0
    }

    /// The cached stat answers only when the file system is on a block
    /// device, and then as `stat` does; errors are left to `stat`.
    #[test]
    fn a_cached_stat_answers_as_stat_does_or_leaves_it_to_stat() {
        let base_dir = tempfile::Builder::new()
            .prefix("portcullis-stat-")
            .tempdir()
            .unwrap();
        let base = base_dir.path().to_path_buf();
        let dir = base.join("root");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("file"), "twelve bytes").unwrap();
        symlink("file", dir.join("link")).unwrap();
        symlink("../outside", dir.join("up")).unwrap();
        let granted = terms(&dir, false);
        let root = crate::files::open_root(&granted).unwrap();
        let block_device = on_a_block_device(&dir);
        for path in ["", "sub", "file", "link", "up"] {
            let slow = stat(&root, path).unwrap();
            // A path walk from the cache gives up when a mount or rename
            // elsewhere raced it, so a miss is allowed now and then.
            let fast = (0..100).find_map(|_| stat_cached(&granted, path));
            match fast {
                Some(fast) => assert_eq!(fast, slow, "{path}"),
                None => assert!(!block_device, "{path}: never answered from the cache"),
            }
        }
        assert_eq!(block_device, stat_cached(&granted, "file").is_some());
        for path in ["missing", "up/x", "link/x"] {
            assert!(stat(&root, path).is_err(), "{path}");
            assert_eq!(stat_cached(&granted, path), None, "{path}");
        }
        let _ = std::fs::remove_dir_all(base);

        // tmpfs has an anonymous device number: the quick thread answers.
        let shm = Path::new("/dev/shm");
        if shm.is_dir() && !on_a_block_device(shm) {
            let dir = shm.join(format!("portcullis-stat-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("file"), "x").unwrap();
            let granted = terms(&dir, false);
            assert!(stat(&crate::files::open_root(&granted).unwrap(), "file").is_ok());
            assert_eq!(stat_cached(&granted, "file"), None);
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// A cached read gives what the page cache has, after what the buffer
    /// held; at end of file, or once the pages are gone (on a disk; tmpfs
    /// keeps them), it gives nothing and leaves the buffer as it was, and
    /// the blocking read gives the bytes.
    #[test]
    fn a_cached_read_takes_only_what_the_page_cache_has() {
        // Eviction is what is tested: a file system on a block device (the
        // temporary directory, else the crate's own, a checkout on disk).
        let base = [std::env::temp_dir(), env!("CARGO_MANIFEST_DIR").into()]
            .into_iter()
            .find(|dir| on_a_block_device(dir))
            .expect("neither the temporary directory nor the crate is on a block device");
        let dir = tempfile::Builder::new()
            .prefix("portcullis-cached-read-")
            .tempdir_in(base)
            .unwrap();
        let path = dir.path().join("data");
        let data: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let mut out = b"head".to_vec();
        assert_eq!(
            read_cached_into(&file, 1000, 70_000, &mut out),
            CachedRead::Read(70_000)
        );
        assert_eq!(&out[..4], b"head");
        assert_eq!(&out[4..], &data[1000..71_000]);
        let mut out = b"head".to_vec();
        assert_eq!(
            read_cached_into(&file, data.len() as u64, 10, &mut out),
            CachedRead::Missing
        );
        assert_eq!(out, b"head");

        file.sync_all().unwrap();
        // The kernel may keep a page it is asked to drop while something
        // else holds it for a moment (about one run of the suite in
        // fifteen): asked again, a bounded number of times.
        let mut evicted = CachedRead::Read(0);
        for _ in 0..50 {
            rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            out.truncate(4);
            evicted = read_cached_into(&file, 500_000, 65_536, &mut out);
            if evicted == CachedRead::Missing {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(evicted, CachedRead::Missing);
        assert_eq!(out, b"head");
        assert_eq!(
            read_at_into(&file, 500_000, 65_536, &mut out).unwrap(),
            65_536
        );
        assert_eq!(&out[4..], &data[500_000..565_536]);
    }

    /// procfs, like tmpfs and FUSE, cannot promise not to wait: the
    /// stream learns it from the first chunk and asks no more.
    #[test]
    fn a_file_system_that_cannot_read_without_waiting_says_so() {
        let file = File::open("/proc/self/status").unwrap();
        let mut out = b"head".to_vec();
        assert_eq!(
            read_cached_into(&file, 0, 4096, &mut out),
            CachedRead::Unsupported
        );
        assert_eq!(out, b"head");
    }

    /// Files written across the point where direct writes start arrive
    /// whole, in pieces of any size: the buffered head, the staged body
    /// and the unaligned tail each land where they belong.
    #[test]
    fn a_file_written_across_the_direct_write_point_arrives_whole() {
        let base_dir = tempfile::Builder::new()
            .prefix("portcullis-direct-")
            .tempdir()
            .unwrap();
        let base = base_dir.path().to_path_buf();
        std::fs::create_dir_all(&base).unwrap();
        let root = crate::files::open_root(&terms(&base, false)).unwrap();
        let from = DIRECT_FROM as usize;
        let sizes = [
            0,
            1,
            from - 1,
            from,
            from + 1,
            from + STAGING_BUFFER + 4096 + 7,
        ];
        for (i, size) in sizes.into_iter().enumerate() {
            let data: Vec<u8> = (0..size).map(|n| (n % 251) as u8 ^ i as u8).collect();
            let mut file = AtomicFile::create(&root, "f", false, false).unwrap();
            // Record-sized pieces, and sizes no block boundary matches.
            let mut pieces = [65_519, 1, 4_097].into_iter().cycle();
            let mut at = 0;
            while at < size {
                let n = pieces.next().unwrap().min(size - at);
                file.write(Bytes::copy_from_slice(&data[at..at + n]))
                    .unwrap();
                at += n;
            }
            assert_eq!(file.staging.is_some(), size > from, "{size} bytes");
            let result = file.commit().unwrap();
            assert_eq!(result["size"], size as u64);
            assert!(
                std::fs::read(base.join("f")).unwrap() == data,
                "{size} bytes"
            );
        }
        let _ = std::fs::remove_dir_all(base);
    }
}

//! Confinement: every path is resolved by the kernel beneath a directory
//! handle of its root, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`
//! and, unless the root allows symlinks, `RESOLVE_NO_SYMLINKS`. The kernel
//! refuses `..` above the handle, absolute symlinks and any symlink leading
//! out, atomically, so a symlink swapped in during an operation cannot
//! redirect it. Operations on a name (create, remove, rename) first open
//! its parent directory this way, then act on one component with the `*at`
//! calls, which never follow a final symlink.
//!
//! Where `openat2` is refused (`ENOSYS`: under systemd's
//! `RestrictSUIDSGID=`, on kernels before 5.6), the same rules are kept by
//! walking one component at a time (`walk.rs`).
//!
//! The policy has already normalised the path (no `..`, no absolute part);
//! this is the second, independent line. Errors carry virtual paths only.
//!
//! Architecture invariant: rustix only. The daemon's file provider and the
//! command launcher (a command's working directory) both open paths here,
//! so there is one implementation of the check.

#![forbid(unsafe_code)]

mod walk;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Statx, StatxFlags};
use rustix::io::Errno;

/// A granted root as confinement needs it: where it is on the host, what
/// clients call it, and whether symlinks inside it may be followed.
#[derive(Debug, Clone, Copy)]
pub struct RootSpec<'a> {
    /// The root's id (in errors about the root itself).
    pub id: &'a str,
    /// The directory on the host: the operator's, opened as written.
    pub host_root: &'a Path,
    /// What clients call the root's directory.
    pub virtual_root: &'a str,
    /// Symlinks that stay beneath the root may be followed.
    pub follow_symlinks: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileError {
    NotFound(String),
    /// The path leaves the root, or crosses a symlink the root forbids.
    Escapes(String),
    Denied(String),
    /// The request does not fit the file (exists, is a directory, …).
    Invalid(String),
    Io(String),
    Cancelled,
}

impl FileError {
    /// What the error says, for a person (a virtual path, never a host one).
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(m)
            | Self::Escapes(m)
            | Self::Denied(m)
            | Self::Invalid(m)
            | Self::Io(m) => m,
            Self::Cancelled => "the request was cancelled",
        }
    }

    /// Names an OS error for `vpath` (a virtual path) without host details.
    pub fn from_errno(e: Errno, vpath: &str) -> Self {
        match e {
            Errno::NOENT => Self::NotFound(format!("{vpath}: no such file or directory")),
            Errno::XDEV | Errno::LOOP => Self::Escapes(format!(
                "{vpath}: the path leaves its root or goes through a symlink the root does not allow"
            )),
            Errno::ACCESS | Errno::PERM | Errno::ROFS => {
                Self::Denied(format!("{vpath}: permission denied"))
            }
            Errno::EXIST => Self::Invalid(format!("{vpath}: already exists")),
            Errno::NOTDIR => Self::Invalid(format!("{vpath}: a component is not a directory")),
            Errno::ISDIR => Self::Invalid(format!("{vpath}: is a directory")),
            Errno::NOTEMPTY => Self::Invalid(format!(
                "{vpath}: the directory is not empty (pass recursive: true)"
            )),
            Errno::NAMETOOLONG => Self::Invalid(format!("{vpath}: name too long")),
            Errno::NOSPC | Errno::DQUOT => {
                Self::Io(format!("{vpath}: no space left on the device"))
            }
            other => Self::Io(format!("{vpath}: {}", other.kind())),
        }
    }
}

impl From<std::io::Error> for FileError {
    fn from(e: std::io::Error) -> Self {
        Self::from_errno(Errno::from_io_error(&e).unwrap_or(Errno::IO), "")
    }
}

/// The attributes a file's description needs (type, mode, size and
/// modification time): what the daemon's `file.stat` asks
/// [`Root::statx_cached_at`] for.
pub const STAT_ATTRIBUTES: StatxFlags = StatxFlags::TYPE
    .union(StatxFlags::MODE)
    .union(StatxFlags::SIZE)
    .union(StatxFlags::MTIME);

/// A granted root, opened for one request.
pub struct Root {
    dir: OwnedFd,
    resolve: ResolveFlags,
    virtual_root: String,
    id: String,
}

impl Root {
    /// Opens the root's directory. The host path is the operator's, so it
    /// is opened as written; everything below it is confined.
    pub fn open(terms: &RootSpec<'_>) -> Result<Self, FileError> {
        let dir = open_root_dir(terms, ResolveFlags::empty()).map_err(|e| {
            FileError::Io(format!(
                "root `{}` is not available on this host ({})",
                terms.id,
                e.kind()
            ))
        })?;
        Ok(Self::with_dir(terms, dir))
    }

    /// Opens the root's directory only if the kernel can find it in its
    /// lookup cache alone (`RESOLVE_CACHED`: a path walk that fails rather
    /// than read a directory or ask a file server); `None` otherwise, or
    /// on any error (then [`Self::open`] says what went wrong).
    pub fn open_cached(terms: &RootSpec<'_>) -> Option<Self> {
        let dir = open_root_dir(terms, ResolveFlags::CACHED).ok()?;
        Some(Self::with_dir(terms, dir))
    }

    fn with_dir(terms: &RootSpec<'_>, dir: OwnedFd) -> Self {
        let mut resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if !terms.follow_symlinks {
            resolve |= ResolveFlags::NO_SYMLINKS;
        }
        Self {
            dir,
            resolve,
            virtual_root: terms.virtual_root.to_string(),
            id: terms.id.to_string(),
        }
    }

    /// The directory `path` beneath the root, opened `O_PATH`: a
    /// command's working directory.
    pub fn open_dir(terms: &RootSpec<'_>, path: &str) -> Result<OwnedFd, FileError> {
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        Self::open(terms)?.open_at(path, flags, Mode::empty())
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// What a client calls `path` (relative to this root).
    pub fn virtual_path(&self, path: &str) -> String {
        match path {
            "" => self.virtual_root.clone(),
            _ => format!("{}/{path}", self.virtual_root.trim_end_matches('/')),
        }
    }

    /// Opens `path` ("" is the root) beneath the root.
    pub fn open_at(&self, path: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, FileError> {
        self.open_beneath(&self.dir, path, flags, mode)
            .map_err(|e| FileError::from_errno(e, &self.virtual_path(path)))
    }

    /// The attributes in `needed` of `path` (a final symlink not followed)
    /// beneath the root, found as [`Self::open_at`] finds it but only from
    /// the lookup cache (see [`Self::open_cached`]), and asked of `statx`
    /// with `AT_STATX_DONT_SYNC`, which keeps it from asking a file server.
    /// `None` on any error, or when `statx` could not give all of `needed`.
    /// The daemon's `file.stat` on a runtime worker makes these system
    /// calls, and the bench times them.
    pub fn statx_cached_at(&self, path: &str, needed: StatxFlags) -> Option<Statx> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW;
        let fd = self
            .open_once(&self.dir, path, flags, Mode::empty(), ResolveFlags::CACHED)
            .ok()?;
        let at = AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC;
        let statx = rustix::fs::statx(&fd, "", at, needed).ok()?;
        StatxFlags::from_bits_retain(statx.stx_mask)
            .contains(needed)
            .then_some(statx)
    }

    /// Opens `path` beneath `dir`, a directory already inside this root.
    pub fn open_beneath(
        &self,
        dir: &OwnedFd,
        path: &str,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, Errno> {
        loop {
            match self.open_once(dir, path, flags, mode, ResolveFlags::empty()) {
                // openat2 may ask for a retry when a rename raced the lookup.
                Err(Errno::AGAIN) => continue,
                other => return other,
            }
        }
    }

    /// One `openat2` of `path` ("" is `dir` itself) beneath `dir`, with this
    /// root's confinement and `extra` resolve flags.
    fn open_once(
        &self,
        dir: &OwnedFd,
        path: &str,
        flags: OFlags,
        mode: Mode,
        extra: ResolveFlags,
    ) -> Result<OwnedFd, Errno> {
        openat2_or_walk(dir.as_fd(), path, flags, mode, self.resolve | extra)
    }

    /// The directory holding `path`, opened for `*at` calls, and the last
    /// component. The root itself has no parent here.
    pub fn parent(&self, path: &str) -> Result<(OwnedFd, String), FileError> {
        let (parent, name) = match path.rsplit_once('/') {
            Some((parent, name)) => (parent, name),
            None if path.is_empty() => {
                return Err(FileError::Invalid(format!(
                    "{}: the root itself cannot be changed this way",
                    self.virtual_root
                )));
            }
            None => ("", path),
        };
        let dir = self.open_at(parent, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        Ok((dir, name.to_string()))
    }
}

/// The root's own directory, `O_PATH`, for [`Root::open`] (`resolve`
/// empty) and [`Root::open_cached`] (`RESOLVE_CACHED`).
fn open_root_dir(terms: &RootSpec<'_>, resolve: ResolveFlags) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let cwd = rustix::fs::CWD;
    if let Some(opened) = openat2(cwd, terms.host_root, flags, Mode::empty(), resolve) {
        return opened;
    }
    if resolve.contains(ResolveFlags::CACHED) {
        return Err(Errno::AGAIN);
    }
    rustix::fs::openat(cwd, terms.host_root, flags, Mode::empty())
}

/// Set once `openat2` has answered `ENOSYS`: every later open walks.
static OPENAT2_REFUSED: AtomicBool = AtomicBool::new(false);

/// One `openat2`, or `None` where it is refused (`ENOSYS`, remembered).
fn openat2(
    dir: BorrowedFd<'_>,
    path: impl rustix::path::Arg,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> Option<Result<OwnedFd, Errno>> {
    if OPENAT2_REFUSED.load(Ordering::Relaxed) {
        return None;
    }
    match rustix::fs::openat2(dir, path, flags, mode, resolve) {
        Err(Errno::NOSYS) => {
            OPENAT2_REFUSED.store(true, Ordering::Relaxed);
            None
        }
        other => Some(other),
    }
}

/// How paths are resolved beneath a root on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// By the kernel, with one `openat2` per path.
    Openat2,
    /// One component at a time (`openat2` is refused here: systemd's
    /// `RestrictSUIDSGID=`, a kernel before 5.6, a seccomp profile).
    Walk,
}

/// Tries `openat2` once, so that the answer is known (and can be said)
/// before the first request.
pub fn resolver() -> Resolver {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let probe = openat2(
        rustix::fs::CWD,
        ".",
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH,
    );
    match probe {
        Some(_) => Resolver::Openat2,
        None => Resolver::Walk,
    }
}

/// Opens `path` ("" is `dir` itself) beneath `dir` with `resolve`'s rules:
/// one `openat2`, or the walk where the system refuses `openat2`. The walk
/// has no lookup-cache-only mode: with `RESOLVE_CACHED` it answers
/// `EAGAIN`, as `openat2` does when the cache is not enough.
fn openat2_or_walk(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::CLOEXEC;
    let dot_or_path = if path.is_empty() { "." } else { path };
    if let Some(opened) = openat2(dir, dot_or_path, flags, mode, resolve) {
        return opened;
    }
    if resolve.contains(ResolveFlags::CACHED) {
        return Err(Errno::AGAIN);
    }
    let follow_symlinks = !resolve.contains(ResolveFlags::NO_SYMLINKS);
    walk::open(dir, path, flags, mode, follow_symlinks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::FileType;
    use std::os::unix::fs::symlink;

    fn terms(dir: &std::path::Path, follow: bool) -> RootSpec<'_> {
        RootSpec {
            id: "main",
            host_root: dir,
            virtual_root: "/workspace/main",
            follow_symlinks: follow,
        }
    }

    #[test]
    fn the_kernel_keeps_resolution_beneath_the_root() {
        let base_dir = tempfile::Builder::new()
            .prefix("portcullis-confine-")
            .tempdir()
            .unwrap();
        let base = base_dir.path().to_path_buf();
        let root_dir = base.join("root");
        std::fs::create_dir_all(root_dir.join("sub")).unwrap();
        std::fs::write(base.join("secret"), "outside").unwrap();
        std::fs::write(root_dir.join("sub/file"), "inside").unwrap();
        symlink("../secret", root_dir.join("up")).unwrap();
        symlink("/etc/passwd", root_dir.join("abs")).unwrap();
        symlink("sub/file", root_dir.join("in")).unwrap();

        let strict = Root::open(&terms(&root_dir, false)).unwrap();
        let following = Root::open(&terms(&root_dir, true)).unwrap();
        let read = OFlags::RDONLY;
        assert!(strict.open_at("sub/file", read, Mode::empty()).is_ok());
        for (root, path) in [
            (&strict, "up"),
            (&strict, "abs"),
            (&strict, "in"),
            (&strict, "../secret"),
            (&strict, "/etc/passwd"),
            (&following, "up"),
            (&following, "abs"),
            (&following, "../secret"),
            (&following, "sub/../../secret"),
        ] {
            let err = root.open_at(path, read, Mode::empty()).unwrap_err();
            assert!(matches!(err, FileError::Escapes(_)), "{path}: {err:?}");
            assert!(
                !err.message().contains(&*base.to_string_lossy()),
                "{}",
                err.message()
            );
        }
        assert!(following.open_at("in", read, Mode::empty()).is_ok());
        assert!(matches!(
            strict.open_at("missing", read, Mode::empty()),
            Err(FileError::NotFound(_))
        ));
        assert_eq!(strict.virtual_path("sub/file"), "/workspace/main/sub/file");
        assert!(matches!(strict.parent(""), Err(FileError::Invalid(_))));
        assert_eq!(strict.parent("sub/file").unwrap().1, "file");
        let _ = std::fs::remove_dir_all(base);
    }

    #[test]
    fn a_cached_stat_describes_only_what_is_beneath_the_root() {
        let base_dir = tempfile::Builder::new()
            .prefix("portcullis-confine-")
            .tempdir()
            .unwrap();
        let root_dir = base_dir.path().join("root");
        std::fs::create_dir_all(root_dir.join("sub")).unwrap();
        std::fs::write(base_dir.path().join("secret"), "outside!").unwrap();
        std::fs::write(root_dir.join("sub/file"), "inside").unwrap();
        symlink("../secret", root_dir.join("up")).unwrap();
        // Warm the lookup cache, as an earlier request would have.
        let _ = std::fs::metadata(root_dir.join("sub/file")).unwrap();
        let _ = std::fs::symlink_metadata(root_dir.join("up")).unwrap();

        let root = Root::open_cached(&terms(&root_dir, false)).expect("a cached root");
        let file = root
            .statx_cached_at("sub/file", STAT_ATTRIBUTES)
            .expect("a cached file");
        assert_eq!(file.stx_size, 6);
        assert_eq!(
            FileType::from_raw_mode(u32::from(file.stx_mode)),
            FileType::RegularFile
        );
        // The final symlink is described, not followed to the file outside.
        let link = root
            .statx_cached_at("up", STAT_ATTRIBUTES)
            .expect("the link itself");
        assert_eq!(
            FileType::from_raw_mode(u32::from(link.stx_mode)),
            FileType::Symlink
        );
        assert_eq!(link.stx_size, "../secret".len() as u64);
        for path in ["../secret", "/etc/passwd", "up/x", "missing"] {
            assert!(
                root.statx_cached_at(path, STAT_ATTRIBUTES).is_none(),
                "{path}"
            );
        }
    }
}

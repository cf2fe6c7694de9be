//! Resolution beneath a directory handle without `openat2`, for where it is
//! refused with `ENOSYS`: systemd's `RestrictSUIDSGID=` filters it (it
//! cannot inspect `openat2`'s mode), as do kernels before 5.6 and some
//! container seccomp profiles.
//!
//! The rules are `openat2`'s with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`
//! (and `RESOLVE_NO_SYMLINKS` for a root that forbids symlinks), kept by
//! opening one component at a time with `O_NOFOLLOW`, each relative to the
//! handle of the directory before it: `..` pops a handle and fails past
//! the start (`EXDEV`); a symlink is never followed by the kernel: its
//! target is read (`readlinkat`) and walked the same way, an absolute one
//! refused (`EXDEV`), more than 40 in one walk refused (`ELOOP`), as the
//! kernel counts. A magic link (`/proc/…/fd/N`) has no target text to
//! walk to, so it is never followed either. A rename racing the walk can
//! make it fail, never lead it out: no step names a path from the root.
//!
//! The handles of the directories walked into are kept (`..` returns to
//! them, never to what `..` names now); a walk holds at most
//! [`MAX_DEPTH`] of them, so a tree built deep on purpose cannot take the
//! daemon's descriptors: deeper paths fail with `ENAMETOOLONG`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// Symlinks one walk may follow, as the kernel's `MAXSYMLINKS`.
const MAX_SYMLINKS: usize = 40;
/// Directory handles one walk may hold: a path this deep below its root.
pub(crate) const MAX_DEPTH: usize = 256;

/// Opens `path` beneath `start` with `flags` and `mode`, following
/// symlinks that stay beneath `start` only if `follow_symlinks`.
pub(crate) fn open(
    start: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
    follow_symlinks: bool,
) -> Result<OwnedFd, Errno> {
    if path.starts_with('/') {
        return Err(Errno::XDEV);
    }
    // The last component is opened with the caller's flags; it follows a
    // symlink unless they say not to (`O_NOFOLLOW`, or `O_CREAT | O_EXCL`,
    // which never follows).
    let final_follows =
        !flags.contains(OFlags::NOFOLLOW) && !flags.contains(OFlags::CREATE | OFlags::EXCL);
    // Components still to walk, the next one last.
    let mut pending: Vec<Vec<u8>> = Vec::new();
    push_components(&mut pending, path.as_bytes());
    // Handles of the directories walked into; the current one is the last,
    // or `start`.
    let mut dirs: Vec<OwnedFd> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop() {
        let here = dirs.last().map_or(start, |dir| dir.as_fd());
        if name == b"." || name == SLASH {
            continue;
        }
        if name == b".." {
            dirs.pop().ok_or(Errno::XDEV)?;
            continue;
        }
        // A name with a slash after it is not created, whatever it is.
        if flags.contains(OFlags::CREATE) && pending == [SLASH] {
            return Err(Errno::ISDIR);
        }
        if pending.is_empty() {
            if !final_follows {
                return rustix::fs::openat(here, name, flags, mode);
            }
            if let Ok(target) = rustix::fs::readlinkat(here, &name, Vec::new()) {
                follow(&mut pending, target.as_bytes(), &mut links, follow_symlinks)?;
                continue;
            }
            return rustix::fs::openat(here, name, flags | OFlags::NOFOLLOW, mode);
        }
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(here, &name, dir_flags, Mode::empty()) {
            Ok(_) if dirs.len() == MAX_DEPTH => return Err(Errno::NAMETOOLONG),
            Ok(dir) => dirs.push(dir),
            // A symlink opened `O_DIRECTORY | O_NOFOLLOW` is "not a
            // directory", as a file is; `readlinkat` tells which.
            Err(Errno::NOTDIR) => match rustix::fs::readlinkat(here, &name, Vec::new()) {
                Ok(target) => follow(&mut pending, target.as_bytes(), &mut links, follow_symlinks)?,
                Err(_) => return Err(Errno::NOTDIR),
            },
            Err(e) => return Err(e),
        }
    }
    // The path ended on a directory: the start itself, `.`, `..`, or a
    // name with a slash after it.
    let here = dirs.last().map_or(start, |dir| dir.as_fd());
    rustix::fs::openat(here, ".", flags, mode)
}

/// Puts a symlink's target in front of what is still to walk.
fn follow(
    pending: &mut Vec<Vec<u8>>,
    target: &[u8],
    links: &mut usize,
    follow_symlinks: bool,
) -> Result<(), Errno> {
    *links += 1;
    if !follow_symlinks || *links > MAX_SYMLINKS {
        return Err(Errno::LOOP);
    }
    if target.starts_with(b"/") {
        return Err(Errno::XDEV);
    }
    push_components(pending, target);
    Ok(())
}

/// Marks a path that ends in a slash: no component can be `/`.
const SLASH: &[u8] = b"/";

/// Adds `path`'s components to `pending` so that its first is popped next.
/// Empty components and `.` are nothing to walk, except at the end: a path
/// ending in `/` or `/.` names a directory, so a marker (`/` or `.`) is kept
/// after its last name, which is then walked into as a directory.
fn push_components(pending: &mut Vec<Vec<u8>>, path: &[u8]) {
    let components = path.split(|&b| b == b'/');
    match components.clone().next_back() {
        _ if path.is_empty() => {}
        Some(b"") => pending.push(SLASH.to_vec()),
        Some(b".") => pending.push(b".".to_vec()),
        _ => {}
    }
    pending.extend(
        components
            .rev()
            .filter(|c| !c.is_empty() && *c != b".")
            .map(<[u8]>::to_vec),
    );
}

#[cfg(test)]
mod tests {
    //! The walk against the kernel's `openat2` on the same tree: every path
    //! of up to three components drawn from the tree's names (symlinks in,
    //! up, absolute, chained, looping, dangling; `.` and `..`), with each
    //! kind of open the daemon makes, must give the same file or the same
    //! error.

    use super::*;
    use proptest::prelude::*;
    use rustix::fs::ResolveFlags;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    const NAMES: &[&str] = &[
        "sub",
        "file",
        "deep",
        "in",
        "indir",
        "indir_slash",
        "up",
        "abs",
        "chain",
        "loop",
        "dangle",
        "dotdot",
        "back",
        "out",
        "..",
        ".",
        "missing",
    ];

    /// `base/root` with every kind of entry the names above reach, and
    /// `base/secret` outside it.
    fn tree(base: &Path) -> std::fs::File {
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub/deep")).unwrap();
        std::fs::write(base.join("secret"), "outside").unwrap();
        std::fs::write(root.join("file"), "top").unwrap();
        std::fs::write(root.join("sub/file"), "inside").unwrap();
        for (link, target) in [
            ("in", "sub/file"),
            ("indir", "sub"),
            ("indir_slash", "sub/"),
            ("up", "../secret"),
            ("abs", "/etc/passwd"),
            ("chain", "in"),
            ("loop", "loop"),
            ("dangle", "sub/new"),
            ("dotdot", "sub/.."),
            ("sub/back", "../file"),
            ("sub/out", "../../secret"),
        ] {
            symlink(target, root.join(link)).unwrap();
        }
        std::fs::File::open(root).unwrap()
    }

    fn paths(depth: usize) -> Vec<String> {
        let mut all = vec![
            String::new(),
            "sub/".into(),
            "indir/".into(),
            "file/".into(),
        ];
        let mut last = vec![String::new()];
        for _ in 0..depth {
            let next: Vec<String> = last
                .iter()
                .flat_map(|p| {
                    NAMES.iter().map(move |n| match p.is_empty() {
                        true => n.to_string(),
                        false => format!("{p}/{n}"),
                    })
                })
                .collect();
            all.extend(next.iter().cloned());
            last = next;
        }
        all
    }

    fn resolve(follow: bool) -> ResolveFlags {
        let base = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        match follow {
            true => base,
            false => base | ResolveFlags::NO_SYMLINKS,
        }
    }

    fn by_kernel(
        dir: &impl AsFd,
        path: &str,
        flags: OFlags,
        follow: bool,
    ) -> Result<OwnedFd, Errno> {
        let path = if path.is_empty() { "." } else { path };
        // openat2 refuses a mode without O_CREAT.
        let mode = match flags.contains(OFlags::CREATE) {
            true => Mode::from_raw_mode(0o600),
            false => Mode::empty(),
        };
        loop {
            match rustix::fs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve(follow)) {
                Err(Errno::AGAIN) => continue,
                other => return other,
            }
        }
    }

    fn identity(fd: &OwnedFd) -> (u64, u64) {
        let stat = rustix::fs::fstat(fd).unwrap();
        (stat.st_dev, stat.st_ino)
    }

    #[test]
    fn the_walk_opens_what_openat2_opens() {
        let base = tempfile::Builder::new()
            .prefix("portcullis-walk-")
            .tempdir()
            .unwrap();
        let root = tree(base.path());
        let mut compared = 0;
        for path in paths(3) {
            for flags in [
                OFlags::RDONLY,
                OFlags::RDONLY | OFlags::DIRECTORY,
                OFlags::RDONLY | OFlags::NOFOLLOW,
                OFlags::PATH,
                OFlags::PATH | OFlags::DIRECTORY,
                OFlags::PATH | OFlags::NOFOLLOW,
            ] {
                for follow in [false, true] {
                    let kernel = by_kernel(&root, &path, flags, follow);
                    let walked = open(root.as_fd(), &path, flags, Mode::empty(), follow);
                    match (&kernel, &walked) {
                        (Ok(k), Ok(w)) => assert_eq!(
                            identity(k),
                            identity(w),
                            "{path:?} {flags:?} follow={follow}"
                        ),
                        (Err(k), Err(w)) => {
                            assert_eq!(k, w, "{path:?} {flags:?} follow={follow}")
                        }
                        _ => panic!(
                            "{path:?} {flags:?} follow={follow}: openat2 {:?}, walk {:?}",
                            kernel.map(|fd| identity(&fd)),
                            walked.map(|fd| identity(&fd))
                        ),
                    }
                    compared += 1;
                }
            }
        }
        assert!(compared > 60_000, "{compared}");
        assert_eq!(
            std::fs::read_to_string(base.path().join("secret")).unwrap(),
            "outside"
        );
    }

    #[test]
    fn a_walk_holds_a_bounded_number_of_handles() {
        let base = tempfile::tempdir().unwrap();
        let deep = ["d"; MAX_DEPTH + 1].join("/");
        std::fs::create_dir_all(base.path().join(&deep)).unwrap();
        let start = std::fs::File::open(base.path()).unwrap();
        let at_limit = ["d"; MAX_DEPTH].join("/");
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        // The last component is opened, not held: MAX_DEPTH + 1 reach.
        assert!(
            open(
                start.as_fd(),
                &format!("{at_limit}/d"),
                flags,
                Mode::empty(),
                false
            )
            .is_ok()
        );
        assert_eq!(
            open(
                start.as_fd(),
                &format!("{deep}/d"),
                flags,
                Mode::empty(),
                false
            )
            .err(),
            Some(Errno::NAMETOOLONG)
        );
        // A symlink back to the top, followed in a loop, stops at the
        // kernel's count of symlinks.
        symlink("..", base.path().join("d/again")).unwrap();
        let looping = ["d/again"; 41].join("/");
        assert!(
            open(
                start.as_fd(),
                &["d/again"; 40].join("/"),
                flags,
                Mode::empty(),
                true
            )
            .is_ok()
        );
        assert_eq!(
            open(start.as_fd(), &looping, flags, Mode::empty(), true).err(),
            Some(Errno::LOOP)
        );
    }

    /// Names the random trees and paths below are made of: the tree's
    /// own, the symlinks', what lies outside the root, and none.
    const WORDS: &[&str] = &[
        "..", ".", "a", "b", "c", "f", "g", "h", "l0", "l1", "l2", "l3", "l4", "l5", "root",
        "secret", "missing",
    ];
    /// Where the random symlinks may be made.
    const DIRS: &[&str] = &["", "a", "a/b", "c"];

    fn words(max: usize) -> impl Strategy<Value = String> {
        (
            proptest::collection::vec(proptest::sample::select(WORDS), 1..=max),
            proptest::bool::weighted(0.1),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(words, absolute, slash)| {
                let mut path = words.join("/");
                if absolute {
                    path.insert(0, '/');
                }
                if slash {
                    path.push('/');
                }
                path
            })
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(64))]

        /// Random symlinks in a small tree (targets up, absolute, chained,
        /// looping, through files), random paths through them: the walk
        /// gives what `openat2` gives.
        #[test]
        fn the_walk_agrees_with_openat2_on_random_trees(
            links in proptest::collection::vec((proptest::sample::select(DIRS), words(4)), 6),
            paths in proptest::collection::vec(words(5), 48),
        ) {
            let base = scratch();
            let root = base.path().join("root");
            std::fs::create_dir_all(root.join("a/b")).unwrap();
            std::fs::create_dir_all(root.join("c")).unwrap();
            std::fs::write(base.path().join("secret"), "outside").unwrap();
            for (file, dir) in [("f", ""), ("g", "a"), ("h", "a/b")] {
                std::fs::write(root.join(dir).join(file), file).unwrap();
            }
            for (i, (dir, target)) in links.iter().enumerate() {
                symlink(target, root.join(dir).join(format!("l{i}"))).unwrap();
            }
            let start = std::fs::File::open(&root).unwrap();
            for path in &paths {
                for flags in [
                    OFlags::RDONLY,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    OFlags::PATH,
                    OFlags::PATH | OFlags::NOFOLLOW,
                ] {
                    for follow in [false, true] {
                        let kernel = by_kernel(&start, path, flags, follow).map(|fd| identity(&fd));
                        let walked = open(start.as_fd(), path, flags, Mode::empty(), follow)
                            .map(|fd| identity(&fd));
                        prop_assert_eq!(
                            kernel, walked,
                            "{:?} {:?} follow={} links={:?}", path, flags, follow, links
                        );
                    }
                }
            }
        }
    }

    /// Every file and symlink under `dir`, with its kind and contents.
    fn listing(dir: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                let meta = std::fs::symlink_metadata(&path).unwrap();
                let what = if meta.is_symlink() {
                    format!("-> {}", std::fs::read_link(&path).unwrap().display())
                } else if meta.is_dir() {
                    stack.push(path);
                    "dir".into()
                } else {
                    std::fs::read_to_string(&path).unwrap()
                };
                out.push((name, what));
            }
        }
        out.sort();
        out
    }

    /// A directory for one tree, in memory where there is a tmpfs: this
    /// test makes thousands.
    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap()
    }

    #[test]
    fn the_walk_creates_what_openat2_creates() {
        for path in paths(2) {
            for flags in [
                OFlags::WRONLY | OFlags::CREATE,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
            ] {
                for follow in [false, true] {
                    let (a, b) = (scratch(), scratch());
                    let (kernel_root, walk_root) = (tree(a.path()), tree(b.path()));
                    let kernel = by_kernel(&kernel_root, &path, flags, follow).map(|_| ());
                    let walked = open(
                        walk_root.as_fd(),
                        &path,
                        flags | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                        follow,
                    )
                    .map(|_| ());
                    let case = format!("{path:?} {flags:?} follow={follow}");
                    assert_eq!(kernel, walked, "{case}");
                    assert_eq!(listing(a.path()), listing(b.path()), "{case}");
                }
            }
        }
    }
}

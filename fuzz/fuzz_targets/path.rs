//! Arbitrary client paths through the whole resolver: the policy's
//! normalisation, then the kernel-confined lookup beneath a real root full
//! of symlinks that lead out. Whatever the input, normalisation yields a
//! clean relative path or an error, and anything that opens is inside the
//! root; nothing panics.

#![no_main]

use std::os::fd::AsRawFd as _;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use portcullis_confine::{Root, RootSpec};
use portcullis_policy::path::normalize;
use rustix::fs::{Mode as FileMode, OFlags};

const VIRTUAL_ROOT: &str = "/workspace/main";

/// base/root (the root) and base/outside, with links from one to the other.
fn fixture() -> &'static PathBuf {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("portcullis-fuzz-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(base.join("outside/dir")).unwrap();
        std::fs::write(root.join("a/b/file"), "in").unwrap();
        std::fs::write(base.join("outside/secret"), "out").unwrap();
        symlink("../outside", root.join("out_rel")).unwrap();
        symlink(base.join("outside"), root.join("out_abs")).unwrap();
        symlink("..", root.join("up")).unwrap();
        symlink("a/b", root.join("in_rel")).unwrap();
        symlink("/proc/self/root", root.join("proc_root")).unwrap();
        symlink("/", root.join("slash")).unwrap();
        symlink("in_rel/../../out_rel", root.join("chain")).unwrap();
        base.canonicalize().unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(relative) = normalize(VIRTUAL_ROOT, path) else {
        return;
    };
    let rel = relative.as_str();
    assert!(!rel.starts_with('/') && !rel.contains('\0'), "{rel:?}");
    assert!(rel.split('/').all(|c| c != ".." && c != "."), "{rel:?}");
    let base = fixture();
    let host_root = base.join("root");
    for follow_symlinks in [false, true] {
        let spec = RootSpec {
            id: "main",
            host_root: &host_root,
            virtual_root: VIRTUAL_ROOT,
            follow_symlinks,
        };
        let root = Root::open(&spec).unwrap();
        for flags in [OFlags::PATH, OFlags::RDONLY | OFlags::NONBLOCK, OFlags::PATH | OFlags::NOFOLLOW] {
            let Ok(fd) = root.open_at(rel, flags, FileMode::empty()) else {
                continue;
            };
            let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            assert!(
                target.starts_with(&host_root),
                "{path:?} -> {rel:?} opened {} (follow_symlinks {follow_symlinks})",
                target.display()
            );
        }
    }
});

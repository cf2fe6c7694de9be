//! A command's own world: user, mount, PID, IPC, UTS and (for a grant that
//! denies the network) network namespaces, made by driving bubblewrap
//! (`/usr/bin/bwrap`, Debian's `bubblewrap`). bwrap is what Flatpak and
//! Codex build on: small, unprivileged (no setuid here), and it gets the
//! fiddly parts right — uid maps, mount propagation, a `/proc` of the new
//! PID namespace with its dangerous files covered, a minimal `/dev`,
//! capabilities dropped even for root. Doing those by hand is where
//! sandboxes go wrong.
//!
//! What the command sees: the system's program directories (`/usr`,
//! `/opt`, and `/bin`, `/sbin`, `/lib*` as they are on the host) read-only;
//! `/etc` read-only with every entry that is not readable by all users
//! covered (`shadow`, `gshadow`, SSH host keys, private keys, a policy file
//! of mode 0640…) and `/etc/portcullis` empty; its granted roots at their
//! host paths, read-only or read-write as granted; a private `/tmp` and
//! `/dev/shm`, each bounded in bytes and in files ([`mount_inside`]); a
//! fresh `/proc` showing only its own processes; a minimal `/dev`. Nothing
//! else: no `/run` (no admin socket, no credentials), no `/var`, no `/sys`,
//! no home directories. Its hostname (a UTS namespace), SysV IPC and
//! abstract Unix sockets (with its own network namespace) are its own.
//!
//! The process tree, and why the launcher stays:
//!
//! ```text
//! daemon ─ launcher (session leader; waits) ─ bwrap (monitor)
//!                                                └ launcher --inside (pid 1, the world's init) ─ program
//! ```
//!
//! The daemon signals the launcher's process group (`shell.signal`, a
//! terminal's ^C). The launcher, bwrap and the inner launcher block those
//! signals (the mask survives exec) — the inner launcher then catches them
//! with handlers that do nothing, which exec resets, so that it can give
//! the program an empty mask — and only the program acts on them, as it
//! did when it was the launcher's own exec. A signal that came before the
//! world's first process existed is passed on to it by the launcher
//! ([`Held`]). bwrap reports a signal death as exit code 128+n;
//! the inner launcher, the program's parent, knows the truth and writes it
//! to a pipe (see [`Status`]), and the launcher ends the same way, so the
//! daemon sees what it saw before. When the program ends, the inner
//! launcher reports it and exits, and as the world's init (`--as-pid-1`;
//! it reaps the world's orphans meanwhile) takes everything left in the
//! PID namespace with it: `setsid` and double-forks included. A SIGKILL to
//! the group does the same at once.
//!
//! The chain of deaths when the daemon dies, even by SIGKILL: the
//! launcher's parent-death signal (set before it does anything, see the
//! crate's text); then the launcher inside, which from the moment it is
//! confined watches the status pipe in everything it waits for — its
//! arguments, its release, its program — and ends when the pipe's reader,
//! the launcher outside, is gone ([`readable`]), taking the world with it
//! as its init; then bwrap's monitor, whose child that was. One that
//! finds the reader gone when it starts runs nothing
//! ([`Status::reader_gone`]). bwrap's own `--die-with-parent` is not
//! used: its monitor, killed between making the world's first process and
//! letting it go on, left that process waiting forever (bwrap's issue
//! 633, at another step); with nothing tying the monitor to the
//! launcher, it always lets it go on, and bwrap's write of that process
//! to the launcher always has a reader ([`Held`]). bwrap's own init,
//! which set its signal only after starting the program, was such a gap;
//! so it is not used.

use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use rustix::fs::Access;

use crate::{EXIT_SANDBOX, SandboxArgs, SetupError, refuse};

/// Where bubblewrap is: Debian's package, never looked up on `PATH`.
pub const BWRAP: &str = "/usr/bin/bwrap";

/// System directories a program reads and executes from.
const SYSTEM_DIRS: &[&str] = &["/usr", "/opt"];
/// On a merged-`/usr` host these are symlinks into `/usr`, elsewhere
/// directories: recreated as they are.
const SYSTEM_LINKS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// Always empty inside, readable or not: the daemon's own configuration.
const ALWAYS_HIDDEN: &[&str] = &["/etc/portcullis"];
/// How deep below `/etc` unreadable entries are looked for.
const ETC_DEPTH: usize = 6;
/// Most `/etc` entries covered; a host with more is refused rather than
/// half-covered.
const MAX_HIDDEN: usize = 512;

/// The signals the daemon and a terminal send a command. Blocked in every
/// process between the daemon and the program (see the module's docs).
const RELAYED: [Signal; 12] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGTERM,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGPIPE,
    Signal::SIGALRM,
];

fn relayed() -> SigSet {
    let mut set = SigSet::empty();
    for signal in RELAYED {
        set.add(signal);
    }
    set
}

/// The entries of `/etc` a command must not see: those not readable by
/// all users that this process's user can read — and so the command,
/// which runs as the same user (root; or the service user through its
/// group, as with a policy file of mode 0640) — and `/etc/portcullis`.
/// What this user cannot read needs no cover, and each cover is a bind
/// mount, the costly part of a world. The daemon looks every few seconds
/// and tells launchers (`--etc-looked --hide …`), so a secret file added
/// after it started is covered too; a launcher told nothing looks itself.
pub fn hidden_in_etc() -> Result<Vec<PathBuf>, SetupError> {
    let mut hidden: Vec<PathBuf> = ALWAYS_HIDDEN
        .iter()
        .map(PathBuf::from)
        .filter(|path| path.symlink_metadata().is_ok())
        .collect();
    let mut pending = vec![(PathBuf::from("/etc"), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if hidden.iter().any(|h| path.starts_with(h)) {
                continue;
            }
            // Not followed: a symlink leads to what its target's own
            // mode says, and a target in /etc is looked at in its place.
            let Ok(meta) = entry.metadata() else { continue };
            let mode = meta.permissions().mode();
            let readable = match meta.is_dir() {
                true => mode & 0o005 == 0o005,
                false => meta.file_type().is_symlink() || mode & 0o004 != 0,
            };
            if !readable {
                let wanted = match meta.is_dir() {
                    true => Access::READ_OK | Access::EXEC_OK,
                    false => Access::READ_OK,
                };
                if rustix::fs::access(&path, wanted).is_ok() {
                    hidden.push(path);
                }
            } else if meta.is_dir() && depth < ETC_DEPTH {
                pending.push((path, depth + 1));
            }
        }
        if hidden.len() > MAX_HIDDEN {
            return Err(SetupError::Namespaces(format!(
                "more than {MAX_HIDDEN} entries of /etc are not readable by all users"
            )));
        }
    }
    Ok(hidden)
}

/// bwrap's arguments for `args`' world, up to its `--`.
fn bwrap_args(args: &SandboxArgs, launcher: &Path) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| out.extend(items.iter().map(|i| i.to_os_string()));
    let flag = |s: &'static str| OsStr::new(s);
    push(&[
        flag("--unshare-user"),
        flag("--unshare-ipc"),
        flag("--unshare-pid"),
        flag("--unshare-uts"),
        flag("--as-pid-1"),
        flag("--cap-drop"),
        flag("ALL"),
        // For the launcher inside to mount its own /tmp and /dev/shm, then
        // drop both: see `mount_inside` and `drop_capabilities`.
        flag("--cap-add"),
        flag("CAP_SYS_ADMIN"),
        flag("--cap-add"),
        flag("CAP_SETPCAP"),
    ]);
    if args.deny_network || args.egress.is_some() {
        push(&[flag("--unshare-net")]);
    }
    for dir in SYSTEM_DIRS {
        push(&[flag("--ro-bind-try"), flag(dir), flag(dir)]);
    }
    for link in SYSTEM_LINKS {
        match std::fs::read_link(link) {
            Ok(target) => push(&[flag("--symlink"), target.as_os_str(), flag(link)]),
            Err(_) => push(&[flag("--ro-bind-try"), flag(link), flag(link)]),
        }
    }
    // What of /etc is hidden, the launcher inside covers (`mount_inside`):
    // each bind of bwrap's reads the whole mount table.
    push(&[flag("--ro-bind"), flag("/etc"), flag("/etc")]);
    push(&[
        flag("--proc"),
        flag("/proc"),
        flag("--dev"),
        flag("/dev"),
        flag("--tmpfs"),
        flag("/tmp"),
    ]);
    if let Some(dir) = &args.egress {
        push(&[
            flag("--ro-bind"),
            dir.as_os_str(),
            flag(crate::egress::INSIDE_DIR),
        ]);
    }
    // After /tmp: a root may be below it.
    // A root whose directory is missing is left out, as Landlock leaves
    // it out: the command finds nothing there.
    for root in &args.ro {
        push(&[flag("--ro-bind-try"), root.as_os_str(), root.as_os_str()]);
    }
    for root in &args.rw {
        push(&[flag("--bind-try"), root.as_os_str(), root.as_os_str()]);
    }
    if !SYSTEM_DIRS.iter().any(|dir| launcher.starts_with(dir)) {
        push(&[
            flag("--ro-bind"),
            launcher.as_os_str(),
            launcher.as_os_str(),
        ]);
    }
    push(&[flag("--chdir"), flag("/")]);
    out
}

/// What a command's own `/tmp` and `/dev/shm` may each hold when the
/// daemon does not say (`--tmp-size`).
pub(crate) const DEFAULT_TMP_SIZE: u64 = 1 << 30;
/// Files and directories an own tmpfs may hold: one per this many bytes of
/// its size. A tmpfs's size bounds its pages, not its inodes (about 1 KiB
/// of kernel memory each, empty files included), whose kernel default is
/// half of RAM's pages: millions.
const BYTES_PER_INODE: u64 = 16 << 10;
/// Files and directories even the smallest own tmpfs may hold.
const MIN_INODES: u64 = 1024;

/// Gives the world its own `/tmp` and `/dev/shm` (those no root covers,
/// [`crate::own_tmpfs`]), bounded: `--tmp-size` bytes each (default
/// [`DEFAULT_TMP_SIZE`]) and
/// one file per [`BYTES_PER_INODE`]; writing past either fails with
/// `ENOSPC`; and covers what of `/etc` is `hidden` (see [`Covers`]).
/// bwrap cannot bound files, and a remount of its mounts is
/// refused: for a daemon that is not root, bwrap nests a second user
/// namespace (the one the launcher has its capabilities in) below the one
/// that owns the mounts. So the launcher makes a mount namespace of its
/// own, mounts over them, and binds the roots that bwrap bound beneath
/// them back where they were. (Covering here, not with bwrap's binds, is
/// cheaper: bwrap reads the whole mount table after each bind.)
pub(crate) fn mount_inside(args: &SandboxArgs, hidden: &[PathBuf]) -> Result<(), SetupError> {
    let dirs = crate::own_tmpfs(args);
    use rustix::mount::{MountFlags, MountPropagationFlags};
    let os = |step| move |e: rustix::io::Errno| SetupError::os(step, e.into());
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| SetupError::os("a mount namespace for /tmp", e.into()))?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(os("a mount namespace for /tmp"))?;
    let covers = Covers::of(hidden, args.ro.iter().chain(&args.rw))?;
    let mut tops: Vec<&Path> = dirs.iter().map(Path::new).collect();
    tops.extend(covers.dirs.iter().map(PathBuf::as_path));
    // Opened in this namespace (a mount of another cannot be bound here)
    // and before they are covered; the outermost only, as their binds
    // bring what lies beneath. A root bwrap left out (missing) stays out.
    let beneath = roots_beneath(&tops, args.ro.iter().chain(&args.rw));
    let mut held = Vec::new();
    for root in beneath {
        let flags =
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
        match rustix::fs::open(root, flags, rustix::fs::Mode::empty()) {
            Ok(fd) => held.push((root, fd)),
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(SetupError::os("a root below /tmp or /etc", e.into())),
        }
    }
    let size = args.tmp_size.unwrap_or(DEFAULT_TMP_SIZE);
    let files = (size / BYTES_PER_INODE).max(MIN_INODES);
    let options = std::ffi::CString::new(format!("size={size},nr_inodes={files},mode=1777"))
        .map_err(|e| SetupError::os("the tmpfs options", std::io::Error::other(e)))?;
    for dir in &dirs {
        let flags = MountFlags::NOSUID | MountFlags::NODEV;
        rustix::mount::mount("tmpfs", *dir, "tmpfs", flags, options.as_c_str())
            .map_err(os("mounting the world's /tmp and /dev/shm"))?;
    }
    covers.mount()?;
    for (root, fd) in held {
        std::fs::create_dir_all(root)
            .map_err(|e| SetupError::os("a root below /tmp or /etc", e))?;
        let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::mount::mount_bind_recursive(source.as_str(), root)
            .map_err(os("binding a root below /tmp or /etc"))?;
    }
    covers.seal()
}

/// What covers the entries of `/etc` a command must not see
/// ([`hidden_in_etc`]): a directory gets an empty tmpfs, read-only once
/// the roots beneath it are bound back; a file gets `/dev/null` bound over
/// it, read-only and `nodev`, so opening it fails with `EACCES`. An entry
/// at or beneath a granted root is not covered: the operator granted it,
/// and bwrap bound the root over `/etc`'s view of it. One gone since it
/// was looked at needs no cover.
#[derive(Debug, Default)]
struct Covers {
    dirs: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl Covers {
    fn of<'a>(
        hidden: &[PathBuf],
        roots: impl Iterator<Item = &'a PathBuf> + Clone,
    ) -> Result<Self, SetupError> {
        let mut covers = Self::default();
        for path in hidden {
            if roots.clone().any(|root| path.starts_with(root)) {
                continue;
            }
            match std::fs::metadata(path) {
                Ok(meta) if meta.is_dir() => covers.dirs.push(path.clone()),
                Ok(_) => covers.files.push(path.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(SetupError::os("an entry of /etc to cover", e)),
            }
        }
        Ok(covers)
    }

    fn mount(&self) -> Result<(), SetupError> {
        use rustix::mount::MountFlags;
        let os = |step| move |e: rustix::io::Errno| SetupError::os(step, e.into());
        let sealed = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        for dir in &self.dirs {
            rustix::mount::mount("tmpfs", dir, "tmpfs", sealed, c"size=4096,mode=0755")
                .map_err(os("covering a directory of /etc"))?;
        }
        if self.files.is_empty() {
            return Ok(());
        }
        // A remount must keep the flags the kernel locked on the source
        // (bwrap's /dev): add to them, never drop one.
        let kept = rustix::fs::statvfs("/dev/null").map_err(os("/dev/null"))?;
        let mut flags = sealed | MountFlags::BIND | MountFlags::RDONLY;
        for (has, flag) in [
            (rustix::fs::StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
            (
                rustix::fs::StatVfsMountFlags::NODIRATIME,
                MountFlags::NODIRATIME,
            ),
            (
                rustix::fs::StatVfsMountFlags::RELATIME,
                MountFlags::RELATIME,
            ),
        ] {
            if kept.f_flag.contains(has) {
                flags |= flag;
            }
        }
        for file in &self.files {
            rustix::mount::mount_bind("/dev/null", file).map_err(os("covering a file of /etc"))?;
            rustix::mount::mount_remount(file, flags, c"")
                .map_err(os("covering a file of /etc read-only"))?;
        }
        Ok(())
    }

    /// Makes the directories' covers read-only, once the roots beneath
    /// them have their mount points.
    fn seal(&self) -> Result<(), SetupError> {
        use rustix::mount::MountFlags;
        let flags =
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY;
        for dir in &self.dirs {
            rustix::mount::mount_remount(dir, flags, c"")
                .map_err(|e| SetupError::os("covering a directory of /etc read-only", e.into()))?;
        }
        Ok(())
    }
}

/// The roots strictly beneath one of `dirs`, outermost only (one beneath
/// another comes with it).
fn roots_beneath<'a>(dirs: &[&Path], roots: impl Iterator<Item = &'a PathBuf>) -> Vec<&'a PathBuf> {
    let below = |root: &Path, dir: &Path| root != dir && root.starts_with(dir);
    let beneath: Vec<&PathBuf> = roots
        .filter(|root| dirs.iter().any(|dir| below(root, dir)))
        .collect();
    let mut outermost: Vec<&PathBuf> = beneath
        .iter()
        .copied()
        .filter(|root| !beneath.iter().any(|other| below(root, other)))
        .collect();
    // A root granted twice (read-only and read-write) is bound once.
    outermost.sort();
    outermost.dedup();
    outermost
}

/// Gives up the capabilities bwrap left the launcher inside (in the
/// world's user namespace; with them the program could unmount what
/// covers `/etc`'s secrets), and checks with the kernel that none is left
/// in any set: a launcher that cannot runs nothing.
pub(crate) fn drop_capabilities() -> Result<(), SetupError> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let os = |step| move |e: rustix::io::Errno| SetupError::os(step, e.into());
    rustix::thread::clear_ambient_capability_set().map_err(os("the ambient capabilities"))?;
    // CAP_SETPCAP last: dropping from the bounding set needs it.
    for capability in [CapabilitySet::SYS_ADMIN, CapabilitySet::SETPCAP] {
        rustix::thread::remove_capability_from_bounding_set(capability)
            .map_err(os("the capability bounding set"))?;
    }
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    rustix::thread::set_capabilities(None, none).map_err(os("dropping capabilities"))?;
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| SetupError::os("/proc/self/status", e))?;
    match capabilities_left(&status) {
        None => Ok(()),
        Some(line) => Err(SetupError::Namespaces(format!(
            "the launcher inside kept capabilities ({line})"
        ))),
    }
}

/// The first of `/proc/self/status`' capability sets that is not empty,
/// or one missing: `None` when the process has no capability at all.
fn capabilities_left(status: &str) -> Option<String> {
    const SETS: [&str; 5] = ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"];
    SETS.iter().find_map(|set| {
        let value = status.lines().find_map(|line| line.strip_prefix(set));
        match value.map(str::trim) {
            Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b == b'0') => None,
            Some(hex) => Some(format!("{set} {hex}")),
            None => Some(format!("no {set} line")),
        }
    })
}

/// What the launcher inside the world is told.
pub(crate) enum Inner<'a> {
    /// The command's arguments, as this launcher was given them.
    Given(&'a [OsString]),
    /// To read them from stdin (`--args-on-stdin` and these flags).
    OnStdin(&'a [OsString]),
}

/// Runs the command in the world `args` describe (roots, network), with
/// the launcher inside told `inner`. Returns how the program ended, the
/// way the daemon expects to see it.
pub(crate) fn enter(args: &SandboxArgs, inner: Inner<'_>, hidden: &[PathBuf]) -> ExitCode {
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&relayed()), None) {
        return refuse(SetupError::os("blocking signals", e.into()));
    }
    // The launcher inside takes the daemon's CPU priority back itself (one
    // started ahead of need waits at the lowest), without capabilities:
    // that needs RLIMIT_NICE (the unit's LimitNICE=+0 gives it). Where
    // this launcher may raise it (root), it does; the one inside sets it
    // to 0 before the program runs.
    let nice = rustix::process::Rlimit {
        current: Some(20),
        maximum: Some(20),
    };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Nice, nice);
    let launcher = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => return refuse(SetupError::os("the launcher's own path", e)),
    };
    let (status_read, status_write) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return refuse(SetupError::os("a pipe", e)),
    };
    // The program's stdin goes in as a descriptor without close-on-exec;
    // bwrap's own stdin is the status pipe (see `Status`).
    let stdin = match rustix::io::dup(std::io::stdin()) {
        Ok(fd) => fd,
        Err(e) => return refuse(SetupError::os("stdin", e.into())),
    };
    let held = match Held::new() {
        Ok(held) => held,
        Err(e) => return refuse(e),
    };
    let mut command = Command::new(BWRAP);
    command
        .args(bwrap_args(args, &launcher))
        .args(held.bwrap_args())
        .arg("--")
        .arg(&launcher)
        .arg("--inside")
        .arg(stdin.as_raw_fd().to_string());
    for path in hidden {
        command.arg("--cover").arg(path);
    }
    match inner {
        // This launcher's environment (a terminal's, which the daemon
        // starts with it) goes in as `--env` flags: the one inside clears
        // what bwrap hands it (bwrap adds `PWD`).
        Inner::Given(raw) => {
            for (name, value) in std::env::vars_os() {
                command.arg("--env").arg(name).arg(value);
            }
            command.args(raw)
        }
        Inner::OnStdin(flags) => command.arg("--args-on-stdin").args(flags),
    };
    command.stdin(Stdio::from(status_write));
    let child = command.spawn();
    drop(command);
    drop(stdin);
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return refuse(SetupError::Namespaces(format!("{BWRAP}: {e}"))),
    };
    let _bwrap_info = held.pass_on();
    // The status comes when the program has ended, before the world's
    // teardown (its mounts and namespaces, about a millisecond of the
    // kernel's time): this launcher ends at once; the world's init is
    // exiting already, taking its PID namespace along. bwrap's monitor
    // would wait for that teardown with the command's stdout and stderr
    // open, and the daemon answers at their end: it goes now.
    if let Some(status) = Status::read(status_read) {
        let _ = child.kill();
        return status.reproduce();
    }
    match child.wait() {
        // The inner launcher refused, and said why.
        Ok(exit) if exit.code() == Some(EXIT_SANDBOX.into()) => ExitCode::from(EXIT_SANDBOX),
        Ok(exit) => refuse(SetupError::Namespaces(format!(
            "bwrap could not set up the command's namespaces ({exit})"
        ))),
        Err(e) => refuse(SetupError::os("waiting for bwrap", e)),
    }
}

/// The signals sent to the command's process group before the world's
/// first process existed. The daemon may signal a command as soon as it
/// has said it started, which can be before bwrap has made the world (a
/// launcher started on demand, or taken from the pool right after it was
/// started); such a signal reaches this launcher and bwrap's monitor,
/// which hold it blocked, and nothing in the world. So bwrap tells this
/// launcher the world's first process once it exists (`--info-fd`)
/// and waits (`--block-fd`) while this launcher passes it what it holds.
/// That process has these signals blocked until the launcher inside takes
/// them, so one it also got directly is held once, not twice.
struct Held {
    signals: SignalFd,
    /// bwrap's `--info-fd`: this side, and bwrap's copy (inherited).
    info: std::io::PipeReader,
    info_for_bwrap: std::os::fd::OwnedFd,
    /// A reader of the info pipe that bwrap inherits too, so that its
    /// write of the world's first process never fails: were this launcher
    /// gone by then, bwrap would die of it with that process waiting for
    /// it forever. bwrap's monitor closes it once it waits for the world;
    /// the launcher inside closes what it inherited
    /// ([`crate::close_inherited`]).
    info_kept_by_bwrap: std::os::fd::OwnedFd,
    /// bwrap's `--block-fd`: this side, and bwrap's copy (inherited).
    go: std::io::PipeWriter,
    go_for_bwrap: std::os::fd::OwnedFd,
}

impl Held {
    fn new() -> Result<Self, SetupError> {
        let signals =
            SignalFd::with_flags(&relayed(), SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
                .map_err(|e| SetupError::os("a signalfd", e.into()))?;
        let pipe = || std::io::pipe().map_err(|e| SetupError::os("a pipe", e));
        let inherited = |fd: std::os::fd::BorrowedFd<'_>| {
            // `dup` leaves out close-on-exec: bwrap inherits the copy.
            rustix::io::dup(fd).map_err(|e| SetupError::os("a pipe", e.into()))
        };
        let (info, info_write) = pipe()?;
        let (go_read, go) = pipe()?;
        Ok(Self {
            signals,
            info_for_bwrap: inherited(info_write.as_fd())?,
            info_kept_by_bwrap: inherited(info.as_fd())?,
            go_for_bwrap: inherited(go_read.as_fd())?,
            info,
            go,
        })
    }

    fn bwrap_args(&self) -> [OsString; 4] {
        [
            "--info-fd".into(),
            self.info_for_bwrap.as_raw_fd().to_string().into(),
            "--block-fd".into(),
            self.go_for_bwrap.as_raw_fd().to_string().into(),
        ]
    }

    /// Once bwrap has started (and holds its copies): waits for the world's
    /// first process, passes it the signals held, and lets it go on. A
    /// bwrap that failed before making it says nothing; then nothing is
    /// passed. (bwrap's child waits for this unless its setup failed; a
    /// pid freed and taken again in that moment is not guarded against.)
    /// Returns the info pipe, which stays open while bwrap may write.
    fn pass_on(self) -> std::io::PipeReader {
        let Self {
            signals,
            mut info,
            info_for_bwrap,
            info_kept_by_bwrap,
            mut go,
            go_for_bwrap,
        } = self;
        drop((info_for_bwrap, info_kept_by_bwrap, go_for_bwrap));
        let first = child_pid(&mut info);
        if let Some(pid) = first
            .and_then(|pid| i32::try_from(pid).ok())
            .map(nix::unistd::Pid::from_raw)
        {
            while let Ok(Some(info)) = signals.read_signal() {
                if let Ok(signal) = Signal::try_from(info.ssi_signo as i32) {
                    let _ = nix::sys::signal::kill(pid, signal);
                }
            }
        }
        let _ = go.write_all(b"1");
        info
    }
}

/// The `child-pid` bwrap writes to its `--info-fd` (`{"child-pid": N, …`),
/// read as it comes until the number is whole; `None` if the pipe ends
/// first. What follows the number is read too and not needed.
fn child_pid(info: &mut std::io::PipeReader) -> Option<u32> {
    const KEY: &[u8] = b"\"child-pid\"";
    let mut text = [0u8; 4096];
    let mut len = 0;
    while len < text.len() {
        match info.read(&mut text[len..]) {
            Ok(0) => return None,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
        let said = &text[..len];
        let Some(at) = said.windows(KEY.len()).position(|w| w == KEY) else {
            continue;
        };
        let value = &said[at + KEY.len()..];
        let value = &value[value.iter().take_while(|b| b" :\n\t".contains(b)).count()..];
        let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
        // The number is whole once something follows it.
        if digits > 0 && digits < value.len() {
            return std::str::from_utf8(&value[..digits]).ok()?.parse().ok();
        }
    }
    None
}

/// How the program ended, from the inner launcher (its parent) to the
/// outer one: `exit N` or `signal N`. The inner launcher's stdin is the
/// pipe's write end when bwrap starts it; it reopens that end (close on
/// exec) and puts the program's stdin in its place, so the program never
/// holds the pipe.
pub(crate) enum Status {
    Exited(u8),
    Signaled(i32),
}

impl Status {
    /// The first line on the pipe (the inner launcher writes one, whole,
    /// with a single `write`), or `None` at the end of the pipe without one.
    fn read(mut pipe: std::io::PipeReader) -> Option<Self> {
        let mut line = [0u8; 64];
        let mut len = 0;
        while len < line.len() && !line[..len].contains(&b'\n') {
            match pipe.read(&mut line[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        let text = std::str::from_utf8(&line[..len]).ok()?;
        let (kind, n) = text.lines().next()?.trim().split_once(' ')?;
        match kind {
            "exit" => n.parse().ok().map(Self::Exited),
            "signal" => n.parse().ok().map(Self::Signaled),
            _ => None,
        }
    }

    /// The inner launcher's side: opens the status pipe (its stdin when
    /// bwrap started it) and puts `stdin_fd`, the program's stdin, on fd 0.
    pub(crate) fn open(stdin_fd: &str) -> Result<std::fs::File, SetupError> {
        let status = std::fs::OpenOptions::new()
            .write(true)
            .open("/proc/self/fd/0")
            .map_err(|e| SetupError::os("the status pipe", e))?;
        let fd: u32 = stdin_fd
            .parse()
            .map_err(|_| SetupError::Usage(format!("--inside {stdin_fd}: not a descriptor")))?;
        let stdin = std::fs::File::open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| SetupError::os("the program's stdin", e))?;
        rustix::stdio::dup2_stdin(&stdin).map_err(|e| SetupError::os("stdin", e.into()))?;
        Ok(status)
    }

    /// The inner launcher's side: runs the program as its child and
    /// reports how it ended. The relayed signals stay blocked until then,
    /// with `handlers` in place that do nothing: the program's mask is
    /// this process's (std does not clear it) and must be empty, while this
    /// process must outlive the signals meant for the program. Handlers
    /// do not survive exec; the program starts with the defaults.
    ///
    /// A signal that came before the program existed (the daemon may
    /// signal a process as soon as it has said it started, while this
    /// launcher still waited for its arguments or its release) was held
    /// pending here; it is passed on to the program once it runs, so it is
    /// not lost. The flags are read only once `spawn` has returned, so
    /// none that reached this launcher falls between a look and the fork;
    /// one that comes while the program is being started may reach it
    /// twice (directly, once forked, and passed on).
    pub(crate) fn run(
        mut status: std::fs::File,
        handlers: Handlers,
        mut program: Command,
    ) -> ExitCode {
        use std::sync::atomic::Ordering;
        let Handlers {
            mut children,
            arrived,
        } = handlers;
        if let Err(e) = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&relayed()), None) {
            return refuse(SetupError::os("unblocking signals", e.into()));
        }
        // Once `spawn` returns the program has exec'd, and signals to the
        // process group reach it directly; those that came before (the
        // flags are read only now, so none falls between a look and the
        // fork) are its to have too.
        let waited = program.spawn().and_then(|child| {
            drop(program);
            if let Some(pid) = i32::try_from(child.id())
                .ok()
                .map(nix::unistd::Pid::from_raw)
            {
                for (signal, flag) in &arrived {
                    if flag.swap(false, Ordering::AcqRel) {
                        let _ = nix::sys::signal::kill(pid, *signal);
                    }
                }
            }
            let_go_of_outputs();
            reap_until(child.id(), &mut children, &status)
        });
        let line = match waited {
            Ok(exit) => match (exit.exit_status(), exit.terminating_signal()) {
                (Some(code), _) => format!("exit {code}\n"),
                (None, Some(signal)) => format!("signal {signal}\n"),
                (None, None) => "exit 255\n".to_string(),
            },
            Err(e) => {
                eprintln!("portcullis sandbox: {e}");
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                format!("exit {code}\n")
            }
        };
        let _ = status.write_all(line.as_bytes());
        ExitCode::SUCCESS
    }

    /// Whether the outer launcher, the status pipe's one reader, is gone
    /// (the write end then polls as an error): asked first thing, so that
    /// a world whose launcher died while bwrap made it runs nothing.
    pub(crate) fn reader_gone(status: &std::fs::File) -> bool {
        use rustix::event::{PollFd, PollFlags, poll};
        let mut fds = [PollFd::new(status, PollFlags::OUT)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&zero)) {
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL),
            Err(_) => true,
        }
    }

    /// Ends this process the way the program ended.
    fn reproduce(self) -> ExitCode {
        match self {
            Self::Exited(code) => ExitCode::from(code),
            Self::Signaled(number) => {
                let Ok(signal) = Signal::try_from(number) else {
                    return ExitCode::from(255);
                };
                // Never a core dump of the launcher, outside the sandbox.
                let none = rustix::process::Rlimit {
                    current: Some(0),
                    maximum: Some(0),
                };
                let _ = rustix::process::setrlimit(rustix::process::Resource::Core, none);
                // It may be blocked: raised, then let through. Raised
                // again for SIGSEGV and SIGBUS, whose first the Rust
                // runtime's stack-overflow handler takes (and then restores
                // the default).
                let _ = nix::sys::signal::raise(signal);
                let mut just = SigSet::empty();
                just.add(signal);
                let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&just), None);
                let _ = nix::sys::signal::raise(signal);
                // A signal whose default is to be ignored cannot have
                // ended the program; should one come here, say so.
                ExitCode::from(128 + number as u8)
            }
        }
    }
}

/// The launcher inside's signal handlers, installed before it waits for
/// its command, so that their cost is not on the request's path; the
/// signals they catch stay blocked until the program starts
/// ([`Status::run`]).
pub(crate) struct Handlers {
    /// Every child's end, as a byte on a pipe this launcher polls beside
    /// the status pipe ([`reap_until`]).
    children: std::io::PipeReader,
    /// Which relayed signals came (blocked until the program runs).
    arrived: Vec<(Signal, std::sync::Arc<std::sync::atomic::AtomicBool>)>,
}

impl Handlers {
    pub(crate) fn install() -> Result<Self, SetupError> {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        // Handlers do not survive exec: the program starts with SIGCHLD's
        // default.
        let children = std::io::pipe()
            .and_then(|(ended, wake)| {
                signal_hook::low_level::pipe::register(libc::SIGCHLD, wake)?;
                Ok(ended)
            })
            .map_err(|e| SetupError::os("a SIGCHLD handler", e))?;
        let mut arrived = Vec::with_capacity(RELAYED.len());
        for signal in RELAYED {
            let flag = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(signal as i32, flag.clone())
                .map_err(|e| SetupError::os("a signal handler", e))?;
            arrived.push((signal, flag));
        }
        Ok(Self { children, arrived })
    }
}

/// Puts /dev/null on this launcher's stdout and stderr once the program
/// holds its own copies: the daemon answers at their end, and this
/// process, the world's init, closes what it holds only after its exit
/// has torn the world's mount namespace down (an RCU grace period). What
/// this launcher says after that (an error while it waits) is lost; a
/// failure here only leaves the end where it was.
fn let_go_of_outputs() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

/// Waits for the program (`pid`) to end, reaping whatever else ends
/// meanwhile: this launcher is the world's init (`--as-pid-1`), so every
/// process orphaned in the world becomes its child, and one left a zombie
/// would keep its pid (counted against the grant's process limits). Each
/// child's end is a byte on `children` (SIGCHLD's pipe), emptied before
/// the children are reaped, so none that ends meanwhile is missed.
fn reap_until(
    pid: u32,
    children: &mut std::io::PipeReader,
    status: &std::fs::File,
) -> std::io::Result<rustix::process::WaitStatus> {
    use rustix::process::{WaitOptions, wait};
    let program = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("the program has no pid"))?;
    loop {
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) if pid == program => return Ok(status),
                Ok(Some(_)) | Err(rustix::io::Errno::INTR) => continue,
                Ok(None) => break,
                Err(e) => return Err(e.into()),
            }
        }
        readable(children.as_fd(), status)?;
        // Readable: this read does not block.
        let _ = children.read(&mut [0u8; 64]);
    }
}

/// Waits until `fd` is readable (or at its end), as a launcher inside a
/// world waits for anything once it is confined: should the outer
/// launcher — the status pipe's one reader — go first (the daemon died,
/// or the launcher was killed on its own), this process ends at once, and
/// with it, the world's init, every process in the world. A pipe's write
/// end polls as an error once its last reader is closed, and only then.
/// (A thread of its own watched the pipe before: one more task per world,
/// counted against the grant's process limits.)
pub(crate) fn readable(
    fd: std::os::fd::BorrowedFd<'_>,
    status: &std::fs::File,
) -> std::io::Result<()> {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(status, PollFlags::empty()),
        ];
        match poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) if !fds[1].revents().is_empty() => std::process::exit(EXIT_SANDBOX.into()),
            Ok(_) if !fds[0].revents().is_empty() => return Ok(()),
            Ok(_) => continue,
        }
    }
}

/// Whether bwrap can make a world on this host (tried once, by the probe).
pub(crate) fn probe() -> Result<(), SetupError> {
    if !Path::new(BWRAP).is_file() {
        return Err(SetupError::Namespaces(format!(
            "{BWRAP} is missing (install Debian's `bubblewrap` package)"
        )));
    }
    let args = SandboxArgs {
        deny_network: true,
        ..SandboxArgs::default()
    };
    let out = Command::new(BWRAP)
        .args(bwrap_args(&args, Path::new("/usr/bin/true")))
        .args(["--", "/usr/bin/true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SetupError::Namespaces(format!("{BWRAP}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said = said.lines().next().unwrap_or("no message").trim();
    Err(SetupError::Namespaces(format!(
        "bwrap cannot make namespaces here: {said}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outermost_roots_beneath_tmp_are_bound_back() {
        let roots: Vec<PathBuf> = [
            "/tmp/a",
            "/tmp/a/b",
            "/tmp",
            "/srv/x",
            "/tmpfiles/y",
            "/dev/shm/s",
            "/tmp/c",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let (tmp, shm) = (Path::new("/tmp"), Path::new("/dev/shm"));
        let beneath = roots_beneath(&[tmp, shm], roots.iter());
        assert_eq!(beneath, [&roots[5], &roots[0], &roots[6]]);
        let twice = [
            PathBuf::from("/tmp/c"),
            PathBuf::from("/tmp/d"),
            PathBuf::from("/tmp/c"),
        ];
        assert_eq!(roots_beneath(&[tmp], twice.iter()), [&twice[0], &twice[1]]);
        assert!(roots_beneath(&[shm], roots[..5].iter()).is_empty());
    }

    #[test]
    fn any_capability_in_any_set_is_found() {
        let status = |bnd: &str, amb: Option<&str>| {
            let mut text = format!(
                "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                 CapEff:\t0000000000000000\nCapBnd:\t{bnd}\n"
            );
            if let Some(amb) = amb {
                text.push_str(&format!("CapAmb:\t{amb}\nNoNewPrivs:\t1\n"));
            }
            text
        };
        assert_eq!(
            capabilities_left(&status("0000000000000000", Some("0000000000000000"))),
            None
        );
        assert_eq!(
            capabilities_left(&status("0000000000200000", Some("0000000000000000"))).as_deref(),
            Some("CapBnd: 0000000000200000")
        );
        assert_eq!(
            capabilities_left(&status("0000000000000000", Some("0000000000000100"))).as_deref(),
            Some("CapAmb: 0000000000000100")
        );
        // A kernel that says nothing of a set is not taken as saying none.
        assert_eq!(
            capabilities_left(&status("0000000000000000", None)).as_deref(),
            Some("no CapAmb: line")
        );
        assert!(capabilities_left(&status("", Some("0000000000000000"))).is_some());
    }

    #[test]
    fn a_status_pipe_without_its_reader_says_the_gateway_is_gone() {
        let (reader, writer) = std::io::pipe().unwrap();
        let writer = std::fs::File::from(std::os::fd::OwnedFd::from(writer));
        assert!(!Status::reader_gone(&writer));
        drop(reader);
        assert!(Status::reader_gone(&writer));
    }

    /// The outer launcher ends as soon as the status line is there, while
    /// bwrap (which holds the pipe's write end as its stdin) still lives.
    #[test]
    fn the_status_is_read_at_its_line_while_the_pipe_stays_open() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"signal 15\n").unwrap();
        let (sent, read) = std::sync::mpsc::channel();
        std::thread::spawn(move || sent.send(Status::read(reader)));
        let status = read
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the read waited for the end of the pipe");
        assert!(matches!(status, Some(Status::Signaled(15))));
        drop(writer);
    }

    #[test]
    fn the_world_s_first_process_is_read_from_bwrap_s_info() {
        let said = |text: &[u8], close: bool| {
            let (mut reader, mut writer) = std::io::pipe().unwrap();
            writer.write_all(text).unwrap();
            // Open or not, a number followed by something is whole.
            let _kept = (!close).then_some(writer);
            child_pid(&mut reader)
        };
        let info = b"{\n    \"child-pid\": 4711,\n    \"cgroup-namespace\": 4026531835";
        assert_eq!(said(info, false), Some(4711));
        assert_eq!(said(b"{\"child-pid\": 7}\n", false), Some(7));
        assert_eq!(said(b"{\"child-pid\": 7", true), None);
        assert_eq!(said(b"{\"exit-code\": 1}\n", true), None);
        assert_eq!(said(b"", true), None);
        // A number split between two writes is read whole.
        let (mut reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"{\"child-pid\": 47").unwrap();
        let rest = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            writer.write_all(b"11,\n").unwrap();
            writer
        });
        assert_eq!(child_pid(&mut reader), Some(4711));
        drop(rest.join().unwrap());
    }

    #[test]
    fn a_pipe_closed_without_a_status_line_says_none() {
        for said in [&b""[..], b"exit", b"exit x\n", b"stopped 3\n"] {
            let (reader, mut writer) = std::io::pipe().unwrap();
            writer.write_all(said).unwrap();
            drop(writer);
            assert!(Status::read(reader).is_none(), "{said:?}");
        }
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"exit 7\n").unwrap();
        drop(writer);
        assert!(matches!(Status::read(reader), Some(Status::Exited(7))));
    }

    #[test]
    fn the_daemon_s_configuration_and_unreadable_etc_entries_are_hidden() {
        let hidden = hidden_in_etc().unwrap();
        if Path::new("/etc/portcullis").exists() {
            assert!(hidden.contains(&PathBuf::from("/etc/portcullis")));
        }
        // Debian's /etc/shadow is 0640 root:shadow: covered where this
        // user could read it (root, as the tests run).
        if Path::new("/etc/shadow").exists()
            && rustix::fs::access("/etc/shadow", Access::READ_OK).is_ok()
        {
            assert!(hidden.contains(&PathBuf::from("/etc/shadow")), "{hidden:?}");
        }
        assert!(!hidden.contains(&PathBuf::from("/etc/passwd")));
    }

    #[test]
    fn roots_come_after_the_private_tmp() {
        let args = SandboxArgs {
            rw: vec![PathBuf::from("/tmp/work")],
            ..SandboxArgs::default()
        };
        let argv = bwrap_args(&args, Path::new("/usr/lib/portcullis/portcullis-sandbox"));
        let at = |s: &str| argv.iter().position(|a| a == s).unwrap();
        assert!(at("/tmp") < at("/tmp/work"));
        assert!(!argv.iter().any(|a| a == "--unshare-net"));
        assert!(
            !argv
                .iter()
                .any(|a| a == "/usr/lib/portcullis/portcullis-sandbox")
        );
    }
}

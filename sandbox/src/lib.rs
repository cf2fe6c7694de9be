//! The child's side of a command: the `portcullis-sandbox` launcher, which
//! the daemon starts in place of the program. It builds the command's
//! world ([`world`]: namespaces of its own, made by bubblewrap), and a
//! second launcher inside it confines itself and runs the program, so
//! everything below applies to the program and to all it starts. (Doing
//! this between fork and exec in the daemon would need `pre_exec`, which
//! is `unsafe`.) The launcher is a small binary of its own: starting the
//! daemon's 90 MB binary for it cost 1.7 ms more.
//!
//! Usage: `portcullis-sandbox [--nice N] [--cgroup DIR]… [--rw DIR]… [--ro DIR]…
//! [--deny-network | --egress DIR] [--tty | --await-release [--stdin-null]] [--limit NAME=N]…
//! [--tmp-size BYTES] [--skip MECHANISM]… [--env NAME VALUE]… [--cwd ROOT PATH
//! [--cwd-follow-symlinks]] -- PROGRAM [ARG…]`; or
//! `portcullis-sandbox --args-on-stdin [--world] [--deny-network | --egress
//! DIR] [--rw DIR]… [--ro DIR]… [--tmp-size BYTES] [--skip MECHANISM]…`,
//! which makes its session (with `--world`, the command's world too, and
//! inside it all of the confinement that depends on the world alone) and
//! then reads those arguments from stdin ([`encode_args`]) — how the
//! daemon starts launchers ahead of need (`pool.rs`); or
//! `portcullis-sandbox --probe`, which reports which mechanisms this host
//! has (one `NAME=ok` or `NAME=REASON` line each); the daemon asks once. `--inside FD …` is the launcher bwrap starts inside a
//! world, never the daemon.
//!
//! In order: a parent-death signal (the launcher, its world and the
//! command die with the daemon, see [`die_with_the_daemon`]); with
//! `--cgroup` the command's control groups joined (so all it starts counts
//! against their limits); with `--nice` the daemon's CPU priority back (a launcher
//! started ahead of need waits at the lowest, see `pool.rs`); a session
//! and process group of its own (so the daemon can end the whole group),
//! with `--tty` its stdin as controlling terminal; the world. Inside it
//! ([`confine_world`], which depends on the world alone and so runs before
//! a launcher started ahead of need has its command):
//! the world's own `/tmp` and `/dev/shm` mounted, bounded (`--tmp-size`,
//! see [`world::mount_inside`]) and what of `/etc` is hidden covered; the
//! two capabilities bwrap left the launcher for that dropped; then ([`Prepared`], [`restrict`])
//! `no_new_privs` (no setuid gains) and a
//! seccomp filter ([`filters::priority`]) that keeps the program from
//! changing other processes' priority or limits; a
//! Landlock ruleset: read and execute the system's program paths, read the
//! granted `ro` roots, read and write the `rw` roots and, in its own world,
//! that world's `/tmp` and `/dev/shm` ([`WORLD_WRITE`]), and (where the
//! kernel has it) signal nothing outside the sandbox; with `--deny-network` no
//! network (see [`network_rules`]): Landlock's TCP rules and its
//! abstract-socket scope, in the same ruleset, and a seccomp filter
//! ([`filters::network`]) that refuses sockets of every family but
//! `AF_UNIX`; with `--egress DIR` (an allow-list) a network namespace of
//! its own too, whose one way out is the daemon's proxy (see [`egress`]);
//! the filter of calls no command needs ([`filters::hardening`]); last,
//! with the command's arguments ([`settle`]), with `--cwd` the working
//! directory, opened beneath its root as `file.*` requests open paths, and
//! the grant's rlimits, no core dumps and no raising of its CPU priority.
//! If the host cannot enforce that (namespaces;
//! Landlock ABI 3, and 6 for the network; seccomp, which is never skipped)
//! the launcher refuses to run the program — unless the daemon passed
//! `--skip` for that mechanism, which it does only for a grant with
//! `sandbox = "best_effort"` on a host whose probe said the mechanism is
//! missing (and then records a warning in the audit entry). Without
//! namespaces the launcher confines itself in place ([`restrict`], then
//! [`settle`]) and execs the program.
//!
//! With `--await-release`, the last step before the program runs is to read
//! one byte from stdin: the daemon sends [`RELEASE`] once the request's
//! start entry is durable, so the sandbox is set up while the entry is
//! written but the program never runs unaudited (end of input instead: the
//! launcher exits). `--stdin-null` then gives the program /dev/null as its
//! stdin.
//!
//! Architecture invariant: this crate never depends on the daemon, the
//! wire or the policy; the daemon uses its library for the launcher's
//! arguments ([`encode_args`], [`RELEASE`], [`Mechanism`], [`Limit`]).

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod egress;
mod filters;
mod world;

pub use egress::{EGRESS_BRIDGE_TASKS, EGRESS_PROXY, EGRESS_SOCKET};

pub use world::hidden_in_etc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use portcullis_confine::{Root, RootSpec};

/// Exit status when the sandbox could not be set up (the program never
/// ran); 126/127 follow the shells' "cannot execute" / "not found".
pub const EXIT_SANDBOX: u8 = 125;

/// The byte that lets a launcher waiting with `--await-release` exec.
pub const RELEASE: &[u8] = b"g";

/// Paths every program needs to read (and execute from).
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc", "/sys", "/dev",
    "/run",
];
/// Device files programs write to.
const SYSTEM_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/tty", "/dev/full"];
/// Directories a command in its own world may write: the world's own
/// tmpfs mounts, empty when it starts and gone when it ends. Never granted
/// to a command without a world, where they are the host's.
const WORLD_WRITE: &[&str] = &["/tmp", "/dev/shm"];
/// The newest Landlock ABI whose filesystem rights are asked for (where
/// the kernel has them; see [`landlock()`]).
const NEWEST: ABI = ABI::V5;

/// `--cwd`: a directory beneath a root, opened the way the daemon opens a
/// request's paths.
#[derive(Debug)]
struct WorkingDir {
    host_root: PathBuf,
    path: String,
    follow_symlinks: bool,
}

#[derive(Debug, Default)]
pub struct SandboxArgs {
    /// The nice value to run the program at.
    nice: Option<i32>,
    /// Directories the program may read and write.
    rw: Vec<PathBuf>,
    /// Directories the program may read.
    ro: Vec<PathBuf>,
    /// No network: see [`network_rules`].
    deny_network: bool,
    /// The network through the daemon's egress proxy only (`--egress
    /// DIR`): see [`egress`].
    egress: Option<PathBuf>,
    /// Control groups to join first (`--cgroup DIR`): see [`join_cgroups`].
    cgroups: Vec<PathBuf>,
    /// Make stdin (a terminal) the controlling terminal.
    tty: bool,
    /// Exec only after reading [`RELEASE`] from stdin.
    await_release: bool,
    /// After the release, stdin is /dev/null.
    stdin_null: bool,
    /// rlimits to set: (resource, value).
    limits: Vec<(Limit, u64)>,
    /// Mechanisms not to apply (the host lacks them; best-effort grant).
    skip: Vec<Mechanism>,
    /// Added to the launcher's environment, which the daemon starts empty.
    env: Vec<(OsString, OsString)>,
    /// The working directory (otherwise the launcher's own).
    cwd: Option<WorkingDir>,
    /// Bytes each of the world's own `/tmp` and `/dev/shm` may hold
    /// (`--tmp-size`; otherwise [`world::DEFAULT_TMP_SIZE`]).
    tmp_size: Option<u64>,
    /// What of `/etc` the command's world covers (`--hide`), when the
    /// daemon looked (`--etc-looked`); otherwise the launcher looks.
    hidden: Option<Vec<PathBuf>>,
    /// The program (an absolute path) and its arguments.
    command: Vec<OsString>,
}

impl SandboxArgs {
    /// The launcher's arguments, as the daemon writes them.
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Self, SetupError> {
        let usage = |m: &str| SetupError::Usage(m.to_string());
        let mut parsed = Self::default();
        while let Some(arg) = args.next() {
            match arg.to_str() {
                Some("--rw") => parsed
                    .rw
                    .push(args.next().ok_or_else(|| usage("--rw needs a DIR"))?.into()),
                Some("--ro") => parsed
                    .ro
                    .push(args.next().ok_or_else(|| usage("--ro needs a DIR"))?.into()),
                Some("--nice") => {
                    let arg = args.next().ok_or_else(|| usage("--nice needs N"))?;
                    let nice = arg.to_str().and_then(|n| n.parse().ok());
                    parsed.nice = Some(nice.ok_or_else(|| usage("--nice needs N, a nice value"))?);
                }
                Some("--deny-network") => parsed.deny_network = true,
                Some("--egress") => {
                    let dir = args.next().ok_or_else(|| usage("--egress needs a DIR"))?;
                    parsed.egress = Some(dir.into());
                }
                Some("--cgroup") => {
                    let dir = args.next().ok_or_else(|| usage("--cgroup needs a DIR"))?;
                    parsed.cgroups.push(dir.into());
                }
                Some("--etc-looked") => {
                    parsed.hidden.get_or_insert_with(Vec::new);
                }
                Some("--hide") => {
                    let path = args.next().ok_or_else(|| usage("--hide needs a PATH"))?;
                    parsed.hidden.get_or_insert_with(Vec::new).push(path.into());
                }
                Some("--tty") => parsed.tty = true,
                Some("--await-release") => parsed.await_release = true,
                Some("--stdin-null") => parsed.stdin_null = true,
                Some("--limit") => {
                    let arg = args.next().ok_or_else(|| usage("--limit needs NAME=N"))?;
                    parsed.limits.push(Limit::parse(&arg.to_string_lossy())?);
                }
                Some("--tmp-size") => parsed.tmp_size = Some(tmp_size(args.next())?),
                Some("--env") => {
                    let name = args.next().ok_or_else(|| usage("--env needs NAME VALUE"))?;
                    let value = args.next().ok_or_else(|| usage("--env needs NAME VALUE"))?;
                    parsed.env.push((name, value));
                }
                Some("--cwd") => {
                    let host_root = args
                        .next()
                        .ok_or_else(|| usage("--cwd needs ROOT PATH"))?
                        .into();
                    let path = args.next().ok_or_else(|| usage("--cwd needs ROOT PATH"))?;
                    let path = path
                        .into_string()
                        .map_err(|_| usage("--cwd: PATH is not UTF-8"))?;
                    parsed.cwd = Some(WorkingDir {
                        host_root,
                        path,
                        follow_symlinks: false,
                    });
                }
                Some("--cwd-follow-symlinks") => match parsed.cwd.as_mut() {
                    Some(cwd) => cwd.follow_symlinks = true,
                    None => return Err(usage("--cwd-follow-symlinks needs a --cwd before it")),
                },
                Some("--skip") => parsed.skip.push(skipped(args.next())?),
                Some("--") => {
                    parsed.command = args.collect();
                    return match parsed.command.is_empty() {
                        true => Err(usage("no program after --")),
                        false => Ok(parsed),
                    };
                }
                _ => {
                    let arg = arg.to_string_lossy();
                    return Err(usage(&format!("unexpected argument {arg}")));
                }
            }
        }
        Err(usage(
            "usage: portcullis-sandbox [--nice N] [--cgroup DIR]... [--rw DIR]... [--ro DIR]... [--deny-network | --egress DIR] [--tty | --await-release [--stdin-null]] [--limit NAME=N]... [--tmp-size BYTES] [--skip MECHANISM]... [--env NAME VALUE]... [--cwd ROOT PATH [--cwd-follow-symlinks]] -- PROGRAM [ARG...]",
        ))
    }
}

/// `--tmp-size`'s value: bytes, more than 0 (a tmpfs of size 0 has none).
fn tmp_size(arg: Option<OsString>) -> Result<u64, SetupError> {
    let bytes = arg.as_ref().and_then(|n| n.to_str()?.parse().ok());
    bytes
        .filter(|&n| n > 0)
        .ok_or_else(|| SetupError::Usage("--tmp-size needs BYTES, more than 0".into()))
}

/// `--skip`'s value: a mechanism's name.
fn skipped(arg: Option<OsString>) -> Result<Mechanism, SetupError> {
    let usage = |m: String| SetupError::Usage(m);
    let name = arg.ok_or_else(|| usage("--skip needs a MECHANISM".into()))?;
    let name = name.to_string_lossy();
    Mechanism::ALL
        .into_iter()
        .find(|m| m.name() == name)
        .ok_or_else(|| {
            usage(format!(
                "--skip {name}: expected landlock, network or namespaces"
            ))
        })
}

/// The launcher's `main`.
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("--probe") => {
            for mechanism in Mechanism::ALL {
                match mechanism.probe() {
                    Ok(()) => println!("{}=ok", mechanism.name()),
                    Err(reason) => println!("{}={reason}", mechanism.name()),
                }
            }
            ExitCode::SUCCESS
        }
        Some("--args-on-stdin") => {
            match die_with_the_daemon().and_then(|()| close_inherited(None)) {
                Ok(()) => waiting(&args[1..]),
                Err(e) => refuse(e),
            }
        }
        Some("--inside") => match args.get(1).and_then(|fd| fd.to_str()) {
            Some(stdin_fd) => inside(stdin_fd, &args[2..]),
            None => refuse(SetupError::Usage("--inside needs FD".into())),
        },
        _ => match SandboxArgs::parse(args.iter().cloned()).and_then(|parsed| {
            die_with_the_daemon()?;
            close_inherited(None)?;
            Ok(parsed)
        }) {
            Ok(parsed) => match Prepared::new(false) {
                Ok(prepared) => run(parsed, &args, prepared, false),
                Err(e) => refuse(e),
            },
            Err(e) => refuse(e),
        },
    }
}

/// Closes every descriptor this launcher inherited beyond stdin, stdout,
/// stderr and `keep` (the status pipe, inside a world), so that nothing
/// else reaches the program: bwrap passes whatever it had on into the
/// world (its copy of the info pipe's kept reader, the program's stdin
/// before it is put on fd 0), and a daemon passes on whatever its own
/// parent leaked to it. Called first thing, while this process owns
/// nothing else. (`nix::unistd::close` takes a raw descriptor; what is
/// closed here, nothing in this process holds.)
fn close_inherited(keep: Option<&std::fs::File>) -> Result<(), SetupError> {
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| SetupError::os("/proc/self/fd", e))?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    // The listing's own descriptor is among them, closed by now.
    for fd in open {
        if fd > 2 && Some(fd) != keep.map(std::os::fd::AsRawFd::as_raw_fd) {
            let _ = nix::unistd::close(fd);
        }
    }
    Ok(())
}

/// A launcher (the daemon's child) is killed when the daemon dies, even by
/// SIGKILL: its world dies with it (the launcher inside watches for that,
/// see `world.rs`), and so does the command, which must not run on
/// unaudited. The signal comes
/// when the *thread* that started the launcher ends, so the daemon starts
/// launchers only from threads that live as long as it does (`pool.rs`).
/// A daemon already gone (this process was adopted) is the same.
fn die_with_the_daemon() -> Result<(), SetupError> {
    let parent = rustix::process::getppid();
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| SetupError::os("the parent-death signal", e.into()))?;
    if rustix::process::getppid() != parent || parent.is_none_or(|p| p.is_init()) {
        return Err(SetupError::GatewayGone);
    }
    Ok(())
}

/// `--args-on-stdin [--world] [--deny-network] [--rw DIR]… [--ro DIR]…`:
/// the steps that do not depend on the request, then the arguments from
/// stdin — how the daemon starts launchers ahead of need (`pool.rs`).
/// With `--world` those steps include the command's world ([`world`]),
/// whose roots and network are known ahead (the daemon keeps launchers of
/// each apart): the launcher inside it reads the arguments. Without, the
/// launcher applies the network's seccomp filter ahead for
/// `--deny-network`, and runs the command without namespaces.
fn waiting(flags: &[OsString]) -> ExitCode {
    let layout = match Layout::parse(flags) {
        Ok(layout) => layout,
        Err(e) => return refuse(e),
    };
    if let Err(e) = join_cgroups(&layout.cgroups) {
        return refuse(e);
    }
    if let Err(e) = rustix::process::setsid() {
        return refuse(SetupError::os("setsid", e.into()));
    }
    if layout.world {
        let args = layout.args();
        return match args.hidden() {
            Ok(hidden) => world::enter(&args, world::Inner::OnStdin(flags), &hidden),
            Err(e) => refuse(e),
        };
    }
    let prepared = match Prepared::new(layout.deny_network) {
        Ok(prepared) => prepared,
        Err(e) => return refuse(e),
    };
    match read_args(None) {
        // The daemon exited (or dropped it) before it was needed.
        Ok(None) => ExitCode::from(EXIT_SANDBOX),
        Ok(Some(raw)) => match SandboxArgs::parse(raw.iter().cloned()) {
            Ok(args) => run(args, &raw, prepared, true),
            Err(e) => refuse(e),
        },
        Err(e) => refuse(e),
    }
}

/// What a launcher started ahead of need knows of its command: the flags
/// after `--args-on-stdin`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Layout {
    world: bool,
    deny_network: bool,
    egress: Option<PathBuf>,
    cgroups: Vec<PathBuf>,
    rw: Vec<PathBuf>,
    ro: Vec<PathBuf>,
    /// `--etc-looked` and `--hide`, as for a command.
    hidden: Option<Vec<PathBuf>>,
    /// `--tmp-size` and `--skip`, as for a command: the world's own
    /// `/tmp` and the confinement its launcher applies before it has the
    /// command ([`confine_world`]).
    tmp_size: Option<u64>,
    skip: Vec<Mechanism>,
}

impl Layout {
    fn parse(flags: &[OsString]) -> Result<Self, SetupError> {
        let usage = || {
            SetupError::Usage(
                "usage: portcullis-sandbox --args-on-stdin [--world] [--deny-network | --egress DIR] [--cgroup DIR]... \
                 [--rw DIR]... [--ro DIR]... [--etc-looked [--hide PATH]...] [--tmp-size BYTES] [--skip MECHANISM]..."
                    .into(),
            )
        };
        let mut layout = Self::default();
        let mut flags = flags.iter();
        while let Some(flag) = flags.next() {
            match flag.to_str() {
                Some("--world") => layout.world = true,
                Some("--deny-network") => layout.deny_network = true,
                Some("--egress") => layout.egress = Some(flags.next().ok_or_else(usage)?.into()),
                Some("--cgroup") => layout.cgroups.push(flags.next().ok_or_else(usage)?.into()),
                Some("--rw") => layout.rw.push(flags.next().ok_or_else(usage)?.into()),
                Some("--ro") => layout.ro.push(flags.next().ok_or_else(usage)?.into()),
                Some("--etc-looked") => {
                    layout.hidden.get_or_insert_with(Vec::new);
                }
                Some("--hide") => {
                    let path = flags.next().ok_or_else(usage)?.into();
                    layout.hidden.get_or_insert_with(Vec::new).push(path);
                }
                Some("--tmp-size") => layout.tmp_size = Some(tmp_size(flags.next().cloned())?),
                Some("--skip") => layout.skip.push(skipped(flags.next().cloned())?),
                _ => return Err(usage()),
            }
        }
        Ok(layout)
    }

    /// The world part of a command's arguments.
    fn args(&self) -> SandboxArgs {
        SandboxArgs {
            deny_network: self.deny_network,
            egress: self.egress.clone(),
            rw: self.rw.clone(),
            ro: self.ro.clone(),
            hidden: self.hidden.clone(),
            tmp_size: self.tmp_size,
            skip: self.skip.clone(),
            ..SandboxArgs::default()
        }
    }

    /// Whether `args` ask for this world, confined as it is: never run a
    /// command in one made for another grant.
    fn fits(&self, args: &SandboxArgs) -> bool {
        let same_skip = |a: &[Mechanism], b: &[Mechanism]| {
            a.iter().all(|m| b.contains(m)) && b.iter().all(|m| a.contains(m))
        };
        self.deny_network == args.deny_network
            && self.egress == args.egress
            && self.rw == args.rw
            && self.ro == args.ro
            && self.tmp_size == args.tmp_size
            && same_skip(&self.skip, &args.skip)
    }
}

/// Why the sandbox could not be set up; the program never ran.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// Arguments the launcher does not understand.
    #[error("{0}")]
    Usage(String),
    #[error("{step}: {source}")]
    Os {
        step: &'static str,
        source: std::io::Error,
    },
    #[error("the working directory: {0}")]
    WorkingDir(String),
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("Landlock is not enforced on this kernel")]
    LandlockNotEnforced,
    #[error("seccomp: {0}")]
    SeccompFilter(#[from] seccompiler::BackendError),
    #[error("seccomp: {0}")]
    Seccomp(#[from] seccompiler::Error),
    /// bwrap could not make the command's world (the message says so).
    #[error("{0}")]
    Namespaces(String),
    #[error("a launcher without network was given a command that may use it")]
    NetworkMismatch,
    #[error("joining the control group {}: {source}", dir.display())]
    Cgroup {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("the egress proxy's port inside the command's world: {0}")]
    EgressPort(std::io::Error),
    #[error("the gateway did not release the command")]
    NotReleased,
    /// The daemon died before this launcher could be tied to it: nothing runs.
    #[error("the gateway that started this launcher is gone")]
    GatewayGone,
    #[error("arguments: {0}")]
    Arguments(&'static str),
}

impl SetupError {
    fn os(step: &'static str, source: std::io::Error) -> Self {
        Self::Os { step, source }
    }
}

fn refuse(what: impl std::fmt::Display) -> ExitCode {
    eprintln!("portcullis sandbox: {what}; the command was not run");
    ExitCode::from(EXIT_SANDBOX)
}

/// What a launcher sets up before it knows its command, because it is the
/// same for every command: a launcher started ahead of need (`pool.rs`)
/// does it while it waits, off the request's path. `no_new_privs` and the
/// seccomp filter every command gets ([`filters::priority`]) are applied
/// here, and with `deny_network` the network's ([`filters::network`]) —
/// only for a command that runs without namespaces of its own, since bwrap
/// needs netlink to bring up a new network namespace.
struct Prepared {
    /// For `--stdin-null`.
    null: std::fs::File,
    network_filtered: bool,
}

impl Prepared {
    fn new(deny_network: bool) -> Result<Self, SetupError> {
        rustix::thread::set_no_new_privs(true)
            .map_err(|e| SetupError::os("no_new_privs", e.into()))?;
        filters::apply(filters::priority())?;
        if deny_network {
            filters::apply(filters::network())?;
        }
        let null = std::fs::File::open("/dev/null").map_err(|e| SetupError::os("/dev/null", e))?;
        Ok(Self {
            null,
            network_filtered: deny_network,
        })
    }
}

/// Runs the command as `args` (parsed from `raw`) say; `in_own_session`: a
/// launcher started ahead of need made its session before its arguments
/// came.
fn run(args: SandboxArgs, raw: &[OsString], prepared: Prepared, in_own_session: bool) -> ExitCode {
    // Before anything else: the sandbox's own set-up is the command's work.
    if !in_own_session && let Err(e) = join_cgroups(&args.cgroups) {
        return refuse(e);
    }
    if let Some(nice) = args.nice
        && let Err(e) = rustix::process::setpriority_process(None, nice)
    {
        return refuse(SetupError::os("CPU priority", e.into()));
    }
    if !in_own_session && let Err(e) = rustix::process::setsid() {
        return refuse(SetupError::os("setsid", e.into()));
    }
    if args.tty
        && let Err(e) = rustix::process::ioctl_tiocsctty(std::io::stdin())
    {
        return refuse(SetupError::os("the terminal", e.into()));
    }
    if args.egress.is_some() && !args.applies(Mechanism::Namespaces) {
        return refuse(SetupError::Usage(
            "--egress needs the command's world (namespaces)".into(),
        ));
    }
    if args.applies(Mechanism::Namespaces) {
        if prepared.network_filtered {
            // The daemon's pool never does this: bwrap needs netlink.
            return refuse(SetupError::Namespaces(
                "a launcher that filtered the network cannot make namespaces".into(),
            ));
        }
        return match args.hidden() {
            Ok(hidden) => world::enter(&args, world::Inner::Given(raw), &hidden),
            Err(e) => refuse(e),
        };
    }
    if let Err(e) = restrict(&args, prepared.network_filtered, false)
        .and_then(|()| settle(&args))
        .and_then(|()| args.release(prepared.null, None))
    {
        return refuse(e);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return refuse(SetupError::Usage("no program".into()));
    };
    use std::os::unix::process::CommandExt as _;
    let error = std::process::Command::new(program)
        .args(rest)
        .envs(args.env.iter().map(|(name, value)| (name, value)))
        .exec();
    eprintln!("portcullis sandbox: {}: {error}", program.to_string_lossy());
    ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// `--inside FD [--cover PATH]… (ARGS… | --args-on-stdin LAYOUT…)`: the
/// launcher bwrap starts as the first process of the command's world (see
/// [`world`]). It covers each PATH (what of `/etc` is hidden, as the
/// launcher outside was told or looked), confines itself as far as the
/// world's layout says ([`confine_world`]),
/// then as far as the command does ([`settle`]), runs the program as its
/// child and tells the launcher outside how it ended. Its stdin is that
/// report's pipe; FD is the program's stdin. With `--args-on-stdin` it was
/// started ahead of need: it confines itself before it reads its arguments
/// there, off the request's path, and refuses any whose world differs from
/// its own. (`--tty` was the outer launcher's to do.)
fn inside(stdin_fd: &str, rest: &[OsString]) -> ExitCode {
    let status = match world::Status::open(stdin_fd) {
        Ok(status) if world::Status::reader_gone(&status) => {
            return refuse(SetupError::GatewayGone);
        }
        Ok(status) => status,
        Err(e) => return refuse(e),
    };
    if let Err(e) = close_inherited(Some(&status)) {
        return refuse(e);
    }
    let handlers = match world::Handlers::install() {
        Ok(handlers) => handlers,
        Err(e) => return refuse(e),
    };
    let mut rest = rest;
    let mut covers = Vec::new();
    while let [flag, path, after @ ..] = rest
        && flag == "--cover"
    {
        covers.push(PathBuf::from(path));
        rest = after;
    }
    // From the moment it is confined, this launcher (and the world with
    // it) ends as soon as the outer launcher is gone: everything it waits
    // for after that, it waits for watching the status pipe too
    // (`world::readable`).
    let confine = |world: &SandboxArgs| confine_world(world, &covers);
    let confined = match rest.split_first() {
        Some((first, layout)) if first == "--args-on-stdin" => {
            Layout::parse(layout).and_then(|layout| {
                let prepared = confine(&layout.args())?;
                let Some(raw) = read_args(Some(&status))? else {
                    return Ok(None);
                };
                let args = SandboxArgs::parse(raw.into_iter())?;
                match layout.fits(&args) {
                    true => Ok(Some((args, prepared))),
                    false => Err(SetupError::Namespaces(
                        "this launcher's world was made for other roots, network, /tmp or confinement"
                            .into(),
                    )),
                }
            })
        }
        _ => SandboxArgs::parse(rest.iter().cloned()).and_then(|args| {
            let prepared = confine(&args)?;
            Ok(Some((args, prepared)))
        }),
    };
    let (args, prepared) = match confined {
        Ok(Some(confined)) => confined,
        // The daemon exited (or dropped it) before it was needed.
        Ok(None) => return ExitCode::from(EXIT_SANDBOX),
        Err(e) => return refuse(e),
    };
    // Best effort: inside, without capabilities, only the daemon's renice
    // of the whole group may give the priority back (pool.rs).
    if let Some(nice) = args.nice {
        let _ = rustix::process::setpriority_process(None, nice);
    }
    let ready = settle(&args).and_then(|()| {
        if args.egress.is_some() {
            // After `confine_world`: the bridge's threads inherit its
            // Landlock ruleset and seccomp filters.
            egress::bridge()?;
        }
        args.release(prepared.null, Some(&status))
    });
    if let Err(e) = ready {
        return refuse(e);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return refuse(SetupError::Usage("no program".into()));
    };
    let mut command = std::process::Command::new(program);
    command
        .args(rest)
        .env_clear()
        .envs(args.env.iter().map(|(name, value)| (name, value)));
    world::Status::run(status, handlers, command)
}

/// What of a command's confinement depends on its world's layout only —
/// its roots, network, `/tmp` size and the mechanisms a best-effort grant
/// skips — in order: the world's own `/tmp` and `/dev/shm` and the covers
/// of what of `/etc` is `hidden`, the
/// capabilities bwrap left dropped, `no_new_privs` and the priority filter
/// ([`Prepared`]), then [`restrict`]. All of it before the launcher reads
/// anything of its command.
fn confine_world(world: &SandboxArgs, hidden: &[PathBuf]) -> Result<Prepared, SetupError> {
    world::mount_inside(world, hidden)?;
    world::drop_capabilities()?;
    let prepared = Prepared::new(false)?;
    restrict(world, prepared.network_filtered, true)?;
    Ok(prepared)
}

/// Landlock, the network's seccomp filter unless it was applied ahead
/// (`network_filtered`), and the filter of calls no command needs
/// ([`filters::hardening`]): what depends on the grant's roots and
/// network, not on the command. `in_world`: the command runs in its own
/// world, whose `/tmp` and `/dev/shm` are its own to write
/// ([`WORLD_WRITE`]).
fn restrict(args: &SandboxArgs, network_filtered: bool, in_world: bool) -> Result<(), SetupError> {
    let deny_network = args.deny_network && args.applies(Mechanism::Network);
    if network_filtered && !deny_network {
        // The daemon's pool keeps the two kinds apart; never run a command
        // with less network than its grant gives without saying so.
        return Err(SetupError::NetworkMismatch);
    }
    let files = match args.applies(Mechanism::Landlock) {
        true => {
            let (read, all) = (AccessFs::from_read(NEWEST), AccessFs::from_all(NEWEST));
            let rules = path_beneath_rules(SYSTEM_READ, read)
                .chain(path_beneath_rules(SYSTEM_WRITE, all))
                .chain(path_beneath_rules(world_writable(args, in_world), all))
                .collect::<Result<Vec<_>, _>>()?;
            Some(rules)
        }
        false => None,
    };
    landlock(args, files, deny_network)?;
    if deny_network && !network_filtered {
        filters::apply(filters::network())?;
    }
    filters::apply(filters::hardening())?;
    filters::apply(filters::no_clone3())
}

/// What depends on the command: its working directory, and the grant's
/// rlimits with no core dumps and no raising of CPU priority. After
/// [`restrict`]: the directory is opened beneath its root as Landlock
/// allows, and the rlimits cannot hamper the confinement's own set-up.
fn settle(args: &SandboxArgs) -> Result<(), SetupError> {
    if let Some(cwd) = &args.cwd {
        change_dir(cwd)?;
    }
    let fixed = [(Limit::Core, 0), (Limit::Nice, 0)];
    for (limit, value) in args.limits.iter().copied().chain(fixed) {
        let rlimit = rustix::process::Rlimit {
            current: Some(value),
            maximum: Some(value),
        };
        rustix::process::setrlimit(limit.resource(), rlimit)
            .map_err(|e| SetupError::os(limit.name(), e.into()))?;
    }
    Ok(())
}

/// [`WORLD_WRITE`]'s directories for a command in its own world, except
/// one with a read-only root beneath it (a rule for the directory would
/// cover that root too, and Landlock must keep it read-only as the mount
/// does) or above it (the directory is then that root's, read-only).
fn world_writable(args: &SandboxArgs, in_world: bool) -> Vec<&'static str> {
    let read_only = |dir: &&str| {
        args.ro
            .iter()
            .any(|root| root.starts_with(dir) || Path::new(dir).starts_with(root))
    };
    match in_world {
        true => WORLD_WRITE
            .iter()
            .copied()
            .filter(|dir| !read_only(dir))
            .collect(),
        false => Vec::new(),
    }
}

/// The world's own tmpfs mounts ([`WORLD_WRITE`]): those no root covers,
/// as a root equal to or above one does (bwrap binds roots after them).
pub(crate) fn own_tmpfs(args: &SandboxArgs) -> Vec<&'static str> {
    let covered =
        |dir: &&str| (args.ro.iter().chain(&args.rw)).any(|root| Path::new(dir).starts_with(root));
    WORLD_WRITE
        .iter()
        .copied()
        .filter(|dir| !covered(dir))
        .collect()
}

impl SandboxArgs {
    /// What of `/etc` to cover: as the daemon said, or looked at now.
    fn hidden(&self) -> Result<Vec<PathBuf>, SetupError> {
        match &self.hidden {
            Some(hidden) => Ok(hidden.clone()),
            None => world::hidden_in_etc(),
        }
    }

    fn applies(&self, mechanism: Mechanism) -> bool {
        !self.skip.contains(&mechanism)
    }

    /// With `--await-release`, waits for it (and with `--stdin-null` puts
    /// `null` on stdin); inside a world, watching the status pipe.
    fn release(
        &self,
        null: std::fs::File,
        watched: Option<&std::fs::File>,
    ) -> Result<(), SetupError> {
        match self.await_release {
            true => await_release(self.stdin_null.then_some(null), watched),
            false => Ok(()),
        }
    }
}

/// Joins the command's control groups (`--cgroup DIR`, one per hierarchy;
/// the daemon made them and sets their limits), so that this launcher and
/// everything it starts — bubblewrap, the world, the program — counts
/// against them and is killed with them.
fn join_cgroups(dirs: &[PathBuf]) -> Result<(), SetupError> {
    for dir in dirs {
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).map_err(
            |source| SetupError::Cgroup {
                dir: dir.clone(),
                source,
            },
        )?;
    }
    Ok(())
}

/// Changes into `--cwd`, opened beneath its root the way the daemon opens
/// a request's paths (so a symlink swapped in cannot lead outside).
fn change_dir(cwd: &WorkingDir) -> Result<(), SetupError> {
    // Errors name the path only, as the daemon's do.
    let root = RootSpec {
        id: "",
        host_root: &cwd.host_root,
        virtual_root: "",
        follow_symlinks: cwd.follow_symlinks,
    };
    let dir = Root::open_dir(&root, &cwd.path)
        .map_err(|e| SetupError::WorkingDir(e.message().to_string()))?;
    rustix::process::fchdir(&dir).map_err(|e| SetupError::os("the working directory", e.into()))
}

/// Most bytes of arguments read from stdin (Linux's own limit for a
/// command line is 2 MiB).
const MAX_ARGS_ON_STDIN: usize = 2 << 20;

/// Arguments as the daemon writes them to a launcher started with
/// `--args-on-stdin`: the byte count of what follows (u32, big-endian),
/// then each argument as its byte count (u32, big-endian) and its bytes.
/// Lengths, not separators: an argument may hold any byte.
pub fn encode_args(args: &[OsString]) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt as _;
    let body_len: usize = args.iter().map(|a| 4 + a.len()).sum();
    let mut out = Vec::with_capacity(4 + body_len);
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    for arg in args {
        out.extend_from_slice(&(arg.len() as u32).to_be_bytes());
        out.extend_from_slice(arg.as_bytes());
    }
    out
}

/// The arguments in an [`encode_args`] body (without its leading count).
pub fn decode_args(mut body: &[u8]) -> Result<Vec<OsString>, SetupError> {
    use std::os::unix::ffi::OsStringExt as _;
    let mut args = Vec::new();
    while !body.is_empty() {
        let (len, rest) = split_u32(body).ok_or(SetupError::Arguments("a length is cut off"))?;
        if rest.len() < len {
            return Err(SetupError::Arguments("an argument is cut off"));
        }
        let (arg, rest) = rest.split_at(len);
        args.push(OsString::from_vec(arg.to_vec()));
        body = rest;
    }
    Ok(args)
}

fn split_u32(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let (head, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_be_bytes(*head) as usize, rest))
}

/// Reads the arguments from stdin, exactly (what follows is the release
/// byte and the program's input). `None`: stdin ended before they began.
fn read_args(watched: Option<&std::fs::File>) -> Result<Option<Vec<OsString>>, SetupError> {
    let mut head = [0u8; 4];
    let read =
        |buf: &mut [u8]| read_exact_stdin(buf, watched).map_err(|e| SetupError::os("arguments", e));
    match read(&mut head)? {
        0 => return Ok(None),
        4 => {}
        _ => return Err(SetupError::Arguments("stdin ended inside their length")),
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_ARGS_ON_STDIN {
        return Err(SetupError::Arguments(
            "more than MAX_ARGS_ON_STDIN (2 MiB) bytes",
        ));
    }
    let mut body = vec![0u8; len];
    if read(&mut body)? != len {
        return Err(SetupError::Arguments("stdin ended inside them"));
    }
    decode_args(&body).map(Some)
}

/// Fills `buf` from fd 0 without reading beyond it (std's `Stdin` would
/// buffer ahead); returns how much it filled before the end of input.
/// With `watched` (the status pipe of a launcher inside a world), each
/// wait is [`world::readable`]'s.
fn read_exact_stdin(
    buf: &mut [u8],
    watched: Option<&std::fs::File>,
) -> Result<usize, std::io::Error> {
    use std::os::fd::AsFd as _;
    let mut filled = 0;
    while filled < buf.len() {
        if let Some(status) = watched {
            world::readable(std::io::stdin().as_fd(), status)?;
        }
        match rustix::io::read(std::io::stdin(), &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(filled)
}

/// Waits for the daemon's [`RELEASE`] byte on stdin, reading exactly one
/// byte (the request's input follows it), then puts `null` (/dev/null), if
/// given, in its place.
fn await_release(
    null: Option<std::fs::File>,
    watched: Option<&std::fs::File>,
) -> Result<(), SetupError> {
    let mut byte = [0u8; 1];
    match read_exact_stdin(&mut byte, watched) {
        Ok(1) if byte == RELEASE => {}
        Ok(_) => return Err(SetupError::NotReleased),
        Err(e) => return Err(SetupError::os("waiting for the release", e)),
    }
    if let Some(null) = null {
        rustix::stdio::dup2_stdin(&null).map_err(|e| SetupError::os("stdin", e.into()))?;
    }
    Ok(())
}

/// Landlock as strict as the kernel allows, but never weaker than the
/// filesystem rights of ABI 3 (which covers truncate). Those are required;
/// the newer ones are applied where the kernel has them: ABI 5's device
/// ioctls, and ABI 6's signal scope — no signal to a process outside this
/// sandbox, so a command cannot kill the daemon or another command, which
/// run as the same user (the daemon signals commands; they signal only
/// what they started).
/// One Landlock ruleset: with `files` (the system paths' rules, see
/// [`Prepared`]) the filesystem rules (and, best effort, the signal scope),
/// with `no_network` the network's (see [`network_rules`]). Nothing to do
/// when neither applies.
fn landlock(
    args: &SandboxArgs,
    files: Option<Vec<PathBeneath<PathFd>>>,
    no_network: bool,
) -> Result<(), SetupError> {
    if files.is_none() && !no_network {
        return Ok(());
    }
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    if files.is_some() {
        ruleset = required_filesystem_rules(ruleset)?;
    }
    if no_network {
        ruleset = network_rules(ruleset)?;
    }
    // Last, so that a kernel without them weakens nothing required above.
    if files.is_some() {
        ruleset = ruleset
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(NEWEST))
            .and_then(|ruleset| ruleset.scope(Scope::Signal))?;
    }
    let mut created = ruleset.create()?;
    if let Some(system_rules) = files {
        let (read, all) = (AccessFs::from_read(NEWEST), AccessFs::from_all(NEWEST));
        created = created
            .add_rules(
                system_rules
                    .into_iter()
                    .map(Ok::<_, landlock::RulesetError>),
            )
            .and_then(|r| r.add_rules(path_beneath_rules(&args.ro, read)))
            .and_then(|r| r.add_rules(path_beneath_rules(&args.rw, all)))?;
    }
    let status = created.restrict_self()?;
    match status.ruleset {
        // Partially: only the best-effort rights are missing (the required
        // ones would have failed above).
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err(SetupError::LandlockNotEnforced),
    }
}

fn required_filesystem_rules(ruleset: Ruleset) -> Result<Ruleset, landlock::RulesetError> {
    ruleset.handle_access(AccessFs::from_all(ABI::V3))
}

/// No network, in layers beneath the command's empty network namespace
/// ([`world`]), each refusing what the others cannot see.
///
/// Landlock: no TCP connect or bind (ABI 4), and no connecting to an
/// abstract UNIX socket made outside this sandbox (ABI 6) — a host's
/// abstract sockets are services, not files, so the filesystem rules do not
/// reach them.
///
/// seccomp ([`filters::network`]): `socket` and `socketpair` of any family
/// but `AF_UNIX` fail with `EACCES` (UDP, raw, netlink, vsock… which
/// Landlock does not cover), and so does `io_uring_setup` (io_uring can open
/// sockets without `socket`).
///
/// Pathname UNIX sockets are files: the mount namespace and the Landlock
/// filesystem rules decide which can be reached.
fn network_rules(ruleset: Ruleset) -> Result<Ruleset, landlock::RulesetError> {
    ruleset
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        .scope(Scope::AbstractUnixSocket)
}

/// The confinement mechanisms a host may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// Landlock filesystem rules (ABI 3).
    Landlock,
    /// Landlock's TCP rules and abstract-socket scope (ABI 6) and seccomp;
    /// needed only by grants with `network = "deny"`.
    Network,
    /// A world of the command's own: user, mount, PID, IPC and UTS
    /// namespaces, and a network namespace when the network is denied
    /// (bubblewrap; see [`world`]).
    Namespaces,
}

impl Mechanism {
    /// In the order the probe tries them: the network's last, since its
    /// filter stays on the probing process (and bwrap needs netlink).
    pub const ALL: [Self; 3] = [Self::Landlock, Self::Namespaces, Self::Network];

    pub fn name(self) -> &'static str {
        match self {
            Self::Landlock => "landlock",
            Self::Network => "network",
            Self::Namespaces => "namespaces",
        }
    }

    /// Whether this host can apply the mechanism (tried in the probing
    /// process, which exits right after). `PORTCULLIS_SANDBOX_PRETEND_MISSING`
    /// (names, comma-separated) makes the probe report a mechanism missing:
    /// the tests' way to see a host without it.
    fn probe(self) -> Result<(), SetupError> {
        let pretend = std::env::var("PORTCULLIS_SANDBOX_PRETEND_MISSING").unwrap_or_default();
        if pretend.split(',').any(|name| name == self.name()) {
            let why = "missing (PORTCULLIS_SANDBOX_PRETEND_MISSING)";
            return Err(SetupError::Usage(why.into()));
        }
        match self {
            Self::Landlock => {
                let hard = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
                Ok(required_filesystem_rules(hard).and_then(|r| r.create().map(drop))?)
            }
            Self::Namespaces => world::probe(),
            // Last: the probe exits right after, without sockets.
            Self::Network => landlock(&SandboxArgs::default(), None, true)
                .and_then(|()| filters::apply(filters::priority()))
                .and_then(|()| filters::apply(filters::network())),
        }
    }
}

/// The rlimits a grant can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Address space, bytes.
    Memory,
    /// One file's size, bytes.
    FileSize,
    /// Open descriptors.
    OpenFiles,
    /// Processes of the command's user (`RLIMIT_NPROC`). In the command's
    /// own user namespace the kernel counts only that namespace's
    /// processes (Linux 5.14+), so this is the command's own count — the
    /// two launcher processes of its world included. Not enforced for a
    /// daemon running as root (the kernel exempts uid 0).
    Processes,
    /// Core dump size (always 0).
    Core,
    /// How far the nice value may be lowered (always 0: not at all).
    Nice,
}

impl Limit {
    const ALL: [(Self, &'static str); 6] = [
        (Self::Memory, "memory"),
        (Self::FileSize, "file_size"),
        (Self::OpenFiles, "open_files"),
        (Self::Processes, "processes"),
        (Self::Core, "core"),
        (Self::Nice, "nice"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(l, _)| *l == self)
            .map_or("", |(_, n)| n)
    }

    /// `memory=1073741824`.
    fn parse(arg: &str) -> Result<(Self, u64), SetupError> {
        let bad = || {
            SetupError::Usage(format!(
                "--limit {arg}: expected NAME=N with NAME one of memory, file_size, open_files, processes, core, nice"
            ))
        };
        let (name, value) = arg.split_once('=').ok_or_else(bad)?;
        let limit = Self::ALL
            .iter()
            .find(|(_, n)| *n == name)
            .ok_or_else(bad)?
            .0;
        Ok((limit, value.parse().map_err(|_| bad())?))
    }

    fn resource(self) -> rustix::process::Resource {
        use rustix::process::Resource;
        match self {
            Self::Memory => Resource::As,
            Self::FileSize => Resource::Fsize,
            Self::OpenFiles => Resource::Nofile,
            Self::Processes => Resource::Nproc,
            Self::Core => Resource::Core,
            Self::Nice => Resource::Nice,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::ffi::OsStringExt as _;

    /// A command's arguments with these roots, read-only and read-write.
    fn args(ro: &[&str], rw: &[&str]) -> SandboxArgs {
        SandboxArgs {
            ro: ro.iter().map(PathBuf::from).collect(),
            rw: rw.iter().map(PathBuf::from).collect(),
            ..SandboxArgs::default()
        }
    }

    /// A world's `/tmp` and `/dev/shm` are writable only in a world, and
    /// never where a read-only root lies beneath them or holds them.
    #[test]
    fn only_a_world_s_own_directories_are_writable() {
        assert!(world_writable(&args(&[], &[]), false).is_empty());
        assert_eq!(world_writable(&args(&[], &[]), true), ["/tmp", "/dev/shm"]);
        assert_eq!(
            world_writable(&args(&[], &["/tmp/work"]), true),
            ["/tmp", "/dev/shm"]
        );
        assert_eq!(
            world_writable(&args(&["/tmp/docs"], &[]), true),
            ["/dev/shm"]
        );
        assert!(world_writable(&args(&["/"], &[]), true).is_empty());
        assert_eq!(world_writable(&args(&["/dev"], &[]), true), ["/tmp"]);
        // A path that merely starts with the same letters is not beneath.
        assert_eq!(
            world_writable(&args(&["/tmpfiles"], &[]), true),
            ["/tmp", "/dev/shm"]
        );
    }

    #[test]
    fn only_tmpfs_mounts_no_root_covers_are_the_world_s_own() {
        assert_eq!(own_tmpfs(&args(&[], &[])), ["/tmp", "/dev/shm"]);
        // A root beneath is bound onto the world's own tmpfs.
        assert_eq!(
            own_tmpfs(&args(&["/tmp/docs"], &["/dev/shm/x"])),
            ["/tmp", "/dev/shm"]
        );
        // A root at or above one covers it with the host's directory.
        assert_eq!(own_tmpfs(&args(&[], &["/tmp"])), ["/dev/shm"]);
        assert_eq!(own_tmpfs(&args(&["/dev"], &[])), ["/tmp"]);
        assert!(own_tmpfs(&args(&[], &["/"])).is_empty());
        assert_eq!(own_tmpfs(&args(&["/tmpfiles"], &[])), ["/tmp", "/dev/shm"]);
    }

    #[test]
    fn a_tmp_size_is_bytes_more_than_zero() {
        let parse = |size: &str| {
            let args = ["--tmp-size", size, "--", "/bin/true"];
            SandboxArgs::parse(args.iter().map(OsString::from)).map(|a| a.tmp_size)
        };
        assert_eq!(parse("8388608").ok(), Some(Some(8 << 20)));
        for bad in ["0", "-1", "8M", ""] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.contains("--tmp-size needs BYTES"), "{bad}: {e}");
        }
    }

    proptest! {
        /// Any arguments, any bytes in them, come back as they went.
        #[test]
        fn arguments_round_trip(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..20)) {
            let args: Vec<OsString> = args.into_iter().map(OsString::from_vec).collect();
            let encoded = encode_args(&args);
            let (len, body) = split_u32(&encoded).unwrap();
            prop_assert_eq!(len, body.len());
            prop_assert_eq!(decode_args(body).unwrap(), args);
        }

        /// Cut anywhere inside an argument, the body is an error, not a
        /// shorter list.
        #[test]
        fn a_cut_body_is_an_error(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..40), 1..20), cut in any::<prop::sample::Index>()) {
            let args: Vec<OsString> = args.into_iter().map(OsString::from_vec).collect();
            let body = &encode_args(&args)[4..];
            let cut = cut.index(body.len());
            let ends = args.iter().scan(0, |end, a| { *end += 4 + a.len(); Some(*end) });
            let boundaries: Vec<usize> = std::iter::once(0).chain(ends).collect();
            prop_assume!(!boundaries.contains(&cut));
            prop_assert!(decode_args(&body[..cut]).is_err());
        }
    }

    #[test]
    fn limits_by_name() {
        assert_eq!(Limit::parse("processes=7").unwrap(), (Limit::Processes, 7));
        assert_eq!(Limit::parse("memory=1024").unwrap(), (Limit::Memory, 1024));
        assert!(Limit::parse("threads=3").is_err());
        assert!(Limit::parse("processes=many").is_err());
    }

    #[test]
    fn parse_takes_environment_and_working_directory() {
        let args = [
            "--env",
            "A",
            "1=2",
            "--cwd",
            "/srv",
            "sub",
            "--cwd-follow-symlinks",
            "--",
            "/bin/true",
        ];
        let parsed = SandboxArgs::parse(args.iter().map(OsString::from)).unwrap();
        assert_eq!(parsed.env, [("A".into(), "1=2".into())]);
        let cwd = parsed.cwd.unwrap();
        assert_eq!(
            (cwd.host_root.to_str(), cwd.path.as_str()),
            (Some("/srv"), "sub")
        );
        assert!(cwd.follow_symlinks);
        let early = [
            "--cwd-follow-symlinks",
            "--cwd",
            "/srv",
            "sub",
            "--",
            "/bin/true",
        ];
        assert!(SandboxArgs::parse(early.iter().map(OsString::from)).is_err());
        assert!(SandboxArgs::parse(["--env", "A"].iter().map(OsString::from)).is_err());
    }

    #[test]
    fn a_world_fits_only_commands_of_its_own_network() {
        let os = |items: &[&str]| items.iter().map(OsString::from).collect::<Vec<_>>();
        let layout =
            Layout::parse(&os(&["--world", "--egress", "/s/egress/3", "--rw", "/w"])).unwrap();
        let command = |extra: &[&str]| {
            let mut args = os(extra);
            args.extend(os(&["--rw", "/w", "--", "/bin/true"]));
            SandboxArgs::parse(args.into_iter()).unwrap()
        };
        assert!(layout.fits(&command(&["--egress", "/s/egress/3"])));
        // Another command's socket, no proxy, no network.
        assert!(!layout.fits(&command(&["--egress", "/s/egress/4"])));
        assert!(!layout.fits(&command(&[])));
        assert!(!layout.fits(&command(&["--deny-network"])));
        assert!(Layout::parse(&os(&["--world", "--egress"])).is_err());
    }

    /// A pool's launcher inside its world confines itself before it reads
    /// its command: a command whose `/tmp` size or skipped mechanisms
    /// differ would run confined as another grant's.
    #[test]
    fn a_world_fits_only_commands_of_its_own_tmp_and_confinement() {
        let os = |items: &[&str]| items.iter().map(OsString::from).collect::<Vec<_>>();
        let flags = ["--world", "--rw", "/w", "--tmp-size", "8388608"];
        let layout = Layout::parse(&os(&[&flags[..], &["--skip", "landlock"]].concat())).unwrap();
        assert_eq!(layout.args().tmp_size, Some(8 << 20));
        assert_eq!(layout.args().skip, [Mechanism::Landlock]);
        let command = |extra: &[&str]| {
            let mut args = os(&["--rw", "/w"]);
            args.extend(os(extra));
            args.extend(os(&["--", "/bin/true"]));
            SandboxArgs::parse(args.into_iter()).unwrap()
        };
        assert!(layout.fits(&command(&["--skip", "landlock", "--tmp-size", "8388608"])));
        assert!(!layout.fits(&command(&["--skip", "landlock"])));
        assert!(!layout.fits(&command(&["--skip", "landlock", "--tmp-size", "4096"])));
        assert!(!layout.fits(&command(&["--tmp-size", "8388608"])));
        let more = [
            "--skip",
            "landlock",
            "--skip",
            "network",
            "--tmp-size",
            "8388608",
        ];
        assert!(!layout.fits(&command(&more)));
        for bad in [
            &["--tmp-size", "0"][..],
            &["--tmp-size"],
            &["--skip", "seccomp"],
        ] {
            assert!(Layout::parse(&os(&[&["--world"][..], bad].concat())).is_err());
        }
    }
}

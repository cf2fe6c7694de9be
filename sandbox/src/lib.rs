//! The child's side of a command: the `portcullis-sandbox` launcher, which
//! the daemon starts in place of the program. It confines itself, then
//! execs the program, so everything below applies to the program and to
//! all it starts. (Doing this between fork and exec in the daemon would
//! need `pre_exec`, which is `unsafe`.) The launcher is a small binary of
//! its own: starting the daemon's 90 MB binary for it cost 1.7 ms more.
//!
//! Usage: `portcullis-sandbox [--nice N] [--rw DIR]… [--ro DIR]…
//! [--deny-network] [--tty | --await-release [--stdin-null]] [--limit NAME=N]…
//! [--skip MECHANISM]… [--env NAME VALUE]… [--cwd ROOT PATH
//! [--cwd-follow-symlinks]] -- PROGRAM [ARG…]`; or
//! `portcullis-sandbox --args-on-stdin [--deny-network]`, which makes its
//! session and then reads those arguments from stdin ([`encode_args`]) —
//! how the daemon starts launchers ahead of need (`pool.rs`); or `portcullis-sandbox
//! --probe`, which reports which mechanisms this host has (one `NAME=ok`
//! or `NAME=REASON` line each); the daemon asks once.
//!
//! First what is the same for every command ([`Prepared`]; a launcher
//! started ahead of need does it before its arguments come): `no_new_privs`
//! (no setuid gains) and a seccomp filter ([`priority_filter`]) that keeps
//! the program from changing other processes' priority or limits (and,
//! for a launcher started with `--deny-network`, the network's filter,
//! which its arguments must then ask for too). Then,
//! in order: with `--nice` the daemon's CPU priority back (a launcher
//! started ahead of need waits at the lowest, see `pool.rs`); a session
//! and process group of its own (so the daemon can end the whole group),
//! with `--tty` its stdin as controlling terminal;
//! with `--cwd` the working directory, opened beneath its root as `file.*`
//! requests open paths; the grant's rlimits, no core dumps and no raising
//! of its CPU priority; a Landlock ruleset: read and execute
//! the system's program paths, read the granted `ro` roots, read and write
//! the `rw` roots, and (where the kernel has it) signal nothing outside
//! the sandbox; with `--deny-network` no network (see [`network_rules`]):
//! Landlock's TCP rules and its abstract-socket scope, in the same
//! ruleset, and a second seccomp filter ([`network_filter`]) that refuses
//! sockets of every family but `AF_UNIX`. If the
//! kernel cannot enforce that (Landlock ABI 3, and 6 for the network;
//! seccomp, which is never skipped) the launcher refuses to run the
//! program — unless the daemon passed `--skip` for that mechanism, which it
//! does only for a grant with `sandbox = "best_effort"` on a host whose
//! probe said the mechanism is missing (and then records a warning in the
//! audit entry).
//!
//! With `--await-release`, the last step before exec is to read one byte
//! from stdin: the daemon sends [`RELEASE`] once the request's start entry
//! is durable, so the sandbox is set up while the entry is written but the
//! program never runs unaudited (end of input instead: the launcher exits).
//! `--stdin-null` then gives the program /dev/null as its stdin.
//!
//! Architecture invariant: this crate never depends on the daemon, the
//! wire or the policy; the daemon uses its library for the launcher's
//! arguments ([`encode_args`], [`RELEASE`], [`Mechanism`], [`Limit`]).

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// The program (an absolute path) and its arguments.
    command: Vec<OsString>,
}

impl SandboxArgs {
    /// The launcher's arguments, as the daemon writes them.
    pub fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Self, String> {
        let mut parsed = Self::default();
        while let Some(arg) = args.next() {
            match arg.to_str() {
                Some("--rw") => parsed
                    .rw
                    .push(args.next().ok_or("--rw needs a DIR")?.into()),
                Some("--ro") => parsed
                    .ro
                    .push(args.next().ok_or("--ro needs a DIR")?.into()),
                Some("--nice") => {
                    let arg = args.next().ok_or("--nice needs N")?;
                    let nice = arg.to_str().and_then(|n| n.parse().ok());
                    parsed.nice = Some(nice.ok_or("--nice needs N, a nice value")?);
                }
                Some("--deny-network") => parsed.deny_network = true,
                Some("--tty") => parsed.tty = true,
                Some("--await-release") => parsed.await_release = true,
                Some("--stdin-null") => parsed.stdin_null = true,
                Some("--limit") => {
                    let arg = args.next().ok_or("--limit needs NAME=N")?;
                    parsed.limits.push(Limit::parse(&arg.to_string_lossy())?);
                }
                Some("--env") => {
                    let name = args.next().ok_or("--env needs NAME VALUE")?;
                    let value = args.next().ok_or("--env needs NAME VALUE")?;
                    parsed.env.push((name, value));
                }
                Some("--cwd") => {
                    let host_root = args.next().ok_or("--cwd needs ROOT PATH")?.into();
                    let path = args.next().ok_or("--cwd needs ROOT PATH")?;
                    let path = path.into_string().map_err(|_| "--cwd: PATH is not UTF-8")?;
                    parsed.cwd = Some(WorkingDir {
                        host_root,
                        path,
                        follow_symlinks: false,
                    });
                }
                Some("--cwd-follow-symlinks") => match parsed.cwd.as_mut() {
                    Some(cwd) => cwd.follow_symlinks = true,
                    None => return Err("--cwd-follow-symlinks needs a --cwd before it".into()),
                },
                Some("--skip") => {
                    let arg = args.next().ok_or("--skip needs a MECHANISM")?;
                    let name = arg.to_string_lossy();
                    let mechanism = Mechanism::ALL
                        .into_iter()
                        .find(|m| m.name() == name)
                        .ok_or_else(|| format!("--skip {name}: expected landlock or network"))?;
                    parsed.skip.push(mechanism);
                }
                Some("--") => {
                    parsed.command = args.collect();
                    return match parsed.command.is_empty() {
                        true => Err("no program after --".into()),
                        false => Ok(parsed),
                    };
                }
                _ => return Err(format!("unexpected argument {}", arg.to_string_lossy())),
            }
        }
        Err("usage: portcullis-sandbox [--nice N] [--rw DIR]... [--ro DIR]... [--deny-network] [--tty | --await-release [--stdin-null]] [--limit NAME=N]... [--skip MECHANISM]... [--env NAME VALUE]... [--cwd ROOT PATH [--cwd-follow-symlinks]] -- PROGRAM [ARG...]".into())
    }
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
        Some("--args-on-stdin") => waiting(&args[1..]),
        _ => match SandboxArgs::parse(args.into_iter()) {
            Ok(args) => match Prepared::new(false) {
                Ok(prepared) => run(args, prepared, false),
                Err(e) => refuse(e),
            },
            Err(e) => refuse(e),
        },
    }
}

/// `--args-on-stdin [--deny-network]`: the steps that do not depend on the
/// request, then the arguments from stdin.
fn waiting(flags: &[OsString]) -> ExitCode {
    let deny_network = match flags {
        [] => false,
        [flag] if flag == "--deny-network" => true,
        _ => return refuse("usage: portcullis-sandbox --args-on-stdin [--deny-network]"),
    };
    if let Err(e) = rustix::process::setsid() {
        return refuse(format!("setsid: {e}"));
    }
    let prepared = match Prepared::new(deny_network) {
        Ok(prepared) => prepared,
        Err(e) => return refuse(e),
    };
    match read_args() {
        // The daemon exited (or dropped it) before it was needed.
        Ok(None) => ExitCode::from(EXIT_SANDBOX),
        Ok(Some(args)) => match SandboxArgs::parse(args.into_iter()) {
            Ok(args) => run(args, prepared, true),
            Err(e) => refuse(e),
        },
        Err(e) => refuse(e),
    }
}

fn refuse(what: impl std::fmt::Display) -> ExitCode {
    eprintln!("portcullis sandbox: {what}; the command was not run");
    ExitCode::from(EXIT_SANDBOX)
}

/// What a launcher sets up before it knows its command, because it is the
/// same for every command: a launcher started ahead of need (`pool.rs`)
/// does it while it waits, off the request's path. `no_new_privs` and the
/// seccomp filter every command gets ([`priority_filter`]) are applied
/// here, and with `deny_network` the network's ([`network_filter`]); the
/// system paths' Landlock rules are opened, to be added to the command's
/// ruleset.
struct Prepared {
    system_rules: Vec<PathBeneath<PathFd>>,
    /// For `--stdin-null`.
    null: std::fs::File,
    network_filtered: bool,
}

impl Prepared {
    fn new(deny_network: bool) -> Result<Self, String> {
        rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
        apply_filter(priority_filter())?;
        if deny_network {
            apply_filter(network_filter())?;
        }
        let (read, all) = (AccessFs::from_read(NEWEST), AccessFs::from_all(NEWEST));
        let system_rules = path_beneath_rules(SYSTEM_READ, read)
            .chain(path_beneath_rules(SYSTEM_WRITE, all))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("Landlock: {e}"))?;
        let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
        Ok(Self {
            system_rules,
            null,
            network_filtered: deny_network,
        })
    }
}

/// Runs the command as `args` say; `in_own_session`: a launcher started
/// ahead of need made its session before its arguments came.
fn run(args: SandboxArgs, prepared: Prepared, in_own_session: bool) -> ExitCode {
    // Before anything else: the sandbox's own set-up is the command's work.
    if let Some(nice) = args.nice
        && let Err(e) = rustix::process::setpriority_process(None, nice)
    {
        return refuse(format!("CPU priority {nice}: {e}"));
    }
    if !in_own_session && let Err(e) = rustix::process::setsid() {
        return refuse(format!("setsid: {e}"));
    }
    if args.tty
        && let Err(e) = rustix::process::ioctl_tiocsctty(std::io::stdin())
    {
        return refuse(format!("the terminal: {e}"));
    }
    let applies = |m: Mechanism| !args.skip.contains(&m);
    if let Some(cwd) = &args.cwd
        && let Err(e) = change_dir(cwd)
    {
        return refuse(e);
    }
    let fixed = [(Limit::Core, 0), (Limit::Nice, 0)];
    let limits = args.limits.iter().copied().chain(fixed);
    for (limit, value) in limits {
        let rlimit = rustix::process::Rlimit {
            current: Some(value),
            maximum: Some(value),
        };
        if let Err(e) = rustix::process::setrlimit(limit.resource(), rlimit) {
            return refuse(format!("{}: {e}", limit.name()));
        }
    }
    let deny_network = args.deny_network && applies(Mechanism::Network);
    if prepared.network_filtered && !deny_network {
        // The daemon's pool keeps the two kinds apart; never run a command
        // with less network than its grant gives without saying so.
        return refuse("a launcher without network was given a command that may use it");
    }
    let files = applies(Mechanism::Landlock).then_some(prepared.system_rules);
    if let Err(e) = landlock(&args, files, deny_network) {
        return refuse(e);
    }
    if deny_network
        && !prepared.network_filtered
        && let Err(e) = apply_filter(network_filter())
    {
        return refuse(e);
    }
    if args.await_release
        && let Err(e) = await_release(args.stdin_null.then_some(prepared.null))
    {
        return refuse(e);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return refuse("no program");
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

/// Changes into `--cwd`, opened beneath its root the way the daemon opens
/// a request's paths (so a symlink swapped in cannot lead outside).
fn change_dir(cwd: &WorkingDir) -> Result<(), String> {
    // Errors name the path only, as the daemon's do.
    let root = RootSpec {
        id: "",
        host_root: &cwd.host_root,
        virtual_root: "",
        follow_symlinks: cwd.follow_symlinks,
    };
    let dir = Root::open_dir(&root, &cwd.path)
        .map_err(|e| format!("the working directory: {}", e.message()))?;
    rustix::process::fchdir(&dir).map_err(|e| format!("the working directory: {e}"))
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
pub fn decode_args(mut body: &[u8]) -> Result<Vec<OsString>, String> {
    use std::os::unix::ffi::OsStringExt as _;
    let mut args = Vec::new();
    while !body.is_empty() {
        let (len, rest) = split_u32(body).ok_or("arguments: a length is cut off")?;
        if rest.len() < len {
            return Err("arguments: an argument is cut off".into());
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
fn read_args() -> Result<Option<Vec<OsString>>, String> {
    let mut head = [0u8; 4];
    let read = |buf: &mut [u8]| read_exact_stdin(buf).map_err(|e| format!("arguments: {e}"));
    match read(&mut head)? {
        0 => return Ok(None),
        4 => {}
        _ => return Err("arguments: stdin ended inside their length".into()),
    }
    let len = u32::from_be_bytes(head) as usize;
    if len > MAX_ARGS_ON_STDIN {
        return Err(format!(
            "arguments: {len} bytes is more than {MAX_ARGS_ON_STDIN}"
        ));
    }
    let mut body = vec![0u8; len];
    if read(&mut body)? != len {
        return Err("arguments: stdin ended inside them".into());
    }
    decode_args(&body).map(Some)
}

/// Fills `buf` from fd 0 without reading beyond it (std's `Stdin` would
/// buffer ahead); returns how much it filled before the end of input.
fn read_exact_stdin(buf: &mut [u8]) -> Result<usize, String> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::io::read(std::io::stdin(), &mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(filled)
}

/// Waits for the daemon's [`RELEASE`] byte on stdin, reading exactly one
/// byte (the request's input follows it), then puts `null` (/dev/null), if
/// given, in its place.
fn await_release(null: Option<std::fs::File>) -> Result<(), String> {
    let mut byte = [0u8; 1];
    match read_exact_stdin(&mut byte) {
        Ok(1) if byte == RELEASE => {}
        Ok(_) => return Err("the gateway did not release the command".into()),
        Err(e) => return Err(format!("waiting for the release: {e}")),
    }
    if let Some(null) = null {
        rustix::stdio::dup2_stdin(&null).map_err(|e| format!("stdin: {e}"))?;
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
) -> Result<(), String> {
    if files.is_none() && !no_network {
        return Ok(());
    }
    let error = |e: landlock::RulesetError| format!("Landlock: {e}");
    let mut ruleset = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
    if files.is_some() {
        ruleset = required_filesystem_rules(ruleset).map_err(error)?;
    }
    if no_network {
        ruleset = network_rules(ruleset).map_err(error)?;
    }
    // Last, so that a kernel without them weakens nothing required above.
    if files.is_some() {
        ruleset = ruleset
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(AccessFs::from_all(NEWEST))
            .and_then(|ruleset| ruleset.scope(Scope::Signal))
            .map_err(error)?;
    }
    let mut created = ruleset.create().map_err(error)?;
    if let Some(system_rules) = files {
        let (read, all) = (AccessFs::from_read(NEWEST), AccessFs::from_all(NEWEST));
        created = created
            .add_rules(
                system_rules
                    .into_iter()
                    .map(Ok::<_, landlock::RulesetError>),
            )
            .and_then(|r| r.add_rules(path_beneath_rules(&args.ro, read)))
            .and_then(|r| r.add_rules(path_beneath_rules(&args.rw, all)))
            .map_err(error)?;
    }
    let status = created.restrict_self().map_err(error)?;
    match status.ruleset {
        // Partially: only the best-effort rights are missing (the required
        // ones would have failed above).
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err("Landlock is not enforced on this kernel".into()),
    }
}

fn required_filesystem_rules(ruleset: Ruleset) -> Result<Ruleset, landlock::RulesetError> {
    ruleset.handle_access(AccessFs::from_all(ABI::V3))
}

/// No network, in two layers, each refusing what the other cannot see.
///
/// Landlock: no TCP connect or bind (ABI 4), and no connecting to an
/// abstract UNIX socket made outside this sandbox (ABI 6) — a host's
/// abstract sockets are services, not files, so the filesystem rules do not
/// reach them.
///
/// seccomp ([`network_filter`]): `socket` and `socketpair` of any family but
/// `AF_UNIX` fail with `EACCES` (UDP, raw, netlink, vsock… which Landlock
/// does not cover), and so does `io_uring_setup` (io_uring can open sockets
/// without `socket`).
///
/// Pathname UNIX sockets are files: the Landlock filesystem rules decide
/// which can be made. This replaced a network namespace per command,
/// whose creation and teardown cost more CPU than `/bin/true` itself.
fn network_rules(ruleset: Ruleset) -> Result<Ruleset, landlock::RulesetError> {
    ruleset
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        .scope(Scope::AbstractUnixSocket)
}

/// Every command's seccomp filter, applied before the command is known
/// ([`Prepared`]). The calls that change another process's priority,
/// scheduling policy, I/O priority or rlimits fail with `EACCES` unless
/// they name the caller itself (pid 0): the kernel lets a process do that
/// to any process of the same user — the daemon and every other
/// principal's commands — and Landlock does not scope it. (CPU affinity
/// stays allowed: `pthread_setaffinity_np` names a program's own threads by
/// id, and pinning the daemon slows it at worst.)
fn priority_filter() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    // (which, who) with which = PRIO_PROCESS / IOPRIO_WHO_PROCESS.
    let not_self_priority = vec![arg_is_not(0, 0)?, arg_is_not(1, 0)?];
    let not_self_io_priority = vec![arg_is_not(0, 1)?, arg_is_not(1, 0)?];
    let not_self = vec![arg_is_not(0, 0)?];
    refusing(vec![
        (libc::SYS_setpriority, not_self_priority),
        (libc::SYS_ioprio_set, not_self_io_priority),
        (libc::SYS_prlimit64, not_self.clone()),
        (libc::SYS_sched_setscheduler, not_self.clone()),
        (libc::SYS_sched_setparam, not_self.clone()),
        (libc::SYS_sched_setattr, not_self),
    ])
}

/// The seccomp half of [`network_rules`], a second filter stacked on
/// [`priority_filter`] for a command whose grant denies the network. Two
/// filters rather than one, because installing one costs about 1 µs per
/// instruction (the kernel works out which syscalls it always allows):
/// the first is installed while every launcher waits, this short one too
/// in a launcher started for such a command, else after the request has
/// arrived.
fn network_filter() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    let not_unix = vec![arg_is_not(0, libc::AF_UNIX as u64)?];
    refusing(vec![
        (libc::SYS_socket, not_unix.clone()),
        (libc::SYS_socketpair, not_unix),
        (libc::SYS_io_uring_setup, vec![]),
    ])
}

/// A rule matching when argument `index` is not `value`.
fn arg_is_not(
    index: u8,
    value: u64,
) -> Result<seccompiler::SeccompRule, seccompiler::BackendError> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let condition = SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, value)?;
    SeccompRule::new(vec![condition])
}

/// A filter refusing (`EACCES`) each syscall when one of its rules matches
/// (always, with none) and allowing everything else. A syscall of another
/// ABI (i386 through `int 0x80`) kills the process; x32's numbers are
/// refused like the native ones.
fn refusing(
    mut refused: Vec<(i64, Vec<seccompiler::SeccompRule>)>,
) -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    use seccompiler::{SeccompAction, SeccompFilter};
    #[cfg(target_arch = "x86_64")]
    {
        const X32: i64 = 0x4000_0000;
        let x32: Vec<_> = refused
            .iter()
            .map(|(number, rules)| (X32 | number, rules.clone()))
            .collect();
        refused.extend(x32);
    }
    let arch = std::env::consts::ARCH.try_into()?;
    SeccompFilter::new(
        refused.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )?
    .try_into()
}

fn apply_filter(
    program: Result<seccompiler::BpfProgram, seccompiler::BackendError>,
) -> Result<(), String> {
    let program = program.map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))
}

/// The confinement mechanisms a host may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Landlock filesystem rules (ABI 3).
    Landlock,
    /// Landlock's TCP rules and abstract-socket scope (ABI 6) and seccomp;
    /// needed only by grants with `network = "deny"`.
    Network,
}

impl Mechanism {
    pub const ALL: [Self; 2] = [Self::Landlock, Self::Network];

    pub fn name(self) -> &'static str {
        match self {
            Self::Landlock => "landlock",
            Self::Network => "network",
        }
    }

    /// Whether this host can apply the mechanism (tried in the probing
    /// process, which exits right after). `PORTCULLIS_SANDBOX_PRETEND_MISSING`
    /// (names, comma-separated) makes the probe report a mechanism missing:
    /// the tests' way to see a host without it.
    fn probe(self) -> Result<(), String> {
        let pretend = std::env::var("PORTCULLIS_SANDBOX_PRETEND_MISSING").unwrap_or_default();
        if pretend.split(',').any(|name| name == self.name()) {
            return Err("missing (PORTCULLIS_SANDBOX_PRETEND_MISSING)".into());
        }
        match self {
            Self::Landlock => {
                let hard = Ruleset::default().set_compatibility(CompatLevel::HardRequirement);
                required_filesystem_rules(hard)
                    .and_then(|r| r.create().map(drop))
                    .map_err(|e| format!("Landlock: {e}"))
            }
            // Last: the probe exits right after, without sockets.
            Self::Network => landlock(&SandboxArgs::default(), None, true)
                .and_then(|()| apply_filter(priority_filter()))
                .and_then(|()| apply_filter(network_filter())),
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
    /// Core dump size (always 0).
    Core,
    /// How far the nice value may be lowered (always 0: not at all).
    Nice,
}

impl Limit {
    const ALL: [(Self, &'static str); 5] = [
        (Self::Memory, "memory"),
        (Self::FileSize, "file_size"),
        (Self::OpenFiles, "open_files"),
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
    fn parse(arg: &str) -> Result<(Self, u64), String> {
        let bad = || {
            format!(
                "--limit {arg}: expected NAME=N with NAME one of memory, file_size, open_files, core, nice"
            )
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
}

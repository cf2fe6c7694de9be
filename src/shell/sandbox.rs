//! The child's side of a command: the `portcullis-sandbox` launcher, which
//! the daemon starts in place of the program. It confines itself, then
//! execs the program, so everything below applies to the program and to
//! all it starts. (Doing this between fork and exec in the daemon would
//! need `pre_exec`, which is `unsafe`.) The launcher is a small binary of
//! its own: starting the daemon's 90 MB binary for it cost 1.7 ms more.
//!
//! Usage: `portcullis-sandbox [--rw DIR]… [--ro DIR]… [--deny-network]
//! -- PROGRAM [ARG…]`.
//!
//! In order: a session and process group of its own (so the daemon can
//! end the whole group), `no_new_privs` (no setuid gains), no core dumps,
//! and a Landlock ruleset: read and execute the system's program paths,
//! read the granted `ro` roots, read and write the `rw` roots, and, when
//! the grant denies the network, no TCP connect or bind. If the kernel
//! cannot enforce that (Landlock ABI 3, and 4 for the network rules) the
//! launcher refuses to run the program.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, path_beneath_rules,
};

/// Exit status when the sandbox could not be set up (the program never
/// ran); 126/127 follow the shells' "cannot execute" / "not found".
pub const EXIT_SANDBOX: u8 = 125;

/// Paths every program needs to read (and execute from).
const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/proc", "/sys", "/dev",
    "/run",
];
/// Device files programs write to.
const SYSTEM_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/tty", "/dev/full"];

#[derive(Debug, Default)]
pub struct SandboxArgs {
    /// Directories the program may read and write.
    rw: Vec<PathBuf>,
    /// Directories the program may read.
    ro: Vec<PathBuf>,
    /// Deny TCP connect and bind.
    deny_network: bool,
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
                Some("--deny-network") => parsed.deny_network = true,
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
        Err("usage: portcullis-sandbox [--rw DIR]... [--ro DIR]... [--deny-network] -- PROGRAM [ARG...]".into())
    }
}

/// The launcher's `main`.
pub fn main(args: impl Iterator<Item = OsString>) -> ExitCode {
    match SandboxArgs::parse(args) {
        Ok(args) => run(args),
        Err(e) => {
            eprintln!("portcullis-sandbox: {e}");
            ExitCode::from(EXIT_SANDBOX)
        }
    }
}

pub fn run(args: SandboxArgs) -> ExitCode {
    let refuse = |what: String| {
        eprintln!("portcullis sandbox: {what}; the command was not run");
        ExitCode::from(EXIT_SANDBOX)
    };
    if let Err(e) = rustix::process::setsid() {
        return refuse(format!("setsid: {e}"));
    }
    if let Err(e) = rustix::thread::set_no_new_privs(true) {
        return refuse(format!("no_new_privs: {e}"));
    }
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::Core, no_core) {
        return refuse(format!("RLIMIT_CORE: {e}"));
    }
    if let Err(e) = landlock(&args) {
        return refuse(e);
    }
    let Some((program, rest)) = args.command.split_first() else {
        return refuse("no program".into());
    };
    use std::os::unix::process::CommandExt as _;
    // The environment and working directory are the ones the daemon set.
    let error = std::process::Command::new(program).args(rest).exec();
    eprintln!("portcullis sandbox: {}: {error}", program.to_string_lossy());
    ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Landlock as strict as the kernel allows, but never weaker than: the
/// filesystem rights of ABI 3 (which covers truncate), and with
/// `--deny-network` the TCP rules of ABI 4. Those are required; the newer
/// rights (ABI 5's device ioctls) are applied where the kernel has them.
fn landlock(args: &SandboxArgs) -> Result<(), String> {
    let error = |e: landlock::RulesetError| format!("Landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V3))
        .map_err(error)?;
    if args.deny_network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(error)?;
    }
    let newest = ABI::V5;
    let ruleset = ruleset
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(newest))
        .map_err(error)?;
    let (read, all) = (AccessFs::from_read(newest), AccessFs::from_all(newest));
    let status = ruleset
        .create()
        .map_err(error)?
        .add_rules(path_beneath_rules(SYSTEM_READ, read))
        .map_err(error)?
        .add_rules(path_beneath_rules(SYSTEM_WRITE, all))
        .map_err(error)?
        .add_rules(path_beneath_rules(&args.ro, read))
        .map_err(error)?
        .add_rules(path_beneath_rules(&args.rw, all))
        .map_err(error)?
        .restrict_self()
        .map_err(error)?;
    match status.ruleset {
        // Partially: only the best-effort rights are missing (the required
        // ones would have failed above).
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err("Landlock is not enforced on this kernel".into()),
    }
}

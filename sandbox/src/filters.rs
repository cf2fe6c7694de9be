//! The seccomp filters a command runs under, each refusing a few calls
//! and allowing the rest: Landlock and the namespaces decide what a
//! command may reach; these close what neither sees.

use crate::SetupError;

/// Every command's seccomp filter, applied before the command is known
/// (`Prepared`). The calls that change another process's priority,
/// scheduling policy, I/O priority or rlimits fail with `EACCES` unless
/// they name the caller itself (pid 0): the kernel lets a process do that
/// to any process of the same user — the daemon and every other
/// principal's commands — and Landlock does not scope it. (CPU affinity
/// stays allowed: `pthread_setaffinity_np` names a program's own threads by
/// id, and pinning the daemon slows it at worst.)
pub(crate) fn priority() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
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

/// The seccomp half of `network_rules` (lib.rs), a second filter stacked on
/// [`priority`] for a command whose grant denies the network. Two
/// filters rather than one, because installing one costs about 1 µs per
/// instruction (the kernel works out which syscalls it always allows):
/// the first is installed while every launcher waits, this short one too
/// in a launcher started for such a command, else after the request has
/// arrived.
pub(crate) fn network() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
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
    refused: Vec<(i64, Vec<seccompiler::SeccompRule>)>,
) -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    refusing_with(libc::EACCES, refused)
}

/// [`refusing`], failing with `errno`.
fn refusing_with(
    errno: i32,
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
        SeccompAction::Errno(errno as u32),
        arch,
    )?
    .try_into()
}

pub(crate) fn apply(
    program: Result<seccompiler::BpfProgram, seccompiler::BackendError>,
) -> Result<(), SetupError> {
    Ok(seccompiler::apply_filter(&program?)?)
}

/// The calls no command needs and a sandbox escape would: tracing or
/// reading other processes (`ptrace`, `process_vm_*`), io_uring (a second
/// path to syscalls seccomp cannot see), mounting and new namespaces (the
/// namespaces a command runs in are made for it, never by it), kernel
/// keyrings, BPF and perf events, and loading kernel code. All fail with
/// `EPERM`. `clone3` fails with `ENOSYS` — its flags are in memory, out of
/// a filter's reach — so C libraries fall back to `clone`, whose flags
/// are checked here.
pub(crate) fn hardening() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let new_namespace = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ]
    .into_iter()
    .map(|flag| {
        let flag = flag as u64;
        let op = SeccompCmpOp::MaskedEq(flag);
        SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            op,
            flag,
        )?])
    })
    .collect::<Result<Vec<_>, _>>()?;
    let always = [
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
    ];
    let mut refused: Vec<(i64, Vec<SeccompRule>)> =
        always.into_iter().map(|n| (n, Vec::new())).collect();
    refused.push((libc::SYS_clone, new_namespace));
    refusing_with(libc::EPERM, refused)
}

/// The second half of [`hardening`]: `clone3` fails with `ENOSYS`.
pub(crate) fn no_clone3() -> Result<seccompiler::BpfProgram, seccompiler::BackendError> {
    refusing_with(libc::ENOSYS, vec![(libc::SYS_clone3, Vec::new())])
}

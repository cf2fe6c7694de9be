//! Launchers started ahead of need. Starting `portcullis-sandbox` costs
//! about 1 ms on a small VM (an exec), more than most commands it runs. So
//! a piped command takes a launcher that was started with
//! `--args-on-stdin`, has made its session and waits for its arguments,
//! and another is started in the background to take its place.
//!
//! An idle launcher holds nothing of any request: an empty environment, `/`
//! as its working directory, no rights beyond the daemon's. It builds the
//! command's world while it waits (its namespaces and mounts, see the
//! sandbox crate's `world.rs`, the slowest part of a start: about 8 ms),
//! and inside it all the confinement that depends on the world alone:
//! its own bounded `/tmp`, capabilities dropped, Landlock and the seccomp
//! filters (about 2 ms more here, which a request used to wait for). So the
//! world's shape — the grant's roots, whether it has the network, its
//! `/tmp` size, what a best-effort grant goes without — is what the pool
//! keys launchers by ([`Kind`]); what depends on the request (environment,
//! working directory, rlimits) comes with the arguments. On a host without
//! namespaces (a best-effort grant) the launcher waits without a world, and
//! may apply the network's seccomp filter ahead ([`Kind::Plain`]). A command is
//! never given a launcher of another kind: the launcher checks too. When
//! the daemon exits, the idle launchers' stdin closes and they exit
//! without running anything.
//!
//! A world whose one way out is the egress proxy gets a directory of its
//! own for the proxy's socket when its launcher is started ([`Waiting`]);
//! the daemon listens there once a command takes it.
//!
//! Launchers are started by a thread of their own at the lowest CPU
//! priority, so that building the next world does not compete with the
//! command just released: on two cores that competition cost about 0.6 ms
//! of every `exec true`. Where commands get cgroups with a `cpu`
//! controller, a waiting launcher's cgroup has the lowest CPU weight, which
//! covers everything in its world, and the default comes back with the
//! command's limits, before the release. Elsewhere the thread starts them at
//! nice 19 (a child starts with its parent thread's nice value): a
//! launcher gets the daemon's priority back when it is taken (the daemon
//! renices it, so the rest of its start-up is not starved on a busy
//! machine), and again from its own side as soon as its arguments arrive
//! (`--nice`, [`Launchers::restored_nice`]), before it sets anything up;
//! that needs `RLIMIT_NICE` ≥ 20 (raised here with `CAP_SYS_RESOURCE`),
//! which the launcher inside a world relies on, and the `setpriority`
//! system call, which the shipped unit refuses. Where neither can be had,
//! launchers start at the daemon's priority. When the pool has run dry,
//! demand is outrunning the starter: it then starts launchers at the
//! daemon's priority until one waits again.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use portcullis_sandbox::Mechanism;
use rustix::process::Pid;
use tokio::process::{Child, Command};
use tokio::runtime::Handle;

use super::cgroup::{CommandCgroup, Controller};
use super::{launcher_path, provider_error};
use crate::egress::{Egress, EgressDir};
use portcullis_wire::frame::ErrorBody;

/// Idle launchers kept of each kind: enough for commands run one after
/// another, or two at a time, to find one waiting.
const IDLE: usize = 2;
/// How long a launcher taken from a pool that still has one waiting lets
/// its command run before its replacement is started: about what a world
/// takes to build. A world built at that moment slows the command just
/// released, even at the lowest CPU priority (bench/README.md); the one
/// still waiting covers the next command meanwhile. A take sooner than
/// this after the last one of its kind starts the replacement at once.
const REFILL_AFTER: std::time::Duration = std::time::Duration::from_millis(10);
/// Kinds kept idle launchers of; the one used longest ago gives way.
const KINDS: usize = 8;

/// The network of a command's world.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum WorldNetwork {
    /// The host's.
    Host,
    /// None: its own empty network namespace (`--deny-network`).
    Empty,
    /// Its own, whose one way out is the egress proxy (`--egress DIR`, a
    /// directory of each launcher's own).
    Proxied,
}

/// What a launcher prepares while it waits, and so which commands it may
/// take.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(super) enum Kind {
    /// The command's world (`--world`): its roots, read-write and
    /// read-only, and whether the network is denied (its own empty
    /// network namespace).
    World {
        rw: Vec<PathBuf>,
        ro: Vec<PathBuf>,
        network: WorldNetwork,
        /// What of `/etc` it covers: a new look makes a new kind, so no
        /// launcher built before it runs a command after it.
        hidden: Arc<[PathBuf]>,
        /// Its own `/tmp` and `/dev/shm`'s size (`--tmp-size`), and what a
        /// best-effort grant's commands go without (`--skip`): the
        /// launcher inside mounts and confines itself before it is taken.
        tmp_size: Option<u64>,
        skip: Vec<Mechanism>,
    },
    /// No world (a host without namespaces); `filtered`: the network's
    /// seccomp filter applied ahead (`--deny-network`).
    Plain { filtered: bool },
}

impl Kind {
    /// The flags after `--args-on-stdin`, for a launcher whose egress
    /// directory (a `Proxied` world's) is `egress` and whose cgroup is
    /// `cgroup`.
    fn flags(&self, egress: Option<&EgressDir>, cgroup: Option<&CommandCgroup>) -> Vec<OsString> {
        let mut flags: Vec<OsString> = Vec::new();
        for dir in cgroup.into_iter().flat_map(CommandCgroup::dirs) {
            flags.extend(["--cgroup".into(), dir.into()]);
        }
        match self {
            Self::World {
                rw,
                ro,
                network,
                hidden,
                tmp_size,
                skip,
            } => {
                flags.push("--world".into());
                match (network, egress) {
                    (WorldNetwork::Host, _) => {}
                    (WorldNetwork::Proxied, Some(dir)) => {
                        flags.extend(["--egress".into(), dir.path().into()]);
                    }
                    // Without its directory a proxied world has no way
                    // out at all (`start` always makes one).
                    (WorldNetwork::Empty | WorldNetwork::Proxied, _) => {
                        flags.push("--deny-network".into());
                    }
                }
                for dir in rw {
                    flags.extend(["--rw".into(), dir.into()]);
                }
                for dir in ro {
                    flags.extend(["--ro".into(), dir.into()]);
                }
                flags.push("--etc-looked".into());
                for path in hidden.iter() {
                    flags.extend(["--hide".into(), path.into()]);
                }
                if let Some(bytes) = tmp_size {
                    flags.extend(["--tmp-size".into(), bytes.to_string().into()]);
                }
                for mechanism in skip {
                    flags.extend(["--skip".into(), mechanism.name().into()]);
                }
            }
            Self::Plain { filtered: true } => flags.push("--deny-network".into()),
            Self::Plain { filtered: false } => {}
        }
        flags
    }
}

/// A launcher waiting for its arguments, and (a `Proxied` world's) the
/// directory its egress socket will be made in.
pub(super) struct Waiting {
    pub child: Child,
    pub egress: Option<EgressDir>,
    /// The cgroup it joined first thing, where the host has cgroups.
    pub cgroup: Option<CommandCgroup>,
}

#[derive(Default)]
struct Pool {
    /// Each kind is topped up once it has been used.
    idle: HashMap<Kind, Vec<Waiting>>,
    /// Being started in the background.
    starting: HashMap<Kind, usize>,
    /// Kinds and when a launcher of each was last taken, most recent last.
    recent: Vec<(Kind, std::time::Instant)>,
}

impl Pool {
    /// Notes `kind` as used `now`; a kind pushed out drops its launchers.
    /// Returns when it was used before.
    fn used(&mut self, kind: &Kind, now: std::time::Instant) -> Option<std::time::Instant> {
        let before = self.recent.iter().position(|(k, _)| k == kind);
        let last = before.map(|i| self.recent.remove(i).1);
        self.recent.push((kind.clone(), now));
        if self.recent.len() > KINDS {
            let (old, _) = self.recent.remove(0);
            self.idle.remove(&old);
        }
        last
    }

    fn is_recent(&self, kind: &Kind) -> bool {
        self.recent.iter().any(|(k, _)| k == kind)
    }
}

fn with_pool<T>(pool: &Mutex<Pool>, f: impl FnOnce(&mut Pool) -> T) -> T {
    f(&mut pool.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The launchers waiting for their arguments, and the thread that starts
/// more (made at the first use). The shell provider owns one.
pub(super) struct Launchers {
    pool: Arc<Mutex<Pool>>,
    starter: OnceLock<Starter>,
    /// Where `Proxied` worlds' socket directories come from.
    egress: Arc<Egress>,
}

impl Launchers {
    pub(super) fn new(egress: Arc<Egress>) -> Self {
        Self {
            pool: Arc::default(),
            starter: OnceLock::new(),
            egress,
        }
    }

    /// A launcher waiting for its arguments on stdin: an idle one if there
    /// is one, else one started now — on a blocking thread, since a spawn
    /// waits for the child's exec and would stall every session on this
    /// runtime worker meanwhile. Either way the idle ones are topped up:
    /// [`REFILL_AFTER`] later if one still waits, else at once.
    pub(super) async fn take(&self, kind: Kind) -> Result<Waiting, ErrorBody> {
        let (idle, refill_now) = with_pool(&self.pool, |pool| {
            let now = std::time::Instant::now();
            let last = pool.used(&kind, now);
            let idle = pool.idle.entry(kind.clone()).or_default();
            // One that exited while idle (killed from outside) is dropped.
            let taken = std::iter::from_fn(|| idle.pop()).find_map(|mut waiting| {
                matches!(waiting.child.try_wait(), Ok(None)).then_some(waiting)
            });
            let in_a_burst = last.is_some_and(|last| now - last < REFILL_AFTER);
            (taken, idle.is_empty() || in_a_burst)
        });
        match refill_now {
            true => self.refill(kind.clone()),
            false => {
                let (pool, requests) = (self.pool.clone(), self.starter().requests.clone());
                let kind = kind.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(REFILL_AFTER).await;
                    refill(&pool, &requests, kind);
                });
            }
        }
        match idle {
            Some(waiting) => {
                let pid = waiting.child.id().and_then(|id| Pid::from_raw(id as i32));
                if let (Some(nice), Some(pid)) = (self.restored_nice(), pid) {
                    // Its whole group, the world's processes too (the
                    // launcher is the group's leader). Best effort: the
                    // launcher takes it back itself too, where it may.
                    let _ = rustix::process::setpriority_pgrp(Some(pid), nice);
                }
                Ok(waiting)
            }
            None => {
                let (answer, started) = tokio::sync::oneshot::channel();
                let asked = self.starter().now.send((kind, Handle::current(), answer));
                match asked {
                    Ok(()) => started.await.unwrap_or_else(|_| {
                        Err(provider_error(
                            "cannot start the command: the launcher thread ended",
                        ))
                    }),
                    Err(_) => Err(provider_error(
                        "cannot start the command: the launcher thread ended",
                    )),
                }
            }
        }
    }

    /// Has the starter thread start launchers of `kind` until `IDLE` are
    /// idle or starting.
    fn refill(&self, kind: Kind) {
        refill(&self.pool, &self.starter().requests, kind);
    }

    /// The nice value a launcher from the pool is to take back (`--nice`):
    /// the daemon's, when launchers are started below it.
    pub(super) fn restored_nice(&self) -> Option<i32> {
        self.starter().restored_nice
    }

    fn starter(&self) -> &Starter {
        self.starter
            .get_or_init(|| Starter::new(self.pool.clone(), self.egress.clone()))
    }
}

/// Asks the starter for as many launchers of `kind` as the pool lacks
/// (none if it is full, or they are being started already).
fn refill(pool: &Mutex<Pool>, requests: &mpsc::Sender<StartRequest>, kind: Kind) {
    let wanted = with_pool(pool, |pool| {
        if !pool.is_recent(&kind) {
            return 0; // pushed out meanwhile
        }
        let idle = pool.idle.get(&kind).map_or(0, Vec::len);
        let starting = pool.starting.entry(kind.clone()).or_default();
        let wanted = IDLE.saturating_sub(idle + *starting);
        *starting += wanted;
        wanted
    });
    if wanted > 0 {
        let request = (wanted, kind.clone(), Handle::current());
        if requests.send(request).is_err() {
            with_pool(pool, |pool| {
                pool.starting.entry(kind).and_modify(|n| *n -= wanted);
            });
        }
    }
}

/// Starts a launcher of `kind`; with `lowest_weight`, in a cgroup of the
/// lowest CPU weight (where there is a `cpu` controller).
fn start(kind: &Kind, egress: &Egress, lowest_weight: bool) -> Result<Waiting, ErrorBody> {
    let dir = match kind {
        Kind::World {
            network: WorldNetwork::Proxied,
            ..
        } => Some(super::egress_dir(egress)?),
        _ => None,
    };
    let mut cgroup = super::command_cgroup()?;
    if lowest_weight
        && let Some(cgroup) = cgroup.as_mut()
        && let Err(e) = cgroup.lower_cpu_weight()
    {
        tracing::debug!("a launcher waits at the default CPU weight: {e}");
    }
    let mut command = Command::new(launcher_path()?);
    command
        .arg("--args-on-stdin")
        .args(kind.flags(dir.as_ref(), cgroup.as_ref()));
    let child = command
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| provider_error(format!("cannot start the command: {e}")))?;
    Ok(Waiting {
        child,
        egress: dir,
        cgroup,
    })
}

struct Starter {
    /// How many launchers of which kind to start, and the runtime their
    /// `Child` lives in. Dropping it ends the thread.
    requests: mpsc::Sender<StartRequest>,
    /// One launcher to start at once, for a command waiting for it (the
    /// pool ran dry), on a thread of its own at the daemon's priority.
    now: mpsc::Sender<StartNow>,
    restored_nice: Option<i32>,
}

/// How many launchers of which kind to start, and the runtime their
/// `Child` lives in.
type StartRequest = (usize, Kind, Handle);

type StartNow = (
    Kind,
    Handle,
    tokio::sync::oneshot::Sender<Result<Waiting, ErrorBody>>,
);

/// The lowest priority: the scheduler gives it the cores only when
/// nothing else wants them.
const LOWEST_NICE: i32 = 19;

impl Starter {
    /// Starts the thread that fills `pool`.
    fn new(pool: Arc<Mutex<Pool>>, egress: Arc<Egress>) -> Self {
        let egress_now = egress.clone();
        let daemon_nice = rustix::process::getpriority_process(None).unwrap_or(0);
        let by_weight = super::host_cgroups().has(Controller::Cpu);
        let restored_nice = match by_weight {
            true => {
                tracing::debug!("launchers wait in cgroups of the lowest CPU weight");
                None
            }
            false => match can_restore(daemon_nice) {
                Ok(()) => {
                    tracing::debug!("launchers are started at nice {LOWEST_NICE}");
                    Some(daemon_nice)
                }
                Err(why) => {
                    tracing::info!(
                        "launchers are started at the daemon's CPU priority: commands have no \
                         cgroup with a cpu controller, and {why}"
                    );
                    None
                }
            },
        };
        let (requests, received) = mpsc::channel::<StartRequest>();
        let lowered = restored_nice.is_some();
        let thread = std::thread::Builder::new()
            .name("launcher-starter".into())
            .spawn(move || {
                // Linux keeps a nice value per thread: this changes only
                // this thread, and the launchers it starts.
                let mut current = daemon_nice;
                for (wanted, kind, runtime) in received {
                    let _entered = runtime.enter();
                    for _ in 0..wanted {
                        let dry =
                            with_pool(&pool, |pool| pool.idle.get(&kind).is_none_or(Vec::is_empty));
                        let nice = if lowered && !dry {
                            LOWEST_NICE
                        } else {
                            daemon_nice
                        };
                        if nice != current
                            && rustix::process::setpriority_process(None, nice).is_ok()
                        {
                            current = nice;
                        }
                        let started = start(&kind, &egress, by_weight && !dry);
                        with_pool(&pool, |pool| {
                            pool.starting.entry(kind.clone()).and_modify(|n| *n -= 1);
                            // A kind pushed out meanwhile keeps none.
                            if pool.is_recent(&kind) {
                                pool.idle
                                    .entry(kind.clone())
                                    .or_default()
                                    .extend(started.ok());
                            }
                        });
                    }
                }
            });
        if let Err(e) = thread {
            tracing::warn!("cannot start the launcher-starter thread: {e}");
        }
        // Launchers are started only from these two threads, which live
        // as long as the daemon: a launcher dies when the thread that
        // started it ends (its parent-death signal, see the sandbox crate).
        let (now, urgent) = mpsc::channel::<StartNow>();
        let urgent_thread = std::thread::Builder::new()
            .name("launcher-now".into())
            .spawn(move || {
                for (kind, runtime, answer) in urgent {
                    let _entered = runtime.enter();
                    let _ = answer.send(start(&kind, &egress_now, false));
                }
            });
        if let Err(e) = urgent_thread {
            tracing::warn!("cannot start the launcher-now thread: {e}");
        }
        Self {
            requests,
            now,
            restored_nice,
        }
    }
}

/// Whether a thread of this process may lower its priority to the
/// lowest and take `nice` back, as a launcher must: tried on a thread that
/// then ends.
fn can_restore(nice: i32) -> Result<(), NiceError> {
    if nice >= LOWEST_NICE {
        return Err(NiceError::AlreadyLowest(nice));
    }
    // The launcher inside a command's world has no capability in the
    // host's user namespace: it takes the priority back under RLIMIT_NICE
    // alone (the daemon's renice of its group can miss a process forked at
    // that moment). So the limit must allow it, raised here if it may be;
    // the launchers inherit it.
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = (20 - nice) as u64;
    let limit = getrlimit(Resource::Nice);
    if limit.current.is_some_and(|current| current < needed) {
        let raised = Rlimit {
            current: Some(needed),
            maximum: limit.maximum.map(|max| max.max(needed)),
        };
        setrlimit(Resource::Nice, raised).map_err(|source| NiceError::Limit {
            current: limit.current.unwrap_or_default(),
            needed,
            source,
        })?;
    }
    let tried = std::thread::spawn(move || {
        rustix::process::setpriority_process(None, LOWEST_NICE).map_err(NiceError::Lower)?;
        rustix::process::setpriority_process(None, nice)
            .map_err(|source| NiceError::TakeBack { nice, source })
    });
    tried.join().unwrap_or(Err(NiceError::ProbeFailed))
}

/// Why launchers cannot wait at the lowest priority (they then wait at the
/// daemon's).
#[derive(Debug, thiserror::Error)]
enum NiceError {
    #[error("the daemon runs at nice {0} already")]
    AlreadyLowest(i32),
    #[error("setpriority: {0}")]
    Lower(rustix::io::Errno),
    #[error(
        "taking nice {nice} back: {source} (RLIMIT_NICE must be at least {}, as \
         `LimitNICE=+0` sets it for nice 0 in a unit that allows setpriority, or the daemon \
         needs CAP_SYS_NICE)",
        20 - nice
    )]
    TakeBack {
        nice: i32,
        source: rustix::io::Errno,
    },
    #[error(
        "RLIMIT_NICE is {current} and cannot be raised to {needed} ({source}): a command's \
         launcher could not take its priority back inside its world (`LimitNICE=+0` in a \
         unit sets it)"
    )]
    Limit {
        current: u64,
        needed: u64,
        source: rustix::io::Errno,
    },
    #[error("the probe thread failed")]
    ProbeFailed,
}

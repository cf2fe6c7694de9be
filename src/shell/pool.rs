//! Launchers started ahead of need. Starting `portcullis-sandbox` costs
//! about 1 ms on a small VM (an exec), more than most commands it runs. So
//! a piped command takes a launcher that was started with
//! `--args-on-stdin`, has made its session and waits for its arguments,
//! and another is started in the background to take its place.
//!
//! An idle launcher holds nothing of any request: an empty environment, `/`
//! as its working directory, no rights beyond the daemon's. What is the
//! same for every command (`no_new_privs`, the seccomp filter on priority
//! calls) it applies while it waits; what depends on the grant (roots,
//! rlimits, Landlock) after its arguments arrive. The network's seccomp
//! filter is the one part of a grant's sandbox it may apply ahead: the pool
//! keeps launchers of each [`Net`] apart, so a command that may use the
//! network never gets one without it. When the daemon exits, the idle
//! launchers' stdin closes and they exit without running anything.
//!
//! Launchers are started by a thread of their own at the lowest CPU
//! priority (a child starts with its parent thread's nice value), so that
//! starting the next one does not compete with the command just released:
//! on two cores that competition cost about 0.6 ms of every `exec true`.
//! A launcher gets the daemon's priority back when it is taken (the daemon
//! renices it, so the rest of its start-up is not starved on a busy
//! machine), and again from its own side as soon as its arguments arrive
//! (`--nice`, [`Launchers::restored_nice`]), before it sets anything up. When the pool
//! has run dry, demand is outrunning the starter: it then starts launchers
//! at the daemon's priority until one waits again. All this needs
//! `RLIMIT_NICE` ≥ 20 (the unit's `LimitNICE=+0`) or `CAP_SYS_NICE`; where
//! a probe finds neither, launchers start at the daemon's priority.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use rustix::process::Pid;
use tokio::process::{Child, Command};
use tokio::runtime::Handle;

use super::{launcher_path, provider_error};
use portcullis_wire::frame::ErrorBody;

/// Idle launchers kept: enough for commands run one after another, or two
/// at a time, to find one waiting.
const IDLE: usize = 2;

/// Whether a launcher has applied the network's seccomp filter while it
/// waited (`--args-on-stdin --deny-network`): only for a grant that denies
/// the network on a host that has the mechanism.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Net {
    Open,
    Filtered,
}

#[derive(Default)]
struct Pool {
    /// Indexed by [`Net`]: each kind is topped up once it has been used.
    idle: [Vec<Child>; 2],
    /// Being started in the background.
    starting: [usize; 2],
}

fn with_pool<T>(pool: &Mutex<Pool>, f: impl FnOnce(&mut Pool) -> T) -> T {
    f(&mut pool.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The launchers waiting for their arguments, and the thread that starts
/// more (made at the first use). The shell provider owns one.
#[derive(Default)]
pub(super) struct Launchers {
    pool: Arc<Mutex<Pool>>,
    starter: OnceLock<Starter>,
}

impl Launchers {
    /// A launcher waiting for its arguments on stdin: an idle one if there
    /// is one, else one started now — on a blocking thread, since a spawn
    /// waits for the child's exec and would stall every session on this
    /// runtime worker meanwhile. Either way the idle ones are topped up.
    pub(super) async fn take(&self, net: Net) -> Result<Child, ErrorBody> {
        let idle = with_pool(&self.pool, |pool| {
            // One that exited while idle (killed from outside) is dropped.
            std::iter::from_fn(|| pool.idle[net as usize].pop())
                .find_map(|mut child| matches!(child.try_wait(), Ok(None)).then_some(child))
        });
        self.refill(net);
        match idle {
            Some(child) => {
                let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
                if let (Some(nice), Some(pid)) = (self.restored_nice(), pid) {
                    // Best effort: the launcher takes it back itself too.
                    let _ = rustix::process::setpriority_process(Some(pid), nice);
                }
                Ok(child)
            }
            None => tokio::task::spawn_blocking(move || start(net))
                .await
                .unwrap_or_else(|e| Err(provider_error(format!("cannot start the command: {e}")))),
        }
    }

    /// Has the starter thread start launchers of `net` until `IDLE` are
    /// idle or starting.
    fn refill(&self, net: Net) {
        let i = net as usize;
        let wanted = with_pool(&self.pool, |pool| {
            let wanted = IDLE.saturating_sub(pool.idle[i].len() + pool.starting[i]);
            pool.starting[i] += wanted;
            wanted
        });
        if wanted > 0 {
            let request = (wanted, net, Handle::current());
            if self.starter().requests.send(request).is_err() {
                with_pool(&self.pool, |pool| pool.starting[i] -= wanted);
            }
        }
    }

    /// The nice value a launcher from the pool is to take back (`--nice`):
    /// the daemon's, when launchers are started below it.
    pub(super) fn restored_nice(&self) -> Option<i32> {
        self.starter().restored_nice
    }

    fn starter(&self) -> &Starter {
        self.starter.get_or_init(|| Starter::new(self.pool.clone()))
    }
}

fn start(net: Net) -> Result<Child, ErrorBody> {
    let mut command = Command::new(launcher_path()?);
    command.arg("--args-on-stdin");
    if net == Net::Filtered {
        command.arg("--deny-network");
    }
    command
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| provider_error(format!("cannot start the command: {e}")))
}

struct Starter {
    /// How many launchers of which kind to start, and the runtime their
    /// `Child` lives in. Dropping it ends the thread.
    requests: mpsc::Sender<(usize, Net, Handle)>,
    restored_nice: Option<i32>,
}

/// The lowest priority: the scheduler gives it the cores only when
/// nothing else wants them.
const LOWEST_NICE: i32 = 19;

impl Starter {
    /// Starts the thread that fills `pool`.
    fn new(pool: Arc<Mutex<Pool>>) -> Self {
        let daemon_nice = rustix::process::getpriority_process(None).unwrap_or(0);
        let restored_nice = match can_restore(daemon_nice) {
            Ok(()) => {
                tracing::debug!("launchers are started at nice {LOWEST_NICE}");
                Some(daemon_nice)
            }
            Err(why) => {
                tracing::info!("launchers are started at the daemon's CPU priority: {why}");
                None
            }
        };
        let (requests, received) = mpsc::channel::<(usize, Net, Handle)>();
        let lowered = restored_nice.is_some();
        let thread = std::thread::Builder::new()
            .name("launcher-starter".into())
            .spawn(move || {
                // Linux keeps a nice value per thread: this changes only
                // this thread, and the launchers it starts.
                let mut current = daemon_nice;
                for (wanted, net, runtime) in received {
                    let (_entered, i) = (runtime.enter(), net as usize);
                    for _ in 0..wanted {
                        let dry = with_pool(&pool, |pool| pool.idle[i].is_empty());
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
                        let started = start(net);
                        with_pool(&pool, |pool| {
                            pool.starting[i] -= 1;
                            pool.idle[i].extend(started.ok());
                        });
                    }
                }
            });
        if let Err(e) = thread {
            tracing::warn!("cannot start the launcher-starter thread: {e}");
        }
        Self {
            requests,
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
        "taking nice {nice} back: {source} (RLIMIT_NICE must be at least {}, as the unit's \
         LimitNICE=+0 sets it for nice 0, or the daemon needs CAP_SYS_NICE)",
        20 - nice
    )]
    TakeBack {
        nice: i32,
        source: rustix::io::Errno,
    },
    #[error("the probe thread failed")]
    ProbeFailed,
}

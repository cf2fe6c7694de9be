//! Launchers started ahead of need. Starting `portcullis-sandbox` costs
//! about 2 ms on a small VM — an exec, and for a grant that denies the
//! network a namespace — more than most commands it runs. So a piped
//! command takes a launcher that was started with `--args-on-stdin`, has
//! made its session (and network namespace) and waits for its arguments,
//! and another is started in the background to take its place.
//!
//! An idle launcher holds nothing of any request: an empty environment, `/`
//! as its working directory, no rights beyond the daemon's. Everything a
//! command is confined by (roots, rlimits, `no_new_privs`, Landlock) is
//! applied after its arguments arrive. When the daemon exits, the idle
//! launchers' stdin closes and they exit without running anything.

use std::sync::{Mutex, OnceLock};

use tokio::process::{Child, Command};

use super::{launcher_path, provider_error};
use crate::frame::ErrorBody;

/// Idle launchers kept of each kind: enough for commands run one after
/// another, or two at a time, to find one waiting.
const IDLE: usize = 2;

/// The launchers of one kind: with a network namespace of their own, or
/// without.
#[derive(Default)]
struct Kind {
    idle: Vec<Child>,
    /// Being started in the background.
    starting: usize,
}

fn kinds() -> &'static Mutex<[Kind; 2]> {
    static KINDS: OnceLock<Mutex<[Kind; 2]>> = OnceLock::new();
    KINDS.get_or_init(Mutex::default)
}

fn with_kind<T>(network_namespace: bool, f: impl FnOnce(&mut Kind) -> T) -> T {
    let mut kinds = kinds().lock().unwrap_or_else(|e| e.into_inner());
    f(&mut kinds[usize::from(network_namespace)])
}

/// A launcher waiting for its arguments on stdin: an idle one if there is
/// one, else one started now. Either way the idle ones are topped up.
pub(super) fn launcher(network_namespace: bool) -> Result<Child, ErrorBody> {
    let idle = with_kind(network_namespace, |kind| {
        // One that exited while idle (killed from outside) is dropped.
        std::iter::from_fn(|| kind.idle.pop())
            .find_map(|mut child| matches!(child.try_wait(), Ok(None)).then_some(child))
    });
    refill(network_namespace);
    match idle {
        Some(child) => Ok(child),
        None => start(network_namespace),
    }
}

fn start(network_namespace: bool) -> Result<Child, ErrorBody> {
    let mut command = Command::new(launcher_path()?);
    command.arg("--args-on-stdin");
    if network_namespace {
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

/// Starts launchers in the background until `IDLE` are idle or starting
/// (on a blocking thread: a spawn waits for the child's exec).
fn refill(network_namespace: bool) {
    let wanted = with_kind(network_namespace, |kind| {
        let wanted = IDLE.saturating_sub(kind.idle.len() + kind.starting);
        kind.starting += wanted;
        wanted
    });
    if wanted == 0 {
        return;
    }
    tokio::task::spawn_blocking(move || {
        for _ in 0..wanted {
            let started = start(network_namespace);
            with_kind(network_namespace, |kind| {
                kind.starting -= 1;
                kind.idle.extend(started.ok());
            });
        }
    });
}

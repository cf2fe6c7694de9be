//! Launchers started ahead of need. Starting `portcullis-sandbox` costs
//! about 1 ms on a small VM (an exec), more than most commands it runs. So
//! a piped command takes a launcher that was started with
//! `--args-on-stdin`, has made its session and waits for its arguments,
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

/// Idle launchers kept: enough for commands run one after another, or two
/// at a time, to find one waiting.
const IDLE: usize = 2;

#[derive(Default)]
struct Pool {
    idle: Vec<Child>,
    /// Being started in the background.
    starting: usize,
}

fn with_pool<T>(f: impl FnOnce(&mut Pool) -> T) -> T {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    let mut pool = POOL
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    f(&mut pool)
}

/// A launcher waiting for its arguments on stdin: an idle one if there is
/// one, else one started now. Either way the idle ones are topped up.
pub(super) fn launcher() -> Result<Child, ErrorBody> {
    let idle = with_pool(|pool| {
        // One that exited while idle (killed from outside) is dropped.
        std::iter::from_fn(|| pool.idle.pop())
            .find_map(|mut child| matches!(child.try_wait(), Ok(None)).then_some(child))
    });
    refill();
    match idle {
        Some(child) => Ok(child),
        None => start(),
    }
}

fn start() -> Result<Child, ErrorBody> {
    Command::new(launcher_path()?)
        .arg("--args-on-stdin")
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
fn refill() {
    let wanted = with_pool(|pool| {
        let wanted = IDLE.saturating_sub(pool.idle.len() + pool.starting);
        pool.starting += wanted;
        wanted
    });
    if wanted == 0 {
        return;
    }
    tokio::task::spawn_blocking(move || {
        for _ in 0..wanted {
            let started = start();
            with_pool(|pool| {
                pool.starting -= 1;
                pool.idle.extend(started.ok());
            });
        }
    });
}

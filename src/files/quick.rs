//! A few threads of their own for file operations that take a few system
//! calls: `file.stat` (unless `ops::stat_cached` answered it on the
//! runtime worker), `file.mkdir` and inline `file.read`.
//!
//! The main runtime's blocking pool starts a thread whenever none is idle,
//! so under load it holds one per operation in flight (~170 at 256 stats
//! in flight in the bench) and wakes a sleeping one for nearly every
//! operation, a large share of a stat's cost (bench/README.md). Here the
//! blocking pool of a second, otherwise idle runtime is capped at
//! [`THREADS`]: its threads go from one queued operation to the next
//! without sleeping while there are any.
//!
//! Only operations with a bounded amount of work come here. Streams (a
//! slow reader would hold a thread), listings, searches, copies and
//! deletes stay on the main blocking pool. A file system that hangs (a
//! dead network mount) can still hold all of these threads; then these
//! operations wait in the queue, and the others go on. The queue has no
//! bound of its own: the requests in flight (per session and sessions per
//! gateway) bound it, as they bound the main pool.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// The threads that run quick operations.
pub(super) const THREADS: usize = 16;

/// The runtime whose blocking pool runs them; `None` when it could not be
/// built (then the main pool serves).
fn runtime() -> Option<&'static Runtime> {
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            Builder::new_current_thread()
                .max_blocking_threads(THREADS)
                .thread_name("file-quick")
                .build()
                .inspect_err(|e| {
                    tracing::warn!("no quick file threads ({e}); using the blocking pool")
                })
                .ok()
        })
        .as_ref()
}

/// Starts `op` on a quick thread (or the main blocking pool).
pub(super) fn spawn<T: Send + 'static>(op: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    match runtime() {
        Some(runtime) => runtime.spawn_blocking(op),
        None => tokio::task::spawn_blocking(op),
    }
}

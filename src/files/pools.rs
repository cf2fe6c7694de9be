//! Threads of their own for file operations with a bounded amount of
//! work, in two pools:
//!
//! - *quick*: operations of a few system calls: `file.stat` (unless
//!   `ops::stat_cached` answered it on the runtime worker), `file.mkdir`
//!   and inline `file.read`;
//! - *writes*: inline `file.write`, `file.append` and `file.edit`, each a
//!   few system calls and two `fsync`s, kept apart so that a slow disk's
//!   syncs never queue a stat.
//!
//! The main runtime's blocking pool starts a thread whenever none is idle,
//! so under load it holds one per operation in flight (~170 at 256 stats
//! in flight in the bench) and wakes a sleeping one for nearly every
//! operation, a large share of a stat's cost (bench/README.md); 256 writes
//! in flight into one directory spent a quarter of the gateway's CPU
//! spinning on that directory's lock. Here the blocking pool of a second,
//! otherwise idle runtime is capped: its threads go from one queued
//! operation to the next without sleeping while there are any.
//!
//! Only operations with a bounded amount of work come here. Streams (a
//! slow reader or writer would hold a thread; what of a streamed read the
//! page cache lacks), listings, searches, copies and deletes stay on the
//! main blocking pool. A file system that hangs (a dead network mount) can
//! still hold all of a pool's threads; then its operations wait in the
//! queue, and the others go on. The queue has no bound of its own: the
//! requests in flight (per session and sessions per gateway) bound it, as
//! they bound the main pool.

use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;

/// The threads that run quick operations.
pub(super) const QUICK_THREADS: usize = 16;

/// The threads that run inline writes.
pub(super) const WRITE_THREADS: usize = 8;

/// A second runtime, whose blocking pool runs one kind of these
/// operations; or, when it could not be built, the main pool.
pub(super) struct Pool(Option<Runtime>);

impl Pool {
    /// The pool for quick operations.
    pub(super) fn quick() -> Self {
        Self::new("file-quick", QUICK_THREADS)
    }

    /// The pool for inline writes.
    pub(super) fn writes() -> Self {
        Self::new("file-write", WRITE_THREADS)
    }

    fn new(name: &str, threads: usize) -> Self {
        let runtime = Builder::new_current_thread()
            .max_blocking_threads(threads)
            .thread_name(name)
            .build()
            .inspect_err(|e| tracing::warn!("no {name} threads ({e}); using the blocking pool"))
            .ok();
        Self(runtime)
    }

    /// Starts `op` on one of the pool's threads (or the main blocking pool).
    pub(super) fn spawn<T: Send + 'static>(
        &self,
        op: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        match &self.0 {
            Some(runtime) => runtime.spawn_blocking(op),
            None => tokio::task::spawn_blocking(op),
        }
    }
}

impl Drop for Pool {
    /// A runtime dropped inside another would block it; this one lets its
    /// threads finish on their own.
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

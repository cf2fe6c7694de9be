//! The threads file operations run on, and each root's share of them.
//! Operations with a bounded amount of work have threads of their own, in
//! two pools:
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
//! Only operations with a bounded amount of work come there. Streams'
//! reads and writes of the file (a stream waits for its client between
//! them on the runtime, holding no thread), listings, searches, watches'
//! start, copies, moves and deletes run on the main runtime's blocking
//! pool ([`BLOCKING_THREADS`] threads), through a [`Pool`] without threads
//! of its own.
//!
//! A file system that hangs (a dead network mount, a FUSE server that
//! stopped answering) holds every thread that touches it. So one root's
//! operations may hold at most half of each pool's threads ([`Pool::run`]
//! waits, cancellably, for the share of every root an operation touches
//! before it takes a thread): a hung root's further operations wait for
//! its share, and every other root's go on. Roots are told apart by their
//! directory on the host; two roots on one hung mount may together hold
//! all of a pool's threads. The waits have no bound of their own: the
//! requests in flight (per session and sessions per gateway) bound them,
//! as they bound the main pool.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::runtime::{Builder, Runtime};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::JoinHandle;

/// The threads that run quick operations: twice one root's share.
pub(super) const QUICK_THREADS: usize = 32;

/// The threads that run inline writes (twice one root's share).
pub(super) const WRITE_THREADS: usize = 16;

/// The main runtime's blocking threads (tokio's default, set by `serve`
/// so that one root's share stays half of them).
pub const BLOCKING_THREADS: usize = 512;

/// Roots whose shares are kept while none of their operations runs;
/// past it, idle shares are dropped (the policy's grants bound the roots,
/// templated per principal, so this is rarely reached).
const IDLE_SHARES_KEPT: usize = 64;

/// Threads that run one kind of file operation: a second runtime's
/// blocking pool, or the main one (when the pool has no threads of its
/// own, or its runtime could not be built); and each root's share of them.
pub(super) struct Pool {
    runtime: Option<Runtime>,
    /// Operations one root may run at once.
    per_root: usize,
    /// Each root's share, by its directory on the host.
    shares: Mutex<HashMap<PathBuf, Arc<Semaphore>>>,
}

impl Pool {
    /// The pool for quick operations.
    pub(super) fn quick() -> Self {
        Self::new("file-quick", QUICK_THREADS)
    }

    /// The pool for inline writes.
    pub(super) fn writes() -> Self {
        Self::new("file-write", WRITE_THREADS)
    }

    /// The main runtime's blocking pool, for every other file operation.
    pub(super) fn main() -> Self {
        Self::shared(None, BLOCKING_THREADS)
    }

    fn new(name: &str, threads: usize) -> Self {
        let runtime = Builder::new_current_thread()
            .max_blocking_threads(threads)
            .thread_name(name)
            .build()
            .inspect_err(|e| tracing::warn!("no {name} threads ({e}); using the blocking pool"))
            .ok();
        Self::shared(runtime, threads)
    }

    fn shared(runtime: Option<Runtime>, threads: usize) -> Self {
        Self {
            runtime,
            per_root: (threads / 2).max(1),
            shares: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `op`, an operation on the roots whose directories on the host
    /// are `roots` (a copy or a move touches two), on one of the pool's
    /// threads once every one of them has a free share. The shares are
    /// held until `op` returns, even if the caller stops waiting for it:
    /// the thread is taken until then.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        roots: &[&Path],
        op: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let permits = self.shares_of(roots).await;
        let op = move || {
            let _permits = permits;
            op()
        };
        match &self.runtime {
            Some(runtime) => runtime.spawn_blocking(op),
            None => tokio::task::spawn_blocking(op),
        }
    }

    /// A share of each of `roots`, taken only when every one is free: it
    /// waits for one root's share holding none of the others', so a root
    /// that hangs never holds another root's share through an operation
    /// that touches both.
    async fn shares_of(&self, roots: &[&Path]) -> Vec<OwnedSemaphorePermit> {
        let mut roots = roots.to_vec();
        roots.sort_unstable();
        roots.dedup();
        let shares: Vec<_> = roots.into_iter().map(|root| self.share(root)).collect();
        let mut waited = 0;
        loop {
            let mut permits = Vec::with_capacity(shares.len());
            let Some(first) = shares.get(waited) else {
                return permits;
            };
            // Never closed, so acquiring fails never; were one closed, the
            // operation would run without that share rather than not at all.
            permits.extend(first.clone().acquire_owned().await.ok());
            let mut full = None;
            for (i, share) in shares.iter().enumerate().filter(|(i, _)| *i != waited) {
                match share.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(TryAcquireError::NoPermits) => {
                        full = Some(i);
                        break;
                    }
                    Err(TryAcquireError::Closed) => {}
                }
            }
            match full {
                None => return permits,
                // Give back what was taken, then wait for the full one.
                Some(i) => waited = i,
            }
        }
    }

    fn share(&self, root: &Path) -> Arc<Semaphore> {
        let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = shares.get(root) {
            return share.clone();
        }
        if shares.len() >= IDLE_SHARES_KEPT {
            // Only the map holds an idle share.
            shares.retain(|_, share| Arc::strong_count(share) > 1);
        }
        let share = Arc::new(Semaphore::new(self.per_root));
        shares.insert(root.to_path_buf(), share.clone());
        share
    }
}

impl Drop for Pool {
    /// A runtime dropped inside another would block it; this one lets its
    /// threads finish on their own.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use tokio::sync::RwLock;

    use super::*;

    /// A root whose operations hang (a dead mount: here, a lock the test
    /// holds) takes only its share of a pool's threads: another root's
    /// operations answer meanwhile, the hung root's further operations
    /// wait for its share, and all of them answer once it does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hung_root_holds_only_its_share_of_the_threads() {
        let limit = Duration::from_secs(20);
        for (pool, threads) in [
            (Arc::new(Pool::quick()), QUICK_THREADS),
            (Arc::new(Pool::writes()), WRITE_THREADS),
            // The test's runtime has tokio's default blocking pool, as the
            // daemon's has.
            (Arc::new(Pool::main()), BLOCKING_THREADS),
        ] {
            let file_system = Arc::new(RwLock::new(()));
            let hung = file_system.clone().write_owned().await;
            let started = Arc::new(AtomicUsize::new(0));
            let on_hung_root: Vec<_> = (0..threads)
                .map(|_| {
                    let (pool, file_system, started) =
                        (pool.clone(), file_system.clone(), started.clone());
                    tokio::spawn(async move {
                        let op = move || {
                            started.fetch_add(1, Ordering::SeqCst);
                            drop(file_system.blocking_read());
                        };
                        pool.run(&[Path::new("/mnt/hung")], op).await.await
                    })
                })
                .collect();
            let elsewhere = futures_util::future::join_all((0..4 * threads).map(|i| {
                let pool = pool.clone();
                async move {
                    pool.run(&[Path::new("/srv/local")], move || i * 2)
                        .await
                        .await
                }
            }));
            let answers = tokio::time::timeout(limit, elsewhere)
                .await
                .expect("a hung root held every thread of the pool");
            let doubled: Vec<usize> = answers.into_iter().map(|a| a.unwrap()).collect();
            assert_eq!(doubled, (0..4 * threads).map(|i| i * 2).collect::<Vec<_>>());

            let deadline = Instant::now() + limit;
            while started.load(Ordering::SeqCst) < threads / 2 {
                assert!(Instant::now() < deadline, "the hung root's share never ran");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(started.load(Ordering::SeqCst), threads / 2);

            drop(hung);
            for op in on_hung_root {
                tokio::time::timeout(limit, op)
                    .await
                    .expect("the hung root's operations stayed queued once it answered")
                    .unwrap()
                    .unwrap();
            }
            assert_eq!(started.load(Ordering::SeqCst), threads);
        }
    }

    /// An operation on two roots (a copy or a move), one of them hung,
    /// waits holding none of the other root's share.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_operation_on_two_roots_waits_holding_neither() {
        let pool = Arc::new(Pool::writes());
        let (local, hung) = (Path::new("/a/local"), Path::new("/z/hung"));
        let file_system = Arc::new(RwLock::new(()));
        let hung_now = file_system.clone().write_owned().await;
        let on_hung: Vec<_> = (0..WRITE_THREADS / 2)
            .map(|_| {
                let (pool, file_system) = (pool.clone(), file_system.clone());
                tokio::spawn(async move {
                    pool.run(&[hung], move || drop(file_system.blocking_read()))
                        .await
                        .await
                })
            })
            .collect();
        let full = pool.share(hung);
        while full.available_permits() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let both = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.run(&[local, hung], || 7).await.await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!both.is_finished(), "it ran without the hung root's share");
        assert_eq!(pool.share(local).available_permits(), WRITE_THREADS / 2);
        // A lone operation on the other root still has the whole share.
        let alone = (0..WRITE_THREADS).map(|i| {
            let pool = pool.clone();
            async move { pool.run(&[local], move || i).await.await.unwrap() }
        });
        let limit = Duration::from_secs(20);
        let ran = tokio::time::timeout(limit, futures_util::future::join_all(alone)).await;
        assert_eq!(
            ran.expect("the other root waited"),
            (0..WRITE_THREADS).collect::<Vec<_>>()
        );

        drop(hung_now);
        let answer = tokio::time::timeout(limit, both)
            .await
            .expect("it stayed queued");
        assert_eq!(answer.unwrap().unwrap(), 7);
        for op in on_hung {
            op.await.unwrap().unwrap();
        }
    }

    /// Idle roots' shares are dropped once many roots have been used; a
    /// root with an operation running keeps its share.
    #[tokio::test]
    async fn idle_shares_are_dropped_and_busy_ones_kept() {
        let pool = Pool::quick();
        let busy = pool.share(Path::new("/busy"));
        let _permit = busy.clone().try_acquire_owned().unwrap();
        for i in 0..3 * IDLE_SHARES_KEPT {
            pool.run(&[Path::new(&format!("/root/{i}"))], || ())
                .await
                .await
                .unwrap();
        }
        let shares = pool.shares.lock().unwrap();
        assert!(
            shares.len() <= IDLE_SHARES_KEPT,
            "{} shares kept",
            shares.len()
        );
        let kept = shares
            .get(Path::new("/busy"))
            .expect("a busy share was dropped");
        assert!(Arc::ptr_eq(kept, &busy));
        assert_eq!(kept.available_permits(), QUICK_THREADS / 2 - 1);
    }
}

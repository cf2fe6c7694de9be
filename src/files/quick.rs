//! A few threads of their own for file operations that take a few system
//! calls: `file.stat`, `file.mkdir` and inline `file.read`.
//!
//! tokio's blocking pool starts a thread whenever none is idle, so under
//! load it holds one per operation in flight (~170 at 256 stats in flight
//! in the bench) and wakes a sleeping one for nearly every operation, a
//! large share of a stat's cost (bench/README.md). Here a handful of
//! threads take operations from one queue and, while it is not empty, go
//! from one to the next without sleeping; a push wakes one only when some
//! wait.
//!
//! Only operations with a bounded amount of work come here. Streams (a
//! slow reader would hold a thread), listings, searches, copies and
//! deletes stay on the blocking pool. A file system that hangs (a dead
//! network mount) can still hold all of these threads; then these
//! operations wait in the queue, and the others go on.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use super::confine::FileError;
use crate::frame::{ErrorBody, ErrorCode};

/// The threads that run quick operations.
const THREADS: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    state: Mutex<State>,
    /// Signalled when a job is queued while a thread waits.
    queued: Condvar,
}

struct State {
    jobs: VecDeque<Job>,
    /// Threads waiting on `queued`: with none, a push wakes nobody.
    idle: usize,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding it; a poisoned lock is still sound.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, job: Job) {
        let mut state = self.lock();
        state.jobs.push_back(job);
        let wake = state.idle > 0;
        drop(state);
        if wake {
            self.queued.notify_one();
        }
    }

    /// One thread: runs jobs while there are any, and waits for more.
    fn work(&self) {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                // A panic is a bug in the operation; its caller gets an
                // error (its result sender is dropped) and the thread
                // serves the next one.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                state = self.lock();
                continue;
            }
            state.idle += 1;
            state = self
                .queued
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.idle -= 1;
        }
    }
}

/// The queue, once its threads are started; `None` when no thread could
/// be started (then the blocking pool serves).
fn queue() -> Option<&'static Queue> {
    static QUEUE: OnceLock<Option<&'static Queue>> = OnceLock::new();
    *QUEUE.get_or_init(|| {
        let queue: &'static Queue = Box::leak(Box::new(Queue {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                idle: 0,
            }),
            queued: Condvar::new(),
        }));
        let started = (0..THREADS)
            .filter(|i| {
                std::thread::Builder::new()
                    .name(format!("file-quick-{i}"))
                    .spawn(move || queue.work())
                    .is_ok()
            })
            .count();
        (started > 0).then_some(queue)
    })
}

/// Runs `op` on a quick thread (or, if none could be started, on the
/// blocking pool) and returns its result.
pub(crate) async fn run<T: Send + 'static>(
    op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, ErrorBody> {
    let Some(queue) = queue() else {
        return super::blocking(op).await;
    };
    let (result, answer) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = result.send(op());
    });
    queue.push(job);
    match answer.await {
        Ok(result) => result.map_err(FileError::into_body),
        Err(_) => {
            tracing::error!("a quick file operation panicked");
            Err(ErrorBody::new(
                ErrorCode::ProviderError,
                "the file operation failed inside the gateway (see its log)",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking operation answers with an error, and the threads keep
    /// serving: more panics than threads, then results again.
    #[tokio::test]
    async fn a_panic_is_an_error_and_the_threads_go_on() {
        let limit = std::time::Duration::from_secs(10);
        for _ in 0..THREADS + 2 {
            let answer = run(|| -> Result<(), FileError> { panic!("a bug") });
            let answer = tokio::time::timeout(limit, answer)
                .await
                .expect("no thread serves the queue any more");
            let error = answer.expect_err("a panic must not look like success");
            assert_eq!(error.code, ErrorCode::ProviderError);
        }
        let all = futures_util::future::join_all((0..64u32).map(|i| run(move || Ok(i * 2))));
        let answers = tokio::time::timeout(limit, all)
            .await
            .expect("no thread serves the queue any more");
        let doubled: Vec<u32> = answers.into_iter().map(|a| a.unwrap()).collect();
        assert_eq!(doubled, (0..64).map(|i| i * 2).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn an_operations_error_keeps_its_code() {
        let answer = run(|| -> Result<(), FileError> { Err(FileError::Cancelled) }).await;
        assert_eq!(
            answer.unwrap_err().code,
            FileError::Cancelled.into_body().code
        );
    }
}

//! A clean interpreter exit. pyo3-async-runtimes hands a finished future's
//! result to asyncio from a tokio blocking thread (`call_soon_threadsafe`,
//! which releases and retakes the GIL). If the interpreter starts to
//! finalize meanwhile, CPython ends that thread with `pthread_exit`, whose
//! forced unwinding through Rust frames aborts the process — one Python
//! process in about twenty that had finished its work (bench, 2026-11-27).
//!
//! So every call into Python from a tokio thread goes through
//! [`with_python`], which counts it, and the module's `atexit` hook
//! ([`drain`]), which runs while the interpreter is still whole: it closes
//! the gate (later calls are skipped: nobody is left to hear them) and
//! waits, with the GIL released, for the calls already inside.
//! [`Counted`] is pyo3-async-runtimes' tokio runtime with its blocking
//! spawns passed through that gate.

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3_async_runtimes::TaskLocals;
use pyo3_async_runtimes::generic::{ContextExt, Runtime};

/// Calls into Python from tokio threads now running.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// Set at interpreter exit: no new call into Python starts.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Runs `f` unless the interpreter is exiting; counted while it runs.
pub fn with_python<T>(f: impl FnOnce() -> T) -> Option<T> {
    // Counted before the check: `drain` closes, then reads the count, so
    // a call that saw the gate open is one it waits for.
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let result = (!CLOSED.load(Ordering::SeqCst)).then(f);
    INSIDE.fetch_sub(1, Ordering::SeqCst);
    result
}

/// The `atexit` hook: closes the gate and waits (at most two seconds,
/// the GIL released) for the calls into Python already running.
#[pyfunction]
#[pyo3(name = "_drain")]
pub fn drain(py: Python<'_>) {
    CLOSED.store(true, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

tokio::task_local! {
    static LOCALS: OnceCell<TaskLocals>;
}

/// pyo3-async-runtimes' tokio runtime, its blocking spawns (where results
/// are handed to Python) through [`with_python`].
pub struct Counted;

impl Runtime for Counted {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        pyo3_async_runtimes::tokio::get_runtime().spawn(fut)
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        pyo3_async_runtimes::tokio::get_runtime().spawn_blocking(move || {
            // Skipped at exit: what it held is released without the GIL
            // (PyO3 defers those reference counts).
            let _ = with_python(f);
        })
    }
}

impl ContextExt for Counted {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        let _ = cell.set(locals);
        Box::pin(LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        LOCALS.try_with(|c| c.get().cloned()).unwrap_or_default()
    }
}

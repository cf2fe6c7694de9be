//! `portcullis-store`: the only code that knows sled.
//!
//! It holds the audit log ([`AuditLog`]): one entry per request and
//! per security event, hash-chained, written by a single writer thread that
//! commits in groups and makes each group durable (a write to its journal
//! and an `fdatasync`, see `journal.rs`) before any caller hears back;
//! remembered approvals ([`RememberedApprovals`]); and the handles of
//! started processes ([`Handles`]), so those of an earlier run are known
//! as lost.

#![forbid(unsafe_code)]

mod audit;
mod checkpoint;
mod handles;
mod journal;

use std::path::{Path, PathBuf};

pub use audit::{
    AuditLog, COMMIT_BUCKETS, CommitStats, Decision, Durability, Entry, Filter, Health, Kind,
    LogStats, Record, Recovery, RequestContext, Retain, Status, Submitted, VerifyError,
    VerifyReport, verify_export, verify_export_against,
};
pub use checkpoint::{
    AuditSigner, Checkpoint, NoteError, PruneMarker, PublicKeyError, decode_public_key, origin_of,
};
pub use handles::{Handle, Handles};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error(
        "the store {path} is in use by another process (is the daemon running? use its admin socket)"
    )]
    Locked { path: PathBuf },
    #[error("cannot open the store {path}: {message}")]
    Open { path: PathBuf, message: String },
    /// An I/O error, and what was being done.
    #[error("store I/O ({context}): {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the store (sled): {0}")]
    Sled(#[from] sled::Error),
    #[error("audit entry {seq} is unreadable: {message}")]
    Corrupt { seq: u64, message: String },
    #[error(
        "the audit log cannot write ({reason}); it writes again by itself once the cause is gone (free space on the store's file system)"
    )]
    Failed { reason: String },
    #[error("the audit writer has stopped (the daemon is shutting down, or the thread ended)")]
    WriterGone,
    #[error("pruning needs the audit key, to sign where the log now starts")]
    NoPruningKey,
    #[error("audit key {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error("export line {line}: {message}")]
    Export { line: usize, message: String },
}

impl StoreError {
    /// An I/O error while doing `context`.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

/// sled's page cache. Its default (1 GiB) lets a daemon that appends
/// audit entries all day grow towards a gigabyte of RSS; appends and the
/// recent entries `audit list` shows need far less.
const CACHE_BYTES: u64 = 32 * 1024 * 1024;

/// The daemon's sled database.
pub struct Store {
    db: sled::Db,
    path: PathBuf,
}

impl Store {
    /// Opens (creating) the store in `dir`. Only one process may hold it.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.into(),
            message: e.to_string(),
        })?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            // The audit journal makes entries durable, and sled is flushed
            // when the journal is emptied; a timer would only add IO.
            .flush_every_ms(None)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io)
                    if io.kind() == std::io::ErrorKind::WouldBlock
                        || io.to_string().contains("lock") =>
                {
                    StoreError::Locked { path: dir.into() }
                }
                other => StoreError::Open {
                    path: dir.into(),
                    message: other.to_string(),
                },
            })?;
        Ok(Self {
            db,
            path: dir.to_path_buf(),
        })
    }

    /// The audit log, with its writer thread started. With a `signer` the
    /// writer signs checkpoints; without one (readers, tools) it does not.
    pub fn audit(&self, signer: Option<AuditSigner>) -> Result<AuditLog, StoreError> {
        AuditLog::open(&self.db, &self.path, Durability::Fdatasync, signer)
    }

    /// Remembered tool approvals (`ask_once`, `ask_once_per_run`).
    pub fn approvals(&self) -> Result<RememberedApprovals, StoreError> {
        let tree = self
            .db
            .open_tree("approvals_remembered")
            .map_err(StoreError::Sled)?;
        Ok(RememberedApprovals { tree })
    }

    /// The handles of started processes and terminal sessions.
    pub fn handles(&self) -> Result<Handles, StoreError> {
        Handles::open(&self.db)
    }

    /// The audit log with a chosen durability; only benchmarks choose less.
    pub fn audit_with(
        &self,
        durability: Durability,
        signer: Option<AuditSigner>,
    ) -> Result<AuditLog, StoreError> {
        AuditLog::open(&self.db, &self.path, durability, signer)
    }
}

/// Approvals an operator gave that hold for later calls: key (principal,
/// tool and, for `ask_once_per_run`, the run id) → who approved.
#[derive(Clone)]
pub struct RememberedApprovals {
    tree: sled::Tree,
}

impl RememberedApprovals {
    fn key(parts: &[&str]) -> Vec<u8> {
        parts.join("\0").into_bytes()
    }

    /// Who approved, if an approval is remembered for `parts`.
    pub fn get(&self, parts: &[&str]) -> Result<Option<String>, StoreError> {
        let value = self.tree.get(Self::key(parts)).map_err(StoreError::Sled)?;
        Ok(value.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Remembers an approval durably.
    pub fn remember(&self, parts: &[&str], approved_by: &str) -> Result<(), StoreError> {
        let io = StoreError::Sled;
        self.tree
            .insert(Self::key(parts), approved_by.as_bytes())
            .map_err(io)?;
        self.tree.flush().map_err(io)?;
        Ok(())
    }
}

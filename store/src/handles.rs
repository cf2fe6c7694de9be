//! Started processes and terminal sessions, remembered across restarts of
//! the daemon: a handle a client was given in an earlier run is then
//! answered as *lost* (its process ended with that run), not as unknown.
//!
//! A handle is written, and flushed, before the client hears of it; how
//! it ended is written when it does, without a flush (a record whose end
//! a crash lost is still a handle of an earlier run, so still lost). The
//! ledger keeps the newest [`KEEP`] handles.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Handles kept; past twice this many, the oldest are dropped down to it.
pub const KEEP: usize = 4096;

/// What the ledger knows of one handle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    /// The principal that started it; nobody else learns of it.
    pub owner: String,
    /// The gateway run (`instance_id`) it was started in.
    pub instance_id: String,
    /// A terminal session (the 0.92 profile's `shell_session`), or a
    /// process.
    pub terminal: bool,
    pub command: Vec<String>,
    /// RFC 3339.
    pub started_at: String,
    /// How it ended, once it did (`exit`, `timeout`, `cancelled`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
}

/// The ledger: handle id → [`Handle`]. Cloning shares it.
#[derive(Clone)]
pub struct Handles {
    tree: sled::Tree,
    /// How many handles the tree holds: counted once when opened, then
    /// kept here (sled's `len` walks the whole tree).
    held: Arc<AtomicUsize>,
}

impl Handles {
    pub(crate) fn open(db: &sled::Db) -> Result<Self, StoreError> {
        let tree = db.open_tree("handles").map_err(StoreError::Sled)?;
        Ok(Self {
            held: Arc::new(AtomicUsize::new(tree.len())),
            tree,
        })
    }

    /// Writes a new handle and makes it durable.
    pub async fn record(&self, id: &str, handle: &Handle) -> Result<(), StoreError> {
        self.insert(id, handle)?;
        self.tree.flush_async().await.map_err(StoreError::Sled)?;
        if self.held.load(Ordering::Relaxed) > 2 * KEEP {
            self.prune()?;
        }
        Ok(())
    }

    /// Records how a handle ended (no flush: see the module's text).
    pub fn ended(&self, id: &str, ended_by: &str) -> Result<(), StoreError> {
        if let Some(mut handle) = self.get(id)? {
            handle.ended_by = Some(ended_by.to_string());
            self.insert(id, &handle)?;
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<Option<Handle>, StoreError> {
        let Some(bytes) = self.tree.get(id.as_bytes()).map_err(StoreError::Sled)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                seq: 0,
                message: format!("handle `{id}`: {e}"),
            })
    }

    /// The handles of runs other than `instance_id` that the gateway's
    /// stop ended — still running at a crash (no end recorded) or ended
    /// `shutdown` —, oldest first: lost with their run.
    pub fn lost(&self, instance_id: &str) -> Result<Vec<(String, Handle)>, StoreError> {
        let mut lost = Vec::new();
        for item in self.tree.iter() {
            let (key, bytes) = item.map_err(StoreError::Sled)?;
            let Ok(handle) = serde_json::from_slice::<Handle>(&bytes) else {
                continue;
            };
            let stopped = matches!(handle.ended_by.as_deref(), None | Some("shutdown"));
            if handle.instance_id != instance_id && stopped {
                lost.push((String::from_utf8_lossy(&key).into_owned(), handle));
            }
        }
        lost.sort_by(|a, b| a.1.started_at.cmp(&b.1.started_at));
        Ok(lost)
    }

    fn insert(&self, id: &str, handle: &Handle) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(handle).map_err(|e| StoreError::Corrupt {
            seq: 0,
            message: format!("handle `{id}`: {e}"),
        })?;
        let earlier = self
            .tree
            .insert(id.as_bytes(), bytes)
            .map_err(StoreError::Sled)?;
        if earlier.is_none() {
            self.held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Keeps the newest [`KEEP`] handles (by start time; an unreadable
    /// one counts as oldest).
    fn prune(&self) -> Result<(), StoreError> {
        let mut all: Vec<(String, sled::IVec)> = Vec::new();
        for item in self.tree.iter() {
            let (key, bytes) = item.map_err(StoreError::Sled)?;
            let started = serde_json::from_slice::<Handle>(&bytes)
                .map(|h| h.started_at)
                .unwrap_or_default();
            all.push((started, key));
        }
        all.sort_unstable();
        let excess = all.len().saturating_sub(KEEP);
        let kept = all.len() - excess;
        for (_, key) in all.into_iter().take(excess) {
            self.tree.remove(key).map_err(StoreError::Sled)?;
        }
        self.held.store(kept, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(instance: &str, started_at: String) -> Handle {
        Handle {
            owner: "agent".into(),
            instance_id: instance.into(),
            terminal: false,
            command: vec!["sleep".into(), "30".into()],
            started_at,
            ended_by: None,
        }
    }

    #[tokio::test]
    async fn a_handle_outlives_the_store_and_ended_ones_are_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = crate::Store::open(dir.path()).unwrap();
            let handles = store.handles().unwrap();
            handles
                .record("p1-aaaa", &handle("aaaa", "2026-01-01T00:00:01Z".into()))
                .await
                .unwrap();
            handles
                .record("p2-aaaa", &handle("aaaa", "2026-01-01T00:00:02Z".into()))
                .await
                .unwrap();
            handles.ended("p2-aaaa", "exit").unwrap();
            handles
                .record("p3-aaaa", &handle("aaaa", "2026-01-01T00:00:03Z".into()))
                .await
                .unwrap();
            handles.ended("p3-aaaa", "shutdown").unwrap();
            // Ending a handle never recorded is not an error.
            handles.ended("p9-aaaa", "exit").unwrap();
        }
        let store = crate::audit::tests::reopen(dir.path());
        let handles = store.handles().unwrap();
        let first = handles.get("p1-aaaa").unwrap().unwrap();
        assert_eq!(first.command, ["sleep", "30"]);
        assert_eq!(
            handles.get("p2-aaaa").unwrap().unwrap().ended_by.as_deref(),
            Some("exit")
        );
        assert_eq!(handles.get("p4-aaaa").unwrap(), None);
        // Running at the stop, or ended by it; not one that exited.
        let lost = handles.lost("bbbb").unwrap();
        let ids: Vec<&str> = lost.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["p1-aaaa", "p3-aaaa"]);
        // The run that started it has lost nothing.
        assert!(handles.lost("aaaa").unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_ledger_keeps_the_newest_handles() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path()).unwrap();
        let handles = store.handles().unwrap();
        for n in 0..=2 * KEEP {
            let started = format!("2026-01-01T00:00:00.{n:06}Z");
            handles
                .insert(&format!("p{n}-aaaa"), &handle("aaaa", started))
                .unwrap();
        }
        handles
            .record("p-last", &handle("aaaa", "2027-01-01T00:00:00Z".into()))
            .await
            .unwrap();
        assert_eq!(handles.tree.len(), KEEP);
        assert!(handles.get("p-last").unwrap().is_some());
        assert!(
            handles
                .get(&format!("p{}-aaaa", 2 * KEEP))
                .unwrap()
                .is_some()
        );
        assert!(handles.get("p0-aaaa").unwrap().is_none());
    }
}

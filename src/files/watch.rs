//! `file.watch`: change notifications from `notify` (inotify), confined.
//!
//! notify watches by path and inotify follows symlinks on the way, so a
//! directory is never handed to it by name: each one is opened beneath the
//! root (`openat2`, as every other file method) and watched through its
//! descriptor's `/proc/self/fd/N` link, which names exactly that inode. A
//! recursive watch walks the tree the same way, and adds directories as
//! they are created. Events carry `/proc/self/fd/N/name`; the fd number
//! maps back to the virtual path.
//!
//! Changes collect in a bounded map keyed by path (a burst of writes to one
//! file is one event) and go out as `file.changed` events; what does not fit
//! is counted and reported as `file.watch_overflow`, after which a client
//! should list again. A slow client therefore costs at most the map.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use rustix::fs::{FileType, Mode, OFlags};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::confine::{FileError, Root};
use super::ops::{MAX_DEPTH, Step, Tree};
use crate::server::resources::EventSink;

/// Directories one recursive watch follows; beyond it the watch reports
/// itself incomplete and overflows.
pub const MAX_DIRS: usize = 1024;
/// Distinct changed paths held for a slow client before counting drops.
pub const MAX_PENDING: usize = 1024;
/// How long changes gather before they are sent, so a burst coalesces.
const GATHER: Duration = Duration::from_millis(50);
const PROC_FD: &str = "/proc/self/fd/";

#[derive(Deserialize)]
pub struct WatchParams {
    #[serde(default)]
    pub recursive: bool,
}

/// A running watch; dropping it stops the watch.
pub type Guard = tokio_util::sync::DropGuard;

/// Starts watching `path` (a directory or a file). Blocking; `runtime`
/// runs the task that sends the events.
pub fn start(
    root: Root,
    path: &str,
    recursive: bool,
    id: &str,
    events: EventSink,
    runtime: &tokio::runtime::Handle,
) -> Result<(Guard, Value), FileError> {
    let vpath = root.virtual_path(path);
    let target = root.open_at(path, OFlags::PATH, Mode::empty())?;
    let stat = rustix::fs::fstat(&target).map_err(|e| FileError::from_errno(e, &vpath))?;
    let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
    if !is_dir {
        // As for a read: a second link may lead outside.
        super::ops::regular_single_link(&stat, &vpath)?;
    }
    let shared = Arc::new(Shared::default());
    let handler = {
        let shared = shared.clone();
        move |event: notify::Result<notify::Event>| shared.record(event)
    };
    let watcher = RecommendedWatcher::new(handler, notify::Config::default())
        .map_err(|e| FileError::Io(format!("{vpath}: cannot watch: {e}")))?;
    let mut tracker = Tracker {
        root,
        watcher,
        shared: shared.clone(),
        by_path: HashMap::new(),
        recursive: recursive && is_dir,
        complete: true,
    };
    tracker.watch(target, path)?;
    if tracker.recursive {
        tracker.add_subdirs(path);
    }
    let info = json!({
        "root_id": tracker.root.id(),
        "path": vpath,
        "recursive": tracker.recursive,
        "directories": if is_dir { tracker.by_path.len() } else { 0 },
        "complete": tracker.complete,
    });
    let cancel = CancellationToken::new();
    let forward = Forward {
        id: id.to_string(),
        root_id: tracker.root.id().to_string(),
        tracker: Arc::new(Mutex::new(tracker)),
        shared,
        events,
    };
    runtime.spawn(forward.run(cancel.clone()));
    Ok((cancel.drop_guard(), info))
}

/// Filled by notify's thread, drained by the forwarding task.
#[derive(Default)]
struct Shared {
    /// fd number → the path (relative to the root) it watches.
    dirs: Mutex<HashMap<i32, String>>,
    pending: Mutex<Pending>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Pending {
    changes: BTreeMap<String, &'static str>,
    dropped: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn record(&self, event: notify::Result<notify::Event>) {
        let event = match event {
            Ok(event) if !event.need_rescan() => event,
            // The kernel's queue overflowed, or notify failed: changes
            // were lost, and the client must hear so.
            _ => {
                lock(&self.pending).dropped += 1;
                self.wake.notify_one();
                return;
            }
        };
        let Some(kind) = kind_name(&event.kind) else {
            return;
        };
        for path in &event.paths {
            let Some(rel) = self.relative(path) else {
                continue;
            };
            let mut pending = lock(&self.pending);
            let full = pending.changes.len() >= MAX_PENDING;
            match pending.changes.get_mut(&rel) {
                Some(seen) => *seen = coalesce(seen, kind),
                None if full => pending.dropped += 1,
                None => {
                    pending.changes.insert(rel, kind);
                }
            }
        }
        self.wake.notify_one();
    }

    /// `/proc/self/fd/N/name` → the path relative to the root. Names that
    /// are not UTF-8 have no virtual path and are passed over.
    fn relative(&self, path: &Path) -> Option<String> {
        let rest = path.to_str()?.strip_prefix(PROC_FD)?;
        let (fd, name) = rest.split_once('/').unwrap_or((rest, ""));
        let dir = lock(&self.dirs).get(&fd.parse().ok()?)?.clone();
        Some(match (dir.is_empty(), name.is_empty()) {
            (_, true) => dir,
            (true, false) => name.to_string(),
            (false, false) => format!("{dir}/{name}"),
        })
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *lock(&self.pending))
    }
}

fn kind_name(kind: &EventKind) -> Option<&'static str> {
    match kind {
        EventKind::Create(_) => Some("created"),
        EventKind::Remove(_) => Some("removed"),
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => Some("moved_from"),
        EventKind::Modify(ModifyKind::Name(RenameMode::To)) => Some("moved_to"),
        // inotify also reports the pair; its halves were reported already.
        EventKind::Modify(ModifyKind::Name(_)) => None,
        EventKind::Modify(ModifyKind::Metadata(_)) => Some("metadata"),
        EventKind::Modify(_) => Some("modified"),
        // Opens and closes are not changes.
        _ => None,
    }
}

/// One path's changes since the last send, as one kind.
fn coalesce(seen: &'static str, new: &'static str) -> &'static str {
    match (seen, new) {
        ("created", "modified" | "metadata") => "created",
        _ => new,
    }
}

/// The watcher and the directories it holds open.
struct Tracker {
    root: Root,
    watcher: RecommendedWatcher,
    shared: Arc<Shared>,
    by_path: HashMap<String, OwnedFd>,
    recursive: bool,
    complete: bool,
}

impl Tracker {
    fn watch(&mut self, fd: OwnedFd, rel: &str) -> Result<(), FileError> {
        let link = format!("{PROC_FD}{}", fd.as_raw_fd());
        lock(&self.shared.dirs).insert(fd.as_raw_fd(), rel.to_string());
        if let Err(e) = self
            .watcher
            .watch(Path::new(&link), RecursiveMode::NonRecursive)
        {
            lock(&self.shared.dirs).remove(&fd.as_raw_fd());
            let vpath = self.root.virtual_path(rel);
            return Err(FileError::Io(format!("{vpath}: cannot watch: {e}")));
        }
        self.by_path.insert(rel.to_string(), fd);
        Ok(())
    }

    /// Watches the directories below `rel`, never through a symlink.
    fn add_subdirs(&mut self, rel: &str) {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        let Ok(dir) = self.root.open_at(rel, flags, Mode::empty()) else {
            return;
        };
        let mut found = Vec::new();
        let tree = Tree {
            depth: MAX_DEPTH,
            hidden: true,
        };
        let never = CancellationToken::new();
        let _ = tree.walk(&self.root, &dir, rel, &never, &mut |entry| {
            if FileType::from_raw_mode(entry.stat.st_mode) != FileType::Directory {
                return Step::Next;
            }
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
            if let Ok(fd) = self
                .root
                .open_beneath(entry.dir, entry.name, flags, Mode::empty())
            {
                found.push((fd, entry.path.to_string()));
            }
            match self.by_path.len() + found.len() < MAX_DIRS {
                true => Step::Next,
                false => Step::Stop,
            }
        });
        for (fd, path) in found {
            if self.by_path.len() >= MAX_DIRS {
                self.complete = false;
                break;
            }
            if !self.by_path.contains_key(&path) {
                let _ = self.watch(fd, &path);
            }
        }
    }

    /// A created path that is a directory is watched too (recursive
    /// watches); one removed is let go.
    fn follow(&mut self, rel: &str, kind: &str) {
        match kind {
            "created" | "moved_to" if self.recursive && !self.by_path.contains_key(rel) => {
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW;
                if let Ok(fd) = self.root.open_at(rel, flags, Mode::empty()) {
                    if self.by_path.len() >= MAX_DIRS {
                        self.complete = false;
                        return;
                    }
                    let _ = self.watch(fd, rel);
                    self.add_subdirs(rel);
                }
            }
            "removed" | "moved_from" => {
                if let Some(fd) = self.by_path.remove(rel) {
                    let link = format!("{PROC_FD}{}", fd.as_raw_fd());
                    let _ = self.watcher.unwatch(Path::new(&link));
                    lock(&self.shared.dirs).remove(&fd.as_raw_fd());
                }
            }
            _ => {}
        }
    }
}

/// Sends a watch's changes to its session until the watch is disposed.
struct Forward {
    id: String,
    root_id: String,
    tracker: Arc<Mutex<Tracker>>,
    shared: Arc<Shared>,
    events: EventSink,
}

impl Forward {
    async fn run(self, cancel: CancellationToken) {
        while cancel
            .run_until_cancelled(async {
                self.shared.wake.notified().await;
                tokio::time::sleep(GATHER).await;
            })
            .await
            .is_some()
        {
            let pending = self.shared.take();
            let tracker = self.tracker.clone();
            let changes: Vec<(String, &'static str)> = pending.changes.into_iter().collect();
            let followed = changes.clone();
            let was_complete = lock(&tracker).complete;
            let now_complete = tokio::task::spawn_blocking(move || {
                let mut tracker = lock(&tracker);
                for (rel, kind) in &followed {
                    tracker.follow(rel, kind);
                }
                tracker.complete
            })
            .await
            .unwrap_or(false);
            let changes: Vec<(String, &str)> = {
                let tracker = lock(&self.tracker);
                let path = |rel: &str| tracker.root.virtual_path(rel);
                changes
                    .iter()
                    .map(|(rel, kind)| (path(rel), *kind))
                    .collect()
            };
            let mut dropped = pending.dropped;
            if was_complete && !now_complete {
                dropped += 1; // directories beyond MAX_DIRS go unwatched
            }
            for (path, kind) in changes {
                let payload = json!({
                    "watch": self.id,
                    "root_id": self.root_id,
                    "path": path,
                    "kind": kind,
                });
                if self.send("file.changed", payload, &cancel).await.is_err() {
                    return;
                }
            }
            if dropped > 0 {
                let payload = json!({
                    "watch": self.id,
                    "root_id": self.root_id,
                    "dropped": dropped,
                });
                if self
                    .send("file.watch_overflow", payload, &cancel)
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        // Disposed: the watcher and its descriptors close off the runtime's
        // workers (stopping notify's thread waits for it).
        let tracker = self.tracker;
        let _ = tokio::task::spawn_blocking(move || drop(tracker)).await;
    }

    async fn send(
        &self,
        event: &str,
        payload: Value,
        cancel: &CancellationToken,
    ) -> Result<(), ()> {
        match cancel
            .run_until_cancelled(self.events.send(event, payload))
            .await
        {
            Some(Ok(())) => Ok(()),
            _ => Err(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange};

    fn event(kind: EventKind, path: &str) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind).add_path(path.into()))
    }

    #[test]
    fn changes_coalesce_by_path_and_overflow_is_counted() {
        let shared = Shared::default();
        lock(&shared.dirs).insert(7, "sub".into());
        lock(&shared.dirs).insert(8, String::new());
        let created = EventKind::Create(CreateKind::File);
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Content));
        shared.record(event(created, "/proc/self/fd/7/a.txt"));
        shared.record(event(written, "/proc/self/fd/7/a.txt"));
        shared.record(event(written, "/proc/self/fd/8/b.txt"));
        shared.record(event(written, "/proc/self/fd/7"));
        // Not ours, not UTF-8-mapped, or not a change: passed over.
        shared.record(event(written, "/proc/self/fd/9/c.txt"));
        shared.record(event(written, "/etc/passwd"));
        shared.record(event(
            EventKind::Access(notify::event::AccessKind::Any),
            "/proc/self/fd/8/b.txt",
        ));
        let pending = shared.take();
        let changes: Vec<_> = pending.changes.into_iter().collect();
        assert_eq!(
            changes,
            [
                ("b.txt".into(), "modified"),
                ("sub".into(), "modified"),
                ("sub/a.txt".into(), "created")
            ]
        );
        assert_eq!(pending.dropped, 0);

        for i in 0..MAX_PENDING + 10 {
            shared.record(event(written, &format!("/proc/self/fd/8/f{i}")));
        }
        // Paths already pending still coalesce when the map is full.
        shared.record(event(written, "/proc/self/fd/8/f0"));
        shared.record(Err(notify::Error::generic("queue overflow")));
        let pending = shared.take();
        assert_eq!(pending.changes.len(), MAX_PENDING);
        assert_eq!(pending.dropped, 11);
        assert!(shared.take().changes.is_empty());
    }
}

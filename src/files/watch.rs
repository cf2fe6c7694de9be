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
//!
//! The whole daemon shares one notify watcher (one inotify instance and
//! thread, the [`Hub`]): a host allows few instances per user (128 by
//! default), and the directories watched are capped daemon-wide, so no
//! client can use up the host's inotify resources.

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

use super::ops::{MAX_DEPTH, Step, Tree};
use crate::provider::EventSink;
use portcullis_confine::{FileError, Root};

/// Directories one recursive watch follows; beyond it the watch reports
/// itself incomplete and overflows.
pub const MAX_DIRS: usize = 1024;
/// Directories and files watched by the whole daemon.
pub const MAX_WATCHED_TOTAL: usize = 16 * 1024;
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
    hub: &Arc<Hub>,
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
    let mut tracker = Tracker {
        hub: hub.clone(),
        root,
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

/// The daemon's one notify watcher, and which watches each watched inode
/// belongs to. inotify gives one watch per inode per instance, so two
/// watches that cover the same directory share it here, counted; the hub
/// holds its own duplicate of the descriptor, so the `/proc/self/fd/N`
/// notify knows the inode by cannot be reused while it is watched.
pub struct Hub {
    watcher: Mutex<Option<RecommendedWatcher>>,
    state: Mutex<HubState>,
    /// Itself, for notify's callback (which the hub holds).
    me: std::sync::Weak<Hub>,
}

#[derive(Default)]
struct HubState {
    by_inode: HashMap<Inode, Watched>,
    /// The hub's descriptor number for each watched inode.
    by_fd: HashMap<i32, Inode>,
    routes: usize,
    next_token: u64,
}

type Inode = (u64, u64);

struct Watched {
    fd: OwnedFd,
    routes: Vec<(u64, Route)>,
}

/// Where changes under one watched inode go for one watch.
struct Route {
    shared: Arc<Shared>,
    /// The directory (or file) it is, relative to that watch's root.
    rel: String,
}

/// A route's place in the hub, to remove it again.
struct Ticket {
    inode: Inode,
    token: u64,
}

/// Why one more path cannot be watched.
#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error("the gateway watches {MAX_WATCHED_TOTAL} paths already")]
    Full,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Notify(notify::Error),
}

impl Hub {
    /// A hub with no watches; notify's watcher is made at the first.
    pub fn new() -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            watcher: Mutex::new(None),
            state: Mutex::new(HubState::default()),
            me: me.clone(),
        })
    }

    /// Watches the inode `fd` (opened beneath a root) is, for `route`.
    /// Fails when the daemon-wide cap is reached or inotify refuses.
    fn watch(&self, fd: &OwnedFd, route: Route) -> Result<Ticket, WatchError> {
        let stat = rustix::fs::fstat(fd).map_err(std::io::Error::from)?;
        let inode = (stat.st_dev, stat.st_ino);
        let (token, new_fd) = {
            let mut state = lock(&self.state);
            if state.routes >= MAX_WATCHED_TOTAL {
                return Err(WatchError::Full);
            }
            state.next_token += 1;
            let token = state.next_token;
            state.routes += 1;
            match state.by_inode.get_mut(&inode) {
                Some(watched) => {
                    watched.routes.push((token, route));
                    (token, None)
                }
                None => {
                    let own = fd.try_clone()?;
                    let n = own.as_raw_fd();
                    state.by_fd.insert(n, inode);
                    let routes = vec![(token, route)];
                    state.by_inode.insert(inode, Watched { fd: own, routes });
                    (token, Some(n))
                }
            }
        };
        let ticket = Ticket { inode, token };
        let Some(n) = new_fd else {
            return Ok(ticket);
        };
        // The state is not locked here: notify's thread takes that lock to
        // deliver events while this call waits for it.
        let mut watcher = lock(&self.watcher);
        let result = match &mut *watcher {
            Some(watcher) => Ok(watcher),
            None => {
                let me = self.me.clone();
                let deliver = move |event| {
                    if let Some(hub) = me.upgrade() {
                        hub.deliver(event);
                    }
                };
                RecommendedWatcher::new(deliver, notify::Config::default())
                    .map(|w| watcher.insert(w))
            }
        }
        .and_then(|w| w.watch(Path::new(&link(n)), RecursiveMode::NonRecursive));
        drop(watcher);
        match result {
            Ok(()) => Ok(ticket),
            Err(e) => {
                self.unwatch(&ticket);
                Err(WatchError::Notify(e))
            }
        }
    }

    /// Removes one route; the inode stops being watched with its last.
    fn unwatch(&self, ticket: &Ticket) {
        let unwatched = {
            let mut state = lock(&self.state);
            let Some(watched) = state.by_inode.get_mut(&ticket.inode) else {
                return;
            };
            let before = watched.routes.len();
            watched.routes.retain(|(token, _)| *token != ticket.token);
            let removed = before - watched.routes.len();
            let last = watched.routes.is_empty();
            state.routes -= removed;
            if !last {
                return;
            }
            let Some(watched) = state.by_inode.remove(&ticket.inode) else {
                return;
            };
            state.by_fd.remove(&watched.fd.as_raw_fd());
            watched.fd
        };
        if let Some(watcher) = &mut *lock(&self.watcher) {
            let _ = watcher.unwatch(Path::new(&link(unwatched.as_raw_fd())));
        }
        // `unwatched` closes here, after notify has forgotten its number.
    }

    /// On notify's thread: each change to every watch its inode is in.
    fn deliver(&self, event: notify::Result<notify::Event>) {
        let state = lock(&self.state);
        let event = match event {
            Ok(event) if !event.need_rescan() => event,
            // The kernel's queue overflowed, or notify failed: changes were
            // lost, and nobody can tell whose; every watch must hear so.
            _ => {
                let all = state.by_inode.values().flat_map(|w| &w.routes);
                for (_, route) in all {
                    route.shared.lost(1);
                }
                return;
            }
        };
        let Some(kind) = kind_name(&event.kind) else {
            return;
        };
        for path in &event.paths {
            let Some((n, name)) = split_link(path) else {
                continue;
            };
            let watched = state.by_fd.get(&n).and_then(|i| state.by_inode.get(i));
            for (_, route) in watched.into_iter().flat_map(|w| &w.routes) {
                route.shared.push(join(&route.rel, name), kind);
            }
        }
    }
}

fn link(fd: i32) -> String {
    format!("{PROC_FD}{fd}")
}

/// `/proc/self/fd/N/name` → (N, "name"); `/proc/self/fd/N` → (N, "").
/// Names that are not UTF-8 have no virtual path and are passed over.
fn split_link(path: &Path) -> Option<(i32, &str)> {
    let rest = path.to_str()?.strip_prefix(PROC_FD)?;
    let (fd, name) = rest.split_once('/').unwrap_or((rest, ""));
    Some((fd.parse().ok()?, name))
}

fn join(dir: &str, name: &str) -> String {
    match (dir.is_empty(), name.is_empty()) {
        (_, true) => dir.to_string(),
        (true, false) => name.to_string(),
        (false, false) => format!("{dir}/{name}"),
    }
}

/// One watch's changes: filled by notify's thread, drained by the
/// forwarding task.
#[derive(Default)]
struct Shared {
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
    fn push(&self, rel: String, kind: &'static str) {
        let mut pending = lock(&self.pending);
        let full = pending.changes.len() >= MAX_PENDING;
        match pending.changes.get_mut(&rel) {
            Some(seen) => *seen = coalesce(seen, kind),
            None if full => pending.dropped += 1,
            None => {
                pending.changes.insert(rel, kind);
            }
        }
        drop(pending);
        self.wake.notify_one();
    }

    fn lost(&self, n: u64) {
        lock(&self.pending).dropped += n;
        self.wake.notify_one();
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

/// One watch's directories, held open while they are watched.
struct Tracker {
    hub: Arc<Hub>,
    root: Root,
    shared: Arc<Shared>,
    by_path: HashMap<String, Ticket>,
    recursive: bool,
    complete: bool,
}

impl Tracker {
    fn watch(&mut self, fd: OwnedFd, rel: &str) -> Result<(), FileError> {
        let route = Route {
            shared: self.shared.clone(),
            rel: rel.to_string(),
        };
        match self.hub.watch(&fd, route) {
            Ok(ticket) => {
                self.by_path.insert(rel.to_string(), ticket);
                Ok(())
            }
            Err(e) => {
                self.complete = false;
                let vpath = self.root.virtual_path(rel);
                Err(FileError::Io(format!("{vpath}: cannot watch: {e}")))
            }
        }
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
                if let Some(ticket) = self.by_path.remove(rel) {
                    self.hub.unwatch(&ticket);
                }
            }
            _ => {}
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for ticket in self.by_path.values() {
            self.hub.unwatch(ticket);
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
            // Off the runtime's workers: following new directories opens
            // them and waits on notify's thread.
            let followed = tokio::task::spawn_blocking(move || {
                let mut tracker = lock(&tracker);
                let was_complete = tracker.complete;
                let mut changes = Vec::with_capacity(pending.changes.len());
                for (rel, kind) in pending.changes {
                    tracker.follow(&rel, kind);
                    changes.push((tracker.root.virtual_path(&rel), kind));
                }
                (changes, was_complete && !tracker.complete)
            })
            .await;
            let Ok((changes, outgrown)) = followed else {
                return;
            };
            // Directories beyond MAX_DIRS go unwatched: that is a loss too.
            let dropped = pending.dropped + u64::from(outgrown);
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
        // Disposed: unwatching waits for notify's thread, so it happens off
        // the runtime's workers.
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

    #[test]
    fn changes_coalesce_by_path_and_overflow_is_counted() {
        let shared = Shared::default();
        shared.push("sub/a.txt".into(), "created");
        shared.push("sub/a.txt".into(), "modified");
        shared.push("b.txt".into(), "modified");
        shared.push("b.txt".into(), "removed");
        let pending = shared.take();
        let changes: Vec<_> = pending.changes.into_iter().collect();
        assert_eq!(
            changes,
            [("b.txt".into(), "removed"), ("sub/a.txt".into(), "created")]
        );
        assert_eq!(pending.dropped, 0);

        for i in 0..MAX_PENDING + 10 {
            shared.push(format!("f{i}"), "modified");
        }
        // Paths already pending still coalesce when the map is full.
        shared.push("f0".into(), "removed");
        shared.lost(1);
        let pending = shared.take();
        assert_eq!(pending.changes.len(), MAX_PENDING);
        assert_eq!(pending.changes["f0"], "removed");
        assert_eq!(pending.dropped, 11);
        assert!(shared.take().changes.is_empty());
    }

    #[test]
    fn event_paths_map_back_through_the_descriptor() {
        fn path(p: &str) -> Option<(i32, &str)> {
            split_link(Path::new(p))
        }
        assert_eq!(path("/proc/self/fd/7/a.txt"), Some((7, "a.txt")));
        assert_eq!(path("/proc/self/fd/7"), Some((7, "")));
        assert_eq!(path("/proc/self/fd/x/a"), None);
        assert_eq!(path("/etc/passwd"), None);
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("sub", ""), "sub");
        assert_eq!(join("sub", "a"), "sub/a");
    }
}

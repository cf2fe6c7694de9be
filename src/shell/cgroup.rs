//! A control group per command, where the daemon can make one: the
//! grant's limits on every process the command starts (`pids`, `memory`,
//! `cpu`), and a way to kill them all. Each controller is taken where the
//! host has it: in the unified (v2) hierarchy, in the daemon's own cgroup
//! (delegated to it by the unit's `Delegate=yes`; writable when run by
//! hand), or else in a v1 hierarchy of its own (hosts still on the hybrid
//! layout). A controller in neither is missing, and the grant's limit
//! falls back to an rlimit where there is one.
//!
//! In v2 a cgroup whose children have controllers may hold no processes,
//! so the daemon first moves itself into a leaf (`daemon`) of its own
//! cgroup and enables the controllers below it; commands get siblings of
//! that leaf. In v1 the daemon makes a directory of its own
//! (`portcullis-PID`) below its cgroup in each hierarchy.
//!
//! A launcher joins its command's cgroups as its first step
//! (`--cgroup DIR`, before it starts bubblewrap), so everything the command
//! starts is inside from the beginning. The daemon sets the limits when a
//! command takes the launcher, before the program is released, and kills
//! and removes the cgroup when the command ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The controllers commands are limited by.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Controller {
    Pids,
    Memory,
    Cpu,
}

impl Controller {
    const ALL: [Self; 3] = [Self::Pids, Self::Memory, Self::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pids => "pids",
            Self::Memory => "memory",
            Self::Cpu => "cpu",
        }
    }
}

/// Where one controller's command cgroups are made.
#[derive(Clone, Debug)]
struct Place {
    /// The directory commands' cgroups are made in.
    dir: PathBuf,
    v2: bool,
}

/// The daemon's cgroups for commands.
#[derive(Debug)]
pub struct Cgroups {
    places: BTreeMap<Controller, Place>,
    /// Why each missing controller is missing.
    missing: BTreeMap<Controller, String>,
    next: AtomicU64,
}

/// The grant's limits, as cgroups take them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub pids: Option<u64>,
    pub memory: Option<u64>,
    /// Thousandths of a CPU.
    pub cpu_millis: Option<u64>,
}

/// One command's cgroup (a directory in each hierarchy it uses): killed
/// and removed when dropped.
#[derive(Debug)]
pub struct CommandCgroup {
    /// Each directory once, with the controllers it has.
    dirs: Vec<(PathBuf, bool, Vec<Controller>)>,
    /// Its CPU weight is the lowest (a launcher waiting in the pool) and
    /// goes back to the default with the limits.
    lowered: bool,
}

/// `cpu.weight` (v2) and `cpu.shares` (v1): the lowest, and the default
/// every other cgroup has.
const CPU_WEIGHT: (&str, &str, &str) = ("cpu.weight", "1", "100");
const CPU_SHARES: (&str, &str, &str) = ("cpu.shares", "2", "1024");

impl Cgroups {
    /// Finds where this process may make cgroups for commands, and makes
    /// what it needs to (the v2 leaf, the v1 directories).
    pub fn detect() -> Self {
        let mut found = Self {
            places: BTreeMap::new(),
            missing: BTreeMap::new(),
            next: AtomicU64::new(0),
        };
        let (Ok(mountinfo), Ok(own)) = (
            std::fs::read_to_string("/proc/self/mountinfo"),
            std::fs::read_to_string("/proc/self/cgroup"),
        ) else {
            for c in Controller::ALL {
                found
                    .missing
                    .insert(c, "/proc/self/cgroup is unreadable".into());
            }
            return found;
        };
        let v2 = unified_dir(&mountinfo, &own).and_then(|dir| {
            let have = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
            let have: Vec<Controller> = Controller::ALL
                .into_iter()
                .filter(|c| have.split_whitespace().any(|n| n == c.name()))
                .collect();
            (!have.is_empty()).then_some((dir, have))
        });
        let v2 = match v2 {
            Some((dir, have)) => match enable_below(&dir, &have) {
                Ok(()) => Some((dir, have)),
                Err(e) => {
                    for c in &have {
                        found.missing.insert(*c, format!("{}: {e}", dir.display()));
                    }
                    None
                }
            },
            None => None,
        };
        for controller in Controller::ALL {
            if let Some((dir, have)) = &v2
                && have.contains(&controller)
            {
                found.places.insert(
                    controller,
                    Place {
                        dir: dir.clone(),
                        v2: true,
                    },
                );
                continue;
            }
            if found.missing.contains_key(&controller) {
                continue;
            }
            match v1_dir(&mountinfo, &own, controller) {
                Some(dir) => {
                    let ours = dir.join(format!("portcullis-{}", std::process::id()));
                    remove_stale(&dir);
                    match std::fs::create_dir_all(&ours) {
                        Ok(()) => {
                            found.places.insert(
                                controller,
                                Place {
                                    dir: ours,
                                    v2: false,
                                },
                            );
                        }
                        Err(e) => {
                            found
                                .missing
                                .insert(controller, format!("{}: {e}", ours.display()));
                        }
                    }
                }
                None => {
                    found
                        .missing
                        .insert(controller, "the host has no hierarchy with it".into());
                }
            }
        }
        found
    }

    /// Removes this daemon's own v1 directories (at shutdown, once its
    /// commands are gone; a command cgroup still in use keeps its parent,
    /// which the next daemon removes).
    pub fn remove_own(&self) {
        for place in self.places.values().filter(|p| !p.v2) {
            let _ = std::fs::remove_dir(&place.dir);
        }
    }

    /// Why `controller` is missing, when it is.
    pub fn missing(&self, controller: Controller) -> Option<&str> {
        self.missing.get(&controller).map(String::as_str)
    }

    pub fn has(&self, controller: Controller) -> bool {
        self.places.contains_key(&controller)
    }

    /// What is there and what is not, for the log.
    pub fn report(&self) -> Vec<(Controller, Result<String, String>)> {
        Controller::ALL
            .into_iter()
            .map(|c| {
                let found = match (self.places.get(&c), self.missing.get(&c)) {
                    (Some(place), _) => Ok(format!(
                        "{} ({})",
                        place.dir.display(),
                        if place.v2 { "v2" } else { "v1" }
                    )),
                    (None, Some(why)) => Err(why.clone()),
                    (None, None) => Err("not looked for".into()),
                };
                (c, found)
            })
            .collect()
    }

    /// A new, empty cgroup for one command (none where no controller is
    /// there).
    pub fn make(&self) -> std::io::Result<Option<CommandCgroup>> {
        if self.places.is_empty() {
            return Ok(None);
        }
        let name = format!(
            "cmd-{}-{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let mut dirs: Vec<(PathBuf, bool, Vec<Controller>)> = Vec::new();
        for (controller, place) in &self.places {
            let dir = place.dir.join(&name);
            match dirs.iter_mut().find(|(d, _, _)| *d == dir) {
                Some((_, _, controllers)) => controllers.push(*controller),
                None => dirs.push((dir, place.v2, vec![*controller])),
            }
        }
        let cgroup = CommandCgroup {
            dirs,
            lowered: false,
        };
        for (dir, _, _) in &cgroup.dirs {
            std::fs::create_dir(dir)?;
        }
        Ok(Some(cgroup))
    }
}

impl CommandCgroup {
    /// The directories a launcher joins (`--cgroup DIR`).
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(dir, _, _)| dir.as_path())
    }

    /// Gives it the lowest CPU weight, so what runs in it (a launcher
    /// building its world in the pool) gets the cores only when running
    /// commands leave them idle; [`limit`](Self::limit) takes the default
    /// back. Nothing where it has no `cpu` controller.
    pub fn lower_cpu_weight(&mut self) -> std::io::Result<()> {
        for (dir, v2, controllers) in &self.dirs {
            if controllers.contains(&Controller::Cpu) {
                let (file, lowest, _) = if *v2 { CPU_WEIGHT } else { CPU_SHARES };
                write(&dir.join(file), lowest)?;
                self.lowered = true;
            }
        }
        Ok(())
    }

    /// Sets the limits this cgroup's controllers take (and the default CPU
    /// weight back, if it was lowered).
    pub fn limit(&self, limits: Limits) -> std::io::Result<()> {
        for (dir, v2, controllers) in &self.dirs {
            for controller in controllers {
                let weight = |(file, _, default): (&'static str, &str, &str)| {
                    self.lowered.then(|| (file, default.to_string()))
                };
                let writes: Vec<(&str, String)> = match (controller, v2) {
                    (Controller::Pids, _) => limits
                        .pids
                        .map(|n| vec![("pids.max", n.to_string())])
                        .unwrap_or_default(),
                    (Controller::Memory, true) => limits
                        .memory
                        .map(|n| {
                            vec![
                                ("memory.max", n.to_string()),
                                ("memory.swap.max", "0".into()),
                            ]
                        })
                        .unwrap_or_default(),
                    (Controller::Memory, false) => limits
                        .memory
                        .map(|n| vec![("memory.limit_in_bytes", n.to_string())])
                        .unwrap_or_default(),
                    (Controller::Cpu, true) => limits
                        .cpu_millis
                        .map(|m| ("cpu.max", format!("{} 100000", m * 100)))
                        .into_iter()
                        .chain(weight(CPU_WEIGHT))
                        .collect(),
                    (Controller::Cpu, false) => limits
                        .cpu_millis
                        .map(|m| {
                            vec![
                                ("cpu.cfs_period_us", "100000".into()),
                                ("cpu.cfs_quota_us", (m * 100).to_string()),
                            ]
                        })
                        .unwrap_or_default()
                        .into_iter()
                        .chain(weight(CPU_SHARES))
                        .collect(),
                };
                for (file, value) in writes {
                    match write(&dir.join(file), &value) {
                        // Without swap accounting there is no swap to limit.
                        Err(_) if file == "memory.swap.max" => {}
                        written => written?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Kills every process in it (see [`kill_all`]).
    pub fn kill(&self) {
        kill_all(&self.dirs);
    }
}

impl Drop for CommandCgroup {
    /// Kills what is left and removes the directories, on the remover's
    /// thread: a cgroup can be removed only once its last process is gone.
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        if !dirs.is_empty() {
            remove_later(dirs);
        }
    }
}

/// A cgroup's directories, as [`CommandCgroup`] holds them.
type Dirs = Vec<(PathBuf, bool, Vec<Controller>)>;

/// Hands `dirs` to the one thread that removes command cgroups (started
/// at the first), which kills what is in them and removes each once it is
/// empty, trying again every [`REMOVE_EVERY`] for up to [`REMOVE_FOR`].
/// One thread for all: starting one per command put a thread's
/// start on every answer's path (bench/README.md).
fn remove_later(dirs: Dirs) {
    static REMOVER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Dirs>>> =
        std::sync::OnceLock::new();
    let remover = REMOVER.get_or_init(|| {
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cgroup-remove".into())
            .spawn(move || remove_all(&receive))
            .ok()
            .map(|_| send)
    });
    // Without the thread (none could be started), left to the next start's
    // `remove_stale`.
    if let Some(remover) = remover {
        let _ = remover.send(dirs);
    }
}

/// How often an emptied cgroup that could not be removed is tried again
/// (at least: also whenever another comes)…
const REMOVE_EVERY: Duration = Duration::from_millis(20);
/// …and for how long before it is left to the next start's `remove_stale`.
const REMOVE_FOR: Duration = Duration::from_secs(2);

/// The remover's loop: each cgroup killed as it comes, then every
/// directory not yet removed tried again each [`REMOVE_EVERY`], so a slow
/// one (a v1 memory cgroup's removal is slow work in the kernel) holds up
/// no other.
fn remove_all(receive: &std::sync::mpsc::Receiver<Dirs>) {
    let mut pending: Vec<(PathBuf, std::time::Instant)> = Vec::new();
    loop {
        let came = match pending.is_empty() {
            true => receive.recv().ok(),
            false => match receive.recv_timeout(REMOVE_EVERY) {
                Ok(dirs) => Some(dirs),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        if let Some(dirs) = came {
            kill_all(&dirs);
            let until = std::time::Instant::now() + REMOVE_FOR;
            pending.extend(dirs.into_iter().map(|(dir, _, _)| (dir, until)));
        } else if pending.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        pending.retain(|(dir, until)| {
            let gone = std::fs::remove_dir(dir).is_ok() || !dir.exists();
            !gone && now < *until
        });
    }
}

/// Writes a cgroup file; an error names it.
fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Kills every process in these cgroups: `cgroup.kill` where there is one
/// (v2), else each listed process until none is left (a fork race is
/// bounded by the rounds, and by the PID namespace, which dies with the
/// command anyway).
fn kill_all(dirs: &[(PathBuf, bool, Vec<Controller>)]) {
    for (dir, _, _) in dirs {
        if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
            continue;
        }
        for _ in 0..20 {
            let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
                break;
            };
            let pids: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// This process's cgroup in the unified hierarchy, if one is mounted.
fn unified_dir(mountinfo: &str, own: &str) -> Option<PathBuf> {
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2").then(|| left.split_whitespace().nth(4))?
    })?;
    let path = own.lines().find_map(|line| line.strip_prefix("0::"))?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// This process's cgroup in the v1 hierarchy that has `controller`.
fn v1_dir(mountinfo: &str, own: &str, controller: Controller) -> Option<PathBuf> {
    let has = |list: &str| list.split(',').any(|c| c == controller.name());
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split_whitespace();
        (right.next()? == "cgroup" && has(right.nth(1)?)).then(|| left.split_whitespace().nth(4))?
    })?;
    let path = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, list, path) = (parts.next()?, parts.next()?, parts.next()?);
        has(list).then_some(path)
    })?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// v2: moves this process into a leaf `daemon` of its cgroup and enables
/// `controllers` for the cgroups made beside it.
fn enable_below(dir: &Path, controllers: &[Controller]) -> std::io::Result<()> {
    let leaf = dir.join("daemon");
    match std::fs::create_dir(&leaf) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    std::fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())?;
    let enable: Vec<String> = controllers
        .iter()
        .map(|c| format!("+{}", c.name()))
        .collect();
    std::fs::write(dir.join("cgroup.subtree_control"), enable.join(" "))
}

/// Removes the v1 directories of daemons that are gone (`portcullis-PID`
/// with no such process), with their command cgroups: anything still in
/// one (a command of a daemon that was killed, had it outlived it) is
/// killed first, since nothing audits it any more.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("portcullis-")) else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        if let Ok(children) = std::fs::read_dir(entry.path()) {
            for child in children.flatten().filter(|c| c.path().is_dir()) {
                kill_all(&[(child.path(), false, Vec::new())]);
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(entry.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const OWN: &str = "\
8:pids:/
4:memory:/process_api/abc
2:cpu,cpuacct:/
0::/system.slice/portcullis.service
";

    #[test]
    fn hierarchies_and_own_paths_are_read_from_proc() {
        assert_eq!(
            v1_dir(MOUNTINFO, OWN, Controller::Memory).unwrap(),
            Path::new("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(
            v1_dir(MOUNTINFO, OWN, Controller::Cpu).unwrap(),
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(
            v1_dir(MOUNTINFO, OWN, Controller::Pids).unwrap(),
            Path::new("/sys/fs/cgroup/pids")
        );
        assert_eq!(
            unified_dir(MOUNTINFO, OWN).unwrap(),
            Path::new("/sys/fs/cgroup/unified/system.slice/portcullis.service")
        );
        assert!(unified_dir("", OWN).is_none());
    }
}

//! The launcher on its own, as the daemon runs it (the end-to-end tests in
//! the daemon's `tests/e2e_shell.rs` run it under a gateway). Building this
//! test is also what makes `cargo test --workspace` build the launcher
//! binary the daemon's end-to-end tests start commands through.

use std::ffi::OsString;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use portcullis_sandbox::encode_args;

/// A launcher as the daemon's pool starts it: waiting for its arguments
/// on stdin, in a world of its own (without network, `root` read-write)
/// when given a root, else without one.
fn waiting_launcher(root: Option<&std::path::Path>) -> std::process::Child {
    waiting_launcher_with(root, &[])
}

/// [`waiting_launcher`] with more of the world's layout (`--tmp-size`…).
fn waiting_launcher_with(root: Option<&std::path::Path>, layout: &[&str]) -> std::process::Child {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_portcullis-sandbox"));
    launcher.arg("--args-on-stdin");
    if let Some(root) = root {
        launcher
            .args(["--world", "--deny-network", "--rw"])
            .arg(root);
    }
    launcher
        .args(layout)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The launcher as the daemon runs it for a piped command: started ahead
/// of need, it reads its arguments from stdin, sets up the sandbox, then
/// waits for the release byte; without it the program never runs.
#[test]
fn the_launcher_runs_the_program_only_once_released() {
    let dir_dir = tempfile::Builder::new()
        .prefix("portcullis-release-")
        .tempdir()
        .unwrap();
    let dir = dir_dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let marker = dir.join("ran");
    // A waiting launcher, and the arguments the daemon would send it.
    let launcher = |extra: &[&str], script: &str| {
        let mut child = waiting_launcher(Some(&dir));
        let mut args: Vec<OsString> = vec!["--rw".into(), dir.clone().into()];
        args.extend(["--deny-network", "--await-release"].map(OsString::from));
        args.extend(extra.iter().map(OsString::from));
        args.extend(["--env", "GREETING", "hi there"].map(OsString::from));
        args.extend(["--cwd".into(), dir.clone().into(), "sub".into()]);
        args.extend(["--", "/bin/sh", "-c", script].map(OsString::from));
        let stdin = child.stdin.as_mut().unwrap();
        stdin.write_all(&encode_args(&args)).unwrap();
        child
    };
    let touch = format!("touch {}; cat", marker.display());

    // Input closed without the release: refused, nothing ran.
    let mut child = launcher(&[], &touch);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the program ran before its release");
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not release"),
        "{out:?}"
    );
    assert!(!marker.exists(), "the program ran without a release");

    // Released: the program runs and the input after the byte is its own.
    let mut child = launcher(&[], &touch);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ghello").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"hello");
    assert!(marker.exists());

    // The environment is exactly the one sent, the working directory the
    // one named beneath its root, and a seccomp filter (the network's) on.
    let script = "env; pwd; grep Seccomp: /proc/self/status";
    let mut child = launcher(&["--stdin-null"], script);
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let env: Vec<&str> = lines[..lines.len() - 2]
        .iter()
        .copied()
        .filter(|l| !["PWD=", "SHLVL=", "_="].iter().any(|p| l.starts_with(p)))
        .collect();
    assert_eq!(env, ["GREETING=hi there"], "{stdout}");
    assert_eq!(lines[lines.len() - 2], dir.join("sub").to_str().unwrap());
    assert_eq!(lines[lines.len() - 1], "Seccomp:\t2", "{stdout}");

    // --stdin-null: after the release the program reads /dev/null.
    let mut child = launcher(&["--stdin-null"], "readlink /proc/self/fd/0");
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "/dev/null");

    // A working directory that leaves its root: refused before anything ran.
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis-sandbox"))
        .arg("--args-on-stdin")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let args = ["--cwd", dir.to_str().unwrap(), "../..", "--", "/bin/true"];
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&encode_args(&args))
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("working directory"),
        "{out:?}"
    );

    // A launcher started without network (as the pool keeps them for
    // grants that deny it) runs such a command, and refuses one whose
    // arguments allow the network rather than run it with less.
    let prefiltered = |deny: bool| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis-sandbox"))
            .args(["--args-on-stdin", "--deny-network"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut args: Vec<&str> = deny.then_some("--deny-network").into_iter().collect();
        // A launcher without a world (a host without namespaces).
        args.extend(["--skip", "namespaces", "--", "/bin/sh", "-c", "echo ran"]);
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&encode_args(&args)).unwrap();
        drop(stdin);
        child.wait_with_output().unwrap()
    };
    let out = prefiltered(true);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n", "{out:?}");
    let out = prefiltered(false);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("may use it"),
        "{out:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A launcher waiting in its world has confined itself before its command
/// comes, as far as the world decides (no capabilities, `no_new_privs`,
/// the seccomp filters; Landlock with them), so that a request does not
/// wait for it; and it refuses a command whose world would differ — here
/// in its `/tmp` size — rather than run it confined as another grant's.
#[test]
fn a_waiting_world_is_confined_before_its_command_comes() {
    let dir = tempfile::Builder::new()
        .prefix("portcullis-confined-")
        .tempdir()
        .unwrap();
    let marker = dir.path().join("ran");
    let child = waiting_launcher_with(Some(dir.path()), &["--tmp-size", "8388608"]);
    // The launcher inside: bwrap's child, the launcher's grandchild.
    let parent_of = |pid: &str| -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after_name = stat.rsplit_once(')')?.1;
        after_name.split_whitespace().nth(1).map(str::to_string)
    };
    let launcher = child.id().to_string();
    let started = std::time::Instant::now();
    let status = loop {
        let inside = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|entry| {
                let pid = entry.file_name().to_string_lossy().to_string();
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let grandparent = parent_of(&parent_of(&pid)?)?;
                let is_inside = cmdline.split(|b| *b == 0).any(|arg| arg == b"--inside");
                (is_inside && grandparent == launcher).then_some(pid)
            });
        let status =
            inside.and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok());
        match status {
            Some(status) if status.contains("Seccomp:\t2") => break status,
            _ if started.elapsed() > Duration::from_secs(10) => {
                panic!("no confined launcher inside the world after 10 s: {status:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    for line in [
        "NoNewPrivs:\t1",
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
    ] {
        assert!(status.contains(line), "{line} while waiting:\n{status}");
    }
    let script = format!("touch {}", marker.display());
    let args: Vec<OsString> = vec![
        "--rw".into(),
        dir.path().into(),
        "--deny-network".into(),
        "--tmp-size".into(),
        "4096".into(),
        "--".into(),
        "/bin/sh".into(),
        "-c".into(),
        script.into(),
    ];
    let out = released(child, &args);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("made for other roots, network, /tmp or confinement"),
        "{out:?}"
    );
    assert!(!marker.exists(), "a command for another world ran");
}

/// A signal the daemon sends the command's process group before the
/// program exists (it may: the client hears `started` once the release is
/// written) is held by the launchers and ends the program once it runs:
/// sent while the launcher waits for its release, with a world and
/// without, and sent while a launcher just started (as one the daemon
/// starts on demand) is still making its world, at several moments of it.
#[test]
fn a_signal_sent_before_the_program_runs_ends_it() {
    use std::os::unix::process::ExitStatusExt as _;
    let dir = tempfile::Builder::new()
        .prefix("portcullis-signal-")
        .tempdir()
        .unwrap();
    let waiting = [(true, 500), (false, 500)].repeat(2);
    let starting = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20].map(|ms| (true, ms));
    for (world, after_ms) in waiting.into_iter().chain(starting) {
        let mut child = waiting_launcher(world.then_some(dir.path()));
        let mut args: Vec<OsString> = match world {
            true => vec!["--rw".into(), dir.path().into(), "--deny-network".into()],
            false => ["--skip", "namespaces"].map(OsString::from).to_vec(),
        };
        args.extend(["--await-release", "--stdin-null"].map(OsString::from));
        args.extend(["--", "/bin/sh", "-c", "exec sleep 30"].map(OsString::from));
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&encode_args(&args)).unwrap();
        let released = match after_ms {
            // Waiting for the release: set up by now, in its own session.
            500 => false,
            // Released at once, as the daemon does on demand.
            _ => {
                let _ = stdin.write_all(b"g");
                true
            }
        };
        std::thread::sleep(Duration::from_millis(after_ms));
        // As the daemon: the group, or the launcher before it has made one.
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process_group(pid, rustix::process::Signal::TERM)
            .or_else(|_| rustix::process::kill_process(pid, rustix::process::Signal::TERM))
            .unwrap();
        if !released {
            // A launcher that ended at the signal reads no release: fine.
            let _ = stdin.write_all(b"g");
        }
        drop(stdin);
        let (sent, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || sent.send(child.wait_with_output()));
        let out = ended
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("world {world}, {after_ms} ms: the TERM was lost"))
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(15),
            "world {world}, {after_ms} ms: {out:?}"
        );
    }
}

/// A process whose command line names a path, as the tests below look
/// for what is left of a world.
#[derive(Debug)]
struct Named {
    pid: rustix::process::Pid,
    cmdline: Vec<u8>,
}

impl Named {
    /// Its pid, command line and the lines of its status that say where
    /// it is.
    fn describe(&self) -> String {
        let pid = self.pid.as_raw_nonzero();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let keep = |l: &&str| {
            ["Name:", "State:", "PPid:", "NSpid:"]
                .iter()
                .any(|k| l.starts_with(k))
        };
        let status = status.lines().filter(keep).collect::<Vec<_>>().join(" ");
        let cmdline = String::from_utf8_lossy(&self.cmdline);
        format!("{pid}: {cmdline:?} {status}")
    }
}

/// Every process whose command line has `path` as one of its arguments.
fn processes_naming(path: &std::path::Path) -> Vec<Named> {
    let mark = path.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = rustix::process::Pid::from_raw(entry.file_name().to_str()?.parse().ok()?)?;
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.as_raw_nonzero())).ok()?;
            let names_it = cmdline.split(|b| *b == 0).any(|arg| arg == mark);
            names_it.then_some(Named { pid, cmdline })
        })
        .collect()
}

/// What `left` still finds after 5 s (a world's teardown takes a moment),
/// each described, then killed here.
fn survivors_of(left: impl Fn() -> Vec<Named>) -> Vec<String> {
    let started = std::time::Instant::now();
    let mut survivors = left();
    while !survivors.is_empty() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        survivors = left();
    }
    // Described before they are killed (their status goes with them).
    let described = survivors.iter().map(Named::describe).collect();
    for process in &survivors {
        let _ = rustix::process::kill_process(process.pid, rustix::process::Signal::KILL);
    }
    described
}

/// A launcher killed while it makes its world (as its parent-death signal
/// kills it when the daemon dies, at any moment) leaves nothing behind:
/// not bwrap's monitor, not the world's first process — which, had the
/// monitor died before letting it go on, would wait for it forever.
#[test]
fn a_launcher_killed_while_making_its_world_leaves_nothing() {
    let dir = tempfile::Builder::new()
        .prefix("portcullis-killed-")
        .tempdir()
        .unwrap();
    let left = || processes_naming(dir.path());
    // The look finds a world that is being made or waits: bwrap's
    // monitor, the launcher inside.
    let mut child = waiting_launcher(Some(dir.path()));
    let started = std::time::Instant::now();
    while left().len() < 2 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let found = left();
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(found.len() >= 2, "no world found: {found:?}, {out:?}");
    // Every 250 µs through the making of the world, then once it waits.
    let moments = (0..=48)
        .map(|n| n * 250)
        .chain([15, 20, 30, 50, 80, 120, 200, 300].map(|ms| ms * 1000));
    let mut killed = 0;
    // Their stdin (where a waiting world reads its arguments) stays open:
    // the world must end because its launcher did, not because that closed.
    let mut stdins = Vec::new();
    for after_us in moments {
        let mut child = waiting_launcher(Some(dir.path()));
        // Not read here: a survivor holding them would stall nothing.
        drop((child.stdout.take(), child.stderr.take()));
        // Taken before `wait`, which would close it.
        stdins.push(child.stdin.take());
        std::thread::sleep(Duration::from_micros(after_us));
        child.kill().unwrap();
        child.wait().unwrap();
        killed += 1;
    }
    let described = survivors_of(left);
    drop(stdins);
    assert!(
        described.is_empty(),
        "{killed} launchers killed while making their worlds left {} processes behind: {described:#?}",
        described.len()
    );
}

/// A launcher killed once its world has its command — while it waits for
/// the release, or while the program runs — takes the world with it: the
/// launcher inside watches the status pipe in every wait, not only while
/// it waits for its arguments. Their stdin stays open, as in the test
/// above.
#[test]
fn a_launcher_killed_after_its_command_came_takes_its_world_with_it() {
    let dir = tempfile::Builder::new()
        .prefix("portcullis-killed-later-")
        .tempdir()
        .unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    // The launchers and bwrap name the root by `--rw`, the program (`sh`)
    // by its `$0`.
    let left = || processes_naming(dir.path());
    let runs_sh = |found: &[Named]| found.iter().any(|p| p.cmdline.starts_with(b"/bin/sh\0"));
    for released in [false, true] {
        let mut child = waiting_launcher(Some(dir.path()));
        drop((child.stdout.take(), child.stderr.take()));
        let mut args: Vec<OsString> = vec!["--rw".into(), root.clone().into()];
        args.extend(["--deny-network", "--await-release", "--stdin-null"].map(OsString::from));
        args.extend(["--", "/bin/sh", "-c", "sleep 30; :"].map(OsString::from));
        args.push(root.clone().into());
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&encode_args(&args)).unwrap();
        if released {
            stdin.write_all(b"g").unwrap();
        }
        let started = std::time::Instant::now();
        let ready = |found: &[Named]| match released {
            true => runs_sh(found),
            // The monitor, the launcher inside and this one.
            false => found.len() >= 3,
        };
        while !ready(&left()) && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Time to read its arguments and settle, when not released.
        std::thread::sleep(Duration::from_millis(200));
        let found = left();
        assert!(ready(&found), "released {released}: not ready: {found:?}");
        assert_eq!(runs_sh(&found), released, "{found:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        let described = survivors_of(left);
        drop(stdin);
        assert!(
            described.is_empty(),
            "released {released}: the world outlived its launcher: {described:#?}"
        );
    }
}

/// Gives a waiting launcher `args` and its release, closes its input and
/// waits for it.
fn released(mut child: std::process::Child, args: &[OsString]) -> std::process::Output {
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&encode_args(args)).unwrap();
    stdin.write_all(b"g").unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// A descriptor the launcher's parent left open does not reach the
/// program, in a world or not; nor does any the launchers or bwrap held.
#[test]
fn the_program_inherits_only_stdin_stdout_and_stderr() {
    let dir = tempfile::Builder::new()
        .prefix("portcullis-fds-")
        .tempdir()
        .unwrap();
    // `dup` leaves out close-on-exec: the launcher inherits it.
    let leaked = rustix::io::dup(std::fs::File::open("/dev/null").unwrap()).unwrap();
    for world in [true, false] {
        let child = waiting_launcher(world.then_some(dir.path()));
        let mut args: Vec<OsString> = match world {
            true => vec!["--rw".into(), dir.path().into(), "--deny-network".into()],
            false => ["--skip", "namespaces"].map(OsString::from).to_vec(),
        };
        args.extend(["--await-release", "--stdin-null", "--"].map(OsString::from));
        // No pipeline: the shell holds a pipe's ends while it starts one.
        args.extend(["/bin/sh", "-c", "ls /proc/$$/fd; :"].map(OsString::from));
        let out = released(child, &args);
        assert!(out.status.success(), "world {world}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "0\n1\n2\n",
            "world {world} (fd {} leaked): {out:?}",
            std::os::fd::AsRawFd::as_raw_fd(&leaked)
        );
    }
}

/// Once the program runs, the launcher inside (the world's pid 1) holds
/// /dev/null, not the program's stdout and stderr: their end, at which the
/// daemon answers, comes with the program's, not after the world's
/// teardown. (It lets go just after starting the program: the program
/// looks for a while.)
#[test]
fn the_launcher_inside_lets_go_of_the_program_s_output() {
    let dir = tempfile::Builder::new()
        .prefix("portcullis-let-go-")
        .tempdir()
        .unwrap();
    let child = waiting_launcher(Some(dir.path()));
    let mut args: Vec<OsString> = vec!["--rw".into(), dir.path().into(), "--deny-network".into()];
    args.extend(["--await-release", "--stdin-null", "--"].map(OsString::from));
    let script = "for i in $(seq 500); do \
         if [ \"$(readlink /proc/1/fd/1)\" = /dev/null ] && [ \"$(readlink /proc/1/fd/2)\" = /dev/null ]; \
         then echo let go; exit 0; fi; sleep 0.01; done; ls -l /proc/1/fd; exit 1";
    args.extend(["/bin/sh", "-c", script].map(OsString::from));
    let out = released(child, &args);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "let go\n", "{out:?}");
}

/// What bwrap says when it cannot make the world reaches the launcher's
/// stderr, before the launcher's own refusal: here it may not start the
/// world's first process (a user of its own with `RLIMIT_NPROC` 2: the
/// launcher and bwrap).
#[test]
fn bwrap_s_own_error_reaches_the_launcher_s_stderr() {
    let (_copy, launcher) = launcher_for_another_user();
    let out = Command::new("setpriv")
        .args([
            "--reuid=61741",
            "--regid=61741",
            "--clear-groups",
            "prlimit",
            "--nproc=2",
        ])
        .arg(&launcher)
        .args(["--rw", "/tmp", "--deny-network", "--", "/bin/true"])
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(stderr.starts_with("bwrap: "), "{stderr}");
    assert!(
        stderr.contains("bwrap could not set up the command's namespaces"),
        "{stderr}"
    );
}

/// A copy of the launcher another user can reach (the build may be under
/// a directory only root may enter, as `.ci/run`'s clone is), in a
/// directory that goes when the first value is dropped. The tests that
/// run it as another user need root.
fn launcher_for_another_user() -> (tempfile::TempDir, std::path::PathBuf) {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs the launcher as another user: run the suite as root (as .ci/run does)"
    );
    let dir = tempfile::Builder::new()
        .prefix("portcullis-other-user-")
        .tempdir()
        .unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(dir.path(), mode).unwrap();
    let launcher = dir.path().join("portcullis-sandbox");
    std::fs::copy(env!("CARGO_BIN_EXE_portcullis-sandbox"), &launcher).unwrap();
    (dir, launcher)
}

/// What of `/etc` the daemon says is hidden is covered inside the world,
/// as root and as another user (whose launcher inside holds its
/// capabilities in a user namespace nested below the one that owns
/// bwrap's mounts): a file cannot be opened, a directory is empty but
/// for a granted root beneath it, bound back whole, and an entry inside
/// a granted root is not covered (the operator granted it).
#[test]
fn what_of_etc_is_hidden_is_covered_inside_the_world() {
    // A directory of /etc all may read, with such a subdirectory that
    // holds a file all may read.
    let readable = |path: &std::path::Path| {
        let mode = std::fs::metadata(path).map_or(0, |m| {
            std::os::unix::fs::PermissionsExt::mode(&m.permissions())
        });
        mode & 0o004 != 0
    };
    let entries = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut found: Vec<_> = std::fs::read_dir(dir)
            .map(|read| read.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        found.sort();
        found
    };
    let is_dir = |p: &std::path::PathBuf| p.symlink_metadata().is_ok_and(|m| m.is_dir());
    let is_file = |p: &std::path::PathBuf| p.symlink_metadata().is_ok_and(|m| m.is_file());
    let (dir, sub, inner) = entries(std::path::Path::new("/etc"))
        .into_iter()
        .filter(|dir| is_dir(dir) && readable(dir))
        .find_map(|dir| {
            entries(&dir)
                .into_iter()
                .filter(|sub| is_dir(sub) && readable(sub))
                .find_map(|sub| {
                    let inner = entries(&sub)
                        .into_iter()
                        .find(|f| is_file(f) && readable(f))?;
                    Some((dir.clone(), sub, inner))
                })
        })
        .expect("a directory of /etc with a readable subdirectory and file");
    let file = "/etc/passwd";
    let host_listing: Vec<String> = entries(&sub)
        .iter()
        .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .collect();
    let (_copy, launcher) = launcher_for_another_user();
    let script = "cat \"$1\" >/dev/null 2>&1; echo \"file=$?\"; ls -A \"$2\"; echo --; ls -A \"$3\"; \
                  echo --; head -c 0 \"$4\" && echo inner-read";
    for user in [None, Some("61741")] {
        let mut command = match user {
            None => Command::new(&launcher),
            Some(uid) => {
                let mut setpriv = Command::new("setpriv");
                setpriv
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg(&launcher);
                setpriv
            }
        };
        let out = command
            .args(["--deny-network", "--ro"])
            .arg(&sub)
            .args(["--etc-looked", "--hide", file, "--hide"])
            .arg(&dir)
            .arg("--hide")
            .arg(&inner)
            .args(["--hide", "/etc/portcullis-test-gone", "--"])
            .args(["/bin/sh", "-c", script, "sh", file])
            .args([&dir, &sub, &inner])
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "as {user:?}: {out:?}");
        let parts: Vec<&str> = stdout.split("--\n").collect();
        assert_eq!(parts.len(), 3, "as {user:?}: {stdout}");
        assert_eq!(
            parts[0].lines().next(),
            Some("file=1"),
            "as {user:?}: {stdout}"
        );
        let sub_name = sub.file_name().unwrap().to_string_lossy();
        assert_eq!(
            parts[0].lines().skip(1).collect::<Vec<_>>(),
            [&*sub_name],
            "as {user:?}"
        );
        assert_eq!(
            parts[1].lines().collect::<Vec<_>>(),
            host_listing,
            "as {user:?}"
        );
        assert_eq!(parts[2], "inner-read\n", "as {user:?}: {stdout}");
    }
}

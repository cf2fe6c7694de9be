//! `portcullis doctor`: checks an installation the way the daemon will use
//! it — config, policy, keys, state directory, roots, the command sandbox,
//! listen addresses, the admin socket — and says for each what to do.
//! Exit 1 when any check fails.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;

use portcullis::config::Config;
use portcullis_policy::{Mode, Policy};
use rustix::fs::Access;
use serde_json::json;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

struct Check {
    status: Status,
    what: String,
    detail: String,
}

#[derive(Default)]
struct Report(Vec<Check>);

impl Report {
    fn add(&mut self, status: Status, what: impl Into<String>, detail: impl Into<String>) {
        self.0.push(Check {
            status,
            what: what.into(),
            detail: detail.into(),
        });
    }
}

pub fn doctor(config_path: &Path, json: bool) -> ExitCode {
    let mut report = Report::default();
    match Config::load(config_path) {
        Ok(config) => {
            report.add(Status::Ok, "config", config_path.display().to_string());
            check_installation(&config, &mut report);
        }
        Err(e) => report.add(
            Status::Fail,
            "config",
            format!("{e} — fix it; nothing else can be checked without it"),
        ),
    }
    let worst = report
        .0
        .iter()
        .map(|c| c.status)
        .max()
        .unwrap_or(Status::Ok);
    if json {
        let checks: Vec<_> = report
            .0
            .iter()
            .map(|c| json!({"status": c.status.label(), "check": c.what, "detail": c.detail}))
            .collect();
        println!("{}", json!({"checks": checks, "status": worst.label()}));
    } else {
        for c in &report.0 {
            println!("{:<5} {}: {}", c.status.label(), c.what, c.detail);
        }
    }
    if worst == Status::Fail {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn check_installation(config: &Config, report: &mut Report) {
    let policy = match portcullis_policy::load_file(&config.policy) {
        Ok(policy) => {
            report.add(
                Status::Ok,
                "policy",
                format!(
                    "{}: {} principals, {} grants, {} roots, {} tools",
                    config.policy.display(),
                    policy.principals.len(),
                    policy.grants.len(),
                    policy.roots.len(),
                    policy.tools.len()
                ),
            );
            Some(policy)
        }
        Err(errors) => {
            report.add(
                Status::Fail,
                "policy",
                format!("does not load — fix these, then `portcullis policy reload`:\n{errors}"),
            );
            None
        }
    };
    check_key(config, report);
    check_state_dir(&config.state_dir, report);
    if let Some(policy) = &policy {
        check_roots(policy, report);
    }
    check_sandbox(report);
    check_listen(config, report);
    check_relays(config, report);
    check_admin_socket(&config.admin_socket, report);
}

fn check_key(config: &Config, report: &mut Report) {
    let path = &config.key_file;
    match portcullis_wire::keyfile::load(path) {
        Ok(key) => {
            let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
            if mode & 0o077 != 0 {
                report.add(
                    Status::Warn,
                    "gateway key",
                    format!(
                        "{} is readable by others (mode {:o}): chmod 600 it",
                        path.display(),
                        mode & 0o777
                    ),
                );
            } else {
                report.add(
                    Status::Ok,
                    "gateway key",
                    format!("{} ({})", path.display(), key.public().fingerprint()),
                );
            }
        }
        Err(e) => report.add(
            Status::Fail,
            "gateway key",
            format!(
                "{e} — create it with `portcullis keys generate {}`",
                path.display()
            ),
        ),
    }
}

fn check_state_dir(dir: &Path, report: &mut Report) {
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => report.add(
            Status::Fail,
            "state dir",
            format!("{} is not a directory", dir.display()),
        ),
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if rustix::fs::access(dir, Access::WRITE_OK | Access::EXEC_OK).is_err() {
                report.add(
                    Status::Fail,
                    "state dir",
                    format!(
                        "{} is not writable by uid {} (owner uid {}): run doctor as the gateway's user, or chown it",
                        dir.display(),
                        rustix::process::geteuid().as_raw(),
                        meta.uid()
                    ),
                );
            } else if mode & 0o077 != 0 {
                report.add(
                    Status::Warn,
                    "state dir",
                    format!(
                        "{} is open to others (mode {mode:o}); it holds the audit log and keys: chmod 700 it",
                        dir.display()
                    ),
                );
            } else {
                report.add(Status::Ok, "state dir", format!("{} (mode {mode:o})", dir.display()));
            }
        }
        Err(e) => report.add(
            Status::Warn,
            "state dir",
            format!(
                "{}: {e} — the gateway creates it at its first start (systemd's StateDirectory= does under the service)",
                dir.display()
            ),
        ),
    }
}

fn check_roots(policy: &Policy, report: &mut Report) {
    for root in &policy.roots {
        let what = format!("root {}", root.id);
        let path = &root.host_path;
        let writable = policy
            .grants
            .iter()
            .any(|g| g.fileops.get(&root.id) == Some(&Mode::Rw));
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                let read = rustix::fs::access(path, Access::READ_OK | Access::EXEC_OK);
                let write = rustix::fs::access(path, Access::WRITE_OK);
                if read.is_err() {
                    report.add(
                        Status::Fail,
                        what,
                        format!(
                            "{} is not readable by this user: fix its permissions",
                            path.display()
                        ),
                    );
                } else if writable && write.is_err() {
                    report.add(
                        Status::Warn,
                        what,
                        format!(
                            "{} is granted rw but is not writable by this user (under systemd it also needs ReadWritePaths=)",
                            path.display()
                        ),
                    );
                } else {
                    let mode = if writable { "rw" } else { "ro" };
                    report.add(Status::Ok, what, format!("{} ({mode})", path.display()));
                }
            }
            Ok(_) => report.add(
                Status::Fail,
                what,
                format!("{} is not a directory", path.display()),
            ),
            Err(e) => report.add(
                Status::Fail,
                what,
                format!(
                    "{}: {e} — create it, or remove the root from the policy",
                    path.display()
                ),
            ),
        }
    }
}

fn check_sandbox(report: &mut Report) {
    match portcullis::shell::host_sandbox() {
        Ok(support) => {
            for (mechanism, result) in support {
                let what = format!("sandbox {}", mechanism.name());
                match result {
                    Ok(()) => report.add(Status::Ok, what, "available"),
                    Err(why) => report.add(
                        Status::Warn,
                        what,
                        format!(
                            "missing ({why}); grants with sandbox = \"require\" refuse commands, \"best_effort\" runs them with a warning"
                        ),
                    ),
                }
            }
        }
        Err(e) => report.add(Status::Fail, "sandbox", e.message),
    }
}

fn check_listen(config: &Config, report: &mut Report) {
    for addr in &config.listen {
        let what = format!("listen {addr}");
        match std::net::TcpListener::bind(addr) {
            Ok(_) => report.add(Status::Ok, what, "free"),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => report.add(
                Status::Warn,
                what,
                "in use: the gateway (or portcullis.socket) already listens there, or another program does (`ss -ltnp`)",
            ),
            Err(e) => report.add(Status::Fail, what, format!("cannot listen: {e}")),
        }
    }
}

/// Each `[[relay]]` endpoint: its token file, then DNS, TCP, TLS and the
/// upgrade with the token, as the daemon connects (and closes at once).
fn check_relays(config: &Config, report: &mut Report) {
    if config.relays.is_empty() {
        return;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return report.add(
                Status::Fail,
                "relay",
                format!("cannot start a runtime: {e}"),
            );
        }
    };
    for relay in &config.relays {
        let what = format!("relay {}", relay.url);
        let token_file = match relay.token.path() {
            Ok(path) => path,
            Err(e) => {
                report.add(Status::Warn, what, format!("{e}; not checked here"));
                continue;
            }
        };
        if let Ok(meta) = std::fs::metadata(&token_file)
            && meta.permissions().mode() & 0o077 != 0
        {
            report.add(
                Status::Warn,
                format!("{what} token"),
                format!(
                    "{} is readable by others (mode {:o}): `chmod 600` it",
                    token_file.display(),
                    meta.permissions().mode() & 0o777
                ),
            );
        }
        let limit = config.limits.header_timeout;
        match runtime.block_on(portcullis::server::dial::probe(relay, limit)) {
            Ok(()) => {
                let tls = match relay.url.starts_with("wss://") {
                    true => "TLS checked, ",
                    false => "no TLS (loopback), ",
                };
                report.add(
                    Status::Ok,
                    what,
                    format!("reached; {tls}the upgrade with the bearer token accepted"),
                )
            }
            Err(e) => report.add(Status::Fail, what, e),
        }
    }
}

fn check_admin_socket(path: &Path, report: &mut Report) {
    let what = "admin socket";
    if !path.exists() {
        let detail = match path.parent() {
            Some(dir) if !dir.exists() => format!(
                "{}: not there yet; the gateway creates {} at start (RuntimeDirectory= under systemd)",
                path.display(),
                dir.display()
            ),
            _ => format!(
                "{}: not there yet; the gateway creates it at start",
                path.display()
            ),
        };
        return report.add(Status::Ok, what, detail);
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => report.add(
            Status::Ok,
            what,
            format!("{}: a running gateway answers", path.display()),
        ),
        Err(e) => report.add(
            Status::Warn,
            what,
            format!(
                "{}: {e} — no gateway answers (a stale file is replaced at the next start), or you lack permission (run as root or the portcullis group)",
                path.display()
            ),
        ),
    }
}

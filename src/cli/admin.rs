//! Verbs that talk to a running daemon through its admin socket:
//! `status`, `sessions`, `policy reload`, `pause`, `resume`.

use std::path::PathBuf;
use std::process::ExitCode;

use hyper::Method;
use portcullis::server::admin;
use serde_json::Value;

use crate::cli::{fail, runtime};
use portcullis::config::Config;

#[derive(clap::Args)]
pub struct Socket {
    /// The daemon's admin socket.
    #[arg(
        long,
        global = true,
        env = "PORTCULLIS_ADMIN_SOCKET",
        default_value = "/run/portcullis/admin.sock"
    )]
    pub admin_socket: PathBuf,
    /// The daemon's configuration: its `admin_socket` is the one used
    /// (the flag `audit` and `doctor` take; it wins over --admin-socket).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the daemon's JSON answer as is.
    #[arg(long, global = true)]
    pub json: bool,
}

impl Socket {
    /// The admin socket: from `--config` when given, else `--admin-socket`.
    fn path(&self) -> Result<PathBuf, String> {
        match &self.config {
            Some(config) => Config::load(config)
                .map(|config| config.admin_socket)
                .map_err(|e| e.to_string()),
            None => Ok(self.admin_socket.clone()),
        }
    }
}

/// Sends one admin request and prints the answer: JSON with `--json`, else
/// `describe`'s summary. Exit 1 unless the daemon answered 2xx.
pub fn call(
    socket: &Socket,
    method: Method,
    path: &str,
    describe: impl Fn(&Value) -> String,
) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => return fail(e),
    };
    let admin_socket = match socket.path() {
        Ok(path) => path,
        Err(e) => return fail(e),
    };
    match runtime.block_on(admin::request(&admin_socket, method, path)) {
        Ok((status, body)) => {
            if socket.json {
                println!("{body}");
            } else if status.is_success() {
                println!("{}", describe(&body));
            } else {
                eprintln!("portcullis: {}", error_text(&body));
            }
            if status.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => fail(e),
    }
}

fn error_text(body: &Value) -> String {
    match body.get("errors").and_then(Value::as_array) {
        Some(errors) => {
            let lines: Vec<String> = errors
                .iter()
                .map(|e| {
                    format!(
                        "{}:{}:{}: {}",
                        e["file"].as_str().unwrap_or(""),
                        e["line"],
                        e["column"],
                        e["message"].as_str().unwrap_or("")
                    )
                })
                .collect();
            format!("the policy was not reloaded:\n{}", lines.join("\n"))
        }
        None => body
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("the daemon refused")
            .to_string(),
    }
}

pub fn status(socket: &Socket) -> ExitCode {
    call(socket, Method::GET, "/v1/status", |b| {
        let relays: String = b["relays"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let detail = match (r["connected_since"].as_str(), r["last_error"].as_str()) {
                    (Some(since), _) => format!("since {since}"),
                    (None, Some(error)) => {
                        format!("{} attempt(s); last error: {error}", r["attempts"])
                    }
                    (None, None) => String::new(),
                };
                format!(
                    "\n  relay {}: {} {detail}",
                    r["url"].as_str().unwrap_or("?"),
                    r["state"].as_str().unwrap_or("?")
                )
            })
            .collect();
        let summary = format!(
            "portcullis {} ({}): {} session(s), policy {}, {}",
            b["version"].as_str().unwrap_or("?"),
            b["provider_id"].as_str().unwrap_or("?"),
            b["sessions"],
            b["policy_generation"]
                .as_str()
                .map(|g| &g[..g.len().min(12)])
                .unwrap_or("?"),
            match b["pause"].as_str() {
                Some("stop") => "STOPPED (emergency stop)",
                Some("soft") => "PAUSED (soft: new requests refused)",
                _ if b["paused"] == true => "PAUSED",
                _ => "running",
            }
        );
        format!("{summary}{relays}")
    })
}

pub fn sessions(socket: &Socket) -> ExitCode {
    call(socket, Method::GET, "/v1/sessions", |b| {
        let rows: Vec<String> = b["sessions"]
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|s| {
                        format!(
                            "{:>6}  {:<20} {:<22} {:>9}  {}",
                            s["id"],
                            s["principal"].as_str().unwrap_or(""),
                            s["peer"].as_str().unwrap_or(""),
                            s["in_flight"],
                            s["started_at"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        format!(
            "{:>6}  {:<20} {:<22} {:>9}  {}\n{}",
            "ID",
            "PRINCIPAL",
            "PEER",
            "IN FLIGHT",
            "STARTED",
            rows.join("\n")
        )
    })
}

pub fn kill(socket: &Socket, id: u64) -> ExitCode {
    call(
        socket,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        |_| format!("session {id} closed"),
    )
}

pub fn reload(socket: &Socket) -> ExitCode {
    call(socket, Method::POST, "/v1/policy/reload", |b| {
        format!(
            "policy reloaded (generation {})",
            b["generation"].as_str().unwrap_or("?")
        )
    })
}

/// `pause` (`Some(soft)`) or `resume` (`None`).
pub fn pause(socket: &Socket, pause: Option<bool>) -> ExitCode {
    let path = match pause {
        Some(false) => "/v1/pause",
        Some(true) => "/v1/pause?soft",
        None => "/v1/resume",
    };
    call(socket, Method::POST, path, move |_| match pause {
        Some(false) => "stopped: sessions closed, their requests failed, commands killed; \
                            new sessions are refused until `portcullis resume`"
            .into(),
        Some(true) => "paused (soft): new requests are refused until `portcullis resume`; \
                           sessions and running work go on"
            .into(),
        None => "resumed".into(),
    })
}

/// `portcullis approvals list`: the tool calls waiting for an operator.
pub fn approvals(socket: &Socket) -> ExitCode {
    call(socket, Method::GET, "/v1/approvals", |b| {
        let all = b["approvals"].as_array().cloned().unwrap_or_default();
        if all.is_empty() {
            return "no tool call or command is waiting for approval".into();
        }
        let rows: Vec<String> = all
            .iter()
            .map(|a| {
                format!(
                    "{:>6}  {:<16} {:<20} {:<17} {}  {}",
                    a["id"],
                    a["principal"].as_str().unwrap_or(""),
                    a["tool"]
                        .as_str()
                        .or_else(|| a["command"].as_str())
                        .unwrap_or(""),
                    a["approval_policy"].as_str().unwrap_or(""),
                    a["requested_at"].as_str().unwrap_or(""),
                    a["arguments"]
                )
            })
            .collect();
        format!(
            "{:>6}  {:<16} {:<20} {:<17} {}  {}\n{}",
            "ID",
            "PRINCIPAL",
            "TOOL/COMMAND",
            "POLICY",
            "REQUESTED",
            "ARGUMENTS",
            rows.join("\n")
        )
    })
}

/// `portcullis approvals approve|deny ID`.
pub fn decide_approval(socket: &Socket, id: u64, approve: bool) -> ExitCode {
    let verb = if approve { "approve" } else { "deny" };
    call(
        socket,
        Method::POST,
        &format!("/v1/approvals/{id}/{verb}"),
        move |_| format!("{} call {id}", if approve { "approved" } else { "denied" }),
    )
}

/// `portcullis metrics`: the daemon's Prometheus text, as served at
/// `/v1/metrics`.
pub fn metrics(socket: &Socket) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => return fail(e),
    };
    let admin_socket = match socket.path() {
        Ok(path) => path,
        Err(e) => return fail(e),
    };
    let mut out = std::io::stdout();
    match runtime.block_on(admin::download(&admin_socket, "/v1/metrics", &mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

//! Shared harness for end-to-end tests: starts the real `portcullis` binary
//! on 127.0.0.1 with a policy written by the test, and connects to it with
//! the real client library (or, for hostile tests, a raw WebSocket and the
//! Noise state machine).

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use portcullis_client::{Client, ClientError, ClientOptions};
use portcullis_crypto::{Handshake, PROLOGUE, PublicKey, StaticKeypair, Transport};
use portcullis_wire::frame::ErrorCode;
use portcullis_wire::keyfile;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Gateway {
    child: Child,
    pub dir: PathBuf,
    pub addr: SocketAddr,
    pub url: String,
    pub key: PublicKey,
    /// Extra environment of the daemon (kept across restarts).
    env: Vec<(String, String)>,
}

impl Gateway {
    /// Starts a gateway whose policy is `policy`, with `limits` appended to
    /// its config (a `[limits]` table, or "").
    pub fn start(policy: &str, limits: &str) -> Self {
        Self::start_with_env(policy, limits, &[])
    }

    /// [`start`](Self::start) with extra variables in the daemon's
    /// environment.
    pub fn start_with_env(policy: &str, limits: &str, env: &[(&str, &str)]) -> Self {
        Self::start_in(policy, limits, env, "state")
    }

    /// [`start`](Self::start) with the store in `state_dir` (absolute, or
    /// relative to the gateway's directory).
    pub fn start_in(policy: &str, limits: &str, env: &[(&str, &str)], state_dir: &str) -> Self {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let dir = std::env::temp_dir().join(format!(
            "portcullis-e2e-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("workspace")).unwrap();
        let gateway_key = keyfile::generate(&dir.join("gateway.key"), false).unwrap();
        std::fs::write(
            dir.join("policy.toml"),
            policy
                .replace("WORKSPACE", &dir.join("workspace").display().to_string())
                .replace("GWDIR", &dir.display().to_string()),
        )
        .unwrap();
        let config = format!(
            "listen = [\"127.0.0.1:0\"]\nkey_file = \"gateway.key\"\npolicy = \"policy.toml\"\n\
             state_dir = \"{state_dir}\"\nadmin_socket = \"admin.sock\"\n{limits}\n"
        );
        std::fs::write(dir.join("portcullis.toml"), config).unwrap();
        let (child, addr) = spawn(&dir, &env);
        Self {
            child,
            url: format!("ws://{addr}"),
            addr,
            key: *gateway_key.public(),
            dir,
            env,
        }
    }

    /// Stops the gateway (SIGTERM) and starts it again on the same directory.
    pub fn restart(&mut self) {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(15))
            .expect("gateway did not stop");
        let (child, addr) = spawn(&self.dir, &self.env);
        self.child = child;
        self.addr = addr;
        self.url = format!("ws://{addr}");
    }

    /// SIGKILL, then start again on the same directory: a crash.
    pub fn crash_and_restart(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let (child, addr) = spawn(&self.dir, &self.env);
        self.child = child;
        self.addr = addr;
        self.url = format!("ws://{addr}");
    }

    pub fn admin_socket(&self) -> PathBuf {
        self.dir.join("admin.sock")
    }

    /// Runs the CLI against this gateway's admin socket.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(args)
            .arg("--admin-socket")
            .arg(self.admin_socket())
            .output()
            .unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    pub fn write_policy(&self, policy: &str) {
        std::fs::write(
            self.dir.join("policy.toml"),
            policy
                .replace(
                    "WORKSPACE",
                    &self.dir.join("workspace").display().to_string(),
                )
                .replace("GWDIR", &self.dir.display().to_string()),
        )
        .unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// Waits for `needle` to appear in the gateway's log.
    pub async fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub async fn connect(&self, identity: &StaticKeypair) -> Result<Client, ClientError> {
        Client::connect(ClientOptions::new(&self.url, self.key, identity.clone())).await
    }

    pub async fn connect_with_token(&self, token: &str) -> Result<Client, ClientError> {
        let mut options =
            ClientOptions::new(&self.url, self.key, StaticKeypair::generate().unwrap());
        options.token = Some(zeroize::Zeroizing::new(token.to_string()));
        Client::connect(options).await
    }

    /// A raw WebSocket with a finished handshake, for sending what the
    /// client library never would. Returns the socket and the transport.
    pub async fn raw(&self, identity: &StaticKeypair) -> (WebSocketStream<TcpStream>, Transport) {
        let (ws, transport, hello) = self.raw_with_hello(identity).await;
        assert!(String::from_utf8_lossy(&hello).contains("\"hello\""));
        (ws, transport)
    }

    /// [`raw`](Self::raw), with the gateway's first record (its hello).
    pub async fn raw_with_hello(
        &self,
        identity: &StaticKeypair,
    ) -> (WebSocketStream<TcpStream>, Transport, Vec<u8>) {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        let request = format!("{}/api/v1/relay/connect", self.url)
            .into_client_request()
            .unwrap();
        let (mut ws, _) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
        let mut hs = Handshake::initiator(identity, PROLOGUE).pin_remote_static(self.key);
        ws.send(Message::Binary(hs.write_message(&[]).unwrap().into()))
            .await
            .unwrap();
        let Some(Ok(Message::Binary(m2))) = ws.next().await else {
            panic!("no message 2")
        };
        hs.read_message(&m2).unwrap();
        ws.send(Message::Binary(hs.write_message(b"{}").unwrap().into()))
            .await
            .unwrap();
        let mut transport = hs.into_transport().unwrap();
        let Some(Ok(Message::Binary(hello))) = ws.next().await else {
            panic!("no hello")
        };
        let hello = transport.open(&hello).unwrap();
        (ws, transport, hello)
    }
}

/// Starts `portcullis serve` on `dir`'s config; returns it and its address.
fn spawn(dir: &std::path::Path, env: &[(String, String)]) -> (Child, SocketAddr) {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr.log"))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["serve", "--config"])
        .arg(dir.join("portcullis.toml"))
        .env("RUST_LOG", "debug")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start portcullis serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let Some(addr) = line.trim().strip_prefix("listening on ") else {
        let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
        panic!("gateway did not start: stdout {line:?}\nstderr:\n{log}");
    };
    (child, addr.parse().unwrap())
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The error code of a request the gateway refused; `None` for a result
/// or an error of the client's own.
pub fn code(result: &Result<serde_json::Value, ClientError>) -> Option<ErrorCode> {
    match result {
        Err(ClientError::Remote(e)) => Some(e.code),
        _ => None,
    }
}

/// Reads from a raw socket until the gateway closes it; true if it did
/// within `within`.
pub async fn closed_by_gateway(ws: &mut WebSocketStream<TcpStream>, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .is_ok()
}

pub fn key_b64(key: &StaticKeypair) -> String {
    key.public().to_base64()
}

/// A `[[principal]]` table: `id`, authenticated by `key`.
pub fn principal(id: &str, key: &StaticKeypair) -> String {
    format!(
        "[[principal]]\nid = \"{id}\"\npublic_key = \"{}\"\n\n",
        key_b64(key)
    )
}

/// The root most tests grant: `main`, the gateway's `workspace`
/// directory, seen as `/workspace/main`.
pub const MAIN_ROOT: &str =
    "[[root]]\nid = \"main\"\npath = \"GWDIR/workspace\"\nvirtual_path = \"/workspace/main\"\n\n";

/// A policy with one principal, `alice` (this key), granted `resources`:
/// the one capability a provider serves today.
pub fn alice_policy(alice: &StaticKeypair) -> String {
    format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n\
         [[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nresources = {{}}\n",
        key_b64(alice)
    )
}

impl Gateway {
    /// Runs `portcullis ARGS --config <this gateway's config>`.
    pub fn cli_config(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(args)
            .arg("--config")
            .arg(self.dir.join("portcullis.toml"))
            .output()
            .unwrap()
    }

    /// The audit invariant over the whole log: `answered` requests (the
    /// responses the test's clients received) left exactly `answered`
    /// completing entries, each with its status and completion time, and
    /// every start entry of a long-running request has its completion.
    pub fn assert_requests_audited(&self, answered: usize) {
        use portcullis_store::Kind;
        let entries = self.audit_entries();
        let completed: Vec<_> = entries
            .iter()
            .filter(|e| e.record.kind == Kind::Request)
            .collect();
        for entry in &completed {
            assert!(
                entry.record.status.is_some() && entry.record.completed_at.is_some(),
                "a completing entry without status or completion time: {entry:?}"
            );
        }
        // Each start entry is completed by exactly one entry naming it.
        for start in entries
            .iter()
            .filter(|e| e.record.kind == Kind::RequestStart)
        {
            let completions: Vec<_> = completed
                .iter()
                .filter(|e| e.record.start_seq == Some(start.seq))
                .collect();
            assert!(
                completions.len() == 1
                    && completions[0].seq > start.seq
                    && completions[0].record.connection == start.record.connection
                    && completions[0].record.request_id == start.record.request_id,
                "request {:?} (start entry {}) completed by {completions:?}",
                start.record.request_id,
                start.seq
            );
        }
        // Each egress connection that was made was closed in the log too.
        for start in entries
            .iter()
            .filter(|e| e.record.kind == Kind::EgressStart)
        {
            assert!(
                entries.iter().any(|e| e.seq > start.seq
                    && e.record.kind == Kind::Egress
                    && e.record.connection == start.record.connection
                    && e.record.request_id == start.record.request_id
                    && e.record.destination == start.record.destination
                    && e.record.status.is_some()),
                "egress connection {:?} started but never closed",
                start.record.destination
            );
        }
        assert_eq!(
            completed.len(),
            answered,
            "completing request entries in the log: {completed:#?}"
        );
    }

    /// Every audit entry, newest first, read with `portcullis audit list`
    /// (through the admin socket while the gateway runs, else the store).
    pub fn audit_entries(&self) -> Vec<portcullis_store::Entry> {
        let out = self.cli_config(&["audit", "list", "--json", "--limit", "100000000"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A process on this host whose command line contains `marker`.
pub fn pid_with(marker: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        String::from_utf8_lossy(&cmdline)
            .contains(marker)
            .then_some(pid)
    })
}

/// Each process on this host whose command line contains `marker`, with
/// its ancestors (`pid state comm`, outwards): what a test that finds
/// one alive shows, to say which link of a chain failed.
pub fn ancestry_of(marker: &str) -> Vec<String> {
    let stat = |pid: u32| -> Option<(String, u32)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, tail) = text.rsplit_once(')')?;
        let comm = head.split_once('(')?.1;
        let mut fields = tail.split_whitespace();
        let state = fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some((format!("{pid} {state} {comm}"), ppid))
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            return None;
        }
        let mut chain = Vec::new();
        let mut next = pid;
        while next > 1 && chain.len() < 16 {
            let Some((line, ppid)) = stat(next) else {
                break;
            };
            chain.push(line);
            next = ppid;
        }
        Some(chain.join(" < "))
    })
    .collect()
}

/// Processes on this host whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.ok()?.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(marker).then_some(cmdline)
        })
        .collect()
}

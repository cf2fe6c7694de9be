//! A portcullis gateway for the benchmarks: the release binary beside this
//! one, on 127.0.0.1, with a bench policy (one principal; a read-write
//! root; `/bin/true` and `/bin/sh` under the default sandbox, network
//! denied) and limits raised for 10,000 sessions.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use portcullis_client::{Client, ClientError, ClientOptions};
use portcullis_crypto::{PublicKey, StaticKeypair};

pub struct Gateway {
    child: Child,
    pub url: String,
    pub key: PublicKey,
    pub identity: StaticKeypair,
    /// The client's key file (for the CLI).
    pub identity_file: PathBuf,
    /// The root's directory on disk (virtual root id `work`).
    pub root: PathBuf,
    pub dir: PathBuf,
}

/// The gateway's `max_frame`: a `shell.exec` result of 16 MiB of output
/// fits (each stream may fill half of it).
pub const MAX_FRAME: usize = 40 << 20;

/// The `portcullis` binary built beside this one.
pub fn binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let dir = exe.parent().ok_or("this binary has no directory")?;
    let bin = dir.join("portcullis");
    match bin.is_file() && dir.join("portcullis-sandbox").is_file() {
        true => Ok(bin),
        false => Err(format!(
            "{} and portcullis-sandbox are not built; run bench/run.sh (it builds them)",
            bin.display()
        )),
    }
}

impl Gateway {
    pub fn start(dir: &Path) -> Result<Self, String> {
        Self::start_with(dir, "")
    }

    /// [`start`](Self::start) with more of the config (e.g. `[[relay]]`).
    pub fn start_with(dir: &Path, extra_config: &str) -> Result<Self, String> {
        let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
        std::fs::create_dir_all(dir.join("root")).map_err(|e| fail("the bench directory", &e))?;
        let gateway_key = portcullis_wire::keyfile::generate(&dir.join("gateway.key"), true)
            .map_err(|e| fail("the gateway key", &e))?;
        let identity_file = dir.join("client.key");
        let identity = portcullis_wire::keyfile::generate(&identity_file, true)
            .map_err(|e| fail("the client key", &e))?;
        let root = dir.join("root");
        // The environment socket's peers are principals by user: this one.
        let uid = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(&root).map_err(|e| fail("the root", &e))?,
        );
        let policy = format!(
            r#"[[principal]]
id = "bench"
public_key = "{client}"
unix_uid = {uid}

[[root]]
id = "work"
path = "{root}"
virtual_path = "/work"

[[grant]]
id = "bench"
principals = ["bench"]
resources = {{}}
fileops = {{ work = "rw" }}

[grant.shell]
commands = ["/bin/true", "/bin/sh"]
cwd_roots = ["work"]
max_processes = 512
# The output part's command prints up to a GiB.
output_limit = "4 GiB"
"#,
            client = identity.public().to_base64(),
            root = root.display(),
        );
        std::fs::write(dir.join("policy.toml"), policy).map_err(|e| fail("the policy", &e))?;
        // `extra_config` before `[limits]`: its top-level keys stay
        // top-level, and a table of its own ends where `[limits]` starts.
        std::fs::write(
            dir.join("portcullis.toml"),
            "listen = [\"127.0.0.1:0\"]\nkey_file = \"gateway.key\"\npolicy = \"policy.toml\"\n\
             state_dir = \"state\"\nadmin_socket = \"admin.sock\"\n"
                .to_string()
                + extra_config
                + &format!(
                    "\n[limits]\nmax_connections = 12000\nmax_sessions_per_principal = 12000\n\
                     max_in_flight = 64\nidle_timeout = \"10m\"\nhandshake_timeout = \"60s\"\n\
                     max_frame = {MAX_FRAME}\n"
                ),
        )
        .map_err(|e| fail("the config", &e))?;
        let mut child = Command::new(binary()?)
            .args(["serve", "--config"])
            .arg(dir.join("portcullis.toml"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("gateway.log")).map_err(|e| fail("log", &e))?)
            .spawn()
            .map_err(|e| fail("starting the gateway", &e))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("the gateway's stdout")?;
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| fail("the gateway's first line", &e))?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            return Err(format!(
                "the gateway did not start (see {})",
                dir.join("gateway.log").display()
            ));
        };
        Ok(Self {
            url: format!("ws://{addr}"),
            child,
            key: *gateway_key.public(),
            identity,
            identity_file,
            root,
            dir: dir.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the gateway as systemd would (SIGTERM) and waits for it, so
    /// that its state is written out; then returns its state directory.
    pub fn stop(mut self) -> Result<PathBuf, String> {
        use rustix::process::{Pid, Signal, kill_process};
        let pid = Pid::from_raw(self.child.id() as i32).ok_or("the gateway has no pid")?;
        kill_process(pid, Signal::TERM).map_err(|e| format!("stopping the gateway: {e}"))?;
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for the gateway: {e}"))?;
        match status.success() {
            true => Ok(self.dir.join("state")),
            false => Err(format!("the gateway stopped with {status}")),
        }
    }

    /// The gateway's audit commits so far, from `GET /v1/metrics` on its
    /// admin socket.
    pub async fn audit_commits(&self) -> Result<AuditCommits, String> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let error = |e: std::io::Error| format!("the gateway's admin socket: {e}");
        let mut socket = tokio::net::UnixStream::connect(self.dir.join("admin.sock"))
            .await
            .map_err(error)?;
        let ask = "GET /v1/metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        socket.write_all(ask.as_bytes()).await.map_err(error)?;
        let mut text = String::new();
        socket.read_to_string(&mut text).await.map_err(error)?;
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .ok_or_else(|| format!("the gateway's metrics have no {name}"))
        };
        Ok(AuditCommits {
            commits: value("portcullis_audit_commit_seconds_count")?,
            entries: value("portcullis_audit_entries_total")?,
            seconds: value("portcullis_audit_commit_seconds_sum")?,
        })
    }

    /// How a client reaches this gateway: its URL and key, the bench's
    /// identity, the client library's defaults otherwise.
    pub fn options(&self) -> ClientOptions {
        ClientOptions::new(&self.url, self.key, self.identity.clone())
    }

    /// A new authenticated session that has accepted every capability.
    pub async fn session(&self) -> Result<Client, ClientError> {
        self.session_with(self.options()).await
    }

    /// [`session`](Self::session) with other options (e.g. `max_frame`).
    pub async fn session_with(&self, options: ClientOptions) -> Result<Client, ClientError> {
        let client = Client::connect(options).await?;
        client.accept_all().await?;
        Ok(client)
    }

    /// `count` sessions, opened 16 at a time.
    pub async fn sessions(&self, count: usize) -> Result<Vec<Client>, String> {
        let mut open = Vec::with_capacity(count);
        while open.len() < count {
            let mut batch = tokio::task::JoinSet::new();
            for _ in 0..16.min(count - open.len()) {
                let options = self.options();
                batch.spawn(async move {
                    let client = Client::connect(options).await?;
                    client.accept_all().await.map(|()| client)
                });
            }
            while let Some(joined) = batch.join_next().await {
                let client = joined.map_err(|e| e.to_string())?;
                open.push(client.map_err(|e| format!("a session: {e}"))?);
            }
        }
        Ok(open)
    }

    /// `portcullis VERB URL --gateway-key … --identity …`, then `rest`.
    pub fn cli(&self, verb: &str) -> Result<Command, String> {
        let mut command = Command::new(binary()?);
        command
            .arg(verb)
            .arg(&self.url)
            .arg("--gateway-key")
            .arg(self.key.to_base64())
            .arg("--identity")
            .arg(&self.identity_file)
            .env("XDG_CONFIG_HOME", self.dir.join("config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        Ok(command)
    }
}

/// Counters of the audit log's group commits (journal write and fdatasync).
#[derive(Clone, Copy)]
pub struct AuditCommits {
    commits: f64,
    pub entries: f64,
    seconds: f64,
}

impl AuditCommits {
    /// How many group commits there were between `self` and `later`.
    pub fn count_until(self, later: Self) -> f64 {
        later.commits - self.commits
    }

    /// Between `self` and `later`: the mean time of a commit in ms, and the
    /// entries per commit.
    pub fn until(self, later: Self) -> (f64, f64) {
        let commits = (later.commits - self.commits).max(1.0);
        (
            (later.seconds - self.seconds) * 1e3 / commits,
            (later.entries - self.entries) / commits,
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Operator tools backed by local MCP servers (`[[mcp_server]]`).
//! One with a `url` is reached over Streamable HTTP on loopback instead of
//! started; the rest holds for it too, but for the process.
//!
//! A server is started on its first call, through the shell provider's
//! spawn — the same world, Landlock, seccomp, cgroup and egress as a
//! `shell.exec` — with its environment and secrets from the policy, and
//! kept while its definition stands. A call is one `tools/call` on it,
//! after the `tool.call` was decided, audited and (when the tool asks for
//! it) approved like any tool's; the answer is redacted of the server's
//! secrets before it leaves.
//!
//! A server is untrusted like any peer: one that exits, closes its pipes,
//! hangs past `call_timeout` or fails its handshake is killed (its whole
//! cgroup) and started again on a later call, no sooner than a backoff
//! that doubles with each failure in a row (1 s up to a minute). Nothing it
//! does reaches past its own calls: it is never on the daemon's threads,
//! its messages are bounded, its stderr goes to the log a bounded number
//! of lines at a time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use portcullis_mcp::upstream::{Upstream, UpstreamError};
use portcullis_policy::{McpReach, McpServer};
use portcullis_wire::frame::{ErrorBody, ErrorCode};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;
use tokio_util::sync::CancellationToken;

use super::registry::Secrets;
use crate::egress::CommandLink;
use crate::provider::{Call, StartEntry};
use crate::shell::{Io, Shell};

/// Bytes one message from a server may take.
const MAX_MESSAGE: usize = 16 << 20;
/// How long a started server has to answer `initialize` and `tools/list`.
const START_LIMIT: Duration = Duration::from_secs(20);
/// The longest wait before a failed server is started again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Lines of a server's stderr logged per start; the rest are counted.
const STDERR_LINES: u32 = 200;
/// Characters of a server's error text put in an error message.
const MESSAGE_CHARS: usize = 4096;
/// Bytes of one stderr line logged.
const STDERR_LINE_BYTES: usize = 512;

/// The servers of the current policy, by name. Cloning shares them.
#[derive(Clone, Default)]
pub struct McpServers(Arc<Inner>);

#[derive(Default)]
struct Inner {
    shell: OnceLock<Shell>,
    secrets_dir: Option<PathBuf>,
    servers: Mutex<HashMap<String, Arc<Server>>>,
}

/// One `[[mcp_server]]` as a definition last had it.
struct Server {
    /// The definition it runs (a reload that changes it starts a new one).
    definition: String,
    state: tokio::sync::Mutex<State>,
}

enum State {
    Stopped,
    Up(Arc<Connection>),
    /// Failed `failures` times in a row; not started again before
    /// `retry_at`.
    Failing {
        failures: u32,
        retry_at: Instant,
        why: String,
    },
}

/// A running server: its MCP session, its process, the secrets it holds.
struct Connection {
    upstream: Upstream,
    secrets: Arc<Secrets>,
    /// Kills the process (its cgroup) when the connection is dropped.
    stop: CancellationToken,
    /// How the process ended, once it has.
    exit: Arc<OnceLock<String>>,
    /// Failures in a row before this start (until a call succeeds),
    /// carried into the next failure.
    failures: AtomicU32,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Connection {
    /// Why it is no longer usable, when it is not.
    fn ended(&self) -> Option<String> {
        if let Some(exit) = self.exit.get() {
            return Some(exit.clone());
        }
        self.upstream
            .is_closed()
            .then(|| "it closed its connection".to_string())
    }
}

fn provider_error(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::ProviderError, message)
}

fn backoff(failures: u32) -> Duration {
    let seconds = 1u64 << failures.saturating_sub(1).min(6);
    Duration::from_secs(seconds).min(MAX_BACKOFF)
}

impl McpServers {
    pub fn new(secrets_dir: Option<PathBuf>) -> Self {
        Self(Arc::new(Inner {
            secrets_dir,
            ..Inner::default()
        }))
    }

    /// The shell provider whose sandbox servers run in; without one no
    /// server starts (a gateway assembled without `shell.*`).
    pub fn use_shell(&self, shell: Shell) {
        let _ = self.0.shell.set(shell);
    }

    /// Stops the servers the policy no longer defines as they were.
    pub fn retain(&self, policy: &portcullis_policy::Policy) {
        let mut servers = self.0.servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.retain(|name, server| {
            policy
                .mcp_server(name)
                .is_some_and(|s| fingerprint(s) == server.definition)
        });
    }

    /// The server as `definition` describes it: the one running, or a new
    /// one in place of a server of an older definition.
    fn server(&self, definition: &McpServer) -> Arc<Server> {
        let fingerprint = fingerprint(definition);
        let mut servers = self.0.servers.lock().unwrap_or_else(|e| e.into_inner());
        let server = servers
            .entry(definition.name.clone())
            .or_insert_with(|| Server::new(fingerprint.clone()));
        if server.definition != fingerprint {
            *server = Server::new(fingerprint);
        }
        server.clone()
    }

    /// `tools/call` of `tool` on the server, for `call` (already decided
    /// and audited as a `tool.call`).
    pub async fn call(
        &self,
        call: &Call,
        definition: &McpServer,
        tool: &str,
        args: Value,
    ) -> Result<Value, ErrorBody> {
        let Value::Object(arguments) = args else {
            return Err(ErrorBody::new(
                ErrorCode::InvalidRequest,
                "an MCP server's tool takes an object of arguments",
            ));
        };
        let server = self.server(definition);
        let name = &definition.name;
        let connection = tokio::select! {
            connected = server.connect(self, call, definition) => connected?,
            () = call.cancel.cancelled() => return Err(cancelled()),
        };
        if !connection.upstream.tools().iter().any(|t| t == tool) {
            // The server's words: a few, each cut short.
            let tools = connection.upstream.tools();
            let mut listed: Vec<String> = tools
                .iter()
                .take(20)
                .map(|t| t.chars().take(64).collect())
                .collect();
            if tools.len() > 20 {
                listed.push(format!("and {} more", tools.len() - 20));
            }
            let listed = listed.join(", ");
            return Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!(
                    "MCP server `{name}` has no tool `{tool}` (it lists: {listed}); the policy's [[tool]] names it"
                ),
            ));
        }
        let limit = definition.call_timeout;
        let answer = tokio::select! {
            answer = tokio::time::timeout(limit, connection.upstream.call(tool, arguments)) => answer,
            // Dropping the call sends the server its cancellation.
            () = call.cancel.cancelled() => return Err(cancelled()),
        };
        let secrets = &connection.secrets;
        let answer = match answer {
            Ok(Ok(answer)) => answer,
            Err(_) => {
                let why = format!("it did not answer a call within {limit:?} (call_timeout)");
                let retry = server.failed(&connection, &why).await;
                return Err(ErrorBody::new(
                    ErrorCode::Timeout,
                    format!("MCP server `{name}`: {why}; it was stopped{retry}"),
                ));
            }
            Ok(Err(UpstreamError::Remote { code, message })) => {
                return Err(secrets.redact_error(
                    provider_error(format!(
                        "MCP server `{name}` refused the call of `{tool}`: {}",
                        cut(&message)
                    ))
                    .with_details(json!({"mcp_error_code": code})),
                ));
            }
            Ok(Err(e)) => {
                let why = connection.ended().unwrap_or_else(|| e.to_string());
                let retry = server.failed(&connection, &why).await;
                return Err(secrets.redact_error(provider_error(format!(
                    "MCP server `{name}` failed during the call: {why}{retry}"
                ))));
            }
        };
        Server::succeeded(&connection);
        if answer.is_error {
            let text = answer
                .text()
                .unwrap_or_else(|| "(no text content)".to_string());
            return Err(secrets.redact_error(
                provider_error(format!(
                    "tool `{tool}` of MCP server `{name}` failed: {}",
                    cut(&text)
                ))
                .with_details(match serde_json::to_string(&answer.content) {
                    Ok(text) if text.len() <= MESSAGE_CHARS * 4 => {
                        json!({"content": answer.content})
                    }
                    _ => json!({"content_omitted": "longer than an error's details may be"}),
                }),
            ));
        }
        let value = answer.value();
        let size = serde_json::to_string(&value).map_or(0, |text| text.len());
        if size > call.max_result {
            return Err(provider_error(format!(
                "MCP server `{name}` answered {size} bytes; a result may take {}",
                call.max_result
            )));
        }
        Ok(secrets.redact(value))
    }
}

/// A server's words in a message of ours: at most [`MESSAGE_CHARS`].
fn cut(text: &str) -> String {
    match text.char_indices().nth(MESSAGE_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn cancelled() -> ErrorBody {
    ErrorBody::new(ErrorCode::Cancelled, "the tool call was cancelled")
}

/// What identifies a definition: all of it (a changed timeout starts the
/// server again too, which is harmless).
fn fingerprint(definition: &McpServer) -> String {
    serde_json::to_string(definition).unwrap_or_default()
}

impl Server {
    fn new(definition: String) -> Arc<Self> {
        Arc::new(Self {
            definition,
            state: tokio::sync::Mutex::new(State::Stopped),
        })
    }

    /// The running connection, started when there is none and the backoff
    /// allows. One caller starts it; others wait for that start.
    async fn connect(
        &self,
        servers: &McpServers,
        call: &Call,
        definition: &McpServer,
    ) -> Result<Arc<Connection>, ErrorBody> {
        let name = &definition.name;
        let mut state = self.state.lock().await;
        let failures = match &*state {
            State::Up(connection) => match connection.ended() {
                None => return Ok(connection.clone()),
                // It worked and has ended since: start it again now.
                Some(why) => {
                    tracing::warn!(server = %name, "MCP server ended: {why}; starting it again");
                    connection.failures.load(Ordering::Relaxed) + 1
                }
            },
            State::Failing {
                failures,
                retry_at,
                why,
            } => {
                let now = Instant::now();
                if now < *retry_at {
                    let wait = retry_at.duration_since(now).as_secs_f64().ceil() as u64;
                    return Err(provider_error(format!(
                        "MCP server `{name}` is not available: {why}; it is started again in {wait} s"
                    )));
                }
                *failures
            }
            State::Stopped => 0,
        };
        *state = State::Stopped;
        match servers.start(call, definition, failures).await {
            Ok(connection) => {
                let connection = Arc::new(connection);
                *state = State::Up(connection.clone());
                Ok(connection)
            }
            Err(why) => {
                let failures = failures + 1;
                let wait = backoff(failures);
                tracing::warn!(server = %name, "MCP server cannot start: {why}");
                *state = State::Failing {
                    failures,
                    retry_at: Instant::now() + wait,
                    why: why.clone(),
                };
                Err(provider_error(format!(
                    "MCP server `{name}` cannot start: {why}; it is tried again in {} s",
                    wait.as_secs()
                )))
            }
        }
    }

    /// Stops `connection` (when it is still the current one) after a
    /// failure; says when the server will be tried again.
    async fn failed(&self, connection: &Arc<Connection>, why: &str) -> String {
        let mut state = self.state.lock().await;
        let current = matches!(&*state, State::Up(c) if Arc::ptr_eq(c, connection));
        if !current {
            return String::new();
        }
        let failures = connection.failures.load(Ordering::Relaxed) + 1;
        let wait = backoff(failures);
        tracing::warn!("MCP server stopped: {why}");
        *state = State::Failing {
            failures,
            retry_at: Instant::now() + wait,
            why: why.to_string(),
        };
        format!(
            "; it is started again in {} s at the earliest",
            wait.as_secs()
        )
    }

    /// A call answered: the failures in a row are over.
    fn succeeded(connection: &Connection) {
        connection.failures.store(0, Ordering::Relaxed);
    }
}

impl McpServers {
    /// Starts the server (or reaches it) and runs MCP's handshake.
    async fn start(
        &self,
        call: &Call,
        definition: &McpServer,
        failures: u32,
    ) -> Result<Connection, String> {
        match &definition.reach {
            McpReach::Start { command } => self.launch(call, definition, command, failures).await,
            McpReach::Http { url, bearer_secret } => {
                let names: Vec<String> = bearer_secret.iter().cloned().collect();
                let secrets = Arc::new(
                    Secrets::load(&names, self.0.secrets_dir.as_deref()).map_err(|e| e.message)?,
                );
                let token = bearer_secret
                    .as_deref()
                    .and_then(|name| secrets.get(name))
                    .map(str::to_string);
                let upstream = Upstream::connect_http(url, token, MAX_MESSAGE, START_LIMIT)
                    .await
                    .map_err(|e| secrets.redact_text(&e.to_string()))?;
                tracing::info!(
                    server = %definition.name,
                    tools = upstream.tools().len(),
                    "MCP server reached at {url}"
                );
                Ok(Connection {
                    upstream,
                    secrets,
                    stop: CancellationToken::new(),
                    exit: Arc::default(),
                    failures: AtomicU32::new(failures),
                })
            }
        }
    }

    /// Starts a stdio server in the command sandbox and runs MCP's
    /// handshake over its pipes.
    async fn launch(
        &self,
        call: &Call,
        definition: &McpServer,
        command: &[String],
        failures: u32,
    ) -> Result<Connection, String> {
        let name = &definition.name;
        let shell = self
            .0
            .shell
            .get()
            .ok_or("this gateway runs no commands (no shell provider)")?;
        let secret_names: Vec<String> = definition.secrets.values().cloned().collect();
        let secrets = Arc::new(
            Secrets::load(&secret_names, self.0.secrets_dir.as_deref()).map_err(|e| e.message)?,
        );
        let env_secrets = definition.secrets.iter().map(|(var, secret)| {
            let value = secrets.get(secret).unwrap_or_default().to_string();
            (var.clone(), value)
        });
        let terms = definition.shell_terms(&call.policy, env_secrets);
        // Its own process slot and its egress entries: the server's, not
        // the caller's (it outlives the call that started it).
        let link = CommandLink {
            origin: call.origin.clone(),
            principal: format!("mcp_server:{name}"),
            request_id: call.request.id.to_string(),
            policy_generation: call.policy.generation.clone(),
        };
        // The call's own start entry is durable: the registry waited.
        let mut entry = StartEntry::durable();
        let mut running = shell
            .spawn(link, &terms, command, Io::Piped { stdin: true }, &mut entry)
            .await
            .map_err(|e| e.message)?;
        let (Some(stdin), Some(stdout), stderr) = (
            running.child.stdin.take(),
            running.child.stdout.take(),
            running.child.stderr.take(),
        ) else {
            return Err("its pipes were not set up".to_string());
        };
        let pid = running.child.id();
        tracing::info!(server = %name, pid, request = %call.request.id, "started MCP server");
        if let Some(stderr) = stderr {
            tokio::spawn(log_stderr(name.clone(), stderr, secrets.clone()));
        }
        let stop = CancellationToken::new();
        let exit = Arc::new(OnceLock::new());
        {
            let (stop, exit, name) = (stop.clone(), exit.clone(), name.clone());
            tokio::spawn(async move {
                let never = Duration::from_secs(100 * 365 * 86_400);
                let ended = match running.wait(never, &stop, None).await {
                    Ok((_, status)) => format!("it exited ({status})"),
                    Err(e) => e.message,
                };
                tracing::info!(server = %name, "MCP server ended: {ended}");
                let _ = exit.set(ended);
            });
        }
        // Dropped on failure, or when the caller gives up waiting: the
        // process is killed with it.
        let mut guard = StopOnDrop(Some(stop.clone()));
        let upstream = Upstream::connect(stdout, stdin, MAX_MESSAGE, START_LIMIT)
            .await
            .map_err(|e| match exit.get() {
                Some(ended) => format!("{e} ({ended})"),
                None => e.to_string(),
            })?;
        guard.0 = None;
        tracing::info!(
            server = %name,
            tools = upstream.tools().len(),
            peer = upstream.server_name().unwrap_or_default(),
            "MCP server ready"
        );
        Ok(Connection {
            upstream,
            secrets,
            stop,
            exit,
            failures: AtomicU32::new(failures),
        })
    }
}

/// Cancels its token when dropped, unless taken out first.
struct StopOnDrop(Option<CancellationToken>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(token) = &self.0 {
            token.cancel();
        }
    }
}

/// The server's stderr, to the log: each line cut at
/// [`STDERR_LINE_BYTES`], redacted, at most [`STDERR_LINES`] of them.
async fn log_stderr(
    name: String,
    stderr: impl tokio::io::AsyncRead + Unpin,
    secrets: Arc<Secrets>,
) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut logged = 0u32;
    let mut dropped = 0u64;
    loop {
        let mut line = Vec::new();
        // Bounded: a line is read a buffer at a time and cut.
        let read = loop {
            let buf = match reader.fill_buf().await {
                Ok([]) | Err(_) => break false,
                Ok(buf) => buf,
            };
            let (take, end) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let room = STDERR_LINE_BYTES.saturating_sub(line.len());
            line.extend_from_slice(&buf[..take.min(room)]);
            reader.consume(take);
            if end {
                break true;
            }
        };
        if !read && line.is_empty() {
            break;
        }
        if logged < STDERR_LINES {
            logged += 1;
            let text = secrets.redact_text(String::from_utf8_lossy(&line).trim_end());
            tracing::info!(server = %name, "MCP server stderr: {text}");
        } else {
            dropped += 1;
        }
        if !read {
            break;
        }
    }
    if dropped > 0 {
        tracing::info!(server = %name, "MCP server stderr: {dropped} more lines not logged");
    }
}

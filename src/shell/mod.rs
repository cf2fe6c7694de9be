//! The `shell` capability: `shell.exec`, a one-shot command whose output
//! comes back in the response, and `shell.start` with the methods that act
//! on a started process (`start.rs`), whose output and state live in
//! `process.rs`; terminals in `pty.rs`.
//!
//! Policy has decided the program, the working directory (a root and path)
//! and the child's whole environment ([`ShellTerms`]). Here the program is
//! resolved to an absolute path, the working directory is opened beneath
//! its root, and the `portcullis-sandbox` launcher (`sandbox.rs`, installed
//! beside the daemon's binary) is started, which confines itself and execs
//! the program. Every exit
//! (normal, timeout, cancel) ends with SIGKILL to the command's process
//! group (for a terminal, to its whole session): nothing a command started
//! outlives it.

pub mod cgroup;
mod pool;
pub mod process;
mod pty;
mod start;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use portcullis_policy::{Capability, Mode, Network, SandboxMode, ShellTerms, Target, Terms};
use rustix::process::{Pid, Signal};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use crate::egress::{CommandLink, Egress, EgressProxy};
use crate::files::{AskedEncoding, Encoding, fit_inline};
use crate::provider::{
    Call, Gauge, Method, Provider, Reply, StartEntry, no_input, params as provider_params,
};
use portcullis_sandbox::{self as sandbox, Mechanism};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Request};
use portcullis_wire::record::Channel;

use crate::artifacts::{Artifacts, Source, Upload};

/// How long the pipes may stay open after the process group was killed (a
/// process that left the group with `setsid` could hold them).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The `shell` provider: commands, started processes, terminals. Cloning
/// shares its state.
#[derive(Clone)]
pub struct Shell(Arc<State>);

struct State {
    processes: process::Processes,
    slots: Slots,
    /// Launchers started ahead of need (`pool.rs`).
    launchers: pool::Launchers,
    /// The proxy of commands with an egress allow-list.
    egress: Arc<Egress>,
    /// What of `/etc` a command's world covers, and when it was looked at.
    etc: Mutex<Option<(Instant, Arc<[PathBuf]>)>>,
    /// Where `shell.exec` with `artifact` hands output past the inline cap.
    artifacts: Option<Artifacts>,
}

/// How long a look at `/etc` serves: a file made unreadable (a new secret)
/// is covered in commands started this much later.
const ETC_LOOK_EVERY: Duration = Duration::from_secs(5);

impl Shell {
    /// A shell provider whose started processes live in `processes` (the
    /// keeper and `resource.*` see the same table).
    pub fn new(
        processes: process::Processes,
        egress: Arc<Egress>,
        artifacts: Option<Artifacts>,
    ) -> Self {
        Self(Arc::new(State {
            processes,
            slots: Slots::default(),
            launchers: pool::Launchers::new(egress.clone()),
            egress,
            etc: Mutex::new(None),
            artifacts,
        }))
    }

    pub fn processes(&self) -> &process::Processes {
        &self.0.processes
    }
}

/// A method that runs a command.
const fn runs(name: &'static str, input: fn(&Request) -> Option<Channel>) -> Method {
    Method {
        name,
        capability: Capability::Shell,
        start_entry: true,
        target: command_target,
        input,
    }
}

/// `shell.exec` with `stdin_stream: true` takes its standard input as
/// chunks on channel 3 (stdin), an empty chunk closing it.
fn exec_input(request: &Request) -> Option<Channel> {
    (request.params.get("stdin_stream") == Some(&Value::Bool(true))).then_some(Channel::Stdin)
}

const METHODS: &[Method] = &[
    runs("shell.exec", exec_input),
    runs("shell.start", no_input),
    acts_on_a_process("shell.input"),
    acts_on_a_process("shell.signal"),
    acts_on_a_process("shell.cancel"),
    Method::plain("shell.status", Capability::Shell),
    Method::plain("shell.list", Capability::Shell),
    acts_on_a_process("shell.attach"),
    acts_on_a_process("shell.resize"),
];

/// A method that changes a started process (its input, a signal, its
/// terminal) or takes its output: a start entry before it acts.
const fn acts_on_a_process(name: &'static str) -> Method {
    Method {
        start_entry: true,
        ..Method::plain(name, Capability::Shell)
    }
}

/// The program, working directory, environment and terminal a command
/// asks for: what the grant's command list and roots are checked against.
fn command_target(request: &Request) -> Result<Target, ErrorBody> {
    let p = &request.params;
    let invalid = provider_params::invalid;
    let (program, args) = match p.get("command") {
        Some(Value::Array(argv)) => {
            let mut words = argv.iter().map(|w| w.as_str().map(str::to_string));
            match (words.next(), words.collect::<Option<Vec<_>>>()) {
                (Some(Some(program)), Some(args)) => (program, args),
                _ => return Err(invalid("`command` must be a non-empty array of strings")),
            }
        }
        _ => {
            return Err(invalid(
                "`command` (an array of strings: program and arguments) is required",
            ));
        }
    };
    let cwd = match provider_params::optional_string(p, "root_id")? {
        Some(root) => Some((
            root,
            provider_params::optional_string(p, "cwd")?.unwrap_or_default(),
        )),
        None => None,
    };
    let env = match p.get("env") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(vars)) => vars
            .iter()
            .map(|(k, v)| match v {
                Value::String(v) => Ok((k.clone(), v.clone())),
                _ => Err(invalid("`env` values must be strings")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("`env` must be an object of strings")),
    };
    let pty = matches!(p.get("pty"), Some(Value::Bool(true)));
    Ok(Target::Command {
        program,
        args,
        cwd,
        env,
        pty,
        lookup: Some(portcullis_policy::ProgramLookup(find_on_path)),
    })
}

impl Provider for Shell {
    fn methods(&self) -> &'static [Method] {
        METHODS
    }

    /// A session that accepted `shell` hears of its principal's processes
    /// an earlier run lost.
    fn session_accepted(&self, principal: &str, accepted: &BTreeSet<String>) -> Vec<Event> {
        match accepted.contains("shell") {
            true => self.0.processes.tell_lost(principal),
            false => Vec::new(),
        }
    }

    fn gauges(&self) -> Vec<Gauge> {
        vec![Gauge {
            name: "portcullis_processes",
            help: "Started processes (shell.start) the gateway holds, running or exited and kept for attach.",
            value: self.0.processes.count() as f64,
        }]
    }

    /// A cancelled command is killed, and answers.
    fn cancel_grace(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// The launcher sets up the sandbox while the start entry is written;
    /// the program runs once it is durable (`Running::release`).
    fn prepares_during_start_entry(&self, request: &Request) -> bool {
        matches!(request.method.as_str(), "shell.exec" | "shell.start")
    }

    fn call(&self, call: Call) -> Reply {
        let shell = self.clone();
        match call.request.method.as_str() {
            "shell.start" => Box::pin(start::start(shell, call)),
            "shell.input" => Box::pin(start::input(shell, call)),
            "shell.signal" => Box::pin(start::signal(shell, call)),
            "shell.cancel" => Box::pin(start::cancel(shell, call)),
            "shell.status" => Box::pin(start::status(shell, call)),
            "shell.list" => Box::pin(start::list(shell, call)),
            "shell.attach" => Box::pin(start::attach(shell, call)),
            "shell.resize" => Box::pin(start::resize(shell, call)),
            _ => Box::pin(exec(shell, call)),
        }
    }
}

#[derive(Deserialize)]
struct ExecParams {
    command: Vec<String>,
    /// Milliseconds; the grant's `max_runtime` is the most it can be.
    timeout_ms: Option<u64>,
    /// Text for the command's standard input (closed after it).
    stdin: Option<String>,
    /// Standard input as chunks on channel 3 instead (see `exec_input`).
    #[serde(default)]
    stdin_stream: bool,
    /// Output past the inline cap (up to the grant's `output_limit`) goes
    /// to the runtime's storage as an artifact per stream.
    #[serde(default)]
    artifact: bool,
    #[serde(default)]
    encoding: AskedEncoding,
}

fn invalid(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

fn provider_error(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::ProviderError, message)
}

fn params<T: serde::de::DeserializeOwned>(request: &Request) -> Result<T, ErrorBody> {
    serde_json::from_value(Value::Object(request.params.clone()))
        .map_err(|e| invalid(format!("{} params: {e}", request.method)))
}

/// Commands run on one execution target, `local` (ya-environment-
/// protocol.v1's `target_id`): a request naming another is `not_found`.
fn on_the_target(request: &Request) -> Result<(), ErrorBody> {
    match request.params.get("target_id") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(t)) if t == portcullis_wire::envproto::TARGET_ID => Ok(()),
        Some(other) => Err(ErrorBody::new(
            ErrorCode::NotFound,
            format!(
                "no execution target {other}: this gateway has one, `{}`",
                portcullis_wire::envproto::TARGET_ID
            ),
        )),
    }
}

async fn exec(shell: Shell, mut call: Call) -> Result<Value, ErrorBody> {
    on_the_target(&call.request)?;
    let p: ExecParams = params(&call.request)?;
    let link = CommandLink::of(&call);
    // Taken out: the call itself lives on (an artifact is uploaded for it).
    let terms = shell_terms(std::mem::replace(&mut call.terms, Terms::None))?;
    if p.stdin.is_some() && p.stdin_stream {
        return Err(invalid("give `stdin` or `stdin_stream`, not both"));
    }
    let io = Io::Piped {
        stdin: p.stdin.is_some() || p.stdin_stream,
    };
    let start_entry = &mut call.start_entry;
    let mut running = shell
        .spawn(link, &terms, &p.command, io, start_entry)
        .await?;
    // Both streams' text fits the result (each half of it); with
    // `artifact`, what the grant allows is kept for the artifact.
    let budget = call.max_result / 2;
    let cap = match p.artifact {
        true => usize::try_from(terms.output_limit).unwrap_or(usize::MAX),
        false => terms.output_limit.min(budget as u64) as usize,
    };
    let stdout = tokio::spawn(read_capped(running.child.stdout.take(), cap));
    let stderr = tokio::spawn(read_capped(running.child.stderr.take(), cap));
    match (p.stdin, running.child.stdin.take(), call.input.take()) {
        (Some(text), Some(mut stdin), _) => {
            call.usage.add_in(text.len());
            tokio::spawn(async move {
                let _ = stdin.write_all(text.as_bytes()).await;
            });
        }
        // The chunks as they come (the session counts them); stdin closes
        // at the empty chunk, or when the input is abandoned.
        (None, Some(mut stdin), Some(mut input)) => {
            tokio::spawn(async move {
                while let Some(chunk) = input.recv().await {
                    if chunk.is_empty() || stdin.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
            });
        }
        _ => {}
    }
    let limit = time_limit(p.timeout_ms, &terms);
    let (outcome, status) = running.wait(limit, &call.cancel, None).await?;
    if let Outcome::Cancelled = outcome {
        return Err(ErrorBody::new(
            ErrorCode::Cancelled,
            "the command was killed: cancelled",
        ));
    }
    let (out, err) = (drained(stdout).await, drained(stderr).await);
    call.usage.add_out(out.data.len() + err.data.len());
    let mut result = exit_result(&status, &outcome, running.started);
    if let Some(warning) = &running.sandbox_warning {
        result["sandbox_warning"] = json!(warning);
    }
    result["encoding"] = json!(p.encoding.name);
    for (name, captured) in [("stdout", out), ("stderr", err)] {
        let (text, used) = inline(&captured.data, p.encoding.encoding, budget);
        result[name] = Value::String(text);
        result[format!("{name}_bytes")] = json!(captured.total);
        result[format!("{name}_truncated")] = json!((used as u64) < captured.total);
        if p.artifact && used < captured.data.len() {
            // The command has run: a failed upload is said in the result,
            // not in place of it.
            result[format!("{name}_artifact")] =
                match output_artifact(&shell, &call, name, captured.data).await {
                    Ok(artifact) => artifact,
                    Err(e) => json!({"error": e}),
                };
        }
    }
    if let Outcome::TimedOut = outcome {
        // The spec's `timeout`, with what the command did before it.
        let limit = limit.as_millis();
        return Err(ErrorBody::new(
            ErrorCode::Timeout,
            format!("the command was killed at its time limit ({limit} ms)"),
        )
        .with_details(result));
    }
    Ok(result)
}

fn shell_terms(terms: Terms) -> Result<ShellTerms, ErrorBody> {
    match terms {
        Terms::Shell(terms) => Ok(terms),
        _ => Err(provider_error(
            "a shell method reached the shell without shell terms",
        )),
    }
}

/// The request's timeout, never beyond the grant's `max_runtime`.
fn time_limit(timeout_ms: Option<u64>, terms: &ShellTerms) -> Duration {
    timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(terms.max_runtime)
        .min(terms.max_runtime)
}

/// How a command ended, as every shell method reports it.
fn exit_result(status: &std::process::ExitStatus, outcome: &Outcome, started: Instant) -> Value {
    json!({
        "exit_code": status.code(),
        "signal": status.signal().map(signal_name),
        "timed_out": matches!(outcome, Outcome::TimedOut),
        "duration_ms": started.elapsed().as_millis() as u64,
    })
}

/// A started command: its process (the launcher, then the program), its
/// process group, and the principal's process slot it holds.
pub(crate) struct Running {
    pub child: tokio::process::Child,
    pub pid: Option<Pid>,
    pub started: Instant,
    /// A terminal's session may hold process groups of its own (jobs).
    terminal: bool,
    /// What the sandbox lacked (a best-effort grant on a host without a
    /// mechanism); recorded in the audit entry.
    pub sandbox_warning: Option<String>,
    _slot: ProcessSlot,
    /// Its egress proxy, serving while it runs.
    _egress: Option<EgressProxy>,
    /// Its cgroup: all it started is killed, and the cgroup removed, when
    /// this is dropped.
    _cgroup: Option<cgroup::CommandCgroup>,
}

/// What the command's stdin, stdout and stderr are.
pub(crate) enum Io<'a> {
    /// Output piped; stdin piped too, or `/dev/null`.
    Piped { stdin: bool },
    /// All three the user side of this terminal.
    Terminal(&'a pty::Pty),
}

/// What a terminal's `TERM` is when the request does not set one.
const DEFAULT_TERM: &str = "xterm-256color";

/// Starts `command` as the terms allow: program resolved, working
/// directory opened beneath its root, exact environment, the launcher in
/// front. The program itself runs only once `start_entry` is durable: a
/// piped command's launcher sets up the sandbox meanwhile and waits to be
/// released; a terminal's is started after it.
impl Shell {
    pub(crate) async fn spawn(
        &self,
        link: CommandLink,
        terms: &ShellTerms,
        command: &[String],
        io: Io<'_>,
        start_entry: &mut StartEntry,
    ) -> Result<Running, ErrorBody> {
        let slot = self.0.slots.take(&link.principal, terms.max_processes)?;
        let hidden = self.hidden_in_etc().await?;
        let started = Start {
            launchers: &self.0.launchers,
            egress: &self.0.egress,
            link,
            slot,
            hidden,
        };
        spawn(started, terms, command, io, start_entry).await
    }
}

impl Shell {
    /// What of `/etc` commands' worlds cover (the sandbox crate's
    /// `hidden_in_etc`), looked at again when the last look is older than
    /// `ETC_LOOK_EVERY`: a few milliseconds the launchers no longer spend
    /// each.
    async fn hidden_in_etc(&self) -> Result<Arc<[PathBuf]>, ErrorBody> {
        let fresh = {
            let etc = self.0.etc.lock().unwrap_or_else(|e| e.into_inner());
            etc.as_ref()
                .filter(|(at, _)| at.elapsed() < ETC_LOOK_EVERY)
                .map(|(_, hidden)| hidden.clone())
        };
        if let Some(hidden) = fresh {
            return Ok(hidden);
        }
        // A walk of a directory tree: off the runtime's workers. Two
        // requests may both look; either look serves.
        let hidden: Arc<[PathBuf]> = tokio::task::spawn_blocking(sandbox::hidden_in_etc)
            .await
            .map_err(|e| provider_error(format!("the command's world: {e}")))?
            .map_err(|e| provider_error(format!("the command's world: {e}")))?
            .into();
        *self.0.etc.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), hidden.clone()));
        Ok(hidden)
    }
}

/// What a start takes of the shell provider.
struct Start<'a> {
    launchers: &'a pool::Launchers,
    egress: &'a Arc<Egress>,
    link: CommandLink,
    slot: ProcessSlot,
    hidden: Arc<[PathBuf]>,
}

/// The network a command gets, as the grant asks and the host can give.
#[derive(Clone, Copy)]
enum CommandNetwork<'a> {
    Host,
    /// None (`network = "deny"`; or an allow-list on a host without
    /// namespaces, on a best-effort grant).
    Empty,
    /// Only the egress proxy, under this allow-list.
    Proxied(&'a Arc<portcullis_policy::egress::Egress>),
}

impl<'a> CommandNetwork<'a> {
    fn of(terms: &'a ShellTerms, world: bool) -> Self {
        match &terms.network {
            Network::Allow => Self::Host,
            Network::Deny => Self::Empty,
            Network::Egress(rules) if world => Self::Proxied(rules),
            Network::Egress(_) => Self::Empty,
        }
    }

    fn world(self) -> pool::WorldNetwork {
        match self {
            Self::Host => pool::WorldNetwork::Host,
            Self::Empty => pool::WorldNetwork::Empty,
            Self::Proxied(_) => pool::WorldNetwork::Proxied,
        }
    }
}

async fn spawn(
    start: Start<'_>,
    terms: &ShellTerms,
    command: &[String],
    io: Io<'_>,
    start_entry: &mut StartEntry,
) -> Result<Running, ErrorBody> {
    let Start {
        launchers,
        egress,
        link,
        slot,
        hidden,
    } = start;
    let Some((program, args)) = command.split_first() else {
        return Err(invalid("`command` must name a program"));
    };
    let program = resolve(program, terms)?;
    let cwd = WorkingDir::open(terms)?;
    let terminal = matches!(io, Io::Terminal(_));
    if terminal {
        // The release byte cannot travel through a terminal.
        start_entry.wait().await?;
    }
    let skip = missing_mechanisms(terms)?;
    let unenforced = unenforced_limits(terms)?;
    let skip_network = skip.iter().any(|(m, _)| *m == Mechanism::Network);
    let world = !skip.iter().any(|(m, _)| *m == Mechanism::Namespaces);
    let network = CommandNetwork::of(terms, world);
    let mut sandbox = SandboxSpec {
        skip: &skip,
        world,
        restored_nice: launchers.restored_nice(),
        hidden: &hidden,
        network,
        egress_dir: None,
        cgroup_dirs: Vec::new(),
    };
    let limits = cgroup_limits(terms, network);
    let limit = |cgroup: &Option<cgroup::CommandCgroup>| match cgroup {
        Some(cgroup) => cgroup
            .limit(limits)
            .map_err(|e| provider_error(format!("cannot limit the command's cgroup: {e}"))),
        None => Ok(()),
    };
    let serve = |dir, rules: &Arc<portcullis_policy::egress::Egress>| {
        egress
            .serve(dir, rules.clone(), link.clone())
            .map_err(|e| provider_error(format!("cannot start the command's egress proxy: {e}")))
    };
    let keep_stdin = matches!(io, Io::Piped { stdin: true });
    let started = Instant::now();
    let (child, proxy, cgroup) = match io {
        Io::Piped { .. } => {
            // A launcher that is already waiting (`pool.rs`) reads its
            // arguments from stdin, which then carries the release byte.
            let kind = match world {
                true => pool::Kind::World {
                    rw: roots(terms, Mode::Rw),
                    ro: roots(terms, Mode::Ro),
                    network: network.world(),
                    hidden: hidden.clone(),
                    tmp_size: world_tmp_size(terms),
                    skip: skip.iter().map(|(mechanism, _)| *mechanism).collect(),
                },
                false => pool::Kind::Plain {
                    filtered: matches!(network, CommandNetwork::Empty) && !skip_network,
                },
            };
            let pool::Waiting {
                mut child,
                egress: dir,
                cgroup,
            } = launchers.take(kind).await?;
            // Before the release: the program starts inside the limits.
            limit(&cgroup)?;
            sandbox.egress_dir = dir.as_ref().map(|d| d.path().to_path_buf());
            let launcher_args = launcher_args(terms, &program, args, &io, &sandbox);
            if let Some(stdin) = child.stdin.as_mut() {
                // A launcher that refused has exited; its status says why.
                let _ = stdin.write_all(&sandbox::encode_args(&launcher_args)).await;
            }
            // Before the release: the program finds its proxy serving.
            let proxy = match (network, dir) {
                (CommandNetwork::Proxied(rules), Some(dir)) => Some(serve(dir, rules)?),
                _ => None,
            };
            (child, proxy, cgroup)
        }
        Io::Terminal(pty) => {
            // Serving before the launcher starts: it runs the program at once.
            let proxy = match network {
                CommandNetwork::Proxied(rules) => {
                    let dir = egress_dir(egress)?;
                    sandbox.egress_dir = Some(dir.path().to_path_buf());
                    Some(serve(dir, rules)?)
                }
                _ => None,
            };
            // Limited before the launcher joins it, first thing.
            let cgroup = command_cgroup()?;
            limit(&cgroup)?;
            sandbox.cgroup_dirs = cgroup
                .iter()
                .flat_map(cgroup::CommandCgroup::dirs)
                .map(Path::to_path_buf)
                .collect();
            let mut launch = tokio::process::Command::new(launcher_path()?);
            launch.args(launcher_args(terms, &program, args, &io, &sandbox));
            launch
                .env_clear()
                .envs(&terms.env)
                .envs(proxy_env(network))
                .current_dir(cwd.path());
            let [stdin, stdout, stderr] = pty
                .stdio()
                .map_err(|e| provider_error(format!("the terminal: {e}")))?;
            launch.stdin(stdin).stdout(stdout).stderr(stderr);
            if !terms.env.contains_key("TERM") {
                launch.env("TERM", DEFAULT_TERM);
            }
            let child = launch
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| provider_error(format!("cannot start the command: {e}")))?;
            // The child has changed into the directory and holds its
            // terminal side (dropping `launch` closes ours, so the terminal
            // ends with the child).
            drop(launch);
            (child, proxy, cgroup)
        }
    };
    drop(cwd);
    let pid = child.id().and_then(|id| Pid::from_raw(id as i32));
    let sandbox_warning = (!skip.is_empty() || !unenforced.is_empty()).then(|| {
        let missing: Vec<String> = skip
            .iter()
            .map(|(m, reason)| format!("{} ({reason})", m.name()))
            .chain(unenforced.iter().cloned())
            .collect();
        let egress = match (&terms.network, network) {
            (Network::Egress(_), CommandNetwork::Empty) => {
                "; without namespaces the egress allow-list cannot be kept, so it had no network"
            }
            _ => "",
        };
        format!(
            "ran without {}: this host lacks it and the grant allows best effort{egress}",
            missing.join(", ")
        )
    });
    let mut running = Running {
        child,
        pid,
        started,
        terminal,
        sandbox_warning,
        _slot: slot,
        _egress: proxy,
        _cgroup: cgroup,
    };
    if !terminal {
        running.release(start_entry, keep_stdin).await?;
    }
    Ok(running)
}

/// What a command's proxy variables point at: the bridge inside its world.
fn proxy_env(network: CommandNetwork) -> Vec<(&'static str, String)> {
    if !matches!(network, CommandNetwork::Proxied(_)) {
        return Vec::new();
    }
    let proxy = format!("http://{}", sandbox::EGRESS_PROXY);
    let local = "localhost,127.0.0.1,::1".to_string();
    vec![
        ("HTTP_PROXY", proxy.clone()),
        ("HTTPS_PROXY", proxy.clone()),
        ("ALL_PROXY", proxy.clone()),
        ("http_proxy", proxy.clone()),
        ("https_proxy", proxy.clone()),
        ("all_proxy", proxy),
        ("NO_PROXY", local.clone()),
        ("no_proxy", local),
    ]
}

impl Running {
    /// Lets the waiting launcher exec the program once the start entry is
    /// durable (one byte on its stdin; with `keep_stdin` the request's
    /// input follows, otherwise the launcher gives the program /dev/null).
    /// When the entry cannot be written the launcher is killed: the program
    /// never ran.
    async fn release(
        &mut self,
        start_entry: &mut StartEntry,
        keep_stdin: bool,
    ) -> Result<(), ErrorBody> {
        if let Err(e) = start_entry.wait().await {
            let _ = self.child.start_kill();
            return Err(e);
        }
        if let Some(stdin) = self.child.stdin.as_mut() {
            // A launcher that refused has exited; its status says why.
            let _ = stdin.write_all(sandbox::RELEASE).await;
        }
        if !keep_stdin {
            self.child.stdin = None;
        }
        Ok(())
    }

    /// Waits for the exit, the time limit, or a cancel (the request's, or
    /// `also`), then kills the process group whatever happened: nothing the
    /// command started outlives it.
    pub async fn wait(
        &mut self,
        limit: Duration,
        cancel: &CancellationToken,
        also: Option<&CancellationToken>,
    ) -> Result<(Outcome, std::process::ExitStatus), ErrorBody> {
        let also_cancelled = async {
            match also {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            status = self.child.wait() => Outcome::Exited(status),
            () = tokio::time::sleep(limit) => Outcome::TimedOut,
            () = cancel.cancelled() => Outcome::Cancelled,
            () = also_cancelled => Outcome::Stopped,
        };
        kill_group(self.pid);
        if self.terminal {
            kill_session(self.pid);
        }
        let status = match outcome {
            Outcome::Exited(ref status) => match status {
                Ok(status) => Ok(*status),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            },
            _ => self.child.wait().await,
        }
        .map_err(|e| provider_error(format!("waiting for the command: {e}")))?;
        Ok((outcome, status))
    }
}

/// Waits (a little) for an output reader after the group was killed.
async fn drained<T: Default, E>(task: impl Future<Output = Result<T, E>>) -> T {
    match tokio::time::timeout(DRAIN_GRACE, task).await {
        Ok(Ok(value)) => value,
        _ => T::default(),
    }
}

pub(crate) enum Outcome {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    /// The request was cancelled (a `cancel` frame, the session ended).
    Cancelled,
    /// `shell.cancel` ended it.
    Stopped,
}

/// One output stream's kept bytes and its total length.
#[derive(Default)]
struct Captured {
    data: Vec<u8>,
    total: u64,
}

/// Reads a stream to its end, keeping the first `cap` bytes: the command
/// never blocks on a full pipe, and the daemon never holds more.
async fn read_capped(stream: Option<impl AsyncRead + Unpin>, cap: usize) -> Captured {
    let mut captured = Captured::default();
    let Some(mut stream) = stream else {
        return captured;
    };
    // A pipe's capacity: one read takes what the command wrote meanwhile.
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = stream.read(&mut buf).await {
        captured.total += n as u64;
        let room = cap.saturating_sub(captured.data.len());
        captured.data.extend_from_slice(&buf[..n.min(room)]);
    }
    captured
}

/// Hands a stream's whole captured output to the runtime's storage.
async fn output_artifact(
    shell: &Shell,
    call: &Call,
    stream: &str,
    data: Vec<u8>,
) -> Result<Value, ErrorBody> {
    let Some(artifacts) = &shell.0.artifacts else {
        return Err(ErrorBody::new(
            ErrorCode::CapabilityUnavailable,
            "this gateway uploads no artifacts",
        ));
    };
    let mime_type = match std::str::from_utf8(&data) {
        Ok(_) => "text/plain; charset=utf-8",
        Err(_) => "application/octet-stream",
    };
    let mut metadata = serde_json::Map::new();
    metadata.insert("source".into(), json!("shell.exec"));
    metadata.insert("stream".into(), json!(stream));
    let upload = Upload {
        kind: stream.to_string(),
        mime_type: mime_type.to_string(),
        metadata,
        size: data.len() as u64,
        source: Source::Bytes(data.into()),
    };
    artifacts.upload(call, upload).await
}

/// Output as it goes in the response: lossy UTF-8 or base64, cut to half
/// a record each. Returns the text and the bytes of output it holds.
fn inline(data: &[u8], encoding: Encoding, budget: usize) -> (String, usize) {
    // Borrowed when the output is UTF-8 already (a copy of many MiB saved).
    let lossy;
    let bytes = match encoding {
        Encoding::Utf8 => {
            lossy = String::from_utf8_lossy(data);
            lossy.as_bytes()
        }
        Encoding::Base64 => data,
    };
    match fit_inline(bytes, encoding, true, budget) {
        // Lossy text is counted in output bytes only when nothing was cut.
        Ok((text, used)) if used == bytes.len() => (text, data.len()),
        Ok((text, used)) => (text, used.min(data.len())),
        Err(_) => (String::new(), 0),
    }
}

/// The signals the shell names, with their numbers on Linux.
pub const SIGNALS: &[(&str, i32)] = &[
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGILL", 4),
    ("SIGABRT", 6),
    ("SIGBUS", 7),
    ("SIGFPE", 8),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGSEGV", 11),
    ("SIGUSR2", 12),
    ("SIGPIPE", 13),
    ("SIGALRM", 14),
    ("SIGTERM", 15),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
    ("SIGTSTP", 20),
    ("SIGTTIN", 21),
    ("SIGTTOU", 22),
    ("SIGXCPU", 24),
    ("SIGXFSZ", 25),
    ("SIGVTALRM", 26),
    ("SIGPROF", 27),
    ("SIGWINCH", 28),
    ("SIGSYS", 31),
];

/// `SIGTERM` for 15; `SIG40` for a signal without a name here.
pub fn signal_name(signal: i32) -> String {
    SIGNALS
        .iter()
        .find(|(_, n)| *n == signal)
        .map_or_else(|| format!("SIG{signal}"), |(name, _)| name.to_string())
}

/// 15 for `SIGTERM` or `TERM`, and for `SIG15`.
pub fn signal_number(name: &str) -> Option<i32> {
    let bare = name.trim_start_matches("SIG");
    SIGNALS
        .iter()
        .find(|(known, _)| known[3..] == *bare)
        .map(|(_, n)| *n)
        .or_else(|| bare.parse().ok())
}

/// SIGKILL to the command's process group (the launcher made it one with
/// `setsid`), or to the process alone if it had not got that far.
fn kill_group(pid: Option<Pid>) {
    let Some(pid) = pid else { return };
    if rustix::process::kill_process_group(pid, Signal::KILL).is_err() {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

/// SIGKILL to every process of the command's session: a terminal's shell
/// puts each job in a process group of its own. Linux has no call for a
/// session, so `/proc/*/stat` is scanned (only when a terminal ends).
/// (Not `getsid`: rustix asserts a nonzero answer, and kernel threads
/// answer 0.)
fn kill_session(leader: Option<Pid>) {
    let Some(leader) = leader else { return };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    let session_of = |pid: &str| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid pgrp session …`; comm may hold anything.
        let after_comm = &stat[stat.rfind(')')? + 1..];
        after_comm.split_whitespace().nth(3)?.parse().ok()
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if session_of(name) == Some(leader.as_raw_nonzero().get())
            && let Some(pid) = name.parse().ok().and_then(Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
}

/// Where the launcher is: `portcullis-sandbox` beside this binary.
fn launcher_path() -> Result<&'static Path, ErrorBody> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = PATH.get_or_init(|| {
        let exe = std::env::current_exe().ok()?;
        let launcher = exe.parent()?.join("portcullis-sandbox");
        launcher.is_file().then_some(launcher)
    });
    found.as_deref().ok_or_else(|| {
        provider_error(
            "the sandbox launcher `portcullis-sandbox` is not installed beside `portcullis`",
        )
    })
}

/// A mechanism, and whether the host has it (or why not).
pub type MechanismSupport = (Mechanism, Result<(), Missing>);

/// Why the host lacks a mechanism, as the launcher's probe said it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Missing {
    #[error("{0}")]
    Said(String),
    #[error("the launcher's probe did not answer")]
    NoAnswer,
}

/// What this host can confine commands with, asked of the launcher once
/// (`portcullis-sandbox --probe`); a mechanism the launcher does not
/// report counts as missing.
pub fn host_sandbox() -> Result<&'static [MechanismSupport], ErrorBody> {
    static SUPPORT: OnceLock<Vec<MechanismSupport>> = OnceLock::new();
    let launcher = launcher_path()?;
    Ok(SUPPORT.get_or_init(|| {
        let report = std::process::Command::new(launcher)
            .arg("--probe")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        Mechanism::ALL
            .into_iter()
            .map(|mechanism| {
                let said = report
                    .lines()
                    .find_map(|line| line.strip_prefix(mechanism.name())?.strip_prefix('='));
                let support = match said {
                    Some("ok") => Ok(()),
                    Some(reason) => Err(Missing::Said(reason.to_string())),
                    None => Err(Missing::NoAnswer),
                };
                (mechanism, support)
            })
            .collect()
    }))
}

/// The mechanisms this command needs that the host lacks, with why: an
/// error when the grant requires them, the launcher's `--skip` list when
/// it allows best effort.
fn missing_mechanisms(terms: &ShellTerms) -> Result<Vec<(Mechanism, String)>, ErrorBody> {
    let support = host_sandbox()?;
    let has = |m: Mechanism| support.iter().any(|(x, s)| *x == m && s.is_ok());
    // An allow-list needs the network mechanism only where it becomes no
    // network: without namespaces.
    let needed = |m: Mechanism| match (m, &terms.network) {
        (Mechanism::Network, Network::Deny) => true,
        (Mechanism::Network, Network::Egress(_)) => !has(Mechanism::Namespaces),
        (Mechanism::Network, Network::Allow) => false,
        _ => true,
    };
    let missing: Vec<(Mechanism, String)> = support
        .iter()
        .filter(|(m, _)| needed(*m))
        .filter_map(|(m, support)| Some((*m, support.clone().err()?.to_string())))
        .collect();
    if missing.is_empty() || terms.sandbox == SandboxMode::BestEffort {
        return Ok(missing);
    }
    let what: Vec<String> = missing
        .iter()
        .map(|(m, reason)| format!("{}: {reason}", m.name()))
        .collect();
    Err(ErrorBody::new(
        ErrorCode::CapabilityUnavailable,
        format!(
            "this host cannot confine the command as the grant requires ({}); nothing was run \
             (an operator may set sandbox = \"best_effort\" on the grant to run it with a warning)",
            what.join("; ")
        ),
    ))
}

/// The launcher's arguments: the sandbox the terms ask for, the working
/// directory, then the program. A piped command's launcher, started ahead
/// of need, gets its environment here too; a terminal's is started with
/// it.
/// The sandbox a command's launcher builds, beyond what the terms say.
struct SandboxSpec<'a> {
    /// Mechanisms the host lacks, on a best-effort grant.
    skip: &'a [(Mechanism, String)],
    /// Whether the command gets a world of its own (the host has
    /// namespaces).
    world: bool,
    restored_nice: Option<i32>,
    /// What of `/etc` its world covers.
    hidden: &'a [PathBuf],
    network: CommandNetwork<'a>,
    /// For a `Proxied` network: where its egress socket is.
    egress_dir: Option<PathBuf>,
    /// The cgroups a terminal's launcher joins (a piped command's joined
    /// them while it waited).
    cgroup_dirs: Vec<PathBuf>,
}

fn launcher_args(
    terms: &ShellTerms,
    program: &Path,
    command_args: &[String],
    io: &Io,
    sandbox: &SandboxSpec,
) -> Vec<OsString> {
    let SandboxSpec {
        skip,
        world,
        restored_nice,
        hidden,
        network,
        ref egress_dir,
        ref cgroup_dirs,
    } = *sandbox;
    let mut args: Vec<OsString> = Vec::new();
    for dir in cgroup_dirs {
        args.extend(["--cgroup".into(), dir.into()]);
    }
    for (mechanism, _) in skip {
        args.extend(["--skip".into(), mechanism.name().into()]);
    }
    for dir in roots(terms, Mode::Rw) {
        args.extend(["--rw".into(), dir.into()]);
    }
    for dir in roots(terms, Mode::Ro) {
        args.extend(["--ro".into(), dir.into()]);
    }
    match (network, egress_dir) {
        (CommandNetwork::Host, _) => {}
        (CommandNetwork::Proxied(_), Some(dir)) => args.extend(["--egress".into(), dir.into()]),
        // Never more network than the grant gives: without its socket's
        // directory a proxied command gets none.
        (CommandNetwork::Empty | CommandNetwork::Proxied(_), _) => {
            args.push("--deny-network".into());
        }
    }
    if let Io::Terminal(_) = io {
        // Its launcher makes the world (a piped command's waited in one).
        args.push("--etc-looked".into());
        for path in hidden {
            args.extend(["--hide".into(), path.into()]);
        }
    }
    let io_flags: &[&str] = match io {
        Io::Terminal(_) => &["--tty"],
        Io::Piped { stdin: true } => &["--await-release"],
        Io::Piped { stdin: false } => &["--await-release", "--stdin-null"],
    };
    args.extend(io_flags.iter().map(OsString::from));
    // In its own world the command's processes are counted in its own
    // user namespace, where the launcher inside (its init) is one more,
    // and (RLIMIT_NPROC counts threads) the egress bridge's threads.
    let max_processes = u64::from(terms.max_processes).min(terms.limits.pids.unwrap_or(u64::MAX));
    let processes = world.then_some(max_processes + WORLD_PROCESSES + bridge_tasks(network));
    // A memory cgroup takes `max_memory`; RLIMIT_AS only where there is none.
    let memory = terms
        .limits
        .memory
        .filter(|_| !host_cgroups().has(cgroup::Controller::Memory));
    let limits = [
        ("memory", memory),
        ("file_size", terms.limits.file_size),
        ("open_files", terms.limits.open_files),
        ("processes", processes),
    ];
    for (name, value) in limits {
        if let Some(value) = value {
            args.extend(["--limit".into(), format!("{name}={value}").into()]);
        }
    }
    if let (true, Some(bytes)) = (world, world_tmp_size(terms)) {
        args.extend(["--tmp-size".into(), bytes.to_string().into()]);
    }
    if let Io::Piped { .. } = io {
        if let Some(nice) = restored_nice {
            args.extend(["--nice".into(), nice.to_string().into()]);
        }
        for (name, value) in &terms.env {
            args.extend(["--env".into(), name.into(), value.into()]);
        }
        for (name, value) in proxy_env(network) {
            args.extend(["--env".into(), name.into(), value.into()]);
        }
    }
    // A terminal's launcher starts there too, but its world starts at `/`:
    // the launcher inside changes into it.
    if let Some(file) = &terms.cwd {
        let (root, path) = (file.host_root.clone(), file.path.clone());
        args.extend(["--cwd".into(), root.into(), path.into()]);
        if file.follow_symlinks {
            args.push("--cwd-follow-symlinks".into());
        }
    }
    args.extend(["--".into(), program.into()]);
    args.extend(command_args.iter().map(OsString::from));
    args
}

/// The size of a command's own `/tmp` and `/dev/shm`, each (they are
/// memory): `max_tmp`, else `max_memory`, the operator's word on a
/// command's memory; else the launcher's default.
fn world_tmp_size(terms: &ShellTerms) -> Option<u64> {
    terms.limits.tmp.or(terms.limits.memory).filter(|&n| n > 0)
}

/// Tasks of a command's world that are not the command's: the launcher
/// inside (its init; one thread).
const WORLD_PROCESSES: u64 = 1;
/// Tasks in a command's cgroup that are not the command's: the launcher,
/// bwrap's monitor and the launcher inside.
const CGROUP_PROCESSES: u64 = 3;

/// This host's cgroups for commands (looked for once; see `cgroup.rs`).
pub fn host_cgroups() -> &'static cgroup::Cgroups {
    static CGROUPS: OnceLock<cgroup::Cgroups> = OnceLock::new();
    CGROUPS.get_or_init(cgroup::Cgroups::detect)
}

/// A new cgroup for one command (none where the host gives none).
fn command_cgroup() -> Result<Option<cgroup::CommandCgroup>, ErrorBody> {
    host_cgroups()
        .make()
        .map_err(|e| provider_error(format!("cannot make the command's cgroup: {e}")))
}

/// A directory for one command's egress socket.
fn egress_dir(egress: &Egress) -> Result<crate::egress::EgressDir, ErrorBody> {
    egress
        .dir()
        .map_err(|e| provider_error(format!("cannot make the command's egress directory: {e}")))
}

/// The grant's limits as a command's cgroup takes them: `max_pids` (else
/// `max_processes`) beside the sandbox's own processes (and, with an
/// egress allow-list, the bridge's threads), `max_memory`, `max_cpu`.
fn cgroup_limits(terms: &ShellTerms, network: CommandNetwork) -> cgroup::Limits {
    let own = terms.limits.pids.unwrap_or(u64::from(terms.max_processes));
    cgroup::Limits {
        pids: Some(own + CGROUP_PROCESSES + bridge_tasks(network)),
        memory: terms.limits.memory,
        cpu_millis: terms.limits.cpu_millis,
    }
}

/// Threads of the egress bridge in a command's world, counted beside its
/// own processes.
fn bridge_tasks(network: CommandNetwork) -> u64 {
    match network {
        CommandNetwork::Proxied(_) => sandbox::EGRESS_BRIDGE_TASKS,
        _ => 0,
    }
}

/// Grant limits this host cannot enforce (only `max_cpu` has no rlimit to
/// fall back on): an error when the grant requires its sandbox, what to
/// warn of when it allows best effort.
fn unenforced_limits(terms: &ShellTerms) -> Result<Vec<String>, ErrorBody> {
    let cgroups = host_cgroups();
    if terms.limits.cpu_millis.is_none() || cgroups.has(cgroup::Controller::Cpu) {
        return Ok(Vec::new());
    }
    let why = cgroups.missing(cgroup::Controller::Cpu).unwrap_or_default();
    match terms.sandbox {
        SandboxMode::BestEffort => Ok(vec![format!("max_cpu (no cpu cgroup controller: {why})")]),
        SandboxMode::Require => Err(ErrorBody::new(
            ErrorCode::CapabilityUnavailable,
            format!(
                "the grant's max_cpu needs a cpu cgroup controller, which this host does not give \
                 the gateway ({why}); nothing was run (delegate one, or set sandbox = \"best_effort\")"
            ),
        )),
    }
}

/// The grant's roots of one mode, in the policy's order.
fn roots(terms: &ShellTerms, mode: Mode) -> Vec<PathBuf> {
    terms
        .host_roots
        .iter()
        .filter(|(_, m)| *m == mode)
        .map(|(path, _)| path.clone())
        .collect()
}

/// The program to run: as policy resolved it (and checked it against the
/// grant), or, for a bare name it did not find, looked up again here, on
/// the child's `PATH` (the grant's `env_set` provides it), never the
/// daemon's.
fn resolve(program: &str, terms: &ShellTerms) -> Result<PathBuf, ErrorBody> {
    if let Some(resolved) = &terms.program {
        return Ok(resolved.clone());
    }
    if program.starts_with('/') {
        return Ok(PathBuf::from(program));
    }
    let Some(path) = terms.env.get("PATH") else {
        return Err(invalid(format!(
            "`{program}` is a bare name and the child's environment has no PATH; \
             the grant's env_set should set one"
        )));
    };
    find_on_path(path, program)
        .map(PathBuf::from)
        .ok_or_else(|| {
            ErrorBody::new(
                ErrorCode::NotFound,
                format!("`{program}` is not on the child's PATH"),
            )
        })
}

/// The first executable file `name` in the absolute directories of `path`
/// (a `PATH` value). Policy uses this to resolve a program before checking
/// it against a grant's command list.
pub fn find_on_path(path: &str, name: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    path.split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .and_then(|found| found.into_os_string().into_string().ok())
}

/// The command's working directory, opened beneath its root (so a
/// symlink swapped in cannot move it outside; no `root_id`: `/`). A
/// terminal's launcher is started in it, by descriptor (`/proc/self/fd/N`,
/// which the child resolves before exec); a piped command's launcher opens
/// it again the same way (`--cwd`), and this open gives the request its
/// error first.
struct WorkingDir(Option<std::os::fd::OwnedFd>);

impl WorkingDir {
    fn open(terms: &ShellTerms) -> Result<Self, ErrorBody> {
        match &terms.cwd {
            Some(file) => {
                let dir =
                    portcullis_confine::Root::open_dir(&crate::files::root_spec(file), &file.path)
                        .map_err(crate::files::error_body)?;
                Ok(Self(Some(dir)))
            }
            None => Ok(Self(None)),
        }
    }

    fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd as _;
        match &self.0 {
            Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            None => PathBuf::from("/"),
        }
    }
}

/// Each principal's commands running now, against its `max_processes`.
#[derive(Clone, Default)]
struct Slots(Arc<Mutex<HashMap<String, u32>>>);

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self, principal: &str, max: u32) -> Result<ProcessSlot, ErrorBody> {
        let mut running = self.lock();
        let count = running.entry(principal.to_string()).or_default();
        if *count >= max {
            return Err(ErrorBody::new(
                ErrorCode::PolicyBlocked,
                format!("`{principal}` runs {max} processes already (the grant's max_processes)"),
            ));
        }
        *count += 1;
        Ok(ProcessSlot {
            slots: self.clone(),
            principal: principal.to_string(),
        })
    }
}

/// One of a principal's `max_processes` concurrent commands, held while
/// the command runs.
struct ProcessSlot {
    slots: Slots,
    principal: String,
}

impl Drop for ProcessSlot {
    fn drop(&mut self) {
        if let Some(count) = self.slots.lock().get_mut(&self.principal) {
            *count = count.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_and_numbers_round_trip() {
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(40), "SIG40");
        assert_eq!(signal_number("SIGKILL"), Some(9));
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("SIG40"), Some(40));
        assert_eq!(signal_number("BOGUS"), None);
        for (name, number) in SIGNALS {
            assert_eq!(
                signal_number(&signal_name(*number)),
                Some(*number),
                "{name}"
            );
        }
    }
}

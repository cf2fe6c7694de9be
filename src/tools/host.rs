//! What a running script or tool can reach: its output (print and debug
//! as stream frames, within `max_output`), the tools (`call_tool`), and,
//! only as the principal's grants allow, files and commands — every call a
//! request of its own, which the session admits, audits and executes as it
//! would one from the peer ([`Call::requests`]).
//!
//! Runs on a pool thread (see `mod.rs`); waiting for the session is driven
//! with the runtime's `block_on`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use portcullis_policy::ScriptLimits;
use rhai::{Dynamic, EvalAltResult, Scope};
use serde_json::{Map, Value, json};
use tokio::runtime::Handle;

use super::engine::{self, Watch};
use super::registry::{CompiledTool, Registry, Secrets};
use super::{invalid, provider_error};
use crate::provider::{Call, Durable, Requests, SessionResources, StreamSink};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};

/// A tool runs with these limits (bounded, besides, by its caller's
/// deadline).
const TOOL_LIMITS: ScriptLimits = ScriptLimits::DEFAULT;

pub struct Host {
    /// The request this host serves; its own requests name it as parent.
    request: Request,
    stream: StreamSink,
    requests: Requests,
    /// The session's: which tools the runtime registered.
    resources: SessionResources,
    registry: Arc<Registry>,
    secrets_dir: Option<PathBuf>,
    limits: ScriptLimits,
    watch: Watch,
    handle: Handle,
    /// Tool calls made (against `max_tool_calls`), and nested requests.
    tool_calls: AtomicU64,
    nested: AtomicU64,
    /// Bytes printed (against `max_output`).
    printed: Arc<AtomicU64>,
    /// Audit entries of nested requests not yet known to be durable.
    unsettled: Arc<Unsettled>,
}

/// The completing entries of a script's own requests, answered before they
/// were durable. Whatever the script says next — a stream frame or its
/// answer — waits until they are, so a run of nested requests shares one
/// flush and nothing leaves the gateway before its entry.
struct Unsettled {
    handle: Handle,
    pending: std::sync::Mutex<Vec<Durable>>,
    /// Set once an entry failed: every later settle fails too.
    failed: std::sync::OnceLock<String>,
}

/// Entries left unsettled at most; the next one waits for them all (this
/// bounds the memory a script's requests can hold in the writer's queue).
const MAX_UNSETTLED: usize = 256;

impl Unsettled {
    fn new(handle: Handle) -> Self {
        Self {
            handle,
            pending: Default::default(),
            failed: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Durable>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `entry` after those already queued.
    fn push(&self, entry: Durable) -> Result<(), ErrorBody> {
        let full = {
            let mut pending = self.lock();
            pending.push(entry);
            pending.len() >= MAX_UNSETTLED
        };
        if full { self.settle() } else { Ok(()) }
    }

    /// Waits until every entry queued so far is durable.
    fn settle(&self) -> Result<(), ErrorBody> {
        let pending = std::mem::take(&mut *self.lock());
        for entry in pending {
            if let Err(e) = self.handle.block_on(entry) {
                let _ = self.failed.set(e.message);
            }
        }
        match self.failed.get() {
            Some(e) => Err(provider_error(e.clone())),
            None => Ok(()),
        }
    }
}

impl Host {
    pub fn new(
        call: &Call,
        limits: ScriptLimits,
        registry: Arc<Registry>,
        secrets_dir: Option<PathBuf>,
    ) -> Self {
        let handle = Handle::current();
        Self {
            request: Request::clone(&call.request),
            stream: call.stream.clone(),
            requests: call.requests.clone(),
            resources: call.resources.clone(),
            registry,
            secrets_dir,
            limits,
            watch: Watch::new(Instant::now() + limits.max_wall_time, call.cancel.clone()),
            tool_calls: AtomicU64::new(0),
            nested: AtomicU64::new(0),
            printed: Arc::default(),
            unsettled: Arc::new(Unsettled::new(handle.clone())),
            handle,
        }
    }

    /// `tool.call`, already admitted and audited by the session.
    pub fn run_tool(&self, name: &str, args: Value) -> Result<Value, ErrorBody> {
        self.execute_tool(self.registry.tool(name)?, args)
    }

    /// Validates the arguments, loads the tool's secrets, runs its script
    /// with `args` in scope, and redacts every secret from what comes out.
    fn execute_tool(&self, compiled: &CompiledTool, args: Value) -> Result<Value, ErrorBody> {
        let tool = &compiled.tool;
        compiled.validate(&args)?;
        let Some(ast) = &compiled.ast else {
            return Err(provider_error(format!(
                "tool `{}` is an MCP server's, not a script",
                tool.name
            )));
        };
        let ast = ast.as_ref().map_err(|_| {
            // Which file and why are in the gateway's log (from the
            // compile); host paths stay there.
            provider_error(format!(
                "tool `{}` cannot run: its script cannot be read or does not compile \
                     (the gateway's log says why)",
                tool.name
            ))
        })?;
        let secrets = Arc::new(Secrets::load(&tool.secrets, self.secrets_dir.as_deref())?);
        let deadline = self
            .watch
            .deadline
            .min(Instant::now() + TOOL_LIMITS.max_wall_time);
        let watch = Watch::new(deadline, self.watch.cancel.clone());
        let mut engine = engine::sandboxed(&TOOL_LIMITS, &watch);
        self.route_output(&mut engine, &watch, Some(secrets.clone()));
        register_secrets(&mut engine, &secrets, &tool.name);
        let mut scope = Scope::new();
        scope.push_constant("args", engine::to_dynamic(&args)?);
        let value = engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, ast)
            .map_err(|e| secrets.redact_error(engine::error_body(&e, &TOOL_LIMITS)))?;
        let json =
            engine::result_json(&value, &TOOL_LIMITS).map_err(|e| secrets.redact_error(e))?;
        Ok(secrets.redact(json))
    }

    /// `script.run`: the agent's source with `args` in scope.
    pub fn run_script(self, source: &str, args: Value) -> Result<Value, ErrorBody> {
        let started = Instant::now();
        let host = Arc::new(self);
        let mut engine = engine::sandboxed(&host.limits, &host.watch);
        host.route_output(&mut engine, &host.watch, None);
        register_host_functions(&mut engine, &host);
        let ast = engine
            .compile(source)
            .map_err(|e| engine::error_body(&e.into(), &host.limits))?;
        let mut scope = Scope::new();
        scope.push_constant("args", engine::to_dynamic(&args)?);
        let evaluated = engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, &ast)
            .map_err(|e| engine::error_body(&e, &host.limits));
        // The answer, success or not, waits for the nested requests' entries.
        host.unsettled.settle()?;
        Ok(json!({
            "value": engine::result_json(&evaluated?, &host.limits)?,
            "stats": {
                "operations": host.watch.operations.load(Ordering::Relaxed),
                "duration_ms": started.elapsed().as_millis() as u64,
                "tool_calls": host.tool_calls.load(Ordering::Relaxed),
                "bytes_printed": host.printed.load(Ordering::Relaxed),
            },
        }))
    }

    /// `print` and `debug` become `stdout` and `log` stream frames, redacted
    /// for a tool; past `max_output` the script is stopped.
    fn route_output(
        &self,
        engine: &mut rhai::Engine,
        watch: &Watch,
        secrets: Option<Arc<Secrets>>,
    ) {
        let sink = Output {
            stream: self.stream.clone(),
            limit: self.limits.max_output,
            printed: self.printed.clone(),
            stopped: watch.stopped.clone(),
            secrets,
            unsettled: self.unsettled.clone(),
        };
        let debug = sink.clone();
        // A line, as print writes one.
        engine.on_print(move |text| sink.send("stdout", &format!("{text}\n")));
        engine.on_debug(move |text, _, _| debug.send("log", text));
    }

    /// Counts a `call_tool`; past `max_tool_calls` the script ends there,
    /// as at any other limit: the termination cannot be caught.
    fn count_tool_call(&self) -> Result<(), Box<EvalAltResult>> {
        let made = self.tool_calls.fetch_add(1, Ordering::Relaxed) + 1;
        if made > self.limits.max_tool_calls {
            let stop = Dynamic::from(engine::STOP_TOOL_CALLS);
            return Err(EvalAltResult::ErrorTerminated(stop, rhai::Position::NONE).into());
        }
        Ok(())
    }

    /// `call_tool(name, args)`: a `tool.call` request of the script's own;
    /// its value.
    fn call_tool(&self, name: &str, args: Value) -> Result<Value, ErrorBody> {
        if self.limits.runtime_tools && self.registry.tool(name).is_err() {
            // Once the runtime registered tools, only those go to it.
            return match self.resources.runtime_tool(name) {
                (true, false) => Err(ErrorBody::new(
                    ErrorCode::NotFound,
                    format!(
                        "neither this gateway nor the runtime's registered tools have `{name}`"
                    ),
                )),
                _ => self.call_runtime_tool(name, args),
            };
        }
        let mut params = Map::new();
        params.insert("name".into(), Value::String(name.to_string()));
        params.insert("arguments".into(), args);
        // The tool's value, as the script called it (not `duration_ms`).
        self.request("tool.call", params)
            .map(|mut result| result["value"].take())
    }

    /// `call_tool` of a tool the gateway does not have, where the grant's
    /// `runtime_tools` allows: a `tool.call` request to the runtime
    /// (audited as the script's), its `result` the value. Bounded by the
    /// script's deadline and cancelled with it.
    fn call_runtime_tool(&self, name: &str, args: Value) -> Result<Value, ErrorBody> {
        self.unsettled.settle()?;
        let mut params = Map::new();
        params.insert("name".into(), Value::String(name.to_string()));
        params.insert("arguments".into(), args);
        let cancel = self.watch.cancel.child_token();
        let asked = self
            .requests
            .ask_runtime(&self.request.id, "tool.call", params, &cancel);
        let (answer, timed_out) = self.until_deadline(&cancel, asked);
        match timed_out {
            true => Err(engine::deadline_error(&self.limits)),
            false => answer,
        }
    }

    /// Runs `asked` (a request of the script's) on this thread; at the
    /// script's deadline it is cancelled and its answer to that awaited.
    /// Says whether the deadline came first.
    fn until_deadline<T>(
        &self,
        cancel: &tokio_util::sync::CancellationToken,
        asked: impl std::future::Future<Output = T>,
    ) -> (T, bool) {
        let deadline = tokio::time::Instant::from_std(self.watch.deadline);
        self.handle.block_on(async {
            let mut asked = std::pin::pin!(asked);
            tokio::select! {
                answer = &mut asked => (answer, false),
                () = tokio::time::sleep_until(deadline) => {
                    cancel.cancel();
                    (asked.await, true)
                }
            }
        })
    }

    /// A request the script makes. The session admits, audits and executes
    /// it as one from the peer (its id is the script's, with `.N` after
    /// it); it is cancelled with the script, and at the script's deadline.
    pub fn request(&self, method: &str, params: Map<String, Value>) -> Result<Value, ErrorBody> {
        let n = self.nested.fetch_add(1, Ordering::Relaxed) + 1;
        let request = crate::provider::own_request(&self.request, n, method, params)
            .map_err(|e| provider_error(format!("a nested request id: {e}")))?;
        let cancel = self.watch.cancel.child_token();
        let sent = self
            .requests
            .send(&self.request.id, request, cancel.clone());
        let (answer, timed_out) = self.until_deadline(&cancel, sent);
        if let Some(entry) = answer.entry {
            self.unsettled.push(entry)?;
        }
        match timed_out {
            // The request was cancelled for the script's deadline: the
            // script ends as the limit says (its next step would stop it).
            true => Err(engine::deadline_error(&self.limits)),
            false => answer.result,
        }
    }
}

/// Where print and debug go.
#[derive(Clone)]
struct Output {
    stream: StreamSink,
    limit: u64,
    printed: Arc<AtomicU64>,
    stopped: Arc<std::sync::OnceLock<&'static str>>,
    secrets: Option<Arc<Secrets>>,
    unsettled: Arc<Unsettled>,
}

impl Output {
    fn send(&self, event: &str, text: &str) {
        if self.unsettled.settle().is_err() {
            // Nothing more may leave; the script ends as cancelled and its
            // answer reports the audit failure (from settling again).
            let _ = self.stopped.set(engine::STOP_CANCELLED);
            return;
        }
        let before = self.printed.fetch_add(text.len() as u64, Ordering::Relaxed);
        if before + text.len() as u64 > self.limit {
            let _ = self.stopped.set(engine::STOP_OUTPUT);
            return;
        }
        let text = match &self.secrets {
            Some(secrets) => secrets.redact_text(text),
            None => text.to_string(),
        };
        let _ = self.stream.event_blocking(event, Value::String(text));
    }
}

/// A tool's secret as its script holds it: the name, never the bytes.
/// Shown (print, debug, `+`, interpolation) as `[REDACTED:name]`; only
/// host functions take it to the value (`hmac_sha256`); it cannot be
/// returned (a result has no such type). So nothing a script does makes
/// the secret appear, in any encoding.
#[derive(Clone)]
struct SecretHandle {
    name: String,
}

/// `secret(name)` and what takes a [`SecretHandle`], for a tool whose
/// policy lists `secrets`.
fn register_secrets(engine: &mut rhai::Engine, secrets: &Arc<Secrets>, tool: &str) {
    engine.register_type_with_name::<SecretHandle>("Secret");
    let shown = |handle: &mut SecretHandle| format!("[REDACTED:{}]", handle.name);
    engine.register_fn("to_string", shown);
    engine.register_fn("to_debug", shown);
    let (listed, tool) = (secrets.clone(), tool.to_string());
    engine.register_fn(
        "secret",
        move |name: &str| -> Result<SecretHandle, Box<EvalAltResult>> {
            match listed.get(name) {
                Some(_) => Ok(SecretHandle {
                    name: name.to_string(),
                }),
                None => Err(engine::throw(&ErrorBody::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "tool `{tool}` may not read secret `{name}` (list it in the tool's secrets)"
                    ),
                ))),
            }
        },
    );
    let keys = secrets.clone();
    engine.register_fn(
        "hmac_sha256",
        move |key: SecretHandle, message: &str| -> Result<String, Box<EvalAltResult>> {
            let value = keys.get(&key.name).unwrap_or_default();
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, value.as_bytes());
            Ok(hex::encode(ring::hmac::sign(&key, message.as_bytes())))
        },
    );
}

/// The functions a script has besides the standard packages. Each goes
/// through [`Host::request`]; a refusal or failure is thrown as
/// `#{code, message}`, which the script may catch.
fn register_host_functions(engine: &mut rhai::Engine, host: &Arc<Host>) {
    type Answer = Result<Dynamic, Box<EvalAltResult>>;
    let answer = |result: Result<Value, ErrorBody>| -> Answer {
        match result {
            Ok(value) => engine::to_dynamic(&value).map_err(|e| engine::throw(&e)),
            Err(error) => Err(engine::throw(&error)),
        }
    };
    let args_json = |args: rhai::Map| -> Result<Value, Box<EvalAltResult>> {
        engine::to_json(&Dynamic::from_map(args)).map_err(|e| engine::throw(&e))
    };

    let h = host.clone();
    engine.register_fn("call_tool", move |name: &str, args: rhai::Map| -> Answer {
        h.count_tool_call()?;
        answer(h.call_tool(name, args_json(args)?))
    });
    let h = host.clone();
    engine.register_fn("call_tool", move |name: &str| -> Answer {
        h.count_tool_call()?;
        answer(h.call_tool(name, json!({})))
    });
    let h = host.clone();
    engine.register_fn("read_file", move |root: &str, path: &str| -> Answer {
        let params = object(json!({"root_id": root, "path": path}));
        let result = h.request("file.read", params).map(|r| r["content"].clone());
        answer(result)
    });
    let h = host.clone();
    engine.register_fn("list_dir", move |root: &str, path: &str| -> Answer {
        let params = object(json!({"root_id": root, "path": path}));
        answer(h.request("file.list", params))
    });
    let h = host.clone();
    engine.register_fn("exec", move |command: rhai::Array| -> Answer {
        let command =
            engine::to_json(&Dynamic::from_array(command)).map_err(|e| engine::throw(&e))?;
        if !command
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string))
        {
            return Err(engine::throw(&invalid("exec takes an array of strings")));
        }
        answer(h.request("shell.exec", object(json!({"command": command}))))
    });
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

//! What a running script or tool can reach: its output (print and debug
//! as stream frames, within `max_output`), the tools (`call_tool`), and,
//! only as the principal's grants allow, files and commands — every call
//! decided, audited and executed on the path a session request takes.
//!
//! Runs on a pool thread (see `mod.rs`); async work (the audit log, the
//! files and shell providers) is driven with the runtime's `block_on`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use portcullis_policy::{ScriptLimits, Verdict};
use portcullis_store::{
    AuditLog, Decision as AuditDecision, Kind, Record as AuditRecord, Submitted,
};
use rhai::{Dynamic, EvalAltResult, Scope};
use serde_json::{Map, Value, json};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::approvals::{Ask, record_outcome};
use super::engine::{self, Watch};
use super::registry::{CompiledTool, Registry, Secrets};
use super::{invalid, provider_error};
use crate::provider::{Call, StartEntry, StreamSink, Usage};
use crate::server::Gateway;
use crate::server::entry;
use crate::server::resources::SessionResources;
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request, RequestId};

/// A tool runs with these limits (bounded, besides, by its caller's
/// deadline).
const TOOL_LIMITS: ScriptLimits = ScriptLimits::DEFAULT;

pub struct Host {
    gateway: Arc<Gateway>,
    principal: String,
    /// The entry of the request this host serves; nested calls start
    /// theirs from it.
    record: AuditRecord,
    request: Request,
    stream: StreamSink,
    resources: SessionResources,
    session_end: Arc<std::sync::OnceLock<ErrorBody>>,
    revoked: Arc<std::sync::OnceLock<ErrorBody>>,
    limits: ScriptLimits,
    watch: Watch,
    handle: Handle,
    /// Tool calls made (against `max_tool_calls`), and nested requests.
    tool_calls: AtomicU64,
    nested: AtomicU64,
    /// Bytes printed (against `max_output`), by the script and the tools
    /// it calls together.
    printed: Arc<AtomicU64>,
    /// Audit entries of nested requests not yet known to be durable.
    unsettled: Arc<Unsettled>,
}

/// Audit entries a script's nested requests submitted without waiting.
/// Whatever the script says next — a stream frame or its answer — waits
/// until they are durable, so a run of nested requests shares one flush
/// and nothing leaves the gateway before its entry.
#[derive(Default)]
struct Unsettled {
    pending: std::sync::Mutex<Vec<Submitted>>,
    /// Set once an entry failed: every later settle fails too.
    failed: std::sync::OnceLock<String>,
}

/// Entries left unsettled at most; the next one waits for them all (this
/// bounds the memory a script's requests can hold in the writer's queue).
const MAX_UNSETTLED: usize = 256;

impl Unsettled {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Submitted>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `record` after those already queued.
    fn submit(&self, audit: &AuditLog, record: AuditRecord) -> Result<(), ErrorBody> {
        let submitted = audit.submit(record).map_err(|e| {
            let _ = self.failed.set(e.to_string());
            provider_error(format!("the audit log is unavailable: {e}"))
        })?;
        let full = {
            let mut pending = self.lock();
            pending.push(submitted);
            pending.len() >= MAX_UNSETTLED
        };
        if full { self.settle() } else { Ok(()) }
    }

    /// Waits until every entry submitted so far is durable.
    fn settle(&self) -> Result<(), ErrorBody> {
        let pending = std::mem::take(&mut *self.lock());
        for submitted in pending {
            if let Err(e) = submitted.wait() {
                let _ = self.failed.set(e.to_string());
            }
        }
        match self.failed.get() {
            Some(e) => Err(provider_error(format!("the audit log is unavailable: {e}"))),
            None => Ok(()),
        }
    }
}

impl Host {
    pub fn new(call: &Call, limits: ScriptLimits) -> Self {
        Self {
            gateway: call.gateway.clone(),
            principal: call.principal.clone(),
            record: call.record.clone(),
            request: call.request.clone(),
            stream: call.stream.clone(),
            resources: call.resources.clone(),
            session_end: call.session_end.clone(),
            revoked: call.revoked.clone(),
            limits,
            watch: Watch::new(Instant::now() + limits.max_wall_time, call.cancel.clone()),
            handle: Handle::current(),
            tool_calls: AtomicU64::new(0),
            nested: AtomicU64::new(0),
            printed: Arc::default(),
            unsettled: Arc::default(),
        }
    }

    /// `tool.call`, already decided and audited by the session.
    pub fn run_tool(&self, name: &str, args: Value) -> Result<Value, ErrorBody> {
        let registry = Registry::of(&self.gateway.current_policy());
        self.execute_tool(registry.tool(name)?, args)
    }

    /// Validates the arguments, loads the tool's secrets, runs its script
    /// with `args` in scope, and redacts every secret from what comes out.
    fn execute_tool(&self, compiled: &CompiledTool, args: Value) -> Result<Value, ErrorBody> {
        let tool = &compiled.tool;
        compiled.validate(&args)?;
        let ast = compiled
            .ast
            .as_ref()
            .map_err(|e| provider_error(format!("tool `{}` cannot run: {e}", tool.name)))?;
        let secrets = Arc::new(Secrets::load(
            &tool.secrets,
            self.gateway.config.secrets_dir.as_deref(),
        )?);
        let deadline = self
            .watch
            .deadline
            .min(Instant::now() + TOOL_LIMITS.max_wall_time);
        let watch = Watch::new(deadline, self.watch.cancel.clone());
        let mut engine = engine::sandboxed(&TOOL_LIMITS, &watch);
        self.route_output(&mut engine, &watch, Some(secrets.clone()));
        let readable = secrets.clone();
        let tool_name = tool.name.clone();
        engine.register_fn(
            "secret",
            move |name: &str| -> Result<String, Box<EvalAltResult>> {
                readable.get(name).map(str::to_string).ok_or_else(|| {
                    engine::throw(&ErrorBody::new(
                        ErrorCode::PermissionDenied,
                        format!("tool `{tool_name}` may not read secret `{name}` (list it in the tool's secrets)"),
                    ))
                })
            },
        );
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
                "duration_ms": started.elapsed().as_secs_f64() * 1e3,
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
        engine.on_print(move |text| sink.send("stdout", text));
        engine.on_debug(move |text, _, _| debug.send("log", text));
    }

    /// `call_tool(name, args)`: the same decision, approval, schema check
    /// and audit entry as a `tool.call` request, then the tool runs here.
    fn call_tool(&self, name: &str, args: Value) -> Result<Value, ErrorBody> {
        let made = self.tool_calls.fetch_add(1, Ordering::Relaxed) + 1;
        if made > self.limits.max_tool_calls {
            return Err(ErrorBody::new(
                ErrorCode::ProviderError,
                format!(
                    "the script hit its limit max_tool_calls ({})",
                    self.limits.max_tool_calls
                ),
            )
            .with_details(
                json!({"limit": "max_tool_calls", "value": self.limits.max_tool_calls}),
            ));
        }
        let mut params = Map::new();
        params.insert("name".into(), Value::String(name.to_string()));
        params.insert("arguments".into(), args);
        self.request("tool.call", params)
    }

    /// A request the script makes, on the session's path: decode, decide,
    /// audit, execute, audit. Its audit entries name the script's request
    /// as parent.
    pub fn request(&self, method: &str, params: Map<String, Value>) -> Result<Value, ErrorBody> {
        let n = self.nested.fetch_add(1, Ordering::Relaxed) + 1;
        let id = RequestId::new(format!("{}.{n}", self.request.id))
            .map_err(|e| provider_error(format!("a nested request id: {e}")))?;
        let request = Request {
            id: id.clone(),
            method: method.to_string(),
            params,
            context: self.request.context.clone(),
        };
        // One policy for the decision and the generation its entry names.
        let policy = self.gateway.current_policy();
        let mut record = AuditRecord {
            kind: Kind::Request,
            started_at: jiff::Timestamp::now().to_string(),
            request_id: Some(id.to_string()),
            method: Some(method.to_string()),
            parent_request_id: Some(self.request.id.to_string()),
            policy_generation: Some(policy.generation.clone()),
            ..self.record.clone()
        };
        record.tool = None;
        let answer = self.decide_and_run(&policy, &request, &mut record);
        entry::complete(
            &mut record,
            answer.as_ref().ok(),
            answer.as_ref().err(),
            &Usage::default(),
        );
        let served = self.gateway.dispatcher.serves(method);
        self.gateway.metrics.request(&record, served);
        self.unsettled.submit(&self.gateway.audit, record)?;
        answer
    }

    fn decide_and_run(
        &self,
        policy: &Arc<portcullis_policy::Policy>,
        request: &Request,
        record: &mut AuditRecord,
    ) -> Result<Value, ErrorBody> {
        let query = crate::server::query::query_for(request)?;
        entry::describe_target(record, &query.target);
        let decision =
            portcullis_policy::decide(policy, &self.principal, &query, jiff::Timestamp::now());
        record.capability = decision.capability.map(|c| c.as_str().to_string());
        record.rule = Some(decision.rule.clone());
        match decision.verdict {
            Verdict::Allow => record.decision = Some(AuditDecision::Allowed),
            Verdict::Deny(denial) => {
                record.decision = Some(AuditDecision::Blocked);
                return Err(ErrorBody::new(entry::error_code(denial), decision.rule));
            }
            Verdict::RequireApproval(policy) => {
                let ask = Ask::for_request(&self.principal, request, policy);
                let timeout = self.gateway.config.approval_timeout;
                let approvals = &self.gateway.approvals;
                let outcome =
                    self.handle
                        .block_on(approvals.obtain(ask, timeout, &self.watch.cancel));
                record_outcome(record, &outcome);
                outcome?;
            }
        }
        if entry::LONG_RUNNING.contains(&request.method.as_str()) {
            let start = AuditRecord {
                kind: Kind::RequestStart,
                ..record.clone()
            };
            // A tool only computes (it has no host functions), so its start
            // entry need only precede its end entry; a command acts on the
            // host, so its start entry is durable before it runs.
            self.unsettled.submit(&self.gateway.audit, start)?;
            if request.method != "tool.call" {
                self.unsettled
                    .settle()
                    .map_err(|e| provider_error(format!("{}, so nothing was run", e.message)))?;
            }
        }
        if let portcullis_policy::Target::Tool { name } = &query.target {
            let args = request
                .params
                .get("arguments")
                .cloned()
                .unwrap_or(json!({}));
            return self.execute_tool(Registry::of(policy).tool(name)?, args);
        }
        self.dispatch(request.clone(), decision.terms)
    }

    /// Runs a files or shell request through the dispatcher, as the
    /// session would; its stream frames (none for the inline forms a
    /// script uses) are dropped.
    fn dispatch(
        &self,
        request: Request,
        terms: portcullis_policy::Terms,
    ) -> Result<Value, ErrorBody> {
        let (outbox, mut drain) = mpsc::channel(16);
        let usage = Arc::new(Usage::default());
        let call = Call {
            principal: self.principal.clone(),
            stream: StreamSink::new(request.id.clone(), outbox, usage.clone()),
            record: self.record.clone(),
            request,
            terms,
            cancel: self.watch.cancel.child_token(),
            input: None,
            usage,
            resources: self.resources.clone(),
            session_end: self.session_end.clone(),
            revoked: self.revoked.clone(),
            gateway: self.gateway.clone(),
            // Settled above: a script's command waits for its entry first.
            start_entry: StartEntry::durable(),
        };
        let gateway = self.gateway.clone();
        self.handle.block_on(async move {
            tokio::spawn(async move { while drain.recv().await.is_some() {} });
            gateway.dispatcher.run(call).await
        })
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
        let _ = self.stream.event_blocking(event, json!({"text": text}));
    }
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
        answer(h.call_tool(name, args_json(args)?))
    });
    let h = host.clone();
    engine.register_fn("call_tool", move |name: &str| -> Answer {
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

//! The `tools` and `scripts` capabilities: `tool.list`, `tool.call`,
//! `tool.cancel` and `script.run`.
//!
//! Tools are the operator's: a JSON Schema and a Rhai script declared in
//! the policy (`registry.rs` compiles them once per policy). Scripts are
//! the agent's: Rhai source run under the grant's limits, which can call
//! tools — and read files, list directories and run commands when the
//! principal holds those grants — many calls in one round trip. Every
//! call a script makes is a request of its own that its session admits,
//! audits and executes like one from the peer, with the script's request
//! as its parent (`host.rs`, through [`Call::requests`]).
//!
//! All Rhai runs on a bounded pool of blocking threads, so a busy script
//! never holds up a session, and at most [`pool_size`] run at once (the
//! rest wait their turn).

/// The Rhai sandbox, its own crate (the fuzzer builds it alone).
pub use portcullis_script as engine;
mod host;
pub mod mcp;
pub mod registry;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use portcullis_policy::{Capability, Policy, ScriptLimits, Target, Terms, ToolAction};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::provider::{Call, Method, Provider, Reply, no_input, params};
pub use host::Host;
use registry::Registry;

/// The `tools` and `scripts` provider. Cloning shares its state.
#[derive(Clone)]
pub struct Tools(Arc<State>);

struct State {
    /// Where tools' secrets are read from (else systemd's
    /// `$CREDENTIALS_DIRECTORY`).
    secrets_dir: Option<PathBuf>,
    /// A place on the script pool for each script or tool running.
    pool: Arc<Semaphore>,
    /// The registry of the policy last asked for.
    registry: Mutex<Option<Arc<Registry>>>,
    /// Each running `tool.call`'s cancel, by principal and request id.
    running: Mutex<HashMap<(String, String), CancellationToken>>,
    /// The servers behind tools of `[[mcp_server]]`s.
    mcp: mcp::McpServers,
}

impl Tools {
    pub fn new(secrets_dir: Option<PathBuf>) -> Self {
        Self(Arc::new(State {
            mcp: mcp::McpServers::new(secrets_dir.clone()),
            secrets_dir,
            pool: Arc::new(Semaphore::new(pool_size())),
            registry: Mutex::default(),
            running: Mutex::default(),
        }))
    }

    /// Starts `[[mcp_server]]`s through `shell` (its sandbox, its process
    /// limits); without it their tools answer that no server can start.
    pub fn with_mcp_servers(self, shell: crate::shell::Shell) -> Self {
        self.0.mcp.use_shell(shell);
        self
    }

    /// The tools of `policy`, compiled the first time they are asked for.
    fn registry(&self, policy: &Arc<Policy>) -> Arc<Registry> {
        let mut current = lock(&self.0.registry);
        if let Some(registry) = current.as_ref()
            && Arc::ptr_eq(registry.policy(), policy)
        {
            return registry.clone();
        }
        let registry = Arc::new(Registry::compile(policy.clone()));
        *current = Some(registry.clone());
        // A reload stops the servers it removed or changed.
        self.0.mcp.retain(policy);
        registry
    }

    /// Runs `work` on the script pool once a place is free. A script's own
    /// tool call (`nested`) runs without a place of its own: its script
    /// holds one and waits for it, so asking for another could deadlock a
    /// full pool.
    async fn on_pool<T: Send + 'static>(
        &self,
        nested: bool,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ErrorBody> {
        let permit = match nested {
            true => None,
            false => Some(
                self.0
                    .pool
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| provider_error("the script pool is closed"))?,
            ),
        };
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .map_err(|e| provider_error(format!("the script thread failed: {e}")))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

const METHODS: &[Method] = &[
    Method::plain("tool.list", Capability::Tools),
    // The runtime's tools, for scripts (`call_tool`).
    Method::plain("tool.register", Capability::Scripts),
    Method::plain("tool.unregister", Capability::Scripts),
    Method {
        start_entry: true,
        target: tool_target,
        ..Method::plain("tool.call", Capability::Tools)
    },
    // Ends another call: a start entry before it acts.
    Method {
        start_entry: true,
        ..Method::plain("tool.cancel", Capability::Tools)
    },
    Method {
        name: "script.run",
        capability: Capability::Scripts,
        start_entry: true,
        target: script_target,
        input: no_input,
    },
];

fn tool_target(request: &Request) -> Result<Target, ErrorBody> {
    Ok(Target::Tool {
        name: params::string(&request.params, "name")?,
    })
}

fn script_target(request: &Request) -> Result<Target, ErrorBody> {
    Ok(Target::Script {
        requested: requested_limits(&request.params)?,
    })
}

/// `script.run`'s `limits`: the ones the request names (it may ask for
/// less than the grant, never more: policy takes the smaller of each).
fn requested_limits(params: &Map<String, Value>) -> Result<Option<ScriptLimits>, ErrorBody> {
    let Some(asked) = params.get("limits") else {
        return Ok(None);
    };
    let Value::Object(asked) = asked else {
        return Err(invalid("`limits` must be an object"));
    };
    let mut limits = ScriptLimits {
        max_operations: u64::MAX,
        max_wall_time: Duration::MAX,
        max_string_size: u64::MAX,
        max_array_len: u64::MAX,
        max_map_len: u64::MAX,
        max_call_depth: u64::MAX,
        max_tool_calls: u64::MAX,
        max_output: u64::MAX,
        // Asking never grants it: the grant's word stands.
        runtime_tools: true,
    };
    for (key, value) in asked {
        let n = value
            .as_u64()
            .ok_or_else(|| invalid(format!("limits.{key} must be a non-negative integer")))?;
        let field = match key.as_str() {
            "max_operations" => &mut limits.max_operations,
            "max_string_size" => &mut limits.max_string_size,
            "max_array_len" => &mut limits.max_array_len,
            "max_map_len" => &mut limits.max_map_len,
            "max_call_depth" => &mut limits.max_call_depth,
            "max_tool_calls" => &mut limits.max_tool_calls,
            "max_output" => &mut limits.max_output,
            "max_wall_time_ms" => {
                limits.max_wall_time = Duration::from_millis(n);
                continue;
            }
            other => return Err(invalid(format!("limits.{other} is not a script limit"))),
        };
        *field = n;
    }
    Ok(Some(limits))
}

impl Provider for Tools {
    fn methods(&self) -> &'static [Method] {
        METHODS
    }

    /// A cancelled script stops at its next progress check.
    fn cancel_grace(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// A `tool.call` can be cancelled from the start, also while it waits
    /// for an approval.
    fn track(&self, call: &Call) -> Option<crate::provider::Tracked> {
        (call.request.method == "tool.call")
            .then(|| Box::new(Running::register(self, call)) as crate::provider::Tracked)
    }

    fn call(&self, call: Call) -> Reply {
        let tools = self.clone();
        match call.request.method.as_str() {
            "tool.list" => Box::pin(async move { Ok(list(&call)) }),
            "tool.register" => Box::pin(async move { register_runtime_tool(&call) }),
            "tool.unregister" => Box::pin(async move { unregister_runtime_tool(&call) }),
            "tool.cancel" => Box::pin(async move { tools.cancel(&call) }),
            "script.run" => Box::pin(async move { tools.script_run(call).await }),
            _ => Box::pin(async move { tools.tool_call(call).await }),
        }
    }
}

/// The longest script source `script.run` takes.
const MAX_SOURCE: u64 = 64 * 1024;

/// Scripts and tools running at once, at most.
pub fn pool_size() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

fn provider_error(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::ProviderError, message)
}

fn invalid(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

/// `tool.list`: the descriptors of the tools the principal may call.
/// Bytes a registered tool's descriptor may take.
const MAX_RUNTIME_TOOL_DESCRIPTOR: usize = 64 << 10;

/// `tool.register {tool: {name, description?, input_schema?, …}}` (or the
/// descriptor's fields as the params): a tool the runtime holds, which a
/// script's `call_tool` then asks of the runtime (where its grant's
/// `runtime_tools` allows). Once the runtime has registered any, only
/// those names go to it.
fn register_runtime_tool(call: &Call) -> Result<Value, ErrorBody> {
    let p = &call.request.params;
    let descriptor = match p.get("tool") {
        Some(tool) => tool.clone(),
        None => Value::Object(p.clone()),
    };
    let name = descriptor
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| portcullis_policy::valid_id(n))
        .ok_or_else(|| {
            invalid("tool.register needs `tool.name`: 1 to 64 characters of a-z, A-Z, 0-9, `_`, `-` and `.`")
        })?
        .to_string();
    if descriptor
        .get("input_schema")
        .is_some_and(|s| !s.is_object() && !s.is_boolean())
    {
        return Err(invalid(
            "`tool.input_schema` must be a JSON Schema (an object)",
        ));
    }
    if descriptor.to_string().len() > MAX_RUNTIME_TOOL_DESCRIPTOR {
        return Err(invalid(format!(
            "a tool's descriptor may take {MAX_RUNTIME_TOOL_DESCRIPTOR} bytes"
        )));
    }
    if !call.resources.register_runtime_tool(&name, descriptor) {
        return Err(ErrorBody::new(
            ErrorCode::PolicyBlocked,
            format!(
                "this session has {} runtime tools registered, the most it holds; unregister one first",
                crate::provider::MAX_RUNTIME_TOOLS
            ),
        ));
    }
    Ok(json!({"name": name, "registered": true}))
}

fn unregister_runtime_tool(call: &Call) -> Result<Value, ErrorBody> {
    let name = call
        .request
        .params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("tool.unregister needs `name`"))?;
    if !call.resources.unregister_runtime_tool(name) {
        return Err(ErrorBody::new(
            ErrorCode::NotFound,
            format!("the runtime registered no tool `{name}` in this session"),
        ));
    }
    Ok(json!({"name": name, "unregistered": true}))
}

fn list(call: &Call) -> Value {
    let policy = &call.policy;
    let tools: Vec<Value> =
        portcullis_policy::tool_descriptors(policy, &call.principal, jiff::Timestamp::now())
            .into_iter()
            .map(|(_, descriptor)| descriptor)
            .collect();
    json!({"tools": tools, "generation": policy.generation})
}

/// A `tool.call`, listed for `tool.cancel` from admission (waiting for
/// its approval too) until dropped.
struct Running {
    tools: Tools,
    key: (String, String),
}

impl Running {
    fn register(tools: &Tools, call: &Call) -> Self {
        let key = (call.principal.clone(), call.request.id.to_string());
        lock(&tools.0.running).insert(key.clone(), call.cancel.clone());
        Self {
            tools: tools.clone(),
            key,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.tools.0.running).remove(&self.key);
    }
}

impl Tools {
    /// `tool.cancel {request_id}`: stops one of the caller's own running
    /// `tool.call`s (like a `cancel` frame for it).
    fn cancel(&self, call: &Call) -> Result<Value, ErrorBody> {
        let Some(Value::String(id)) = call.request.params.get("request_id") else {
            return Err(invalid(
                "tool.cancel needs `request_id`, the id of a running tool.call",
            ));
        };
        let token = lock(&self.0.running)
            .get(&(call.principal.clone(), id.clone()))
            .cloned();
        match token {
            Some(token) => {
                token.cancel();
                Ok(json!({"request_id": id, "cancelled": true}))
            }
            None => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("no running tool.call `{id}` of yours"),
            )),
        }
    }

    async fn tool_call(&self, call: Call) -> Result<Value, ErrorBody> {
        let name = match call.request.params.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => return Err(invalid("tool.call needs `name`")),
        };
        let args = call
            .request
            .params
            .get("arguments")
            .or_else(|| call.request.params.get("args"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let registry = self.registry(&call.policy);
        let started = std::time::Instant::now();
        let compiled = registry.tool(&name)?;
        let value = match &compiled.tool.action {
            ToolAction::Mcp { server, tool } => {
                compiled.validate(&args)?;
                let definition = call.policy.mcp_server(server).ok_or_else(|| {
                    provider_error(format!("tool `{name}` names MCP server `{server}`, which the policy does not define"))
                })?;
                self.0.mcp.call(&call, definition, tool, args).await?
            }
            ToolAction::Script(_) => {
                let host = Host::new(
                    &call,
                    ScriptLimits::DEFAULT,
                    registry.clone(),
                    self.0.secrets_dir.clone(),
                );
                self.on_pool(call.parent.is_some(), move || host.run_tool(&name, args))
                    .await??
            }
        };
        Ok(json!({
            "value": value,
            "duration_ms": started.elapsed().as_millis() as u64,
        }))
    }

    async fn script_run(&self, call: Call) -> Result<Value, ErrorBody> {
        let Terms::Script(limits) = call.terms else {
            return Err(provider_error(
                "script.run reached scripts without script terms",
            ));
        };
        let source = match call.request.params.get("source") {
            Some(Value::String(source)) => source.clone(),
            _ => return Err(invalid("script.run needs `source`, the Rhai text")),
        };
        // The source is a string the script holds: the limit on strings
        // bounds it (as asked, within the grant), and 64 KiB (a frame)
        // at most.
        let most = limits.max_string_size.min(MAX_SOURCE);
        if source.len() as u64 > most {
            return Err(invalid(format!(
                "the script is {} bytes; at most {most} (its max_string_size, and 64 KiB)",
                source.len(),
            )));
        }
        let args = call
            .request
            .params
            .get("args")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let registry = self.registry(&call.policy);
        let host = Host::new(&call, limits, registry, self.0.secrets_dir.clone());
        self.on_pool(call.parent.is_some(), move || {
            host.run_script(&source, args)
        })
        .await?
    }
}

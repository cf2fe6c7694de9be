//! The `tools` and `scripts` capabilities: `tool.list`, `tool.call`,
//! `tool.cancel` and `script.run`.
//!
//! Tools are the operator's: a JSON Schema and a Rhai script declared in
//! the policy (`registry.rs` compiles them once per policy). Scripts are
//! the agent's: Rhai source run under the grant's limits, which can call
//! tools — and read files, list directories and run commands when the
//! principal holds those grants — many calls in one round trip. Every
//! call a script makes goes the session's way (`host.rs`): decided by the
//! policy, recorded in the audit log (with the script's request id as its
//! parent), executed by the same provider, recorded again.
//!
//! All Rhai runs on a bounded pool of blocking threads, so a busy script
//! never holds up a session, and at most [`pool_size`] run at once (the
//! rest wait their turn).

pub mod approvals;
pub mod engine;
mod host;
pub mod registry;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use portcullis_policy::{ScriptLimits, Terms, Verdict};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::provider::{Call, Provider, Reply};
pub use host::Host;
use portcullis_wire::frame::{ErrorBody, ErrorCode};

pub struct Tools;

impl Provider for Tools {
    fn methods(&self) -> &'static [&'static str] {
        &["tool.list", "tool.call", "tool.cancel", "script.run"]
    }

    /// A cancelled script stops at its next progress check.
    fn cancel_grace(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn call(&self, call: Call) -> Reply {
        match call.request.method.as_str() {
            "tool.list" => Box::pin(async move { Ok(list(&call)) }),
            "tool.cancel" => Box::pin(async move { cancel(&call) }),
            "script.run" => Box::pin(script_run(call)),
            _ => Box::pin(tool_call(call)),
        }
    }
}

/// Scripts and tools running at once, at most.
pub fn pool_size() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

static POOL: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(pool_size())));

/// Runs `work` on the script pool once a place is free.
async fn on_pool<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ErrorBody> {
    let permit = POOL
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| provider_error("the script pool is closed"))?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work()
    })
    .await
    .map_err(|e| provider_error(format!("the script thread failed: {e}")))
}

fn provider_error(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::ProviderError, message)
}

fn invalid(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

/// `tool.list`: the descriptors of the tools the principal may call.
fn list(call: &Call) -> Value {
    let policy = call.gateway.current_policy();
    let tools: Vec<Value> = descriptors(&policy, &call.principal, jiff::Timestamp::now())
        .into_iter()
        .map(|(_, descriptor)| descriptor)
        .collect();
    json!({"tools": tools, "generation": policy.generation})
}

/// The tools `principal` may call now, by name and descriptor, in the
/// policy's order, with the approval each needs. A session keeps the last set it saw and tells
/// the client what a reload changed (`tool.registered` /
/// `tool.unregistered`).
pub fn descriptors(
    policy: &portcullis_policy::Policy,
    principal: &str,
    now: jiff::Timestamp,
) -> Vec<(String, Value)> {
    policy
        .tools
        .iter()
        .filter_map(|tool| {
            let query = portcullis_policy::Query {
                method: "tool.call".into(),
                target: portcullis_policy::Target::Tool {
                    name: tool.name.clone(),
                },
            };
            let approval = match portcullis_policy::decide(policy, principal, &query, now).verdict {
                Verdict::Allow => "allow",
                Verdict::RequireApproval(p) => p.as_str(),
                Verdict::Deny(_) => return None,
            };
            let descriptor = json!({
                "name": tool.name,
                "title": tool.title,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "risk": tool.risk,
                "approval_policy": approval,
            });
            Some((tool.name.clone(), descriptor))
        })
        .collect()
}

/// Running `tool.call`s by principal and request id, for `tool.cancel`.
static RUNNING: LazyLock<Mutex<HashMap<(String, String), CancellationToken>>> =
    LazyLock::new(Default::default);

struct Running(String, String);

impl Running {
    fn register(principal: &str, id: &str, token: CancellationToken) -> Self {
        let key = (principal.to_string(), id.to_string());
        lock_running().insert(key.clone(), token);
        Self(key.0, key.1)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        lock_running().remove(&(std::mem::take(&mut self.0), std::mem::take(&mut self.1)));
    }
}

fn lock_running() -> std::sync::MutexGuard<'static, HashMap<(String, String), CancellationToken>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tool.cancel {request_id}`: stops one of the caller's own running
/// `tool.call`s (like a `cancel` frame for it).
fn cancel(call: &Call) -> Result<Value, ErrorBody> {
    let Some(Value::String(id)) = call.request.params.get("request_id") else {
        return Err(invalid(
            "tool.cancel needs `request_id`, the id of a running tool.call",
        ));
    };
    let token = lock_running()
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

async fn tool_call(call: Call) -> Result<Value, ErrorBody> {
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
    let _running = Running::register(
        &call.principal,
        &call.request.id.to_string(),
        call.cancel.clone(),
    );
    let host = Host::new(&call, ScriptLimits::DEFAULT);
    let started = std::time::Instant::now();
    let value = on_pool(move || host.run_tool(&name, args)).await??;
    Ok(json!({
        "value": value,
        "duration_ms": started.elapsed().as_secs_f64() * 1e3,
    }))
}

async fn script_run(call: Call) -> Result<Value, ErrorBody> {
    let Terms::Script(limits) = call.terms else {
        return Err(provider_error(
            "script.run reached scripts without script terms",
        ));
    };
    let source = match call.request.params.get("source") {
        Some(Value::String(source)) => source.clone(),
        _ => return Err(invalid("script.run needs `source`, the Rhai text")),
    };
    if source.len() as u64 > limits.max_string_size.max(64 * 1024) {
        return Err(invalid(format!(
            "the script is {} bytes; at most {} (the grant's max_string_size, or 64 KiB)",
            source.len(),
            limits.max_string_size.max(64 * 1024)
        )));
    }
    let args = call
        .request
        .params
        .get("args")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let host = Host::new(&call, limits);
    on_pool(move || host.run_script(&source, args)).await?
}

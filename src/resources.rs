//! `resource.list`, `resource.get` and `resource.dispose`: the session's
//! resources (file watches; see [`crate::provider::SessionResources`]), and
//! the principal's started processes (`shell::process`), which belong to
//! the principal, not the session, and end by their own rules (exit,
//! `idle_timeout`).
//!
//! `resource.create` makes a watch through `file.watch`, and
//! `resource.restore_state` re-makes the watches of an exported state the
//! same way: each a request of the call's own (see
//! [`crate::provider::Requests`]), so policy, limits and audit are the
//! ones `file.watch` always takes. A process is never restarted: a
//! restored state reports it kept (it still runs here) or lost.

use portcullis_policy::Capability;
use portcullis_wire::frame::{ErrorBody, ErrorCode};
use serde_json::{Value, json};

use crate::provider::{Call, Method, Provider, Reply};
use crate::shell::process::Processes;

/// `resource.list`, `resource.get`, `resource.dispose`: the session's
/// resources, and the principal's started processes.
pub struct Resources {
    processes: Processes,
}

impl Resources {
    pub fn new(processes: Processes) -> Self {
        Self { processes }
    }
}

impl Provider for Resources {
    fn methods(&self) -> &'static [Method] {
        const METHODS: &[Method] = &[
            Method::plain("resource.list", Capability::Resources),
            Method::plain("resource.get", Capability::Resources),
            // Ends a watch or a started process.
            Method {
                start_entry: true,
                ..Method::plain("resource.dispose", Capability::Resources)
            },
            // Makes a watch (a `file.watch` of the call's own).
            Method {
                start_entry: true,
                ..Method::plain("resource.create", Capability::Resources)
            },
            Method::plain("resource.export_state", Capability::Resources),
            Method {
                start_entry: true,
                ..Method::plain("resource.restore_state", Capability::Resources)
            },
        ];
        METHODS
    }

    fn call(&self, call: Call) -> Reply {
        let processes = self.processes.clone();
        Box::pin(async move {
            let resources = call.resources.clone();
            let mine = || {
                processes
                    .of(&call.principal)
                    .iter()
                    .map(|p| {
                        let mut info = p.describe();
                        info["id"] = json!(p.id);
                        info["kind"] = json!("process");
                        info
                    })
                    .collect::<Vec<_>>()
            };
            match call.request.method.as_str() {
                "resource.list" => {
                    let mut all = resources.list();
                    all.extend(mine());
                    return Ok(json!({ "resources": all }));
                }
                "resource.export_state" => return Ok(export_state(&call, &processes)),
                "resource.create" => return create(&call).await,
                "resource.restore_state" => return restore_state(&call, &processes).await,
                _ => {}
            }
            let Some(id) = call.request.params.get("id").and_then(Value::as_str) else {
                return Err(ErrorBody::new(
                    ErrorCode::InvalidRequest,
                    format!("{}: `id` (a string) is required", call.request.method),
                ));
            };
            let not_found = || {
                ErrorBody::new(
                    ErrorCode::NotFound,
                    format!("no resource `{id}` in this session or process of yours"),
                )
            };
            if call.request.method == "resource.get" {
                let mut all = resources.list();
                all.extend(mine());
                let found = all.into_iter().find(|r| r["id"] == id);
                return found.ok_or_else(not_found);
            }
            if resources.dispose(id) {
                return Ok(json!({ "id": id, "disposed": true }));
            }
            let Ok(process) = processes.find(&call.principal, id) else {
                return Err(not_found());
            };
            // A process is stopped (if it runs) and forgotten.
            process
                .stop_and_wait(crate::shell::process::StopReason::Disposed)
                .await;
            processes.forget(id);
            Ok(json!({ "id": id, "disposed": true }))
        })
    }
}

/// The version of the state `resource.export_state` gives.
const STATE_VERSION: u64 = 1;

/// What the session and the principal hold, as a state the runtime can
/// keep: each watch with the request that made it, each process with its
/// id and command (for the record: processes are not restarted).
fn export_state(call: &Call, processes: &Processes) -> Value {
    let mut held: Vec<Value> = call
        .resources
        .requests()
        .into_iter()
        .map(|(id, request)| {
            json!({"id": id, "kind": "watch",
                   "create": {"method": request.method, "params": request.params}})
        })
        .collect();
    held.extend(processes.of(&call.principal).iter().map(|p| {
        json!({"id": p.id, "kind": "process", "command": p.command,
               "state": if p.running() { "running" } else { "exited" }})
    }));
    json!({"state": {"version": STATE_VERSION, "provider": "portcullis", "resources": held}})
}

/// `resource.create {kind: "watch", params}`: a watch, made by `file.watch`
/// with `params`.
async fn create(call: &Call) -> Result<Value, ErrorBody> {
    let p = &call.request.params;
    let invalid = |m: &str| ErrorBody::new(ErrorCode::InvalidRequest, m);
    match p.get("kind").and_then(Value::as_str) {
        Some("watch") => {}
        Some("process" | "terminal") => {
            return Err(invalid(
                "resource.create makes watches; start a process or terminal with shell.start \
                 (its output streams on that request)",
            ));
        }
        _ => return Err(invalid("resource.create needs `kind`: \"watch\"")),
    }
    let Some(Value::Object(params)) = p.get("params") else {
        return Err(invalid(
            "resource.create needs `params`: file.watch's (root_id, path, …)",
        ));
    };
    let made = own_request(call, 1, "file.watch", params.clone()).await?;
    Ok(json!({"id": made["watch"], "kind": "watch", "resource": made}))
}

/// `resource.restore_state {state}`: each watch made again (a new id);
/// each process kept if it still runs here under this principal, else
/// reported lost.
async fn restore_state(call: &Call, processes: &Processes) -> Result<Value, ErrorBody> {
    let invalid = |m: String| ErrorBody::new(ErrorCode::InvalidRequest, m);
    let state = call.request.params.get("state").ok_or_else(|| {
        invalid("resource.restore_state needs `state`, as resource.export_state gave it".into())
    })?;
    if state.get("version").and_then(Value::as_u64) != Some(STATE_VERSION) {
        return Err(invalid(format!("`state.version` must be {STATE_VERSION}")));
    }
    let Some(held) = state.get("resources").and_then(Value::as_array) else {
        return Err(invalid("`state.resources` must be an array".into()));
    };
    if held.len() > crate::provider::MAX_PER_SESSION * 8 {
        return Err(invalid(format!(
            "`state.resources` holds {} entries; a state has at most {}",
            held.len(),
            crate::provider::MAX_PER_SESSION * 8
        )));
    }
    let (mut restored, mut lost) = (Vec::new(), Vec::new());
    for (n, resource) in held.iter().enumerate() {
        let id = resource.get("id").cloned().unwrap_or(Value::Null);
        match resource.get("kind").and_then(Value::as_str) {
            Some("watch") => {
                let params = resource
                    .pointer("/create/params")
                    .and_then(Value::as_object)
                    .filter(|_| resource.pointer("/create/method") == Some(&json!("file.watch")));
                let Some(params) = params else {
                    lost.push(json!({"id": id, "kind": "watch", "reason": "no file.watch request to make it again"}));
                    continue;
                };
                match own_request(call, n as u64 + 1, "file.watch", params.clone()).await {
                    Ok(made) => restored.push(json!({"id": made["watch"], "previous_id": id, "kind": "watch"})),
                    Err(e) => lost.push(json!({"id": id, "kind": "watch", "reason": e.message, "code": e.code.as_str()})),
                }
            }
            Some("process") => {
                let running = id
                    .as_str()
                    .and_then(|id| processes.find(&call.principal, id).ok())
                    .filter(|p| p.running());
                match running {
                    Some(p) => restored.push(json!({"id": p.id, "previous_id": id, "kind": "process", "kept": true})),
                    None => lost.push(json!({"id": id, "kind": "process",
                                             "reason": "a process is not restarted, and this one no longer runs here"})),
                }
            }
            other => lost.push(json!({"id": id, "kind": other, "reason": "not a kind of resource this gateway has"})),
        }
    }
    Ok(json!({"restored": restored, "lost": lost}))
}

/// A request of the call's own (id `<call id>.<n>`), through the session's
/// one path; its answer once its entry is durable.
async fn own_request(
    call: &Call,
    n: u64,
    method: &str,
    params: serde_json::Map<String, Value>,
) -> Result<Value, ErrorBody> {
    let request = crate::provider::own_request(&call.request, n, method, params).map_err(|e| {
        ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("a request id of this call's: {e}"),
        )
    })?;
    let answer = call
        .requests
        .send(&call.request.id, request, call.cancel.child_token())
        .await;
    if let Some(entry) = answer.entry {
        entry.await?;
    }
    answer.result
}

//! `resource.list`, `resource.get` and `resource.dispose`: the session's
//! resources (file watches; see [`crate::provider::SessionResources`]), and
//! the principal's started processes (`shell::process`), which belong to
//! the principal, not the session, and end by their own rules (exit,
//! `idle_timeout`).

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
        ];
        METHODS
    }

    fn call(&self, call: Call) -> Reply {
        let processes = self.processes.clone();
        Box::pin(async move {
            let resources = call.resources;
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
            if call.request.method == "resource.list" {
                let mut all = resources.list();
                all.extend(mine());
                return Ok(json!({ "resources": all }));
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

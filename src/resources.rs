//! What a session holds beyond its requests: file watches. A resource is
//! created by a request, listed by `resource.list`, ended by
//! `resource.dispose`, by a policy change that no longer allows the request
//! that made it, or by the end of the session. Dropping a resource's guard
//! stops it.
//!
//! The principal's started processes (`shell::process`) are listed and
//! disposed of here too (kind `process`): they belong to the principal,
//! not the session, and end by their own rules (exit, `idle_timeout`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use portcullis_policy::Capability;

use crate::shell::process::Processes;

use crate::provider::{Call, Method, Outbound, Outbox, Provider, Reply, SessionGone};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Frame, Request};

/// Resources one session may hold at once.
pub const MAX_PER_SESSION: usize = 16;

/// Sends `event` frames to the session (change notifications).
#[derive(Clone)]
pub struct EventSink {
    outbox: Outbox,
}

impl EventSink {
    /// Waits while the peer is slow; fails only when the session is gone.
    pub async fn send(&self, event: &str, payload: Value) -> Result<(), SessionGone> {
        let frame = Frame::Event(Event {
            event: event.to_string(),
            payload,
        });
        self.outbox
            .send(Outbound::Frame(frame))
            .await
            .map_err(|_| SessionGone)
    }
}

struct Held {
    kind: &'static str,
    /// The request that created it, decided again when the policy changes.
    request: Request,
    info: Value,
    _guard: Box<dyn Send>,
}

/// One session's resources. Cloned into every call of the session.
#[derive(Clone)]
pub struct SessionResources {
    held: Arc<Mutex<Holdings>>,
    events: EventSink,
}

#[derive(Default)]
struct Holdings {
    next: u64,
    by_id: BTreeMap<String, Held>,
}

impl SessionResources {
    pub fn new(outbox: Outbox) -> Self {
        Self {
            held: Arc::default(),
            events: EventSink { outbox },
        }
    }

    fn lock(&self) -> MutexGuard<'_, Holdings> {
        // A panic while holding the lock leaves a map that is still whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn events(&self) -> EventSink {
        self.events.clone()
    }

    /// Reserves an id (`w1`, `w2`, …) for a resource about to be made.
    pub fn reserve(&self, prefix: &str) -> Result<String, ErrorBody> {
        let mut held = self.lock();
        if held.by_id.len() >= MAX_PER_SESSION {
            return Err(ErrorBody::new(
                ErrorCode::ProviderError,
                format!(
                    "this session holds {MAX_PER_SESSION} resources already; \
                     dispose of one with resource.dispose"
                ),
            ));
        }
        held.next += 1;
        Ok(format!("{prefix}{}", held.next))
    }

    /// Holds a resource until it is disposed. `info` is what
    /// `resource.list` shows besides id and kind.
    pub fn add(
        &self,
        id: String,
        kind: &'static str,
        request: &Request,
        info: Value,
        guard: Box<dyn Send>,
    ) {
        let held = Held {
            kind,
            request: request.clone(),
            info,
            _guard: guard,
        };
        self.lock().by_id.insert(id, held);
    }

    pub fn list(&self) -> Vec<Value> {
        self.lock()
            .by_id
            .iter()
            .map(|(id, held)| describe(id, held))
            .collect()
    }

    /// Stops and forgets a resource; `false` if there was none by that id.
    pub fn dispose(&self, id: &str) -> bool {
        // Dropped outside the lock: stopping a watch joins its thread.
        let removed = self.lock().by_id.remove(id);
        removed.is_some()
    }

    /// The requests behind the resources held, to decide them again.
    pub fn requests(&self) -> Vec<(String, Request)> {
        self.lock()
            .by_id
            .iter()
            .map(|(id, held)| (id.clone(), held.request.clone()))
            .collect()
    }

    /// Ends everything (the session is over).
    pub fn clear(&self) {
        let all = std::mem::take(&mut self.lock().by_id);
        drop(all);
    }
}

fn describe(id: &str, held: &Held) -> Value {
    let mut value = json!({ "id": id, "kind": held.kind });
    if let (Some(value), Value::Object(info)) = (value.as_object_mut(), &held.info) {
        value.extend(info.clone());
    }
    value
}

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
            Method::plain("resource.dispose", Capability::Resources),
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

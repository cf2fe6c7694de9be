//! What a session holds beyond its requests (file watches): created by a
//! request, listed by `resource.list`, ended by `resource.dispose`, by a
//! policy change that no longer allows the request that made it, or by the
//! end of the session. Dropping a resource's guard stops it. Part of the
//! provider API: a call adds what it holds to its session's resources.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Frame, Request};
use serde_json::{Value, json};

use super::{Outbound, Outbox, SessionGone};

/// Resources one session may hold at once.
pub const MAX_PER_SESSION: usize = 16;

/// Sends `event` frames to the session (change notifications).
#[derive(Clone)]
pub struct EventSink {
    outbox: Outbox,
}

impl EventSink {
    /// Whether both send to the same session.
    pub fn same_session(&self, other: &EventSink) -> bool {
        self.outbox.same_channel(&other.outbox)
    }

    /// Whether the session is gone.
    pub fn is_closed(&self) -> bool {
        self.outbox.is_closed()
    }

    /// Waits while the peer is slow; fails only when the session is gone.
    pub async fn send(&self, event: &str, payload: Value) -> Result<(), SessionGone> {
        let frame = Frame::Event(Event {
            event: event.to_string(),
            payload,
        });
        self.outbox
            .send(Outbound::Frame(Box::new(frame)))
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
    /// The principal's `max_resources` (the session sets it, and again
    /// after a policy change); [`MAX_PER_SESSION`] bounds it.
    granted: Arc<AtomicUsize>,
    /// Tools the runtime registered with `tool.register`, by name: what a
    /// script's `call_tool` may ask of the runtime.
    runtime_tools: Arc<Mutex<BTreeMap<String, Value>>>,
}

/// Tools a runtime may register in one session.
pub const MAX_RUNTIME_TOOLS: usize = 256;

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
            granted: Arc::new(AtomicUsize::new(MAX_PER_SESSION)),
            runtime_tools: Arc::default(),
        }
    }

    fn tools(&self) -> MutexGuard<'_, BTreeMap<String, Value>> {
        self.runtime_tools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers (or replaces) a tool the runtime holds; false when the
    /// session holds [`MAX_RUNTIME_TOOLS`] others already.
    pub fn register_runtime_tool(&self, name: &str, descriptor: Value) -> bool {
        let mut tools = self.tools();
        if tools.len() >= MAX_RUNTIME_TOOLS && !tools.contains_key(name) {
            return false;
        }
        tools.insert(name.to_string(), descriptor);
        true
    }

    pub fn unregister_runtime_tool(&self, name: &str) -> bool {
        self.tools().remove(name).is_some()
    }

    /// Whether the runtime registered tools at all, and this one.
    pub fn runtime_tool(&self, name: &str) -> (bool, bool) {
        let tools = self.tools();
        (!tools.is_empty(), tools.contains_key(name))
    }

    /// How many resources the principal's grants let this session hold.
    pub fn set_granted(&self, max_resources: u32) {
        let n = usize::try_from(max_resources).unwrap_or(usize::MAX);
        self.granted.store(n, Ordering::Relaxed);
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
        let granted = self.granted.load(Ordering::Relaxed);
        if held.by_id.len() >= granted.min(MAX_PER_SESSION) {
            let (code, limit) = match granted < MAX_PER_SESSION {
                true => (
                    ErrorCode::PolicyBlocked,
                    format!("the grant's max_resources ({granted})"),
                ),
                false => (
                    ErrorCode::ProviderError,
                    format!("{MAX_PER_SESSION}, the most a session holds"),
                ),
            };
            return Err(ErrorBody::new(
                code,
                format!(
                    "this session holds {} resources already, {limit}; \
                     dispose of one with resource.dispose",
                    held.by_id.len()
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

//! The profile's mapping, sans I/O: a JSON-RPC message from the runtime
//! becomes relay.v1 frame records for the session ([`Translator::inbound`]),
//! and a relay.v1 frame from the session becomes JSON-RPC messages for the
//! runtime ([`Translator::outbound`]). The session, its admission path and
//! the providers never learn which profile a peer speaks.
//!
//! A few messages are the protocol's own, not requests of a capability
//! (`initialize`, `shutdown`, `$/ping`, `provider.status`,
//! `provider.capabilities`): they are answered from what the session
//! announced, in order with everything else — the reader hands the session
//! a relay `ping` and the writer answers when its `pong` passes.

use std::collections::{HashMap, HashSet, VecDeque};

use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::codes;
use crate::frame::{
    self, Cancel, ErrorBody, ErrorCode, Event, Frame, Heartbeat, Hello, Request, RequestContext,
    RequestId, Response, Stream,
};
use crate::record;

/// The protocol string of this profile.
pub const PROTOCOL: &str = "ya-environment-protocol.v1";

/// The one execution target this provider has: commands run on this host,
/// in the sandbox the grant describes.
pub const TARGET_ID: &str = "local";

/// The id of the `initialize` request the provider sends.
pub const INITIALIZE_ID: &str = "initialize";

/// Output a `process.wait` or `shell_session.snapshot` gathers per stream
/// before it counts instead of keeping (the process's ring is 1 MiB).
const MAX_COLLECTED: usize = 1 << 20;

/// Why the channel must end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("the runtime refused `initialize`: {0}")]
    InitializeRefused(String),
}

/// How a 0.92 method's answer is made from the relay method's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Same,
    Exec,
    /// `process.start` / `shell_session.open`: answered at the `started`
    /// stream frame; the output then goes on as `$/stream`.
    Started {
        session: bool,
    },
    /// `process.wait` / `shell_session.snapshot`: an attach whose output
    /// is gathered into the answer.
    Collect {
        session: bool,
    },
    Status {
        session: bool,
    },
    List {
        sessions: bool,
    },
    /// The relay result as it is, naming a terminal by `session_id`.
    Handle {
        session: bool,
    },
    Kill {
        session: bool,
    },
    Watch,
}

/// A request of the runtime's on its way through the session.
struct Call {
    /// The JSON-RPC id; `None` for a notification (no answer is sent).
    rpc_id: Option<Value>,
    shape: Shape,
    answered: bool,
    collected: Option<Collected>,
    /// The mount it named, for its error's `data.mount_id`.
    mount_id: Option<Value>,
}

#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    first_seq: Option<u64>,
    next_seq: Option<u64>,
    /// Bytes not kept: past [`MAX_COLLECTED`], or gone from the ring.
    dropped: u64,
}

/// What the writer says when the `pong` of one of the reader's pings
/// passes.
enum Local {
    Initialize {
        rpc_id: Value,
    },
    Reply {
        rpc_id: Value,
        result: Value,
    },
    Error {
        rpc_id: Value,
        name: &'static str,
        message: String,
    },
    Status {
        rpc_id: Value,
    },
    Capabilities {
        rpc_id: Value,
    },
    Event {
        event: &'static str,
    },
}

/// The mapping's state, shared by a channel's reader and writer.
#[derive(Default)]
pub struct Translator {
    hello: Option<Hello>,
    /// Relay id → the runtime's request.
    calls: HashMap<String, Call>,
    /// JSON-RPC id (as [`id_key`]) → relay id, while unanswered.
    by_rpc: HashMap<String, String>,
    local: HashMap<String, Local>,
    /// Pings the session sent, until the runtime answers.
    session_pings: HashSet<String>,
    /// Requests the session sent the runtime, until it answers.
    to_runtime: HashSet<String>,
    /// Messages handed to the session as they were because they are not
    /// JSON-RPC: the id to answer (if one could be read) and why. The
    /// session refuses (and audits) each in order with a `relay.error`.
    refused: VecDeque<(Value, &'static str, String)>,
    accepted: Vec<String>,
    paused: bool,
    next: u64,
}

impl Translator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the session's `hello` has passed (the mounts are known).
    pub fn has_hello(&self) -> bool {
        self.hello.is_some()
    }

    /// One JSON-RPC message from the runtime → the records the session
    /// reads, in order.
    pub fn inbound(
        &mut self,
        message: &[u8],
        max_frame: usize,
    ) -> Result<Vec<Vec<u8>>, ProfileError> {
        let parsed: Result<Value, _> = serde_json::from_slice(message);
        let mut object = match parsed {
            Ok(Value::Object(object)) => object,
            Ok(Value::Array(_)) => {
                return Ok(self.refuse(
                    message,
                    Value::Null,
                    "invalid_request",
                    "batches are not supported: send one message at a time".into(),
                ));
            }
            Ok(_) => {
                return Ok(self.refuse(
                    message,
                    Value::Null,
                    "invalid_request",
                    "a message is a JSON object".into(),
                ));
            }
            Err(e) => {
                return Ok(self.refuse(
                    message,
                    Value::Null,
                    "parse_error",
                    format!("not JSON: {e}"),
                ));
            }
        };
        let id = object.remove("id");
        if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            let id = id.unwrap_or(Value::Null);
            return Ok(self.refuse(
                message,
                id,
                "invalid_request",
                "`jsonrpc` must be \"2.0\"".into(),
            ));
        }
        let method = match object.remove("method") {
            Some(Value::String(method)) => method,
            Some(_) => {
                let id = id.unwrap_or(Value::Null);
                return Ok(self.refuse(
                    message,
                    id,
                    "invalid_request",
                    "`method` must be a string".into(),
                ));
            }
            None => return self.response(id.unwrap_or(Value::Null), object, max_frame),
        };
        if id
            .as_ref()
            .is_some_and(|v| !(v.is_string() || v.is_number()))
        {
            return Ok(self.refuse(
                message,
                Value::Null,
                "invalid_request",
                "`id` must be a string or a number".into(),
            ));
        }
        let params = match object.remove("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(params)) => params,
            Some(_) => {
                let id = id.unwrap_or(Value::Null);
                return Ok(self.refuse(
                    message,
                    id,
                    "invalid_request",
                    "`params` must be an object".into(),
                ));
            }
        };
        let context = object
            .remove("context")
            .or_else(|| params.get("context").cloned());
        Ok(self.request(id, &method, params, context, max_frame))
    }

    /// A message that is not a request the profile can map: handed to the
    /// session as it is, which refuses and audits it; the writer answers.
    fn refuse(
        &mut self,
        message: &[u8],
        id: Value,
        name: &'static str,
        why: String,
    ) -> Vec<Vec<u8>> {
        self.refused.push_back((id, name, why));
        let mut record = Vec::with_capacity(message.len() + 1);
        record.push(record::KIND_FRAME);
        // Never a valid relay frame: the session refuses it whatever it is.
        record.extend_from_slice(b"\0");
        record.extend_from_slice(&message[..message.len().min(4096)]);
        vec![record]
    }

    fn local(&mut self, action: Local) -> Vec<Vec<u8>> {
        self.next += 1;
        let id = format!("envproto-{}", self.next);
        self.local.insert(id.clone(), action);
        frame_records(
            &Frame::Ping(Heartbeat {
                id: Some(id),
                ts: None,
            }),
            usize::MAX,
        )
    }

    fn request(
        &mut self,
        id: Option<Value>,
        method: &str,
        params: Map<String, Value>,
        context: Option<Value>,
        max_frame: usize,
    ) -> Vec<Vec<u8>> {
        match (method, id) {
            ("$/cancelRequest", _) => {
                let target = params.get("id").and_then(id_key);
                let Some(relay) = target.and_then(|key| self.by_rpc.get(&key)).cloned() else {
                    return Vec::new();
                };
                let reason = params
                    .get("reason")
                    .and_then(Value::as_str)
                    .filter(|r| frame::is_short_name(r))
                    .map(str::to_string);
                let id = RequestId::new(relay).expect("relay ids are made valid");
                frame_records(&Frame::Cancel(Cancel { id, reason }), max_frame)
            }
            // Notifications the provider has no use for.
            (_, None) if method.starts_with("$/") || method == "exit" => Vec::new(),
            ("$/ping", Some(rpc_id)) => {
                let ts = params.get("ts").cloned().unwrap_or(Value::Null);
                self.local(Local::Reply {
                    rpc_id,
                    result: json!({"ts": ts}),
                })
            }
            ("initialize", Some(rpc_id)) => self.runtime_initialize(rpc_id, &params),
            ("shutdown", Some(rpc_id)) => self.local(Local::Reply {
                rpc_id,
                result: json!({}),
            }),
            ("provider.status", Some(rpc_id)) => self.local(Local::Status { rpc_id }),
            ("provider.capabilities", Some(rpc_id)) => self.local(Local::Capabilities { rpc_id }),
            (_, rpc_id) => {
                let mount_id = params.get("mount_id").cloned();
                let (relay_method, relay_params, shape) = self.map_request(method, params);
                let relay_id = self.relay_id(rpc_id.as_ref());
                if let Some(key) = rpc_id.as_ref().and_then(id_key) {
                    self.by_rpc.insert(key, relay_id.clone());
                }
                let collected = matches!(shape, Shape::Collect { .. }).then(Collected::default);
                self.calls.insert(
                    relay_id.clone(),
                    Call {
                        rpc_id,
                        shape,
                        answered: false,
                        collected,
                        mount_id,
                    },
                );
                let request = Request {
                    id: RequestId::new(relay_id.clone()).expect("relay ids are made valid"),
                    method: relay_method,
                    params: relay_params,
                    context: context.as_ref().and_then(relay_context),
                };
                match record::encode_frame_records(&Frame::Request(request), max_frame) {
                    Ok(records) => records,
                    Err(e) => {
                        let call = self.calls.remove(&relay_id);
                        let rpc_id = call.and_then(|c| c.rpc_id).unwrap_or(Value::Null);
                        if let Some(key) = id_key(&rpc_id) {
                            self.by_rpc.remove(&key);
                        }
                        self.refuse(b"", rpc_id, "invalid_request", e.to_string())
                    }
                }
            }
        }
    }

    /// The runtime spoke first (LSP style): it is answered with the
    /// provider's descriptor, and what it accepts is taken as accepted.
    fn runtime_initialize(&mut self, rpc_id: Value, params: &Map<String, Value>) -> Vec<Vec<u8>> {
        if let Some(protocol) = params.get("protocol").and_then(Value::as_str)
            && protocol != PROTOCOL
        {
            let message = format!("this provider speaks `{PROTOCOL}`, not `{protocol}`");
            return self.local(Local::Error {
                rpc_id,
                name: "unsupported_protocol",
                message,
            });
        }
        let mut records = self.accepted(&Value::Object(params.clone()));
        records.extend(self.local(Local::Initialize { rpc_id }));
        records
    }

    /// `relay.accepted` for what the runtime's initialize (its answer, or
    /// its own request's params) accepts — everything offered when it does
    /// not say —, with its `connection_id` and `token` (the session checks
    /// a token where its transport asks for one), then `provider.online`.
    fn accepted(&mut self, initialize: &Value) -> Vec<Vec<u8>> {
        let names = initialize.get("accepted_capabilities");
        let connection_id = initialize.get("connection_id");
        let offered = self.offered();
        let mut relay: Vec<String> = Vec::new();
        let mut accepted = Vec::new();
        for name in names
            .and_then(Value::as_array)
            .map_or(offered.clone(), |names| {
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
        {
            if !offered.contains(&name) {
                continue;
            }
            let relay_name = match name.as_str() {
                "process" | "shell_session" => "shell",
                other => other,
            };
            if !relay.iter().any(|r| r == relay_name) {
                relay.push(relay_name.to_string());
            }
            accepted.push(name);
        }
        self.accepted = accepted;
        let mut payload = json!({"accepted_capabilities": relay, "output": "frames"});
        if let Some(id) = connection_id.and_then(Value::as_str) {
            payload["connection_id"] = json!(id);
        }
        if let Some(token) = initialize.get("token").and_then(Value::as_str) {
            payload["token"] = json!(token);
        }
        let event = Event {
            event: "relay.accepted".into(),
            payload,
        };
        let mut records = frame_records(&Frame::Event(event), usize::MAX);
        records.extend(self.local(Local::Event {
            event: "provider.online",
        }));
        records
    }

    /// A JSON-RPC response from the runtime.
    fn response(
        &mut self,
        id: Value,
        mut object: Map<String, Value>,
        max_frame: usize,
    ) -> Result<Vec<Vec<u8>>, ProfileError> {
        let Some(key) = id.as_str().map(str::to_string) else {
            return Ok(Vec::new());
        };
        let error = object.remove("error");
        if key == INITIALIZE_ID && !self.accepted_once() {
            if let Some(error) = error {
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given");
                return Err(ProfileError::InitializeRefused(
                    message.chars().take(300).collect(),
                ));
            }
            let result = object.remove("result").unwrap_or(Value::Null);
            return Ok(self.accepted(&result));
        }
        if self.session_pings.remove(&key) {
            let pong = Heartbeat {
                id: Some(key),
                ts: None,
            };
            return Ok(frame_records(&Frame::Pong(pong), max_frame));
        }
        if !self.to_runtime.remove(&key) {
            return Ok(Vec::new());
        }
        let Ok(relay_id) = RequestId::new(key) else {
            return Ok(Vec::new());
        };
        let response = match error {
            Some(error) => {
                let name = error
                    .get("data")
                    .and_then(|d| d.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("provider_error");
                let message = error.get("message").and_then(Value::as_str).unwrap_or("");
                let mut body = ErrorBody::new(codes::relay_code(name), message);
                body.details = error.get("data").cloned();
                Response::err(relay_id, body)
            }
            None => Response::ok(relay_id, object.remove("result").unwrap_or(Value::Null)),
        };
        Ok(frame_records(&Frame::Response(response), max_frame))
    }

    fn accepted_once(&self) -> bool {
        !self.accepted.is_empty()
    }

    /// The relay id for a runtime's request: its own id where that is a
    /// valid relay id not in use, else one made up.
    fn relay_id(&mut self, rpc_id: Option<&Value>) -> String {
        let own = match rpc_id {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        if let Some(own) =
            own.filter(|id| RequestId::new(id.clone()).is_ok() && !self.calls.contains_key(id))
        {
            return own;
        }
        loop {
            self.next += 1;
            let made = format!("rpc-{}", self.next);
            if !self.calls.contains_key(&made) {
                return made;
            }
        }
    }

    /// The relay method and params for a 0.92 request, and how to shape
    /// its answer.
    fn map_request(
        &self,
        method: &str,
        mut p: Map<String, Value>,
    ) -> (String, Map<String, Value>, Shape) {
        rename(&mut p, "mount_id", "root_id");
        rename(&mut p, "to_mount_id", "to_root_id");
        rename(&mut p, "include_hidden", "hidden");
        rename(&mut p, "session_id", "process_id");
        // No binary chunks in this profile: everything travels inline.
        p.remove("stream");
        p.remove("stdin_stream");
        p.remove("context");
        let (relay, shape) = match method {
            "file.read" => {
                if p.get("mode").and_then(Value::as_str) == Some("bytes") {
                    p.insert("encoding".into(), json!("base64"));
                }
                p.remove("mode");
                ("file.read", Shape::Same)
            }
            "file.watch" => ("file.watch", Shape::Watch),
            "shell.exec" => {
                self.command(&mut p, "sh");
                ("shell.exec", Shape::Exec)
            }
            "process.start" => {
                self.command(&mut p, "sh");
                p.remove("output_limit_bytes");
                p.remove("persistence");
                ("shell.start", Shape::Started { session: false })
            }
            "shell_session.open" => {
                self.command(&mut p, "sh");
                if let Some(Value::Object(pty)) = p.remove("pty") {
                    for side in ["cols", "rows"] {
                        if let Some(n) = pty.get(side) {
                            p.insert(side.into(), n.clone());
                        }
                    }
                }
                p.insert("pty".into(), json!(true));
                p.remove("persistence");
                ("shell.start", Shape::Started { session: true })
            }
            "process.input" => ("shell.input", Shape::Handle { session: false }),
            "shell_session.input" => ("shell.input", Shape::Handle { session: true }),
            "shell_session.exec" => {
                let command = p.remove("command");
                let line = match command {
                    Some(Value::String(line)) => format!("{line}\n"),
                    _ => String::new(),
                };
                p.insert("data".into(), json!(line));
                ("shell.input", Shape::Handle { session: true })
            }
            "process.close_stdin" => {
                p.insert("data".into(), json!(""));
                p.insert("eof".into(), json!(true));
                ("shell.input", Shape::Handle { session: false })
            }
            "process.signal" => {
                if let Some(n) = p.get("signal").and_then(Value::as_u64)
                    && let Some(name) = signal_name(n)
                {
                    p.insert("signal".into(), json!(name));
                }
                ("shell.signal", Shape::Same)
            }
            "process.kill" => ("shell.cancel", Shape::Kill { session: false }),
            "shell_session.close" => ("shell.cancel", Shape::Kill { session: true }),
            "shell_session.resize" => ("shell.resize", Shape::Handle { session: true }),
            "process.wait" => {
                if let Some(wait) = p.remove("timeout_ms") {
                    p.insert("wait_ms".into(), wait);
                }
                ("shell.attach", Shape::Collect { session: false })
            }
            "shell_session.snapshot" => {
                p.insert("wait_ms".into(), json!(0));
                ("shell.attach", Shape::Collect { session: true })
            }
            "process.status" => ("shell.status", Shape::Status { session: false }),
            "shell_session.status" => ("shell.status", Shape::Status { session: true }),
            "process.list" => ("shell.list", Shape::List { sessions: false }),
            "shell_session.list" => ("shell.list", Shape::List { sessions: true }),
            other => (other, Shape::Same),
        };
        (relay.to_string(), p, shape)
    }

    /// A command's program and working directory in relay terms: a
    /// command line is run by `sh -c`; an absolute `cwd` picks the mount
    /// it is under (the first mount when none is: the policy then refuses
    /// it, audited); no `cwd` is the target's default.
    fn command(&self, p: &mut Map<String, Value>, shell: &str) {
        match p.remove("command") {
            Some(Value::String(line)) => {
                p.insert("command".into(), json!([shell, "-c", line]));
            }
            Some(other) => {
                p.insert("command".into(), other);
            }
            None => {
                let program = p.remove("shell").unwrap_or_else(|| json!(shell));
                p.insert("command".into(), json!([program]));
            }
        }
        let mounts = self.mounts();
        if p.contains_key("root_id") {
            return;
        }
        let cwd = p.get("cwd").and_then(Value::as_str).map(str::to_string);
        let under = |path: &str, vp: &str| {
            path == vp
                || path
                    .strip_prefix(vp)
                    .is_some_and(|rest| rest.starts_with('/'))
                || vp == "/"
        };
        let mount = match cwd.as_deref() {
            Some(path) if path.starts_with('/') => mounts
                .iter()
                .filter(|(_, vp)| under(path, vp))
                .max_by_key(|(_, vp)| vp.len())
                .or(mounts.first()),
            _ => mounts.first(),
        };
        if let Some((root, _)) = mount {
            p.insert("root_id".into(), json!(root));
        }
    }

    /// The mounts the hello announced: `(root_id, virtual_path)`.
    fn mounts(&self) -> Vec<(String, String)> {
        self.hello
            .iter()
            .flat_map(Hello::roots)
            .map(|r| (r.root_id, r.virtual_path))
            .collect()
    }

    /// The capability names offered, in this profile's terms.
    fn offered(&self) -> Vec<String> {
        let caps = self.capabilities();
        caps.iter()
            .filter(|(_, v)| v.get("enabled").and_then(Value::as_bool) == Some(true))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// `initialize`'s `capabilities`, from the session's hello.
    pub(super) fn capabilities(&self) -> Map<String, Value> {
        let mut caps = Map::new();
        let Some(hello) = &self.hello else {
            return caps;
        };
        let relay = &hello.capabilities;
        if relay.contains_key("fileops") {
            let generation = self.generation();
            let mounts: Vec<Value> = hello
                .roots()
                .into_iter()
                .map(|r| {
                    json!({
                        "mount_id": r.root_id,
                        "label": r.label,
                        "virtual_path": r.virtual_path,
                        "mode": r.mode,
                        "state": "online",
                        "generation": generation,
                        "follow_symlinks": r.follow_symlinks,
                        "watch_supported": true,
                    })
                })
                .collect();
            caps.insert("fileops".into(), json!({"enabled": true, "mounts": mounts}));
        }
        if let Some(shell) = relay.get("shell") {
            let pty = shell
                .get("interactive")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let persist = shell
                .get("persist")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let persistence = if persist { "provider" } else { "connection" };
            let mounts = self.mounts();
            let target = json!({
                "target_id": TARGET_ID,
                "label": "this host, in the grant's sandbox",
                "platform": "linux",
                "shell_kind": "sh",
                "default_cwd": mounts.first().map_or("/", |(_, vp)| vp.as_str()),
                "allowed_mount_ids": mounts.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
                "supports_exec": true,
                "supports_processes": true,
                "supports_pty": pty,
                "supports_signals": true,
                "process_persistence": persistence,
                "session_persistence": if pty { persistence } else { "none" },
            });
            caps.insert(
                "shell".into(),
                json!({"enabled": true, "targets": [target]}),
            );
            caps.insert("process".into(), json!({"enabled": true}));
            caps.insert("shell_session".into(), json!({"enabled": pty}));
        }
        if let Some(tools) = relay.get("tools") {
            caps.insert("tools".into(), tools.clone());
        }
        for name in ["scripts", "resources", "artifacts"] {
            if let Some(cap) = relay.get(name) {
                caps.insert(name.into(), cap.clone());
            }
        }
        caps.insert("computer".into(), json!({"enabled": false}));
        caps
    }

    /// The mounts' `generation`, a number as the spec has it: the first
    /// 48 bits of the policy's SHA-256 (the hello's `generation`), so it
    /// changes with the policy and stays put across restarts without one.
    fn generation(&self) -> u64 {
        self.hello
            .as_ref()
            .and_then(|h| h.capabilities.get("fileops"))
            .and_then(|f| f.get("generation"))
            .and_then(Value::as_str)
            .and_then(|hex| u64::from_str_radix(hex.get(..12)?, 16).ok())
            .unwrap_or(1)
    }

    fn provider(&self) -> Value {
        let Some(hello) = &self.hello else {
            return Value::Null;
        };
        json!({
            "provider_id": hello.provider_id,
            "provider_kind": "ya_envd",
            "provider_version": hello.client_version,
            "instance_id": hello.instance_id,
            "display_name": hello.provider_id,
            "implementation": "portcullis",
            "principal": hello.principal,
        })
    }

    /// One relay frame from the session (its JSON, whole) → the JSON-RPC
    /// messages for the runtime.
    pub fn outbound(&mut self, json: &[u8]) -> Vec<Value> {
        let Ok(frame) = frame::decode_frame(json) else {
            return Vec::new();
        };
        match frame {
            Frame::Hello(hello) => {
                self.hello = Some(hello);
                let params = json!({
                    "protocol": PROTOCOL,
                    "provider": self.provider(),
                    "capabilities": self.capabilities(),
                    "max_message": self.hello.as_ref().and_then(|h| h.max_frame),
                });
                vec![rpc_request(json!(INITIALIZE_ID), "initialize", params)]
            }
            Frame::Response(response) => self.answer(response),
            Frame::Stream(stream) => self.stream(stream),
            Frame::Event(event) => self.event(event),
            Frame::Pong(beat) => beat
                .id
                .and_then(|id| self.local.remove(&id))
                .map(|action| vec![self.say(action)])
                .unwrap_or_default(),
            Frame::Ping(beat) => {
                let id = beat.id.unwrap_or_else(|| "ping".into());
                self.session_pings.insert(id.clone());
                vec![rpc_request(json!(id), "$/ping", json!({"ts": beat.ts}))]
            }
            Frame::Request(request) => {
                self.to_runtime.insert(request.id.to_string());
                let mut message = rpc_request(
                    json!(request.id.as_str()),
                    &request.method,
                    Value::Object(request.params),
                );
                if let Some(context) = request.context {
                    message["context"] = json!(context);
                }
                vec![message]
            }
            Frame::Cancel(cancel) => vec![rpc_notification(
                "$/cancelRequest",
                json!({"id": cancel.id.as_str(), "reason": cancel.reason}),
            )],
        }
    }

    fn say(&self, action: Local) -> Value {
        match action {
            Local::Initialize { rpc_id } => rpc_result(
                rpc_id,
                json!({
                    "accepted_protocol": PROTOCOL,
                    "protocol": PROTOCOL,
                    "provider": self.provider(),
                    "capabilities": self.capabilities(),
                    "accepted_capabilities": self.accepted,
                    "server_time": now(),
                }),
            ),
            Local::Reply { rpc_id, result } => rpc_result(rpc_id, result),
            Local::Error {
                rpc_id,
                name,
                message,
            } => rpc_error(rpc_id, name, &message, Map::new()),
            Local::Status { rpc_id } => {
                let hello = self.hello.as_ref();
                rpc_result(
                    rpc_id,
                    json!({
                        "protocol": PROTOCOL,
                        "provider_id": hello.and_then(|h| h.provider_id.clone()),
                        "instance_id": hello.and_then(|h| h.instance_id.clone()),
                        "state": if self.paused { "paused" } else { "online" },
                        "accepted_capabilities": self.accepted,
                        "principal": hello.and_then(|h| h.principal.clone()),
                    }),
                )
            }
            Local::Capabilities { rpc_id } => {
                rpc_result(rpc_id, json!({"capabilities": self.capabilities()}))
            }
            Local::Event { event } => {
                let hello = self.hello.as_ref();
                rpc_notification(
                    "$/event",
                    json!({"event": event, "payload": {
                        "provider_id": hello.and_then(|h| h.provider_id.clone()),
                        "instance_id": hello.and_then(|h| h.instance_id.clone()),
                    }}),
                )
            }
        }
    }

    fn answer(&mut self, response: Response) -> Vec<Value> {
        let relay_id = response.id.to_string();
        let Some(mut call) = self.calls.remove(&relay_id) else {
            return Vec::new();
        };
        if let Some(key) = call.rpc_id.as_ref().and_then(id_key)
            && self.by_rpc.get(&key) == Some(&relay_id)
        {
            self.by_rpc.remove(&key);
        }
        let Some(rpc_id) = call.rpc_id.clone() else {
            return Vec::new();
        };
        if call.answered {
            return Vec::new();
        }
        match (response.result, response.error) {
            (Some(result), _) => vec![rpc_result(
                rpc_id,
                reshape(call.shape, result, call.collected.take()),
            )],
            (None, Some(error)) => {
                // A process killed at its time limit has ended: a wait
                // reports that as a result.
                if let (Shape::Collect { .. }, ErrorCode::Timeout, Some(details)) =
                    (call.shape, error.code, &error.details)
                {
                    return vec![rpc_result(
                        rpc_id,
                        reshape(call.shape, details.clone(), call.collected.take()),
                    )];
                }
                vec![error_message(rpc_id, &call, &error)]
            }
            (None, None) => Vec::new(),
        }
    }

    fn stream(&mut self, stream: Stream) -> Vec<Value> {
        let relay_id = stream.id.to_string();
        let Some(call) = self.calls.get_mut(&relay_id) else {
            return Vec::new();
        };
        if let Some(collected) = call.collected.as_mut() {
            collected.take(&stream);
            return Vec::new();
        }
        let Some(rpc_id) = call.rpc_id.clone() else {
            return Vec::new();
        };
        let shape = call.shape;
        if let Shape::Started { session } = shape
            && stream.event == "started"
            && !call.answered
        {
            call.answered = true;
            // The id is the runtime's to use again once answered.
            if let Some(key) = id_key(&rpc_id)
                && self.by_rpc.get(&key) == Some(&relay_id)
            {
                self.by_rpc.remove(&key);
            }
            let id = stream
                .data
                .get("process_id")
                .cloned()
                .unwrap_or(Value::Null);
            let persist = stream
                .data
                .get("persist")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let persistence = if persist { "provider" } else { "connection" };
            let mut result = json!({"persistence": persistence, "started_at": now(), "pid": stream.data.get("pid"), "target_id": TARGET_ID});
            if session {
                result["session_id"] = id.clone();
                result["resource_id"] = id;
            } else {
                result["process_id"] = id;
            }
            return vec![rpc_result(rpc_id, result)];
        }
        let mut params = json!({"id": rpc_id, "event": stream.event, "data": stream.data});
        if let Some(sequence) = stream.sequence {
            params["sequence"] = json!(sequence);
        }
        if let Some(encoding) = stream.encoding {
            params["encoding"] = json!(encoding);
        }
        if let Shape::Started { session: true } = shape
            && params["event"] == "stdout"
        {
            params["event"] = json!("pty_output");
        }
        vec![rpc_notification("$/stream", params)]
    }

    fn event(&mut self, event: Event) -> Vec<Value> {
        match event.event.as_str() {
            "relay.error" => {
                if let Some((id, name, why)) = self.refused.pop_front() {
                    return vec![rpc_error(id, name, &why, Map::new())];
                }
                let event = json!({"event": "provider.error", "payload": event.payload});
                vec![rpc_notification("$/event", event)]
            }
            "file.changed" => {
                let p = &event.payload;
                let kind = match p.get("kind").and_then(Value::as_str) {
                    Some("created") => "created",
                    Some("modified" | "metadata") => "modified",
                    Some("removed") => "deleted",
                    Some("moved_from" | "moved_to") => "renamed",
                    _ => "unknown",
                };
                let generation = self.generation();
                let payload = json!({
                    "mount_id": p.get("root_id"),
                    "generation": generation,
                    "path": p.get("path"),
                    "kind": kind,
                    "watch": p.get("watch"),
                    "resource_id": p.get("watch"),
                    "ts": now(),
                });
                vec![rpc_notification(
                    "$/event",
                    json!({"event": "mount.changed", "payload": payload}),
                )]
            }
            // A policy change: the descriptor in this profile's terms, and
            // each mount it took away or added.
            "capability.updated" => {
                let before = self.mounts();
                if let (Some(hello), Some(Value::Object(caps))) =
                    (self.hello.as_mut(), event.payload.get("capabilities"))
                {
                    hello.capabilities = caps.clone();
                }
                let after = self.mounts();
                let generation = self.generation();
                let mut said = Vec::new();
                for (id, path) in &before {
                    if !after.iter().any(|(other, _)| other == id) {
                        let payload = json!({"mount_id": id, "virtual_path": path, "generation": generation, "reason": "policy"});
                        said.push(rpc_notification(
                            "$/event",
                            json!({"event": "mount.offline", "payload": payload}),
                        ));
                    }
                }
                for (id, path) in &after {
                    if !before.iter().any(|(other, _)| other == id) {
                        let payload =
                            json!({"mount_id": id, "virtual_path": path, "generation": generation});
                        said.push(rpc_notification(
                            "$/event",
                            json!({"event": "mount.online", "payload": payload}),
                        ));
                    }
                }
                let mut payload = event.payload;
                payload["capabilities"] = Value::Object(self.capabilities());
                said.push(rpc_notification(
                    "$/event",
                    json!({"event": "capability.updated", "payload": payload}),
                ));
                said
            }
            "process.lost" => {
                let mut payload = event.payload;
                let terminal = payload.get("terminal").and_then(Value::as_bool) == Some(true);
                let name = match terminal {
                    true => {
                        rename_value(&mut payload, "process_id", "session_id");
                        payload["resource_id"] = payload["session_id"].clone();
                        "shell_session.lost"
                    }
                    false => "process.lost",
                };
                vec![rpc_notification(
                    "$/event",
                    json!({"event": name, "payload": payload}),
                )]
            }
            name => {
                match name {
                    "provider.paused" => self.paused = true,
                    "provider.resumed" => self.paused = false,
                    _ => {}
                }
                vec![rpc_notification(
                    "$/event",
                    json!({"event": event.event, "payload": event.payload}),
                )]
            }
        }
    }
}

impl Collected {
    fn take(&mut self, stream: &Stream) {
        match stream.event.as_str() {
            "attached" => {
                self.first_seq = stream.data.get("from_seq").and_then(Value::as_u64);
                self.next_seq = self.first_seq;
                if stream.data.get("truncated").and_then(Value::as_bool) == Some(true) {
                    let first = stream
                        .data
                        .get("first_seq")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    let from = self.first_seq.unwrap_or(0);
                    self.dropped += first.saturating_sub(from);
                }
            }
            "stdout" | "stderr" => {
                let text = stream.data.as_str().unwrap_or("");
                let bytes = match stream.encoding.as_deref() {
                    Some("base64") => base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .unwrap_or_default(),
                    _ => text.as_bytes().to_vec(),
                };
                if let Some(seq) = stream.sequence {
                    self.next_seq = Some(seq + bytes.len() as u64);
                    self.first_seq.get_or_insert(seq);
                }
                let out = if stream.event == "stdout" {
                    &mut self.stdout
                } else {
                    &mut self.stderr
                };
                let room = MAX_COLLECTED.saturating_sub(out.len());
                out.extend_from_slice(&bytes[..bytes.len().min(room)]);
                self.dropped += bytes.len().saturating_sub(room) as u64;
            }
            "output_truncated" => {
                self.dropped += stream
                    .data
                    .get("missed_bytes")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                self.next_seq = stream
                    .data
                    .get("resumed_at")
                    .and_then(Value::as_u64)
                    .or(self.next_seq);
            }
            _ => {}
        }
    }
}

/// The answer's shape in this profile.
fn reshape(shape: Shape, mut result: Value, collected: Option<Collected>) -> Value {
    match shape {
        Shape::Same => result,
        Shape::Exec => {
            let truncated = result.get("stdout_truncated").and_then(Value::as_bool) == Some(true)
                || result.get("stderr_truncated").and_then(Value::as_bool) == Some(true);
            result["truncated"] = json!(truncated);
            result
        }
        Shape::Watch => {
            result["resource_id"] = result.get("watch").cloned().unwrap_or(Value::Null);
            rename_value(&mut result, "root_id", "mount_id");
            result
        }
        Shape::Started { .. } => result,
        Shape::Handle { session } => {
            if session {
                rename_value(&mut result, "process_id", "session_id");
            }
            result
        }
        Shape::Kill { session } => {
            let killed = result.get("cancelled").cloned().unwrap_or(json!(false));
            result["killed"] = killed;
            result["status"] = json!(if session { "closed" } else { "killed" });
            if session {
                rename_value(&mut result, "process_id", "session_id");
            }
            result
        }
        Shape::Status { session } => state_of(result, session),
        Shape::List { sessions } => {
            let all = result
                .get("processes")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let list: Vec<Value> = all
                .into_iter()
                .filter(|p| p.get("terminal").and_then(Value::as_bool).unwrap_or(false) == sessions)
                .map(|p| state_of(p, sessions))
                .collect();
            match sessions {
                true => json!({"sessions": list}),
                false => json!({"processes": list}),
            }
        }
        Shape::Collect { session } => {
            let collected = collected.unwrap_or_default();
            let running = result.get("state").and_then(Value::as_str) == Some("running");
            let status = match (running, result.get("ended_by").and_then(Value::as_str)) {
                (true, _) => "running",
                (false, Some("exit") | None) => "exited",
                (false, Some(_)) => "killed",
            };
            let mut out = result;
            out["status"] = json!(status);
            out["first_seq"] = json!(collected.first_seq);
            out["next_seq"] = json!(collected.next_seq);
            let truncated = collected.dropped > 0
                || out.get("output_truncated").and_then(Value::as_bool) == Some(true);
            out["output_truncated"] = json!(truncated);
            if session {
                rename_value(&mut out, "process_id", "session_id");
                out["output"] = json!(String::from_utf8_lossy(&collected.stdout));
                out["status"] = json!(if running { "open" } else { "closed" });
            } else {
                text_or_base64(&mut out, "stdout", &collected.stdout);
                text_or_base64(&mut out, "stderr", &collected.stderr);
            }
            out
        }
    }
}

/// A process's state as 0.92 names it (`ProcessState` /
/// `ShellSessionState`), the relay's fields kept beside.
fn state_of(mut p: Value, session: bool) -> Value {
    let running = p.get("state").and_then(Value::as_str) == Some("running");
    let status = match (session, running, p.get("ended_by").and_then(Value::as_str)) {
        (true, true, _) => "open",
        (true, false, _) => "closed",
        (false, true, _) => "running",
        (false, false, Some("exit") | None) => "exited",
        (false, false, Some(_)) => "killed",
    };
    let persist = p.get("persist").and_then(Value::as_bool).unwrap_or(false);
    p["status"] = json!(status);
    p["target_id"] = json!(TARGET_ID);
    p["persistence"] = json!(if persist { "provider" } else { "connection" });
    if let Some(Value::Array(argv)) = p.get("command") {
        let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        let line = match words.as_slice() {
            ["sh", "-c", line] => (*line).to_string(),
            words => words.join(" "),
        };
        p["argv"] = p["command"].take();
        p["command"] = json!(line);
    }
    if session {
        rename_value(&mut p, "process_id", "session_id");
        p["resource_id"] = p["session_id"].clone();
    }
    p
}

fn text_or_base64(out: &mut Value, field: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => out[field] = json!(text),
        Err(_) => {
            out[field] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            out[format!("{field}_encoding")] = json!("base64");
        }
    }
}

/// A relay error as this profile's JSON-RPC error: a process or session
/// of an earlier run of the gateway is lost, not merely not found.
fn error_message(rpc_id: Value, call: &Call, error: &ErrorBody) -> Value {
    let shape = call.shape;
    let session = matches!(
        shape,
        Shape::Started { session: true }
            | Shape::Collect { session: true }
            | Shape::Status { session: true }
            | Shape::Handle { session: true }
            | Shape::Kill { session: true }
    );
    let name = codes::error_name(error.code, error.details.as_ref(), session);
    let mut data = Map::new();
    data.insert("recoverable".into(), json!(error.recoverable));
    if error.code != ErrorCode::Unrecognized && name != error.code.as_str() {
        data.insert("relay_code".into(), json!(error.code.as_str()));
    }
    if let Some(details) = &error.details {
        data.insert("details".into(), details.clone());
    }
    if let Some(mount) = &call.mount_id {
        data.insert("mount_id".into(), mount.clone());
    }
    rpc_error(rpc_id, name, &error.message, data)
}

fn rpc_request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn rpc_notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

fn rpc_result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn rpc_error(id: Value, name: &str, message: &str, mut data: Map<String, Value>) -> Value {
    data.insert("name".into(), json!(name));
    data.entry("recoverable")
        .or_insert(json!(name != "unknown_method"));
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": codes::number(name), "message": message, "data": data}})
}

/// A JSON-RPC id as a map key: strings and numbers never collide.
fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::String(s) => Some(format!("s:{s}")),
        Value::Number(n) => Some(format!("n:{n}")),
        _ => None,
    }
}

fn relay_context(context: &Value) -> Option<RequestContext> {
    let field = |name: &str| {
        context
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let context = RequestContext {
        session_id: field("session_id"),
        run_id: field("run_id"),
        tool_call_id: field("tool_call_id"),
        workspace_id: field("workspace_id"),
    };
    (context != RequestContext::default()).then_some(context)
}

fn rename(p: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(value) = p.remove(from) {
        p.entry(to).or_insert(value);
    }
}

fn rename_value(v: &mut Value, from: &str, to: &str) {
    if let Value::Object(map) = v {
        rename(map, from, to);
    }
}

fn signal_name(n: u64) -> Option<&'static str> {
    Some(match n {
        1 => "HUP",
        2 => "INT",
        3 => "QUIT",
        9 => "KILL",
        10 => "USR1",
        12 => "USR2",
        15 => "TERM",
        18 => "CONT",
        19 => "STOP",
        28 => "WINCH",
        _ => return None,
    })
}

fn frame_records(frame: &Frame, max_frame: usize) -> Vec<Vec<u8>> {
    // Frames made here from bounded input; one the session's bound refuses
    // is sent whole and refused there (audited) rather than dropped here.
    record::encode_frame_records(frame, max_frame).unwrap_or_else(|_| {
        let mut one = vec![record::KIND_FRAME];
        frame::encode_frame_json(frame, &mut one);
        vec![one]
    })
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

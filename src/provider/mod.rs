//! The provider API: what a capability provider (files, shell, tools and
//! scripts, resources) implements, and what it is handed for each call.
//!
//! A provider declares its methods ([`Method`]): name, capability,
//! whether it leaves a start entry before it acts (every method that
//! changes or runs anything does), which chunk channel it
//! takes input on, and how its params become the policy's [`Target`]. The
//! daemon registers providers in [`Providers`] where it is assembled
//! (`cli/serve.rs`); the server admits, audits and dispatches through that
//! registry and names no provider.
//!
//! Architecture invariant: this module and the providers below it never
//! import `crate::server`. What a provider needs of the daemon reaches it
//! through the [`Call`] (the policy that decided, the session's streams and
//! resources, [`Requests`] for a script's own requests) or its own
//! constructor.

mod nested;
pub mod output;
pub mod params;
mod resources;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use portcullis_policy::{Capability, Denial, Policy, Query, Target, Terms};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Frame, Request, RequestId, Stream};
use portcullis_wire::record::{Channel, ChunkRecord};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use nested::{
    Answer, Asked, Durable, DurableSeq, Nested, RUNTIME_ANSWER_TIMEOUT, Requests, ToRuntime,
    own_request,
};
pub use resources::{EventSink, MAX_PER_SESSION, MAX_RUNTIME_TOOLS, SessionResources};

/// One method as its provider declares it.
pub struct Method {
    pub name: &'static str,
    /// The capability the policy files it under (a test checks that
    /// `portcullis_policy::capability_of` agrees).
    pub capability: Capability,
    /// Leaves a start entry, durable before the provider acts, as well as
    /// its completing entry: every method that changes or runs anything
    /// (and long reads, so they show while they run). The others — reads —
    /// leave their one entry once answered.
    pub start_entry: bool,
    /// What the policy decides on: the params that matter, as a
    /// [`Target`]; a param of the wrong type is `invalid_request` here.
    pub target: fn(&Request) -> Result<Target, ErrorBody>,
    /// The chunk channel this request takes binary input on, if any.
    pub input: fn(&Request) -> Option<Channel>,
}

impl Method {
    /// A method whose params name nothing to check and that takes no input.
    pub const fn plain(name: &'static str, capability: Capability) -> Self {
        Self {
            name,
            capability,
            start_entry: false,
            target: no_target,
            input: no_input,
        }
    }
}

fn no_target(_: &Request) -> Result<Target, ErrorBody> {
    Ok(Target::None)
}

/// [`Method::input`] for methods that take none.
pub fn no_input(_: &Request) -> Option<Channel> {
    None
}

/// What a session sends, in order, through its bounded outbox. A full
/// outbox makes producers wait: that is the back-pressure from a slow peer.
#[derive(Debug)]
pub enum Outbound {
    /// Boxed: every session's outbox holds a block of 32 of these.
    Frame(Box<Frame>),
    Chunk {
        id: RequestId,
        channel: Channel,
        data: Bytes,
    },
    /// A chunk record already encoded (a download's piece, read in place).
    Record(ChunkRecord),
    /// Close the connection after everything queued before it.
    Close { policy: bool, reason: String },
}

pub type Outbox = mpsc::Sender<Outbound>;

/// A request that policy allowed, handed to its provider.
pub struct Call {
    pub principal: String,
    /// Shared with the session's record of what is in flight, which decides
    /// it again when the policy changes.
    pub request: Arc<Request>,
    /// The policy that decided this request.
    pub policy: Arc<Policy>,
    /// What the policy decided the request may use (paths, limits, env).
    pub terms: Terms,
    /// Cancelled by a `cancel` frame, revocation or shutdown.
    pub cancel: CancellationToken,
    pub stream: StreamSink,
    /// The request's binary input (chunks on the channel its method's
    /// `input` named), when it takes any. An empty chunk ends it; `None`
    /// from the receiver means the input was abandoned (cancel, session
    /// end).
    pub input: Option<mpsc::Receiver<Bytes>>,
    /// Bytes in and out, for the audit entry.
    pub usage: Arc<Usage>,
    /// What the session holds (watches); where a call adds a resource.
    pub resources: SessionResources,
    /// Set, before `cancel` fires, when the session itself ends (the
    /// connection closed, a revocation, shutdown): a cancel without it was
    /// asked for. A persistent process outlives the first, not the second.
    pub session_end: Arc<OnceLock<ErrorBody>>,
    /// Set, before `cancel` fires, when a policy change revoked this
    /// request.
    pub revoked: Arc<OnceLock<ErrorBody>>,
    /// Requests of its own (a script's `exec`, `read_file`, `call_tool`),
    /// each taking the session's path as if the peer had sent it, with
    /// this request as parent.
    pub requests: Requests,
    /// The request this one was made by, for a script's own requests.
    pub parent: Option<RequestId>,
    /// A long-running request's start entry, on its way to the audit log.
    pub start_entry: StartEntry,
    /// The session the request came from, as audit entries name it.
    pub origin: Arc<Origin>,
    /// Bytes of JSON a result may take: the gateway's `max_frame` less
    /// room for the response around it (a result goes in parts, §3).
    pub max_result: usize,
}

/// The error of a request the audit log could not record: `provider_error`
/// with `details.audit = "unavailable"`, and `details.ran` saying whether
/// the request acted (its start entry was durable, its outcome could not
/// be written) or not (refused before acting). docs/PROTOCOL.md §5.
pub fn audit_unavailable(ran: bool, why: &str) -> ErrorBody {
    let message = if ran {
        format!("the request ran, but the audit log could not record its outcome ({why})")
    } else {
        format!(
            "the audit log cannot write ({why}), so nothing was run; retry once it writes again"
        )
    };
    ErrorBody::new(ErrorCode::ProviderError, message)
        .with_details(serde_json::json!({"audit": "unavailable", "ran": ran}))
}

/// The error a refusal answers with.
pub fn error_code(denial: Denial) -> ErrorCode {
    match denial {
        Denial::UnknownMethod => ErrorCode::UnknownMethod,
        Denial::CapabilityUnavailable => ErrorCode::CapabilityUnavailable,
        Denial::UnknownTool => ErrorCode::NotFound,
        Denial::Blocked => ErrorCode::PolicyBlocked,
        Denial::InvalidRequest => ErrorCode::InvalidRequest,
        Denial::UnknownPrincipal
        | Denial::PrincipalDisabled
        | Denial::PrincipalExpired
        | Denial::NotGranted
        | Denial::ReadOnly
        | Denial::BadPath
        | Denial::UnknownRoot => ErrorCode::PermissionDenied,
    }
}

/// How a request (or a request to the runtime, or an upload) ended, as
/// its audit entry says it: status, and the error's code name.
pub fn audit_status(error: Option<&ErrorBody>) -> (portcullis_store::Status, Option<String>) {
    use portcullis_store::Status;
    match error {
        None => (Status::Succeeded, None),
        Some(e) if e.code == ErrorCode::Cancelled => {
            (Status::Cancelled, Some(e.code.as_str().into()))
        }
        Some(e) => (Status::Failed, Some(e.code.as_str().into())),
    }
}

/// Room a response's frame takes around its result (type, id, fields).
pub const RESPONSE_ROOM: usize = 1024;

/// The session a call came from, as its audit entries name it; for
/// entries a provider writes beside the request's own (each connection a
/// command makes through the egress proxy).
#[derive(Debug)]
pub struct Origin {
    /// The gateway's session (connection) number.
    pub connection: u64,
    pub peer: Arc<str>,
}

/// A request's start entry until it is durable. Nothing acts on the host
/// before then: the registry waits for it, unless the provider prepares
/// meanwhile ([`Provider::prepares_during_start_entry`]) and waits itself.
/// A clone waits for the same entry (admission keeps one, to name the
/// entry in the request's completing entry).
#[derive(Clone)]
pub struct StartEntry(Option<Arc<PendingStart>>);

struct PendingStart {
    /// Polled in place by whoever waits first; a waiter dropped midway
    /// leaves it for the next.
    entry: tokio::sync::Mutex<Option<DurableSeq>>,
    outcome: OnceLock<Result<u64, ErrorBody>>,
}

impl StartEntry {
    /// No entry to wait for (a read, or one already durable).
    pub fn durable() -> Self {
        Self(None)
    }

    pub fn pending(entry: DurableSeq) -> Self {
        Self(Some(Arc::new(PendingStart {
            entry: tokio::sync::Mutex::new(Some(entry)),
            outcome: OnceLock::new(),
        })))
    }

    /// Waits until the entry is durable (at once after the first time).
    pub async fn wait(&self) -> Result<(), ErrorBody> {
        if self.0.is_none() {
            return Ok(());
        }
        self.outcome().await.map(drop).map_err(|e| ErrorBody {
            message: format!("{}, so nothing was run", e.message),
            ..e
        })
    }

    /// The entry's sequence number once durable; `None` without one.
    pub async fn seq(&self) -> Option<u64> {
        self.outcome().await.ok()
    }

    async fn outcome(&self) -> Result<u64, ErrorBody> {
        let Some(pending) = &self.0 else {
            return Err(ErrorBody::new(ErrorCode::ProviderError, "no start entry"));
        };
        let mut entry = pending.entry.lock().await;
        if let Some(outcome) = pending.outcome.get() {
            return outcome.clone();
        }
        let outcome = match entry.as_mut() {
            Some(durable) => durable.as_mut().await,
            None => Err(ErrorBody::new(
                ErrorCode::ProviderError,
                "the start entry was lost",
            )),
        };
        *entry = None;
        let _ = pending.outcome.set(outcome.clone());
        outcome
    }
}

/// Data a request moved, counted as it moves.
#[derive(Debug, Default)]
pub struct Usage {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

impl Usage {
    pub fn add_in(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn add_out(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// (bytes in, bytes out)
    pub fn totals(&self) -> (u64, u64) {
        (
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
        )
    }
}

/// The operator's pause (`portcullis pause`). `Stop` is the emergency
/// stop, a revocation of everything: sessions closed, requests failed,
/// commands and processes killed (but those whose grant says
/// `survive_revocation`), new sessions refused. `Soft` only refuses new
/// requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pause {
    #[default]
    Off,
    Soft,
    Stop,
}

/// What a session, a refused session and a request in flight are told
/// when the emergency stop ends them.
pub const STOPPED_BY_OPERATOR: &str = "the gateway was stopped by its operator";

/// What a request in flight is told when a change of the policy takes away
/// what allowed it.
pub const REVOKED_BY_POLICY: &str = "the policy no longer allows this request; it was stopped";

impl Pause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Soft => "soft",
            Self::Stop => "stop",
        }
    }
}

/// How a session takes output (stdout, stderr, a terminal's): as the
/// spec's `stream` frames, or as binary chunks when `relay.accepted`
/// asked for them (`"output": "chunks"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputForm {
    #[default]
    Frames,
    Chunks,
}

/// Streams progress of one request before its terminal response.
#[derive(Clone)]
pub struct StreamSink {
    id: RequestId,
    outbox: Outbox,
    usage: Arc<Usage>,
    output: OutputForm,
}

impl StreamSink {
    pub fn new(id: RequestId, outbox: Outbox, usage: Arc<Usage>, output: OutputForm) -> Self {
        Self {
            id,
            outbox,
            usage,
            output,
        }
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// How this request's session takes output.
    pub fn output_form(&self) -> OutputForm {
        self.output
    }

    /// Sends output as a `stream` frame (see [`output`]).
    pub async fn output(&self, frame: output::OutputFrame) -> Result<(), SessionGone> {
        self.usage.add_out(frame.output_len);
        let stream = Stream {
            sequence: Some(frame.sequence),
            encoding: frame.base64.then(|| "base64".to_string()),
            ..self.stream(frame.event, Value::String(frame.data))
        };
        let frame = Outbound::Frame(Box::new(Frame::Stream(stream)));
        self.outbox.send(frame).await.map_err(|_| SessionGone)
    }

    /// Sends a `stream` frame; waits while the peer is slow. Fails only
    /// when the session is gone.
    pub async fn event(&self, event: &str, data: Value) -> Result<(), SessionGone> {
        let frame = Outbound::Frame(Box::new(Frame::Stream(self.stream(event, data))));
        self.outbox.send(frame).await.map_err(|_| SessionGone)
    }

    /// [`event`](Self::event) from a blocking thread (a search).
    pub fn event_blocking(&self, event: &str, data: Value) -> Result<(), SessionGone> {
        let frame = Outbound::Frame(Box::new(Frame::Stream(self.stream(event, data))));
        self.outbox.blocking_send(frame).map_err(|_| SessionGone)
    }

    fn stream(&self, event: &str, data: Value) -> Stream {
        Stream {
            id: self.id.clone(),
            event: event.to_string(),
            data,
            sequence: None,
            encoding: None,
        }
    }

    /// Sends a binary chunk (split to fit records by the writer's caller).
    pub async fn chunk(&self, channel: Channel, data: Bytes) -> Result<(), SessionGone> {
        self.usage.add_out(data.len());
        let id = self.id.clone();
        self.outbox
            .send(Outbound::Chunk { id, channel, data })
            .await
            .map_err(|_| SessionGone)
    }

    /// An empty chunk record for this request with room for `room` data
    /// bytes (fewer if a record cannot carry them), to fill in place and
    /// send with [`record`](Self::record).
    pub fn chunk_record(&self, channel: Channel, room: usize) -> ChunkRecord {
        ChunkRecord::new(&self.id, channel, room)
    }

    /// Sends a chunk made by [`chunk_record`](Self::chunk_record); waits
    /// while the peer is slow.
    pub async fn record(&self, chunk: ChunkRecord) -> Result<(), SessionGone> {
        self.usage.add_out(chunk.data().len());
        self.outbox
            .send(Outbound::Record(chunk))
            .await
            .map_err(|_| SessionGone)
    }
}

/// How often long work (a streamed read, a search) reports how far it got.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The spec's `progress` stream frames of one request, at most one per
/// [`PROGRESS_EVERY`]: work done sooner reports none.
pub struct Progress {
    next: std::time::Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            next: std::time::Instant::now() + PROGRESS_EVERY,
        }
    }
}

impl Progress {
    /// Sends `progress` with `data()` if one is due (from a blocking
    /// thread).
    pub fn tick(
        &mut self,
        sink: &StreamSink,
        data: impl FnOnce() -> Value,
    ) -> Result<(), SessionGone> {
        match self.due() {
            true => sink.event_blocking("progress", data()),
            false => Ok(()),
        }
    }

    /// Whether a `progress` frame is due now; if so, the next is due
    /// [`PROGRESS_EVERY`] later.
    pub fn due(&mut self) -> bool {
        let now = std::time::Instant::now();
        if now < self.next {
            return false;
        }
        self.next = now + PROGRESS_EVERY;
        true
    }
}

#[derive(Debug)]
pub struct SessionGone;

pub type Reply = Pin<Box<dyn Future<Output = Result<Value, ErrorBody>> + Send>>;

pub trait Provider: Send + Sync + 'static {
    /// The methods this provider serves.
    fn methods(&self) -> &'static [Method];
    /// How long a cancelled call may take to clean up (remove a partial
    /// upload, kill a process) and answer before it is dropped. Providers
    /// that watch `Call::cancel` set this; others are dropped at once.
    fn cancel_grace(&self) -> Duration {
        Duration::ZERO
    }
    /// Whether the provider prepares `request` while its start entry is
    /// being written (and waits for [`Call::start_entry`] before it acts):
    /// a command's sandbox is set up meanwhile. Otherwise the registry
    /// waits before calling.
    fn prepares_during_start_entry(&self, _request: &Request) -> bool {
        false
    }
    /// Called once a call is admitted, before it waits for an approval:
    /// what the provider keeps about it until the call ends (dropped
    /// then). `tool.cancel` finds a call still waiting for its approval
    /// this way.
    fn track(&self, _call: &Call) -> Option<Tracked> {
        None
    }
    fn call(&self, call: Call) -> Reply;
    /// A session of `principal` has been accepted with the `accepted`
    /// capabilities: the events the provider must tell it first (the
    /// shell: the processes an earlier run of the gateway lost).
    fn session_accepted(&self, _principal: &str, _accepted: &BTreeSet<String>) -> Vec<Event> {
        Vec::new()
    }
    /// What the provider holds now, for the metrics endpoint.
    fn gauges(&self) -> Vec<Gauge> {
        Vec::new()
    }
}

/// What [`Provider::track`] keeps about a call while it runs.
pub type Tracked = Box<dyn Send>;

/// One gauge of a provider's, in the Prometheus text format's terms.
pub struct Gauge {
    pub name: &'static str,
    pub help: &'static str,
    pub value: f64,
}

/// A method two providers declare.
#[derive(Debug, thiserror::Error)]
#[error("method `{0}` is registered twice")]
pub struct Twice(pub &'static str);

/// The registered providers, by method.
#[derive(Clone, Default)]
pub struct Providers {
    by_method: HashMap<&'static str, (Arc<dyn Provider>, &'static Method)>,
    /// Each provider once, in the order registered.
    all: Vec<Arc<dyn Provider>>,
}

impl Providers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `provider`'s methods; a method registered twice is the
    /// daemon's assembly error, named here.
    pub fn register(&mut self, provider: Arc<dyn Provider>) -> Result<(), Twice> {
        for method in provider.methods() {
            if self.by_method.contains_key(method.name) {
                return Err(Twice(method.name));
            }
            self.by_method
                .insert(method.name, (provider.clone(), method));
        }
        self.all.push(provider);
        Ok(())
    }

    /// [`register`](Self::register), for assembly that cannot go wrong.
    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        if let Err(e) = self.register(provider) {
            panic!("{e}");
        }
        self
    }

    pub fn method(&self, name: &str) -> Option<&'static Method> {
        self.by_method.get(name).map(|(_, method)| *method)
    }

    pub fn serves(&self, method: &str) -> bool {
        self.by_method.contains_key(method)
    }

    /// Every served method, in no particular order.
    pub fn methods(&self) -> impl Iterator<Item = &'static Method> + '_ {
        self.by_method.values().map(|(_, method)| *method)
    }

    /// [`Provider::session_accepted`] of every provider.
    pub fn session_accepted(&self, principal: &str, accepted: &BTreeSet<String>) -> Vec<Event> {
        self.all
            .iter()
            .flat_map(|p| p.session_accepted(principal, accepted))
            .collect()
    }

    /// Every provider's gauges.
    pub fn gauges(&self) -> Vec<Gauge> {
        self.all.iter().flat_map(|p| p.gauges()).collect()
    }

    /// What policy decides on for `request`. A method no provider serves
    /// has no target: policy calls it unknown, whatever its params.
    pub fn query_for(&self, request: &Request) -> Result<Query, ErrorBody> {
        Self::query(self.method(&request.method), request)
    }

    /// [`query_for`](Self::query_for) with the method already looked up.
    pub fn query(method: Option<&Method>, request: &Request) -> Result<Query, ErrorBody> {
        let target = match method {
            Some(method) => (method.target)(request)?,
            None => Target::None,
        };
        Ok(Query {
            method: request.method.clone(),
            target,
        })
    }

    /// Whether the policy still allows `request` for `principal` now: how a
    /// policy change is applied to what already runs (requests in flight,
    /// resources, persistent processes).
    pub fn still_allowed(
        &self,
        policy: &Policy,
        principal: &str,
        request: &Request,
        now: jiff::Timestamp,
    ) -> bool {
        self.query_for(request).is_ok_and(|query| {
            let decision = portcullis_policy::decide(policy, principal, &query, now);
            // One that needs approval was approved before it ran.
            !matches!(decision.verdict, portcullis_policy::Verdict::Deny(_))
        })
    }

    /// [`Provider::track`] of the call's provider.
    pub fn track(&self, call: &Call) -> Option<Tracked> {
        let (provider, _) = self.by_method.get(call.request.method.as_str())?;
        provider.track(call)
    }

    /// Runs the call until it answers or is cancelled. Dropping the
    /// provider's future on cancel stops its work; providers that own
    /// processes also watch `call.cancel` to kill them.
    pub async fn run(&self, call: Call) -> Result<Value, ErrorBody> {
        let Some((provider, _)) = self.by_method.get(call.request.method.as_str()).cloned() else {
            return Err(ErrorBody::new(
                ErrorCode::UnknownMethod,
                format!("`{}` is not served", call.request.method),
            ));
        };
        if !provider.prepares_during_start_entry(&call.request) {
            call.start_entry.wait().await?;
        }
        let cancel = call.cancel.clone();
        let grace = provider.cancel_grace();
        let mut reply = provider.call(call);
        let cancelled = || ErrorBody::new(ErrorCode::Cancelled, "the request was cancelled");
        tokio::select! {
            reply = &mut reply => reply,
            // A provider that finishes within the grace says what happened
            // (it may have completed just before the cancel arrived).
            () = cancel.cancelled() => match tokio::time::timeout(grace, reply).await {
                Ok(reply) => reply,
                Err(_) => Err(cancelled()),
            },
        }
    }
}

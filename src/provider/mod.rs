//! Execute and respond: the step after a request was decoded and allowed.
//! Capability providers (files, shell, tools, scripts) implement
//! [`Provider`] and are registered in the [`Dispatcher`]; a method no
//! provider serves answers `unknown_method`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use portcullis_policy::Terms;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::server::resources::SessionResources;
use portcullis_wire::frame::{ErrorBody, ErrorCode, Frame, Request, RequestId, Stream};
use portcullis_wire::record::{Channel, ChunkRecord};

/// What a session sends, in order, through its bounded outbox. A full
/// outbox makes producers wait: that is the back-pressure from a slow peer.
#[derive(Debug)]
pub enum Outbound {
    Frame(Frame),
    Chunk {
        id: RequestId,
        channel: Channel,
        data: Bytes,
    },
    /// A chunk record already encoded (a download's piece, read in place).
    Record(ChunkRecord),
    /// Close the connection after everything queued before it.
    Close {
        policy: bool,
        reason: String,
    },
}

pub type Outbox = mpsc::Sender<Outbound>;

/// A request that policy allowed, handed to its provider.
pub struct Call {
    pub principal: String,
    pub request: Request,
    /// What the policy decided the request may use (paths, limits, env).
    pub terms: Terms,
    /// Cancelled by a `cancel` frame, revocation or shutdown.
    pub cancel: CancellationToken,
    pub stream: StreamSink,
    /// The request's binary input (chunks on the channel its provider's
    /// `input_channel` named), when it takes any. An empty chunk ends it;
    /// `None` from the receiver means the input was abandoned (cancel,
    /// session end).
    pub input: Option<mpsc::Receiver<Bytes>>,
    /// Bytes in and out, for the audit entry.
    pub usage: Arc<Usage>,
    /// What the session holds (watches); where a call adds a resource.
    pub resources: SessionResources,
    /// Set, before `cancel` fires, when the session itself ends (the
    /// connection closed, a revocation, shutdown): a cancel without it was
    /// asked for. A persistent process outlives the first, not the second.
    pub session_end: Arc<std::sync::OnceLock<ErrorBody>>,
    /// Set, before `cancel` fires, when a policy change revoked this
    /// request.
    pub revoked: Arc<std::sync::OnceLock<ErrorBody>>,
    /// The daemon: scripts decide, audit and dispatch the requests they
    /// make through it, on the same path as the session's.
    pub gateway: Arc<crate::server::Gateway>,
    /// The request's audit entry as the session began it (connection,
    /// peer, principal, context); nested calls start theirs from it.
    pub record: portcullis_store::Record,
    /// A long-running request's start entry, on its way to the audit log.
    pub start_entry: StartEntry,
}

/// A request's start entry until it is durable. Nothing acts on the host
/// before then: the dispatcher waits for it, unless the provider prepares
/// meanwhile ([`Provider::prepares_during_start_entry`]) and waits itself.
pub struct StartEntry(Option<portcullis_store::Submitted>);

impl StartEntry {
    /// No entry to wait for (a short request, or one already durable).
    pub fn durable() -> Self {
        Self(None)
    }

    pub fn pending(submitted: portcullis_store::Submitted) -> Self {
        Self(Some(submitted))
    }

    /// Waits until the entry is durable (at once the second time).
    pub async fn wait(&mut self) -> Result<(), ErrorBody> {
        let Some(submitted) = self.0.take() else {
            return Ok(());
        };
        submitted.durable().await.map(drop).map_err(|e| {
            tracing::error!("audit: {e}");
            ErrorBody::new(
                ErrorCode::ProviderError,
                "the audit log is unavailable, so nothing was run",
            )
        })
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

/// Streams progress of one request before its terminal response.
#[derive(Clone)]
pub struct StreamSink {
    id: RequestId,
    outbox: Outbox,
    usage: Arc<Usage>,
}

impl StreamSink {
    pub fn new(id: RequestId, outbox: Outbox, usage: Arc<Usage>) -> Self {
        Self { id, outbox, usage }
    }

    pub fn id(&self) -> &RequestId {
        &self.id
    }

    /// Sends a `stream` frame; waits while the peer is slow. Fails only
    /// when the session is gone.
    pub async fn event(&self, event: &str, data: Value) -> Result<(), SessionGone> {
        let frame = self.stream_frame(event, data);
        self.outbox.send(frame).await.map_err(|_| SessionGone)
    }

    /// [`event`](Self::event) from a blocking thread (a search).
    pub fn event_blocking(&self, event: &str, data: Value) -> Result<(), SessionGone> {
        let frame = self.stream_frame(event, data);
        self.outbox.blocking_send(frame).map_err(|_| SessionGone)
    }

    fn stream_frame(&self, event: &str, data: Value) -> Outbound {
        Outbound::Frame(Frame::Stream(Stream {
            id: self.id.clone(),
            event: event.to_string(),
            data,
        }))
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
    /// send with [`record_blocking`](Self::record_blocking).
    pub fn chunk_record(&self, channel: Channel, room: usize) -> ChunkRecord {
        ChunkRecord::new(&self.id, channel, room)
    }

    /// Sends a chunk made by [`chunk_record`](Self::chunk_record) from a
    /// blocking thread.
    pub fn record_blocking(&self, chunk: ChunkRecord) -> Result<(), SessionGone> {
        self.usage.add_out(chunk.data().len());
        self.outbox
            .blocking_send(Outbound::Record(chunk))
            .map_err(|_| SessionGone)
    }
}

#[derive(Debug)]
pub struct SessionGone;

pub type Reply = Pin<Box<dyn Future<Output = Result<Value, ErrorBody>> + Send>>;

pub trait Provider: Send + Sync + 'static {
    /// The methods this provider serves.
    fn methods(&self) -> &'static [&'static str];
    /// The chunk channel on which `request` takes binary input, if it does.
    fn input_channel(&self, _request: &Request) -> Option<Channel> {
        None
    }
    /// How long a cancelled call may take to clean up (remove a partial
    /// upload, kill a process) and answer before it is dropped. Providers
    /// that watch `Call::cancel` set this; others are dropped at once.
    fn cancel_grace(&self) -> Duration {
        Duration::ZERO
    }
    /// Whether the provider prepares `request` while its start entry is
    /// being written (and waits for [`Call::start_entry`] before it acts):
    /// a command's sandbox is set up meanwhile. Otherwise the dispatcher
    /// waits before calling.
    fn prepares_during_start_entry(&self, _request: &Request) -> bool {
        false
    }
    fn call(&self, call: Call) -> Reply;
}

#[derive(Clone, Default)]
pub struct Dispatcher {
    providers: HashMap<&'static str, Arc<dyn Provider>>,
}

impl Dispatcher {
    pub fn new() -> Self {
        let mut dispatcher = Self::default();
        dispatcher.register(Arc::new(crate::server::resources::Resources));
        dispatcher.register(Arc::new(crate::files::Files));
        dispatcher.register(Arc::new(crate::shell::Shell));
        dispatcher.register(Arc::new(crate::tools::Tools));
        dispatcher
    }

    pub fn register(&mut self, provider: Arc<dyn Provider>) {
        for method in provider.methods() {
            self.providers.insert(method, provider.clone());
        }
    }

    pub fn serves(&self, method: &str) -> bool {
        self.providers.contains_key(method)
    }

    pub fn input_channel(&self, request: &Request) -> Option<Channel> {
        self.providers
            .get(request.method.as_str())?
            .input_channel(request)
    }

    /// Runs the call until it answers or is cancelled. Dropping the
    /// provider's future on cancel stops its work; providers that own
    /// processes also watch `call.cancel` to kill them.
    pub async fn run(&self, mut call: Call) -> Result<Value, ErrorBody> {
        let Some(provider) = self.providers.get(call.request.method.as_str()).cloned() else {
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

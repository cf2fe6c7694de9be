//! Execute and respond: the step after a request was decoded and allowed.
//! Capability providers (files, shell, tools, scripts) implement
//! [`Provider`] and are registered in the [`Dispatcher`]; a method no
//! provider serves answers `unknown_method`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use portcullis_policy::Terms;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::frame::{ErrorBody, ErrorCode, Frame, Request, RequestId, Stream};
use crate::record::Channel;

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
}

/// Streams progress of one request before its terminal response.
#[derive(Clone)]
pub struct StreamSink {
    id: RequestId,
    outbox: Outbox,
}

impl StreamSink {
    pub fn new(id: RequestId, outbox: Outbox) -> Self {
        Self { id, outbox }
    }

    /// Sends a `stream` frame; waits while the peer is slow. Fails only
    /// when the session is gone.
    pub async fn event(&self, event: &str, data: Value) -> Result<(), SessionGone> {
        let frame = Frame::Stream(Stream {
            id: self.id.clone(),
            event: event.to_string(),
            data,
        });
        self.outbox
            .send(Outbound::Frame(frame))
            .await
            .map_err(|_| SessionGone)
    }

    /// Sends a binary chunk (split to fit records by the writer's caller).
    pub async fn chunk(&self, channel: Channel, data: Bytes) -> Result<(), SessionGone> {
        let id = self.id.clone();
        self.outbox
            .send(Outbound::Chunk { id, channel, data })
            .await
            .map_err(|_| SessionGone)
    }
}

#[derive(Debug)]
pub struct SessionGone;

pub type Reply = Pin<Box<dyn Future<Output = Result<Value, ErrorBody>> + Send>>;

pub trait Provider: Send + Sync + 'static {
    /// The methods this provider serves.
    fn methods(&self) -> &'static [&'static str];
    fn call(&self, call: Call) -> Reply;
}

#[derive(Clone, Default)]
pub struct Dispatcher {
    providers: HashMap<&'static str, Arc<dyn Provider>>,
}

impl Dispatcher {
    pub fn new() -> Self {
        let mut dispatcher = Self::default();
        dispatcher.register(Arc::new(Resources));
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

    /// Runs the call until it answers or is cancelled. Dropping the
    /// provider's future on cancel stops its work; providers that own
    /// processes also watch `call.cancel` to kill them.
    pub async fn run(&self, call: Call) -> Result<Value, ErrorBody> {
        let Some(provider) = self.providers.get(call.request.method.as_str()).cloned() else {
            return Err(ErrorBody::new(
                ErrorCode::UnknownMethod,
                format!("`{}` is not served", call.request.method),
            ));
        };
        let cancel = call.cancel.clone();
        tokio::select! {
            reply = provider.call(call) => reply,
            () = cancel.cancelled() => Err(ErrorBody::new(ErrorCode::Cancelled, "the request was cancelled")),
        }
    }
}

/// `resource.*`: the resources a session holds. File watches and persistent
/// processes become resources when their providers land; until then a
/// session holds none, and `resource.list` says so.
struct Resources;

impl Provider for Resources {
    fn methods(&self) -> &'static [&'static str] {
        &["resource.list"]
    }

    fn call(&self, _call: Call) -> Reply {
        Box::pin(async { Ok(json!({ "resources": [] })) })
    }
}

//! A running call's own requests (a script's `exec`, `read_file`,
//! `call_tool`). The provider hands each to its session, which takes it
//! through the same admission, audit and execution as a request from the
//! peer — pause, drain, the in-flight cap, expiry, accepted capabilities,
//! the policy and approval — with the call's request as parent, and
//! answers here instead of on the wire.
//!
//! A call may also ask the *runtime* (the spec's provider → runtime
//! requests: `artifact.reserve`, `artifact.complete`, `artifact.abort`):
//! [`Requests::ask_runtime`] hands the session a [`ToRuntime`], which it
//! sends as a `request` frame with an id of its own (`gw-…`), audits when
//! answered, and routes the runtime's `response` back here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use portcullis_wire::frame::{ErrorBody, ErrorCode, Request, RequestId};
use serde_json::{Map, Value};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Resolves once an audit entry is durable; an error says why it is not.
pub type Durable = Pin<Box<dyn Future<Output = Result<(), ErrorBody>> + Send>>;

/// [`Durable`], resolving to the entry's sequence number.
pub type DurableSeq = Pin<Box<dyn Future<Output = Result<u64, ErrorBody>> + Send>>;

/// A request on its way to the session, with where its answer goes.
pub struct Nested {
    pub parent: RequestId,
    pub request: Request,
    /// Cancels the request (the caller's deadline or its own cancel).
    pub cancel: CancellationToken,
    pub answer: oneshot::Sender<Answer>,
}

/// A nested request's outcome, and its completing entry on its way to
/// the log. The caller waits for `entry` before anything it says next
/// leaves the gateway, so a run of nested requests shares one flush.
pub struct Answer {
    pub result: Result<Value, ErrorBody>,
    pub entry: Option<Durable>,
}

/// Request number `n` that the call `of` makes of its own: id
/// `<its id>.<n>`, its context. Fails when that id is too long.
pub fn own_request(
    of: &Request,
    n: u64,
    method: &str,
    params: Map<String, Value>,
) -> Result<Request, portcullis_wire::frame::FrameError> {
    Ok(Request {
        id: RequestId::new(format!("{}.{n}", of.id))?,
        method: method.to_string(),
        params,
        context: of.context.clone(),
    })
}

/// A request for the runtime, on its way to the session.
pub struct ToRuntime {
    /// `gw-<n>`: unique in this session, and never a peer's id (the
    /// runtime answers it; the peer's own ids name requests *it* sent).
    pub id: RequestId,
    /// The request it is made for (its audit entry names it).
    pub parent: RequestId,
    pub method: &'static str,
    pub params: Map<String, Value>,
    pub answer: oneshot::Sender<Result<Value, ErrorBody>>,
}

/// What a call hands its session.
pub enum Asked {
    /// A request of its own, through admission.
    Session(Box<Nested>),
    /// A request for the runtime.
    Runtime(Box<ToRuntime>),
    /// The caller stopped waiting for request `id` of the runtime (it was
    /// cancelled or timed out): the session sends `cancel` and forgets it.
    RuntimeCancel { id: RequestId, why: ErrorBody },
}

/// How long the runtime has to answer a request of the gateway's.
pub const RUNTIME_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a call sends its own requests: its session. The session takes
/// them from the queue its answers already use (a channel each would cost
/// every idle session its first block); the queue needs no bound of its
/// own, since each caller waits for its answer before it asks again, and
/// the calls in flight are bounded.
#[derive(Clone)]
pub struct Requests {
    session: Arc<dyn Fn(Asked) -> bool + Send + Sync>,
    /// Numbers the requests sent to the runtime.
    next_runtime_id: Arc<AtomicU64>,
}

impl Requests {
    /// `deliver` hands a request to the session; false once it has ended.
    pub fn new(deliver: impl Fn(Asked) -> bool + Send + Sync + 'static) -> Self {
        Self {
            session: Arc::new(deliver),
            next_runtime_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Requests with nowhere to go (a call outside any session): every
    /// one answers `relay_disconnected`.
    pub fn none() -> Self {
        Self::new(|_| false)
    }

    /// Hands `request` to the session and waits for its answer.
    pub async fn send(
        &self,
        parent: &RequestId,
        request: Request,
        cancel: CancellationToken,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let nested = Box::new(Nested {
            parent: parent.clone(),
            request,
            cancel,
            answer,
        });
        let gone = || Answer {
            result: Err(ErrorBody::new(
                ErrorCode::RelayDisconnected,
                "the session ended before the request was answered",
            )),
            entry: None,
        };
        if !(self.session)(Asked::Session(nested)) {
            return gone();
        }
        answered.await.unwrap_or_else(|_| gone())
    }

    /// Sends `method` to the runtime for the call `parent` and waits for
    /// its answer: at most [`RUNTIME_ANSWER_TIMEOUT`], and no longer than
    /// `cancel` allows (either sends the runtime a `cancel`).
    pub async fn ask_runtime(
        &self,
        parent: &RequestId,
        method: &'static str,
        params: Map<String, Value>,
        cancel: &CancellationToken,
    ) -> Result<Value, ErrorBody> {
        let n = self.next_runtime_id.fetch_add(1, Ordering::Relaxed);
        let id = RequestId::new(format!("gw-{n}"))
            .map_err(|e| ErrorBody::new(ErrorCode::ProviderError, e.to_string()))?;
        let (answer, answered) = oneshot::channel();
        let asked = Box::new(ToRuntime {
            id: id.clone(),
            parent: parent.clone(),
            method,
            params,
            answer,
        });
        let gone = || {
            ErrorBody::new(
                ErrorCode::RelayDisconnected,
                "the session ended before the runtime answered",
            )
        };
        if !(self.session)(Asked::Runtime(asked)) {
            return Err(gone());
        }
        let why = tokio::select! {
            answer = answered => return answer.unwrap_or_else(|_| Err(gone())),
            () = cancel.cancelled() => ErrorBody::new(ErrorCode::Cancelled, format!("{method} was cancelled")),
            () = tokio::time::sleep(RUNTIME_ANSWER_TIMEOUT) => ErrorBody::new(
                ErrorCode::Timeout,
                format!("the runtime did not answer {method} within {} s", RUNTIME_ANSWER_TIMEOUT.as_secs()),
            ),
        };
        (self.session)(Asked::RuntimeCancel {
            id,
            why: why.clone(),
        });
        Err(why)
    }
}

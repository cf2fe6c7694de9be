//! A running call's own requests (a script's `exec`, `read_file`,
//! `call_tool`). The provider hands each to its session, which takes it
//! through the same admission, audit and execution as a request from the
//! peer — pause, drain, the in-flight cap, expiry, accepted capabilities,
//! the policy and approval — with the call's request as parent, and
//! answers here instead of on the wire.

use std::future::Future;
use std::pin::Pin;

use portcullis_wire::frame::{ErrorBody, ErrorCode, Request, RequestId};
use serde_json::Value;
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

/// Where a call sends its own requests: its session. The session takes
/// them from the queue its answers already use (a channel each would cost
/// every idle session its first block); the queue needs no bound of its
/// own, since each caller waits for its answer before it asks again, and
/// the calls in flight are bounded.
#[derive(Clone)]
pub struct Requests {
    session: Arc<dyn Fn(Box<Nested>) -> bool + Send + Sync>,
}

impl Requests {
    /// `deliver` hands a request to the session; false once it has ended.
    pub fn new(deliver: impl Fn(Box<Nested>) -> bool + Send + Sync + 'static) -> Self {
        Self {
            session: Arc::new(deliver),
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
        if !(self.session)(nested) {
            return gone();
        }
        answered.await.unwrap_or_else(|_| gone())
    }
}

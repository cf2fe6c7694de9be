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
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Resolves once an audit entry is durable; an error says why it is not.
pub type Durable = Pin<Box<dyn Future<Output = Result<(), ErrorBody>> + Send>>;

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

/// Where a call sends its own requests: its session. (Boxed in the
/// channel: tokio allocates a channel's first block of 32 slots up front,
/// and every session has one of these, mostly idle.)
#[derive(Clone)]
pub struct Requests {
    session: mpsc::Sender<Box<Nested>>,
}

impl Requests {
    pub fn new(session: mpsc::Sender<Box<Nested>>) -> Self {
        Self { session }
    }

    /// Requests with nowhere to go (a call outside any session): every
    /// one answers `relay_disconnected`.
    pub fn none() -> Self {
        let (session, _) = mpsc::channel(1);
        Self { session }
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
        if self.session.send(nested).await.is_err() {
            return gone();
        }
        answered.await.unwrap_or_else(|_| gone())
    }
}

//! Requests the gateway sends to the runtime (the spec's provider →
//! runtime direction: `artifact.reserve`, `artifact.complete`,
//! `artifact.abort`), made by a running call through
//! [`crate::provider::Requests::ask_runtime`].
//!
//! Each is sent only if the runtime accepted the capability it belongs
//! to, at most [`MAX_TO_RUNTIME`] at once per session; its entry
//! (`to_runtime`, naming the call it was made for) is durable before its
//! answer reaches the call. A response whose id names none of them is
//! ignored (it may answer one already given up on); the session's end
//! answers the rest `relay_disconnected`.

use std::collections::HashMap;

use portcullis_store::{Decision as AuditDecision, Kind, Record as AuditRecord};
use portcullis_wire::frame::{Cancel, ErrorBody, ErrorCode, Frame, Request, RequestId, Response};
use serde_json::Value;
use tokio::sync::oneshot;
use tracing::{debug, error};

use super::Session;
use crate::provider::ToRuntime;
use crate::server::entry::code_name;

/// Requests one session may have awaiting the runtime's answer.
pub(super) const MAX_TO_RUNTIME: usize = 16;

/// A request sent to the runtime, until it is answered.
pub(super) struct Awaiting {
    answer: oneshot::Sender<Result<Value, ErrorBody>>,
    record: AuditRecord,
}

pub(super) type AwaitingRuntime = HashMap<RequestId, Awaiting>;

/// The capability of the runtime's a method of the gateway's asks for.
fn capability_of(method: &str) -> &'static str {
    match method.split_once('.').map(|(family, _)| family) {
        Some("artifact") => "artifacts",
        _ => "tools",
    }
}

impl Session {
    /// Sends `asked` to the runtime, or answers why not.
    pub(super) async fn send_to_runtime(&mut self, asked: ToRuntime) {
        let ToRuntime {
            id,
            parent,
            method,
            params,
            answer,
        } = asked;
        let capability = capability_of(method);
        let refusal = if !self
            .accepted
            .as_ref()
            .is_some_and(|accepted| accepted.contains(capability))
        {
            Some(ErrorBody::new(
                ErrorCode::CapabilityUnavailable,
                format!(
                    "the runtime did not accept `{capability}` in relay.accepted, so {method} cannot be asked of it"
                ),
            ))
        } else if self.awaiting_runtime.len() >= MAX_TO_RUNTIME {
            Some(ErrorBody::new(
                ErrorCode::ProviderError,
                format!(
                    "{MAX_TO_RUNTIME} requests already await the runtime's answer in this session"
                ),
            ))
        } else {
            None
        };
        let request = Request {
            id: id.clone(),
            method: method.to_string(),
            params,
            context: None,
        };
        let mut record = self.audit_record(&request);
        record.kind = Kind::ToRuntime;
        record.parent_request_id = Some(parent.to_string());
        record.capability = Some(capability.to_string());
        if let Some(refusal) = refusal {
            record.decision = Some(AuditDecision::Blocked);
            record.detail = Some(refusal.message.clone());
            self.record_refusal(record, refusal.code).await;
            let _ = answer.send(Err(refusal));
            return;
        }
        record.decision = Some(AuditDecision::Allowed);
        self.awaiting_runtime
            .insert(id, Awaiting { answer, record });
        self.send(Frame::Request(request)).await;
    }

    /// The runtime's answer to a request of the gateway's.
    pub(super) fn runtime_answered(&mut self, response: Response) {
        let Some(awaiting) = self.awaiting_runtime.remove(&response.id) else {
            debug!(session = self.info.id, id = %response.id, "a response to no request awaiting one");
            return;
        };
        let outcome = match (response.result, response.error) {
            (_, Some(error)) => Err(error),
            (Some(result), None) => Ok(result),
            (None, None) => Ok(Value::Null),
        };
        self.finish_runtime(awaiting, outcome);
    }

    /// The caller gave up on request `id` of the runtime: the runtime is
    /// told, and the entry says why.
    pub(super) async fn runtime_cancelled(&mut self, id: RequestId, why: ErrorBody) {
        let Some(awaiting) = self.awaiting_runtime.remove(&id) else {
            return;
        };
        let reason = Some(code_name(why.code));
        self.send(Frame::Cancel(Cancel { id, reason })).await;
        self.finish_runtime(awaiting, Err(why));
    }

    /// Every request still awaiting the runtime, as the session ends.
    pub(super) fn abandon_runtime_requests(&mut self) {
        for (_, awaiting) in std::mem::take(&mut self.awaiting_runtime) {
            let why = ErrorBody::new(
                ErrorCode::RelayDisconnected,
                "the session ended before the runtime answered",
            );
            self.finish_runtime(awaiting, Err(why));
        }
    }

    /// Audits the outcome, and answers the caller once that is durable.
    fn finish_runtime(&self, awaiting: Awaiting, outcome: Result<Value, ErrorBody>) {
        let Awaiting { answer, mut record } = awaiting;
        record.completed_at = Some(jiff::Timestamp::now().to_string());
        let (status, code) = crate::provider::audit_status(outcome.as_ref().err());
        (record.status, record.error_code) = (Some(status), code);
        if let Err(e) = &outcome {
            record.detail = Some(e.message.chars().take(300).collect());
        }
        let submitted = self.gateway.audit.submit(record);
        let session = self.info.id;
        tokio::spawn(async move {
            let durable = match submitted {
                Ok(submitted) => submitted.durable().await.map(drop),
                Err(e) => Err(e),
            };
            let outcome = match durable {
                Ok(()) => outcome,
                Err(e) => {
                    error!(session, "audit: {e}");
                    Err(ErrorBody::new(
                        ErrorCode::ProviderError,
                        "the audit log could not record the runtime's answer",
                    ))
                }
            };
            let _ = answer.send(outcome);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_methods_ask_for_the_artifacts_capability() {
        assert_eq!(capability_of("artifact.reserve"), "artifacts");
        assert_eq!(capability_of("artifact.abort"), "artifacts");
        assert_eq!(capability_of("tool.call"), "tools");
    }
}

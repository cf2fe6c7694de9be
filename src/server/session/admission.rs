//! The one path every request takes, from the peer or from a running
//! call (a script's `exec`, `read_file`, `call_tool`):
//!
//! admit (relay.accepted, drain, the in-flight cap, pause, params, the
//! policy's decision, a served method, an accepted capability) → audit a
//! refusal, or a long-running method's start entry → approval, if the
//! policy asks for one → execute (the method's provider) → audit the
//! outcome → answer.
//!
//! Only where the answer goes differs ([`AnswerTo`]): a peer's request is
//! answered on the wire once its entry is durable; a nested request is
//! answered to its caller with its entry on the way, and the caller waits
//! for that before anything it says next leaves the gateway.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use portcullis_policy::{ApprovalPolicy, Capability, Denial, Policy, Terms, Verdict, decide};
use portcullis_store::{
    Decision as AuditDecision, Kind, Record as AuditRecord, RequestContext as AuditContext, Status,
};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Frame, Request, RequestId, Response};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::error;

use super::{INPUT_QUEUE, InFlight, Inbox, InboxSender, InputRoute, Session};
use crate::provider::{
    Answer, Call, Method, Nested, Outbound, Pause, Providers, StartEntry, StreamSink, Usage,
};
use crate::server::Gateway;
use crate::server::approvals::{Ask, Onlookers, record_outcome};
use crate::server::entry::{self, code_name, describe_target, error_code};

/// Where a request's answer goes.
pub(super) enum AnswerTo {
    /// A `response` frame to the peer, once the entry is durable.
    Peer,
    /// A running call's own request: answered to the call, its stream
    /// frames shown as the call's own.
    Caller {
        parent: RequestId,
        answer: oneshot::Sender<Answer>,
    },
}

/// Why a request is answered without running.
struct Refusal {
    error: ErrorBody,
}

impl Refusal {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody::new(code, message),
        }
    }
}

/// What admission allows a request to run with.
struct Admitted {
    /// The method as its provider declared it.
    method: &'static Method,
    policy: Arc<Policy>,
    terms: Terms,
    /// Parked for an operator first, under this policy.
    approval: Option<ApprovalPolicy>,
}

impl Session {
    /// A request from the peer.
    pub(super) async fn handle_request(
        &mut self,
        request: Request,
        done: &InboxSender,
        draining: bool,
    ) {
        let record = self.audit_record(&request);
        let cancel = CancellationToken::new();
        // Boxed: admission's future is most of a session's, and an idle
        // session would otherwise hold its room all the time.
        Box::pin(self.take(request, record, AnswerTo::Peer, cancel, done, draining)).await
    }

    /// A request a running call made (see [`crate::provider::Requests`]).
    pub(super) async fn handle_nested(
        &mut self,
        nested: Nested,
        done: &InboxSender,
        draining: bool,
    ) {
        let Nested {
            parent,
            request,
            cancel,
            answer,
        } = nested;
        let mut record = self.audit_record(&request);
        record.parent_request_id = Some(parent.to_string());
        let to = AnswerTo::Caller { parent, answer };
        Box::pin(self.take(request, record, to, cancel, done, draining)).await
    }

    async fn take(
        &mut self,
        request: Request,
        mut record: AuditRecord,
        to: AnswerTo,
        cancel: CancellationToken,
        done: &InboxSender,
        draining: bool,
    ) {
        if self.in_flight.contains_key(&request.id) {
            let message = format!("request id `{}` is already in flight", request.id);
            record.detail = Some(message.clone());
            self.record_refusal(record, ErrorCode::InvalidRequest).await;
            return match to {
                // Answering with this id would look like the answer to the
                // first request, so the refusal is an event.
                AnswerTo::Peer => {
                    let payload =
                        json!({"code": "invalid_request", "id": request.id, "message": message});
                    self.event("relay.error", payload).await
                }
                AnswerTo::Caller { answer, .. } => {
                    let refused = ErrorBody::new(ErrorCode::InvalidRequest, message);
                    let _ = answer.send(Answer {
                        result: Err(refused),
                        entry: None,
                    });
                }
            };
        }
        match self.admit(&request, &mut record, draining) {
            Err(Refusal { error }) => {
                self.record_refusal(record, error.code).await;
                self.answer(request.id, to, error).await
            }
            Ok(admitted) => {
                self.execute(request, admitted, record, to, cancel, done)
                    .await
            }
        }
    }

    /// Answers a refused request.
    async fn answer(&self, id: RequestId, to: AnswerTo, error: ErrorBody) {
        match to {
            AnswerTo::Peer => self.send(Frame::Response(Response::err(id, error))).await,
            AnswerTo::Caller { answer, .. } => {
                let _ = answer.send(Answer {
                    result: Err(error),
                    entry: None,
                });
            }
        }
    }

    /// The checks before a request may run, in the order of
    /// docs/PROTOCOL.md §5. Fills `record` with what it learns.
    fn admit(
        &self,
        request: &Request,
        record: &mut AuditRecord,
        draining: bool,
    ) -> Result<Admitted, Refusal> {
        let refuse = |code, message: &str| Err(Refusal::new(code, message));
        let Some(accepted) = &self.accepted else {
            return refuse(
                ErrorCode::InvalidRequest,
                "send the event relay.accepted before any request",
            );
        };
        if draining {
            return refuse(ErrorCode::RelayDisconnected, "the gateway is shutting down");
        }
        // Fail closed: nothing runs, not even a read, while no entry can
        // be written (the writer retries by itself).
        if let Some(why) = self.gateway.audit.stopped() {
            record.rule = Some("the audit log cannot write".into());
            return Err(Refusal {
                error: entry::audit_unavailable(false, &why),
            });
        }
        let limit = self.gateway.config.limits.max_in_flight;
        if self.in_flight.len() >= limit {
            return refuse(
                ErrorCode::ProviderError,
                &format!("too many requests in flight (limit {limit}); wait for answers"),
            );
        }
        if *self.gateway.paused.borrow() != Pause::Off {
            record.decision = Some(AuditDecision::Blocked);
            record.rule = Some("the gateway is paused".into());
            return refuse(
                ErrorCode::PolicyBlocked,
                "the gateway is paused by its operator",
            );
        }
        let method = self.gateway.providers.method(&request.method);
        let query = Providers::query(method, request).map_err(|error| Refusal { error })?;
        describe_target(record, &query.target);
        let policy = self.gateway.current_policy();
        // The entry names the generation that decided, even if a reload
        // came after `audit_record`.
        record.policy_generation = Some(policy.generation.clone());
        let decision = decide(&policy, &self.principal, &query, jiff::Timestamp::now());
        record.capability = decision.capability.map(|c| c.as_str().to_string());
        record.rule = Some(decision.rule.clone());
        if let Verdict::Deny(denial @ (Denial::UnknownMethod | Denial::CapabilityUnavailable)) =
            decision.verdict
        {
            return refuse(error_code(denial), &decision.rule);
        }
        let Some(method) = method else {
            return refuse(
                ErrorCode::UnknownMethod,
                &format!("method `{}` is not served by this gateway", request.method),
            );
        };
        if let Some(capability) = decision.capability
            && !accepted.contains(capability.as_str())
            && !matches!(decision.verdict, Verdict::Deny(_))
        {
            let message = format!(
                "capability `{}` was not accepted in relay.accepted",
                capability.as_str()
            );
            return refuse(ErrorCode::CapabilityUnavailable, &message);
        }
        let approval = match decision.verdict {
            Verdict::Allow => {
                record.decision = Some(AuditDecision::Allowed);
                if let Terms::File(file) = &decision.terms {
                    record.path = Some(file.path.clone());
                }
                None
            }
            Verdict::Deny(denial) => {
                record.decision = Some(AuditDecision::Blocked);
                return refuse(error_code(denial), &decision.rule);
            }
            // Parked until an operator decides (see `execute`).
            Verdict::RequireApproval(policy) => Some(policy),
        };
        Ok(Admitted {
            method,
            policy,
            terms: decision.terms,
            approval,
        })
    }

    /// What every request entry of this session says of where it came
    /// from: the session, its peer and principal, the gateway run.
    pub(super) fn session_record(&self) -> AuditRecord {
        AuditRecord {
            started_at: jiff::Timestamp::now().to_string(),
            ..self.record_base.clone()
        }
    }

    /// The entry every request starts from.
    pub(super) fn audit_record(&self, request: &Request) -> AuditRecord {
        let capability = portcullis_policy::capability_of(&request.method);
        AuditRecord {
            request_id: Some(request.id.to_string()),
            method: Some(request.method.clone()),
            context: request.context.as_ref().map(|c| AuditContext {
                session_id: c.session_id.clone(),
                run_id: c.run_id.clone(),
                tool_call_id: c.tool_call_id.clone(),
                workspace_id: c.workspace_id.clone(),
            }),
            policy_generation: Some(self.gateway.current_policy().generation.clone()),
            capability: capability.map(|c| c.as_str().to_string()),
            target_id: (capability == Some(Capability::Shell))
                .then(|| portcullis_wire::envproto::TARGET_ID.to_string()),
            resource_id: entry::resource_of(&request.params),
            ..self.session_record()
        }
    }

    /// Records a request answered without running; durable before the
    /// answer (the caller sends it after this returns).
    pub(super) async fn record_refusal(&self, mut record: AuditRecord, code: ErrorCode) {
        record.completed_at = Some(jiff::Timestamp::now().to_string());
        record.status = Some(Status::Failed);
        record.error_code = Some(code_name(code));
        record.error_name = Some(entry::error_name(code, None).to_string());
        let served = record
            .method
            .as_deref()
            .is_some_and(|m| self.gateway.providers.serves(m));
        self.gateway.metrics.request(&record, served);
        // While the log cannot write, each refusal is counted in the entry
        // it writes when it resumes; its stop was logged once.
        if let Err(e) = self.gateway.audit.append(record).await
            && self.gateway.audit.stopped().is_none()
        {
            error!(session = self.info.id, "audit: {e}");
        }
    }

    /// Runs an admitted request in its own task. A long-running method is
    /// recorded before it starts; every request is recorded before its
    /// answer. `done` tells this loop the id is free again.
    async fn execute(
        &mut self,
        request: Request,
        admitted: Admitted,
        mut record: AuditRecord,
        to: AnswerTo,
        cancel: CancellationToken,
        done: &InboxSender,
    ) {
        let id = request.id.clone();
        let gateway = self.gateway.clone();
        let Admitted {
            method,
            policy,
            terms,
            approval,
        } = admitted;
        // A call that waits for approval leaves its start entry once
        // approved (in its task, below). Otherwise it is submitted here and
        // is durable before the call acts (see `StartEntry`).
        let mut start_entry = StartEntry::durable();
        if approval.is_none() && method.start_entry {
            let start = AuditRecord {
                kind: Kind::RequestStart,
                ..record.clone()
            };
            match submit(&gateway, start) {
                Ok(entry) => {
                    start_entry = StartEntry::pending(Box::pin(async move {
                        entry
                            .await
                            .map_err(|why| entry::audit_unavailable(false, &why))
                    }));
                }
                Err(why) => {
                    return self
                        .answer(id, to, entry::audit_unavailable(false, &why))
                        .await;
                }
            }
        }
        let revoked = Arc::new(OnceLock::new());
        let request = Arc::new(request);
        let running = InFlight {
            cancel: cancel.clone(),
            request: request.clone(),
            revoked: revoked.clone(),
        };
        self.in_flight.insert(id.clone(), running);
        self.info.in_flight.fetch_add(1, Ordering::Relaxed);
        let usage = Arc::new(Usage::default());
        // A nested request takes no binary input: nothing can route it.
        let input = match &to {
            AnswerTo::Caller { .. } => None,
            AnswerTo::Peer => (method.input)(&request).map(|channel| {
                let (tx, rx) = mpsc::channel(INPUT_QUEUE);
                let route = InputRoute {
                    channel,
                    tx,
                    usage: usage.clone(),
                };
                self.inputs.insert(id.clone(), route);
                rx
            }),
        };
        let (stream_id, parent) = match &to {
            AnswerTo::Peer => (id.clone(), None),
            AnswerTo::Caller { parent, .. } => (parent.clone(), Some(parent.clone())),
        };
        let call = Call {
            principal: self.principal.clone(),
            stream: StreamSink::new(stream_id, self.outbox.clone(), usage.clone(), self.output),
            request,
            policy,
            terms,
            cancel,
            input,
            usage: usage.clone(),
            resources: self.resources.clone(),
            session_end: self.end_reason.clone(),
            revoked: revoked.clone(),
            requests: self.requests.clone(),
            parent,
            start_entry: start_entry.clone(),
            origin: self.origin.clone(),
            max_result: gateway.config.limits.max_frame - crate::provider::RESPONSE_ROOM,
        };
        let (outbox, done, end_reason) =
            (self.outbox.clone(), done.clone(), self.end_reason.clone());
        // Boxed: this future is several KiB (the call, its audit record,
        // the provider's future), and tokio moves a task's future by value,
        // into its cell and again at each change of stage. Those copies
        // were about 5 % of the gateway's CPU at 256 requests in flight; a
        // box moves as a pointer.
        tokio::spawn(Box::pin(async move {
            let tracked = gateway.providers.track(&call);
            let approved = match approval {
                None => Ok(None),
                Some(policy) => approve(&gateway, &call, policy, method, &mut record).await,
            };
            let outcome = match approved {
                Ok(approved_start) => {
                    let outcome = gateway.providers.run(call).await;
                    record.start_seq = match approved_start {
                        Some(seq) => Some(seq),
                        None => start_entry.seq().await,
                    };
                    outcome
                }
                Err(error) => Err(error),
            };
            drop(tracked);
            let outcome = match outcome {
                Err(error) if error.code == ErrorCode::Cancelled => {
                    let reason = revoked.get().or(end_reason.get()).cloned();
                    Err(reason.unwrap_or(error))
                }
                other => other,
            };
            entry::complete(
                &mut record,
                outcome.as_ref().ok(),
                outcome.as_ref().err(),
                &usage,
            );
            gateway.metrics.request(&record, true);
            // Whether the request acted: a read did; one that acts did once
            // its start entry was durable.
            let ran = record.start_seq.is_some() || !method.start_entry;
            match to {
                AnswerTo::Peer => {
                    let response = match gateway.audit.append(record).await {
                        Ok(_) => match outcome {
                            Ok(result) => Response::ok(id.clone(), result),
                            Err(error) => Response::err(id.clone(), error),
                        },
                        Err(e) => {
                            error!("audit: {e}");
                            Response::err(id.clone(), entry::audit_unavailable(ran, &e.to_string()))
                        }
                    };
                    // The id is free before the answer leaves: a peer that
                    // reuses it once answered finds it free (the loop
                    // takes this before the next record).
                    let _ = done.send(Inbox::Done(id.clone()));
                    let _ = outbox
                        .send(Outbound::Frame(Box::new(Frame::Response(response))))
                        .await;
                    return;
                }
                AnswerTo::Caller { answer, .. } => {
                    let answered = match submit(&gateway, record) {
                        Ok(entry) => Answer {
                            result: outcome,
                            entry: Some(Box::pin(async move {
                                entry
                                    .await
                                    .map(drop)
                                    .map_err(|why| entry::audit_unavailable(ran, &why))
                            })),
                        },
                        Err(why) => Answer {
                            result: Err(entry::audit_unavailable(ran, &why)),
                            entry: None,
                        },
                    };
                    let _ = answer.send(answered);
                }
            }
            let _ = done.send(Inbox::Done(id));
        }));
    }
}

/// Hands `record` to the audit writer; the entry is durable once the
/// returned future resolves, to its sequence number. An error says why
/// the log cannot write.
fn submit(
    gateway: &Gateway,
    record: AuditRecord,
) -> Result<impl std::future::Future<Output = Result<u64, String>> + Send + 'static + use<>, String>
{
    let submitted = gateway
        .audit
        .submit(record)
        .map_err(|e| why_unwritten(&gateway.audit, &e))?;
    let audit = gateway.audit.clone();
    Ok(async move { submitted.await.map_err(|e| why_unwritten(&audit, &e)) })
}

/// Why an entry was not written: the log's own reason while it is stopped.
fn why_unwritten(audit: &portcullis_store::AuditLog, e: &portcullis_store::StoreError) -> String {
    error!("audit: {e}");
    audit.stopped().unwrap_or_else(|| e.to_string())
}

/// Waits for an operator to approve a parked call (see
/// `server::approvals`) and records the outcome in its entry; once
/// approved, a call that acts leaves its start entry, whose sequence
/// number this returns.
async fn approve(
    gateway: &Gateway,
    call: &Call,
    policy: ApprovalPolicy,
    method: &Method,
    record: &mut AuditRecord,
) -> Result<Option<u64>, ErrorBody> {
    let risk = call
        .request
        .params
        .get("name")
        .and_then(Value::as_str)
        .and_then(|name| call.policy.tool(name))
        .map(|tool| tool.risk.as_str().to_string());
    let ask = Ask::for_request(&call.principal, &call.request, policy).with_risk(risk);
    let timeout = gateway.config.approval_timeout;
    let onlookers = Onlookers {
        stream: call.stream.clone(),
        events: call.resources.events(),
        request_id: call.request.id.to_string(),
    };
    let outcome = gateway
        .approvals
        .obtain(ask, timeout, &call.cancel, &onlookers)
        .await;
    record_outcome(record, &outcome);
    outcome?;
    if !method.start_entry {
        return Ok(None);
    }
    let start = AuditRecord {
        kind: Kind::RequestStart,
        ..record.clone()
    };
    match submit(gateway, start) {
        Ok(entry) => entry.await.map(Some),
        Err(why) => Err(why),
    }
    .map_err(|why| entry::audit_unavailable(false, &why))
}

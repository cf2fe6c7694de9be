//! One session, from the WebSocket upgrade to its close:
//!
//! 1. Noise handshake (bounded by `handshake_timeout`);
//! 2. authenticate: a token in message 3, else the client's static key;
//! 3. `hello` advertising only what the principal is granted;
//! 4. wait for the event `relay.accepted`;
//! 5. decode → decide → execute → respond, for every request, while
//!    watching policy reloads, expiry, the pause switch, operator kills and
//!    shutdown.
//!
//! Writing happens in a separate task fed by a bounded outbox, so a slow
//! peer slows only its own session.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use portcullis_policy::{
    ApprovalPolicy, Capability, Denial, Policy, Summary, Terms, Verdict, decide, principal_by_key,
    principal_by_token, principal_status, summary,
};
use portcullis_store::{
    Decision as AuditDecision, Kind, Record as AuditRecord, RequestContext as AuditContext, Status,
};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::provider::{Call, Outbound, Outbox, StartEntry, StreamSink, Usage};
use crate::server::entry::{self, LONG_RUNNING, code_name, describe_target, error_code};
use crate::server::query::{query_for, still_allowed};
use crate::server::resources::SessionResources;
use crate::server::state::{Gateway, SessionInfo};
use crate::tools::approvals::{Ask, record_outcome};
use portcullis_wire::channel::{self, ChannelError, RecordReader, RecordWriter};
use portcullis_wire::frame::{
    self, ErrorBody, ErrorCode, Event, Frame, Heartbeat, Hello, PROTOCOL, Request, RequestId,
    Response,
};
use portcullis_wire::record::{self, Channel, ChunkRecord, Record, RecordError};

/// Records queued for the writer before producers wait.
const OUTBOX_CAPACITY: usize = 64;

pub async fn run<S>(gateway: Arc<Gateway>, ws: WebSocketStream<S>, peer: SocketAddr)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = gateway.config.limits;
    let started = Instant::now();
    let info = gateway_info(&gateway);
    let accepted = match timeout(
        limits.handshake_timeout,
        channel::accept(ws, &gateway.key, &info),
    )
    .await
    {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(e)) => {
            debug!(%peer, "handshake failed: {e}");
            return gateway.security_event("handshake_failed", None, format!("peer {peer}: {e}"));
        }
        Err(_) => {
            debug!(%peer, "handshake timed out");
            return gateway.security_event(
                "handshake_failed",
                None,
                format!("peer {peer}: timed out"),
            );
        }
    };
    let mut writer = accepted.writer;
    let policy = gateway.current_policy();
    let principal = match authenticate(&policy, &accepted.client_key, &accepted.credentials) {
        Ok(principal) => principal,
        Err(why) => {
            warn!(%peer, key = %accepted.client_key.fingerprint(), "authentication refused: {why}");
            let detail = format!(
                "peer {peer}, key {}: {why}",
                accepted.client_key.fingerprint()
            );
            gateway.security_event("auth_refused", None, detail);
            return writer.close(true, "authentication failed").await;
        }
    };
    let granted = summary(&policy, &principal, jiff::Timestamp::now());
    if granted_names(&granted).is_empty() {
        // The same rule that closes a session whose grants were all revoked.
        warn!(%peer, %principal, "authentication refused: the principal has no grants");
        gateway.security_event(
            "auth_refused",
            Some(&principal),
            format!("peer {peer}: the principal has no grants"),
        );
        return writer.close(true, "authentication failed").await;
    }
    let Some(guard) =
        gateway
            .sessions
            .register(&principal, peer, limits.max_sessions_per_principal)
    else {
        warn!(%peer, %principal, "refused: too many sessions for this principal");
        return writer
            .close(true, "too many sessions for this principal")
            .await;
    };
    info!(%peer, %principal, session = guard.info.id, "session authenticated");

    let (outbox, outbox_rx) = mpsc::channel(OUTBOX_CAPACITY);
    let writer_task = tokio::spawn(write_loop(writer, outbox_rx));
    let hello = Hello {
        protocol: PROTOCOL.to_string(),
        provider_id: Some(gateway.config.provider_id.clone()),
        client_id: Some(principal.clone()),
        client_kind: Some("portcullis".into()),
        client_version: Some(env!("CARGO_PKG_VERSION").into()),
        instance_id: Some(gateway.instance_id.clone()),
        capabilities: capabilities_json(&policy, &granted),
    };
    let tools = tools_by_name(&policy, &principal, jiff::Timestamp::now());
    let mut session = Session {
        gateway: gateway.clone(),
        principal,
        info: guard.info.clone(),
        outbox: outbox.clone(),
        in_flight: HashMap::new(),
        inputs: HashMap::new(),
        accepted: None,
        tools,
        granted,
        end_reason: Arc::new(OnceLock::new()),
        resources: SessionResources::new(outbox.clone()),
    };
    if outbox
        .send(Outbound::Frame(Frame::Hello(hello)))
        .await
        .is_ok()
    {
        session.serve(accepted.reader, started).await;
    }
    // Watches stop with the session.
    session.resources.clear();
    drop(session);
    drop(outbox);
    // The writer ends after the close frame, or when the peer stops reading.
    let mut writer_task = writer_task;
    if timeout(Duration::from_secs(5), &mut writer_task)
        .await
        .is_err()
    {
        writer_task.abort();
    }
    drop(guard);
}

/// Message 2's payload: who this gateway is.
fn gateway_info(gateway: &Gateway) -> Vec<u8> {
    let info = json!({
        "provider_id": gateway.config.provider_id,
        "protocol": PROTOCOL,
        "instance_id": gateway.instance_id,
        "version": env!("CARGO_PKG_VERSION"),
    });
    info.to_string().into_bytes()
}

/// A token in message 3 names the principal; without one, the client's
/// authenticated static key does. The reason is for the log, never the peer.
fn authenticate(
    policy: &Policy,
    key: &portcullis_crypto::PublicKey,
    credentials: &[u8],
) -> Result<String, String> {
    let credentials: Map<String, Value> = serde_json::from_slice(credentials)
        .map_err(|_| "message 3 payload is not a JSON object".to_string())?;
    let principal = match credentials.get("token") {
        Some(Value::String(token)) => principal_by_token(policy, token).ok_or("unknown token")?,
        Some(_) => return Err("`token` is not a string".into()),
        None => principal_by_key(policy, key.as_bytes()).ok_or("unknown client key")?,
    };
    principal_status(policy, &principal.id, jiff::Timestamp::now()).map_err(|(_, rule)| rule)?;
    Ok(principal.id.clone())
}

/// The descriptors of the tools `principal` may call, by name.
fn tools_by_name(
    policy: &Policy,
    principal: &str,
    now: jiff::Timestamp,
) -> BTreeMap<String, Value> {
    crate::tools::descriptors(policy, principal, now)
        .into_iter()
        .collect()
}

/// The `capabilities` of a hello: only what the principal is granted.
pub fn capabilities_json(policy: &Policy, granted: &Summary) -> Map<String, Value> {
    let mut caps = Map::new();
    if !granted.fileops.is_empty() {
        let roots: Vec<Value> = granted
            .fileops
            .iter()
            .filter_map(|(id, mode)| {
                let root = policy.root(id)?;
                Some(json!({"root_id": id, "label": root.description.clone().unwrap_or_else(|| id.clone()),
                            "virtual_path": root.virtual_path, "mode": mode.as_str()}))
            })
            .collect();
        caps.insert("fileops".into(), json!({"enabled": true, "roots": roots}));
    }
    if granted.shell {
        caps.insert(
            "shell".into(),
            json!({"enabled": true, "runtime": "portcullis", "interactive": granted.pty}),
        );
    }
    if !granted.tools.is_empty() {
        caps.insert(
            "tools".into(),
            json!({"enabled": true, "tool_count": granted.tools.len()}),
        );
    }
    if granted.scripts {
        caps.insert("scripts".into(), json!({"enabled": true}));
    }
    if granted.resources {
        caps.insert("resources".into(), json!({"enabled": true}));
    }
    caps
}

struct Session {
    gateway: Arc<Gateway>,
    principal: String,
    info: SessionInfo,
    outbox: Outbox,
    in_flight: HashMap<RequestId, InFlight>,
    /// Requests in flight that take binary input: where their chunks go.
    inputs: HashMap<RequestId, InputRoute>,
    /// Capabilities named in `relay.accepted`; `None` until it arrives.
    accepted: Option<BTreeSet<String>>,
    granted: Summary,
    /// The tool descriptors the principal was last granted, by name.
    tools: BTreeMap<String, Value>,
    /// Set when the session ends for a reason other than a `cancel`: the
    /// answer cancelled requests get instead of `cancelled`.
    end_reason: Arc<OnceLock<ErrorBody>>,
    resources: SessionResources,
}

/// A request being executed.
struct InFlight {
    cancel: CancellationToken,
    /// Decided again when the policy changes.
    request: Request,
    /// Set when a policy change stopped it: its answer.
    revoked: Arc<OnceLock<ErrorBody>>,
}

/// Where the chunks of one request's input go.
struct InputRoute {
    channel: Channel,
    tx: mpsc::Sender<Bytes>,
    usage: Arc<Usage>,
}

/// Chunks of one request's input queued before the session stops reading
/// (TCP then pushes back on the sender): 16 × 64 KiB.
const INPUT_QUEUE: usize = 16;

/// Why the main loop stops reading requests.
enum Ending {
    /// Close now (after pending answers), with this reason.
    Close { policy: bool, reason: String },
    /// The connection is gone or broken; nothing more can be sent.
    Broken,
}

impl Session {
    async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        mut reader: RecordReader<S>,
        started: Instant,
    ) {
        let limits = self.gateway.config.limits;
        let gateway = self.gateway.clone();
        let mut policy_rx = gateway.policy.subscribe();
        let mut paused_rx = gateway.paused.subscribe();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<RequestId>();
        let mut expiry = self.next_expiry();
        let mut pinged = false;
        let mut draining = false;
        // The waits that outlive one turn of the loop are made once and
        // reset, not made anew each turn: each made anew registered a timer
        // or a waiter, and this loop turns once or twice per request.
        let never = || later(Instant::now(), Duration::MAX);
        let mut killed = pin!(self.info.kill.clone().cancelled_owned());
        let mut shutdown = pin!(gateway.shutdown.clone().cancelled_owned());
        let mut accept_deadline = pin!(sleep_until(later(started, limits.handshake_timeout)));
        let mut drain_deadline = pin!(sleep_until(never()));
        let mut expiry_timer = pin!(sleep_until(expiry.unwrap_or_else(never)));
        // Idle: no record from the peer while the loop waits; restarted on
        // every turn, which (extending a registered timer) takes no lock.
        let mut idle = pin!(sleep_until(later(Instant::now(), limits.idle_timeout)));

        let ending = loop {
            if draining && self.in_flight.is_empty() {
                break Ending::Close {
                    policy: false,
                    reason: "the gateway is shutting down".into(),
                };
            }
            idle.as_mut()
                .reset(later(Instant::now(), limits.idle_timeout));
            tokio::select! {
                () = &mut killed => {
                    let detail = format!("session {}", self.info.id);
                    gateway.security_event("session_killed", Some(&self.principal), detail);
                    break self.end(ErrorCode::RelayDisconnected, "the operator closed this session", true);
                }
                () = &mut shutdown, if !draining => {
                    draining = true;
                    drain_deadline.as_mut().reset(later(Instant::now(), limits.shutdown_grace));
                }
                () = &mut drain_deadline, if draining => {
                    break self.end(ErrorCode::RelayDisconnected, "the gateway is shutting down", false);
                }
                () = &mut accept_deadline, if self.accepted.is_none() => {
                    break Ending::Close { policy: true, reason: "no relay.accepted in time".into() };
                }
                Ok(()) = policy_rx.changed() => {
                    if let Some(ending) = self.reevaluate().await { break ending; }
                    expiry = self.next_expiry();
                    expiry_timer.as_mut().reset(expiry.unwrap_or_else(never));
                }
                () = &mut expiry_timer, if expiry.is_some() => {
                    if let Some(ending) = self.reevaluate().await { break ending; }
                    expiry = self.next_expiry();
                    expiry_timer.as_mut().reset(expiry.unwrap_or_else(never));
                }
                Ok(()) = paused_rx.changed() => {
                    let event = if *paused_rx.borrow_and_update() { "provider.paused" } else { "provider.resumed" };
                    self.event(event, json!({})).await;
                }
                Some(id) = done_rx.recv() => {
                    self.finished(&id);
                    self.finish_done(&mut done_rx);
                }
                () = &mut idle => {
                    if pinged {
                        break Ending::Close { policy: false, reason: "idle".into() };
                    }
                    pinged = true;
                    let ping = Heartbeat { id: Some(format!("idle-{}", jiff::Timestamp::now().as_second())), ts: None };
                    self.send(Frame::Ping(ping)).await;
                }
                received = reader.recv() => match received {
                    Err(e) => {
                        debug!(session = self.info.id, "connection ended: {e}");
                        if let ChannelError::Noise(noise) = &e {
                            let detail = format!("session {}: {noise}", self.info.id);
                            self.gateway.security_event("decrypt_failed", Some(&self.principal), detail);
                        }
                        let _ = self.end(ErrorCode::RelayDisconnected, "the connection ended", false);
                        break match e {
                            ChannelError::Closed { .. } | ChannelError::WebSocket(_) => Ending::Broken,
                            other => Ending::Close { policy: true, reason: other.to_string() },
                        };
                    }
                    Ok(plaintext) => {
                        pinged = false;
                        self.handle_record(plaintext, &done_tx, draining).await;
                        // Answers sent meanwhile free their ids here, not
                        // in a turn of their own.
                        self.finish_done(&mut done_rx);
                    }
                },
            }
        };
        // Let cancelled requests send their answers, briefly, before closing.
        let until = Instant::now() + Duration::from_secs(2);
        while !self.in_flight.is_empty() {
            match timeout(
                until.saturating_duration_since(Instant::now()),
                done_rx.recv(),
            )
            .await
            {
                Ok(Some(id)) => self.finished(&id),
                _ => break,
            }
        }
        if let Ending::Close { policy, reason } = ending {
            info!(session = self.info.id, principal = %self.principal, "closing: {reason}");
            let _ = timeout(
                Duration::from_secs(2),
                self.outbox.send(Outbound::Close { policy, reason }),
            )
            .await;
        }
    }

    /// Forgets a request that has answered: its id is free again.
    fn finished(&mut self, id: &RequestId) {
        self.in_flight.remove(id);
        self.inputs.remove(id);
        self.info.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// [`finished`](Self::finished) for every answer already announced.
    fn finish_done(&mut self, done: &mut mpsc::UnboundedReceiver<RequestId>) {
        while let Ok(id) = done.try_recv() {
            self.finished(&id);
        }
    }

    /// Cancels every request in flight; they answer with `code`.
    fn end(&mut self, code: ErrorCode, message: &str, policy: bool) -> Ending {
        let _ = self.end_reason.set(ErrorBody::new(code, message));
        for running in self.in_flight.values() {
            running.cancel.cancel();
        }
        self.inputs.clear();
        Ending::Close {
            policy,
            reason: message.to_string(),
        }
    }

    async fn send(&self, frame: Frame) {
        let _ = self.outbox.send(Outbound::Frame(frame)).await;
    }

    async fn event(&self, event: &str, payload: Value) {
        self.send(Frame::Event(Event {
            event: event.to_string(),
            payload,
        }))
        .await;
    }

    async fn respond_error(&self, id: RequestId, code: ErrorCode, message: impl Into<String>) {
        self.send(Frame::Response(Response::err(
            id,
            ErrorBody::new(code, message),
        )))
        .await;
    }

    async fn handle_record(
        &mut self,
        plaintext: Vec<u8>,
        done: &mpsc::UnboundedSender<RequestId>,
        draining: bool,
    ) {
        // Chunk data travels on as a slice of the record, not a copy.
        let plaintext = Bytes::from(plaintext);
        match record::decode(&plaintext) {
            Ok(Record::Frame(Frame::Request(request))) => {
                self.handle_request(request, done, draining).await
            }
            Ok(Record::Frame(Frame::Cancel(cancel))) => {
                if let Some(running) = self.in_flight.get(&cancel.id) {
                    running.cancel.cancel();
                }
                // The provider sees its input end (`None`) and cleans up.
                self.inputs.remove(&cancel.id);
            }
            Ok(Record::Frame(Frame::Ping(beat))) => self.send(Frame::Pong(beat)).await,
            Ok(Record::Frame(Frame::Event(event))) if event.event == "relay.accepted" => {
                self.accept(&event.payload).await
            }
            Ok(Record::Frame(other)) => debug!(session = self.info.id, "ignored frame: {other:?}"),
            Ok(Record::Chunk(chunk)) => {
                let data = plaintext.slice_ref(chunk.data);
                self.route_chunk(chunk, data).await
            }
            Err(e) => {
                let json = plaintext.get(1..).unwrap_or_default();
                let salvaged =
                    frame::salvage_request_id(json).filter(|id| !self.in_flight.contains_key(id));
                let record = AuditRecord {
                    kind: Kind::Request,
                    started_at: jiff::Timestamp::now().to_string(),
                    connection: Some(self.info.id),
                    peer: Some(self.info.peer.to_string()),
                    principal: Some(self.principal.clone()),
                    request_id: salvaged.as_ref().map(ToString::to_string),
                    detail: Some(e.to_string().chars().take(300).collect()),
                    ..AuditRecord::default()
                };
                self.record_refusal(record, ErrorCode::InvalidRequest).await;
                match salvaged {
                    Some(id) if matches!(e, RecordError::Frame(_)) => {
                        self.respond_error(id, ErrorCode::InvalidRequest, e.to_string())
                            .await;
                    }
                    _ => {
                        let payload = json!({"code": "invalid_request", "message": e.to_string()});
                        self.event("relay.error", payload).await;
                    }
                }
            }
        }
    }

    /// Hands a chunk to the request whose input it is. Waiting here while
    /// that request's queue is full is the back-pressure on the uploader.
    async fn route_chunk(&mut self, chunk: record::Chunk<'_>, data: Bytes) {
        let problem = match self.inputs.get(chunk.request_id) {
            None => format!("no request `{}` takes binary input", chunk.request_id),
            Some(route) if route.channel != chunk.channel => format!(
                "request `{}` takes input on channel {}, not {}",
                chunk.request_id, route.channel as u8, chunk.channel as u8
            ),
            Some(route) => {
                route.usage.add_in(chunk.data.len());
                let end = chunk.data.is_empty();
                // A closed queue means the request already ended; its
                // response says how.
                let _ = route.tx.send(data).await;
                if end {
                    self.inputs.remove(chunk.request_id);
                }
                return;
            }
        };
        self.event(
            "relay.error",
            json!({"code": "invalid_request", "message": problem}),
        )
        .await;
    }

    async fn accept(&mut self, payload: &Value) {
        let Some(names) = payload
            .get("accepted_capabilities")
            .and_then(Value::as_array)
        else {
            let message =
                "relay.accepted needs payload.accepted_capabilities, an array of capability names";
            return self
                .event(
                    "relay.error",
                    json!({"code": "invalid_request", "message": message}),
                )
                .await;
        };
        let offered = granted_names(&self.granted);
        let accepted = names
            .iter()
            .filter_map(Value::as_str)
            .filter(|n| offered.contains(*n))
            .map(str::to_string)
            .collect();
        self.accepted = Some(accepted);
    }

    async fn handle_request(
        &mut self,
        request: Request,
        done: &mpsc::UnboundedSender<RequestId>,
        draining: bool,
    ) {
        let mut record = self.audit_record(&request);
        if self.in_flight.contains_key(&request.id) {
            // Answering with this id would look like the answer to the first
            // request, so the refusal is an event.
            let message = format!("request id `{}` is already in flight", request.id);
            record.detail = Some(message.clone());
            self.record_refusal(record, ErrorCode::InvalidRequest).await;
            let payload = json!({"code": "invalid_request", "id": request.id, "message": message});
            return self.event("relay.error", payload).await;
        }
        match self.admit(&request, &mut record, draining) {
            Err(refusal) => {
                self.record_refusal(record, refusal.code).await;
                self.respond_error(request.id, refusal.code, refusal.message)
                    .await;
            }
            Ok((terms, approval)) => self.execute(request, terms, approval, record, done).await,
        }
    }

    /// The checks before a request may run, in the order of
    /// docs/PROTOCOL.md §5. Fills `record` with what it learns.
    fn admit(
        &self,
        request: &Request,
        record: &mut AuditRecord,
        draining: bool,
    ) -> Result<(Terms, Option<ApprovalPolicy>), Refusal> {
        let refuse = |code, message: &str| {
            Err(Refusal {
                code,
                message: message.to_string(),
            })
        };
        let Some(accepted) = &self.accepted else {
            return refuse(
                ErrorCode::InvalidRequest,
                "send the event relay.accepted before any request",
            );
        };
        if draining {
            return refuse(ErrorCode::RelayDisconnected, "the gateway is shutting down");
        }
        let limit = self.gateway.config.limits.max_in_flight;
        if self.in_flight.len() >= limit {
            return refuse(
                ErrorCode::ProviderError,
                &format!("too many requests in flight (limit {limit}); wait for answers"),
            );
        }
        if *self.gateway.paused.borrow() {
            record.decision = Some(AuditDecision::Blocked);
            record.rule = Some("the gateway is paused".into());
            return refuse(
                ErrorCode::PolicyBlocked,
                "the gateway is paused by its operator",
            );
        }
        let query = query_for(request).map_err(|e| Refusal {
            code: e.code,
            message: e.message,
        })?;
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
        if !self.gateway.dispatcher.serves(&request.method) {
            return refuse(
                ErrorCode::UnknownMethod,
                &format!("method `{}` is not served by this gateway", request.method),
            );
        }
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
        match decision.verdict {
            Verdict::Allow => {
                record.decision = Some(AuditDecision::Allowed);
                if let Terms::File(file) = &decision.terms {
                    record.path = Some(file.path.clone());
                }
                Ok((decision.terms, None))
            }
            Verdict::Deny(denial) => {
                record.decision = Some(AuditDecision::Blocked);
                refuse(error_code(denial), &decision.rule)
            }
            // Parked until an operator decides (see `execute`).
            Verdict::RequireApproval(policy) => Ok((decision.terms, Some(policy))),
        }
    }

    /// The entry every request starts from.
    fn audit_record(&self, request: &Request) -> AuditRecord {
        AuditRecord {
            kind: Kind::Request,
            started_at: jiff::Timestamp::now().to_string(),
            connection: Some(self.info.id),
            peer: Some(self.info.peer.to_string()),
            principal: Some(self.principal.clone()),
            request_id: Some(request.id.to_string()),
            method: Some(request.method.clone()),
            context: request.context.as_ref().map(|c| AuditContext {
                session_id: c.session_id.clone(),
                run_id: c.run_id.clone(),
                tool_call_id: c.tool_call_id.clone(),
            }),
            policy_generation: Some(self.gateway.current_policy().generation.clone()),
            ..AuditRecord::default()
        }
    }

    /// Records a request answered without running; durable before the
    /// answer (the caller sends it after this returns).
    async fn record_refusal(&self, mut record: AuditRecord, code: ErrorCode) {
        record.completed_at = Some(jiff::Timestamp::now().to_string());
        record.status = Some(Status::Failed);
        record.error_code = Some(code_name(code));
        let served = record
            .method
            .as_deref()
            .is_some_and(|m| self.gateway.dispatcher.serves(m));
        self.gateway.metrics.request(&record, served);
        if let Err(e) = self.gateway.audit.append(record).await {
            error!(session = self.info.id, "audit: {e}");
        }
    }

    /// Runs an allowed request in its own task. A long-running method is
    /// recorded before it starts; every request is recorded, durably, before
    /// its answer. `done` tells this loop the id is free again.
    async fn execute(
        &mut self,
        request: Request,
        terms: Terms,
        approval: Option<ApprovalPolicy>,
        mut record: AuditRecord,
        done: &mpsc::UnboundedSender<RequestId>,
    ) {
        let id = request.id.clone();
        let audit = self.gateway.audit.clone();
        // A call that waits for approval leaves its start entry once
        // approved (in its task, below). Otherwise it is submitted here and
        // is durable before the call acts (see `StartEntry`).
        let mut start_entry = StartEntry::durable();
        if approval.is_none() && LONG_RUNNING.contains(&request.method.as_str()) {
            let start = AuditRecord {
                kind: Kind::RequestStart,
                ..record.clone()
            };
            match audit.submit(start) {
                Ok(submitted) => start_entry = StartEntry::pending(submitted),
                Err(e) => {
                    error!(session = self.info.id, "audit: {e}");
                    let message = "the audit log is unavailable, so nothing was run";
                    return self
                        .respond_error(id, ErrorCode::ProviderError, message)
                        .await;
                }
            }
        }
        let cancel = CancellationToken::new();
        let revoked = Arc::new(OnceLock::new());
        let running = InFlight {
            cancel: cancel.clone(),
            request: request.clone(),
            revoked: revoked.clone(),
        };
        self.in_flight.insert(id.clone(), running);
        self.info.in_flight.fetch_add(1, Ordering::Relaxed);
        let usage = Arc::new(Usage::default());
        let input = self
            .gateway
            .dispatcher
            .input_channel(&request)
            .map(|channel| {
                let (tx, rx) = mpsc::channel(INPUT_QUEUE);
                let route = InputRoute {
                    channel,
                    tx,
                    usage: usage.clone(),
                };
                self.inputs.insert(id.clone(), route);
                rx
            });
        let call = Call {
            principal: self.principal.clone(),
            stream: StreamSink::new(id.clone(), self.outbox.clone(), usage.clone()),
            request,
            terms,
            cancel,
            input,
            usage: usage.clone(),
            resources: self.resources.clone(),
            session_end: self.end_reason.clone(),
            revoked: revoked.clone(),
            gateway: self.gateway.clone(),
            record: record.clone(),
            start_entry,
        };
        let (gateway, outbox, done, end_reason) = (
            self.gateway.clone(),
            self.outbox.clone(),
            done.clone(),
            self.end_reason.clone(),
        );
        // Boxed: this future is 4.8 KiB (the call, its audit record, the
        // dispatcher's future), and tokio moves a task's future by value,
        // into its cell and again at each change of stage. Those copies
        // were about 5 % of the gateway's CPU at 256 requests in flight; a
        // box moves as a pointer.
        tokio::spawn(Box::pin(async move {
            let approved = match approval {
                None => Ok(()),
                Some(policy) => approve(&gateway, &call, policy, &mut record).await,
            };
            let outcome = match approved {
                Ok(()) => gateway.dispatcher.run(call).await,
                Err(error) => Err(error),
            };
            let mut response = match outcome {
                Ok(result) => Response::ok(id.clone(), result),
                Err(error) if error.code == ErrorCode::Cancelled => {
                    let reason = revoked.get().or(end_reason.get()).cloned();
                    Response::err(id.clone(), reason.unwrap_or(error))
                }
                Err(error) => Response::err(id.clone(), error),
            };
            entry::complete(
                &mut record,
                response.result.as_ref(),
                response.error.as_ref(),
                &usage,
            );
            gateway.metrics.request(&record, true);
            if let Err(e) = audit.append(record).await {
                error!("audit: {e}");
                let error = ErrorBody::new(
                    ErrorCode::ProviderError,
                    "the audit log is unavailable; the outcome was not recorded",
                );
                response = Response::err(id.clone(), error);
            }
            let _ = outbox
                .send(Outbound::Frame(Frame::Response(response)))
                .await;
            let _ = done.send(id);
        }));
    }

    /// After a policy change or an expiry: close if the principal may no
    /// longer act, tell the peer if its capabilities changed.
    async fn reevaluate(&mut self) -> Option<Ending> {
        let policy = self.gateway.current_policy();
        let now = jiff::Timestamp::now();
        let granted = summary(&policy, &self.principal, now);
        let revoked = match principal_status(&policy, &self.principal, now) {
            Err((_, rule)) => Some(rule),
            Ok(()) if granted_names(&granted).is_empty() => {
                Some(format!("principal `{}` has no grants left", self.principal))
            }
            Ok(()) => None,
        };
        if let Some(rule) = revoked {
            info!(session = self.info.id, principal = %self.principal, "revoked: {rule}");
            self.gateway.security_event(
                "session_revoked",
                Some(&self.principal),
                format!("session {}: {rule}", self.info.id),
            );
            return Some(self.end(
                ErrorCode::PermissionDenied,
                "access was revoked by the policy",
                true,
            ));
        }
        self.stop_what_is_no_longer_allowed(&policy, now).await;
        self.announce_tool_changes(&policy, now).await;
        if granted != self.granted {
            let names = granted_names(&granted);
            if let Some(accepted) = &mut self.accepted {
                accepted.retain(|c| names.contains(c));
            }
            let capabilities = capabilities_json(&policy, &granted);
            self.granted = granted;
            self.event(
                "capability.updated",
                json!({"capabilities": capabilities, "generation": policy.generation}),
            )
            .await;
        }
        None
    }

    /// Tells the client which tools a policy change granted, changed
    /// (`tool.registered`, with the new descriptor) or took away
    /// (`tool.unregistered`).
    async fn announce_tool_changes(&mut self, policy: &Policy, now: jiff::Timestamp) {
        let tools = tools_by_name(policy, &self.principal, now);
        let generation = &policy.generation;
        for name in self.tools.keys().filter(|name| !tools.contains_key(*name)) {
            let payload = json!({"name": name, "generation": generation});
            self.event("tool.unregistered", payload).await;
        }
        for (name, descriptor) in &tools {
            if self.tools.get(name) != Some(descriptor) {
                let payload = json!({"tool": descriptor, "generation": generation});
                self.event("tool.registered", payload).await;
            }
        }
        self.tools = tools;
    }

    /// Stops what the policy no longer allows: requests in flight (a
    /// command whose grant was taken away is killed; it answers
    /// `permission_denied`) and resources (a watch on a root since taken
    /// away).
    async fn stop_what_is_no_longer_allowed(&self, policy: &Policy, now: jiff::Timestamp) {
        let allowed = |request: &Request| still_allowed(policy, &self.principal, request, now);
        for (id, running) in &self.in_flight {
            if !allowed(&running.request) {
                info!(session = self.info.id, request = %id, "request revoked by the policy");
                let message = "the policy no longer allows this request; it was stopped";
                let _ = running
                    .revoked
                    .set(ErrorBody::new(ErrorCode::PermissionDenied, message));
                running.cancel.cancel();
            }
        }
        for (id, request) in self.resources.requests() {
            if !allowed(&request) && self.resources.dispose(&id) {
                info!(session = self.info.id, resource = %id, "resource revoked by the policy");
                let payload = json!({"id": id, "reason": "the policy no longer allows it"});
                self.event("resource.disposed", payload).await;
            }
        }
    }

    /// When the principal or one of its grants next expires.
    fn next_expiry(&self) -> Option<Instant> {
        let policy = self.gateway.current_policy();
        let now = jiff::Timestamp::now();
        let principal = policy.principal(&self.principal)?;
        let grants = policy
            .grants
            .iter()
            .filter(|g| g.principals.contains(&self.principal));
        let soonest = principal
            .expires_at
            .into_iter()
            .chain(grants.filter_map(|g| g.expires_at))
            .filter(|t| *t > now)
            .min()?;
        let wait = Duration::try_from(soonest.duration_since(now)).ok()?;
        Some(later(Instant::now(), wait))
    }
}

fn granted_names(granted: &Summary) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let caps = [
        (Capability::Fileops, !granted.fileops.is_empty()),
        (Capability::Shell, granted.shell),
        (Capability::Tools, !granted.tools.is_empty()),
        (Capability::Scripts, granted.scripts),
        (Capability::Resources, granted.resources),
    ];
    for (cap, on) in caps {
        if on {
            names.insert(cap.as_str().to_string());
        }
    }
    names
}

/// Why a request is answered without running.
struct Refusal {
    code: ErrorCode,
    message: String,
}

/// `start + wait`, or about thirty years on when that would overflow (a
/// limit in the config may be written as `"1000000000d"`).
fn later(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .or_else(|| start.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(start)
}

/// Drains the outbox into the socket. Consecutive records are written
/// together and flushed when the outbox runs dry.
async fn write_loop<S: AsyncRead + AsyncWrite + Unpin>(
    mut writer: RecordWriter<S>,
    mut outbox: mpsc::Receiver<Outbound>,
) {
    while let Some(item) = outbox.recv().await {
        let sent = match item {
            Outbound::Close { policy, reason } => {
                let _ = writer.flush().await;
                return writer.close(policy, &reason).await;
            }
            Outbound::Frame(frame) => send(&mut writer, encode_frame(frame), &outbox).await,
            Outbound::Record(chunk) => send(&mut writer, chunk.into_record(), &outbox).await,
            Outbound::Chunk { id, channel, data } => {
                let capacity = record::chunk_capacity(&id).max(1);
                for piece in data.chunks(capacity) {
                    let mut chunk = ChunkRecord::new(&id, channel, piece.len());
                    chunk.buffer().extend_from_slice(piece);
                    if !send(&mut writer, chunk.into_record(), &outbox).await {
                        return;
                    }
                }
                true
            }
        };
        if !sent {
            return;
        }
    }
    let _ = writer.flush().await;
}

/// Writes one record, flushing when nothing else is queued behind it.
/// False once the connection is gone.
async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    writer: &mut RecordWriter<S>,
    record: Vec<u8>,
    outbox: &mpsc::Receiver<Outbound>,
) -> bool {
    writer.send(record, outbox.is_empty()).await.is_ok()
}

fn encode_frame(frame: Frame) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256);
    if record::encode_frame(&frame, &mut buf).is_ok() {
        return buf;
    }
    // Only a result can be this large; answer with an error instead.
    let id = match &frame {
        Frame::Response(r) => r.id.clone(),
        _ => {
            return encode_frame(Frame::Event(Event {
                event: "relay.error".into(),
                payload: json!({"message": "an event was too large to send"}),
            }));
        }
    };
    let error = ErrorBody::new(
        ErrorCode::ProviderError,
        "the result is larger than one record (65519 bytes)",
    );
    buf.clear();
    let _ = record::encode_frame(&Frame::Response(Response::err(id, error)), &mut buf);
    buf
}

/// Waits for an operator to approve a parked call (see
/// `tools::approvals`) and records the outcome in its entry; once
/// approved, a long-running call leaves its start entry.
async fn approve(
    gateway: &Gateway,
    call: &Call,
    policy: ApprovalPolicy,
    record: &mut AuditRecord,
) -> Result<(), ErrorBody> {
    let ask = Ask::for_request(&call.principal, &call.request, policy);
    let timeout = gateway.config.approval_timeout;
    let outcome = gateway.approvals.obtain(ask, timeout, &call.cancel).await;
    record_outcome(record, &outcome);
    outcome?;
    if !LONG_RUNNING.contains(&call.request.method.as_str()) {
        return Ok(());
    }
    let start = AuditRecord {
        kind: Kind::RequestStart,
        ..record.clone()
    };
    gateway.audit.append(start).await.map(drop).map_err(|e| {
        error!("audit: {e}");
        ErrorBody::new(
            ErrorCode::ProviderError,
            "the audit log is unavailable, so nothing was run",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_the_clock_s_range_is_decades_away_not_a_panic() {
        let now = Instant::now();
        assert_eq!(
            later(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        let far = later(now, Duration::MAX);
        assert!(far >= now + Duration::from_secs(29 * 365 * 86_400));
        // A limit the config accepts, past what the clock can add.
        let limit = portcullis_policy::units::parse_duration("200000000000000d").unwrap();
        assert!(now.checked_add(limit).is_none());
        assert!(later(now, limit) > now);
    }
}

//! One session, from the WebSocket upgrade to its close:
//!
//! 1. Noise handshake (bounded by `handshake_timeout`; `handshake.rs`);
//! 2. authenticate: a token in message 3, else the client's static key;
//! 3. `hello` advertising only what the principal is granted (`hello.rs`);
//! 4. wait for the event `relay.accepted`;
//! 5. the request loop (here): every request from the peer, and every
//!    request a running call makes of its own, takes the one path in
//!    `admission.rs`, while the loop watches policy reloads and expiry
//!    (`reevaluate.rs`), the pause switch, operator kills and shutdown.
//!
//! Writing happens in a separate task fed by a bounded outbox
//! (`writer.rs`), so a slow peer slows only its own session.

mod admission;
mod handshake;
mod hello;
mod reevaluate;
mod to_runtime;
mod writer;

use handshake::authenticate;
pub use handshake::{
    Identity, Opened, envproto, envproto_over_websocket, over_websocket, plain_over_websocket,
};
pub use hello::capabilities_json;
use hello::{granted_names, tools_by_name};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use portcullis_policy::{Summary, summary};
use portcullis_store::{Health, Record as AuditRecord};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::provider::SessionResources;
use crate::provider::{
    Asked, Origin, Outbound, Outbox, OutputForm, Pause, Requests, STOPPED_BY_OPERATOR, Usage,
};
use crate::server::peer::Peer;
use crate::server::state::{Gateway, SessionInfo};
use portcullis_wire::channel::{ChannelError, RecordSink, RecordSource};
use portcullis_wire::frame::{
    self, ErrorBody, ErrorCode, Event, Frame, Heartbeat, Hello, PROTOCOL, Request, RequestId,
    Response,
};
use portcullis_wire::record::{self, Channel, Record, RecordError};

/// Records queued for the writer before producers wait.
const OUTBOX_CAPACITY: usize = 64;

/// What the request loop hears from its requests' tasks: one has
/// answered (its id is free again), or a running call asks something (a
/// request of its own, or one of the runtime).
enum Inbox {
    Done(RequestId),
    /// Boxed: every session's inbox holds a block of 32 of these.
    Asked(Box<Asked>),
}

type InboxSender = mpsc::UnboundedSender<Inbox>;

/// One session over any transport, from its opened channel to its close.
/// `started` is when the connection began (`relay.accepted` is due within
/// `handshake_timeout` of it).
pub async fn run<R, W>(
    gateway: Arc<Gateway>,
    accepted: Box<Opened<R, W>>,
    peer: Peer,
    started: Instant,
) where
    R: RecordSource,
    W: RecordSink,
{
    let limits = gateway.config.limits;
    let mut writer = accepted.writer;
    let policy = gateway.current_policy();
    // A local user whose principal has a token proves it in `initialize`
    // too (the 0.92 spec's socket profile: OS access control plus token).
    let token_due = matches!(accepted.identity, Identity::LocalUser { .. });
    let principal = match authenticate(&policy, &accepted.identity) {
        Ok(principal) => principal,
        Err(why) => {
            let who = accepted.identity.describe();
            warn!(%peer, identity = %who, "authentication refused: {why}");
            let detail = format!("peer {peer}, {who}: {why}");
            gateway.security_event("auth_refused", None, detail);
            return writer.close(true, "authentication failed").await;
        }
    };
    if *gateway.paused.borrow() == Pause::Stop {
        warn!(%peer, %principal, "refused: the gateway is stopped");
        gateway.security_event(
            "session_refused",
            Some(&principal),
            format!("peer {peer}: the gateway is stopped by its operator"),
        );
        return writer.close(true, STOPPED_BY_OPERATOR).await;
    }
    let token_due = token_due
        && policy
            .principals
            .iter()
            .any(|p| p.id == principal && p.token_sha256.is_some());
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
            .register(&principal, peer.clone(), limits.max_sessions_per_principal)
    else {
        warn!(%peer, %principal, "refused: too many sessions for this principal");
        return writer
            .close(true, "too many sessions for this principal")
            .await;
    };
    info!(%peer, %principal, session = guard.info.id, "session authenticated");

    let (outbox, outbox_rx) = mpsc::channel(OUTBOX_CAPACITY);
    let max_frame = gateway.config.limits.max_frame;
    // The writer boxed: a task's future would hold two copies of it.
    let in_flight = guard.info.in_flight.clone();
    let writer_task = tokio::spawn(writer::write_loop(
        Box::new(writer),
        outbox_rx,
        max_frame,
        in_flight,
    ));
    let (inbox, inbox_rx) = mpsc::unbounded_channel();
    let to_inbox = inbox.clone();
    let requests = Requests::new(move |asked| to_inbox.send(Inbox::Asked(Box::new(asked))).is_ok());
    let hello = Hello {
        protocol: PROTOCOL.to_string(),
        provider_id: Some(gateway.config.provider_id.clone()),
        // The spec's relay client is the provider: its id, not the peer's.
        client_id: Some(gateway.config.provider_id.clone()),
        client_kind: Some("portcullis".into()),
        client_version: Some(env!("CARGO_PKG_VERSION").into()),
        instance_id: Some(gateway.instance_id.clone()),
        principal: Some(principal.clone()),
        max_frame: Some(gateway.config.limits.max_frame as u64),
        capabilities: capabilities_json(&policy, &granted),
    };
    let tools = tools_by_name(&policy, &principal, jiff::Timestamp::now());
    let resources = SessionResources::new(outbox.clone());
    resources.set_granted(granted.max_resources);
    let origin = Arc::new(Origin {
        connection: guard.info.id,
        peer: guard.info.peer.to_string().into(),
    });
    let mut session = Session {
        gateway: gateway.clone(),
        record_base: record_base(&gateway, &guard.info, &origin, &principal),
        principal,
        origin,
        info: guard.info.clone(),
        outbox: outbox.clone(),
        in_flight: HashMap::new(),
        inputs: HashMap::new(),
        accepted: None,
        output: OutputForm::Frames,
        parts: record::Assembler::sharing(gateway.config.limits.max_frame, gateway.parts.clone()),
        token_due,
        awaiting_runtime: to_runtime::AwaitingRuntime::new(),
        tools,
        granted,
        end_reason: Arc::new(OnceLock::new()),
        // Moved in: a copy left here would hold the outbox open.
        resources,
        requests,
    };
    if outbox
        .send(Outbound::Frame(Box::new(Frame::Hello(hello))))
        .await
        .is_ok()
    {
        session
            .serve(accepted.reader, (inbox, inbox_rx), started)
            .await;
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
    /// How output is sent: `relay.accepted`'s `output` (frames unless it
    /// says `chunks`).
    output: OutputForm,
    /// A frame arriving in parts (a request larger than one record).
    parts: record::Assembler,
    /// What every entry of this session's requests says of where it came
    /// from (see [`record_base`]); its `connection_id` is the runtime's id
    /// for the connection once `relay.accepted` names one.
    record_base: AuditRecord,
    /// The principal's token must come with `relay.accepted` (the 0.92
    /// profile's `initialize`) before anything else is served.
    token_due: bool,
    /// Requests sent to the runtime, until it answers them.
    awaiting_runtime: to_runtime::AwaitingRuntime,
    granted: Summary,
    /// The tool descriptors the principal was last granted, by name.
    tools: BTreeMap<String, Value>,
    /// Set when the session ends for a reason other than a `cancel`: the
    /// answer cancelled requests get instead of `cancelled`.
    end_reason: Arc<OnceLock<ErrorBody>>,
    resources: SessionResources,
    /// Where this session's running calls send requests of their own.
    requests: Requests,
    /// Who this session is, for entries providers write of their own.
    origin: Arc<Origin>,
}

/// The fields every entry of a session's requests shares: the session, its
/// peer and principal, the gateway run, how the peer came. Made once per
/// session; each entry clones the strings' pointers.
fn record_base(
    gateway: &Gateway,
    info: &SessionInfo,
    origin: &Origin,
    principal: &str,
) -> AuditRecord {
    let provider: Arc<str> = gateway.config.provider_id.as_str().into();
    AuditRecord {
        kind: portcullis_store::Kind::Request,
        connection: Some(info.id),
        peer: Some(origin.peer.clone()),
        principal: Some(principal.into()),
        connection_id: Some(info.id.to_string().into()),
        client_id: Some(provider.clone()),
        provider_id: Some(provider),
        instance_id: Some(gateway.instance_id.as_str().into()),
        transport: Some(info.peer.transport().into()),
        profile: Some(info.peer.profile().into()),
        ..AuditRecord::default()
    }
}

/// A request being executed.
struct InFlight {
    cancel: CancellationToken,
    /// Decided again when the policy changes.
    request: Arc<Request>,
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
    async fn serve<R: RecordSource>(
        &mut self,
        mut reader: R,
        (done_tx, mut done_rx): (InboxSender, mpsc::UnboundedReceiver<Inbox>),
        started: Instant,
    ) {
        let limits = self.gateway.config.limits;
        let gateway = self.gateway.clone();
        let mut policy_rx = gateway.policy.subscribe();
        let mut paused_rx = gateway.paused.subscribe();
        let mut audit_rx = gateway.audit.watch_health();
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
                    if let Some(ending) = Box::pin(self.reevaluate()).await { break ending; }
                    expiry = self.next_expiry();
                    expiry_timer.as_mut().reset(expiry.unwrap_or_else(never));
                }
                () = &mut expiry_timer, if expiry.is_some() => {
                    if let Some(ending) = Box::pin(self.reevaluate()).await { break ending; }
                    expiry = self.next_expiry();
                    expiry_timer.as_mut().reset(expiry.unwrap_or_else(never));
                }
                Ok(()) = paused_rx.changed() => {
                    let pause = *paused_rx.borrow_and_update();
                    if pause == Pause::Stop {
                        break self.end(ErrorCode::PolicyBlocked, STOPPED_BY_OPERATOR, true);
                    }
                    let event = if pause == Pause::Soft { "provider.paused" } else { "provider.resumed" };
                    self.event(event, json!({"mode": pause.as_str()})).await;
                }
                Ok(()) = audit_rx.changed() => {
                    let health = audit_rx.borrow_and_update().clone();
                    match health {
                        Health::Stopped { reason, .. } => self.event("provider.audit_stopped", json!({"reason": reason})).await,
                        Health::Writing => self.event("provider.audit_resumed", json!({})).await,
                    }
                }
                Some(item) = done_rx.recv() => {
                    self.take_inbox(item, &done_tx, draining).await;
                    self.drain_inbox(&mut done_rx, &done_tx, draining).await;
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
                        // Ids freed by answers already sent first: the peer
                        // may reuse one in this record.
                        self.drain_inbox(&mut done_rx, &done_tx, draining).await;
                        if let Some(ending) = self.handle_record(plaintext, &done_tx, draining).await {
                            break ending;
                        }
                        // Answers sent meanwhile free their ids here, not
                        // in a turn of their own.
                        self.drain_inbox(&mut done_rx, &done_tx, draining).await;
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
                Ok(Some(Inbox::Done(id))) => self.finished(&id),
                // Ending: a call's own request is dropped unanswered, and
                // its caller hears that the session ended.
                Ok(Some(Inbox::Asked(_))) => {}
                _ => break,
            }
        }
        self.abandon_runtime_requests();
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

    /// One item of the inbox: an answer's id freed, or a call's own
    /// request taken.
    async fn take_inbox(&mut self, item: Inbox, done: &InboxSender, draining: bool) {
        let asked = match item {
            Inbox::Done(id) => return self.finished(&id),
            Inbox::Asked(asked) => *asked,
        };
        // Boxed, so that an idle session's future has no room for them.
        match asked {
            Asked::Session(nested) => Box::pin(self.handle_nested(*nested, done, draining)).await,
            Asked::Runtime(asked) => Box::pin(self.send_to_runtime(*asked)).await,
            Asked::RuntimeCancel { id, why } => Box::pin(self.runtime_cancelled(id, why)).await,
        }
    }

    /// [`take_inbox`](Self::take_inbox) for everything already queued.
    async fn drain_inbox(
        &mut self,
        inbox: &mut mpsc::UnboundedReceiver<Inbox>,
        done: &InboxSender,
        draining: bool,
    ) {
        while let Ok(item) = inbox.try_recv() {
            self.take_inbox(item, done, draining).await;
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
        let _ = self.outbox.send(Outbound::Frame(Box::new(frame))).await;
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

    /// Handles one record; `Some` when the session must end.
    async fn handle_record(
        &mut self,
        plaintext: Vec<u8>,
        done: &InboxSender,
        draining: bool,
    ) -> Option<Ending> {
        // Chunk data travels on as a slice of the record, not a copy.
        let plaintext = Bytes::from(plaintext);
        let joined;
        let (decoded, json) = match record::decode(&plaintext) {
            Ok(Record::Part(part)) => match self.parts.push(part) {
                None => return None,
                Some(Ok(json)) => {
                    joined = json;
                    let frame = frame::decode_frame(&joined).map_err(RecordError::from);
                    (frame.map(Record::Frame), &joined[..])
                }
                Some(Err(e)) => (Err(e), &[][..]),
            },
            other => (other, plaintext.get(1..).unwrap_or_default()),
        };
        match decoded {
            Ok(Record::Frame(Frame::Request(request))) => {
                self.handle_request(request, done, draining).await;
            }
            Ok(Record::Frame(Frame::Cancel(cancel))) => {
                if let Some(running) = self.in_flight.get(&cancel.id) {
                    running.cancel.cancel();
                }
                // The provider sees its input end (`None`) and cleans up.
                self.inputs.remove(&cancel.id);
            }
            Ok(Record::Frame(Frame::Ping(beat))) => self.send(Frame::Pong(beat)).await,
            Ok(Record::Frame(Frame::Response(response))) => self.runtime_answered(response),
            Ok(Record::Frame(Frame::Event(event))) if event.event == "relay.accepted" => {
                // Boxed (once per session), like the refusal below: an
                // idle session's future has no room for them.
                return Box::pin(self.accept(&event.payload)).await;
            }
            Ok(Record::Frame(other)) => debug!(session = self.info.id, "ignored frame: {other:?}"),
            Ok(Record::Chunk(chunk)) => {
                let data = plaintext.slice_ref(chunk.data);
                self.route_chunk(chunk, data).await;
            }
            Ok(Record::Part(_)) => {}
            Err(e) => {
                let salvaged =
                    frame::salvage_request_id(json).filter(|id| !self.in_flight.contains_key(id));
                let record = AuditRecord {
                    request_id: salvaged.as_ref().map(ToString::to_string),
                    detail: Some(e.to_string().chars().take(300).collect()),
                    ..self.session_record()
                };
                // Short of room for frames in parts is the gateway's
                // state, not the peer's mistake.
                let code = match e {
                    RecordError::PartsBudgetSpent { .. } => ErrorCode::ProviderError,
                    _ => ErrorCode::InvalidRequest,
                };
                Box::pin(self.record_refusal(record, code)).await;
                match salvaged {
                    Some(id) if matches!(e, RecordError::Frame(_)) => {
                        self.respond_error(id, ErrorCode::InvalidRequest, e.to_string())
                            .await;
                    }
                    _ => {
                        let payload = json!({"code": code.as_str(), "message": e.to_string()});
                        self.event("relay.error", payload).await;
                    }
                }
            }
        }
        None
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

    /// `relay.accepted`: what the runtime accepts. `Some` when it ends the
    /// session (a token that was due and not given).
    async fn accept(&mut self, payload: &Value) -> Option<Ending> {
        if self.token_due {
            let policy = self.gateway.current_policy();
            let proven = payload
                .get("token")
                .and_then(Value::as_str)
                .and_then(|token| portcullis_policy::principal_by_token(&policy, token))
                .is_some_and(|p| p.id == self.principal);
            if !proven {
                let detail = format!(
                    "peer {}: principal {} has a token_hash, and initialize did not carry its token",
                    self.info.peer, self.principal
                );
                warn!(session = self.info.id, "authentication refused: {detail}");
                self.gateway
                    .security_event("auth_refused", Some(&self.principal), detail);
                return Some(self.end(ErrorCode::PermissionDenied, "authentication failed", true));
            }
            self.token_due = false;
        }
        let Some(names) = payload
            .get("accepted_capabilities")
            .and_then(Value::as_array)
        else {
            let message =
                "relay.accepted needs payload.accepted_capabilities, an array of capability names";
            self.event(
                "relay.error",
                json!({"code": "invalid_request", "message": message}),
            )
            .await;
            return None;
        };
        self.output = match payload.get("output").and_then(Value::as_str) {
            Some("chunks") => OutputForm::Chunks,
            None | Some("frames") => OutputForm::Frames,
            Some(other) => {
                let message = format!(
                    "relay.accepted: output `{other}` is neither `frames` (the default) nor \
                     `chunks`; output goes as stream frames"
                );
                self.event(
                    "relay.error",
                    json!({"code": "invalid_request", "message": message}),
                )
                .await;
                OutputForm::Frames
            }
        };
        // The runtime's names for this connection and its clock: kept for
        // the audit log, and a skew worth knowing about is logged.
        let connection_id = payload
            .get("connection_id")
            .and_then(Value::as_str)
            .filter(|id| frame::is_short_name(id))
            .map_or_else(|| self.info.id.to_string(), str::to_string);
        self.record_base.connection_id = Some(connection_id.into());
        if let Some(time) = payload
            .get("server_time")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        {
            let skew = jiff::Timestamp::now().duration_since(time).as_secs().abs();
            if skew > 300 {
                warn!(
                    session = self.info.id,
                    "the runtime's clock differs from this host's by {skew} s"
                );
            }
        }
        let offered = granted_names(&self.granted);
        let accepted = names
            .iter()
            .filter_map(Value::as_str)
            .filter(|n| offered.contains(*n))
            .map(str::to_string)
            .collect();
        let first = self
            .gateway
            .providers
            .session_accepted(&self.principal, &accepted);
        self.accepted = Some(accepted);
        for event in first {
            self.event(&event.event, event.payload).await;
        }
        None
    }
}

/// `start + wait`, or about thirty years on when that would overflow (a
/// limit in the config may be written as `"1000000000d"`).
fn later(start: Instant, wait: Duration) -> Instant {
    start
        .checked_add(wait)
        .or_else(|| start.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(start)
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

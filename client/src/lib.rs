//! The Rust client library: connect to a gateway with a pinned key, read
//! its `hello`, accept capabilities, and make requests (with streaming and
//! cancellation). The bundled CLI and the end-to-end tests use it.
//!
//! ```no_run
//! # async fn demo(gateway_key: portcullis_crypto::PublicKey) -> Result<(), portcullis_client::ClientError> {
//! use portcullis_client::{Client, ClientOptions};
//! let identity = portcullis_crypto::StaticKeypair::generate().unwrap();
//! let client = Client::connect(ClientOptions::new("ws://127.0.0.1:7443", gateway_key, identity)).await?;
//! client.accept_all().await?;
//! let resources = client.request("resource.list", serde_json::json!({})).await?;
//! # Ok(()) }
//! ```
//!
//! Architecture invariant: this crate depends on `portcullis-wire`,
//! `portcullis-crypto`, tokio and rustls only — never on the daemon.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use portcullis_crypto::{PublicKey, StaticKeypair};
use serde_json::{Map, Value, json};
use thiserror::Error;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use zeroize::Zeroizing;

use portcullis_wire::channel::{self, ChannelError, RELAY_PATH};
use portcullis_wire::frame::{
    self, Cancel, ErrorBody, Event, Frame, Heartbeat, Hello, Request, RequestContext, RequestId,
    Response,
};
use portcullis_wire::record::{self, Channel, Record};

pub mod config;
mod files;
pub mod listen;
pub mod tls;

pub use files::UploadOptions;
/// The wire types this library's API speaks in.
pub use portcullis_wire as wire;

pub struct ClientOptions {
    /// `ws://host:port`, optionally with the relay path.
    pub url: String,
    /// The gateway's static key: the handshake stops before sending
    /// credentials if the gateway proves another one.
    pub gateway_key: PublicKey,
    /// This client's static key (the principal's identity, unless a token is
    /// given).
    pub identity: StaticKeypair,
    pub token: Option<Zeroizing<String>>,
    pub timeout: Duration,
    /// For `wss://`: the CA certificate(s), PEM, that the gateway's TLS
    /// certificate must chain to. Required for `wss://`.
    pub tls_ca: Option<std::path::PathBuf>,
    /// Events held for [`Client::next_event`] before newer ones are
    /// counted as lost (and reported as [`EVENTS_LOST`]) rather than
    /// stall responses behind them.
    pub event_queue: usize,
    /// The largest frame taken or sent in parts (a result larger than one
    /// record): past it a request is refused here, and a response dropped.
    pub max_frame: usize,
}

/// The event [`Client::next_event`] yields where events were lost because
/// its queue was full: `payload.count` says how many, and it stands where
/// they would have been.
pub const EVENTS_LOST: &str = "client.events_lost";

impl ClientOptions {
    pub fn new(url: &str, gateway_key: PublicKey, identity: StaticKeypair) -> Self {
        Self {
            url: url.to_string(),
            gateway_key,
            identity,
            token: None,
            timeout: Duration::from_secs(10),
            tls_ca: None,
            event_queue: 256,
            max_frame: record::DEFAULT_MAX_FRAME,
        }
    }
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error(
        "invalid gateway URL `{0}`: expected ws://HOST:PORT or wss://HOST:PORT, optionally with /api/v1/relay/connect"
    )]
    Url(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(transparent)]
    TlsSetup(#[from] tls::TlsError),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("WebSocket upgrade failed: {0}")]
    Upgrade(String),
    #[error("{0}")]
    Channel(#[from] ChannelError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("timed out")]
    Timeout,
    #[error("{}: {}", serde_json::to_value(.0.code).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(), .0.message)]
    Remote(ErrorBody),
    #[error("disconnected: {0}")]
    Disconnected(String),
}

/// Something that arrived for a request before its response.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    Stream { event: String, data: Value },
    Chunk { channel: Channel, data: Bytes },
}

/// What the event queue holds: an event, or how many were lost at this
/// place because the queue was full.
enum Queued {
    Event(Event),
    Lost(u64),
}

/// The reader's side of the event queue: it never waits for the
/// application (a response behind an unread event would stall), so a full
/// queue loses events and says how many, in place.
struct EventQueue {
    tx: mpsc::Sender<Queued>,
    /// Lost since the last report; [`Client::next_event`] reports them
    /// itself once it has read everything queued before them.
    unreported: Arc<AtomicU64>,
    /// Lost in all.
    lost: Arc<AtomicU64>,
}

impl EventQueue {
    fn push(&mut self, event: Event) {
        let unreported = self.unreported.swap(0, Ordering::AcqRel);
        if unreported > 0 && self.tx.try_send(Queued::Lost(unreported)).is_err() {
            self.unreported.fetch_add(unreported, Ordering::AcqRel);
            return self.lose();
        }
        if self.tx.try_send(Queued::Event(event)).is_err() {
            self.lose();
        }
    }

    fn lose(&mut self) {
        self.unreported.fetch_add(1, Ordering::AcqRel);
        self.lost.fetch_add(1, Ordering::Relaxed);
    }
}

struct Pending {
    response: oneshot::Sender<Response>,
    stream: mpsc::Sender<StreamItem>,
}

#[derive(Default)]
struct Shared {
    pending: HashMap<RequestId, Pending>,
    pings: HashMap<String, oneshot::Sender<()>>,
    /// The reader has ended: nothing will answer a request or a ping
    /// registered from now on, so none is (it fails at once instead of
    /// waiting forever).
    ended: bool,
}

pub struct Client {
    hello: Hello,
    gateway_info: Value,
    outbox: mpsc::Sender<Vec<u8>>,
    shared: Arc<Mutex<Shared>>,
    events: tokio::sync::Mutex<mpsc::Receiver<Queued>>,
    events_lost: Arc<AtomicU64>,
    events_unreported: Arc<AtomicU64>,
    next_id: AtomicU64,
    closed: watch::Receiver<Option<String>>,
    /// Set by [`Client::close`]: the reader and the writer stop.
    closing: watch::Sender<bool>,
    reader_task: tokio::task::JoinHandle<()>,
    max_frame: usize,
}

impl Drop for Client {
    /// Dropping the client closes the connection: the writer sends a close
    /// frame once the outbox is gone, and the reader stops here.
    fn drop(&mut self) {
        self.reader_task.abort();
    }
}

impl Client {
    /// Connects, runs the handshake and reads the gateway's `hello`.
    pub async fn connect(options: ClientOptions) -> Result<Self, ClientError> {
        let limit = options.timeout;
        tokio::time::timeout(limit, Self::connect_inner(options))
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    async fn connect_inner(options: ClientOptions) -> Result<Self, ClientError> {
        let target = parse_url(&options.url)?;
        let tcp =
            TcpStream::connect(&target.addr)
                .await
                .map_err(|source| ClientError::Connect {
                    addr: target.addr.clone(),
                    source,
                })?;
        let _ = tcp.set_nodelay(true);
        if !target.tls {
            return Self::over(tcp, &target.url, options).await;
        }
        let ca = options.tls_ca.as_deref().ok_or_else(|| {
            ClientError::Tls(
                "wss:// needs the CA certificate that signed the gateway's certificate (--tls-ca)"
                    .into(),
            )
        })?;
        let connector = tls::connector(ca)?;
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|_| ClientError::Url(options.url.clone()))?;
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        Self::over(tls, &target.url, options).await
    }

    /// The WebSocket upgrade, the handshake and the hello over `stream`.
    async fn over<S>(stream: S, url: &str, options: ClientOptions) -> Result<Self, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let request = url
            .into_client_request()
            .map_err(|e| ClientError::Upgrade(e.to_string()))?;
        let (ws, _) = tokio_tungstenite::client_async_with_config(
            request,
            stream,
            Some(channel::client_ws_config()),
        )
        .await
        .map_err(|e| ClientError::Upgrade(e.to_string()))?;
        Self::over_websocket(ws, options).await
    }

    /// The handshake (as the Noise initiator, the gateway's key pinned) and
    /// the hello over an upgraded WebSocket, whichever side opened the TCP
    /// connection: the client dialed the gateway, or the gateway dialed a
    /// [`listen::ProviderListener`].
    async fn over_websocket<S>(
        ws: tokio_tungstenite::WebSocketStream<S>,
        options: ClientOptions,
    ) -> Result<Self, ClientError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let credentials = match &options.token {
            Some(token) => {
                Zeroizing::new(json!({ "token": token.as_str() }).to_string().into_bytes())
            }
            None => Zeroizing::new(b"{}".to_vec()),
        };
        let connected =
            channel::connect(ws, &options.identity, options.gateway_key, &credentials).await?;
        let gateway_info = serde_json::from_slice(&connected.gateway_info).unwrap_or(Value::Null);
        let (mut writer, mut reader) = (connected.writer, connected.reader);
        let max_frame = options.max_frame;

        let first = reader.recv().await?;
        let hello = match record::decode(&first) {
            Ok(Record::Frame(Frame::Hello(hello))) => hello,
            Ok(other) => {
                return Err(ClientError::Protocol(format!(
                    "expected hello first, got {other:?}"
                )));
            }
            Err(e) => return Err(ClientError::Protocol(format!("expected hello first: {e}"))),
        };

        let (outbox, mut outbox_rx) = mpsc::channel::<Vec<u8>>(64);
        let (events_tx, events_rx) = mpsc::channel(options.event_queue.max(1));
        let (events_lost, events_unreported) = (Arc::default(), Arc::default());
        let mut events_tx = EventQueue {
            tx: events_tx,
            unreported: Arc::clone(&events_unreported),
            lost: Arc::clone(&events_lost),
        };
        let (closed_tx, closed) = watch::channel(None);
        let (closing, closing_rx) = watch::channel(false);
        let shared = Arc::new(Mutex::new(Shared::default()));

        let mut writer_closing = closing_rx.clone();
        let writer_shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    rec = outbox_rx.recv() => {
                        // None: every sender is gone, the client was dropped.
                        let Some(rec) = rec else { break };
                        let others = || {
                            writer_shared
                                .lock()
                                .is_ok_and(|shared| shared.pending.len() > 1)
                        };
                        let flush = channel::nothing_behind(&outbox_rx, others).await;
                        if writer.send(rec, flush).await.is_err() {
                            return;
                        }
                    }
                    () = asked_to_close(&mut writer_closing) => break,
                }
            }
            writer
                .close(false, "the client closed the connection")
                .await;
        });
        let mut reader_closing = closing_rx;
        let (reader_shared, reader_outbox) = (shared.clone(), outbox.clone());
        let reader_task = tokio::spawn(async move {
            let buffers = channel::BufferPool::default();
            let mut parts = record::Assembler::new(max_frame);
            let reason = loop {
                let received = tokio::select! {
                    received = reader.recv_pooled(&buffers) => received,
                    () = asked_to_close(&mut reader_closing) => {
                        break "the client closed the connection".to_string();
                    }
                };
                match received {
                    Ok(plaintext) => {
                        let (shared, outbox) = (&reader_shared, &reader_outbox);
                        route(plaintext, shared, &mut events_tx, outbox, &mut parts).await
                    }
                    Err(e) => break e.to_string(),
                }
            };
            // Dropping the senders fails every pending request.
            if let Ok(mut shared) = reader_shared.lock() {
                shared.ended = true;
                shared.pending.clear();
                shared.pings.clear();
            }
            let _ = closed_tx.send(Some(reason));
        });
        // What the gateway takes, if it says.
        let sent_max = hello
            .max_frame
            .and_then(|m| usize::try_from(m).ok())
            .map_or(max_frame, |m| m.min(max_frame));
        Ok(Self {
            hello,
            gateway_info,
            outbox,
            shared,
            events: tokio::sync::Mutex::new(events_rx),
            events_lost,
            events_unreported,
            next_id: AtomicU64::new(1),
            closed,
            closing,
            reader_task,
            max_frame: sent_max,
        })
    }

    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The gateway's description from handshake message 2.
    pub fn gateway_info(&self) -> &Value {
        &self.gateway_info
    }

    /// Capabilities named in the hello.
    pub fn offered(&self) -> Vec<String> {
        self.hello.capabilities.keys().cloned().collect()
    }

    /// Sends `relay.accepted` for these capabilities, asking for output
    /// as binary chunks ([`StreamItem::Chunk`]), the fast path.
    pub async fn accept(&self, capabilities: &[&str]) -> Result<(), ClientError> {
        self.accept_output(capabilities, "chunks").await
    }

    /// Sends `relay.accepted` for these capabilities, with output as
    /// `output` says: `chunks`, or `frames` (`stream` frames as the relay
    /// spec sends them, [`StreamItem::Stream`]).
    pub async fn accept_output(
        &self,
        capabilities: &[&str],
        output: &str,
    ) -> Result<(), ClientError> {
        let event = Event {
            event: "relay.accepted".into(),
            payload: json!({ "accepted_capabilities": capabilities, "output": output }),
        };
        self.send(Frame::Event(event)).await
    }

    /// Accepts everything the hello offers.
    pub async fn accept_all(&self) -> Result<(), ClientError> {
        let offered = self.offered();
        let names: Vec<&str> = offered.iter().map(String::as_str).collect();
        self.accept(&names).await
    }

    /// Sends any frame as-is (tests use this to misbehave on purpose); one
    /// larger than a record goes in parts.
    pub async fn send(&self, frame: Frame) -> Result<(), ClientError> {
        let records = record::encode_frame_records(&frame, self.max_frame)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        for record in records {
            self.send_record(record).await?;
        }
        Ok(())
    }

    /// Sends a plaintext record as-is, sealed.
    pub async fn send_record(&self, record: Vec<u8>) -> Result<(), ClientError> {
        self.outbox
            .send(record)
            .await
            .map_err(|_| self.disconnected())
    }

    /// Starts a request with a fresh id.
    pub async fn start(
        &self,
        method: &str,
        params: Value,
    ) -> Result<RequestHandle<'_>, ClientError> {
        let id = RequestId::new(format!("c{}", self.next_id.fetch_add(1, Ordering::Relaxed)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.start_with_id(id, method, params).await
    }

    /// Starts a request with a fresh id and a `context` (the agent's
    /// session, run and tool-call ids; `ask_once_per_run` approvals are
    /// remembered per `run_id`).
    pub async fn start_with_context(
        &self,
        context: RequestContext,
        method: &str,
        params: Value,
    ) -> Result<RequestHandle<'_>, ClientError> {
        let id = RequestId::new(format!("c{}", self.next_id.fetch_add(1, Ordering::Relaxed)))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.send_request(id, method, params, Some(context)).await
    }

    /// Starts a request with a chosen id.
    pub async fn start_with_id(
        &self,
        id: RequestId,
        method: &str,
        params: Value,
    ) -> Result<RequestHandle<'_>, ClientError> {
        self.send_request(id, method, params, None).await
    }

    async fn send_request(
        &self,
        id: RequestId,
        method: &str,
        params: Value,
        context: Option<RequestContext>,
    ) -> Result<RequestHandle<'_>, ClientError> {
        let params = match params {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(ClientError::Protocol("params must be a JSON object".into())),
        };
        let (response_tx, response) = oneshot::channel();
        let (stream_tx, stream) = mpsc::channel(256);
        if let Ok(mut shared) = self.shared.lock() {
            if shared.ended {
                return Err(self.disconnected());
            }
            shared.pending.insert(
                id.clone(),
                Pending {
                    response: response_tx,
                    stream: stream_tx,
                },
            );
        }
        let request = Request {
            id: id.clone(),
            method: method.to_string(),
            params,
            context,
        };
        self.send(Frame::Request(request)).await?;
        Ok(RequestHandle {
            id,
            client: self,
            response,
            stream,
            early: None,
        })
    }

    /// A request and its result; stream items are discarded.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, ClientError> {
        self.start(method, params).await?.response().await
    }

    /// A relay-level ping; returns the round-trip time.
    pub async fn ping(&self) -> Result<Duration, ClientError> {
        let id = format!("p{}", self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        if let Ok(mut shared) = self.shared.lock() {
            if shared.ended {
                return Err(self.disconnected());
            }
            shared.pings.insert(id.clone(), tx);
        }
        let started = Instant::now();
        self.send(Frame::Ping(Heartbeat {
            id: Some(id),
            ts: Some(jiff::Timestamp::now().to_string()),
        }))
        .await?;
        rx.await.map_err(|_| self.disconnected())?;
        Ok(started.elapsed())
    }

    /// The next event from the gateway, or `None` after `wait`. Where
    /// events were lost because the queue was full
    /// ([`ClientOptions::event_queue`]), an [`EVENTS_LOST`] event stands
    /// in their place with their `count`.
    pub async fn next_event(&self, wait: Duration) -> Option<Event> {
        let mut events = self.events.lock().await;
        let queued = match events.try_recv() {
            Ok(queued) => queued,
            // Everything queued before the losses has been read.
            Err(_) => match self.events_unreported.swap(0, Ordering::AcqRel) {
                0 => tokio::time::timeout(wait, events.recv()).await.ok()??,
                lost => Queued::Lost(lost),
            },
        };
        match queued {
            Queued::Event(event) => Some(event),
            Queued::Lost(count) => Some(Event {
                event: EVENTS_LOST.into(),
                payload: json!({ "count": count }),
            }),
        }
    }

    /// How many events were lost in all because the queue was full.
    pub fn events_lost(&self) -> u64 {
        self.events_lost.load(Ordering::Relaxed)
    }

    /// Closes the connection now, whoever else holds this client: every
    /// request still waiting fails as disconnected, and the gateway sees a
    /// close frame (it ends what the session started, as on any
    /// disconnect).
    pub fn close(&self) {
        let _ = self.closing.send(true);
    }

    /// Resolves with the reason once the connection has ended.
    pub async fn closed(&self) -> String {
        let mut closed = self.closed.clone();
        loop {
            if let Some(reason) = closed.borrow_and_update().clone() {
                return reason;
            }
            if closed.changed().await.is_err() {
                return "the connection ended".into();
            }
        }
    }

    fn disconnected(&self) -> ClientError {
        ClientError::Disconnected(
            self.closed
                .borrow()
                .clone()
                .unwrap_or_else(|| "the connection ended".into()),
        )
    }
}

/// Resolves once [`Client::close`] was called or the client is gone.
async fn asked_to_close(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|closing| *closing).await;
}

/// One request in flight.
pub struct RequestHandle<'c> {
    pub id: RequestId,
    client: &'c Client,
    response: oneshot::Receiver<Response>,
    stream: mpsc::Receiver<StreamItem>,
    early: Option<Response>,
}

impl RequestHandle<'_> {
    /// The next stream item, or `None` once the response has arrived.
    pub async fn next(&mut self) -> Option<StreamItem> {
        self.stream.recv().await
    }

    /// Asks the gateway to stop this request; its response says `cancelled`.
    pub async fn cancel(&self) -> Result<(), ClientError> {
        self.client
            .send(Frame::Cancel(Cancel {
                id: self.id.clone(),
                reason: Some("user_cancelled".into()),
            }))
            .await
    }

    /// Whether the terminal response has arrived (it is kept for
    /// [`response`](Self::response)).
    pub fn finished(&mut self) -> bool {
        if self.early.is_none()
            && let Ok(response) = self.response.try_recv()
        {
            self.early = Some(response);
        }
        self.early.is_some()
    }

    /// Waits for the terminal response. Stream items not yet read are
    /// discarded (and no longer held up).
    pub async fn response(self) -> Result<Value, ClientError> {
        let disconnected = || self.client.disconnected();
        drop(self.stream);
        let response = match self.early {
            Some(response) => Ok(response),
            None => self.response.await,
        };
        match response {
            Ok(Response {
                result: Some(result),
                ..
            }) => Ok(result),
            Ok(Response {
                error: Some(error), ..
            }) => Err(ClientError::Remote(error)),
            Ok(_) => Err(ClientError::Protocol(
                "a response without result or error".into(),
            )),
            Err(_) => Err(disconnected()),
        }
    }
}

async fn route(
    plaintext: Bytes,
    shared: &Mutex<Shared>,
    events: &mut EventQueue,
    outbox: &mpsc::Sender<Vec<u8>>,
    parts: &mut record::Assembler,
) {
    let lock = || shared.lock().ok();
    let joined;
    let decoded = match record::decode(&plaintext) {
        Ok(Record::Part(part)) => match parts.push(part) {
            None => return,
            Some(Ok(json)) => {
                joined = json;
                frame::decode_frame(&joined)
                    .map(Record::Frame)
                    .map_err(Into::into)
            }
            Some(Err(e)) => Err(e),
        },
        other => other,
    };
    // A chunk's data is handed on as a slice of the record, not copied.
    match decoded {
        Ok(Record::Frame(Frame::Response(response))) => {
            if let Some(pending) = lock().and_then(|mut s| s.pending.remove(&response.id)) {
                let _ = pending.response.send(response);
            }
        }
        Ok(Record::Frame(Frame::Stream(stream))) => {
            let sender = lock().and_then(|s| s.pending.get(&stream.id).map(|p| p.stream.clone()));
            if let Some(sender) = sender {
                let _ = sender
                    .send(StreamItem::Stream {
                        event: stream.event,
                        data: stream.data,
                    })
                    .await;
            }
        }
        Ok(Record::Chunk(chunk)) => {
            let id = RequestId::new(chunk.request_id).ok();
            let sender =
                id.and_then(|id| lock().and_then(|s| s.pending.get(&id).map(|p| p.stream.clone())));
            if let Some(sender) = sender {
                let _ = sender
                    .send(StreamItem::Chunk {
                        channel: chunk.channel,
                        data: plaintext.slice_ref(chunk.data),
                    })
                    .await;
            }
        }
        Ok(Record::Frame(Frame::Event(event))) => {
            events.push(event);
        }
        Ok(Record::Frame(Frame::Ping(beat))) => {
            let mut buf = Vec::new();
            if record::encode_frame(&Frame::Pong(beat), &mut buf).is_ok() {
                let _ = outbox.send(buf).await;
            }
        }
        Ok(Record::Frame(Frame::Pong(beat))) => {
            if let Some(waiter) = beat
                .id
                .and_then(|id| lock().and_then(|mut s| s.pings.remove(&id)))
            {
                let _ = waiter.send(());
            }
        }
        Ok(Record::Frame(_) | Record::Part(_)) | Err(_) => {}
    }
}

/// Where and how to connect, from a `ws://` or `wss://` URL.
struct UrlTarget {
    /// `host:port` for the TCP connection.
    addr: String,
    /// The host alone, for TLS server name checks.
    host: String,
    /// The full URL with the relay path.
    url: String,
    tls: bool,
}

fn parse_url(url: &str) -> Result<UrlTarget, ClientError> {
    let (tls, rest) = match (url.strip_prefix("ws://"), url.strip_prefix("wss://")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => return Err(ClientError::Url(url.to_string())),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
        _ => return Err(ClientError::Url(url.to_string())),
    };
    let path = if path.is_empty() || path == "/" {
        RELAY_PATH
    } else {
        path
    };
    let scheme = if tls { "wss" } else { "ws" };
    Ok(UrlTarget {
        addr: authority.to_string(),
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        url: format!("{scheme}://{authority}{path}"),
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("ws://127.0.0.1:7443").unwrap().url,
            "ws://127.0.0.1:7443/api/v1/relay/connect"
        );
        assert_eq!(
            parse_url("ws://h:1/api/v1/relay/connect").unwrap().addr,
            "h:1"
        );
        let secure = parse_url("wss://gateway.example:443").unwrap();
        assert!(secure.tls);
        assert_eq!(secure.host, "gateway.example");
        assert_eq!(secure.url, "wss://gateway.example:443/api/v1/relay/connect");
        assert_eq!(parse_url("ws://[::1]:7443").unwrap().host, "::1");
        assert!(parse_url("http://h:1").is_err());
        assert!(parse_url("ws://nohost").is_err());
        assert!(parse_url("ws://h:notaport").is_err());
    }
}

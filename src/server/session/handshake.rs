//! The Noise handshake over an upgraded WebSocket, and who the client is:
//! a token in message 3, else its authenticated static key.

use std::sync::Arc;

use portcullis_policy::{Policy, principal_by_key, principal_by_token, principal_status};
use portcullis_wire::channel::{self, RecordReader, RecordWriter};
use portcullis_wire::frame::PROTOCOL;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, timeout};
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use super::run;
use crate::server::peer::Peer;
use crate::server::state::Gateway;

/// A channel whose handshake is done: what a transport hands a session.
pub struct Opened<R, W> {
    pub reader: R,
    pub writer: W,
    pub identity: Identity,
}

/// Who the peer proved to be, as far as the transport can say.
pub enum Identity {
    /// The Noise channel: the client's authenticated static key, and what
    /// it sent to authenticate (`{}` or `{"token": …}`; zeroized on drop).
    Noise {
        client_key: portcullis_crypto::PublicKey,
        credentials: zeroize::Zeroizing<Vec<u8>>,
    },
    /// The plain profile: the principal the operator configured for the
    /// endpoint, whose TLS certificate the gateway checked; and stdio's
    /// parent process.
    Configured { principal: String },
    /// A process on this host, on the environment socket: the principal
    /// whose `unix_uid` is its user. A principal that also has a
    /// `token_hash` must present that token in `initialize` as well.
    LocalUser { principal: String, uid: u32 },
}

impl Identity {
    /// As logs and security events name it.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Noise { client_key, .. } => format!("key {}", client_key.fingerprint()),
            Self::Configured { principal } => format!("configured principal {principal}"),
            Self::LocalUser { principal, uid } => format!("uid {uid} as {principal}"),
        }
    }
}

/// The Noise handshake over an upgraded WebSocket (bounded by
/// `handshake_timeout`), then the session. A failed handshake is a
/// security event. Says whether the handshake succeeded (the peer proved
/// a key).
pub async fn over_websocket<S>(gateway: Arc<Gateway>, ws: WebSocketStream<S>, peer: Peer) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    match handshake(&gateway, ws, &peer).await {
        Some(opened) => {
            run(gateway, opened, peer, started).await;
            true
        }
        None => false,
    }
}

/// A plain-profile WebSocket (no handshake: its TLS was checked when it
/// was opened), then the session as `principal`.
pub async fn plain_over_websocket<S>(
    gateway: Arc<Gateway>,
    ws: WebSocketStream<S>,
    peer: Peer,
    principal: String,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (writer, reader) = portcullis_wire::plain::split(ws, gateway.config.limits.max_frame);
    let opened = Box::new(Opened {
        reader,
        writer,
        identity: Identity::Configured { principal },
    });
    run(gateway, opened, peer, started).await;
    true
}

/// A ya-environment-protocol.v1 channel (stdio, a Unix socket) whose
/// peer the transport has already identified as `principal`, then the
/// session, the same as any other.
pub async fn envproto<S, K>(
    gateway: Arc<Gateway>,
    source: S,
    sink: K,
    peer: Peer,
    identity: Identity,
) where
    S: portcullis_wire::envproto::MessageSource,
    K: portcullis_wire::envproto::MessageSink + 'static,
{
    envproto_session(gateway, source, sink, peer, identity, Instant::now()).await;
}

/// ya-environment-protocol.v1 inside the Noise channel: the handshake
/// and authentication of [`over_websocket`], then JSON-RPC messages in
/// its records. Says whether the handshake succeeded.
pub async fn envproto_over_websocket<S>(
    gateway: Arc<Gateway>,
    ws: WebSocketStream<S>,
    peer: Peer,
) -> bool
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use portcullis_wire::envproto::{RecordMessageSink, RecordMessages};
    let started = Instant::now();
    let Some(opened) = handshake(&gateway, ws, &peer).await else {
        return false;
    };
    let Opened {
        reader,
        writer,
        identity,
    } = *opened;
    let limit = gateway.config.limits.max_frame;
    let parts = portcullis_wire::record::Assembler::sharing(limit, gateway.parts.clone());
    let source = RecordMessages::new(reader, parts);
    let sink = RecordMessageSink::new(writer);
    envproto_session(gateway, source, sink, peer, identity, started).await;
    true
}

async fn envproto_session<S, K>(
    gateway: Arc<Gateway>,
    source: S,
    sink: K,
    peer: Peer,
    identity: Identity,
    started: Instant,
) where
    S: portcullis_wire::envproto::MessageSource,
    K: portcullis_wire::envproto::MessageSink + 'static,
{
    let (writer, reader) =
        portcullis_wire::envproto::split(source, sink, gateway.config.limits.max_frame);
    let opened = Box::new(Opened {
        reader,
        writer,
        identity,
    });
    run(gateway, opened, peer, started).await;
}

/// The handshake on its own, so that nothing of it stays in the session's
/// future. (Boxed: a value moved into an awaited call stays in the
/// caller's future as well, rust-lang/rust#62958, here for the session's
/// life.)
async fn handshake<S>(
    gateway: &Gateway,
    ws: WebSocketStream<S>,
    peer: &Peer,
) -> Option<Box<Opened<RecordReader<S>, RecordWriter<S>>>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let info = gateway_info(gateway);
    let limit = gateway.config.limits.handshake_timeout;
    match timeout(limit, channel::accept(ws, &gateway.key, &info)).await {
        Ok(Ok(accepted)) => Some(Box::new(Opened {
            reader: accepted.reader,
            writer: accepted.writer,
            identity: Identity::Noise {
                client_key: accepted.client_key,
                credentials: accepted.credentials,
            },
        })),
        Ok(Err(e)) => {
            debug!(%peer, "handshake failed: {e}");
            let detail = format!("peer {peer}: {e}");
            gateway.security_event("handshake_failed", None, detail);
            None
        }
        Err(_) => {
            debug!(%peer, "handshake timed out");
            let detail = format!("peer {peer}: timed out");
            gateway.security_event("handshake_failed", None, detail);
            None
        }
    }
}

/// Message 2's payload: who this gateway is.
pub(super) fn gateway_info(gateway: &Gateway) -> Vec<u8> {
    let info = json!({
        "provider_id": gateway.config.provider_id,
        "protocol": PROTOCOL,
        "instance_id": gateway.instance_id,
        "version": env!("CARGO_PKG_VERSION"),
    });
    info.to_string().into_bytes()
}

/// Why a handshake's credentials named no principal: for the log and the
/// audit's `auth_refused` event, never for the peer.
#[derive(Debug, thiserror::Error)]
pub(super) enum AuthError {
    #[error("message 3 payload is not a JSON object")]
    NotAnObject,
    #[error("`token` is not a string")]
    TokenNotAString,
    #[error("unknown token")]
    UnknownToken,
    #[error("unknown client key")]
    UnknownKey,
    /// The principal exists but may not connect now (disabled, expired, …).
    #[error("{0}")]
    NotActive(String),
}

/// A token in message 3 names the principal; without one, the client's
/// authenticated static key does. A configured principal is taken as it
/// is, if it may act now.
pub(super) fn authenticate(policy: &Policy, identity: &Identity) -> Result<String, AuthError> {
    let (key, credentials) = match identity {
        Identity::Noise {
            client_key,
            credentials,
        } => (client_key, credentials),
        Identity::Configured { principal } | Identity::LocalUser { principal, .. } => {
            principal_status(policy, principal, jiff::Timestamp::now())
                .map_err(|(_, rule)| AuthError::NotActive(rule))?;
            return Ok(principal.clone());
        }
    };
    let credentials: Map<String, Value> =
        serde_json::from_slice(credentials).map_err(|_| AuthError::NotAnObject)?;
    let principal = match credentials.get("token") {
        Some(Value::String(token)) => {
            principal_by_token(policy, token).ok_or(AuthError::UnknownToken)?
        }
        Some(_) => return Err(AuthError::TokenNotAString),
        None => principal_by_key(policy, key.as_bytes()).ok_or(AuthError::UnknownKey)?,
    };
    principal_status(policy, &principal.id, jiff::Timestamp::now())
        .map_err(|(_, rule)| AuthError::NotActive(rule))?;
    Ok(principal.id.clone())
}

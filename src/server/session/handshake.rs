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
    /// The client's authenticated static key.
    pub client_key: portcullis_crypto::PublicKey,
    /// What the client sent to authenticate (`{}` or `{"token": …}`);
    /// zeroized on drop.
    pub credentials: zeroize::Zeroizing<Vec<u8>>,
}

/// The Noise handshake over an upgraded WebSocket (bounded by
/// `handshake_timeout`), then the session. A failed handshake is a
/// security event.
pub async fn over_websocket<S>(gateway: Arc<Gateway>, ws: WebSocketStream<S>, peer: Peer)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    if let Some(opened) = handshake(&gateway, ws, &peer).await {
        run(gateway, opened, peer, started).await
    }
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
            client_key: accepted.client_key,
            credentials: accepted.credentials,
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
/// authenticated static key does.
pub(super) fn authenticate(
    policy: &Policy,
    key: &portcullis_crypto::PublicKey,
    credentials: &[u8],
) -> Result<String, AuthError> {
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

//! Dial-out: the gateway connects to each runtime relay endpoint of the
//! config (`[[relay]]`), as the relay spec's primary topology has it, and
//! serves one session at a time on each connection — the same session as
//! an accepted connection's: the gateway is still the Noise responder (the
//! runtime sends message 1 after the upgrade and proves its principal's
//! key in message 3), so TCP direction and Noise roles are independent.
//! The bearer token authenticates the gateway to the endpoint; the Noise
//! keys authenticate the two ends to each other.
//!
//! A lost or refused connection is retried with exponential backoff and
//! jitter, capped, reset once a connection stayed up for a while or its
//! runtime authenticated. A token
//! the endpoint refuses (401, 403) stops the retries until the next
//! reload. Each attempt's failure is logged and audited (`relay_failed`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tracing::{info, warn};
use zeroize::Zeroizing;

use super::Gateway;
use super::peer::Peer;
use super::session;
use crate::config::RelayEndpoint;
use portcullis_wire::channel::ws_config;
use portcullis_wire::read_ahead::ReadAhead;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

/// The first wait after a failure, and the longest.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// A connection up this long resets the backoff.
const HEALTHY: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What `portcullis status` shows of one endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointStatus {
    pub url: String,
    /// `connecting`, `connected`, `waiting` (to retry), `token_refused`
    /// (until a reload), `stopped`.
    pub state: &'static str,
    /// Attempts since the last healthy connection.
    pub attempts: u64,
    pub connections: u64,
    pub last_error: Option<String>,
    /// RFC 3339, while connected.
    pub connected_since: Option<String>,
}

/// One endpoint's status, shared with the admin socket.
pub type Endpoint = Arc<Mutex<EndpointStatus>>;

pub fn endpoint(url: &str) -> Endpoint {
    Arc::new(Mutex::new(EndpointStatus {
        url: url.to_string(),
        state: "connecting",
        attempts: 0,
        connections: 0,
        last_error: None,
        connected_since: None,
    }))
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("the bearer token: {0}")]
    Token(String),
    #[error("the endpoint refused the bearer token ({0})")]
    TokenRefused(u16),
    #[error("{0}")]
    Failed(String),
}

/// Dials `config.relays[index]` until the gateway shuts down.
pub async fn dial(gateway: Arc<Gateway>, index: usize) {
    let (Some(relay), Some(status)) = (
        gateway.config.relays.get(index).cloned(),
        gateway.relays.get(index).cloned(),
    ) else {
        return;
    };
    let set = |f: &dyn Fn(&mut EndpointStatus)| {
        if let Ok(mut s) = status.lock() {
            f(&mut s)
        }
    };
    let mut attempts: u32 = 0;
    let mut reloads = gateway.policy.subscribe();
    loop {
        set(&|s| s.state = "connecting");
        let attempt = tokio::select! {
            attempt = open(&gateway, &relay) => attempt,
            () = gateway.shutdown.cancelled() => break,
        };
        let failure = match attempt {
            Ok(connected) => {
                let since = Instant::now();
                set(&|s| {
                    s.state = "connected";
                    s.connections += 1;
                    s.last_error = None;
                    s.connected_since = Some(jiff::Timestamp::now().to_string());
                });
                info!(url = %relay.url, "connected to the relay endpoint");
                let authenticated = connected.await;
                set(&|s| s.connected_since = None);
                // Healthy: up for a while, or a runtime that proved its
                // key (it may well close at once: a person's one command).
                if authenticated || since.elapsed() >= HEALTHY {
                    attempts = 0;
                }
                "the connection ended".to_string()
            }
            Err(DialError::TokenRefused(code)) => {
                let why = format!(
                    "the endpoint refused the bearer token ({code}); not retried until a reload"
                );
                warn!(url = %relay.url, "{why}");
                gateway.security_event("relay_failed", None, format!("{}: {why}", relay.url));
                set(&|s| {
                    s.state = "token_refused";
                    s.last_error = Some(why.clone());
                });
                tokio::select! {
                    _ = reloads.changed() => continue,
                    () = gateway.shutdown.cancelled() => break,
                }
            }
            Err(e) => {
                let why = e.to_string();
                warn!(url = %relay.url, "cannot connect to the relay endpoint: {why}");
                gateway.security_event("relay_failed", None, format!("{}: {why}", relay.url));
                why
            }
        };
        attempts = attempts.saturating_add(1);
        let wait = backoff(attempts);
        set(&|s| {
            s.state = "waiting";
            s.attempts = u64::from(attempts);
            s.last_error = Some(failure.clone());
        });
        tokio::select! {
            () = sleep(wait) => {}
            () = gateway.shutdown.cancelled() => break,
        }
    }
    set(&|s| s.state = "stopped");
}

/// The wait before attempt `n + 1`: doubling from [`FIRST_BACKOFF`] to
/// [`MAX_BACKOFF`], less up to half of it at random (so that gateways
/// that lost the same endpoint do not come back at once).
fn backoff(attempts: u32) -> Duration {
    let full = FIRST_BACKOFF
        .saturating_mul(1 << attempts.saturating_sub(1).min(16))
        .min(MAX_BACKOFF);
    let mut random = [0u8; 2];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random);
    let fraction = f64::from(u16::from_le_bytes(random)) / f64::from(u16::MAX);
    full.mul_f64(1.0 - fraction / 2.0)
}

/// One connection, served: [`connect`], then the session in the
/// endpoint's profile. Resolves to the session, to be awaited while it
/// lasts.
async fn open(
    gateway: &Arc<Gateway>,
    relay: &RelayEndpoint,
) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>, DialError> {
    let limit = gateway.config.limits.header_timeout;
    Ok(match connect(relay, limit, config(gateway, relay)).await? {
        Upgraded::Tcp(ws) => serve(gateway, relay, *ws),
        Upgraded::Tls(ws) => serve(gateway, relay, *ws),
    })
}

/// An upgraded connection to an endpoint, with TLS or (to loopback)
/// without (boxed: the TLS state is large).
enum Upgraded {
    Tcp(Box<tokio_tungstenite::WebSocketStream<ReadAhead<TcpStream>>>),
    Tls(
        Box<
            tokio_tungstenite::WebSocketStream<
                ReadAhead<tokio_rustls::client::TlsStream<TcpStream>>,
            >,
        >,
    ),
}

/// DNS, TCP, TLS for `wss://`, and the upgrade with the bearer token:
/// each step bounded, its failure named.
async fn connect(
    relay: &RelayEndpoint,
    limit: Duration,
    config: WebSocketConfig,
) -> Result<Upgraded, DialError> {
    let token = read_token(relay)?;
    let mut request = relay
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| DialError::Failed(format!("the URL: {e}")))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token.as_str()))
        .map_err(|_| DialError::Token("not a valid header value".into()))?;
    request.headers_mut().insert("authorization", bearer);
    let uri = request.uri().clone();
    let tls = uri.scheme_str() == Some("wss");
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let addresses: Vec<std::net::SocketAddr> = timeout(
        CONNECT_TIMEOUT,
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    .map_err(|_| DialError::Failed(format!("DNS: no answer for {host} within 10 s")))?
    .map_err(|e| DialError::Failed(format!("DNS: {host}: {e}")))?
    .collect();
    let mut last = format!("TCP: {host} has no address");
    let mut connected = None;
    for address in addresses {
        match timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
            Ok(Ok(tcp)) => {
                connected = Some(tcp);
                break;
            }
            Ok(Err(e)) => last = format!("TCP: {address}: {e}"),
            Err(_) => last = format!("TCP: {address}: no connection within 10 s"),
        }
    }
    let tcp = connected.ok_or(DialError::Failed(last))?;
    let _ = tcp.set_nodelay(true);
    if !tls {
        let ws = upgrade(request, tcp, limit, config).await?;
        return Ok(Upgraded::Tcp(Box::new(ws)));
    }
    let connector = match relay.cert_sha256 {
        Some(pin) => crate::tls::pinned_connector(pin),
        None => crate::tls::client_connector(relay.ca_file.as_deref()),
    }
    .map_err(|e| DialError::Failed(format!("TLS: {e}")))?;
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|e| DialError::Failed(format!("TLS: host `{host}`: {e}")))?;
    let stream = timeout(limit, connector.connect(name, tcp))
        .await
        .map_err(|_| DialError::Failed("TLS: no handshake in time".into()))?
        .map_err(|e| DialError::Failed(format!("TLS: {e}")))?;
    let ws = upgrade(request, stream, limit, config).await?;
    Ok(Upgraded::Tls(Box::new(ws)))
}

/// `portcullis doctor`'s check of an endpoint: DNS, TCP, TLS and the
/// upgrade with the token, then a normal close (no session).
pub async fn probe(relay: &RelayEndpoint, limit: Duration) -> Result<(), String> {
    use futures_util::SinkExt as _;
    let close = tokio_tungstenite::tungstenite::Message::Close(None);
    match connect(relay, limit, ws_config()).await {
        Ok(Upgraded::Tcp(mut ws)) => {
            let _ = timeout(limit, ws.send(close)).await;
            Ok(())
        }
        Ok(Upgraded::Tls(mut ws)) => {
            let _ = timeout(limit, ws.send(close)).await;
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The WebSocket limits of the endpoint's profile.
fn config(gateway: &Gateway, relay: &RelayEndpoint) -> WebSocketConfig {
    match relay.plain_principal {
        Some(_) => portcullis_wire::plain::plain_ws_config(gateway.config.limits.max_frame),
        None => ws_config(),
    }
}

/// The session on an upgraded connection, in the endpoint's profile.
fn serve<S>(
    gateway: &Arc<Gateway>,
    relay: &RelayEndpoint,
    ws: tokio_tungstenite::WebSocketStream<S>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = Peer::Relay {
        url: relay.url.clone(),
        plain: relay.plain_principal.is_some(),
        jsonrpc: relay.environment,
    };
    let gateway = gateway.clone();
    match (relay.plain_principal.clone(), relay.environment) {
        (Some(principal), false) => {
            Box::pin(session::plain_over_websocket(gateway, ws, peer, principal))
        }
        (None, false) => Box::pin(session::over_websocket(gateway, ws, peer)),
        (None, true) => Box::pin(session::envproto_over_websocket(gateway, ws, peer)),
        (Some(principal), true) => Box::pin(async move {
            let (source, sink) = portcullis_wire::envproto::split_text(ws);
            let identity = session::Identity::Configured { principal };
            session::envproto(gateway, source, sink, peer, identity).await;
            true
        }),
    }
}

/// The WebSocket upgrade, bounded by `limit`; 401 and 403 say the token
/// was refused.
async fn upgrade<S>(
    request: tokio_tungstenite::tungstenite::handshake::client::Request,
    stream: S,
    limit: Duration,
    config: WebSocketConfig,
) -> Result<tokio_tungstenite::WebSocketStream<ReadAhead<S>>, DialError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tokio_tungstenite::tungstenite::Error;
    let stream = ReadAhead::new(stream);
    let upgraded = timeout(
        limit,
        tokio_tungstenite::client_async_with_config(request, stream, Some(config)),
    )
    .await
    .map_err(|_| DialError::Failed("upgrade: no answer in time".into()))?;
    match upgraded {
        Ok((ws, _)) => Ok(ws),
        Err(Error::Http(response)) if matches!(response.status().as_u16(), 401 | 403) => {
            Err(DialError::TokenRefused(response.status().as_u16()))
        }
        Err(Error::Http(response)) => Err(DialError::Failed(format!(
            "upgrade: the endpoint answered {}",
            response.status()
        ))),
        Err(e) => Err(DialError::Failed(format!("upgrade: {e}"))),
    }
}

/// The bearer token, read now (a rotated file is picked up at the next
/// connection); zeroized when dropped.
fn read_token(relay: &RelayEndpoint) -> Result<Zeroizing<String>, DialError> {
    let path = relay.token.path().map_err(DialError::Token)?;
    let text = std::fs::read_to_string(&path)
        .map(Zeroizing::new)
        .map_err(|e| DialError::Token(format!("{}: {e}", path.display())))?;
    let token = Zeroizing::new(text.trim().to_string());
    if token.is_empty() {
        return Err(DialError::Token(format!("{} is empty", path.display())));
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_at_most_half_taken_off() {
        for (attempts, full) in [(1, 1), (2, 2), (3, 4), (7, 60), (40, 60)] {
            let full = Duration::from_secs(full);
            for _ in 0..20 {
                let wait = backoff(attempts);
                assert!(wait <= full && wait >= full / 2, "{attempts}: {wait:?}");
            }
        }
    }
}

//! The daemon: TCP listeners, HTTP/1.1 with hyper, the WebSocket upgrade at
//! [`portcullis_wire::channel::RELAY_PATH`], and a session per upgraded
//! connection. Every accepted socket gets `TCP_NODELAY`, holds one of
//! `max_connections` permits, and must send its request head within
//! `header_timeout`.
//!
//! Architecture invariant: nothing under `server/` names a concrete
//! provider; requests reach providers through [`crate::provider::Providers`],
//! which the daemon's assembly fills.

pub mod admin;
pub mod approvals;
pub mod dial;
pub mod entry;
pub mod environment;
pub mod metrics;
pub mod peer;
pub mod session;
pub mod state;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    CONNECTION, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION,
    UPGRADE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::OwnedSemaphorePermit;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tracing::{debug, info};

use portcullis_wire::channel::{ENVIRONMENT_PATH, RELAY_PATH, ws_config};
use portcullis_wire::read_ahead::ReadAhead;
pub use state::Gateway;

/// Accepts connections on `listener` until shutdown.
pub async fn serve(gateway: Arc<Gateway>, listener: TcpListener) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    debug!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = gateway.shutdown.cancelled() => return,
        };
        let Ok(permit) = gateway.connections.clone().try_acquire_owned() else {
            debug!(%peer, "refused: max_connections reached");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let gateway = gateway.clone();
        tokio::spawn(async move {
            match gateway.tls.clone() {
                None => connection(gateway, stream, peer, permit).await,
                Some(acceptor) => {
                    // The TLS handshake shares the request head's deadline.
                    let limit = gateway.config.limits.header_timeout;
                    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => connection(gateway, tls, peer, permit).await,
                        Ok(Err(e)) => debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

/// Serves HTTP on one connection (plain TCP or TLS).
async fn connection<I>(
    gateway: Arc<Gateway>,
    stream: I,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let permit = Arc::new(permit);
    let header_timeout = gateway.config.limits.header_timeout;
    let service = service_fn(move |request| {
        let (gateway, permit) = (gateway.clone(), permit.clone());
        async move { Ok::<_, Infallible>(route(gateway, request, peer, permit)) }
    });
    let result = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Some(header_timeout))
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = result {
        debug!(%peer, "http: {e}");
    }
}

fn route(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
    peer: SocketAddr,
    permit: Arc<OwnedSemaphorePermit>,
) -> Response<Full<Bytes>> {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, RELAY_PATH) => upgrade(gateway, request, peer, permit, Profile::Relay),
        (&Method::GET, ENVIRONMENT_PATH) => {
            upgrade(gateway, request, peer, permit, Profile::Environment)
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
}

/// What a WebSocket speaks inside its Noise channel, by its URL path.
#[derive(Clone, Copy)]
enum Profile {
    /// relay.v1 frames.
    Relay,
    /// ya-environment-protocol.v1's JSON-RPC messages.
    Environment,
}

/// RFC 6455 §4.2: answer 101 and hand the upgraded stream to a session.
fn upgrade(
    gateway: Arc<Gateway>,
    request: Request<Incoming>,
    peer: SocketAddr,
    permit: Arc<OwnedSemaphorePermit>,
    profile: Profile,
) -> Response<Full<Bytes>> {
    let headers = request.headers();
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|v: &HeaderValue| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    let key = headers
        .get(SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec());
    let version_ok = headers
        .get(SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    let (Some(key), true, true, true) = (
        key,
        has(UPGRADE, "websocket"),
        has(CONNECTION, "upgrade"),
        version_ok,
    ) else {
        return text(
            StatusCode::BAD_REQUEST,
            "expected a WebSocket upgrade (version 13)\n",
        );
    };
    let accept = derive_accept_key(&key);
    tokio::spawn(async move {
        match hyper::upgrade::on(request).await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    ReadAhead::new(TokioIo::new(upgraded)),
                    Role::Server,
                    Some(ws_config()),
                )
                .await;
                // Each boxed: this task's future would otherwise be as
                // large as the larger of the two, for every session.
                match profile {
                    Profile::Relay => {
                        let peer = peer::Peer::Tcp { addr: peer };
                        Box::pin(session::over_websocket(gateway, ws, peer)).await;
                    }
                    Profile::Environment => {
                        let peer = peer::Peer::TcpJsonRpc { addr: peer };
                        Box::pin(session::envproto_over_websocket(gateway, ws, peer)).await;
                    }
                }
            }
            Err(e) => debug!(%peer, "upgrade failed: {e}"),
        }
        drop(permit);
    });
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(value) = HeaderValue::from_str(&accept) {
        h.insert(SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}

/// Binds every configured address — or, under socket activation, serves
/// the listeners systemd passed instead (`listen` is then ignored).
pub async fn bind(
    gateway: &Gateway,
    inherited: Vec<std::net::TcpListener>,
) -> std::io::Result<Vec<TcpListener>> {
    if !inherited.is_empty() {
        let listeners = inherited
            .into_iter()
            .map(TcpListener::from_std)
            .collect::<std::io::Result<Vec<_>>>()?;
        for listener in &listeners {
            info!(
                "listening on {} (socket from systemd; `listen` in the config is not used)",
                listener.local_addr()?
            );
        }
        return Ok(listeners);
    }
    let mut listeners = Vec::new();
    for addr in &gateway.config.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
        info!("listening on {}", listener.local_addr()?);
        listeners.push(listener);
    }
    Ok(listeners)
}

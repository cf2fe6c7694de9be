//! MCP's Streamable HTTP transport for [`Front`]: on loopback TCP or a
//! Unix socket only, every request carrying the configured bearer token
//! (compared in constant time, never passed on: the gateway sees this
//! server's own identity), browser `Origin`s refused unless allowed, the
//! `Host` a loopback name (rmcp's check, against DNS rebinding), bodies
//! bounded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use zeroize::Zeroizing;

use crate::{Front, McpServeError};

/// Where the HTTP transport listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A loopback address (127.0.0.0/8 or ::1).
    Tcp(SocketAddr),
    /// A Unix socket, made afresh (mode 0600: this user only).
    Unix(PathBuf),
}

impl Listen {
    /// `unix:PATH`, or a loopback `ADDR:PORT`; anything else is refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let addr: SocketAddr = text
            .parse()
            .map_err(|_| format!("`{text}` is neither ADDR:PORT nor unix:PATH"))?;
        if !addr.ip().is_loopback() {
            return Err(format!(
                "`{text}` is not a loopback address: the MCP HTTP transport listens on \
                 127.0.0.1, ::1 or a Unix socket (put a TLS proxy in front to reach it from elsewhere)"
            ));
        }
        Ok(Self::Tcp(addr))
    }
}

/// The bearer token every request must carry, kept as its SHA-256.
pub struct BearerToken([u8; 32]);

impl BearerToken {
    pub fn new(token: &Zeroizing<String>) -> Result<Self, String> {
        if token.len() < 16 {
            return Err("the MCP bearer token must be at least 16 characters".into());
        }
        Ok(Self(Sha256::digest(token.as_bytes()).into()))
    }

    fn admits(&self, header: Option<&hyper::header::HeaderValue>) -> bool {
        let Some(given) = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
        else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        bool::from(digest.ct_eq(&self.0))
    }
}

/// Serves MCP over Streamable HTTP until the gateway's session ends.
/// `ready` hears the address bound (for a port 0) before the first accept.
pub async fn serve(
    front: Front,
    listen: Listen,
    token: BearerToken,
    allowed_origins: Vec<String>,
    ready: impl FnOnce(String),
) -> Result<(), McpServeError> {
    let io = |what: &str, e: std::io::Error| McpServeError::Transport(format!("{what}: {e}"));
    let config = StreamableHttpServerConfig::default()
        .with_allowed_origins(allowed_origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(16 << 20);
    let client = front.client.clone();
    let _following = crate::AbortOnDrop(front.follow_policy_changes());
    let service = StreamableHttpService::new(
        move || Ok(front.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let token = Arc::new(token);
    let listener = match &listen {
        Listen::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| io("bind", e))?;
            ready(format!(
                "http://{}/mcp",
                listener.local_addr().map_err(|e| io("bind", e))?
            ));
            Either::Tcp(listener)
        }
        Listen::Unix(path) => {
            let _ = std::fs::remove_file(path);
            let listener = tokio::net::UnixListener::bind(path).map_err(|e| io("bind", e))?;
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io("chmod", e))?;
            ready(format!("unix:{}", path.display()));
            Either::Unix(listener)
        }
    };
    let serve_one = |io: Box<dyn Io>| {
        let (service, token) = (service.clone(), token.clone());
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (service, token) = (service.clone(), token.clone());
                async move {
                    if !token.admits(request.headers().get(hyper::header::AUTHORIZATION)) {
                        return Ok::<_, std::convert::Infallible>(unauthorized());
                    }
                    if request.uri().path() != "/mcp" {
                        return Ok(plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp"));
                    }
                    Ok(service.handle(request).await)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), handler)
                .await;
        });
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(io) => serve_one(io),
                Err(e) => tracing::warn!("mcp http: accept: {e}"),
            },
            why = client.closed() => {
                return Err(McpServeError::Gateway(format!("the session ended: {why}")));
            }
        }
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}

enum Either {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Either {
    async fn accept(&self) -> std::io::Result<Box<dyn Io>> {
        Ok(match self {
            Self::Tcp(l) => Box::new(l.accept().await?.0),
            Self::Unix(l) => Box::new(l.accept().await?.0),
        })
    }
}

fn plain(
    status: StatusCode,
    text: &'static str,
) -> Response<BoxBody<Bytes, std::convert::Infallible>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    response
}

fn unauthorized() -> Response<BoxBody<Bytes, std::convert::Infallible>> {
    let mut response = plain(StatusCode::UNAUTHORIZED, "a bearer token is required");
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_or_a_unix_socket() {
        assert_eq!(
            Listen::parse("127.0.0.1:8765"),
            Ok(Listen::Tcp("127.0.0.1:8765".parse().unwrap()))
        );
        assert!(Listen::parse("[::1]:0").is_ok());
        assert_eq!(
            Listen::parse("unix:/run/x.sock"),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        let public = Listen::parse("0.0.0.0:8765").unwrap_err();
        assert!(public.contains("not a loopback"), "{public}");
        assert!(Listen::parse("localhost").is_err());
    }

    #[test]
    fn the_token_is_compared_whole() {
        let token = BearerToken::new(&Zeroizing::new("0123456789abcdef-token".into())).unwrap();
        let header = |v: &'static str| hyper::header::HeaderValue::from_static(v);
        assert!(token.admits(Some(&header("Bearer 0123456789abcdef-token"))));
        assert!(!token.admits(Some(&header("Bearer 0123456789abcdef-toke"))));
        assert!(!token.admits(Some(&header("0123456789abcdef-token"))));
        assert!(!token.admits(None));
        assert!(BearerToken::new(&Zeroizing::new("short".into())).is_err());
    }
}

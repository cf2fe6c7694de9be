//! The runtime's side of dial-out: a listener that gateways connect to
//! (the relay spec's primary topology, a provider behind NAT dialing its
//! runtime). It takes the WebSocket upgrade on the relay path only with
//! the expected bearer token (`Authorization: Bearer …`), then runs the
//! same Noise handshake as a client that dials the gateway — this side is
//! the initiator and pins the gateway's key; TCP direction and Noise
//! roles are independent — and hands back the same [`Client`].

use std::net::SocketAddr;

use subtle::ConstantTimeEq as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use zeroize::Zeroizing;

use crate::{Client, ClientError, ClientOptions};
use portcullis_wire::channel::{self, RELAY_PATH};

/// Listens for gateways that dial in.
pub struct ProviderListener {
    listener: TcpListener,
    token: Zeroizing<String>,
}

impl ProviderListener {
    /// Listens on `addr`; a gateway must present `token`.
    pub async fn bind(addr: &str, token: Zeroizing<String>) -> std::io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
            token,
        })
    }

    /// Takes a listening socket already bound (e.g. handed over by a
    /// supervisor).
    pub fn from_std(
        listener: std::net::TcpListener,
        token: Zeroizing<String>,
    ) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        Ok(Self {
            listener: TcpListener::from_std(listener)?,
            token,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next gateway that dials in and proves the key in `options`
    /// (`options.url` is not used). A connection that fails the token,
    /// the upgrade or the handshake is an error; call again for the next.
    pub async fn accept(&self, options: ClientOptions) -> Result<Client, ClientError> {
        let (tcp, peer) = self
            .listener
            .accept()
            .await
            .map_err(|source| ClientError::Connect {
                addr: "the listener".into(),
                source,
            })?;
        let limit = options.timeout;
        tokio::time::timeout(limit, self.open(tcp, peer, options))
            .await
            .map_err(|_| ClientError::Timeout)?
    }

    async fn open(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let _ = tcp.set_nodelay(true);
        let expected = format!("Bearer {}", self.token.as_str());
        // tungstenite's callback type; its error is a whole HTTP response.
        #[allow(clippy::result_large_err)]
        let check = |request: &Request, response: Response| {
            #[allow(clippy::result_large_err)]
            let refuse = |status: StatusCode, why: &str| {
                let mut refusal = ErrorResponse::new(Some(why.to_string()));
                *refusal.status_mut() = status;
                Err(refusal)
            };
            if request.uri().path() != RELAY_PATH {
                return refuse(StatusCode::NOT_FOUND, "not the relay path");
            }
            let given = request
                .headers()
                .get("authorization")
                .map(|v| v.as_bytes())
                .unwrap_or_default();
            if !bool::from(given.ct_eq(expected.as_bytes())) {
                return refuse(StatusCode::UNAUTHORIZED, "a valid bearer token is required");
            }
            Ok(response)
        };
        let ws = tokio_tungstenite::accept_hdr_async_with_config(
            tcp,
            check,
            Some(channel::client_ws_config()),
        )
        .await
        .map_err(|e| ClientError::Upgrade(format!("from {peer}: {e}")))?;
        Client::over_websocket(ws, options).await
    }
}

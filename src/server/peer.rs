//! Who is on the other end of a session, as far as its transport can say.
//! A transport adds a variant here and an accept loop; nothing in the
//! request path changes.

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A client that dialed in over TCP (WebSocket, optionally TLS).
    Tcp { addr: SocketAddr },
    /// The same, speaking ya-environment-protocol.v1 inside the Noise
    /// channel (`/api/v1/environment/connect`).
    TcpJsonRpc { addr: SocketAddr },
    /// A runtime's relay endpoint the gateway dialed (`[[relay]]`), in
    /// the Noise or the plain profile.
    Relay {
        url: String,
        plain: bool,
        /// ya-environment-protocol.v1 instead of relay.v1.
        jsonrpc: bool,
    },
    /// `portcullis stdio`: the process that started this one, speaking
    /// ya-environment-protocol.v1 on its standard input and output.
    Stdio { parent: u32 },
    /// A Unix socket in ya-environment-protocol.v1: the peer's process and
    /// user as the kernel reports them (`SO_PEERCRED`).
    Unix { uid: u32, pid: Option<i32> },
}

impl fmt::Display for Peer {
    /// As audit entries and logs name it: the address for TCP.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { addr } => write!(f, "{addr}"),
            Self::TcpJsonRpc { addr } => write!(f, "{addr} v1-jsonrpc"),
            // Every entry of a plain session says so, in its peer, and
            // which protocol it speaks when not relay.v1.
            Self::Relay {
                url,
                plain,
                jsonrpc,
            } => write!(
                f,
                "{}{url}{}",
                if *plain { "plain " } else { "" },
                if *jsonrpc { " v1-jsonrpc" } else { "" }
            ),
            // The profile is named too: these speak JSON-RPC, not relay.v1.
            Self::Stdio { parent } => write!(f, "stdio v1-jsonrpc (parent pid {parent})"),
            Self::Unix {
                uid,
                pid: Some(pid),
            } => {
                write!(f, "unix v1-jsonrpc (uid {uid}, pid {pid})")
            }
            Self::Unix { uid, pid: None } => write!(f, "unix v1-jsonrpc (uid {uid})"),
        }
    }
}

impl Peer {
    /// How the peer reached the gateway, as audit entries name it.
    pub fn transport(&self) -> &'static str {
        match self {
            Self::Tcp { .. } | Self::TcpJsonRpc { .. } => "websocket",
            Self::Relay { plain: false, .. } => "websocket-out",
            Self::Relay { plain: true, .. } => "websocket-out-plain",
            Self::Stdio { .. } => "stdio",
            Self::Unix { .. } => "unix",
        }
    }

    /// The protocol it speaks, as audit entries name it.
    pub fn profile(&self) -> &'static str {
        match self {
            Self::Tcp { .. } | Self::Relay { jsonrpc: false, .. } => "relay.v1",
            Self::TcpJsonRpc { .. }
            | Self::Relay { jsonrpc: true, .. }
            | Self::Stdio { .. }
            | Self::Unix { .. } => portcullis_wire::envproto::PROTOCOL,
        }
    }
}

/// `sessions --json` and the admin API show a peer as its display text.
impl serde::Serialize for Peer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

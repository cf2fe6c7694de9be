//! Every way the channel can fail, as one typed enum.

use thiserror::Error;

/// An error from the handshake or the transport. After any of these the
/// handshake or direction that produced it refuses further use: the caller
/// must drop the connection (Noise has no recovery from a failed message).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    #[error("message is {len} bytes; a Noise message is at most 65535 bytes")]
    MessageTooLarge { len: usize },

    #[error("payload is {len} bytes; at most {max} bytes fit in this message")]
    PayloadTooLarge { len: usize, max: usize },

    #[error("message is truncated: need at least {need} bytes, got {got}")]
    Truncated { need: usize, got: usize },

    #[error(
        "decryption failed: the message was altered, truncated, replayed, reordered \
         or sealed under another key"
    )]
    Decrypt,

    #[error("the peer sent a low-order X25519 public key (no shared secret possible)")]
    WeakPublicKey,

    #[error("the responder's static key is {got}, but {expected} was pinned")]
    RemoteKeyMismatch { got: String, expected: String },

    #[error("the {role} cannot {action} message {number} of the XX handshake now")]
    OutOfOrder {
        role: &'static str,
        action: &'static str,
        number: u8,
    },

    #[error("the handshake is not finished; transport keys exist only after message 3")]
    HandshakeIncomplete,

    #[error("this handshake or channel already failed; start a new connection")]
    Failed,

    #[error("the nonce space of this direction is exhausted (2^64-1 messages); reconnect")]
    NonceExhausted,

    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
}

//! `portcullis-crypto`: the secure channel of portcullis, without I/O.
//!
//! - [`Handshake`] runs `Noise_XX_25519_AESGCM_SHA256` (Noise revision 34)
//!   as a state machine over byte buffers.
//! - [`Transport`] (split into [`Sender`] and [`Receiver`]) seals and opens
//!   transport messages with implicit nonces, `REKEY()` every
//!   [`REKEY_INTERVAL`] messages per direction, and fails closed.
//! - [`StaticKeypair`] and [`PublicKey`] are the static keys, their key file
//!   text and their `SHA256:` fingerprints.
//!
//! No sockets, no async runtime, no file access: callers move the bytes.
//! Randomness (ephemeral and generated keys) comes from the OS.

#![forbid(unsafe_code)]

mod cipher;
mod error;
mod handshake;
mod keys;
mod symmetric;
mod transport;

pub use error::Error;
pub use handshake::{Handshake, Role};
pub use keys::{KEY_FILE_HEADER, KeyError, PublicKey, StaticKeypair};
pub use transport::{Receiver, Sender, Transport};

/// The full Noise protocol name; the handshake hash starts from it.
pub const PROTOCOL_NAME: &str = "Noise_XX_25519_AESGCM_SHA256";

/// The prologue both sides mix in before message 1 (DESIGN.md, "The wire").
pub const PROLOGUE: &[u8] = b"portcullis.v1";

/// Noise's limit on any message, handshake or transport.
pub const MAX_MESSAGE_LEN: usize = 65535;

/// The AES-GCM authentication tag appended to every encrypted message.
pub const TAG_LEN: usize = 16;

/// The largest plaintext that fits one transport message.
pub const MAX_PLAINTEXT_LEN: usize = MAX_MESSAGE_LEN - TAG_LEN;

/// Each direction applies `REKEY()` after every this many messages.
pub const REKEY_INTERVAL: u64 = 1 << 20;

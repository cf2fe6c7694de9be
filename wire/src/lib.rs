//! What a portcullis client and gateway share, and nothing else: the
//! record layer ([`record`]: one kind byte, then a relay frame or a binary
//! chunk), the `ya-environment-relay.v1` frames and their validation
//! ([`frame`]), the Noise channel over WebSocket binary messages
//! ([`channel`]), the `ya-environment-protocol.v1` profile that maps
//! JSON-RPC messages onto those frames ([`envproto`]), and key files on
//! disk ([`keyfile`]).
//!
//! Architecture invariant: this crate knows no policy, no store, no
//! provider, and no sandbox; the client library and third-party runtimes
//! build on it without the daemon.

#![forbid(unsafe_code)]

pub mod channel;
pub mod envproto;
pub mod frame;
pub mod keyfile;
pub mod plain;
pub mod read_ahead;
pub mod record;

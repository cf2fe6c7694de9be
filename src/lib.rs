//! portcullis: a hardened gateway that lets remote AI-agent runtimes use
//! this host's capabilities only as far as an operator's policy grants.
//!
//! This crate is the daemon: the server and its one admission path
//! ([`server`]), the provider API ([`provider`]) and the providers below it
//! ([`files`], [`shell`], [`tools`], [`resources`]), assembled in
//! [`daemon`]. The wire is `portcullis-wire`, the client library
//! `portcullis-client`. See `ARCHITECTURE.md` for the map.

#![forbid(unsafe_code)]

pub mod artifacts;
pub mod config;
pub mod daemon;
pub mod egress;
pub mod files;
pub mod provider;
pub mod resources;
pub mod server;
pub mod shell;
pub mod systemd;
pub mod tls;
pub mod tools;

/// 128 random bits, hex: instance and object ids (never a secret).
pub fn random_id() -> String {
    let mut bytes = [0u8; 16];
    // Without OS randomness the daemon could not make keys either; an all-zero
    // id is still unique enough for one instance and is never a secret.
    let _ = getrandom::fill(&mut bytes);
    hex::encode(bytes)
}

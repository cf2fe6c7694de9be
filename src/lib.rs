//! portcullis: a hardened gateway that lets remote AI-agent runtimes use
//! this host's capabilities only as far as an operator's policy grants.
//!
//! This crate holds the wire codec ([`record`], [`frame`]) and the key file
//! handling ([`keyfile`]); the server, sessions, capability providers and
//! client library are built on them. See `ARCHITECTURE.md` for the map.

#![forbid(unsafe_code)]

pub mod config;
pub mod files;
pub mod provider;
pub mod server;
pub mod shell;
pub mod systemd;
pub mod tls;
pub mod tools;

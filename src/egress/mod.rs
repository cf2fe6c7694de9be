//! The egress proxy: the only way out for a command whose grant has an
//! egress allow-list (`network = { allow = [...] }`). Such a command runs
//! in a network namespace with nothing but loopback; the launcher inside
//! bridges a loopback port to a Unix socket this module listens on, one
//! socket per command, in a directory mounted into the command's world
//! (the sandbox crate's `egress.rs`). So every connection here is known to
//! be that command's, and is decided with its grant and audited with its
//! request.
//!
//! A connection is HTTP CONNECT (TLS only: the ClientHello's server name
//! must be the CONNECT host) or a plain-HTTP request in absolute form. For
//! each: the allow-list decides on the name and port ([`portcullis_policy::egress`]);
//! the proxy resolves the name itself (or through `[egress] resolve`), keeps
//! only addresses the allow-list lets it use (public ones, or private ones an
//! address entry covers); an `egress_start` entry is durable before the
//! upstream connection is made, and an `egress` entry with the bytes each
//! way follows when it closes — or is the only entry, for a refusal. UDP and
//! QUIC have no way out: the world has no route, and the proxy carries only
//! TCP.
//!
//! Invariant: the daemon makes outbound connections for commands only
//! here.

mod proxy;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use portcullis_policy::egress::Egress as AllowList;
use portcullis_store::{AuditLog, Kind, Record};
use tokio_util::sync::CancellationToken;

use crate::config::EgressConfig;
use crate::provider::{Call, Origin};

/// The proxy for every command of this daemon run.
pub struct Egress {
    /// `[egress] resolve`: names answered without DNS.
    resolve: BTreeMap<String, Vec<IpAddr>>,
    audit: AuditLog,
    /// Where each command's socket directory is made.
    base: PathBuf,
    next: AtomicU64,
}

/// A directory for one command's proxy socket, made before its launcher
/// starts (bwrap mounts it); removed when dropped.
#[derive(Debug)]
pub struct EgressDir(PathBuf);

impl EgressDir {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for EgressDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whose connections a proxy carries: the command's request, as its audit
/// entries name it.
#[derive(Clone, Debug)]
pub struct CommandLink {
    pub origin: Arc<Origin>,
    pub principal: String,
    pub request_id: String,
    pub policy_generation: Arc<str>,
}

impl CommandLink {
    pub fn of(call: &Call) -> Self {
        Self {
            origin: call.origin.clone(),
            principal: call.principal.clone(),
            request_id: call.request.id.to_string(),
            policy_generation: call.policy.generation.clone(),
        }
    }
}

/// A command's proxy, serving until dropped (then it stops accepting, and
/// connections still open are closed, each with its entry).
pub struct EgressProxy {
    stop: CancellationToken,
    _dir: EgressDir,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Egress {
    /// The proxy of a daemon whose state directory is `state_dir` (its
    /// sockets go in `egress/` there, emptied now: nothing of an earlier
    /// run is served).
    pub fn new(config: &EgressConfig, state_dir: &Path, audit: AuditLog) -> Arc<Self> {
        // Absolute: launchers start in `/`, and bwrap mounts it from there.
        let base = std::path::absolute(state_dir.join("egress"))
            .unwrap_or_else(|_| state_dir.join("egress"));
        let _ = std::fs::remove_dir_all(&base);
        Arc::new(Self {
            resolve: config
                .resolve
                .iter()
                .filter_map(|(name, addrs)| {
                    Some((
                        portcullis_policy::egress::normalize_name(name)?,
                        addrs.clone(),
                    ))
                })
                .collect(),
            audit,
            base,
            next: AtomicU64::new(0),
        })
    }

    /// A fresh directory for one command's socket (mode 0700).
    pub fn dir(&self) -> std::io::Result<EgressDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.base)?;
        let path = self
            .base
            .join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(EgressDir(path))
    }

    /// Serves `command`'s connections on a socket in `dir` under `rules`,
    /// until the returned proxy is dropped.
    pub fn serve(
        self: &Arc<Self>,
        dir: EgressDir,
        rules: Arc<AllowList>,
        command: CommandLink,
    ) -> std::io::Result<EgressProxy> {
        let socket = dir.path().join(portcullis_sandbox::EGRESS_SOCKET);
        let listener = tokio::net::UnixListener::bind(&socket)?;
        let stop = CancellationToken::new();
        let context = Arc::new(proxy::Context {
            egress: self.clone(),
            rules,
            command,
            stop: stop.clone(),
        });
        tokio::spawn(proxy::accept(listener, context));
        Ok(EgressProxy { stop, _dir: dir })
    }

    /// The addresses `host` has: `[egress] resolve`'s, else DNS's.
    async fn resolve(&self, host: &str, port: u16) -> Result<Vec<IpAddr>, String> {
        if let Some(addrs) = self.resolve.get(host) {
            return Ok(addrs.clone());
        }
        let looked = tokio::time::timeout(proxy::TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| format!("resolving {host} took longer than {:?}", proxy::TIMEOUT))?
            .map_err(|e| format!("resolving {host}: {e}"))?;
        Ok(looked.map(|addr| addr.ip()).collect())
    }

    /// An entry about one connection of `command`'s.
    fn record(
        &self,
        kind: Kind,
        command: &CommandLink,
        method: &str,
        destination: String,
    ) -> Record {
        Record {
            kind,
            started_at: jiff::Timestamp::now().to_string(),
            connection: Some(command.origin.connection),
            peer: Some(command.origin.peer.clone()),
            principal: Some(command.principal.as_str().into()),
            request_id: Some(command.request_id.clone()),
            method: Some(method.to_string()),
            capability: Some("shell".to_string()),
            destination: Some(destination),
            policy_generation: Some(command.policy_generation.clone()),
            ..Record::default()
        }
    }
}

//! The environment socket (`environment_socket` in portcullis.toml): a
//! Unix socket serving ya-environment-protocol.v1 to local runtimes, the
//! 0.92 spec's long-lived local daemon profile. The kernel names the peer
//! (`SO_PEERCRED`); the policy's `unix_uid` maps its user to a principal.
//! A peer in a sandboxed command's namespaces is refused whatever its uid
//! (a command runs with the daemon's uid), as on the admin socket.

use std::path::Path;
use std::sync::Arc;

use portcullis_wire::envproto::lsp::{LspReader, LspWriter};
use tokio::io::{BufReader, BufWriter};
use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::server::Gateway;
use crate::server::admin::{bind_socket, foreign_namespace};
use crate::server::peer::Peer;
use crate::server::session;

/// Binds the environment socket. Anyone may connect (mode 0666): who a
/// peer is, and whether it is anyone, is the policy's `unix_uid`.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    bind_socket(path, 0o666)
}

pub async fn serve(gateway: Arc<Gateway>, listener: UnixListener, path: std::path::PathBuf) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            () = gateway.shutdown.cancelled() => break,
        };
        let Ok(cred) = stream.peer_cred() else {
            continue;
        };
        let (uid, pid) = (cred.uid(), cred.pid());
        let peer = Peer::Unix { uid, pid };
        let refuse = |why: String| {
            warn!(%peer, "environment socket: refused: {why}");
            gateway.security_event("auth_refused", None, format!("peer {peer}: {why}"));
        };
        if let Some(namespace) = pid.and_then(foreign_namespace) {
            refuse(format!("a sandboxed command's {namespace} namespace"));
            continue;
        }
        let policy = gateway.current_policy();
        let Some(principal) = portcullis_policy::principal_by_uid(&policy, uid) else {
            refuse(format!("no principal has unix_uid = {uid}"));
            let (_, write) = stream.into_split();
            tokio::spawn(async move {
                portcullis_wire::envproto::refuse(LspWriter::new(write), "authentication failed")
                    .await
            });
            continue;
        };
        let principal = principal.id.clone();
        info!(%peer, %principal, "environment socket: connected");
        let max = gateway.config.limits.max_frame;
        let (read, write) = stream.into_split();
        let source = LspReader::new(BufReader::new(read), max);
        let sink = LspWriter::new(BufWriter::new(write));
        let identity = session::Identity::LocalUser { principal, uid };
        tokio::spawn(session::envproto(
            gateway.clone(),
            source,
            sink,
            peer,
            identity,
        ));
    }
    let _ = std::fs::remove_file(&path);
}

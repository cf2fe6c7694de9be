//! A command whose grant has an egress allow-list runs in a network
//! namespace of its own with nothing but loopback; its one way out is the
//! daemon's egress proxy. The daemon listens on a Unix socket in a
//! directory of its own for this command (`--egress DIR`), which bwrap
//! mounts read-only at [`INSIDE_DIR`]; the launcher inside bridges a TCP
//! port on the world's loopback ([`EGRESS_PROXY`], where the daemon points
//! `HTTP_PROXY` and `HTTPS_PROXY`) to that socket, one connection to the
//! socket per connection to the port. The proxy decides, resolves,
//! connects and audits; the bridge only carries bytes, and a program that
//! ignores the proxy variables finds no route at all.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::SetupError;

/// Where programs in the world reach the proxy (`HTTP_PROXY=http://…`).
pub const EGRESS_PROXY: &str = "127.0.0.1:3128";
/// The daemon's socket, by its name in `--egress DIR`.
pub const EGRESS_SOCKET: &str = "proxy.sock";
/// Where `--egress DIR` is mounted inside the world.
pub(crate) const INSIDE_DIR: &str = "/run/portcullis";
/// Connections bridged at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 32;
/// Threads the bridge may run at once (two per connection, and the one
/// that accepts): they count against the command's `pids` cgroup.
pub const EGRESS_BRIDGE_TASKS: u64 = 1 + 2 * MAX_CONNECTIONS as u64;

/// Listens on [`EGRESS_PROXY`] and bridges each connection to the daemon's
/// socket on a thread of its own, for as long as this process lives (the
/// launcher inside, which outlives the program by a status line).
pub(crate) fn bridge() -> Result<(), SetupError> {
    let listener = TcpListener::bind(EGRESS_PROXY).map_err(SetupError::EgressPort)?;
    std::thread::Builder::new()
        .name("egress-bridge".into())
        .spawn(move || accept(listener))
        .map_err(|e| SetupError::os("the egress bridge's thread", e))?;
    Ok(())
}

fn accept(listener: TcpListener) {
    let open = Arc::new(AtomicUsize::new(0));
    let socket = format!("{INSIDE_DIR}/{EGRESS_SOCKET}");
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        let (still_open, socket) = (open.clone(), socket.clone());
        let spawned = std::thread::Builder::new()
            .name("egress-conn".into())
            .spawn(move || {
                if let Ok(proxy) = UnixStream::connect(&socket) {
                    carry(client, proxy);
                }
                still_open.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Copies both ways until both sides have finished sending.
fn carry(client: TcpStream, proxy: UnixStream) {
    let (Ok(client_back), Ok(proxy_back)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new()
        .name("egress-up".into())
        .spawn(move || {
            let _ = std::io::copy(&mut &client, &mut &proxy);
            let _ = proxy.shutdown(Shutdown::Write);
        });
    let _ = std::io::copy(&mut &proxy_back, &mut &client_back);
    let _ = client_back.shutdown(Shutdown::Write);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
}

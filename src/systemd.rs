//! Running under systemd: listeners inherited through socket activation,
//! readiness, status and watchdog notifications, and whether stderr is the
//! journal. Outside systemd every function here does nothing.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::warn;

/// The TCP listeners systemd passed (socket activation), in its order;
/// empty when none were passed. Reads and clears `LISTEN_FDS`/`LISTEN_PID`,
/// so call it once, before any thread starts.
pub fn inherited_listeners() -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut fds = listenfd::ListenFd::from_env();
    let mut listeners = Vec::new();
    for index in 0..fds.len() {
        let listener = fds
            .take_tcp_listener(index)
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("inherited socket {index} is not a TCP listener: {e}"),
                )
            })?
            .ok_or_else(|| std::io::Error::other(format!("inherited socket {index} is gone")))?;
        listener.set_nonblocking(true)?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Tells systemd the gateway is serving (`Type=notify`), with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The `STATUS=` line `systemctl status` shows.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        warn!("cannot notify systemd: {e}");
    }
}

/// Under `WatchdogSec=`: sends `WATCHDOG=1` at half the interval for as
/// long as the async runtime runs this task, so a runtime that stops
/// making progress (every worker blocked) is restarted. Returns at once
/// when there is no watchdog.
pub async fn watchdog() {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut tick = tokio::time::interval((interval / 2).max(Duration::from_millis(100)));
    loop {
        tick.tick().await;
        send(&[NotifyState::Watchdog]);
    }
}

/// Whether stderr is connected to the journal (`JOURNAL_STREAM` names its
/// device and inode), so logs should go there with their fields.
pub fn stderr_is_journal() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = rustix::fs::fstat(std::io::stderr()) else {
        return false;
    };
    stream
        .to_str()
        .and_then(|s| s.split_once(':'))
        .is_some_and(|(dev, ino)| dev.parse() == Ok(stat.st_dev) && ino.parse() == Ok(stat.st_ino))
}

//! Terminals for `shell.start` with `pty: true`: a pseudoterminal pair,
//! its size, and reading its output on a thread of its own.
//!
//! The daemon keeps the controlling side; the child gets the other side as
//! stdin, stdout and stderr, and the launcher (`--tty`) makes it the
//! controlling terminal of the new session, so ^C in the input becomes
//! SIGINT for the foreground job and a resize becomes SIGWINCH.

use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::Arc;

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

/// Columns and rows when a request names none.
pub const DEFAULT_SIZE: (u16, u16) = (80, 24);

/// A new pseudoterminal.
pub struct Pty {
    /// The controlling side: output is read from it, input written to it.
    pub master: Arc<OwnedFd>,
    /// The child's side, held until the child has it.
    user: OwnedFd,
}

impl Pty {
    pub fn open(cols: u16, rows: u16) -> std::io::Result<Self> {
        let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
        let master = rustix::pty::openpt(flags)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        // By descriptor, not by its /dev/pts name, which could be raced.
        let user = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
        resize(&master, cols, rows)?;
        Ok(Self {
            master: Arc::new(master),
            user,
        })
    }

    /// The child's stdin, stdout and stderr: the terminal's user side.
    pub fn stdio(&self) -> std::io::Result<[Stdio; 3]> {
        Ok([
            Stdio::from(self.user.try_clone()?),
            Stdio::from(self.user.try_clone()?),
            Stdio::from(self.user.try_clone()?),
        ])
    }
}

/// Sets the terminal's size; the kernel sends SIGWINCH to its foreground
/// process group.
pub fn resize(master: &OwnedFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(master, size)?)
}

/// Reads the terminal's output into `push` until every process holding
/// the user side has gone (the read fails with EIO); the receiver hears
/// when it has. A thread of its own rather than the runtime's blocking
/// pool, so that a read held open by an escaped process never delays the
/// runtime's shutdown.
pub fn pump(
    master: &OwnedFd,
    mut push: impl FnMut(&[u8]) + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let mut terminal = std::fs::File::from(master.try_clone()?);
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("portcullis-pty".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = terminal.read(&mut buf) {
                push(&buf[..n]);
            }
            let _ = done.send(());
        })?;
    Ok(finished)
}

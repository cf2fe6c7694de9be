//! A stream that reads ahead only while its peer is sending in bulk.
//!
//! The WebSocket layer reads into its own buffer, whose size is both what
//! every connection holds while idle and the most one `read` takes in. A
//! small one keeps ten thousand idle sessions cheap but costs an upload
//! four times the system calls. [`ReadAhead`] decouples the two: reads go
//! straight into the caller's slice until one fills it (more is waiting),
//! then come from a buffer of [`BULK`] bytes filled one `read` at a time,
//! which is dropped again once it is empty and the socket has nothing more
//! (the peer went quiet). Writes pass through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The read-ahead buffer's size while the peer sends in bulk: one Noise
/// message and its WebSocket header fit.
pub const BULK: usize = 80 * 1024;

/// `inner`, read ahead while its peer sends in bulk.
#[derive(Debug)]
pub struct ReadAhead<S> {
    inner: S,
    /// Present only while reading ahead; what it holds is unread.
    ahead: Option<BytesMut>,
}

impl<S> ReadAhead<S> {
    pub fn new(inner: S) -> Self {
        Self { inner, ahead: None }
    }

    #[cfg(test)]
    fn is_reading_ahead(&self) -> bool {
        self.ahead.is_some()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(ahead) = this.ahead.as_mut() else {
            let before = dst.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, dst))?;
            // The slice filled up: the peer is likely sending more than it
            // holds, so the next reads go through a buffer.
            if dst.filled().len() > before && dst.remaining() == 0 {
                this.ahead = Some(BytesMut::with_capacity(BULK));
            }
            return Poll::Ready(Ok(()));
        };
        if ahead.is_empty() {
            ahead.clear();
            ahead.reserve(BULK);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, ahead) {
                Poll::Pending => {
                    // Nothing waiting and nothing held: the peer went
                    // quiet, so the buffer goes until it sends in bulk again.
                    this.ahead = None;
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // End of stream: nothing copied, as a plain read says it.
                Poll::Ready(Ok(0)) => {
                    this.ahead = None;
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
        let n = ahead.len().min(dst.remaining());
        dst.put_slice(&ahead[..n]);
        ahead.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Small reads pass straight through; a read that fills the caller's
    /// slice starts reading ahead, which delivers every byte in order and
    /// ends once the peer is quiet.
    #[tokio::test]
    async fn reads_ahead_only_while_the_peer_sends_in_bulk() {
        let (mut peer, ours) = tokio::io::duplex(256 * 1024);
        let mut reader = ReadAhead::new(ours);
        let mut small = [0u8; 4096];

        peer.write_all(b"hello").await.unwrap();
        let n = reader.read(&mut small).await.unwrap();
        assert_eq!(&small[..n], b"hello");
        assert!(!reader.is_reading_ahead());

        let bulk: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        peer.write_all(&bulk).await.unwrap();
        let mut got = Vec::new();
        while got.len() < bulk.len() {
            let n = reader.read(&mut small).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&small[..n]);
            if got.len() == 4096 {
                assert!(
                    reader.is_reading_ahead(),
                    "a full slice starts reading ahead"
                );
            }
        }
        assert_eq!(got, bulk);

        // Quiet peer: the next read waits, and the buffer is gone.
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            reader.read(&mut small),
        )
        .await;
        assert!(waited.is_err());
        assert!(!reader.is_reading_ahead());

        peer.write_all(b"again").await.unwrap();
        drop(peer);
        let n = reader.read(&mut small).await.unwrap();
        assert_eq!(&small[..n], b"again");
        assert_eq!(reader.read(&mut small).await.unwrap(), 0, "end of stream");
    }

    /// End of stream while reading ahead reads as zero bytes.
    #[tokio::test]
    async fn end_of_stream_while_reading_ahead_is_zero_bytes() {
        let (mut peer, ours) = tokio::io::duplex(64 * 1024);
        let mut reader = ReadAhead::new(ours);
        let mut slice = [0u8; 8];
        peer.write_all(&[7u8; 20]).await.unwrap();
        drop(peer);
        let mut got = Vec::new();
        loop {
            let n = reader.read(&mut slice).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&slice[..n]);
        }
        assert_eq!(got, vec![7u8; 20]);
    }
}

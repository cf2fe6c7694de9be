//! The secure channel over a WebSocket (DESIGN.md, "The wire" 2–3): one
//! Noise handshake message per binary WebSocket message, then one sealed
//! record per binary message. Used by both the gateway and the client, so
//! the two cannot drift apart.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use portcullis_crypto::{Handshake, PROLOGUE, PublicKey, StaticKeypair, Transport};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use zeroize::Zeroizing;

/// The URL path of the relay endpoint.
pub const RELAY_PATH: &str = "/api/v1/relay/connect";

/// The URL path of ya-environment-protocol.v1 inside the same Noise
/// channel (JSON-RPC messages in the records instead of relay frames).
pub const ENVIRONMENT_PATH: &str = "/api/v1/environment/connect";

/// WebSocket limits (the gateway's; the client's are
/// [`client_ws_config`]): one Noise message (≤ 65535 bytes) per
/// WebSocket message, so nothing larger is ever reassembled; a 4 KiB read
/// buffer keeps idle sessions cheap (it is held by every connection, 16 of
/// the 36 KiB an idle session took with 16 KiB), and the gateway's streams
/// read ahead in bulk ([`crate::read_ahead`]) so that uploads do not pay
/// for it in system calls. Small records queued behind each other
/// are written with one system call: `RecordWriter::send` without `flush`
/// leaves them in the write buffer (up to 64 KiB; a larger record goes out
/// at once), and both ends' writer tasks flush when [`nothing_behind`]
/// says their queue stays empty. With 16 requests in flight per session
/// this took the gateway from 1.00 `sendto` per answer to 0.30–0.59
/// (bench, 2026-11-23).
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(4 * 1024)
        .write_buffer_size(64 * 1024)
        .max_write_buffer_size(4 * 65536)
        .max_message_size(Some(portcullis_crypto::MAX_MESSAGE_LEN))
        .max_frame_size(Some(portcullis_crypto::MAX_MESSAGE_LEN))
}

/// The client's limits: [`ws_config`] with a larger write buffer, so that
/// an upload's records go out four to a system call. Fewer, larger writes
/// wake the gateway less often: a 1 GiB put, alternated eight times
/// against one gateway, ran at a median of 1,263 MB/s against 1,095 with
/// the gateway's 64 KiB (client CPU 580–700 ms against 630–810). The
/// client's read buffer stays at 16 KiB: a larger one made downloads
/// slower.
pub fn client_ws_config() -> WebSocketConfig {
    ws_config()
        .read_buffer_size(16 * 1024)
        .write_buffer_size(256 * 1024)
        .max_write_buffer_size(512 * 1024)
}

#[derive(Debug, Error)]
pub enum ChannelError {
    #[error("WebSocket: {0}")]
    WebSocket(#[from] tungstenite::Error),
    #[error("the peer closed the connection{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Closed { reason: Option<String> },
    #[error("the peer sent a text WebSocket message; only binary messages carry the protocol")]
    TextMessage,
    #[error("secure channel: {0}")]
    Noise(#[from] portcullis_crypto::Error),
    #[error("handshake: {0}")]
    Handshake(String),
    #[error("plain profile: {0}")]
    Plain(String),
    /// `ya-environment-protocol.v1`: framing, I/O, or a refused
    /// `initialize`.
    #[error("ya-environment-protocol.v1: {0}")]
    Profile(String),
    #[error("timed out")]
    Timeout,
}

/// Reads the next binary message, skipping WebSocket pings and pongs (which
/// tungstenite answers itself).
async fn next_binary<S>(stream: &mut S) -> Result<Bytes, ChannelError>
where
    S: futures_util::Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    loop {
        match stream.next().await {
            None => return Err(ChannelError::Closed { reason: None }),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(Message::Binary(data))) => return Ok(data),
            Some(Ok(Message::Text(_))) => return Err(ChannelError::TextMessage),
            Some(Ok(Message::Close(frame))) => {
                return Err(ChannelError::Closed {
                    reason: frame
                        .map(|f| f.reason.to_string())
                        .filter(|r| !r.is_empty()),
                });
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
        }
    }
}

/// What the gateway learns from a finished handshake.
pub struct Accepted<S> {
    pub writer: RecordWriter<S>,
    pub reader: RecordReader<S>,
    /// The client's authenticated static key.
    pub client_key: PublicKey,
    /// The payload of message 3 (credentials JSON); zeroized on drop.
    pub credentials: Zeroizing<Vec<u8>>,
}

/// Runs the responder side: reads message 1 (which must carry an empty
/// payload), answers with `gateway_info` in message 2, reads message 3.
pub async fn accept<S>(
    mut ws: WebSocketStream<S>,
    key: &StaticKeypair,
    gateway_info: &[u8],
) -> Result<Accepted<S>, ChannelError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hs = Handshake::responder(key, PROLOGUE);
    let m1 = next_binary(&mut ws).await?;
    if !hs.read_message(&m1)?.is_empty() {
        return Err(ChannelError::Handshake(
            "message 1 must have an empty payload".into(),
        ));
    }
    let m2 = hs.write_message(gateway_info)?;
    ws.send(Message::Binary(m2.into())).await?;
    let m3 = next_binary(&mut ws).await?;
    let credentials = Zeroizing::new(hs.read_message(&m3)?);
    let transport = hs.into_transport()?;
    let client_key = *transport.remote_static();
    let (writer, reader) = split(ws, transport);
    Ok(Accepted {
        writer,
        reader,
        client_key,
        credentials,
    })
}

/// What the client learns from a finished handshake.
pub struct Connected<S> {
    pub writer: RecordWriter<S>,
    pub reader: RecordReader<S>,
    /// The payload of message 2: the gateway's description (JSON).
    pub gateway_info: Vec<u8>,
}

/// Runs the initiator side. The gateway's static key must be `pinned`; on a
/// mismatch the handshake stops before message 3, so `credentials` (which
/// may hold a token) are never sent to an impostor.
pub async fn connect<S>(
    mut ws: WebSocketStream<S>,
    identity: &StaticKeypair,
    pinned: PublicKey,
    credentials: &[u8],
) -> Result<Connected<S>, ChannelError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hs = Handshake::initiator(identity, PROLOGUE).pin_remote_static(pinned);
    let m1 = hs.write_message(&[])?;
    ws.send(Message::Binary(m1.into())).await?;
    let m2 = next_binary(&mut ws).await?;
    let gateway_info = hs.read_message(&m2)?;
    let m3 = hs.write_message(credentials)?;
    ws.send(Message::Binary(m3.into())).await?;
    let (writer, reader) = split(ws, hs.into_transport()?);
    Ok(Connected {
        writer,
        reader,
        gateway_info,
    })
}

fn split<S>(ws: WebSocketStream<S>, transport: Transport) -> (RecordWriter<S>, RecordReader<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (sink, stream) = ws.split();
    let (sender, receiver) = transport.split();
    (
        RecordWriter {
            sink,
            noise: sender,
        },
        RecordReader {
            stream,
            noise: receiver,
        },
    )
}

/// Where a session reads records from: the opened plaintext of one record
/// per message, whatever carries the messages. The Noise channel over
/// WebSocket is one; a transport that needs no Noise (a local pipe) is
/// another.
pub trait RecordSource: Send {
    /// The next record; any error ends the channel.
    fn recv(&mut self) -> impl std::future::Future<Output = Result<Vec<u8>, ChannelError>> + Send;
}

/// Where a session writes records to; see [`RecordSource`].
pub trait RecordSink: Send + 'static {
    /// Queues `record`; with `flush` the queue is written out.
    fn send(
        &mut self,
        record: Vec<u8>,
        flush: bool,
    ) -> impl std::future::Future<Output = Result<(), ChannelError>> + Send;
    fn flush(&mut self) -> impl std::future::Future<Output = Result<(), ChannelError>> + Send;
    /// Ends the channel, saying why (and whether a policy decided it).
    fn close(&mut self, policy: bool, reason: &str)
    -> impl std::future::Future<Output = ()> + Send;
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> RecordSource for RecordReader<S> {
    fn recv(&mut self) -> impl std::future::Future<Output = Result<Vec<u8>, ChannelError>> + Send {
        RecordReader::recv(self)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> RecordSink for RecordWriter<S> {
    fn send(
        &mut self,
        record: Vec<u8>,
        flush: bool,
    ) -> impl std::future::Future<Output = Result<(), ChannelError>> + Send {
        RecordWriter::send(self, record, flush)
    }

    fn flush(&mut self) -> impl std::future::Future<Output = Result<(), ChannelError>> + Send {
        RecordWriter::flush(self)
    }

    fn close(
        &mut self,
        policy: bool,
        reason: &str,
    ) -> impl std::future::Future<Output = ()> + Send {
        RecordWriter::close(self, policy, reason)
    }
}

/// Whether a writer task should flush after its current record: true
/// when nothing is queued behind it. When `others_in_flight` says more
/// answers or requests of this connection are under way (asked only when
/// the queue is empty) it first lets every other ready task run once, so
/// records made ready together (the answers one audit group commit
/// releases, the requests of many tasks) leave in one write. A record
/// alone on its connection is written at once: the turn of the scheduler
/// would only add to its latency.
pub async fn nothing_behind<T>(
    queue: &tokio::sync::mpsc::Receiver<T>,
    others_in_flight: impl FnOnce() -> bool,
) -> bool {
    if !queue.is_empty() {
        return false;
    }
    if !others_in_flight() {
        return true;
    }
    tokio::task::yield_now().await;
    queue.is_empty()
}

/// Seals records and writes them, one per binary WebSocket message.
pub struct RecordWriter<S> {
    sink: SplitSink<WebSocketStream<S>, Message>,
    noise: portcullis_crypto::Sender,
}

impl<S: AsyncRead + AsyncWrite + Unpin> RecordWriter<S> {
    /// Seals `record` (the plaintext, reused as the buffer) and queues it;
    /// with `flush` the queue is written out.
    pub async fn send(&mut self, mut record: Vec<u8>, flush: bool) -> Result<(), ChannelError> {
        record.reserve_exact(portcullis_crypto::TAG_LEN);
        self.noise.seal_in_place(&mut record)?;
        let message = Message::Binary(record.into());
        if flush {
            self.sink.send(message).await?
        } else {
            self.sink.feed(message).await?
        }
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<(), ChannelError> {
        self.sink.flush().await.map_err(Into::into)
    }

    /// Sends a WebSocket close frame with `reason` (the close code says
    /// whether it was a policy decision) and stops writing. Bounded, so a
    /// peer that does not read cannot hold it.
    pub async fn close(&mut self, policy: bool, reason: &str) {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.sink.send(close(policy, reason)),
        )
        .await;
    }
}

/// A close message with `reason` (cut to 120 characters); its code says
/// whether a policy decided it.
pub(crate) fn close(policy: bool, reason: &str) -> Message {
    let code = if policy {
        CloseCode::Policy
    } else {
        CloseCode::Normal
    };
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.chars().take(120).collect::<String>().into(),
    }))
}

/// Reads binary WebSocket messages and opens them as records.
pub struct RecordReader<S> {
    stream: SplitStream<WebSocketStream<S>>,
    noise: portcullis_crypto::Receiver,
}

impl<S: AsyncRead + AsyncWrite + Unpin> RecordReader<S> {
    /// The next record's plaintext. Any failure ends the channel: a text
    /// message, a message that does not decrypt (altered, replayed,
    /// reordered), or a close.
    pub async fn recv(&mut self) -> Result<Vec<u8>, ChannelError> {
        let message = next_binary(&mut self.stream).await?;
        let mut buf = Vec::from(message);
        self.noise.open_in_place(&mut buf)?;
        Ok(buf)
    }

    /// [`recv`](Self::recv) into a buffer from `pool`, which gets it back
    /// when the last slice of the returned record is dropped.
    pub async fn recv_pooled(&mut self, pool: &BufferPool) -> Result<Bytes, ChannelError> {
        let message = next_binary(&mut self.stream).await?;
        let mut buf = pool.take();
        buf.extend_from_slice(&message);
        drop(message);
        self.noise.open_in_place(&mut buf)?;
        Ok(pool.lend(buf))
    }
}

/// Buffers for opened records, used again once every slice of a record is
/// dropped. A client receiving a download copies each message out of the
/// WebSocket's buffer (it is shared, so it cannot be opened in place);
/// into freshly allocated memory that cost more than the copy itself
/// (the allocator returned the memory between records, and every page
/// faulted in anew: a third of the client's system time).
#[derive(Clone, Default)]
pub struct BufferPool(Arc<Mutex<Vec<Vec<u8>>>>);

/// Buffers a pool keeps: more than a download has in flight (records
/// queued for the writer and the hasher), at most 64 KiB each.
const POOL_BUFFERS: usize = 160;

impl BufferPool {
    /// An empty buffer, with the capacity of one used before if any.
    fn take(&self) -> Vec<u8> {
        let spare = self.0.lock().ok().and_then(|mut spare| spare.pop());
        spare.unwrap_or_default()
    }

    /// `data` as `Bytes` that give it back to the pool when the last
    /// slice of them is dropped.
    fn lend(&self, data: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            data,
            pool: Arc::downgrade(&self.0),
        })
    }

    #[cfg(test)]
    fn spare(&self) -> usize {
        self.0.lock().map_or(0, |spare| spare.len())
    }
}

/// A record's buffer on loan from a [`BufferPool`].
struct Pooled {
    data: Vec<u8>,
    pool: Weak<Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        if let Ok(mut spare) = pool.lock()
            && spare.len() < POOL_BUFFERS
        {
            let mut data = std::mem::take(&mut self.data);
            data.clear();
            spare.push(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record alone is flushed at once; one with others in flight waits
    /// for the tasks that are ready, and is not flushed when they queued
    /// something behind it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_writer_waits_one_turn_only_while_others_are_in_flight() {
        for others in [false, true] {
            let (tx, rx) = tokio::sync::mpsc::channel::<u8>(4);
            // Ready, but on this one thread it runs only if the writer yields.
            let answer = tokio::spawn(async move { tx.send(1).await });
            assert_eq!(nothing_behind(&rx, || others).await, !others);
            answer.await.unwrap().unwrap();
            assert!(!rx.is_empty());
            assert!(
                !nothing_behind(&rx, || panic!("asked with a record queued")).await,
                "a queued record is never last"
            );
        }
    }

    #[test]
    fn a_pooled_buffer_comes_back_empty_when_its_last_slice_is_dropped() {
        let pool = BufferPool::default();
        let record = pool.lend(vec![7u8; 1000]);
        let chunk = record.slice(10..20);
        drop(record);
        assert_eq!(pool.spare(), 0, "a slice still uses it");
        assert_eq!(&chunk[..], &[7u8; 10]);
        drop(chunk);
        assert_eq!(pool.spare(), 1);
        let again = pool.take();
        assert!(again.is_empty() && again.capacity() >= 1000);
        assert_eq!(pool.spare(), 0);
    }

    #[test]
    fn a_pool_keeps_at_most_its_bound_and_lent_bytes_may_outlive_it() {
        let pool = BufferPool::default();
        let lent: Vec<Bytes> = (0..POOL_BUFFERS + 10)
            .map(|_| pool.lend(vec![0u8; 16]))
            .collect();
        drop(lent);
        assert_eq!(pool.spare(), POOL_BUFFERS);
        // Bytes that outlive their pool just free their buffer.
        let late = pool.lend(vec![1u8; 16]);
        drop(pool);
        drop(late);
    }
}

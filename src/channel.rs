//! The secure channel over a WebSocket (DESIGN.md, "The wire" 2–3): one
//! Noise handshake message per binary WebSocket message, then one sealed
//! record per binary message. Used by both the gateway and the client, so
//! the two cannot drift apart.

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

/// WebSocket limits for both ends: one Noise message (≤ 65535 bytes) per
/// WebSocket message, so nothing larger is ever reassembled; a small read
/// buffer keeps idle sessions cheap.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(16 * 1024)
        .write_buffer_size(0)
        .max_write_buffer_size(4 * 65536)
        .max_message_size(Some(portcullis_crypto::MAX_MESSAGE_LEN))
        .max_frame_size(Some(portcullis_crypto::MAX_MESSAGE_LEN))
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
        let code = if policy {
            CloseCode::Policy
        } else {
            CloseCode::Normal
        };
        let frame = CloseFrame {
            code,
            reason: reason.chars().take(120).collect::<String>().into(),
        };
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            self.sink.send(Message::Close(Some(frame))),
        )
        .await;
    }
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
}

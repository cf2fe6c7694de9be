//! The plain profile: relay.v1 frames as JSON text WebSocket messages,
//! exactly as the relay spec writes them, with no Noise channel inside
//! (for runtimes without Noise; the connection must be TLS, and the
//! runtime is authenticated by its certificate, not by a key). The
//! session still speaks in records ([`RecordSource`], [`RecordSink`]): a
//! text message is a frame record; a frame the session sends in parts
//! goes out as one text message once whole. Binary chunks have no place
//! here: sending one is an error that ends the channel, and a binary
//! message from the peer is refused the same way.

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::channel::{ChannelError, RecordSink, RecordSource};
use crate::record::{FrameJoiner, JoinError, KIND_FRAME};

/// WebSocket limits for the plain profile: a message is a whole frame, up
/// to `max_frame` bytes.
pub fn plain_ws_config(max_frame: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(max_frame))
        .max_frame_size(Some(max_frame))
}

/// Splits an upgraded WebSocket into the plain profile's two halves.
/// `max_frame` bounds a frame the writer joins from parts.
pub fn split<S>(ws: WebSocketStream<S>, max_frame: usize) -> (PlainWriter<S>, PlainReader<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (sink, stream) = ws.split();
    (
        PlainWriter {
            sink,
            parts: FrameJoiner::new(max_frame),
        },
        PlainReader { stream },
    )
}

/// Reads text messages as frame records.
pub struct PlainReader<S> {
    stream: SplitStream<WebSocketStream<S>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> RecordSource for PlainReader<S> {
    async fn recv(&mut self) -> Result<Vec<u8>, ChannelError> {
        loop {
            match self.stream.next().await {
                None => return Err(ChannelError::Closed { reason: None }),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(Message::Text(text))) => {
                    let mut record = Vec::with_capacity(text.len() + 1);
                    record.push(KIND_FRAME);
                    record.extend_from_slice(text.as_bytes());
                    return Ok(record);
                }
                Some(Ok(Message::Binary(_))) => {
                    return Err(ChannelError::Plain(
                        "a binary message in the plain profile, which carries JSON text frames only"
                            .into(),
                    ));
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(ChannelError::Closed {
                        reason: frame.map(|f| f.reason.to_string()),
                    });
                }
                Some(Ok(_)) => {}
            }
        }
    }
}

/// Writes frame records as text messages.
pub struct PlainWriter<S> {
    sink: SplitSink<WebSocketStream<S>, Message>,
    /// Frames being joined from their parts.
    parts: FrameJoiner,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> PlainWriter<S> {
    async fn text(&mut self, json: Vec<u8>, flush: bool) -> Result<(), ChannelError> {
        let text = String::from_utf8(json)
            .map_err(|_| ChannelError::Plain("a frame that is not UTF-8".into()))?;
        let message = Message::Text(text.into());
        match flush {
            true => self.sink.send(message).await?,
            false => self.sink.feed(message).await?,
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> RecordSink for PlainWriter<S> {
    async fn send(&mut self, record: Vec<u8>, flush: bool) -> Result<(), ChannelError> {
        match self.parts.push(record) {
            Ok(Some(json)) => self.text(json, flush).await,
            Ok(None) => Ok(()),
            Err(JoinError::TooLarge) => Err(ChannelError::Plain("a frame past max_frame".into())),
            Err(JoinError::Chunk) => Err(ChannelError::Plain(
                "binary output or file data in the plain profile, which has no chunks \
                 (ask for stream frames, not `stream: true` or `output: chunks`)"
                    .into(),
            )),
            Err(JoinError::NotARecord) => Err(ChannelError::Plain("not a record".into())),
        }
    }

    async fn flush(&mut self) -> Result<(), ChannelError> {
        self.sink.flush().await.map_err(Into::into)
    }

    async fn close(&mut self, policy: bool, reason: &str) {
        let message = crate::channel::close(policy, reason);
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(2), self.sink.send(message)).await;
    }
}

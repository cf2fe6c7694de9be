//! The `ya-environment-protocol.v1` profile (the 0.92 spec): JSON-RPC 2.0
//! messages in place of relay.v1 frames, carried LSP-framed over stdio or
//! a Unix socket. It is a codec, not a second session: [`ProfileReader`]
//! and [`ProfileWriter`] are the [`RecordSource`] and [`RecordSink`] a
//! session reads and writes, and [`translate`] maps each message to the
//! relay.v1 frames the one admission path already knows (`process.start`
//! → `shell.start`, `mount_id` → `root_id`, …) and each frame back.
//!
//! There are no binary chunks in this profile: file data and output travel
//! inline, as the spec has them.

pub mod codes;
pub mod lsp;
pub mod schema;
pub mod translate;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::channel::{ChannelError, RecordSink, RecordSource};
use crate::record::{FrameJoiner, JoinError, KIND_FRAME, KIND_PART};
pub use translate::{PROTOCOL, TARGET_ID, Translator};

/// Where whole messages come from (LSP framing, a WebSocket's text
/// messages).
pub trait MessageSource: Send {
    fn next(&mut self) -> impl Future<Output = Result<Vec<u8>, ChannelError>> + Send;
}

/// Where whole messages go.
pub trait MessageSink: Send {
    fn write(
        &mut self,
        message: &[u8],
        flush: bool,
    ) -> impl Future<Output = Result<(), ChannelError>> + Send;
    fn flush(&mut self) -> impl Future<Output = Result<(), ChannelError>> + Send;
    /// Ends the stream; `policy` and `reason` as [`RecordSink::close`]
    /// takes them, for a transport that can say them.
    fn close(&mut self, policy: bool, reason: &str) -> impl Future<Output = ()> + Send;
}

/// The two halves of a channel in this profile, sharing one
/// [`Translator`]. `max_frame` bounds a message either way.
pub fn split<S: MessageSource, K: MessageSink>(
    source: S,
    sink: K,
    max_frame: usize,
) -> (ProfileWriter<K>, ProfileReader<S>) {
    let shared = Arc::new(Mutex::new(Translator::new()));
    let (hello_tx, hello_rx) = watch::channel(false);
    (
        ProfileWriter {
            sink,
            shared: shared.clone(),
            parts: FrameJoiner::new(max_frame),
            hello: hello_tx,
        },
        ProfileReader {
            source,
            shared,
            queue: VecDeque::new(),
            max_frame,
            hello: hello_rx,
        },
    )
}

fn lock(shared: &Mutex<Translator>) -> std::sync::MutexGuard<'_, Translator> {
    // The translator holds no invariant a panic elsewhere could break
    // half-way that matters more than answering.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads messages and hands the session relay records.
pub struct ProfileReader<S> {
    source: S,
    shared: Arc<Mutex<Translator>>,
    queue: VecDeque<Vec<u8>>,
    max_frame: usize,
    /// Set once the writer has passed the session's hello: requests are
    /// mapped with the mounts it names.
    hello: watch::Receiver<bool>,
}

impl<S: MessageSource> RecordSource for ProfileReader<S> {
    async fn recv(&mut self) -> Result<Vec<u8>, ChannelError> {
        loop {
            if let Some(record) = self.queue.pop_front() {
                return Ok(record);
            }
            // Each await here may be dropped (the session's loop selects
            // over it): a message once read is translated and queued
            // before the next await.
            if self.hello.wait_for(|seen| *seen).await.is_err() {
                return Err(ChannelError::Closed { reason: None });
            }
            let message = self.source.next().await?;
            let records = lock(&self.shared)
                .inbound(&message, self.max_frame)
                .map_err(|e| ChannelError::Profile(e.to_string()))?;
            self.queue.extend(records);
        }
    }
}

/// Takes the session's relay records and writes messages.
pub struct ProfileWriter<K> {
    sink: K,
    shared: Arc<Mutex<Translator>>,
    /// Frames being joined from their parts.
    parts: FrameJoiner,
    hello: watch::Sender<bool>,
}

impl<K: MessageSink> ProfileWriter<K> {
    async fn frame(&mut self, json: &[u8], flush: bool) -> Result<(), ChannelError> {
        let (messages, hello) = {
            let mut translator = lock(&self.shared);
            (translator.outbound(json), translator.has_hello())
        };
        if hello && !*self.hello.borrow() {
            self.hello.send_replace(true);
        }
        for message in messages {
            let bytes = serde_json::to_vec(&message).unwrap_or_default();
            self.sink.write(&bytes, false).await?;
        }
        // Also when this frame said nothing (an answer already given): the
        // flush is for what is queued before it.
        if flush {
            self.sink.flush().await?;
        }
        Ok(())
    }
}

impl<K: MessageSink + 'static> RecordSink for ProfileWriter<K> {
    async fn send(&mut self, record: Vec<u8>, flush: bool) -> Result<(), ChannelError> {
        match self.parts.push(record) {
            Ok(Some(json)) => self.frame(&json, flush).await,
            Ok(None) => Ok(()),
            Err(JoinError::TooLarge) => Err(ChannelError::Profile("a frame past max_frame".into())),
            Err(JoinError::Chunk) => Err(ChannelError::Profile(
                "binary data in ya-environment-protocol.v1, which has none".into(),
            )),
            Err(JoinError::NotARecord) => Err(ChannelError::Profile("not a record".into())),
        }
    }

    async fn flush(&mut self) -> Result<(), ChannelError> {
        self.sink.flush().await
    }

    async fn close(&mut self, policy: bool, reason: &str) {
        goodbye(&mut self.sink, policy, reason).await;
    }
}

/// Ends a channel before any session (a peer the transport could not map
/// to a principal), saying why as [`ProfileWriter`]'s close does.
pub async fn refuse<K: MessageSink>(mut sink: K, reason: &str) {
    goodbye(&mut sink, true, reason).await;
}

/// The spec's word for a provider going away (`provider.revoked` when a
/// policy decided it, else `provider.offline`), then the end of the
/// stream; bounded, as the peer may not read.
async fn goodbye<K: MessageSink>(sink: &mut K, policy: bool, reason: &str) {
    let kind = if policy {
        "provider.revoked"
    } else {
        "provider.offline"
    };
    let event = serde_json::json!({"jsonrpc": "2.0", "method": "$/event",
        "params": {"event": kind, "payload": {"reason": reason}}});
    let bytes = serde_json::to_vec(&event).unwrap_or_default();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let _ = sink.write(&bytes, true).await;
        sink.close(policy, reason).await;
    })
    .await;
}

/// This profile inside the Noise channel (`/api/v1/environment/connect`):
/// each JSON-RPC message travels as the body of a frame record, or in
/// parts (record kind 0x03) when it is larger than one record — the
/// records of relay.v1, carrying JSON-RPC instead of relay frames.
pub struct RecordMessages<R> {
    records: R,
    parts: crate::record::Assembler,
}

impl<R: RecordSource> RecordMessages<R> {
    /// `parts` joins messages sent in parts (bounded as the session's are).
    pub fn new(records: R, parts: crate::record::Assembler) -> Self {
        Self { records, parts }
    }
}

impl<R: RecordSource> MessageSource for RecordMessages<R> {
    async fn next(&mut self) -> Result<Vec<u8>, ChannelError> {
        loop {
            let mut record = self.records.recv().await?;
            match record.first().copied() {
                Some(KIND_FRAME) => {
                    record.remove(0);
                    return Ok(record);
                }
                Some(KIND_PART) => match crate::record::decode(&record) {
                    Ok(crate::record::Record::Part(part)) => match self.parts.push(part) {
                        None => {}
                        Some(Ok(message)) => return Ok(message),
                        Some(Err(e)) => return Err(ChannelError::Profile(e.to_string())),
                    },
                    Ok(_) => {}
                    Err(e) => return Err(ChannelError::Profile(e.to_string())),
                },
                _ => {
                    return Err(ChannelError::Profile(
                        "a record that is not a message: ya-environment-protocol.v1 has no \
                         binary chunks"
                            .into(),
                    ));
                }
            }
        }
    }
}

/// Writes messages as frame records (in parts when large).
pub struct RecordMessageSink<W> {
    records: W,
}

impl<W: RecordSink> RecordMessageSink<W> {
    pub fn new(records: W) -> Self {
        Self { records }
    }
}

impl<W: RecordSink> MessageSink for RecordMessageSink<W> {
    async fn write(&mut self, message: &[u8], flush: bool) -> Result<(), ChannelError> {
        let room = crate::record::MAX_RECORD_LEN - 2;
        if message.len() < crate::record::MAX_RECORD_LEN {
            let mut record = Vec::with_capacity(message.len() + 1);
            record.push(KIND_FRAME);
            record.extend_from_slice(message);
            return self.records.send(record, flush).await;
        }
        let count = message.len().div_ceil(room);
        for (i, piece) in message.chunks(room).enumerate() {
            let last = i + 1 == count;
            let mut record = Vec::with_capacity(piece.len() + 2);
            record.push(KIND_PART);
            record.push(u8::from(last));
            record.extend_from_slice(piece);
            self.records.send(record, flush && last).await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ChannelError> {
        self.records.flush().await
    }

    async fn close(&mut self, policy: bool, reason: &str) {
        self.records.close(policy, reason).await;
    }
}

/// This profile as the spec's WebSocket transport has it: "each WebSocket
/// text frame carries one JSON-RPC message", no Noise channel inside (for
/// a dialed endpoint whose TLS certificate the gateway checked, like the
/// relay plain profile).
pub fn split_text<S>(
    ws: tokio_tungstenite::WebSocketStream<S>,
) -> (TextMessages<S>, TextMessageSink<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    use futures_util::StreamExt;
    let (sink, stream) = ws.split();
    (TextMessages { stream }, TextMessageSink { sink })
}

pub struct TextMessages<S> {
    stream: futures_util::stream::SplitStream<tokio_tungstenite::WebSocketStream<S>>,
}

impl<S> MessageSource for TextMessages<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    async fn next(&mut self) -> Result<Vec<u8>, ChannelError> {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        loop {
            match self.stream.next().await {
                None => return Err(ChannelError::Closed { reason: None }),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(Message::Text(text))) => return Ok(text.as_bytes().to_vec()),
                Some(Ok(Message::Binary(_))) => {
                    return Err(ChannelError::Profile(
                        "a binary WebSocket message: each message is JSON-RPC text".into(),
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

pub struct TextMessageSink<S> {
    sink: futures_util::stream::SplitSink<
        tokio_tungstenite::WebSocketStream<S>,
        tokio_tungstenite::tungstenite::Message,
    >,
}

impl<S> MessageSink for TextMessageSink<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
{
    async fn write(&mut self, message: &[u8], flush: bool) -> Result<(), ChannelError> {
        use futures_util::SinkExt;
        let text = String::from_utf8(message.to_vec())
            .map_err(|_| ChannelError::Profile("a message that is not UTF-8".into()))?;
        let message = tokio_tungstenite::tungstenite::Message::Text(text.into());
        match flush {
            true => self.sink.send(message).await?,
            false => self.sink.feed(message).await?,
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ChannelError> {
        use futures_util::SinkExt;
        self.sink.flush().await.map_err(Into::into)
    }

    async fn close(&mut self, policy: bool, reason: &str) {
        use futures_util::SinkExt;
        let _ = self.sink.send(crate::channel::close(policy, reason)).await;
    }
}

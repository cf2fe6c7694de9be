//! The session's writer task: it drains the bounded outbox into the
//! socket, so a slow peer slows only its own session.

use portcullis_wire::channel::RecordSink;
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Frame, Response};
use portcullis_wire::record::{self, ChunkRecord};
use serde_json::json;
use tokio::sync::mpsc;

use crate::provider::Outbound;

/// Drains the outbox into the socket. Consecutive records are written
/// together and flushed when the outbox runs dry.
pub(super) async fn write_loop<W: RecordSink>(mut writer: W, mut outbox: mpsc::Receiver<Outbound>) {
    while let Some(item) = outbox.recv().await {
        let sent = match item {
            Outbound::Close { policy, reason } => {
                let _ = writer.flush().await;
                return writer.close(policy, &reason).await;
            }
            Outbound::Frame(frame) => send(&mut writer, encode_frame(frame), &outbox).await,
            Outbound::Record(chunk) => send(&mut writer, chunk.into_record(), &outbox).await,
            Outbound::Chunk { id, channel, data } => {
                let capacity = record::chunk_capacity(&id).max(1);
                for piece in data.chunks(capacity) {
                    let mut chunk = ChunkRecord::new(&id, channel, piece.len());
                    chunk.buffer().extend_from_slice(piece);
                    if !send(&mut writer, chunk.into_record(), &outbox).await {
                        return;
                    }
                }
                true
            }
        };
        if !sent {
            return;
        }
    }
    let _ = writer.flush().await;
}

/// Writes one record, flushing when nothing else is queued behind it.
/// False once the connection is gone.
async fn send<W: RecordSink>(
    writer: &mut W,
    record: Vec<u8>,
    outbox: &mpsc::Receiver<Outbound>,
) -> bool {
    writer.send(record, outbox.is_empty()).await.is_ok()
}

fn encode_frame(frame: Frame) -> Vec<u8> {
    let mut buf = Vec::with_capacity(256);
    if record::encode_frame(&frame, &mut buf).is_ok() {
        return buf;
    }
    // Only a result can be this large; answer with an error instead.
    let id = match &frame {
        Frame::Response(r) => r.id.clone(),
        _ => {
            return encode_frame(Frame::Event(Event {
                event: "relay.error".into(),
                payload: json!({"message": "an event was too large to send"}),
            }));
        }
    };
    let error = ErrorBody::new(
        ErrorCode::ProviderError,
        "the result is larger than one record (65519 bytes)",
    );
    buf.clear();
    let _ = record::encode_frame(&Frame::Response(Response::err(id, error)), &mut buf);
    buf
}

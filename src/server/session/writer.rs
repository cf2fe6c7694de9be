//! The session's writer task: it drains the bounded outbox into the
//! socket, so a slow peer slows only its own session.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use portcullis_wire::channel::{self, RecordSink};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Frame, Response};
use portcullis_wire::record::{self, ChunkRecord};
use serde_json::json;
use tokio::sync::mpsc;

use crate::provider::Outbound;

/// Drains the outbox into the socket. Consecutive records are written
/// together and flushed when the outbox runs dry.
pub(super) async fn write_loop<W: RecordSink>(
    mut writer: Box<W>,
    outbox: mpsc::Receiver<Outbound>,
    max_frame: usize,
    in_flight: Arc<AtomicUsize>,
) {
    let mut queue = Queue { outbox, in_flight };
    while let Some(item) = queue.outbox.recv().await {
        let sent = match item {
            Outbound::Close { policy, reason } => {
                let _ = writer.flush().await;
                return writer.close(policy, &reason).await;
            }
            Outbound::Frame(frame) => {
                let mut sent = true;
                for record in encode_frame(*frame, max_frame) {
                    sent = sent && queue.send(&mut *writer, record).await;
                }
                sent
            }
            Outbound::Record(chunk) => queue.send(&mut *writer, chunk.into_record()).await,
            Outbound::Chunk { id, channel, data } => {
                let capacity = record::chunk_capacity(&id).max(1);
                for piece in data.chunks(capacity) {
                    let mut chunk = ChunkRecord::new(&id, channel, piece.len());
                    chunk.buffer().extend_from_slice(piece);
                    if !queue.send(&mut *writer, chunk.into_record()).await {
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

/// What the writer drains, and how many of the session's requests are not
/// yet answered (the record being written's among them).
struct Queue {
    outbox: mpsc::Receiver<Outbound>,
    in_flight: Arc<AtomicUsize>,
}

impl Queue {
    /// Writes one record, flushing when nothing else is queued behind it.
    /// False once the connection is gone.
    async fn send<W: RecordSink>(&self, writer: &mut W, record: Vec<u8>) -> bool {
        let others = || self.in_flight.load(Ordering::Relaxed) > 1;
        let flush = channel::nothing_behind(&self.outbox, others).await;
        writer.send(record, flush).await.is_ok()
    }
}

/// The records of `frame` (in parts when larger than one record); one
/// larger than `max_frame` becomes an error response instead.
fn encode_frame(frame: Frame, max_frame: usize) -> Vec<Vec<u8>> {
    let limit = match record::encode_frame_records(&frame, max_frame) {
        Ok(records) => return records,
        Err(_) => max_frame,
    };
    let id = match &frame {
        Frame::Response(r) => r.id.clone(),
        _ => {
            let event = Frame::Event(Event {
                event: "relay.error".into(),
                payload: json!({"code": "provider_error", "message": "an event was too large to send"}),
            });
            return encode_frame(event, max_frame);
        }
    };
    let error = ErrorBody::new(
        ErrorCode::ProviderError,
        format!("the result is larger than {limit} bytes, the gateway's max_frame"),
    );
    let mut buf = Vec::new();
    let _ = record::encode_frame(&Frame::Response(Response::err(id, error)), &mut buf);
    vec![buf]
}

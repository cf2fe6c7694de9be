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
    mut outbox: mpsc::Receiver<Outbound>,
    max_frame: usize,
    in_flight: Arc<AtomicUsize>,
) {
    while let Some(item) = outbox.recv().await {
        let sent = match item {
            Outbound::Close { policy, reason } => {
                let _ = writer.flush().await;
                return writer.close(policy, &reason).await;
            }
            Outbound::Frame(frame) => {
                let mut sent = true;
                for record in encode_frame(*frame, max_frame) {
                    sent = sent && send(&mut *writer, record, &outbox, &in_flight).await;
                }
                sent
            }
            Outbound::Record(chunk) => {
                send(&mut *writer, chunk.into_record(), &outbox, &in_flight).await
            }
            Outbound::Chunk { id, channel, data } => {
                let capacity = record::chunk_capacity(&id).max(1);
                for piece in data.chunks(capacity) {
                    let mut chunk = ChunkRecord::new(&id, channel, piece.len());
                    chunk.buffer().extend_from_slice(piece);
                    if !send(&mut *writer, chunk.into_record(), &outbox, &in_flight).await {
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
/// False once the connection is gone. `in_flight` counts the session's
/// requests not yet answered (this record's among them).
async fn send<W: RecordSink>(
    writer: &mut W,
    record: Vec<u8>,
    outbox: &mpsc::Receiver<Outbound>,
    in_flight: &AtomicUsize,
) -> bool {
    let others = in_flight.load(Ordering::Relaxed) > 1;
    let flush = channel::nothing_behind(outbox, others).await;
    writer.send(record, flush).await.is_ok()
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

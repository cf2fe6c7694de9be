//! File transfer for the client library: `file.read` and `file.write`
//! with `stream: true`, moving data as chunks on channel 4 (file data).
//! What `portcullis cat|get|put` and agent runtimes written in Rust use.

use std::io::{Read, Write};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use portcullis_wire::record::{Channel, ChunkRecord};

use crate::{Client, ClientError, StreamItem};

/// How [`Client::upload`] writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct UploadOptions {
    /// The length the gateway insists on: any other is refused and
    /// nothing is written.
    pub size: Option<u64>,
    /// Append to the file instead of replacing it atomically.
    pub append: bool,
    /// Ask for the SHA-256 of what was written in the result.
    pub sha256: bool,
}

/// Records an upload reads ahead of the socket.
const UPLOAD_QUEUE: usize = 4;
/// Pieces of a download queued for the thread that writes them.
const DOWNLOAD_QUEUE: usize = 16;

impl Client {
    /// Streams a file into `out`; `progress` hears the bytes so far. The
    /// result carries `size` and `length` (and with `sha256`, the
    /// gateway's SHA-256 of the bytes it sent); the download fails unless
    /// exactly `length` bytes arrived. `out` is written on a blocking
    /// thread of its own (never on the async runtime) and handed back, so
    /// the caller can sync or inspect it; a slow `out` slows the download.
    ///
    /// The bytes are not hashed again here: every record is authenticated
    /// by the channel's AEAD under a nonce that counts records, so a byte
    /// changed, dropped, reordered or replayed on the way fails the
    /// session, and the authenticated response ends the stream. Hashing
    /// again would cost a core-second per GiB (half a download's CPU on a
    /// small machine) to check only this function's own handling; the
    /// end-to-end tests hash what arrives instead.
    pub async fn download<W: Write + Send + 'static>(
        &self,
        root: &str,
        path: &str,
        out: W,
        sha256: bool,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(Value, W), ClientError> {
        let params = json!({"root_id": root, "path": path, "stream": true, "sha256": sha256});
        let mut handle = self.start("file.read", params).await?;
        let (pieces, mut queued) = mpsc::channel::<Bytes>(DOWNLOAD_QUEUE);
        let writer = tokio::task::spawn_blocking(move || -> std::io::Result<W> {
            let mut out = out;
            while let Some(piece) = queued.blocking_recv() {
                out.write_all(&piece)?;
            }
            out.flush()?;
            Ok(out)
        });
        let mut received = 0u64;
        while let Some(item) = handle.next().await {
            if let StreamItem::Chunk {
                channel: Channel::FileData,
                data,
            } = item
            {
                received += data.len() as u64;
                if pieces.send(data).await.is_err() {
                    // The writer failed; it says why below.
                    let _ = handle.cancel().await;
                    break;
                }
                progress(received);
            }
        }
        drop(pieces);
        let result = handle.response().await;
        let out = joined(writer.await)?;
        let result = result?;
        if result["length"].as_u64() != Some(received) {
            return Err(ClientError::Protocol(format!(
                "the download is incomplete: {received} bytes arrived, the gateway sent {}",
                result["length"]
            )));
        }
        Ok((result, out))
    }

    /// Uploads `input` to `path` as `options` say. `input` is read on a
    /// blocking thread of its own (never on the async runtime), straight
    /// into the records that carry it, a few records ahead of the socket.
    /// A local read error cancels the request, so nothing is left behind.
    pub async fn upload<R: Read + Send + 'static>(
        &self,
        root: &str,
        path: &str,
        input: R,
        options: UploadOptions,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<Value, ClientError> {
        let UploadOptions {
            size,
            append,
            sha256,
        } = options;
        let method = if append { "file.append" } else { "file.write" };
        let params =
            json!({"root_id": root, "path": path, "stream": true, "size": size, "sha256": sha256});
        let mut handle = self.start(method, params).await?;
        let (records, mut read) = mpsc::channel::<std::io::Result<ChunkRecord>>(UPLOAD_QUEUE);
        let id = handle.id.clone();
        // Ends at the end of the input, at a read error, or when the
        // receiver is gone (the upload was refused or failed).
        tokio::task::spawn_blocking(move || {
            let mut input = input;
            loop {
                let mut chunk = ChunkRecord::new(&id, Channel::FileData, usize::MAX);
                let room = chunk.room() as u64;
                let filled = (&mut input).take(room).read_to_end(chunk.buffer());
                let last = !matches!(filled, Ok(n) if n > 0);
                if records.blocking_send(filled.map(|_| chunk)).is_err() || last {
                    return;
                }
            }
        });
        let mut sent = 0u64;
        loop {
            // Refused or failed already: stop sending, read why.
            if handle.finished() {
                return handle.response().await;
            }
            let chunk = match read.recv().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => {
                    let _ = handle.cancel().await;
                    let _ = handle.response().await;
                    return Err(local(e));
                }
                None => {
                    let _ = handle.cancel().await;
                    return Err(ClientError::Protocol(
                        "the upload's reader thread ended early".into(),
                    ));
                }
            };
            let n = chunk.data().len();
            self.send_record(chunk.into_record()).await?;
            if n == 0 {
                break; // the empty chunk ends the upload
            }
            sent += n as u64;
            progress(sent);
        }
        handle.response().await
    }
}

/// A transfer thread's outcome.
fn joined<T>(
    outcome: Result<std::io::Result<T>, tokio::task::JoinError>,
) -> Result<T, ClientError> {
    match outcome {
        Ok(done) => done.map_err(local),
        Err(e) => Err(ClientError::Protocol(format!(
            "the transfer's local thread failed: {e}"
        ))),
    }
}

fn local(e: std::io::Error) -> ClientError {
    ClientError::Protocol(format!("local file: {e}"))
}

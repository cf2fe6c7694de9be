//! File transfer for the client library: `file.read` and `file.write`
//! with `stream: true`, moving data as chunks on channel 4 (file data).
//! What `portcullis cat|get|put` and agent runtimes written in Rust use.

use std::io::{Read, Write};

use serde_json::{Value, json};

use crate::client::{Client, ClientError, StreamItem};
use crate::record::{Channel, ChunkRecord};

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

impl Client {
    /// Streams a file into `out`; `progress` hears the bytes so far. The
    /// result carries `size` and `length` (and with `sha256`, the
    /// gateway's SHA-256 of the bytes it sent); the download fails unless
    /// exactly `length` bytes arrived.
    ///
    /// The bytes are not hashed again here: every record is authenticated
    /// by the channel's AEAD under a nonce that counts records, so a byte
    /// changed, dropped, reordered or replayed on the way fails the
    /// session, and the authenticated response ends the stream. Hashing
    /// again would cost a core-second per GiB (half a download's CPU on a
    /// small machine) to check only this function's own handling; the
    /// end-to-end tests hash what arrives instead.
    pub async fn download(
        &self,
        root: &str,
        path: &str,
        out: &mut dyn Write,
        sha256: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Value, ClientError> {
        let params = json!({"root_id": root, "path": path, "stream": true, "sha256": sha256});
        let mut handle = self.start("file.read", params).await?;
        let mut received = 0u64;
        while let Some(item) = handle.next().await {
            if let StreamItem::Chunk {
                channel: Channel::FileData,
                data,
            } = item
            {
                received += data.len() as u64;
                out.write_all(&data).map_err(local)?;
                progress(received);
            }
        }
        let result = handle.response().await?;
        if result["length"].as_u64() != Some(received) {
            return Err(ClientError::Protocol(format!(
                "the download is incomplete: {received} bytes arrived, the gateway sent {}",
                result["length"]
            )));
        }
        Ok(result)
    }

    /// Uploads `input` to `path` as `options` say.
    pub async fn upload(
        &self,
        root: &str,
        path: &str,
        input: &mut dyn Read,
        options: UploadOptions,
        progress: &mut dyn FnMut(u64),
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
        let mut sent = 0u64;
        loop {
            // Refused or failed already: stop sending, read why.
            if handle.finished() {
                return handle.response().await;
            }
            // The input is read straight into the record that carries it.
            let mut chunk = ChunkRecord::new(&handle.id, Channel::FileData, usize::MAX);
            let room = chunk.room() as u64;
            let n = input
                .take(room)
                .read_to_end(chunk.buffer())
                .map_err(local)?;
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

fn local(e: std::io::Error) -> ClientError {
    ClientError::Protocol(format!("local file: {e}"))
}

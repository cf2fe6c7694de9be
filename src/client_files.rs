//! File transfer for the client library: `file.read` and `file.write`
//! with `stream: true`, moving data as chunks on channel 4 (file data).
//! What `portcullis cat|get|put` and agent runtimes written in Rust use.

use std::io::{Read, Write};

use serde_json::{Value, json};

use crate::client::{Client, ClientError, StreamItem};
use crate::record::{self, Channel};

impl Client {
    /// Streams a file into `out`; `progress` hears the bytes so far. The
    /// result carries `size`, `length` and `sha256`, which is checked
    /// against what arrived.
    pub async fn download(
        &self,
        root: &str,
        path: &str,
        out: &mut dyn Write,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Value, ClientError> {
        let params = json!({"root_id": root, "path": path, "stream": true});
        let mut handle = self.start("file.read", params).await?;
        // Hashing runs on its own thread while this one receives and
        // decrypts the next records: on a small machine they are the two
        // largest costs of a download.
        let (to_hasher, mut chunks) = tokio::sync::mpsc::channel::<bytes::Bytes>(64);
        let hasher = tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256Writer::default();
            while let Some(data) = chunks.blocking_recv() {
                hasher.update(&data);
            }
            hasher.hex()
        });
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
                if to_hasher.send(data).await.is_err() {
                    break;
                }
            }
        }
        drop(to_hasher);
        let result = handle.response().await?;
        let sha256 = hasher
            .await
            .map_err(|e| ClientError::Protocol(format!("hashing the download: {e}")))?;
        if result["length"].as_u64() != Some(received) || result["sha256"] != sha256 {
            return Err(ClientError::Protocol(format!(
                "the download is damaged: {received} bytes arrived, the gateway sent {}",
                result["length"]
            )));
        }
        Ok(result)
    }

    /// Uploads `input` to `path` (replaced atomically, or appended to with
    /// `append`). With `size`, the gateway refuses any other length.
    pub async fn upload(
        &self,
        root: &str,
        path: &str,
        input: &mut dyn Read,
        size: Option<u64>,
        append: bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Value, ClientError> {
        let method = if append { "file.append" } else { "file.write" };
        let params = json!({"root_id": root, "path": path, "stream": true, "size": size});
        let mut handle = self.start(method, params).await?;
        let mut buf = vec![0; record::chunk_capacity(&handle.id)];
        let mut sent = 0u64;
        loop {
            // Refused or failed already: stop sending, read why.
            if handle.finished() {
                return handle.response().await;
            }
            let n = read_full(input, &mut buf).map_err(local)?;
            let mut rec = Vec::with_capacity(n + 200);
            record::encode_chunk(&handle.id, Channel::FileData, &buf[..n], &mut rec)
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            self.send_record(rec).await?;
            if n == 0 {
                break; // the empty chunk ends the upload
            }
            sent += n as u64;
            progress(sent);
        }
        handle.response().await
    }
}

/// Reads until `buf` is full or the input ends.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn local(e: std::io::Error) -> ClientError {
    ClientError::Protocol(format!("local file: {e}"))
}

#[derive(Default)]
struct Sha256Writer(sha2::Sha256);

impl Sha256Writer {
    fn update(&mut self, data: &[u8]) {
        sha2::Digest::update(&mut self.0, data);
    }

    fn hex(self) -> Value {
        Value::String(hex::encode(sha2::Digest::finalize(self.0)))
    }
}

//! A ya-environment-protocol.v1 runtime for the benchmarks: LSP-framed
//! JSON-RPC, one request at a time, over a `portcullis stdio` child or a
//! daemon's environment socket. Written from the 0.92 spec, as a runtime
//! would; nothing of portcullis's own wire.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

pub struct JsonRpc {
    read: BufReader<Box<dyn AsyncRead + Unpin + Send>>,
    write: Box<dyn AsyncWrite + Unpin + Send>,
    child: Option<tokio::process::Child>,
    next: u64,
}

impl JsonRpc {
    /// `portcullis stdio` as this process's child, past its `initialize`.
    pub async fn stdio(binary: &Path, config: &Path, principal: &str) -> Result<Self, String> {
        let log = config.with_extension("log");
        let mut child = tokio::process::Command::new(binary)
            .args(["stdio", "--principal", principal, "--config"])
            .arg(config)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting portcullis stdio: {e}"))?;
        let read: Box<dyn AsyncRead + Unpin + Send> =
            Box::new(child.stdout.take().ok_or("the child's stdout")?);
        let write: Box<dyn AsyncWrite + Unpin + Send> =
            Box::new(child.stdin.take().ok_or("the child's stdin")?);
        Self::ready(read, write, Some(child)).await
    }

    /// A daemon's environment socket, past its `initialize`.
    pub async fn unix(path: &Path) -> Result<Self, String> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (read, write) = stream.into_split();
        Self::ready(Box::new(read), Box::new(write), None).await
    }

    async fn ready(
        read: Box<dyn AsyncRead + Unpin + Send>,
        write: Box<dyn AsyncWrite + Unpin + Send>,
        child: Option<tokio::process::Child>,
    ) -> Result<Self, String> {
        let mut rpc = Self {
            read: BufReader::new(read),
            write,
            child,
            next: 0,
        };
        let init = rpc.recv().await?;
        if init["method"] != "initialize" {
            return Err(format!("expected initialize, got {init}"));
        }
        let accepted = json!({"jsonrpc": "2.0", "id": init["id"], "result": {
            "accepted_protocol": "ya-environment-protocol.v1",
            "accepted_capabilities": ["fileops", "shell", "process"]}});
        rpc.send(&accepted).await?;
        Ok(rpc)
    }

    async fn send(&mut self, message: &Value) -> Result<(), String> {
        let body = message.to_string();
        let framed = format!("Content-Length: {}\r\n\r\n{body}", body.len());
        self.write
            .write_all(framed.as_bytes())
            .await
            .map_err(|e| format!("writing to the provider: {e}"))?;
        self.write.flush().await.map_err(|e| e.to_string())
    }

    async fn recv(&mut self) -> Result<Value, String> {
        let mut length = None;
        loop {
            let mut line = String::new();
            let n = self
                .read
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the provider closed the connection".into());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let mut body = vec![0; length.ok_or("a message without Content-Length")?];
        self.read
            .read_exact(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&body).map_err(|e| format!("not JSON: {e}"))
    }

    /// One request; its result (notifications before it are skipped).
    pub async fn call(&mut self, method: &str, params: &Value) -> Result<Value, String> {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        loop {
            if let Some(answer) = answer_to(&self.recv().await?, id, method) {
                return answer;
            }
        }
    }

    /// Ends a child provider: its input closes, it exits.
    pub async fn close(mut self) {
        let _ = self.write.shutdown().await;
        drop(self.write);
        if let Some(mut child) = self.child.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait()).await;
        }
    }
}

/// `message` as the answer to request `id` (`method`): its result, or its
/// error; None when it is something else (a notification, a request, an
/// answer to another id).
pub fn answer_to(message: &Value, id: u64, method: &str) -> Option<Result<Value, String>> {
    if message["id"] != id || message.get("method").is_some() {
        return None;
    }
    Some(match message.get("error") {
        Some(error) => Err(format!("{method}: {error}")),
        None => Ok(message["result"].clone()),
    })
}

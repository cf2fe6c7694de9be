//! An MCP client for the benchmarks: `portcullis mcp` as this process's
//! child, newline-delimited JSON-RPC on its standard input and output (the
//! MCP stdio transport), one call at a time. Written from the MCP
//! specification, as an MCP host would.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

pub struct Mcp {
    read: BufReader<ChildStdout>,
    write: ChildStdin,
    child: Child,
    next: u64,
}

impl Mcp {
    /// `portcullis mcp URL` in front of a gateway, past `initialize`.
    /// `home` holds its remembered gateway keys.
    pub async fn start(
        binary: &Path,
        url: &str,
        gateway_key: &str,
        identity: &Path,
        home: &Path,
    ) -> Result<Self, String> {
        let log = home.join("mcp.log");
        let mut child = tokio::process::Command::new(binary)
            .args(["mcp", url, "--gateway-key", gateway_key, "--identity"])
            .arg(identity)
            .env("HOME", home)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting portcullis mcp: {e}"))?;
        let mut mcp = Self {
            read: BufReader::new(child.stdout.take().ok_or("the child's stdout")?),
            write: child.stdin.take().ok_or("the child's stdin")?,
            child,
            next: 0,
        };
        let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "portcullis-bench", "version": env!("CARGO_PKG_VERSION")}});
        mcp.call("initialize", &init).await?;
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(mcp)
    }

    async fn send(&mut self, message: &Value) -> Result<(), String> {
        let line = message.to_string() + "\n";
        self.write
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("writing to portcullis mcp: {e}"))?;
        self.write.flush().await.map_err(|e| e.to_string())
    }

    /// One request; its result (notifications and requests before it are
    /// skipped).
    async fn call(&mut self, method: &str, params: &Value) -> Result<Value, String> {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        loop {
            let mut line = String::new();
            let n = self
                .read
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("portcullis mcp closed its output".into());
            }
            let message: Value =
                serde_json::from_str(&line).map_err(|e| format!("not JSON: {e}: {line}"))?;
            if let Some(answer) = crate::jsonrpc::answer_to(&message, id, method) {
                return answer;
            }
        }
    }

    /// A tool call; an error when the tool says it failed.
    pub async fn tool(&mut self, name: &str, arguments: &Value) -> Result<Value, String> {
        let result = self
            .call("tools/call", &json!({"name": name, "arguments": arguments}))
            .await?;
        match result["isError"].as_bool() {
            Some(true) => Err(format!("{name}: {}", result["content"])),
            _ => Ok(result),
        }
    }

    /// Ends the server: its input closes, it exits.
    pub async fn close(mut self) {
        let _ = self.write.shutdown().await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), self.child.wait()).await;
    }
}

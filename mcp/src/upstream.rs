//! The other direction: portcullis as the *client* of a local MCP server
//! (rmcp's client over the server's stdout and stdin), so the daemon can
//! offer that server's tools as operator tools. Knows nothing of processes,
//! sandboxes or policy — the daemon starts the server and hands over its
//! pipes, or names a loopback URL where one already runs.
//!
//! Everything the server sends is untrusted: one message is at most
//! `max_message` bytes (a longer line is dropped by rmcp's reader, the
//! connection stays up), lines that are not JSON-RPC are skipped, and a
//! tool list longer than [`MAX_TOOLS`] is refused.

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, JsonObject,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{ClientHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};

/// Tools a server may list; past it the list is refused, not truncated.
pub const MAX_TOOLS: usize = 1024;

/// Why a local MCP server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("it did not complete MCP's initialize handshake: {0}")]
    Handshake(String),
    #[error("it did not answer within {0:?}")]
    Timeout(Duration),
    #[error("it closed its connection")]
    Closed,
    #[error("it answered with a JSON-RPC error {code}: {message}")]
    Remote { code: i32, message: String },
    #[error("its answer is not one MCP allows here: {0}")]
    Protocol(String),
    #[error("it lists more than {MAX_TOOLS} tools")]
    TooManyTools,
}

impl From<ServiceError> for UpstreamError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::McpError(e) => Self::Remote {
                code: e.code.0,
                message: e.message.into_owned(),
            },
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => Self::Closed,
            ServiceError::Timeout { timeout } => Self::Timeout(timeout),
            other => Self::Protocol(other.to_string()),
        }
    }
}

/// Who we are to the server, in its `initialize`.
#[derive(Clone)]
struct Gateway;

impl ClientHandler for Gateway {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("portcullis", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// A connected server: initialized, its tools listed.
pub struct Upstream {
    service: RunningService<RoleClient, Gateway>,
    tools: Vec<String>,
}

impl Upstream {
    /// Runs MCP's handshake over `read`/`write` (the server's stdout and
    /// stdin) and lists its tools, within `limit`.
    pub async fn connect<R, W>(
        read: R,
        write: W,
        max_message: usize,
        limit: Duration,
    ) -> Result<Self, UpstreamError>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let transport = AsyncRwTransport::<RoleClient, _, _>::new(read, write)
            .with_max_line_length(max_message);
        Self::start(transport, limit).await
    }

    /// Runs MCP's handshake with a server on loopback over Streamable
    /// HTTP (no proxy, no redirects; `bearer` as its token) and lists its
    /// tools, within `limit`.
    pub async fn connect_http(
        url: &str,
        bearer: Option<String>,
        max_message: usize,
        limit: Duration,
    ) -> Result<Self, UpstreamError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| UpstreamError::Handshake(e.to_string()))?;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url)
            .max_sse_event_size(max_message)
            .max_json_response_size(max_message);
        if let Some(token) = bearer {
            config = config.auth_header(token);
        }
        Self::start(
            StreamableHttpClientTransport::with_client(client, config),
            limit,
        )
        .await
    }

    async fn start<T, E, A>(transport: T, limit: Duration) -> Result<Self, UpstreamError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let connect = async {
            let service = Gateway
                .serve(transport)
                .await
                .map_err(|e| UpstreamError::Handshake(e.to_string()))?;
            let listed = service.peer().list_all_tools().await?;
            if listed.len() > MAX_TOOLS {
                return Err(UpstreamError::TooManyTools);
            }
            let tools = listed.into_iter().map(|t| t.name.into_owned()).collect();
            Ok(Self { service, tools })
        };
        tokio::time::timeout(limit, connect)
            .await
            .map_err(|_| UpstreamError::Timeout(limit))?
    }

    /// The names of the tools it listed when it started.
    pub fn tools(&self) -> &[String] {
        &self.tools
    }

    /// What it says it is (`serverInfo`: name and version).
    pub fn server_name(&self) -> Option<String> {
        let info = self.service.peer().peer_info()?;
        let server = serde_json::to_value(&*info).ok()?;
        let name = server.pointer("/serverInfo/name")?.as_str()?.to_string();
        let version = server
            .pointer("/serverInfo/version")
            .and_then(Value::as_str);
        let said = match version {
            Some(v) => format!("{name} {v}"),
            None => name,
        };
        // Its own words, for a log line: bounded.
        Some(said.chars().take(80).collect())
    }

    /// Whether the connection has ended (the server exited or closed it).
    pub fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }

    /// `tools/call`. Dropping the future (the caller cancelled, or gave up
    /// waiting) sends the server `notifications/cancelled` for it.
    pub async fn call(
        &self,
        tool: &str,
        arguments: JsonObject,
    ) -> Result<ToolAnswer, UpstreamError> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let result = self.service.peer().call_tool(params).await?;
        let content = result
            .content
            .iter()
            .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
            .collect();
        Ok(ToolAnswer {
            is_error: result.is_error.unwrap_or(false),
            structured: result.structured_content,
            content,
        })
    }
}

/// A `tools/call` result, as MCP gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    pub is_error: bool,
    pub structured: Option<Value>,
    /// The content blocks, in MCP's JSON form.
    pub content: Vec<Value>,
}

impl ToolAnswer {
    /// The value a `tool.call` answers with: the structured content when
    /// the tool gives it; else its text, when every block is text (joined
    /// by newlines); else `{"content": [...]}`, the blocks as MCP has them.
    pub fn value(&self) -> Value {
        if let Some(structured) = &self.structured {
            return structured.clone();
        }
        match self.text() {
            Some(text) => Value::String(text),
            None => json!({"content": self.content}),
        }
    }

    /// The text of the blocks, if each is a text block.
    pub fn text(&self) -> Option<String> {
        let texts: Option<Vec<&str>> = self
            .content
            .iter()
            .map(|block| match block.get("type").and_then(Value::as_str) {
                Some("text") => block.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect();
        texts.map(|t| t.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(structured: Option<Value>, content: Vec<Value>) -> ToolAnswer {
        ToolAnswer {
            is_error: false,
            structured,
            content,
        }
    }

    #[test]
    fn structured_content_is_the_value_when_given() {
        let a = answer(
            Some(json!({"n": 3})),
            vec![json!({"type": "text", "text": "{\"n\": 3}"})],
        );
        assert_eq!(a.value(), json!({"n": 3}));
    }

    #[test]
    fn text_blocks_are_joined_and_other_blocks_kept_as_mcp_has_them() {
        let text = answer(
            None,
            vec![
                json!({"type": "text", "text": "a"}),
                json!({"type": "text", "text": "b"}),
            ],
        );
        assert_eq!(text.value(), json!("a\nb"));
        let image = json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        let mixed = answer(
            None,
            vec![json!({"type": "text", "text": "a"}), image.clone()],
        );
        assert_eq!(
            mixed.value(),
            json!({"content": [{"type": "text", "text": "a"}, image]})
        );
        assert_eq!(answer(None, vec![]).value(), json!(""));
    }
}

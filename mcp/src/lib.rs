//! `portcullis mcp`: an MCP server in front of a gateway. It connects to
//! the gateway as a client (the pinned key, an identity or a token, like
//! every client verb) and offers the principal's grants as MCP tools and
//! its roots as MCP resources ([`catalogue`]).
//!
//! Invariant: one MCP call is one relay request of the connected
//! principal, decided, audited and executed by the gateway like any
//! other; its audit entry's `tool_call_id` is `mcp-` and the MCP request
//! id. This crate decides nothing: a refusal is the gateway's, passed back
//! as the tool's error with the relay code. An MCP cancellation cancels
//! the relay request.

#![forbid(unsafe_code)]

pub mod catalogue;

use std::sync::Arc;

use portcullis_client::{Client, ClientError};
use portcullis_wire::frame::{Cancel, ErrorBody, Frame, RequestContext};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData as McpError,
    InitializeResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
};
use rmcp::service::RequestContext as McpContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use catalogue::{CallError, Catalogue, RelayCall};

/// Why the MCP server could not start or ended.
#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    /// The gateway refused `relay.accepted` or `tool.list`, or the session
    /// ended.
    #[error("the gateway: {0}")]
    Gateway(String),
    /// The MCP transport failed (the client's initialize, a broken pipe).
    #[error("MCP: {0}")]
    Transport(String),
}

/// The MCP server: a connected gateway client and what it may use.
#[derive(Clone)]
pub struct Front {
    client: Arc<Client>,
    catalogue: Arc<Catalogue>,
}

impl Front {
    /// Accepts the session's capabilities and learns the principal's
    /// operator tools.
    pub async fn new(client: Client) -> Result<Self, McpServeError> {
        let gateway = |e: ClientError| McpServeError::Gateway(e.to_string());
        client.accept_all().await.map_err(gateway)?;
        let capabilities = client.hello().capabilities.clone();
        let tools = match capabilities.get("tools") {
            Some(_) => client
                .request("tool.list", json!({}))
                .await
                .map_err(gateway)?
                .get("tools")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            None => Vec::new(),
        };
        Ok(Self {
            catalogue: Arc::new(Catalogue::new(&capabilities, &tools)),
            client: Arc::new(client),
        })
    }

    pub fn catalogue(&self) -> &Catalogue {
        &self.catalogue
    }

    /// Serves MCP on standard input and output until the client closes
    /// them (or the gateway's session ends).
    pub async fn serve_stdio(self) -> Result<(), McpServeError> {
        let client = self.client.clone();
        let running = self
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| McpServeError::Transport(e.to_string()))?;
        let cancel = running.cancellation_token();
        tokio::select! {
            ended = running.waiting() => {
                ended.map_err(|e| McpServeError::Transport(e.to_string()))?;
                Ok(())
            }
            why = client.closed() => {
                cancel.cancel();
                Err(McpServeError::Gateway(format!("the session ended: {why}")))
            }
        }
    }

    /// One relay request for one MCP call; `Err` only when the gateway's
    /// session is gone. Cancelled with `ct`.
    async fn relay(
        &self,
        call: RelayCall,
        mcp_id: String,
        ct: &CancellationToken,
    ) -> Result<Result<Value, ErrorBody>, ClientError> {
        let context = RequestContext {
            tool_call_id: Some(format!("mcp-{mcp_id}")),
            ..RequestContext::default()
        };
        let handle = self
            .client
            .start_with_context(context, &call.method, call.params)
            .await?;
        let id = handle.id.clone();
        let response = handle.response();
        tokio::pin!(response);
        let answered = tokio::select! {
            answered = &mut response => answered,
            () = ct.cancelled() => {
                let cancel = Frame::Cancel(Cancel { id, reason: Some("mcp_cancelled".into()) });
                let _ = self.client.send(cancel).await;
                response.await
            }
        };
        match answered {
            Ok(result) => Ok(Ok(result)),
            Err(ClientError::Remote(error)) => Ok(Err(error)),
            Err(other) => Err(other),
        }
    }
}

/// A tool's failure as MCP shows it: the message, and the relay code and
/// details as structured content.
fn tool_error(code: &str, message: &str, details: Option<&Value>) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    let mut structured = json!({"code": code, "message": message});
    if let Some(details) = details {
        structured["details"] = details.clone();
    }
    result.structured_content = Some(structured);
    result
}

fn internal(why: impl std::fmt::Display) -> McpError {
    McpError::internal_error(why.to_string(), None)
}

impl ServerHandler for Front {
    fn get_info(&self) -> InitializeResult {
        let capabilities: ServerCapabilities =
            serde_json::from_value(json!({"tools": {}, "resources": {}})).unwrap_or_default();
        let mut info = InitializeResult::new(capabilities).with_instructions(
            "Files, commands and tools of a portcullis gateway. Paths are the gateway's virtual \
             paths (the roots are the resources). Every call is decided by the gateway's policy \
             and written to its audit log; a refusal comes back as the tool's error.",
        );
        info.server_info.name = "portcullis".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: McpContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        serde_json::from_value(json!({"tools": self.catalogue.mcp_tools()})).map_err(internal)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: McpContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let call = match self.catalogue.call(&request.name, &args) {
            Ok(call) => call,
            Err(e @ CallError::UnknownTool(_)) => {
                return Err(McpError::invalid_params(e.to_string(), None));
            }
            Err(e) => return Ok(tool_error("invalid_request", &e.to_string(), None).into()),
        };
        let text_field = call.text_field;
        let answered = self
            .relay(call, context.id.to_string(), &context.ct)
            .await
            .map_err(internal)?;
        let result = match answered {
            Ok(result) => {
                let text = match text_field.and_then(|field| result.get(field)?.as_str()) {
                    Some(text) => text.to_string(),
                    None => serde_json::to_string_pretty(&result).map_err(internal)?,
                };
                let mut ok = CallToolResult::success(vec![ContentBlock::text(text)]);
                ok.structured_content = Some(result);
                ok
            }
            Err(error) => tool_error(error.code.as_str(), &error.message, error.details.as_ref()),
        };
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: McpContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        serde_json::from_value(json!({"resources": self.catalogue.mcp_resources()}))
            .map_err(internal)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: McpContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let call = self
            .catalogue
            .resource_call(&request.uri)
            .map_err(|e| McpError::resource_not_found(e.to_string(), None))?;
        let (text, mime) = match self
            .relay(call, context.id.to_string(), &context.ct)
            .await
            .map_err(internal)?
        {
            Ok(result) => match result.get("content").and_then(Value::as_str) {
                Some(content) => (content.to_string(), "text/plain"),
                None => (
                    serde_json::to_string_pretty(&result).map_err(internal)?,
                    "application/json",
                ),
            },
            Err(error) => {
                let data = json!({"code": error.code.as_str(), "details": error.details});
                return Err(McpError::resource_not_found(
                    format!("{}: {}", error.code.as_str(), error.message),
                    Some(data),
                ));
            }
        };
        let result: ReadResourceResult = serde_json::from_value(json!({"contents": [
            {"uri": request.uri, "mimeType": mime, "text": text}
        ]}))
        .map_err(internal)?;
        Ok(result.into())
    }
}

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
//!
//! It also holds the other direction, [`upstream`]: the daemon as the
//! client of a local MCP server whose tools the policy offers as operator
//! tools.

#![forbid(unsafe_code)]

pub mod catalogue;
pub mod http;
pub mod output;
pub mod upstream;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use portcullis_client::{Client, ClientError, StreamItem};
use portcullis_wire::frame::{ErrorBody, ErrorCode, RequestContext};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData as McpError,
    InitializeResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
};
use rmcp::service::{NotificationContext, Peer, RequestContext as McpContext};
use rmcp::{RoleServer, ServerHandler, ServiceExt as _};
use serde_json::{Map, Value, json};

use catalogue::{CallError, Catalogue, RelayCall, Shape};
use output::Gathered;

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
    granted: Arc<RwLock<Granted>>,
    /// The MCP clients told when the catalogue changes (one over stdio,
    /// one per session over HTTP).
    peers: Arc<Mutex<Vec<Peer<RoleServer>>>>,
}

/// What the principal is granted, as the gateway last said, and the
/// catalogue made of it.
struct Granted {
    capabilities: Map<String, Value>,
    catalogue: Arc<Catalogue>,
}

/// Gateway events after which the catalogue is learned again.
const CHANGES: &[&str] = &["capability.updated", "tool.registered", "tool.unregistered"];

impl Front {
    /// Accepts the session's capabilities and learns the principal's
    /// operator tools.
    pub async fn new(client: Client) -> Result<Self, McpServeError> {
        let gateway = |e: ClientError| McpServeError::Gateway(e.to_string());
        client.accept_all().await.map_err(gateway)?;
        let capabilities = client.hello().capabilities.clone();
        let tools = tools_of(&client, &capabilities).await.map_err(gateway)?;
        Ok(Self {
            granted: Arc::new(RwLock::new(Granted {
                catalogue: Arc::new(Catalogue::new(&capabilities, &tools)),
                capabilities,
            })),
            client: Arc::new(client),
            peers: Arc::default(),
        })
    }

    /// The catalogue as it stands.
    pub fn catalogue(&self) -> Arc<Catalogue> {
        let granted = self.granted.read().unwrap_or_else(|e| e.into_inner());
        granted.catalogue.clone()
    }

    /// Follows the gateway's events: when a policy change alters what the
    /// principal is granted, learns the catalogue again and tells every
    /// MCP client whose list changed (`notifications/tools/list_changed`,
    /// `notifications/resources/list_changed`). Ends with the session.
    pub fn follow_policy_changes(&self) -> tokio::task::JoinHandle<()> {
        let front = self.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = front.client.next_event(Duration::from_secs(3600)) => event,
                    _ = front.client.closed() => return,
                };
                let Some(event) = event else { continue };
                if CHANGES.contains(&event.event.as_str())
                    && let Err(e) = front.relearn(&event.payload).await
                {
                    tracing::warn!("the catalogue could not be learned again: {e}");
                }
            }
        })
    }

    async fn relearn(&self, payload: &Value) -> Result<(), ClientError> {
        let mut capabilities = {
            let granted = self.granted.read().unwrap_or_else(|e| e.into_inner());
            granted.capabilities.clone()
        };
        if let Some(Value::Object(now)) = payload.get("capabilities") {
            capabilities = now.clone();
        }
        let tools = tools_of(&self.client, &capabilities).await?;
        let catalogue = Arc::new(Catalogue::new(&capabilities, &tools));
        let (tools_changed, resources_changed) = {
            let mut granted = self.granted.write().unwrap_or_else(|e| e.into_inner());
            let before = &granted.catalogue;
            let changed = (
                before.mcp_tools() != catalogue.mcp_tools(),
                before.mcp_resources() != catalogue.mcp_resources(),
            );
            *granted = Granted {
                capabilities,
                catalogue,
            };
            changed
        };
        let peers: Vec<Peer<RoleServer>> = {
            let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            peers.clone()
        };
        let mut gone = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            let told = match (tools_changed, resources_changed) {
                (false, false) => Ok(()),
                _ if peer.is_transport_closed() => Err(()),
                _ => {
                    let tools = match tools_changed {
                        true => peer.notify_tool_list_changed().await.map_err(drop),
                        false => Ok(()),
                    };
                    let resources = match resources_changed {
                        true => peer.notify_resource_list_changed().await.map_err(drop),
                        false => Ok(()),
                    };
                    tools.and(resources)
                }
            };
            if told.is_err() {
                gone.push(i);
            }
        }
        if !gone.is_empty() {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let mut i = 0;
            peers.retain(|_| {
                let keep = !gone.contains(&i);
                i += 1;
                keep
            });
        }
        Ok(())
    }

    /// Serves MCP on standard input and output until the client closes
    /// them (or the gateway's session ends).
    pub async fn serve_stdio(self) -> Result<(), McpServeError> {
        let client = self.client.clone();
        let _following = AbortOnDrop(self.follow_policy_changes());
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
    /// session is gone. The MCP request's cancellation cancels it; while it
    /// runs, a caller that asked for progress hears every second how long.
    async fn relay(
        &self,
        call: RelayCall,
        context: &McpContext<RoleServer>,
    ) -> Result<Result<Value, ErrorBody>, ClientError> {
        let request_context = RequestContext {
            tool_call_id: Some(format!("mcp-{}", context.id)),
            ..RequestContext::default()
        };
        if call.shape == Shape::Started {
            return Ok(self.start_process(call, request_context, context).await);
        }
        let mut handle = self
            .client
            .start_with_context(request_context, &call.method, call.params)
            .await?;
        let mut gathered = (call.shape == Shape::Output).then(Gathered::default);
        let progress = context.meta.get_progress_token();
        let started = Instant::now();
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + PROGRESS_EVERY, PROGRESS_EVERY);
        let mut cancelled = false;
        // The stream ends when the response has come; it is read to its
        // end (a stream nobody reads would hold up the connection).
        loop {
            tokio::select! {
                item = handle.next() => match item {
                    Some(item) => {
                        if let Some(gathered) = gathered.as_mut() {
                            gathered.take(item);
                        }
                    }
                    None => break,
                },
                () = context.ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    let _ = handle.cancel().await;
                }
                _ = ticks.tick(), if progress.is_some() => {
                    let seconds = started.elapsed().as_secs();
                    let note = json!({"progressToken": progress, "progress": seconds,
                                      "message": format!("{} running for {seconds} s", call.method)});
                    if let Ok(note) = serde_json::from_value(note) {
                        let _ = context.peer.notify_progress(note).await;
                    }
                }
            }
        }
        match handle.response().await {
            Ok(result) => Ok(Ok(match gathered {
                Some(gathered) => gathered.answer(&result),
                None => result,
            })),
            Err(ClientError::Remote(error)) => Ok(Err(error)),
            Err(other) => Err(other),
        }
    }

    /// `shell.start`, answered once the process runs (`{process_id, pid,
    /// …}`, its `started` frame); the request goes on in a task of its own
    /// until the process ends, its output read and let go (it stays in the
    /// process's ring for `read_process_output`). A cancellation before it
    /// runs cancels it.
    async fn start_process(
        &self,
        call: RelayCall,
        request_context: RequestContext,
        context: &McpContext<RoleServer>,
    ) -> Result<Value, ErrorBody> {
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (client, ct) = (self.client.clone(), context.ct.clone());
        tokio::spawn(async move {
            let mut started_tx = Some(started_tx);
            let handle = client
                .start_with_context(request_context, &call.method, call.params)
                .await;
            let mut handle = match handle {
                Ok(handle) => handle,
                Err(e) => {
                    if let Some(tx) = started_tx.take() {
                        let _ = tx.send(Err(gone(&e)));
                    }
                    return;
                }
            };
            loop {
                tokio::select! {
                    item = handle.next() => match item {
                        Some(StreamItem::Stream { event, data }) if event == "started" => {
                            if let Some(tx) = started_tx.take() {
                                let _ = tx.send(Ok(data));
                            }
                        }
                        Some(_) => {}
                        None => break,
                    },
                    () = ct.cancelled(), if started_tx.is_some() => {
                        let _ = handle.cancel().await;
                    }
                }
            }
            let ended = handle.response().await;
            if let Some(tx) = started_tx.take() {
                let _ = tx.send(match ended {
                    Ok(result) => Ok(result),
                    Err(ClientError::Remote(error)) => Err(error),
                    Err(other) => Err(gone(&other)),
                });
            }
        });
        started.await.unwrap_or_else(|_| {
            Err(ErrorBody::new(
                ErrorCode::ProviderError,
                "the process's request ended without an answer",
            ))
        })
    }
}

/// The gateway's session ended under a call.
/// Aborts a task when dropped: it ends with what started it.
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The principal's operator tools (`tool.list`), when it has the
/// capability.
async fn tools_of(
    client: &Client,
    capabilities: &Map<String, Value>,
) -> Result<Vec<Value>, ClientError> {
    if !capabilities.contains_key("tools") {
        return Ok(Vec::new());
    }
    let listed = client.request("tool.list", json!({})).await?;
    Ok(listed
        .get("tools")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

fn gone(error: &ClientError) -> ErrorBody {
    ErrorBody::new(ErrorCode::RelayDisconnected, error.to_string())
}

/// How often a call that asked for progress hears of it.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

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
        let capabilities: ServerCapabilities = serde_json::from_value(
            json!({"tools": {"listChanged": true}, "resources": {"listChanged": true}}),
        )
        .unwrap_or_default();
        let mut info = InitializeResult::new(capabilities).with_instructions(
            "Files, commands and tools of a portcullis gateway. Paths are the gateway's virtual \
             paths (the roots are the resources). Every call is decided by the gateway's policy \
             and written to its audit log; a refusal comes back as the tool's error.",
        );
        info.server_info.name = "portcullis".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.retain(|peer| !peer.is_transport_closed());
        peers.push(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: McpContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        serde_json::from_value(json!({"tools": self.catalogue().mcp_tools()})).map_err(internal)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: McpContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let call = match self.catalogue().call(&request.name, &args) {
            Ok(call) => call,
            Err(e @ CallError::UnknownTool(_)) => {
                return Err(McpError::invalid_params(e.to_string(), None));
            }
            Err(e) => return Ok(tool_error("invalid_request", &e.to_string(), None).into()),
        };
        let text_field = call.text_field;
        let answered = self.relay(call, &context).await.map_err(internal)?;
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
        serde_json::from_value(json!({"resources": self.catalogue().mcp_resources()}))
            .map_err(internal)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: McpContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let call = self
            .catalogue()
            .resource_call(&request.uri)
            .map_err(|e| McpError::resource_not_found(e.to_string(), None))?;
        let (text, mime) = match self.relay(call, &context).await.map_err(internal)? {
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

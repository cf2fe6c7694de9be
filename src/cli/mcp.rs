//! `portcullis mcp`: an MCP server in front of a gateway, for MCP clients
//! (coding agents, IDE and desktop assistants): over stdio (the client
//! launches it), or Streamable HTTP on loopback or a Unix socket. It
//! connects like every client verb and serves `portcullis-mcp`'s
//! catalogue; in stdio mode standard output is the MCP stream, so
//! everything it says goes to standard error.

use std::path::PathBuf;
use std::process::ExitCode;

use portcullis_mcp::http::{BearerToken, Listen};
use zeroize::Zeroizing;

use crate::cli::connect::Target;
use crate::cli::fail;

#[derive(clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub target: Target,
    /// Serve Streamable HTTP at http://ADDR/mcp (a loopback ADDR:PORT, port
    /// 0 for any) or on a Unix socket (unix:PATH) instead of stdio. Prints
    /// `listening on URL` once bound.
    #[arg(long, value_name = "ADDR|unix:PATH", requires = "http_token_file")]
    pub http: Option<String>,
    /// With --http: the file holding the bearer token every HTTP request
    /// must carry (at least 16 characters, e.g. 32 random bytes in base64).
    /// It is checked here and never sent on.
    #[arg(long, value_name = "FILE")]
    pub http_token_file: Option<PathBuf>,
    /// With --http: a browser origin allowed to call (e.g.
    /// http://localhost:3000; repeat for more). Requests from any other
    /// origin are refused; requests without an Origin header pass.
    #[arg(long, value_name = "ORIGIN")]
    pub allow_origin: Vec<String>,
}

pub fn mcp(args: McpArgs) -> ExitCode {
    let http = match args.http.as_deref().map(Listen::parse).transpose() {
        Ok(http) => http,
        Err(e) => return fail(format!("--http: {e}")),
    };
    let token = match &args.http_token_file {
        Some(file) => match std::fs::read_to_string(file)
            .map(|t| Zeroizing::new(t.trim().to_string()))
            .map_err(|e| format!("--http-token-file {}: {e}", file.display()))
            .and_then(|t| BearerToken::new(&t))
        {
            Ok(token) => Some(token),
            Err(e) => return fail(e),
        },
        None => None,
    };
    // Several calls may be in flight: a runtime with more than one thread.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let served = runtime.block_on(async {
        let client = args.target.connect().await?;
        let front = portcullis_mcp::Front::new(client)
            .await
            .map_err(|e| e.to_string())?;
        match (http, token) {
            (Some(listen), Some(token)) => {
                let ready = |url: String| println!("listening on {url}");
                portcullis_mcp::http::serve(front, listen, token, args.allow_origin, ready)
                    .await
                    .map_err(|e| e.to_string())
            }
            _ => front.serve_stdio().await.map_err(|e| e.to_string()),
        }
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

//! `portcullis mcp`: an MCP server in front of a gateway, for MCP clients
//! (coding agents, IDE and desktop assistants) that launch it over stdio.
//! It connects like every client verb and serves `portcullis-mcp`'s
//! catalogue; standard output is the MCP stream, so everything it says
//! goes to standard error.

use std::process::ExitCode;

use crate::cli::connect::Target;
use crate::cli::fail;

pub fn mcp(target: Target) -> ExitCode {
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
        let client = target.connect().await?;
        let front = portcullis_mcp::Front::new(client)
            .await
            .map_err(|e| e.to_string())?;
        front.serve_stdio().await.map_err(|e| e.to_string())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

//! `portcullis stdio`: a provider launched by its runtime, speaking
//! ya-environment-protocol.v1 (JSON-RPC, LSP framing) on its standard
//! input and output — the 0.92 spec's stdio profile. The parent process
//! is the principal named on the command line; the gateway is the same
//! as `serve`'s (policy, audit log, sandbox), with one session and no
//! listener. Logs go to standard error, never to the protocol's stream.

use std::path::Path;
use std::pin::pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use portcullis::config::Config;
use portcullis::daemon::Daemon;
use portcullis::server::peer::Peer;
use portcullis::server::{Gateway, session};
use portcullis_wire::envproto::lsp::{LspReader, LspWriter};
use tokio::io::{BufReader, BufWriter};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info};

use crate::cli::fail;
use crate::cli::serve::{Assembled, assemble, init_logging, shut_down};

pub fn stdio(config: &Path, principal: &str) -> ExitCode {
    init_logging();
    let config = match Config::load(config) {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    let Assembled {
        runtime,
        gateway,
        daemon,
    } = match assemble(config) {
        Ok(assembled) => assembled,
        Err(code) => return code,
    };
    let policy = gateway.current_policy();
    if !policy.principals.iter().any(|p| p.id == principal) {
        return fail(format!(
            "the policy has no principal `{principal}` (--principal names the one this \
             provider's parent acts as)"
        ));
    }
    let code = runtime.block_on(serve(Arc::new(gateway), daemon, principal.to_string()));
    // Standard input is read on a blocking thread that may still wait for
    // a byte: do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn serve(gateway: Arc<Gateway>, daemon: Daemon, principal: String) -> ExitCode {
    daemon.spawn_keepers(&gateway);
    let (Ok(mut hangup), Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail("cannot install signal handlers");
    };
    let max = gateway.config.limits.max_frame;
    let source = LspReader::new(BufReader::new(tokio::io::stdin()), max);
    let sink = LspWriter::new(BufWriter::new(tokio::io::stdout()));
    let peer = Peer::Stdio {
        parent: std::os::unix::process::parent_id(),
    };
    info!(%principal, "serving ya-environment-protocol.v1 on standard input and output");
    let identity = session::Identity::Configured { principal };
    let mut session = pin!(session::envproto(
        gateway.clone(),
        source,
        sink,
        peer,
        identity
    ));
    loop {
        tokio::select! {
            () = &mut session => break,
            _ = hangup.recv() => match gateway.reload_policy() {
                Ok(generation) => info!(%generation, "policy reloaded"),
                Err(errors) => error!("policy reload failed; keeping the old policy:\n{errors}"),
            },
            _ = terminate.recv() => { gateway.shutdown.cancel(); }
            _ = interrupt.recv() => { gateway.shutdown.cancel(); }
        }
    }
    info!("the session ended; stopping");
    shut_down(&gateway, daemon).await
}

/// `portcullis protocol schema`: the whole document, or one method's
/// params and result (or one of them), as JSON on standard output.
pub fn schema(method: Option<&str>, part: Option<&str>) -> ExitCode {
    use portcullis_wire::envproto::schema;
    let printed = match (method, part) {
        (None, _) => Some(schema::document()),
        (Some(method), Some(part)) => schema::of(method, part),
        (Some(method), None) => schema::of(method, "params").map(
            |params| serde_json::json!({"params": params, "result": schema::of(method, "result")}),
        ),
    };
    match printed {
        Some(value) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        None => super::fail(format!(
            "`{}` is not a method of ya-environment-protocol.v1 this provider serves \
             (`portcullis protocol schema` lists them under `methods` and `notifications`)",
            method.unwrap_or_default()
        )),
    }
}

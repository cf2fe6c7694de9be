//! `portcullis exec URL -- CMD…`: runs a command on a gateway with
//! `shell.start`, streams its output here as it comes, and exits with the
//! command's exit code (128 + N when signal N ended it).

use std::io::Write as _;
use std::process::ExitCode;

use portcullis::client::StreamItem;
use portcullis::record::Channel;
use serde_json::{Map, Value, json};

use crate::cli::connect::{Target, runtime};
use crate::cli::fail;

#[derive(clap::Args)]
pub struct Exec {
    #[command(flatten)]
    target: Target,
    /// Working directory, as ROOT:PATH (`main:` for the root itself).
    #[arg(long, value_name = "ROOT:PATH")]
    cwd: Option<String>,
    /// An environment variable for the command (the grant decides which
    /// pass); repeatable.
    #[arg(long, value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Kill the command after this many seconds (at most the grant's
    /// max_runtime).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn exec(args: Exec) -> ExitCode {
    let mut params = json!({"command": args.command});
    if let Some(cwd) = &args.cwd {
        let Some((root, path)) = cwd.split_once(':') else {
            return fail(format!("--cwd `{cwd}` is not ROOT:PATH"));
        };
        params["root_id"] = json!(root);
        params["cwd"] = json!(path);
    }
    let mut env = Map::new();
    for pair in &args.env {
        let Some((name, value)) = pair.split_once('=') else {
            return fail(format!("--env `{pair}` is not NAME=VALUE"));
        };
        env.insert(name.into(), Value::String(value.into()));
    }
    params["env"] = Value::Object(env);
    if let Some(seconds) = args.timeout {
        params["timeout_ms"] = json!((seconds * 1000.0).round() as u64);
    }
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let client = args.target.connect().await?;
            client.accept_all().await.map_err(|e| e.to_string())?;
            let mut handle = client
                .start("shell.start", params)
                .await
                .map_err(|e| e.to_string())?;
            let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
            while let Some(item) = handle.next().await {
                if let StreamItem::Chunk { channel, data } = item {
                    let written = match channel {
                        Channel::Stderr => err.write_all(&data).and_then(|()| err.flush()),
                        _ => out.write_all(&data).and_then(|()| out.flush()),
                    };
                    written.map_err(|e| format!("writing output: {e}"))?;
                }
            }
            handle.response().await.map_err(|e| e.to_string())
        })
    });
    match result {
        Ok(result) => exit_code_of(&result),
        Err(e) => fail(e),
    }
}

/// The command's exit code as this process's, the way shells report a
/// signal (128 + N).
fn exit_code_of(result: &Value) -> ExitCode {
    if let Some(code) = result["exit_code"].as_i64() {
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    let signal = result["signal"]
        .as_str()
        .and_then(portcullis::shell::signal_number)
        .unwrap_or(0);
    ExitCode::from(128 + signal.clamp(0, 127) as u8)
}

//! `portcullis tool list|call` and `portcullis script run`: operator tools
//! and Rhai scripts on a gateway. Results print as JSON; a script's
//! `print` and `debug` lines go to stdout and stderr as they come.

use std::path::PathBuf;
use std::process::ExitCode;

use portcullis_client::{Client, StreamItem};
use serde_json::{Value, json};

use crate::cli::connect::Target;
use crate::cli::files::with_client;

#[derive(clap::Subcommand)]
pub enum ToolCommand {
    /// The tools this identity may call, with their input schemas.
    List {
        #[command(flatten)]
        target: Target,
        /// Print the whole answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Call a tool with JSON arguments (`'{"a": 1}'`); prints its value.
    Call {
        #[command(flatten)]
        target: Target,
        name: String,
        /// The arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
    },
}

#[derive(clap::Subcommand)]
pub enum ScriptCommand {
    /// Run a Rhai script file (`-` for stdin); prints its value and stats.
    Run {
        #[command(flatten)]
        target: Target,
        file: PathBuf,
        /// The script's `args`, a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
    },
}

pub fn tool(command: ToolCommand) -> ExitCode {
    match command {
        ToolCommand::List { target, json } => with_client(&target, async |client| {
            let list = client
                .request("tool.list", json!({}))
                .await
                .map_err(|e| e.to_string())?;
            if json {
                println!("{list}");
                return Ok(ExitCode::SUCCESS);
            }
            for tool in list["tools"].as_array().into_iter().flatten() {
                println!(
                    "{:<24} {:<8} {:<17} {}",
                    tool["name"].as_str().unwrap_or(""),
                    tool["risk"].as_str().unwrap_or(""),
                    tool["approval_policy"].as_str().unwrap_or(""),
                    tool["description"].as_str().unwrap_or("")
                );
            }
            Ok(ExitCode::SUCCESS)
        }),
        ToolCommand::Call {
            target,
            name,
            arguments,
        } => {
            let arguments = match object(&arguments, "the arguments") {
                Ok(arguments) => arguments,
                Err(e) => return crate::cli::fail(e),
            };
            with_client(&target, async |client| {
                let params = json!({"name": name, "arguments": arguments});
                let result = streamed(client, "tool.call", params).await?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&result["value"]).unwrap_or_default()
                );
                Ok(ExitCode::SUCCESS)
            })
        }
    }
}

pub fn script(command: ScriptCommand) -> ExitCode {
    let ScriptCommand::Run { target, file, args } = command;
    let source = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map(|_| text)
    } else {
        std::fs::read_to_string(&file)
    };
    let (source, args) = match (source, object(&args, "--args")) {
        (Ok(source), Ok(args)) => (source, args),
        (Err(e), _) => return crate::cli::fail(format!("{}: {e}", file.display())),
        (_, Err(e)) => return crate::cli::fail(e),
    };
    with_client(&target, async |client| {
        let params = json!({"source": source, "args": args});
        let result = streamed(client, "script.run", params).await?;
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
        Ok(ExitCode::SUCCESS)
    })
}

fn object(text: &str, what: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(format!("{what} must be a JSON object")),
        Err(e) => Err(format!("{what} are not JSON: {e}")),
    }
}

/// Sends the request, printing `stdout` and `log` stream frames as they
/// come, and returns the result.
async fn streamed(client: &Client, method: &str, params: Value) -> Result<Value, String> {
    let mut handle = client
        .start(method, params)
        .await
        .map_err(|e| e.to_string())?;
    while let Some(item) = handle.next().await {
        if let StreamItem::Stream { event, data } = item {
            let text = data.as_str().unwrap_or_default();
            match event.as_str() {
                "stdout" => print!("{text}"),
                _ => eprintln!("{text}"),
            }
        }
    }
    handle.response().await.map_err(|e| e.to_string())
}

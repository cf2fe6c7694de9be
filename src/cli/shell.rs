//! `portcullis exec URL -- CMD…` and `portcullis shell URL`: a command on a
//! gateway with `shell.start`, its output here as it comes, this terminal's
//! input there, and this process's exit code the command's (128 + N when
//! signal N ended it).
//!
//! `shell` runs the command in a remote terminal: the local terminal goes
//! into raw mode (restored however the command ends), window size changes
//! are sent as `shell.resize`. Input travels as `shell.input` requests,
//! one at a time so that keystrokes keep their order; what is typed while
//! one is on its way goes in the next. `exec` with `--no-stdin`, or with
//! `/dev/null` as its stdin, closes the command's stdin in the start
//! itself.

use std::future::Future;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::pin::Pin;
use std::process::ExitCode;

use base64::Engine as _;
use portcullis_client::{Client, ClientError, StreamItem};
use portcullis_wire::frame::ErrorCode;
use portcullis_wire::record::Channel;
use serde_json::{Map, Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::cli::connect::Target;
use crate::cli::{fail, runtime};

/// Where and how the command runs (both verbs).
#[derive(clap::Args)]
struct Placement {
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
}

#[derive(clap::Args)]
pub struct Exec {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    placement: Placement,
    /// Do not send this process's stdin to the command (it reads EOF).
    #[arg(short = 'n', long)]
    no_stdin: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
pub struct Shell {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    placement: Placement,
    /// The program and its arguments (default: `bash -l`).
    #[arg(last = true)]
    command: Vec<String>,
}

pub fn exec(args: Exec) -> ExitCode {
    let mut params = match start_params(&args.command, &args.placement) {
        Ok(params) => params,
        Err(e) => return fail(e),
    };
    // Nothing to send: the command reads /dev/null from its start, with no
    // `shell.input` (and its audit entry) to close its stdin.
    let stdin = !args.no_stdin && !stdin_is_dev_null();
    if !stdin {
        params["stdin"] = json!("");
    }
    let mode = Mode {
        terminal: false,
        stdin,
    };
    finish(run(&args.target, params, mode))
}

pub fn shell(args: Shell) -> ExitCode {
    let command = match args.command.is_empty() {
        true => vec!["bash".to_string(), "-l".to_string()],
        false => args.command,
    };
    let mut params = match start_params(&command, &args.placement) {
        Ok(params) => params,
        Err(e) => return fail(e),
    };
    let (cols, rows) = window_size();
    params["pty"] = json!(true);
    params["cols"] = json!(cols);
    params["rows"] = json!(rows);
    let mode = Mode {
        terminal: true,
        stdin: true,
    };
    finish(run(&args.target, params, mode))
}

fn start_params(command: &[String], placement: &Placement) -> Result<Value, String> {
    let mut params = json!({"command": command});
    if let Some(cwd) = &placement.cwd {
        let Some((root, path)) = cwd.split_once(':') else {
            return Err(format!("--cwd `{cwd}` is not ROOT:PATH"));
        };
        params["root_id"] = json!(root);
        params["cwd"] = json!(path);
    }
    let mut env = Map::new();
    for pair in &placement.env {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("--env `{pair}` is not NAME=VALUE"));
        };
        env.insert(name.into(), Value::String(value.into()));
    }
    params["env"] = Value::Object(env);
    if let Some(seconds) = placement.timeout {
        params["timeout_ms"] = json!((seconds * 1000.0).round() as u64);
    }
    Ok(params)
}

fn finish(result: Result<Value, String>) -> ExitCode {
    match result {
        Ok(result) => exit_code_of(&result),
        Err(e) => fail(e),
    }
}

#[derive(Clone, Copy)]
struct Mode {
    /// A remote terminal: raw mode here, resizes sent.
    terminal: bool,
    /// Send this process's stdin.
    stdin: bool,
}

fn run(target: &Target, params: Value, mode: Mode) -> Result<Value, String> {
    let rt = runtime()?;
    rt.block_on(async {
        let client = target.connect().await?;
        client.accept_all().await.map_err(|e| e.to_string())?;
        // Raw only once connected, so errors before print normally.
        let _raw = match mode.terminal {
            true => RawMode::enter(),
            false => None,
        };
        match follow(&client, params, mode).await {
            // Killed at its time limit: said, and the exit code is the
            // signal's, as a shell reports it.
            Err(ClientError::Remote(e)) if e.code == ErrorCode::Timeout && e.details.is_some() => {
                eprintln!("portcullis: {}", e.message);
                Ok(e.details.unwrap_or_default())
            }
            other => other.map_err(|e| e.to_string()),
        }
    })
}

type InputReply<'a> = Pin<Box<dyn Future<Output = Result<Value, ClientError>> + 'a>>;

/// Starts the command and relays until it answers.
async fn follow(client: &Client, params: Value, mode: Mode) -> Result<Value, ClientError> {
    let mut handle = client.start("shell.start", params).await?;
    let mut keys = match mode.stdin {
        true => read_stdin(),
        false => mpsc::channel(1).1,
    };
    // Without stdin the start closed the command's already.
    let (mut input_ended, mut eof_sent) = (!mode.stdin, !mode.stdin);
    let mut resized = match mode.terminal {
        true => signal(SignalKind::window_change()).ok(),
        false => None,
    };
    let mut process_id: Option<String> = None;
    let mut typed = Vec::new();
    let mut sending: Option<InputReply<'_>> = None;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    loop {
        if let (None, Some(id)) = (&sending, &process_id)
            && (!typed.is_empty() || (input_ended && !eof_sent))
        {
            let data = base64::engine::general_purpose::STANDARD.encode(std::mem::take(&mut typed));
            // A terminal has no EOF to send; ^D in the data is its EOF.
            let eof = input_ended && !mode.terminal;
            eof_sent |= input_ended;
            let params = json!({"process_id": id, "data": data, "encoding": "base64", "eof": eof});
            sending = Some(Box::pin(client.request("shell.input", params)));
        }
        tokio::select! {
            item = handle.next() => match item {
                Some(StreamItem::Stream { event, data }) if event == "started" => {
                    process_id = data["process_id"].as_str().map(str::to_string);
                }
                Some(StreamItem::Stream { event, data }) if event == "output_truncated" => {
                    let missed = data["missed_bytes"].as_u64().unwrap_or(0);
                    eprint!("\r\n[portcullis: {missed} bytes of output were lost]\r\n");
                }
                Some(StreamItem::Chunk { channel, data }) => {
                    let written = match channel {
                        Channel::Stderr => err.write_all(&data).and_then(|()| err.flush()),
                        _ => out.write_all(&data).and_then(|()| out.flush()),
                    };
                    if let Err(e) = written {
                        return Err(ClientError::Protocol(format!("writing output: {e}")));
                    }
                }
                Some(_) => {}
                None => break,
            },
            key = keys.recv(), if !input_ended => match key {
                Some(data) => typed.extend(data),
                None => input_ended = true,
            },
            reply = async { sending.as_mut().expect("guarded").await }, if sending.is_some() => {
                sending = None;
                // The process may have stopped reading; its exit says more.
                if reply.is_err() {
                    input_ended = true;
                    eof_sent = true;
                    typed.clear();
                }
            },
            Some(()) = async { resized.as_mut()?.recv().await }, if resized.is_some() => {
                if let Some(id) = &process_id {
                    let (cols, rows) = window_size();
                    let params = json!({"process_id": id, "cols": cols, "rows": rows});
                    let _ = client.request("shell.resize", params).await;
                }
            },
        }
    }
    handle.response().await
}

/// This process's stdin, read on a thread of its own (a read from a
/// terminal cannot be cancelled; the thread ends with the process).
fn read_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = stdin.read(&mut buf) {
            if tx.blocking_send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    rx
}

/// Whether this process's stdin is `/dev/null` (as under `cron`, `ssh -n`
/// or `< /dev/null`).
fn stdin_is_dev_null() -> bool {
    use rustix::fs::{FileType, fstat, stat};
    let (Ok(stdin), Ok(null)) = (fstat(std::io::stdin()), stat("/dev/null")) else {
        return false;
    };
    let is_char = |mode| FileType::from_raw_mode(mode) == FileType::CharacterDevice;
    is_char(stdin.st_mode) && is_char(null.st_mode) && stdin.st_rdev == null.st_rdev
}

/// This terminal's (columns, rows); 80×24 when stdin is not a terminal.
fn window_size() -> (u16, u16) {
    match rustix::termios::tcgetwinsize(std::io::stdin()) {
        Ok(size) if size.ws_col > 0 && size.ws_row > 0 => (size.ws_col, size.ws_row),
        _ => (80, 24),
    }
}

/// The local terminal in raw mode (keys go through as typed: ^C is sent,
/// not acted on here) until dropped, which restores it.
struct RawMode(rustix::termios::Termios);

impl RawMode {
    fn enter() -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = rustix::termios::tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(Self(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.0,
        );
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

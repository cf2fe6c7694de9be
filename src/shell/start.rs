//! `shell.start` and the methods that act on a started process:
//! `shell.attach`, `shell.input`, `shell.resize`, `shell.signal`,
//! `shell.cancel`, `shell.status`, `shell.list`.
//!
//! `shell.start` launches the process, whose output goes into its ring
//! (`process.rs`) and whose supervisor task waits for the exit; the
//! request then follows the ring like any attached reader: a `started`
//! stream frame, the output as chunks (channel 1 stdout, 2 stderr, 5 a
//! terminal) in order, then the terminal response with the exit status.
//! `shell.attach` does the same from a given sequence number, for a
//! process that is still running or has exited and is still kept.

use base64::Engine as _;
use bytes::Bytes;
use rustix::process::Signal;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;

use super::process::{self, Process, Spec, StdinChunk, StopReason};
use super::pty::{self, Pty};
use super::{
    Io, Shell, drained, exit_result, invalid, params, provider_error, shell_terms, time_limit,
};
use crate::egress::CommandLink;
use crate::files::Encoding;
use crate::provider::{Call, REVOKED_BY_POLICY, STOPPED_BY_OPERATOR, StartEntry};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};
use portcullis_wire::record::Channel;

#[derive(Deserialize)]
struct StartParams {
    command: Vec<String>,
    timeout_ms: Option<u64>,
    /// Run in a terminal (the grant's `pty` must allow it).
    #[serde(default)]
    pty: bool,
    cols: Option<u16>,
    rows: Option<u16>,
    /// Text for the standard input, which is then closed (`""`: nothing,
    /// the command reads `/dev/null`). Without it stdin stays open for
    /// `shell.input`.
    stdin: Option<String>,
}

pub async fn start(shell: Shell, mut call: Call) -> Result<Value, ErrorBody> {
    super::on_the_target(&call.request)?;
    let p: StartParams = params(&call.request)?;
    let terms = shell_terms(call.terms.clone())?;
    let mut start_entry = std::mem::replace(&mut call.start_entry, StartEntry::durable());
    let process = launch(&shell, &call, &p, &terms, &mut start_entry).await?;
    if let Err(e) = shell.processes().remember(&process).await {
        process.stop(StopReason::Cancelled);
        return Err(e);
    }
    let mut started = json!({
        "process_id": process.id,
        "pid": process.pid,
        "terminal": process.terminal.is_some(),
        "persist": process.persist,
    });
    if let Some(warning) = &process.sandbox_warning {
        started["sandbox_warning"] = json!(warning);
    }
    process.watch(call.resources.events());
    let status = json!({"state": "running", "process_id": process.id, "pid": process.pid});
    if call.stream.event("started", started).await.is_err()
        || call.stream.event("status", status).await.is_err()
    {
        return Err(let_go(&call, &process, true, true));
    }
    follow(&call, &process, 0, true).await
}

/// Starts the process with its output pumps, stdin feeder and supervisor.
async fn launch(
    shell: &Shell,
    call: &Call,
    p: &StartParams,
    terms: &portcullis_policy::ShellTerms,
    start_entry: &mut StartEntry,
) -> Result<Arc<Process>, ErrorBody> {
    if p.pty && p.stdin.is_some() {
        return Err(invalid(
            "`stdin` is for a process without a terminal; send a terminal's input with shell.input",
        ));
    }
    let size = (
        p.cols.unwrap_or(pty::DEFAULT_SIZE.0).clamp(1, 1000),
        p.rows.unwrap_or(pty::DEFAULT_SIZE.1).clamp(1, 1000),
    );
    let terminal = match p.pty {
        true => Some(
            Pty::open(size.0, size.1)
                .map_err(|e| provider_error(format!("cannot open a terminal: {e}")))?,
        ),
        false => None,
    };
    let io = match &terminal {
        Some(pty) => Io::Terminal(pty),
        None => Io::Piped {
            stdin: p.stdin.as_ref().is_none_or(|text| !text.is_empty()),
        },
    };
    let mut running = shell
        .spawn(CommandLink::of(call), terms, &p.command, io, start_entry)
        .await?;
    let (stdin_tx, stdin_rx) = mpsc::channel(16);
    if let Some(text) = p.stdin.as_ref().filter(|text| !text.is_empty()) {
        call.usage.add_in(text.len());
        // A fresh channel of 16 has room for both.
        let _ = stdin_tx.try_send(StdinChunk::Data(Bytes::from(text.clone())));
        let _ = stdin_tx.try_send(StdinChunk::End);
    }
    let processes = shell.processes().clone();
    let process = processes.register(Spec {
        owner: call.principal.clone(),
        request: Request::clone(&call.request),
        command: p.command.clone(),
        pid: running.pid.map(|pid| pid.as_raw_nonzero().get()),
        persist: terms.persist,
        idle_timeout: terms.idle_timeout,
        survive_revocation: terms.survive_revocation,
        sandbox_warning: running.sandbox_warning.clone(),
        terminal: terminal.as_ref().map(|t| t.master.clone()),
        output_limit: terms.output_limit,
        stdin: stdin_tx,
    });
    let mut pumps: Vec<tokio::sync::oneshot::Receiver<()>> = Vec::new();
    match &terminal {
        Some(pty) => {
            let sink = process.clone();
            let push = move |data: &[u8]| sink.output.push(Channel::Terminal, data);
            match pty::pump(&pty.master, push) {
                Ok(done) => pumps.push(done),
                Err(e) => tracing::warn!("terminal output of {}: {e}", process.id),
            }
            match pty.master.try_clone() {
                Ok(fd) => {
                    let writer = tokio::fs::File::from_std(std::fs::File::from(fd));
                    tokio::spawn(feed(writer, stdin_rx, process.clone()));
                }
                Err(e) => tracing::warn!("terminal input of {}: {e}", process.id),
            }
        }
        None => {
            pumps.push(pump(running.child.stdout.take(), &process, Channel::Stdout));
            pumps.push(pump(running.child.stderr.take(), &process, Channel::Stderr));
            if let Some(stdin) = running.child.stdin.take() {
                tokio::spawn(feed(stdin, stdin_rx, process.clone()));
            }
        }
    }
    // The child holds its terminal side now; ours must close for the
    // output to end when the child does.
    drop(terminal);
    let limit = time_limit(p.timeout_ms, terms);
    let supervised = process.clone();
    tokio::spawn(async move {
        let never = tokio_util::sync::CancellationToken::new();
        let waited = running
            .wait(limit, &never, Some(supervised.stop_token()))
            .await;
        for pump in pumps {
            drained(pump).await;
        }
        supervised.output.close();
        let result = match waited {
            Ok((outcome, status)) => {
                let mut result = exit_result(&status, &outcome, running.started);
                let ended_by = match outcome {
                    super::Outcome::Exited(_) => "exit",
                    super::Outcome::TimedOut => "timeout",
                    _ => supervised
                        .stop_reason()
                        .map_or("cancelled", StopReason::as_str),
                };
                result["ended_by"] = json!(ended_by);
                result["cancelled"] = json!(ended_by == "cancelled");
                if let Some(warning) = &running.sandbox_warning {
                    result["sandbox_warning"] = json!(warning);
                }
                result
            }
            Err(e) => {
                json!({"exit_code": null, "signal": null, "ended_by": "error", "error": e.message})
            }
        };
        // The process slot is free once the process is gone.
        drop(running);
        if let Some(ended_by) = result["ended_by"].as_str() {
            processes.ended(&supervised.id, ended_by);
        }
        supervised.finish(result);
        if !supervised.persist {
            processes.forget(&supervised.id);
        }
    });
    Ok(process)
}

/// Follows the output from `seq` to its end, then answers with the exit
/// result. A `cancel` of the request that started the process stops it;
/// the end of a session stops it unless it persists; a `cancel` of an
/// attach only detaches.
async fn follow(
    call: &Call,
    process: &Arc<Process>,
    seq: u64,
    owner: bool,
) -> Result<Value, ErrorBody> {
    follow_until(call, process, seq, owner, None).await
}

/// [`follow`], or with a `deadline`, until the output is caught up at or
/// after it: a process still running then answers
/// `{process_id, state: "running", next_seq}` (a poll; it is not touched).
async fn follow_until(
    call: &Call,
    process: &Arc<Process>,
    seq: u64,
    owner: bool,
    deadline: Option<tokio::time::Instant>,
) -> Result<Value, ErrorBody> {
    let _following = process.follow();
    let streamed = tokio::select! {
        streamed = process::stream(process, seq, &call.stream, deadline) => streamed,
        () = call.cancel.cancelled() => return Err(let_go(call, process, owner, false)),
    };
    let Ok(process::Streamed { missed, ended }) = streamed else {
        return Err(let_go(call, process, owner, true));
    };
    if !ended {
        return Ok(json!({"process_id": process.id, "state": "running",
                         "next_seq": process.output.span().1, "missed_bytes": missed}));
    }
    let mut result = tokio::select! {
        result = process.exited() => result,
        () = call.cancel.cancelled() => return Err(let_go(call, process, owner, false)),
    };
    // The keeper may stop a revoked process, or every process at the
    // emergency stop, before the session marks this request revoked or
    // ends: the answer is the same either way.
    let revoked = match process.stop_reason() {
        Some(StopReason::Revoked) => Some((ErrorCode::PermissionDenied, REVOKED_BY_POLICY)),
        Some(StopReason::Stopped) => Some((ErrorCode::PolicyBlocked, STOPPED_BY_OPERATOR)),
        _ => None,
    };
    if let Some((code, message)) = revoked.filter(|_| owner) {
        return Err(ErrorBody::new(code, message));
    }
    result["process_id"] = json!(process.id);
    result["stdout_bytes"] = json!(process.output.written(Channel::Stdout));
    result["stderr_bytes"] = json!(process.output.written(Channel::Stderr));
    result["terminal_bytes"] = json!(process.output.written(Channel::Terminal));
    result["output_truncated"] = json!(process.output.over_limit() > 0);
    result["missed_bytes"] = json!(missed);
    // The spec's process state change, before the terminal response.
    let mut status = result.clone();
    status["state"] = json!("exited");
    let _ = call.stream.event("status", status).await;
    if result["ended_by"] == "timeout" {
        // The spec's `timeout`, with how it ended in details.
        return Err(ErrorBody::new(
            ErrorCode::Timeout,
            "the process was killed at its time limit",
        )
        .with_details(result));
    }
    Ok(result)
}

/// The answer when a follower stops following, and what happens to the
/// process: the request that started it stops it (a `cancel`, or the end
/// of its session unless the process persists); an attach just lets go.
/// `gone`: the session can no longer be written to (it is ending).
fn let_go(call: &Call, process: &Process, owner: bool, gone: bool) -> ErrorBody {
    let session_ended = gone || call.session_end.get().is_some();
    let revoked = call.revoked.get().is_some() || call.session_end.get().is_some();
    if !owner || (session_ended && process.persist) || (revoked && process.survive_revocation) {
        return ErrorBody::new(
            ErrorCode::Cancelled,
            "detached; the process keeps running (shell.attach follows it again)",
        );
    }
    process.stop(match session_ended {
        true => StopReason::SessionEnded,
        false => StopReason::Cancelled,
    });
    ErrorBody::new(ErrorCode::Cancelled, "the process was killed: cancelled")
}

/// Moves one output pipe into the ring until it closes; the receiver
/// hears when it has.
fn pump(
    pipe: Option<impl AsyncRead + Unpin + Send + 'static>,
    process: &Arc<Process>,
    channel: Channel,
) -> tokio::sync::oneshot::Receiver<()> {
    let (done, finished) = tokio::sync::oneshot::channel();
    let process = process.clone();
    tokio::spawn(async move {
        if let Some(mut pipe) = pipe {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                process.output.push(channel, &buf[..n]);
            }
        }
        let _ = done.send(());
    });
    finished
}

/// Writes what `shell.input` sends to the process's stdin (or terminal).
async fn feed(
    mut stdin: impl AsyncWrite + Unpin,
    mut input: mpsc::Receiver<StdinChunk>,
    process: Arc<Process>,
) {
    while let Some(StdinChunk::Data(data)) = input.recv().await {
        process.touch();
        if stdin.write_all(&data).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
    }
    // `End`, or the process is gone: stdin closes when dropped (a terminal
    // stays open; `eof` there is ^D in the data).
}

#[derive(Deserialize)]
struct AttachParams {
    process_id: String,
    /// Replay from this sequence number; default: the oldest output kept.
    from_seq: Option<u64>,
    /// Answer once caught up after this long even if the process still
    /// runs (a poll, e.g. `process.wait` with a timeout; `0`: what the
    /// ring holds now).
    wait_ms: Option<u64>,
}

/// Follows a process of the caller's from `from_seq` (or the oldest
/// output kept): an `attached` stream frame saying what is replayed and
/// whether anything asked for is gone, then the output, then its exit.
pub async fn attach(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: AttachParams = params(&call.request)?;
    let process = shell.processes().find(&call.principal, &p.process_id)?;
    let (first, next) = process.output.span();
    let from = p.from_seq.unwrap_or(first);
    if from > next {
        return Err(invalid(format!(
            "from_seq {from} is past the output's end ({next})"
        )));
    }
    let attached = json!({
        "process_id": process.id,
        "from_seq": from,
        "first_seq": first,
        "next_seq": next,
        "truncated": from < first || (p.from_seq.is_none() && first > 0),
        "terminal": process.terminal.is_some(),
        "state": if process.running() { "running" } else { "exited" },
    });
    if process.running() {
        process.watch(call.resources.events());
    }
    if call.stream.event("attached", attached).await.is_err() {
        return Err(ErrorBody::new(ErrorCode::Cancelled, "the session ended"));
    }
    let deadline = p.wait_ms.map(|ms| {
        tokio::time::Instant::now() + std::time::Duration::from_millis(ms.min(86_400_000))
    });
    follow_until(&call, &process, from, false, deadline).await
}

#[derive(Deserialize)]
struct ProcessParams {
    process_id: String,
}

#[derive(Deserialize)]
struct InputParams {
    process_id: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    encoding: Encoding,
    /// Close stdin after `data`.
    #[serde(default)]
    eof: bool,
}

pub async fn input(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: InputParams = params(&call.request)?;
    let data = match p.encoding {
        Encoding::Utf8 => p.data.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(&p.data)
            .map_err(|e| invalid(format!("data: {e}")))?,
    };
    let process = shell.processes().find(&call.principal, &p.process_id)?;
    let n = data.len();
    call.usage.add_in(n);
    let closed = || ErrorBody::new(ErrorCode::NotFound, "the process no longer reads its input");
    if n > 0 {
        process
            .stdin
            .send(StdinChunk::Data(Bytes::from(data)))
            .await
            .map_err(|_| closed())?;
    }
    if p.eof {
        process
            .stdin
            .send(StdinChunk::End)
            .await
            .map_err(|_| closed())?;
    }
    Ok(json!({"process_id": p.process_id, "written": n, "eof": p.eof}))
}

#[derive(Deserialize)]
struct ResizeParams {
    process_id: String,
    cols: u16,
    rows: u16,
}

pub async fn resize(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: ResizeParams = params(&call.request)?;
    if !(1..=1000).contains(&p.cols) || !(1..=1000).contains(&p.rows) {
        return Err(invalid("cols and rows must be between 1 and 1000"));
    }
    let process = shell.processes().find(&call.principal, &p.process_id)?;
    let Some(master) = &process.terminal else {
        return Err(invalid(format!(
            "process `{}` has no terminal (start it with `pty: true`)",
            p.process_id
        )));
    };
    if process.running() {
        pty::resize(master, p.cols, p.rows)
            .map_err(|e| provider_error(format!("resizing the terminal: {e}")))?;
    }
    Ok(json!({"process_id": p.process_id, "cols": p.cols, "rows": p.rows}))
}

#[derive(Deserialize)]
struct SignalParams {
    process_id: String,
    signal: String,
}

pub async fn signal(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: SignalParams = params(&call.request)?;
    // Only these may be sent; the names are the ones `shell.exec` reports.
    const SENDABLE: &[&str] = &[
        "TERM", "INT", "KILL", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT", "WINCH",
    ];
    let bare = p.signal.trim_start_matches("SIG");
    let signal = SENDABLE
        .contains(&bare)
        .then(|| super::signal_number(bare))
        .flatten()
        .and_then(Signal::from_named_raw)
        .ok_or_else(|| invalid(format!("signal `{bare}`: one of {}", SENDABLE.join(", "))))?;
    let process = shell.processes().find(&call.principal, &p.process_id)?;
    // Until the launcher has made its process group (`setsid`, its first
    // step) the group does not exist: the signal goes to the launcher then.
    let sent = process.running()
        && process
            .pid
            .and_then(rustix::process::Pid::from_raw)
            .is_some_and(|pid| {
                rustix::process::kill_process_group(pid, signal)
                    .or_else(|_| rustix::process::kill_process(pid, signal))
                    .is_ok()
            });
    Ok(json!({"process_id": p.process_id, "signal": p.signal, "sent": sent}))
}

pub async fn cancel(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: ProcessParams = params(&call.request)?;
    let process = shell.processes().find(&call.principal, &p.process_id)?;
    let was_running = process.running();
    process.stop_and_wait(StopReason::Cancelled).await;
    Ok(json!({"process_id": p.process_id, "cancelled": was_running}))
}

pub async fn status(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let p: ProcessParams = params(&call.request)?;
    Ok(shell
        .processes()
        .find(&call.principal, &p.process_id)?
        .describe())
}

pub async fn list(shell: Shell, call: Call) -> Result<Value, ErrorBody> {
    let mine: Vec<Value> = shell
        .processes()
        .of(&call.principal)
        .iter()
        .map(|p| p.describe())
        .collect();
    Ok(json!({"processes": mine}))
}

//! `shell.start` and the methods that act on a started process:
//! `shell.input`, `shell.signal`, `shell.cancel`, `shell.status`,
//! `shell.list`.
//!
//! `shell.start` runs as long as its process: first a `started` stream
//! frame with the process id, then the output as chunks (channel 1 stdout,
//! 2 stderr) in order, then the terminal response with the exit status.
//! Output is sent as it comes; a slow client slows the process through the
//! pipe (the byte-bounded replay ring that decouples them comes with
//! persistent processes). Processes live in a daemon-wide table, visible
//! and controllable only by the principal that started them.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use base64::Engine as _;
use bytes::Bytes;
use rustix::process::Signal;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Outcome, drained, exit_result, invalid, params, shell_terms, spawn, time_limit};
use crate::files::Encoding;
use crate::frame::{ErrorBody, ErrorCode};
use crate::record::Channel;
use crate::server::dispatch::{Call, StreamSink};

#[derive(Deserialize)]
struct StartParams {
    command: Vec<String>,
    timeout_ms: Option<u64>,
}

/// One started process, as `shell.list` shows it.
struct Entry {
    owner: String,
    command: Vec<String>,
    pid: Option<i32>,
    started_at: String,
    stdin: mpsc::Sender<StdinChunk>,
    stop: CancellationToken,
}

enum StdinChunk {
    Data(Bytes),
    End,
}

#[derive(Default)]
struct Table {
    next: u64,
    by_id: BTreeMap<String, Entry>,
}

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub async fn start(call: Call) -> Result<Value, ErrorBody> {
    let p: StartParams = params(&call.request)?;
    let terms = shell_terms(call.terms)?;
    let mut running = spawn(&call.principal, &terms, &p.command, true)?;
    let (stdin_tx, stdin_rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let id = {
        let mut table = table();
        table.next += 1;
        let id = format!("p{}", table.next);
        let entry = Entry {
            owner: call.principal.clone(),
            command: p.command.clone(),
            pid: running.pid.map(|pid| pid.as_raw_nonzero().get()),
            started_at: jiff::Timestamp::now().to_string(),
            stdin: stdin_tx,
            stop: stop.clone(),
        };
        table.by_id.insert(id.clone(), entry);
        id
    };
    // Whatever happens below, the entry goes when this call ends.
    let _listed = Listed(id.clone());
    let started = json!({"process_id": id, "pid": running.pid.map(|p| p.as_raw_nonzero().get())});
    if call.stream.event("started", started).await.is_err() {
        return Err(ErrorBody::new(ErrorCode::Cancelled, "the session ended"));
    }
    let limit = terms.output_limit;
    let out = tokio::spawn(pump(
        running.child.stdout.take(),
        call.stream.clone(),
        Channel::Stdout,
        limit,
    ));
    let err = tokio::spawn(pump(
        running.child.stderr.take(),
        call.stream.clone(),
        Channel::Stderr,
        limit,
    ));
    if let Some(stdin) = running.child.stdin.take() {
        tokio::spawn(feed(stdin, stdin_rx, call.usage.clone()));
    }
    let (outcome, status) = running
        .wait(time_limit(p.timeout_ms, &terms), &call.cancel, Some(&stop))
        .await?;
    if let Outcome::Cancelled = outcome {
        return Err(ErrorBody::new(
            ErrorCode::Cancelled,
            "the process was killed: cancelled",
        ));
    }
    let (out, err) = (drained(out).await, drained(err).await);
    let mut result = exit_result(&status, &outcome, running.started);
    result["process_id"] = json!(id);
    result["cancelled"] = json!(matches!(outcome, Outcome::Stopped));
    result["stdout_bytes"] = json!(out.total);
    result["stderr_bytes"] = json!(err.total);
    result["output_truncated"] = json!(out.truncated || err.truncated);
    Ok(result)
}

/// Removes a process from the table when its `shell.start` ends.
struct Listed(String);

impl Drop for Listed {
    fn drop(&mut self) {
        table().by_id.remove(&self.0);
    }
}

#[derive(Default)]
struct Pumped {
    total: u64,
    truncated: bool,
}

/// Streams one output pipe as chunks until it closes; past `limit` bytes
/// the output is counted and dropped.
async fn pump(
    pipe: Option<impl AsyncRead + Unpin>,
    sink: StreamSink,
    channel: Channel,
    limit: u64,
) -> Pumped {
    let mut pumped = Pumped::default();
    let Some(mut pipe) = pipe else {
        return pumped;
    };
    let piece = crate::record::chunk_capacity(sink.id()).clamp(1, 32 * 1024);
    let mut buf = vec![0u8; piece];
    while let Ok(n @ 1..) = pipe.read(&mut buf).await {
        let room = limit.saturating_sub(pumped.total) as usize;
        pumped.total += n as u64;
        if room < n {
            pumped.truncated = true;
        }
        let send = n.min(room);
        if send > 0
            && sink
                .chunk(channel, Bytes::copy_from_slice(&buf[..send]))
                .await
                .is_err()
        {
            break;
        }
    }
    pumped
}

/// Writes what `shell.input` sends to the process's stdin.
async fn feed(
    mut stdin: tokio::process::ChildStdin,
    mut input: mpsc::Receiver<StdinChunk>,
    usage: std::sync::Arc<crate::server::dispatch::Usage>,
) {
    while let Some(StdinChunk::Data(data)) = input.recv().await {
        usage.add_in(data.len());
        if stdin.write_all(&data).await.is_err() {
            return;
        }
    }
    // `End`, or the process is gone: stdin closes when dropped.
}

#[derive(Deserialize)]
struct ProcessParams {
    process_id: String,
}

/// The caller's own process `id`; anyone else's is `not_found` too, so
/// ids of other principals' processes are not disclosed.
fn owned<T>(principal: &str, id: &str, f: impl FnOnce(&Entry) -> T) -> Result<T, ErrorBody> {
    let table = table();
    match table.by_id.get(id) {
        Some(entry) if entry.owner == principal => Ok(f(entry)),
        _ => Err(ErrorBody::new(
            ErrorCode::NotFound,
            format!("no running process `{id}` of yours"),
        )),
    }
}

fn describe(id: &str, entry: &Entry) -> Value {
    json!({
        "process_id": id,
        "command": entry.command,
        "pid": entry.pid,
        "started_at": entry.started_at,
        "state": "running",
    })
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

pub async fn input(call: Call) -> Result<Value, ErrorBody> {
    let p: InputParams = params(&call.request)?;
    let data = match p.encoding {
        Encoding::Utf8 => p.data.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(&p.data)
            .map_err(|e| invalid(format!("data: {e}")))?,
    };
    let stdin = owned(&call.principal, &p.process_id, |e| e.stdin.clone())?;
    let n = data.len();
    let closed = || ErrorBody::new(ErrorCode::NotFound, "the process no longer reads its input");
    if n > 0 {
        stdin
            .send(StdinChunk::Data(Bytes::from(data)))
            .await
            .map_err(|_| closed())?;
    }
    if p.eof {
        stdin.send(StdinChunk::End).await.map_err(|_| closed())?;
    }
    Ok(json!({"process_id": p.process_id, "written": n, "eof": p.eof}))
}

#[derive(Deserialize)]
struct SignalParams {
    process_id: String,
    signal: String,
}

pub async fn signal(call: Call) -> Result<Value, ErrorBody> {
    let p: SignalParams = params(&call.request)?;
    // Only these may be sent; the names are the ones `shell.exec` reports.
    const SENDABLE: &[&str] = &[
        "TERM", "INT", "KILL", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT",
    ];
    let bare = p.signal.trim_start_matches("SIG");
    let signal = SENDABLE
        .contains(&bare)
        .then(|| super::signal_number(bare))
        .flatten()
        .and_then(Signal::from_named_raw)
        .ok_or_else(|| invalid(format!("signal `{bare}`: one of {}", SENDABLE.join(", "))))?;
    let pid = owned(&call.principal, &p.process_id, |e| e.pid)?;
    let sent = pid
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|pid| rustix::process::kill_process_group(pid, signal).is_ok());
    Ok(json!({"process_id": p.process_id, "signal": p.signal, "sent": sent}))
}

pub async fn cancel(call: Call) -> Result<Value, ErrorBody> {
    let p: ProcessParams = params(&call.request)?;
    owned(&call.principal, &p.process_id, |e| e.stop.cancel())?;
    Ok(json!({"process_id": p.process_id, "cancelled": true}))
}

pub async fn status(call: Call) -> Result<Value, ErrorBody> {
    let p: ProcessParams = params(&call.request)?;
    owned(&call.principal, &p.process_id, |e| {
        describe(&p.process_id, e)
    })
}

pub async fn list(call: Call) -> Result<Value, ErrorBody> {
    let table = table();
    let mine: Vec<Value> = table
        .by_id
        .iter()
        .filter(|(_, e)| e.owner == call.principal)
        .map(|(id, e)| describe(id, e))
        .collect();
    Ok(json!({"processes": mine}))
}

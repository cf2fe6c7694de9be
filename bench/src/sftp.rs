//! Just enough of an SFTP (version 3) client to send `STAT` requests, and
//! small writes (open, write, close), with several in flight over one
//! `ssh -s sftp` connection: OpenSSH's counterparts of portcullis's
//! `file.stat` and `file.write`.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Instant;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, BufReader, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::measure::Latencies;

const INIT: u8 = 1;
const VERSION: u8 = 2;
const STAT: u8 = 17;
const STATUS: u8 = 101;
const ATTRS: u8 = 105;

/// The big-endian `u32` at `at` in a packet's body (its request id at 0,
/// a status code at 4).
fn u32_at(body: &[u8], at: usize) -> Option<u32> {
    let b = body.get(at..at + 4)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

pub struct Sftp {
    _child: Child,
    to: BufWriter<ChildStdin>,
    from: BufReader<ChildStdout>,
}

impl Sftp {
    /// Opens the subsystem through `ssh` (a new connection).
    pub async fn open(mut ssh: std::process::Command) -> Result<Self, String> {
        ssh.arg("-s").arg("sftp");
        let mut child = tokio::process::Command::from(ssh)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("ssh -s sftp: {e}"))?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("ssh -s sftp: no pipes".into());
        };
        let mut sftp = Self {
            _child: child,
            to: BufWriter::new(to),
            from: BufReader::new(from),
        };
        sftp.send(INIT, &3u32.to_be_bytes()).await?;
        sftp.to.flush().await.map_err(|e| e.to_string())?;
        match sftp.receive().await? {
            (VERSION, _) => Ok(sftp),
            (kind, _) => Err(format!("sftp: expected VERSION, got packet type {kind}")),
        }
    }

    async fn send(&mut self, kind: u8, payload: &[u8]) -> Result<(), String> {
        let length = (payload.len() + 1) as u32;
        let io = |e: std::io::Error| format!("sftp: {e}");
        self.to.write_all(&length.to_be_bytes()).await.map_err(io)?;
        self.to.write_all(&[kind]).await.map_err(io)?;
        self.to.write_all(payload).await.map_err(io)
    }

    async fn receive(&mut self) -> Result<(u8, Vec<u8>), String> {
        let io = |e: std::io::Error| format!("sftp: {e}");
        let length = self.from.read_u32().await.map_err(io)? as usize;
        if !(1..=256 * 1024).contains(&length) {
            return Err(format!("sftp: a packet of {length} bytes"));
        }
        let mut packet = vec![0; length];
        self.from.read_exact(&mut packet).await.map_err(io)?;
        Ok((packet[0], packet.split_off(1)))
    }

    async fn send_stat(&mut self, id: u32, path: &str) -> Result<(), String> {
        let mut payload = Vec::with_capacity(8 + path.len());
        payload.extend_from_slice(&id.to_be_bytes());
        payload.extend_from_slice(&(path.len() as u32).to_be_bytes());
        payload.extend_from_slice(path.as_bytes());
        self.send(STAT, &payload).await
    }

    /// `STAT path` with `window` requests in flight until `deadline`; the
    /// latency of each (sent to answered). A failed stat is an error.
    pub async fn stat_until(
        &mut self,
        path: &str,
        window: usize,
        deadline: Instant,
    ) -> Result<Latencies, String> {
        let mut sent: HashMap<u32, Instant> = HashMap::new();
        let mut latencies = Latencies::default();
        let mut next_id = 0u32;
        for _ in 0..window {
            self.send_stat(next_id, path).await?;
            sent.insert(next_id, Instant::now());
            next_id += 1;
        }
        self.to.flush().await.map_err(|e| e.to_string())?;
        while !sent.is_empty() {
            let (kind, body) = self.receive().await?;
            let id = u32_at(&body, 0).ok_or("sftp: a short answer")?;
            let started = sent.remove(&id).ok_or("sftp: an answer to no request")?;
            latencies.push(started.elapsed());
            if kind != ATTRS {
                let what = if kind == STATUS {
                    "an error status"
                } else {
                    "an unexpected packet"
                };
                return Err(format!("sftp: STAT {path} got {what}"));
            }
            if Instant::now() < deadline {
                self.send_stat(next_id, path).await?;
                sent.insert(next_id, Instant::now());
                next_id = next_id.wrapping_add(1);
                self.to.flush().await.map_err(|e| e.to_string())?;
            }
        }
        Ok(latencies)
    }
}

const OPEN: u8 = 3;
const CLOSE: u8 = 4;
const WRITE: u8 = 6;
const HANDLE: u8 = 102;
/// `SSH_FXF_WRITE | SSH_FXF_CREAT | SSH_FXF_TRUNC`.
const WRITE_CREATE_TRUNCATE: u32 = 0x02 | 0x08 | 0x10;

/// Where one slot of [`Sftp::write_until`] is in its open, write, close.
enum Stage {
    Opening,
    Writing(Vec<u8>),
    Closing,
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
}

impl Sftp {
    /// Writes `data` to `{prefix}{slot}` (OPEN with truncate, WRITE, CLOSE:
    /// what an SFTP client does to put a small file), `window` slots at a
    /// time until `deadline`; the latency of each whole write. OpenSSH's
    /// counterpart of `file.write`; its server does not `fsync`.
    pub async fn write_until(
        &mut self,
        prefix: &str,
        data: &[u8],
        window: usize,
        deadline: Instant,
    ) -> Result<Latencies, String> {
        // id → (slot, stage, when the write began)
        let mut sent: HashMap<u32, (usize, Stage, Instant)> = HashMap::new();
        let mut latencies = Latencies::default();
        let mut next_id = 0u32;
        for slot in 0..window {
            self.send_open(next_id, &format!("{prefix}{slot}")).await?;
            sent.insert(next_id, (slot, Stage::Opening, Instant::now()));
            next_id += 1;
        }
        self.to.flush().await.map_err(|e| e.to_string())?;
        while !sent.is_empty() {
            let (kind, body) = self.receive().await?;
            let id = u32_at(&body, 0).ok_or("sftp: a short answer")?;
            let (slot, stage, started) = sent.remove(&id).ok_or("sftp: an answer to no request")?;
            let ok_status = kind == STATUS && u32_at(&body, 4) == Some(0);
            let next = match stage {
                Stage::Opening if kind == HANDLE => {
                    // The handle as a string: its length, then its bytes.
                    let handle = body.get(4..).ok_or("sftp: a short handle")?.to_vec();
                    let mut payload = Vec::with_capacity(32 + data.len());
                    payload.extend_from_slice(&next_id.to_be_bytes());
                    payload.extend_from_slice(&handle);
                    payload.extend_from_slice(&0u64.to_be_bytes());
                    string(&mut payload, data);
                    self.send(WRITE, &payload).await?;
                    Some(Stage::Writing(handle))
                }
                Stage::Writing(handle) if ok_status => {
                    let mut payload = next_id.to_be_bytes().to_vec();
                    payload.extend_from_slice(&handle);
                    self.send(CLOSE, &payload).await?;
                    Some(Stage::Closing)
                }
                Stage::Closing if ok_status => {
                    latencies.push(started.elapsed());
                    if Instant::now() < deadline {
                        self.send_open(next_id, &format!("{prefix}{slot}")).await?;
                        sent.insert(next_id, (slot, Stage::Opening, Instant::now()));
                        next_id = next_id.wrapping_add(1);
                        self.to.flush().await.map_err(|e| e.to_string())?;
                    }
                    None
                }
                stage => {
                    let stage = match stage {
                        Stage::Opening => "OPEN",
                        Stage::Writing(_) => "WRITE",
                        Stage::Closing => "CLOSE",
                    };
                    let status = u32_at(&body, 4);
                    let message = String::from_utf8_lossy(body.get(12..).unwrap_or_default());
                    return Err(format!(
                        "sftp: {stage} of {prefix}{slot} got packet type {kind} (status {status:?}: {message})"
                    ));
                }
            };
            if let Some(stage) = next {
                sent.insert(next_id, (slot, stage, started));
                next_id = next_id.wrapping_add(1);
                self.to.flush().await.map_err(|e| e.to_string())?;
            }
        }
        Ok(latencies)
    }

    async fn send_open(&mut self, id: u32, path: &str) -> Result<(), String> {
        let mut payload = id.to_be_bytes().to_vec();
        string(&mut payload, path.as_bytes());
        payload.extend_from_slice(&WRITE_CREATE_TRUNCATE.to_be_bytes());
        payload.extend_from_slice(&0u32.to_be_bytes()); // no attributes
        self.send(OPEN, &payload).await
    }
}

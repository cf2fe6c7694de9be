//! Started processes (`shell.start`), daemon-wide: each one's output ring,
//! its state, and the keeper that ends processes the policy no longer
//! allows or nobody has used for a while.
//!
//! Output goes into a byte-bounded ring as it comes and never waits for a
//! reader: a slow or absent client cannot stall the process. Every byte of
//! output has a sequence number (its offset in the process's output, all
//! channels together), so a reader that knows where it stopped asks for
//! the rest; what the ring no longer holds is reported as missed, never
//! skipped silently. Readers (`shell.start` itself, `shell.attach`) follow
//! the ring at their own pace.
//!
//! A process without `persist` ends with the request that started it; a
//! persistent one outlives its session and is kept, after it exits too,
//! until it has been idle (nobody following, no output, no input) for the
//! grant's `idle_timeout`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use portcullis_policy::Policy;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::provider::EventSink;
use crate::provider::output::{OutputFrame, TextOutput};
use crate::provider::{OutputForm, Pause, SessionGone, StreamSink};
use portcullis_store::{Handle, Handles};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Event, Request};
use portcullis_wire::record::Channel;

/// Output a process keeps for readers who are behind or away.
pub const RING_BYTES: usize = 1 << 20;

/// How a handle the gateway lost (see [`Processes::tell_lost`]) is
/// recorded once its owner was told.
const TOLD_LOST: &str = "lost";

/// Exited processes kept per principal (for `shell.attach` and status);
/// beyond this the oldest exited one is forgotten.
const KEEP_EXITED: usize = 32;

/// Why a process was ended before it exited on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `shell.cancel`, or a `cancel` of the request that started it.
    Cancelled,
    /// The policy no longer allows it.
    Revoked,
    /// The operator's emergency stop (`portcullis pause`).
    Stopped,
    /// Idle for the grant's `idle_timeout`.
    Idle,
    /// `resource.dispose`.
    Disposed,
    /// The session that started it ended (a process without `persist`).
    SessionEnded,
    /// The gateway is stopping.
    Shutdown,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancelled => "cancelled",
            Self::Revoked => "revoked",
            Self::Stopped => "stopped",
            Self::Idle => "idle",
            Self::Disposed => "disposed",
            Self::SessionEnded => "session_ended",
            Self::Shutdown => "shutdown",
        }
    }
}

pub enum StdinChunk {
    Data(Bytes),
    End,
}

/// One started process.
pub struct Process {
    pub id: String,
    /// Order of creation in this run (the number in the id).
    seq: u64,
    pub owner: String,
    /// The request that started it, decided again when the policy changes.
    pub request: Request,
    pub command: Vec<String>,
    pub pid: Option<i32>,
    pub started_at: String,
    pub persist: bool,
    pub idle_timeout: Duration,
    /// Keeps running when its grant is revoked.
    pub survive_revocation: bool,
    /// What the sandbox lacked, if anything (see `Running`).
    pub sandbox_warning: Option<String>,
    /// The terminal's controlling side, for `shell.resize`.
    pub terminal: Option<Arc<std::os::fd::OwnedFd>>,
    pub output: Output,
    pub stdin: mpsc::Sender<StdinChunk>,
    stop: CancellationToken,
    stop_reason: OnceLock<StopReason>,
    activity: Mutex<Activity>,
    /// The exit result, once there is one.
    exit: watch::Sender<Option<Value>>,
    /// Sessions that started or attached, told `process.exited`.
    watchers: Mutex<Vec<EventSink>>,
}

struct Activity {
    followers: usize,
    last: Instant,
}

/// What [`Process::new`] needs besides the id.
pub struct Spec {
    pub owner: String,
    pub request: Request,
    pub command: Vec<String>,
    pub pid: Option<i32>,
    pub persist: bool,
    pub idle_timeout: Duration,
    pub survive_revocation: bool,
    pub sandbox_warning: Option<String>,
    pub terminal: Option<Arc<std::os::fd::OwnedFd>>,
    pub output_limit: u64,
    pub stdin: mpsc::Sender<StdinChunk>,
}

impl Process {
    fn new(seq: u64, tag: &str, spec: Spec) -> Self {
        Self {
            id: format!("p{seq}-{tag}"),
            seq,
            owner: spec.owner,
            request: spec.request,
            command: spec.command,
            pid: spec.pid,
            started_at: jiff::Timestamp::now().to_string(),
            persist: spec.persist,
            idle_timeout: spec.idle_timeout,
            survive_revocation: spec.survive_revocation,
            sandbox_warning: spec.sandbox_warning,
            terminal: spec.terminal,
            output: Output::new(RING_BYTES, spec.output_limit),
            stdin: spec.stdin,
            stop: CancellationToken::new(),
            stop_reason: OnceLock::new(),
            activity: Mutex::new(Activity {
                followers: 0,
                last: Instant::now(),
            }),
            exit: watch::Sender::new(None),
            watchers: Mutex::default(),
        }
    }

    /// Ends the process group (the supervisor kills it and records why).
    pub fn stop(&self, reason: StopReason) {
        let _ = self.stop_reason.set(reason);
        self.stop.cancel();
    }

    /// Stops the process and waits (a little: it is killed, then its
    /// output drained) until it is gone, so that a status right after says
    /// so.
    pub async fn stop_and_wait(&self, reason: StopReason) {
        self.stop(reason);
        let _ = tokio::time::timeout(Duration::from_secs(4), self.exited()).await;
    }

    /// Cancelled when the process is to be stopped.
    pub fn stop_token(&self) -> &CancellationToken {
        &self.stop
    }

    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_reason.get().copied()
    }

    pub fn result(&self) -> Option<Value> {
        self.exit.borrow().clone()
    }

    pub fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// Waits for the exit result.
    pub async fn exited(&self) -> Value {
        let mut rx = self.exit.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(result) => result.clone().unwrap_or_default(),
            Err(_) => Value::Null,
        }
    }

    /// Records the exit result and tells the watching sessions:
    /// `process.exited`, and the spec's `resource.updated` (the process is
    /// a resource of theirs, `resource.list` shows it).
    pub fn finish(&self, result: Value) {
        self.exit.send_replace(Some(result.clone()));
        self.touch();
        let watchers = std::mem::take(&mut *lock(&self.watchers));
        let mut payload = result;
        payload["process_id"] = json!(self.id);
        let mut updated = payload.clone();
        updated["id"] = json!(self.id);
        updated["kind"] = json!("process");
        updated["state"] = json!("exited");
        for sink in watchers {
            let (payload, updated) = (payload.clone(), updated.clone());
            // A slow session must not hold up the others, or this task.
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    let _ = sink.send("process.exited", payload).await;
                    let _ = sink.send("resource.updated", updated).await;
                })
                .await;
            });
        }
    }

    /// Tells this session `process.exited` when the process exits (once,
    /// however often it starts or attaches).
    pub fn watch(&self, sink: EventSink) {
        let mut watchers = lock(&self.watchers);
        watchers.retain(|w| !w.is_closed());
        if watchers.iter().any(|w| w.same_session(&sink)) {
            return;
        }
        if watchers.len() >= 64 {
            watchers.remove(0);
        }
        watchers.push(sink);
    }

    /// Marks activity (output, input, a request about it).
    pub fn touch(&self) {
        lock(&self.activity).last = Instant::now();
    }

    /// Counts a reader while the guard lives.
    pub fn follow(self: &Arc<Self>) -> Following {
        let mut activity = lock(&self.activity);
        activity.followers += 1;
        activity.last = Instant::now();
        Following(self.clone())
    }

    /// Nobody follows it and nothing happened for its `idle_timeout`.
    fn idle(&self, now: Instant) -> bool {
        let activity = lock(&self.activity);
        let last = activity.last.max(self.output.last_write());
        activity.followers == 0 && now.saturating_duration_since(last) >= self.idle_timeout
    }

    /// As `shell.status`, `shell.list` and `resource.list` show it.
    pub fn describe(&self) -> Value {
        let (first_seq, next_seq) = self.output.span();
        let mut value = json!({
            "process_id": self.id,
            "command": self.command,
            "root_id": self.request.params.get("root_id"),
            "cwd": self.request.params.get("cwd"),
            "pid": self.pid,
            "started_at": self.started_at,
            "state": if self.running() { "running" } else { "exited" },
            "persist": self.persist,
            "terminal": self.terminal.is_some(),
            "attached": lock(&self.activity).followers,
            "first_seq": first_seq,
            "next_seq": next_seq,
        });
        if let Some(warning) = &self.sandbox_warning {
            value["sandbox_warning"] = json!(warning);
        }
        if let Some(Value::Object(result)) = self.result() {
            for key in ["exit_code", "signal", "ended_by", "duration_ms"] {
                if let Some(v) = result.get(key) {
                    value[key] = v.clone();
                }
            }
        }
        value
    }
}

/// A reader of a process's output; see [`Process::follow`].
pub struct Following(Arc<Process>);

impl Drop for Following {
    fn drop(&mut self) {
        let mut activity = lock(&self.0.activity);
        activity.followers = activity.followers.saturating_sub(1);
        activity.last = Instant::now();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every value behind these locks stays whole if a holder panicked.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A process's output: a ring of pieces, each with the sequence number of
/// its first byte.
pub struct Output {
    ring: Mutex<Ring>,
    /// The sequence number after the last byte, and whether output ended.
    progress: watch::Sender<(u64, bool)>,
}

struct Ring {
    pieces: VecDeque<Piece>,
    /// Bytes held in `pieces`.
    held: usize,
    capacity: usize,
    /// Sequence number of the first byte held.
    first: u64,
    /// Sequence number after the last byte.
    next: u64,
    /// Output past `limit` is counted, not kept.
    limit: u64,
    over_limit: u64,
    by_channel: BTreeMap<u8, u64>,
    last_write: Instant,
}

#[derive(Clone)]
pub struct Piece {
    pub seq: u64,
    pub channel: Channel,
    pub data: Bytes,
}

/// What a reader gets from [`Output::read_from`].
pub struct Batch {
    /// Bytes between the sequence asked for and the first one held.
    pub missed: u64,
    pub pieces: Vec<Piece>,
    /// Where to read next.
    pub next: u64,
    /// Output has ended and `next` is its end.
    pub done: bool,
}

impl Output {
    pub fn new(capacity: usize, limit: u64) -> Self {
        Self {
            ring: Mutex::new(Ring {
                pieces: VecDeque::new(),
                held: 0,
                capacity,
                first: 0,
                next: 0,
                limit,
                over_limit: 0,
                by_channel: BTreeMap::new(),
                last_write: Instant::now(),
            }),
            progress: watch::Sender::new((0, false)),
        }
    }

    /// Appends output; drops the oldest pieces beyond the ring's capacity.
    /// Never waits for a reader.
    pub fn push(&self, channel: Channel, data: &[u8]) {
        let next = {
            let mut ring = lock(&self.ring);
            ring.last_write = Instant::now();
            *ring.by_channel.entry(channel as u8).or_default() += data.len() as u64;
            let room = ring.limit.saturating_sub(ring.next + ring.over_limit);
            let keep = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            ring.over_limit += (data.len() - keep) as u64;
            if keep == 0 {
                return;
            }
            let piece = Piece {
                seq: ring.next,
                channel,
                data: Bytes::copy_from_slice(&data[..keep]),
            };
            ring.next += keep as u64;
            ring.held += keep;
            ring.pieces.push_back(piece);
            while ring.held > ring.capacity {
                let Some(old) = ring.pieces.pop_front() else {
                    break;
                };
                ring.held -= old.data.len();
                ring.first = old.seq + old.data.len() as u64;
            }
            ring.next
        };
        self.progress.send_replace((next, false));
    }

    /// No more output will come.
    pub fn close(&self) {
        let next = lock(&self.ring).next;
        self.progress.send_replace((next, true));
    }

    /// Up to `max` bytes from `seq` on (from the oldest held if that is
    /// gone).
    pub fn read_from(&self, seq: u64, max: usize) -> Batch {
        let ring = lock(&self.ring);
        let start = seq.clamp(ring.first, ring.next);
        let missed = ring.first.saturating_sub(seq);
        let mut pieces = Vec::new();
        let mut taken = 0usize;
        let mut at = start;
        for piece in &ring.pieces {
            let end = piece.seq + piece.data.len() as u64;
            if end <= at {
                continue;
            }
            if taken >= max {
                break;
            }
            let skip = (at - piece.seq) as usize;
            let data = piece.data.slice(skip..);
            taken += data.len();
            at = end;
            pieces.push(Piece {
                seq: piece.seq + skip as u64,
                channel: piece.channel,
                data,
            });
        }
        let done = self.progress.borrow().1 && at == ring.next;
        Batch {
            missed,
            pieces,
            next: at,
            done,
        }
    }

    /// (first sequence held, next sequence)
    pub fn span(&self) -> (u64, u64) {
        let ring = lock(&self.ring);
        (ring.first, ring.next)
    }

    /// Bytes written to `channel`, all of them (kept or not).
    pub fn written(&self, channel: Channel) -> u64 {
        lock(&self.ring)
            .by_channel
            .get(&(channel as u8))
            .copied()
            .unwrap_or(0)
    }

    /// Bytes past the grant's `output_limit`, not kept.
    pub fn over_limit(&self) -> u64 {
        lock(&self.ring).over_limit
    }

    fn last_write(&self) -> Instant {
        lock(&self.ring).last_write
    }

    pub fn subscribe(&self) -> watch::Receiver<(u64, bool)> {
        self.progress.subscribe()
    }
}

/// Bytes a reader takes from the ring at a time.
const READ_BATCH: usize = 256 * 1024;

/// How far [`stream`] went.
pub struct Streamed {
    /// Bytes the ring no longer held (reported as `output_truncated`).
    pub missed: u64,
    /// Whether the output ended; `false` when the deadline came first.
    pub ended: bool,
}

/// Sends the output from `seq` until it ends (or, with a `deadline`, until
/// it is caught up at or after it), as `stream` frames or chunks (the
/// session's [`OutputForm`]), reporting what the ring no longer held as
/// `output_truncated` stream frames.
pub async fn stream(
    process: &Process,
    mut seq: u64,
    sink: &StreamSink,
    deadline: Option<tokio::time::Instant>,
) -> Result<Streamed, SessionGone> {
    let mut progress = process.output.subscribe();
    let mut missed_total = 0;
    let mut text = (sink.output_form() == OutputForm::Frames).then(TextOutput::default);
    let mut frames = Vec::new();
    loop {
        progress.borrow_and_update();
        let batch = process.output.read_from(seq, READ_BATCH);
        if batch.missed > 0 {
            if let Some(text) = &mut text {
                text.flush(&mut frames);
                send_frames(sink, &mut frames).await?;
            }
            missed_total += batch.missed;
            let resumed_at = seq + batch.missed;
            let report =
                json!({"missed_bytes": batch.missed, "from_seq": seq, "resumed_at": resumed_at});
            sink.event("output_truncated", report).await?;
        }
        let caught_up = batch.pieces.is_empty();
        for piece in batch.pieces {
            match &mut text {
                None => sink.chunk(piece.channel, piece.data).await?,
                Some(text) => {
                    text.push(piece.channel, piece.seq, &piece.data, &mut frames);
                    send_frames(sink, &mut frames).await?;
                }
            }
        }
        seq = batch.next;
        let ended = batch.done;
        let waited = caught_up && deadline.is_some_and(|d| tokio::time::Instant::now() >= d);
        if ended || waited {
            if let Some(text) = &mut text {
                text.flush(&mut frames);
                send_frames(sink, &mut frames).await?;
            }
            return Ok(Streamed {
                missed: missed_total,
                ended,
            });
        }
        if caught_up {
            let until = deadline
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365));
            tokio::select! {
                changed = progress.changed() => if changed.is_err() {
                    return Ok(Streamed { missed: missed_total, ended: true });
                },
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

async fn send_frames(sink: &StreamSink, frames: &mut Vec<OutputFrame>) -> Result<(), SessionGone> {
    for frame in frames.drain(..) {
        sink.output(frame).await?;
    }
    Ok(())
}

/// Every process the shell provider started in this run of the gateway,
/// by id: its table (and what `resource.*` lists of a principal's). Cloning
/// shares it.
#[derive(Clone)]
pub struct Processes(Arc<Held>);

struct Held {
    table: Mutex<Table>,
    /// This run of the gateway (`instance_id`); its first 8 characters end
    /// each process id: `p7-3f9a1c2e`.
    instance_id: String,
    tag: String,
    /// Every handle given out, across runs: one of an earlier run is lost,
    /// not unknown. `None` only where nothing is kept (unit tests).
    ledger: Option<Handles>,
    /// Handles an earlier run lost while they ran, not yet told to a
    /// session of their owner.
    untold: Mutex<Vec<(String, Handle)>>,
}

/// Every process, by id.
#[derive(Default)]
struct Table {
    next: u64,
    by_id: BTreeMap<String, Arc<Process>>,
}

impl Processes {
    /// An empty table whose ids end in the first 8 characters of
    /// `instance_id` (the gateway's, as its hello names it), remembering
    /// the handles it gives out in `ledger`.
    pub fn new(instance_id: &str, ledger: Option<Handles>) -> Self {
        let untold = match &ledger {
            Some(ledger) => ledger.lost(instance_id).unwrap_or_else(|e| {
                tracing::warn!("cannot read the handles of the gateway's earlier runs: {e}");
                Vec::new()
            }),
            None => Vec::new(),
        };
        Self(Arc::new(Held {
            table: Mutex::default(),
            instance_id: instance_id.to_string(),
            tag: instance_id.chars().take(8).collect(),
            ledger,
            untold: Mutex::new(untold),
        }))
    }

    /// The events (`process.lost`) a session of `principal` is told of
    /// the processes an earlier run of the gateway lost — each once, to the
    /// first session of its owner —, recorded as told.
    pub fn tell_lost(&self, principal: &str) -> Vec<Event> {
        let mine: Vec<(String, Handle)> = {
            let mut untold = lock(&self.0.untold);
            let (mine, others) = std::mem::take(&mut *untold)
                .into_iter()
                .partition(|(_, h)| h.owner == principal);
            *untold = others;
            mine
        };
        mine.into_iter()
            .map(|(id, handle)| {
                self.ended(&id, TOLD_LOST);
                Event {
                    event: "process.lost".into(),
                    payload: json!({
                        "process_id": id,
                        "terminal": handle.terminal,
                        "started_at": handle.started_at,
                        "ended_by": handle.ended_by,
                        "reason": "gateway_restarted",
                    }),
                }
            })
            .collect()
    }

    /// Makes `process`'s handle durable in the ledger; before anyone is
    /// told of it, so that every handle a client holds is known after a
    /// restart.
    pub async fn remember(&self, process: &Process) -> Result<(), ErrorBody> {
        let Some(ledger) = &self.0.ledger else {
            return Ok(());
        };
        let handle = Handle {
            owner: process.owner.clone(),
            instance_id: self.0.instance_id.clone(),
            terminal: process.terminal.is_some(),
            command: process.command.clone(),
            started_at: process.started_at.clone(),
            ended_by: None,
        };
        ledger.record(&process.id, &handle).await.map_err(|e| {
            ErrorBody::new(
                ErrorCode::ProviderError,
                format!("cannot record the process's handle: {e}"),
            )
        })
    }

    /// Records how a process ended (see [`Handles::ended`]).
    pub fn ended(&self, id: &str, ended_by: &str) {
        if let Some(ledger) = &self.0.ledger
            && let Err(e) = ledger.ended(id, ended_by)
        {
            tracing::warn!("cannot record how {id} ended: {e}");
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.0.table)
    }

    /// Processes held now (running, or exited and kept for attach).
    pub fn count(&self) -> usize {
        self.table().by_id.len()
    }

    /// Registers a new process under a fresh id. Of the owner's exited
    /// processes, only the newest [`KEEP_EXITED`] stay.
    pub fn register(&self, spec: Spec) -> Arc<Process> {
        let mut table = self.table();
        table.next += 1;
        let process = Arc::new(Process::new(table.next, &self.0.tag, spec));
        let mut exited: Vec<(u64, String)> = table
            .by_id
            .values()
            .filter(|p| p.owner == process.owner && !p.running())
            .map(|p| (p.seq, p.id.clone()))
            .collect();
        exited.sort_unstable();
        let excess = (exited.len() + 1).saturating_sub(KEEP_EXITED);
        for (_, old) in exited.iter().take(excess) {
            table.by_id.remove(old);
        }
        table.by_id.insert(process.id.clone(), process.clone());
        process
    }

    pub fn forget(&self, id: &str) {
        self.table().by_id.remove(id);
    }

    /// The caller's own process `id`. Another principal's is `not_found`
    /// too, so ids of other principals' processes are not disclosed.
    pub fn find(&self, principal: &str, id: &str) -> Result<Arc<Process>, ErrorBody> {
        if let Some(process) = self.table().by_id.get(id).filter(|p| p.owner == principal) {
            process.touch();
            return Ok(process.clone());
        }
        let handle = match &self.0.ledger {
            Some(ledger) => ledger.get(id).unwrap_or_else(|e| {
                tracing::warn!("cannot look up the handle {id}: {e}");
                None
            }),
            None => None,
        };
        match handle.filter(|h| h.owner == principal && h.instance_id != self.0.instance_id) {
            // `lost`: the handle was real, its process ended with that run
            // (the 0.92 profile's `process_lost`).
            Some(handle) => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!(
                    "process `{id}` was started by an earlier run of the gateway ({}), and \
                     ended when that run stopped",
                    handle.started_at
                ),
            )
            .with_details(json!({
                "lost": true,
                "reason": "gateway_restarted",
                "terminal": handle.terminal,
                "started_at": handle.started_at,
                "ended_by": handle.ended_by,
            }))),
            None => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("no process `{id}` of yours (it may have exited and been forgotten)"),
            )),
        }
    }

    /// The principal's processes, oldest first.
    pub fn of(&self, principal: &str) -> Vec<Arc<Process>> {
        let mut mine: Vec<Arc<Process>> = self
            .table()
            .by_id
            .values()
            .filter(|p| p.owner == principal)
            .cloned()
            .collect();
        mine.sort_by_key(|p| p.seq);
        mine
    }

    fn all(&self) -> Vec<Arc<Process>> {
        self.table().by_id.values().cloned().collect()
    }

    /// Waits (up to `grace`) for every process to have exited; for
    /// shutdown.
    pub async fn all_exited(&self, grace: Duration) {
        let processes = self.all();
        let every = async {
            for process in processes {
                process.exited().await;
            }
        };
        let _ = tokio::time::timeout(grace, every).await;
    }
}

/// How often the keeper looks at every process.
const KEEPER_TICK: Duration = Duration::from_secs(1);

/// Whether the policy still allows a request for a principal now (the
/// daemon's [`crate::provider::Providers::still_allowed`]).
pub type StillAllowed = Arc<dyn Fn(&Policy, &str, &Request, jiff::Timestamp) -> bool + Send + Sync>;

/// The task that ends processes the policy no longer allows (on every
/// policy change, and every second for expiries) and every one at the
/// emergency stop (but those whose grant says `survive_revocation`), ends
/// or forgets idle ones, and stops every process when `shutdown` fires.
pub async fn keeper(
    processes: Processes,
    mut policy: watch::Receiver<Arc<Policy>>,
    mut paused: watch::Receiver<Pause>,
    shutdown: CancellationToken,
    still_allowed: StillAllowed,
) {
    let mut tick = tokio::time::interval(KEEPER_TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Ok(()) = policy.changed() => {}
            Ok(()) = paused.changed() => {}
            () = shutdown.cancelled() => {
                for process in processes.all() {
                    process.stop(StopReason::Shutdown);
                }
                return;
            }
        }
        let current = policy.borrow_and_update().clone();
        // The emergency stop revokes everything.
        let stopped = *paused.borrow_and_update() == Pause::Stop;
        let (now, instant) = (jiff::Timestamp::now(), Instant::now());
        for process in processes.all() {
            let revocable = process.running() && !process.survive_revocation;
            let revoked = if !revocable {
                None
            } else if stopped {
                Some(StopReason::Stopped)
            } else if !still_allowed(&current, &process.owner, &process.request, now) {
                Some(StopReason::Revoked)
            } else {
                None
            };
            if let Some(reason) = revoked {
                tracing::info!(process = %process.id, principal = %process.owner, reason = reason.as_str(), "process revoked");
                process.stop(reason);
            } else if process.persist && process.idle(instant) {
                match process.running() {
                    true => process.stop(StopReason::Idle),
                    false => processes.forget(&process.id),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(batch: &Batch) -> String {
        batch
            .pieces
            .iter()
            .map(|p| String::from_utf8_lossy(&p.data).into_owned())
            .collect()
    }

    #[test]
    fn the_ring_keeps_the_newest_bytes_and_counts_the_rest() {
        let output = Output::new(8, u64::MAX);
        output.push(Channel::Stdout, b"abcd");
        output.push(Channel::Stderr, b"efgh");
        output.push(Channel::Stdout, b"ij");
        // "abcd" went to make room: 10 bytes written, 8 fit, pieces whole.
        let batch = output.read_from(0, usize::MAX);
        assert_eq!(batch.missed, 4);
        assert_eq!(text(&batch), "efghij");
        assert_eq!(batch.next, 10);
        assert!(!batch.done);
        assert_eq!(output.span(), (4, 10));
        // From the middle of a piece, and past the end.
        assert_eq!(text(&output.read_from(6, usize::MAX)), "ghij");
        assert_eq!(output.read_from(6, usize::MAX).missed, 0);
        assert!(output.read_from(99, usize::MAX).pieces.is_empty());
        output.close();
        assert!(output.read_from(10, usize::MAX).done);
        assert_eq!(output.written(Channel::Stdout), 6);
        assert_eq!(output.written(Channel::Stderr), 4);
    }

    #[test]
    fn output_past_the_limit_is_counted_not_kept() {
        let output = Output::new(1024, 5);
        output.push(Channel::Stdout, b"abc");
        output.push(Channel::Stdout, b"defg");
        output.push(Channel::Stdout, b"h");
        assert_eq!(text(&output.read_from(0, usize::MAX)), "abcde");
        assert_eq!(output.over_limit(), 3);
        assert_eq!(output.written(Channel::Stdout), 8);
    }

    #[test]
    fn a_batch_stops_near_its_size() {
        let output = Output::new(1024, u64::MAX);
        for _ in 0..10 {
            output.push(Channel::Stdout, b"0123456789");
        }
        let batch = output.read_from(0, 25);
        assert_eq!(batch.next, 30, "whole pieces until 25 bytes are taken");
        assert_eq!(output.read_from(batch.next, usize::MAX).next, 100);
    }
}

//! The scale test: many sessions at once, each reading small files,
//! stating them and running `/bin/true`, one request after another with a
//! pause, for a fixed time; first at each session count (the same pause,
//! so the offered load grows with the sessions), then at the largest count
//! again once the audit log has been filled to each given length. Every
//! failure is counted (the run fails when any request did); the largest
//! count's latency, RSS and CPU are reported per five-second window, and
//! every load's RSS, disk and latency in a table and a chart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portcullis_client::Client;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::Args;
use crate::gateway::Gateway;
use crate::measure::{self, Latencies};

pub const WINDOW: Duration = Duration::from_secs(5);
const FILES: usize = 16;
/// Of every 40 requests: 1 exec, 12 stats, 27 reads.
const MIX: &str =
    "of every 40 requests 27 `file.read` of a 4 KiB file, 12 `file.stat`, 1 `shell.exec /bin/true`";
/// Requests in flight while the log is filled.
pub const FILL_IN_FLIGHT: usize = 256;

#[derive(Clone, Copy)]
enum Kind {
    Read,
    Stat,
    Exec,
}

impl Kind {
    fn of(n: usize) -> Self {
        match n % 40 {
            0 => Self::Exec,
            1..=12 => Self::Stat,
            _ => Self::Read,
        }
    }
}

pub struct Window {
    pub from: u64,
    pub to: u64,
    pub requests: usize,
    pub p50: f64,
    pub p99: f64,
    pub rss_kib: u64,
    /// The gateway's CPU use over the window (1.0 = one core busy).
    pub cpu: f64,
}

/// One load: `sessions` for the test's time on a log of `log_entries`.
pub struct Load {
    pub sessions: usize,
    /// Audit entries in the log when the load started.
    pub log_entries: u64,
    /// How the log was filled to that length, when it was: entries per
    /// second at [`FILL_IN_FLIGHT`] `file.stat`s in flight.
    pub filled_at: Option<f64>,
    pub requests: usize,
    pub errors: u64,
    pub p50: f64,
    pub p99: f64,
    /// The gateway's RSS at the end of the load.
    pub rss_kib: u64,
    /// The gateway's state directory at the end of the load.
    pub disk_bytes: u64,
    /// The gateway's mean CPU use (1.0 = one core busy).
    pub cpu: f64,
}

/// A request's name, count, p50 and p99 in ms.
pub type ByKind = (&'static str, usize, f64, f64);

pub struct ScaleResult {
    pub seconds: u64,
    pub pause_ms: u64,
    pub mix: &'static str,
    pub loads: Vec<Load>,
    /// The largest session count's load, per window.
    pub sessions: usize,
    pub windows: Vec<Window>,
    pub by_kind: Vec<ByKind>,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub rss_before_kib: u64,
    pub rss_connected_kib: u64,
}

#[derive(Default)]
struct Recorder {
    windows: Vec<Latencies>,
    by_kind: [Latencies; 3],
    errors: u64,
    first_errors: Vec<String>,
}

impl Recorder {
    fn record(&mut self, window: usize, kind: Kind, outcome: Result<Duration, String>) {
        match outcome {
            Ok(took) => {
                if self.windows.len() <= window {
                    self.windows.resize_with(window + 1, Latencies::default);
                }
                self.windows[window].push(took);
                self.by_kind[kind as usize].push(took);
            }
            Err(e) => {
                self.errors += 1;
                if self.first_errors.len() < 5 {
                    self.first_errors.push(e);
                }
            }
        }
    }
}

/// What one load saw, before it is summed up.
struct Outcome {
    recorder: Recorder,
    rss: Vec<u64>,
    cpu: Vec<f64>,
    rss_end_kib: u64,
}

pub async fn run(args: &Args, gateway: &Gateway) -> Result<ScaleResult, String> {
    let data = gateway.root.join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    for i in 0..FILES {
        std::fs::write(data.join(format!("f{i}.txt")), vec![b'x'; 4096])
            .map_err(|e| e.to_string())?;
    }
    let mut counts = args.scale_sessions.clone();
    counts.sort_unstable();
    counts.dedup();
    let largest = counts
        .last()
        .copied()
        .filter(|n| *n > 0)
        .ok_or("--scale-sessions needs a session count above 0")?;
    crate::settle().await;
    let rss_before_kib = measure::rss_kib(gateway.pid());

    let mut sessions: Vec<Arc<Client>> = Vec::with_capacity(largest);
    let mut loads = Vec::new();
    let mut headline = None;
    let (mut errors, mut first_errors) = (0, Vec::new());
    let mut keep = |outcome: &mut Outcome| {
        errors += outcome.recorder.errors;
        first_errors.append(&mut outcome.recorder.first_errors);
        first_errors.truncate(5);
    };
    for &count in &counts {
        eprintln!("scale: connecting {count} sessions");
        let more = gateway.sessions(count - sessions.len()).await?;
        sessions.extend(more.into_iter().map(Arc::new));
        let log_entries = gateway.audit_commits().await?.entries as u64;
        let mut outcome = load(args, gateway, &sessions).await?;
        if count == largest {
            headline = Some(per_window(args, &mut outcome));
        }
        loads.push(summary(
            gateway,
            &sessions,
            log_entries,
            None,
            &mut outcome,
        )?);
        keep(&mut outcome);
    }
    let rss_connected_kib = measure::rss_kib(gateway.pid());
    for &target in args.scale_log_entries.iter().flatten() {
        let (log_entries, rate) = fill(gateway, &sessions, target).await?;
        let mut outcome = load(args, gateway, &sessions).await?;
        loads.push(summary(
            gateway,
            &sessions,
            log_entries,
            rate,
            &mut outcome,
        )?);
        keep(&mut outcome);
    }
    drop(sessions);

    let (windows, by_kind) = headline.ok_or("no load ran")?;
    Ok(ScaleResult {
        seconds: args.scale_seconds,
        pause_ms: args.scale_pause_ms,
        mix: MIX,
        loads,
        sessions: largest,
        windows,
        by_kind,
        errors,
        first_errors,
        rss_before_kib,
        rss_connected_kib,
    })
}

/// The load's latency, RSS and CPU per window, and its latency by kind.
fn per_window(args: &Args, outcome: &mut Outcome) -> (Vec<Window>, Vec<ByKind>) {
    let windows = outcome
        .recorder
        .windows
        .iter_mut()
        .enumerate()
        .map(|(i, latencies)| Window {
            from: i as u64 * WINDOW.as_secs(),
            to: ((i as u64 + 1) * WINDOW.as_secs()).min(args.scale_seconds),
            requests: latencies.len(),
            p50: latencies.quantile_ms(0.5),
            p99: latencies.quantile_ms(0.99),
            rss_kib: outcome.rss.get(i).copied().unwrap_or(outcome.rss_end_kib),
            cpu: outcome.cpu.get(i).copied().unwrap_or(0.0),
        })
        .collect();
    let names = ["file.read", "file.stat", "shell.exec"];
    let by_kind = outcome
        .recorder
        .by_kind
        .iter_mut()
        .zip(names)
        .map(|(l, name)| (name, l.len(), l.quantile_ms(0.5), l.quantile_ms(0.99)))
        .collect();
    (windows, by_kind)
}

/// Its summary line: everything the load saw (its windows taken).
fn summary(
    gateway: &Gateway,
    sessions: &[Arc<Client>],
    log_entries: u64,
    filled_at: Option<f64>,
    outcome: &mut Outcome,
) -> Result<Load, String> {
    let mut all = Latencies::default();
    for window in outcome.recorder.windows.drain(..) {
        all.extend(window);
    }
    let disk_bytes = measure::disk_usage(&gateway.dir.join("state"))
        .map_err(|e| format!("the gateway's state directory: {e}"))?;
    let load = Load {
        sessions: sessions.len(),
        log_entries,
        filled_at,
        requests: all.len(),
        errors: outcome.recorder.errors,
        p50: all.quantile_ms(0.5),
        p99: all.quantile_ms(0.99),
        rss_kib: outcome.rss_end_kib,
        disk_bytes,
        cpu: outcome.cpu.iter().sum::<f64>() / outcome.cpu.len().max(1) as f64,
    };
    eprintln!(
        "scale: {} sessions on {} entries: {} requests, {} failed, p50 {:.2} ms, p99 {:.2} ms, RSS {:.0} MiB, disk {:.0} MiB",
        load.sessions,
        load.log_entries,
        load.requests,
        load.errors,
        load.p50,
        load.p99,
        load.rss_kib as f64 / 1024.0,
        load.disk_bytes as f64 / 1048576.0
    );
    Ok(load)
}

/// Every session sends the mix for the test's time; the gateway's RSS and
/// CPU are read once a window.
async fn load(args: &Args, gateway: &Gateway, sessions: &[Arc<Client>]) -> Result<Outcome, String> {
    let pid = gateway.pid();
    eprintln!(
        "scale: {} sessions for {} s",
        sessions.len(),
        args.scale_seconds
    );
    let recorder = Arc::new(Mutex::new(Recorder::default()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.scale_seconds);
    let pause = Duration::from_millis(args.scale_pause_ms);
    let mut tasks = JoinSet::new();
    for (i, client) in sessions.iter().enumerate() {
        let (client, recorder) = (client.clone(), recorder.clone());
        tasks.spawn(async move {
            let mut n = i;
            // Spread the sessions' starts over one pause.
            tokio::time::sleep(pause.mul_f64((i % 97) as f64 / 97.0)).await;
            while Instant::now() < deadline {
                let kind = Kind::of(n);
                let at = Instant::now();
                let outcome = one_request(&client, kind, n).await.map(|()| at.elapsed());
                let window = (at - started).as_secs() as usize / WINDOW.as_secs() as usize;
                recorder
                    .lock()
                    .map_err(|_| "the recorder")?
                    .record(window, kind, outcome);
                n += 1;
                // 0.5–1.5 pauses, so the sessions do not march in step.
                let jitter = 0.5 + ((n * 7919 + i * 104_729) % 1000) as f64 / 1000.0;
                tokio::time::sleep(pause.mul_f64(jitter)).await;
            }
            Ok::<(), &'static str>(())
        });
    }
    let (mut rss, mut cpu) = (Vec::new(), Vec::new());
    let mut last = (Instant::now(), measure::cpu_seconds(pid, false));
    while Instant::now() < deadline {
        tokio::time::sleep(WINDOW.min(deadline - Instant::now())).await;
        rss.push(measure::rss_kib(pid));
        let now = (Instant::now(), measure::cpu_seconds(pid, false));
        cpu.push((now.1 - last.1) / (now.0 - last.0).as_secs_f64());
        last = now;
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    let rss_end_kib = measure::rss_kib(pid);
    let recorder = Arc::try_unwrap(recorder)
        .map_err(|_| "the recorder is still shared")?
        .into_inner()
        .map_err(|_| "the recorder")?;
    Ok(Outcome {
        recorder,
        rss,
        cpu,
        rss_end_kib,
    })
}

/// Fills the audit log to `target` entries with `file.stat`s, the first
/// sixteen sessions carrying [`FILL_IN_FLIGHT`] of them at a time.
/// Returns the log's length (the gateway's count) and the entries per
/// second written, or `None` when the log was that long already.
async fn fill(
    gateway: &Gateway,
    sessions: &[Arc<Client>],
    target: u64,
) -> Result<(u64, Option<f64>), String> {
    let before = gateway.audit_commits().await?.entries as u64;
    let Some(missing) = target.checked_sub(before).filter(|m| *m > 0) else {
        return Ok((before, None));
    };
    eprintln!("scale: filling the audit log from {before} to {target} entries");
    let remaining = Arc::new(AtomicU64::new(missing));
    let started = Instant::now();
    let carriers = &sessions[..sessions.len().min(16)];
    let mut tasks = JoinSet::new();
    for i in 0..FILL_IN_FLIGHT {
        let (client, remaining) = (carriers[i % carriers.len()].clone(), remaining.clone());
        tasks.spawn(async move {
            let params = json!({"root_id": "work", "path": format!("data/f{}.txt", i % FILES)});
            // Each `file.stat` is one entry.
            while remaining
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                client
                    .request("file.stat", params.clone())
                    .await
                    .map_err(|e| format!("file.stat while filling the log: {e}"))?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| e.to_string())??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = gateway.audit_commits().await?.entries as u64;
    Ok((after, Some(after.saturating_sub(before) as f64 / seconds)))
}

async fn one_request(client: &Client, kind: Kind, n: usize) -> Result<(), String> {
    let file = json!({"root_id": "work", "path": format!("data/f{}.txt", n % FILES)});
    let (method, params) = match kind {
        Kind::Read => ("file.read", file),
        Kind::Stat => ("file.stat", file),
        Kind::Exec => ("shell.exec", json!({"command": ["/bin/true"]})),
    };
    let result = client
        .request(method, params)
        .await
        .map_err(|e| format!("{method}: {e}"))?;
    let fine = match kind {
        Kind::Exec => result["exit_code"] == 0,
        Kind::Read | Kind::Stat => result != Value::Null,
    };
    match fine {
        true => Ok(()),
        false => Err(format!("{method}: unexpected answer {result}")),
    }
}

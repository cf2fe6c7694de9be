//! The scale test: many sessions at once, each reading small files,
//! stating them and running `/bin/true`, one request after another with a
//! pause, for a fixed time. Every failure is counted (the run fails when
//! any request did); latency and the gateway's RSS are reported per
//! five-second window.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portcullis_client::Client;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::Args;
use crate::gateway::Gateway;
use crate::measure::{self, Latencies};

const WINDOW: Duration = Duration::from_secs(5);
const FILES: usize = 16;
/// Of every 20 requests: 1 exec, 6 stats, 13 reads.
const MIX: &str =
    "of every 20 requests 13 `file.read` of a 4 KiB file, 6 `file.stat`, 1 `shell.exec /bin/true`";

#[derive(Clone, Copy)]
enum Kind {
    Read,
    Stat,
    Exec,
}

impl Kind {
    fn of(n: usize) -> Self {
        match n % 20 {
            0 => Self::Exec,
            1..=6 => Self::Stat,
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

pub struct ScaleResult {
    pub sessions: usize,
    pub seconds: u64,
    pub pause_ms: u64,
    pub mix: &'static str,
    pub requests: usize,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub windows: Vec<Window>,
    pub by_kind: Vec<(&'static str, usize, f64, f64)>,
    pub rss_before_kib: u64,
    pub rss_connected_kib: u64,
    pub rss_end_kib: u64,
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

pub async fn run(args: &Args, gateway: &Gateway) -> Result<ScaleResult, String> {
    let data = gateway.root.join("data");
    std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
    for i in 0..FILES {
        std::fs::write(data.join(format!("f{i}.txt")), vec![b'x'; 4096])
            .map_err(|e| e.to_string())?;
    }
    let pid = gateway.pid();
    crate::settle().await;
    let rss_before_kib = measure::rss_kib(pid);
    eprintln!("scale: connecting {} sessions", args.scale_sessions);
    let sessions: Vec<Arc<Client>> = gateway
        .sessions(args.scale_sessions)
        .await?
        .into_iter()
        .map(Arc::new)
        .collect();
    let rss_connected_kib = measure::rss_kib(pid);
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
    drop(sessions);

    let mut recorder = Arc::try_unwrap(recorder)
        .map_err(|_| "the recorder is still shared")?
        .into_inner()
        .map_err(|_| "the recorder")?;
    let windows = recorder
        .windows
        .iter_mut()
        .enumerate()
        .map(|(i, latencies)| Window {
            from: i as u64 * WINDOW.as_secs(),
            to: ((i as u64 + 1) * WINDOW.as_secs()).min(args.scale_seconds),
            requests: latencies.len(),
            p50: latencies.quantile_ms(0.5),
            p99: latencies.quantile_ms(0.99),
            rss_kib: rss.get(i).copied().unwrap_or(rss_end_kib),
            cpu: cpu.get(i).copied().unwrap_or(0.0),
        })
        .collect::<Vec<_>>();
    let names = ["file.read", "file.stat", "shell.exec"];
    let by_kind = recorder
        .by_kind
        .iter_mut()
        .zip(names)
        .map(|(l, name)| (name, l.len(), l.quantile_ms(0.5), l.quantile_ms(0.99)))
        .collect();
    Ok(ScaleResult {
        sessions: args.scale_sessions,
        seconds: args.scale_seconds,
        pause_ms: args.scale_pause_ms,
        mix: MIX,
        requests: windows.iter().map(|w| w.requests).sum(),
        errors: recorder.errors,
        first_errors: recorder.first_errors,
        windows,
        by_kind,
        rss_before_kib,
        rss_connected_kib,
        rss_end_kib,
    })
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

//! `portcullis-bench`: portcullis side by side with OpenSSH on this
//! machine, in one run, and the scale test. See `bench/README.md`; run it
//! with `bash bench/run.sh`, which builds what it needs first.
//!
//! Everything listens on 127.0.0.1 and is stopped by PID when the run ends.
//! Figures are reported, never asserted: the exit status is non-zero only
//! when something failed (a request, a transfer whose copy differs, the
//! scale test's error count).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

mod gateway;
mod jsonrpc;
mod mcp;
mod measure;
mod report;
mod rows;
mod scale;
mod sftp;
mod sshd;

#[derive(Parser)]
#[command(
    version,
    about = "portcullis beside OpenSSH on this machine, and at scale"
)]
pub struct Args {
    /// Rounds per comparison (each alternates portcullis and OpenSSH).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Size of the bulk-transfer file in MiB.
    #[arg(long, default_value_t = 1024)]
    bulk_mib: u64,
    /// Round trips per round for the latency rows.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Idle-session counts compared with sshd.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    sessions: Vec<usize>,
    /// Idle sessions for the gateway alone.
    #[arg(long, default_value_t = 10_000)]
    gateway_sessions: usize,
    /// Seconds per concurrency level for requests per second.
    #[arg(long, default_value_t = 3.0)]
    request_seconds: f64,
    /// Session counts in the scale test, each loaded in turn (the largest
    /// also on the longer logs of --scale-log-entries).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    scale_sessions: Vec<usize>,
    /// How long each of the scale test's loads runs, in seconds.
    #[arg(long, default_value_t = 60)]
    scale_seconds: u64,
    /// Each scale-test session's pause between requests, in ms (0.5–1.5
    /// times this, so the sessions do not march in step).
    #[arg(long, default_value_t = 4000)]
    scale_pause_ms: u64,
    /// Audit-log lengths the scale test fills the log to (with `file.stat`)
    /// before loading the largest session count again; `none`: no such loads.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000", value_parser = log_length)]
    scale_log_entries: Vec<Option<u64>>,
    /// Small sizes everywhere: checks that the harness works (CI), not a
    /// measurement.
    #[arg(long)]
    quick: bool,
    /// Only these parts (default: all of them).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Part>,
    /// Install openssh-server with apt-get if it is missing.
    #[arg(long)]
    install_ssh: bool,
    /// Where the results go (Markdown).
    #[arg(long, default_value = "bench/RESULTS.md")]
    out: PathBuf,
    /// Where the chart goes (SVG; written when requests were measured).
    #[arg(long, default_value = "bench/chart.svg")]
    chart: PathBuf,
    /// The Python interpreter that has the `portcullis` package, for the
    /// `python` part (python/test.sh installs it in target/python-venv).
    #[arg(long, default_value = "target/python-venv/bin/python")]
    python: PathBuf,
    /// Working directory for files, keys and state (deleted at the end).
    #[arg(long, default_value = "/var/tmp")]
    work_dir: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Sessions,
    Exec,
    Connect,
    Requests,
    Writes,
    Bulk,
    Scale,
    /// Dial-out beside dial-in on one gateway.
    Dial,
    /// The Python package beside the Rust client on one gateway.
    Python,
    /// ya-environment-protocol.v1 over stdio and a Unix socket beside
    /// relay.v1 dialed in.
    Envproto,
    /// `portcullis mcp` (MCP over stdio) beside relay.v1 dialed in.
    Mcp,
    /// A command printing a GiB: its output as binary chunks and as
    /// `stream` frames.
    Output,
}

impl Args {
    fn wants(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }

    fn shrink_for_quick(&mut self) {
        if self.quick {
            self.rounds = 1;
            self.bulk_mib = 16;
            self.samples = 20;
            self.sessions = vec![20];
            self.gateway_sessions = 50;
            self.request_seconds = 0.5;
            self.scale_sessions = vec![20, 50];
            self.scale_seconds = 5;
            self.scale_pause_ms = 250;
            self.scale_log_entries = vec![Some(5_000)];
        }
    }
}

fn main() -> std::process::ExitCode {
    let mut args = Args::parse();
    args.shrink_for_quick();
    raise_open_file_limit();
    let work = args
        .work_dir
        .join(format!("portcullis-bench.{}", std::process::id()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let result = match runtime {
        // On ^C or SIGTERM the run is dropped, which stops the gateway and
        // sshd it started, and the work directory is removed below.
        Ok(runtime) => runtime.block_on(async {
            tokio::select! {
                result = run(&args, &work) => result,
                signal = interrupted() => Err(format!("stopped by {signal}")),
            }
        }),
        Err(e) => Err(format!("the async runtime: {e}")),
    };
    let _ = std::fs::remove_dir_all(&work);
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portcullis-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The first SIGINT or SIGTERM.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

async fn run(args: &Args, work: &std::path::Path) -> Result<(), String> {
    if args.install_ssh {
        sshd::install()?;
    }
    if args.wants(Part::Python) {
        // Said before the long parts run, not after them.
        rows::python_ready(args)?;
    }
    let gateway = gateway::Gateway::start(&work.join("gateway"))?;
    eprintln!("gateway on {} (pid {})", gateway.url, gateway.pid());
    let mut results = report::Results::new(args);
    let side_by_side = [
        Part::Sessions,
        Part::Exec,
        Part::Connect,
        Part::Requests,
        Part::Writes,
        Part::Bulk,
    ];
    if side_by_side.into_iter().any(|part| args.wants(part)) {
        if !std::path::Path::new(sshd::SSHD).exists() {
            return Err(format!(
                "{} is missing: pass --install-ssh (or apt-get install -y openssh-server)",
                sshd::SSHD
            ));
        }
        let mut sshd = sshd::Sshd::start(&work.join("ssh"))?;
        eprintln!("sshd on 127.0.0.1 (pid {})", sshd.pid());
        results.openssh = format!("{}, cipher {}", sshd::version(), sshd.cipher());
        if args.wants(Part::Sessions) {
            rows::sessions(args, &gateway, &sshd, &mut results).await?;
        }
        if args.wants(Part::Exec) {
            rows::exec(args, &gateway, &mut sshd, &mut results).await?;
        }
        if args.wants(Part::Connect) {
            rows::connect(args, &gateway, &sshd, &mut results).await?;
        }
        if args.wants(Part::Requests) {
            rows::requests(args, &gateway, &sshd, rows::Small::Stat, &mut results).await?;
        }
        if args.wants(Part::Writes) {
            rows::requests(args, &gateway, &sshd, rows::Small::Write, &mut results).await?;
        }
        if args.wants(Part::Bulk) {
            rows::bulk(args, &gateway, &sshd, work, &mut results).await?;
        }
    }
    if args.wants(Part::Python) {
        rows::python(args, &gateway, work, &mut results).await?;
    }
    if args.wants(Part::Mcp) {
        rows::mcp(args, &gateway, work, &mut results).await?;
    }
    if args.wants(Part::Output) {
        rows::output(args, &gateway, &mut results).await?;
    }
    rows::audit_size(gateway, &mut results).await?;
    if args.wants(Part::Dial) {
        rows::dial(args, work, &mut results).await?;
    }
    if args.wants(Part::Envproto) {
        rows::envproto(args, work, &mut results).await?;
    }
    if args.wants(Part::Scale) {
        // The scale test runs on a gateway of its own, started fresh.
        let scale_gateway = gateway::Gateway::start(&work.join("scale"))?;
        results.scale = Some(scale::run(args, &scale_gateway).await?);
    }
    results.write(&args.out, &args.chart)?;
    match results.concurrency.is_empty() {
        true => eprintln!(
            "wrote {} (no chart: the requests part did not run)",
            args.out.display()
        ),
        false => eprintln!("wrote {} and {}", args.out.display(), args.chart.display()),
    }
    match results.scale.as_ref().map_or(0, |s| s.errors) {
        0 => Ok(()),
        n => Err(format!("the scale test saw {n} failed requests")),
    }
}

/// 10,000 sessions need 10,000 sockets here and in the gateway (which
/// inherits the limit).
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    if let Err(e) = setrlimit(Resource::Nofile, limit) {
        eprintln!("portcullis-bench: cannot raise the open-file limit: {e}");
    }
}

/// Sleeps a little: lets a process settle before its memory is read.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(1000)).await;
}

/// A `--scale-log-entries` value: a number of entries, or `none`.
fn log_length(value: &str) -> Result<Option<u64>, String> {
    match value {
        "none" => Ok(None),
        number => number
            .parse()
            .map(Some)
            .map_err(|e| format!("{number}: {e} (a number of entries, or `none`)")),
    }
}

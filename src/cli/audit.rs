//! `portcullis audit list|show|verify`. While the daemon runs, sled belongs
//! to it, so the CLI asks through the admin socket; when it is stopped the
//! CLI opens the store itself. The output is the same either way.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hyper::Method;
use portcullis::config::Config;
use portcullis::server::admin;
use portcullis_store::{Checkpoint, Entry, Filter, Store, VerifyReport};
use serde_json::{Value, json};

use crate::cli::{fail, runtime};

#[derive(clap::Args)]
pub struct Source {
    /// The daemon's configuration (for its admin socket and state directory).
    #[arg(long, global = true, default_value = "/etc/portcullis/portcullis.toml")]
    pub config: PathBuf,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Only entries since: a duration back from now (`1h`, `30m`) or a time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// Only entries until (same forms as --since).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long)]
    pub principal: Option<String>,
    /// Method glob, e.g. `file.*`.
    #[arg(long)]
    pub method: Option<String>,
    /// allowed, approved or blocked.
    #[arg(long)]
    pub decision: Option<String>,
    /// succeeded, failed, cancelled, interrupted (the gateway stopped
    /// after the request's start entry and before its answer) or lost (it
    /// named a process of an earlier run of the gateway).
    #[arg(long)]
    pub status: Option<String>,
    /// Only the requests of this run (`context.run_id`).
    #[arg(long)]
    pub run: Option<String>,
    /// Only the requests of this agent session (`context.session_id`).
    #[arg(long)]
    pub session: Option<String>,
    /// Only the requests of this tool call (`context.tool_call_id`).
    #[arg(long)]
    pub tool_call: Option<String>,
    /// Only this relay connection: its `connection_id` (the runtime's, from
    /// `relay.accepted`) or the gateway's session number.
    #[arg(long)]
    pub connection: Option<String>,
    /// Only what came this way: websocket (dialed in), websocket-out,
    /// websocket-out-plain (dialed out), stdio or unix.
    #[arg(long)]
    pub transport: Option<String>,
    /// Only what spoke this protocol: relay.v1 or
    /// ya-environment-protocol.v1.
    #[arg(long)]
    pub profile: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Where the entries come from.
enum Backend {
    Daemon(PathBuf),
    Offline(Box<portcullis_store::AuditLog>, Store),
}

fn backend(source: &Source, rt: &tokio::runtime::Runtime) -> Result<Backend, String> {
    let config = Config::load(&source.config).map_err(|e| e.to_string())?;
    if rt
        .block_on(admin::request(
            &config.admin_socket,
            Method::GET,
            "/v1/status",
        ))
        .is_ok()
    {
        return Ok(Backend::Daemon(config.admin_socket));
    }
    let store = Store::open(&config.state_dir.join("store")).map_err(|e| e.to_string())?;
    let log = store.audit(None).map_err(|e| e.to_string())?;
    Ok(Backend::Offline(Box::new(log), store))
}

fn daemon(
    rt: &tokio::runtime::Runtime,
    socket: &std::path::Path,
    path: &str,
) -> Result<Value, String> {
    let (status, body) = rt
        .block_on(admin::request(socket, Method::GET, path))
        .map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(body["error"]
            .as_str()
            .unwrap_or("the daemon refused")
            .to_string())
    }
}

/// A snake_case enum value from a flag (`--decision blocked`).
fn named<T: serde::de::DeserializeOwned>(
    flag: &str,
    value: &Option<String>,
) -> Result<Option<T>, String> {
    value
        .as_ref()
        .map(|v| {
            serde_json::from_value(Value::String(v.clone()))
                .map_err(|_| format!("--{flag}: unknown value `{v}`"))
        })
        .transpose()
}

fn time_arg(flag: &str, value: &str) -> Result<jiff::Timestamp, String> {
    if let Ok(time) = value.parse::<jiff::Timestamp>() {
        return Ok(time);
    }
    let back = portcullis_policy::units::parse_duration(value).map_err(|_| {
        format!("--{flag} `{value}`: expected a duration back from now (`1h`) or a time (2026-11-21T10:00:00Z)")
    })?;
    let span = jiff::SignedDuration::try_from(back).map_err(|e| e.to_string())?;
    jiff::Timestamp::now()
        .checked_sub(span)
        .map_err(|e| e.to_string())
}

pub fn list(source: Source, args: ListArgs) -> ExitCode {
    let result = runtime().and_then(|rt| {
        let since = args
            .since
            .as_deref()
            .map(|v| time_arg("since", v))
            .transpose()?;
        let until = args
            .until
            .as_deref()
            .map(|v| time_arg("until", v))
            .transpose()?;
        let filter = Filter {
            since,
            until,
            principal: args.principal.clone(),
            method: args.method.clone(),
            decision: named("decision", &args.decision)?,
            status: named("status", &args.status)?,
            run: args.run.clone(),
            session: args.session.clone(),
            tool_call: args.tool_call.clone(),
            connection: args.connection.clone(),
            transport: args.transport.clone(),
            profile: args.profile.clone(),
            limit: args.limit,
        };
        match backend(&source, &rt)? {
            Backend::Offline(log, _store) => log.list(&filter).map_err(|e| e.to_string()),
            Backend::Daemon(socket) => {
                let mut query = vec![format!("limit={}", filter.limit)];
                let mut add = |k: &str, v: Option<String>| {
                    if let Some(v) = v {
                        query.push(format!("{k}={}", admin::percent_encode(&v)));
                    }
                };
                add("since", filter.since.map(|t| t.to_string()));
                add("until", filter.until.map(|t| t.to_string()));
                add("principal", filter.principal.clone());
                add("method", filter.method.clone());
                add("decision", args.decision.clone());
                add("status", args.status.clone());
                add("run", filter.run.clone());
                add("session", filter.session.clone());
                add("tool_call", filter.tool_call.clone());
                add("connection", filter.connection.clone());
                add("transport", filter.transport.clone());
                add("profile", filter.profile.clone());
                let body = daemon(&rt, &socket, &format!("/v1/audit?{}", query.join("&")))?;
                serde_json::from_value(body["entries"].clone()).map_err(|e| e.to_string())
            }
        }
    });
    match result {
        Ok(entries) => {
            print_entries(&entries, source.json);
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn print_entries(entries: &[Entry], json: bool) {
    if !json {
        println!(
            "{:>7}  {:<24} {:<14} {:<16} {:<9} {:<11} {:<22} ERROR",
            "SEQ", "TIME", "PRINCIPAL", "METHOD/EVENT", "DECISION", "STATUS", "VIA"
        );
    }
    print_rows(entries, json);
}

fn print_rows(entries: &[Entry], json: bool) {
    if json {
        for entry in entries {
            println!("{}", serde_json::to_string(entry).unwrap_or_default());
        }
        return;
    }
    for e in entries {
        let r = &e.record;
        let name = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let word = |v: Value| v.as_str().map(str::to_string).unwrap_or_else(|| "-".into());
        // `unix 0.92`, `websocket relay`: the transport, then the profile.
        let via = match (&r.transport, r.profile.as_deref()) {
            (Some(t), Some("ya-environment-protocol.v1")) => format!("{t} 0.92"),
            (Some(t), Some(_)) => format!("{t} relay"),
            (Some(t), None) => t.to_string(),
            (None, _) => "-".into(),
        };
        println!(
            "{:>7}  {:<24} {:<14} {:<16} {:<9} {:<11} {:<22} {}",
            e.seq,
            r.started_at.chars().take(24).collect::<String>(),
            r.principal.as_deref().unwrap_or("-"),
            r.method
                .clone()
                .or(r.event.clone())
                .unwrap_or_else(|| "-".into()),
            word(json!(r.decision)),
            word(json!(r.status)),
            via,
            name(&r.error_code)
                + if r.warning.is_some() {
                    " (warning)"
                } else {
                    ""
                }
                + &r.destination
                    .as_ref()
                    .map_or(String::new(), |d| format!("  to {d}"))
        );
    }
}

pub fn show(source: Source, seq: u64) -> ExitCode {
    let result = runtime().and_then(|rt| match backend(&source, &rt)? {
        Backend::Offline(log, _store) => log
            .get(seq)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no audit entry {seq}")),
        Backend::Daemon(socket) => {
            serde_json::from_value(daemon(&rt, &socket, &format!("/v1/audit/{seq}"))?)
                .map_err(|e| e.to_string())
        }
    });
    match result {
        Ok(entry) => {
            let text = if source.json {
                serde_json::to_string(&entry)
            } else {
                serde_json::to_string_pretty(&entry)
            };
            println!("{}", text.unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Verify an export (`audit export`) instead of the store.
    #[arg(long, value_name = "EXPORT")]
    pub file: Option<PathBuf>,
    /// The audit public key (base64, from `portcullis audit key`) to check
    /// checkpoint signatures with [default: the one in the state directory].
    #[arg(long)]
    pub key: Option<String>,
    /// A checkpoint kept off the host (`portcullis audit checkpoint`): the
    /// log must still reach its entry and hold it unchanged, so deleting
    /// or rewriting anything it covers fails, even re-signed.
    #[arg(long, value_name = "NOTE")]
    pub checkpoint: Option<PathBuf>,
}

/// The checkpoint note in `path`, its signature checked with `key`.
fn kept_checkpoint(path: &Path, key: Option<&[u8]>) -> Result<Checkpoint, String> {
    let key = key.ok_or(
        "--checkpoint needs the audit key (--key, or STATE_DIR/audit.key) to check its signature",
    )?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Checkpoint::from_note(&text, key).map_err(|e| format!("{}: {e}", path.display()))
}

/// The key to check signatures with: `--key`, else the state directory's.
fn verifying_key(source: &Source, given: &Option<String>) -> Result<Option<Vec<u8>>, String> {
    if let Some(key) = given {
        return portcullis_store::decode_public_key(key)
            .map(Some)
            .map_err(|e| e.to_string());
    }
    let config = Config::load(&source.config).map_err(|e| e.to_string())?;
    let signer = portcullis_store::AuditSigner::load(&config.state_dir.join("audit.key"))
        .map_err(|e| e.to_string())?;
    Ok(signer.map(|s| s.public_key().to_vec()))
}

/// Exit 0 when the whole chain holds, 2 when it is broken, 1 on error.
pub fn verify(source: Source, args: VerifyArgs) -> ExitCode {
    let result: Result<VerifyReport, String> = runtime().and_then(|rt| {
        if let Some(file) = &args.file {
            let key = args
                .key
                .as_deref()
                .ok_or("--file needs --key (the audit public key; `portcullis audit key`)")?;
            let key = portcullis_store::decode_public_key(key).map_err(|e| e.to_string())?;
            let kept = match &args.checkpoint {
                Some(path) => Some(kept_checkpoint(path, Some(&key))?),
                None => None,
            };
            let reader = std::io::BufReader::new(
                std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?,
            );
            return portcullis_store::verify_export_against(reader, &key, kept.as_ref())
                .map_err(|e| e.to_string());
        }
        let key = verifying_key(&source, &args.key)?;
        let kept = match &args.checkpoint {
            Some(path) => Some(kept_checkpoint(path, key.as_deref())?),
            None => None,
        };
        match backend(&source, &rt)? {
            Backend::Offline(log, _store) => log
                .verify_against(key.as_deref(), kept.as_ref())
                .map_err(|e| e.to_string()),
            Backend::Daemon(socket) => {
                let path = match &kept {
                    Some(kept) => format!("/v1/audit/verify?kept={}:{}", kept.seq, kept.head),
                    None => "/v1/audit/verify".to_string(),
                };
                serde_json::from_value(daemon(&rt, &socket, &path)?).map_err(|e| e.to_string())
            }
        }
    });
    match result {
        Ok(report) => {
            if source.json {
                println!("{}", json!(report));
            } else if let Some(error) = &report.error {
                println!("BROKEN after {} good entries: {error}", report.entries);
            } else {
                println!(
                    "ok: {} entries, chain intact up to entry {} (head {}); {} signed checkpoint(s), signed through entry {}",
                    report.entries,
                    report.last_seq,
                    report.head,
                    report.checkpoints,
                    report.signed_through
                );
                if report.interrupted > 0 {
                    println!(
                        "note: {} request(s) were interrupted by a stop of the gateway (`audit list --status interrupted`)",
                        report.interrupted
                    );
                }
                if let Some(seq) = report.kept_through {
                    println!(
                        "ok: the log still extends the checkpoint kept off the host (entry {seq})"
                    );
                }
            }
            if report.error.is_none() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(crate::cli::EXIT_NO)
            }
        }
        Err(e) => fail(e),
    }
}

/// Writes the log as JSON Lines (entries and signed checkpoints), from the
/// running daemon or, when it is stopped, straight from the store.
pub fn export(source: Source, output: Option<PathBuf>) -> ExitCode {
    let result = (|| {
        let rt = runtime()?;
        let mut out: Box<dyn std::io::Write> = match &output {
            Some(path) => Box::new(std::io::BufWriter::new(
                std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
            )),
            None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
        };
        match backend(&source, &rt)? {
            Backend::Daemon(socket) => rt
                .block_on(admin::download(&socket, "/v1/audit/export", &mut out))
                .map_err(|e| e.to_string())?,
            Backend::Offline(log, _store) => {
                // The header names the key, as the daemon's export does.
                let key = verifying_key(&source, &None)?;
                log.export_naming(&mut out, key.as_deref())
                    .map_err(|e| e.to_string())?;
            }
        }
        out.flush().map_err(|e| e.to_string())
    })();
    match result {
        Ok(()) => {
            if let Some(path) = output {
                eprintln!("exported the audit log to {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The last `lines` entries, oldest first; with `follow`, then every new
/// entry as it is written (polling), until interrupted.
pub fn tail(source: Source, lines: usize, follow: bool) -> ExitCode {
    let result = runtime().and_then(|rt| {
        let backend = backend(&source, &rt)?;
        let fetch = |after: u64| -> Result<Vec<Entry>, String> {
            match &backend {
                Backend::Offline(log, _) => log.after(after, 1000).map_err(|e| e.to_string()),
                Backend::Daemon(socket) => {
                    let body = daemon(&rt, socket, &format!("/v1/audit/after/{after}"))?;
                    serde_json::from_value(body["entries"].clone()).map_err(|e| e.to_string())
                }
            }
        };
        let mut last: Vec<Entry> = match &backend {
            Backend::Offline(log, _) => log
                .list(&Filter {
                    limit: lines,
                    ..Filter::default()
                })
                .map_err(|e| e.to_string())?,
            Backend::Daemon(socket) => {
                let body = daemon(&rt, socket, &format!("/v1/audit?limit={lines}"))?;
                serde_json::from_value(body["entries"].clone()).map_err(|e| e.to_string())?
            }
        };
        last.reverse();
        print_entries(&last, source.json);
        if !follow {
            return Ok(());
        }
        let mut seen = last.last().map_or(0, |e| e.seq);
        loop {
            std::thread::sleep(std::time::Duration::from_millis(500));
            let new = fetch(seen)?;
            if let Some(entry) = new.last() {
                seen = entry.seq;
                print_rows(&new, source.json);
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// Removes entries started before `before` (a duration back from now, or a
/// time), leaving a signed marker so the rest still verifies.
pub fn prune(source: Source, before: String) -> ExitCode {
    let result = runtime().and_then(|rt| {
        let before = time_arg("before", &before)?;
        match backend(&source, &rt)? {
            Backend::Daemon(socket) => {
                let path = format!(
                    "/v1/audit/prune?before={}",
                    admin::percent_encode(&before.to_string())
                );
                let (status, body) = rt
                    .block_on(admin::request(&socket, Method::POST, &path))
                    .map_err(|e| e.to_string())?;
                if !status.is_success() {
                    return Err(body["error"]
                        .as_str()
                        .unwrap_or("the daemon refused")
                        .to_string());
                }
                Ok(body["removed"].as_u64().unwrap_or(0))
            }
            Backend::Offline(reader, store) => {
                drop(reader);
                let config = Config::load(&source.config).map_err(|e| e.to_string())?;
                let signer = portcullis_store::AuditSigner::load(
                    &config.state_dir.join("audit.key"),
                )
                .map_err(|e| e.to_string())?
                .ok_or("no audit key: pruning must be signed by the key in the state directory")?;
                let log = store.audit(Some(signer)).map_err(|e| e.to_string())?;
                rt.block_on(log.prune(before)).map_err(|e| e.to_string())
            }
        }
    });
    match result {
        Ok(removed) => {
            println!("pruned {removed} entries");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// Prints the audit public key, for `audit verify --file … --key …`.
/// The newest signed checkpoint, as a signed note (`--json`: as stored).
pub fn checkpoint(source: Source) -> ExitCode {
    let result = runtime().and_then(|rt| match backend(&source, &rt)? {
        Backend::Offline(log, _store) => log
            .head_checkpoint()
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no checkpoint yet: the log is empty or has no audit key".to_string()),
        Backend::Daemon(socket) => {
            serde_json::from_value(daemon(&rt, &socket, "/v1/audit/checkpoint")?)
                .map_err(|e| e.to_string())
        }
    });
    let checkpoint: Checkpoint = match result {
        Ok(checkpoint) => checkpoint,
        Err(e) => return fail(e),
    };
    if source.json {
        println!("{}", json!(checkpoint));
        return ExitCode::SUCCESS;
    }
    match checkpoint.note() {
        Some(note) => {
            print!("{note}");
            ExitCode::SUCCESS
        }
        None => fail(format!(
            "the newest checkpoint (entry {}) predates signed notes; it is rewritten after the next request",
            checkpoint.seq
        )),
    }
}

pub fn key(source: Source) -> ExitCode {
    match verifying_key(&source, &None) {
        Ok(Some(key)) => {
            use base64::Engine as _;
            println!("{}", base64::engine::general_purpose::STANDARD.encode(key));
            ExitCode::SUCCESS
        }
        Ok(None) => {
            fail("no audit key yet: the daemon creates STATE_DIR/audit.key when it first starts")
        }
        Err(e) => fail(e),
    }
}

//! `portcullis serve`: run the gateway until SIGTERM. SIGHUP reloads the
//! policy. `--demo DIR` first creates a working local setup in DIR.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use portcullis::config::Config;
use portcullis::daemon::Daemon;
use portcullis::server::{self, Gateway};
use portcullis::systemd;
use portcullis_policy::load_file;
use portcullis_store::Retain;
use portcullis_wire::keyfile;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::cli::fail;

pub fn serve(config: &Path) -> ExitCode {
    serve_with(config, Only::Config)
}

/// `portcullis socket`: the daemon with one transport, the environment
/// socket at `path` (the config's `listen` and `[[relay]]` are not served).
pub fn socket(config: &Path, path: &Path) -> ExitCode {
    serve_with(config, Only::Socket(path))
}

/// `portcullis websocket --connect URL`: the daemon with one transport, a
/// runtime's endpoint it dials (the 0.92 spec's `websocket --connect`):
/// `relay` is that `[[relay]]` table's other keys, as TOML.
pub fn websocket(config: &Path, relay: &str) -> ExitCode {
    serve_with(config, Only::Relay(relay))
}

/// Which of the config's transports are served.
enum Only<'a> {
    /// All of them.
    Config,
    /// The environment socket at this path.
    Socket(&'a Path),
    /// This `[[relay]]` (its keys as TOML).
    Relay(&'a str),
}

fn serve_with(config: &Path, only: Only<'_>) -> ExitCode {
    init_logging();
    // Before any thread starts: this reads and clears LISTEN_FDS.
    let inherited = match systemd::inherited_listeners() {
        Ok(inherited) => inherited,
        Err(e) => return fail(format!("socket activation: {e}")),
    };
    let mut config = match Config::load(config) {
        Ok(config) => config,
        Err(e) => return fail(e),
    };
    match only {
        Only::Config => {}
        Only::Socket(path) => {
            config.environment_socket = Some(path.to_path_buf());
            config.listen.clear();
            config.relays.clear();
        }
        Only::Relay(keys) => {
            // Checked as the config's own [[relay]] tables are.
            let text = format!(
                "key_file = \"k\"\npolicy = \"p\"\nstate_dir = \"s\"\nadmin_socket = \"a\"\n\
                 [[relay]]\n{keys}"
            );
            match Config::parse(&text, Path::new("the command line")) {
                Ok(parsed) => config.relays = parsed.relays,
                Err(e) => return fail(e),
            }
            config.listen.clear();
            config.environment_socket = None;
        }
    }
    if inherited.is_empty()
        && let Some(why) = config.nothing_to_serve()
    {
        return fail(format!("config: {why}"));
    }
    let assembled = match assemble(config) {
        Ok(assembled) => assembled,
        Err(code) => return code,
    };
    let Assembled {
        runtime,
        gateway,
        daemon,
    } = assembled;
    runtime.block_on(run(Arc::new(gateway), daemon, inherited))
}

/// What every way of serving opens first: the key, the policy, the audit
/// log (recovered if the last stop was unclean), the providers.
pub(crate) struct Assembled {
    pub runtime: tokio::runtime::Runtime,
    pub gateway: Gateway,
    pub daemon: Daemon,
}

pub(crate) fn assemble(config: Config) -> Result<Assembled, ExitCode> {
    let key = match keyfile::load(&config.key_file) {
        Ok(key) => key,
        Err(e) => {
            return Err(fail(format!(
                "{e}\n(create one with `portcullis keys generate {}`)",
                config.key_file.display()
            )));
        }
    };
    let policy = load_file(&config.policy)
        .map_err(|errors| fail(format!("the policy does not load:\n{errors}")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(portcullis::files::BLOCKING_THREADS)
        .build()
        .map_err(|e| fail(format!("cannot start the async runtime: {e}")))?;
    let store_dir = config.state_dir.join("store");
    let store = portcullis_store::Store::open(&store_dir).map_err(fail)?;
    let signer = portcullis_store::AuditSigner::load_or_create(&config.state_dir.join("audit.key"))
        .map_err(fail)?;
    let audit = store.audit(Some(signer)).map_err(fail)?;
    let recovery = audit.recovery();
    if recovery.restored > 0 || recovery.discarded_bytes > 0 {
        warn!(
            restored = recovery.restored,
            discarded_bytes = recovery.discarded_bytes,
            "the audit log recovered from an unclean stop: acknowledged entries put back from its \
             journal, a half-written last write (never acknowledged) cut off"
        );
    }
    if recovery.interrupted > 0 {
        warn!(
            interrupted = recovery.interrupted,
            "requests were running when the gateway last stopped: each is completed in the audit \
             log with status `interrupted` (whether it took effect is unknown); \
             `portcullis audit list --status interrupted` lists them"
        );
    }
    let remembered = store.approvals().map_err(fail)?;
    let handles = store.handles().map_err(fail)?;
    let daemon = Daemon::assemble(&config, audit.clone(), handles);
    let (providers, instance_id) = (daemon.providers.clone(), daemon.instance_id.clone());
    let mut gateway = Gateway::new(config, key, policy, audit, providers, instance_id);
    gateway.approvals = portcullis::server::approvals::Approvals::new(Some(remembered));
    if let Some(files) = &gateway.config.tls {
        gateway.tls = Some(portcullis::tls::acceptor(&files.cert, &files.key).map_err(fail)?);
    }
    Ok(Assembled {
        runtime,
        gateway,
        daemon,
    })
}

async fn run(
    gateway: Arc<Gateway>,
    daemon: Daemon,
    inherited: Vec<std::net::TcpListener>,
) -> ExitCode {
    let listeners = match server::bind(&gateway, inherited).await {
        Ok(listeners) => listeners,
        Err(e) => return fail(e),
    };
    let admin = match server::admin::bind(&gateway.config.admin_socket) {
        Ok(admin) => admin,
        Err(e) => {
            return fail(format!(
                "cannot bind the admin socket {}: {e}",
                gateway.config.admin_socket.display()
            ));
        }
    };
    tokio::spawn(server::admin::serve(gateway.clone(), admin));
    let environment = match &gateway.config.environment_socket {
        Some(path) => match server::environment::bind(path) {
            Ok(listener) => Some((listener, path.clone())),
            Err(e) => {
                return fail(format!(
                    "cannot bind the environment socket {}: {e}",
                    path.display()
                ));
            }
        },
        None => None,
    };
    if let Some(addr) = gateway.config.metrics_listen {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                info!("metrics on http://{addr}/metrics");
                tokio::spawn(server::metrics::serve(gateway.clone(), listener));
            }
            Err(e) => return fail(format!("cannot listen for metrics on {addr}: {e}")),
        }
    }
    daemon.spawn_keepers(&gateway);
    tokio::spawn(report_audit_health(gateway.clone()));
    tokio::task::spawn_blocking(log_sandbox_support);
    if !gateway.config.audit.retains_everything() {
        tokio::spawn(retention(gateway.clone()));
    }
    let (Ok(mut hangup), Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return fail("cannot install signal handlers");
    };
    let key = gateway.key.public();
    info!(fingerprint = %key.fingerprint(), policy = %gateway.current_policy().generation, "gateway key {key}");
    let mut addresses = Vec::new();
    for listener in listeners {
        // One line per address on stdout, for scripts and tests.
        if let Ok(addr) = listener.local_addr() {
            say(&format!("listening on {addr}"));
            addresses.push(addr.to_string());
        }
        tokio::spawn(server::serve(gateway.clone(), listener));
    }
    if let Some((listener, path)) = environment {
        // After the TCP lines: scripts read the first line for the address.
        say(&format!("environment socket {}", path.display()));
        addresses.push(format!(
            "unix:{} (ya-environment-protocol.v1)",
            path.display()
        ));
        tokio::spawn(server::environment::serve(gateway.clone(), listener, path));
    }
    for (index, relay) in gateway.config.relays.iter().enumerate() {
        info!(url = %relay.url, "dialing out to a relay endpoint");
        addresses.push(relay.url.clone());
        tokio::spawn(server::dial::dial(gateway.clone(), index));
    }
    let serving = format!("serving on {}", addresses.join(", "));
    let generation = gateway.current_policy().generation.clone();
    systemd::ready(&format!("{serving}; policy {generation}"));
    tokio::spawn(systemd::watchdog());
    loop {
        tokio::select! {
            _ = hangup.recv() => match gateway.reload_policy() {
                Ok(generation) => {
                    info!(%generation, "policy reloaded");
                    systemd::status(&format!("{serving}; policy {generation}"));
                }
                Err(errors) => {
                    error!("policy reload failed; keeping the old policy:\n{errors}");
                    systemd::status(&format!("{serving}; policy reload FAILED, old policy kept (see the log)"));
                }
            },
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    info!(sessions = gateway.sessions.count(), "shutting down");
    systemd::stopping();
    shut_down(&gateway, daemon).await
}

/// A line on stdout for scripts and tests; nobody reading it (a closed
/// pipe) is not an error of the daemon's.
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Stops serving: sessions finish what is in flight (bounded by
/// `shutdown_grace`), started processes end, the log's tail is signed.
pub(crate) async fn shut_down(gateway: &Gateway, daemon: Daemon) -> ExitCode {
    gateway.shutdown.cancel();
    // Sessions finish what is in flight (bounded by shutdown_grace), then close.
    let deadline =
        tokio::time::Instant::now() + gateway.config.limits.shutdown_grace + Duration::from_secs(3);
    while gateway.sessions.count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Started processes were stopped with the shutdown; let them go first.
    daemon.processes_exited(Duration::from_secs(3)).await;
    portcullis::shell::host_cgroups().remove_own();
    // Sign the tail of the audit log, so a stopped log is fully covered.
    gateway.audit.checkpoint().await;
    if gateway.sessions.count() > 0 {
        warn!(
            sessions = gateway.sessions.count(),
            "sessions still open at exit"
        );
    }
    info!("stopped");
    ExitCode::SUCCESS
}

/// Applies `[audit]` retention now and then every minute: entries older
/// than `max_age`, then the oldest beyond `max_entries`. A minute keeps a
/// flood (say of failed handshakes) from outgrowing the bound for long.
/// A journal line each time the audit log stops writing or writes again
/// (sessions are told by events, `status` and the metrics say it too).
async fn report_audit_health(gateway: Arc<Gateway>) {
    let mut health = gateway.audit.watch_health();
    loop {
        tokio::select! {
            changed = health.changed() => if changed.is_err() { return },
            () = gateway.shutdown.cancelled() => return,
        }
        match health.borrow_and_update().clone() {
            portcullis_store::Health::Stopped { reason, .. } => error!(
                "the audit log cannot write ({reason}): every request is refused until it can; \
                 it retries every second (free space on the state directory's file system)"
            ),
            portcullis_store::Health::Writing => {
                info!("the audit log writes again: requests are served");
            }
        }
    }
}

async fn retention(gateway: Arc<Gateway>) {
    let config = gateway.config.audit.clone();
    let mut tick = tokio::time::interval(RETENTION_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = gateway.shutdown.cancelled() => return,
        }
        let by_age = config.max_age.and_then(|age| {
            let age = jiff::SignedDuration::try_from(age).ok()?;
            jiff::Timestamp::now().checked_sub(age).ok()
        });
        let bounds = [
            by_age.map(|before| (Retain::Since(before), format!("before {before}"))),
            config
                .max_entries
                .map(|keep| (Retain::Newest(keep), format!("beyond the newest {keep}"))),
        ];
        for (bound, why) in bounds.into_iter().flatten() {
            match gateway.audit.prune_to(bound).await {
                Ok(0) => {}
                Ok(removed) => {
                    info!(removed, "audit retention: pruned entries {why}");
                    gateway.security_event(
                        "audit_pruned",
                        None,
                        format!("retention: {removed} entries {why}"),
                    );
                }
                Err(e) => error!("audit retention: {e}"),
            }
        }
    }
}

const RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// Logs go to the journal, with their fields, when stderr is the journal
/// (under systemd); to stderr as text otherwise. `RUST_LOG` filters
/// (default `info`, and `warn` for rmcp: its `info` lines carry what an
/// MCP server says of itself, whole — the daemon logs its own account).
pub fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"))
    };
    if systemd::stderr_is_journal()
        && let Ok(journald) = tracing_journald::layer()
    {
        // Fields as journal fields of their own: `journalctl PRINCIPAL=agent`.
        let subscriber = tracing_subscriber::registry().with(filter()).with(
            journald
                .with_syslog_identifier("portcullis".into())
                .with_field_prefix(None),
        );
        if tracing::subscriber::set_global_default(subscriber).is_ok() {
            return;
        }
    }
    // Colours only for a terminal: a log redirected to a file stays text.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Says once, at startup, what this host can confine commands with.
fn log_sandbox_support() {
    match portcullis::shell::host_sandbox() {
        Ok(support) => {
            for (mechanism, result) in support {
                match result {
                    Ok(()) => info!(mechanism = mechanism.name(), "sandbox: available"),
                    Err(why) => warn!(
                        mechanism = mechanism.name(),
                        "sandbox: missing ({why}); grants that require it refuse commands"
                    ),
                }
            }
        }
        Err(e) => warn!("sandbox: {}", e.message),
    }
    if portcullis_confine::resolver() == portcullis_confine::Resolver::Walk {
        info!(
            "files: openat2 is refused here (ENOSYS: systemd's RestrictSUIDSGID=, or an older kernel); \
             paths beneath a root are resolved one component at a time, with the same rules"
        );
    }
    for (controller, found) in portcullis::shell::host_cgroups().report() {
        match found {
            Ok(place) => info!(
                controller = controller.name(),
                "cgroups: commands' in {place}"
            ),
            Err(why) => info!(
                controller = controller.name(),
                "cgroups: no {} controller for commands ({why}); its limits fall back to rlimits where there is one",
                controller.name()
            ),
        }
    }
}

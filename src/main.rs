//! The `portcullis` command: the daemon and its operator and client verbs.
//! Argument parsing lives here; each verb is in `cli/`.

#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::policy::DEFAULT_POLICY;

/// glibc's allocator took a fifth of the gateway's CPU samples at 256
/// requests in flight; with mimalloc, in its secure mode (guard pages,
/// encrypted free lists), CPU per request fell by about a sixth
/// (bench/README.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "portcullis",
    version,
    about = "A hardened gateway for AI agents on this host."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create and inspect X25519 static keys (the gateway's and clients').
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Make a bearer token for a principal (printed once) and its hash for the policy.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Check this installation: config, policy, keys, state, roots, sandbox, ports.
    Doctor {
        /// The configuration file.
        #[arg(long, default_value = "/etc/portcullis/portcullis.toml")]
        config: PathBuf,
        /// One JSON object with every check.
        #[arg(long)]
        json: bool,
    },
    /// Write the man pages (one per command) into DIR.
    #[command(hide = true)]
    Man { dir: PathBuf },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Check a policy file and explain its decisions.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Run the gateway until SIGTERM; SIGHUP reloads the policy.
    #[command(
        after_help = "Try it locally: portcullis serve --demo (creates ./portcullis-demo once)"
    )]
    Serve {
        /// The configuration file.
        #[arg(
            long,
            default_value = "/etc/portcullis/portcullis.toml",
            conflicts_with = "demo"
        )]
        config: PathBuf,
        /// Create (once) and run a local demo gateway in DIR on 127.0.0.1:7443.
        #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "portcullis-demo")]
        demo: Option<PathBuf>,
    },
    /// The ya-environment-protocol.v1 profile: its JSON Schema.
    #[command(subcommand)]
    Protocol(ProtocolCommand),
    /// Serve ya-environment-protocol.v1 (JSON-RPC, LSP framing) on standard
    /// input and output, for a runtime that starts the provider as its child.
    #[command(
        after_help = "The parent process acts as PRINCIPAL: its grants, its audit entries.                       The gateway is serve's (the same policy, audit log and sandbox) with one                       session and no listener; its state directory must not be a running                       daemon's. Logs go to standard error. docs/PROTOCOL.md §11."
    )]
    Stdio {
        /// The configuration file.
        #[arg(long, default_value = "/etc/portcullis/portcullis.toml")]
        config: PathBuf,
        /// The policy's principal the parent process acts as.
        #[arg(long)]
        principal: String,
    },
    /// Serve ya-environment-protocol.v1 on a Unix socket only: a local daemon
    /// whose peers are the policy's principals by `unix_uid`.
    #[command(
        after_help = "The config's listen addresses and [[relay]] endpoints are not served;                       its admin socket is. To serve the socket beside them, set                       environment_socket in the config and run `serve`. docs/PROTOCOL.md §11."
    )]
    Socket {
        /// The configuration file.
        #[arg(long, default_value = "/etc/portcullis/portcullis.toml")]
        config: PathBuf,
        /// Where the socket is made (a stale one is replaced).
        #[arg(long, value_name = "PATH")]
        listen: PathBuf,
    },
    /// Dial a runtime's endpoint and serve it only (the 0.92 spec's
    /// `websocket --connect`): a [[relay]] given on the command line.
    #[command(
        after_help = "The config's listen addresses, environment socket and [[relay]] endpoints                       are not served; its admin socket is. The protocol defaults to                       ya-environment-protocol.v1 inside the Noise channel; --plain-principal                       speaks it as the spec's own WebSocket profile (JSON text messages over TLS).                       docs/OPERATIONS.md, \"Dial out to a runtime\"."
    )]
    Websocket {
        /// The configuration file.
        #[arg(long, default_value = "/etc/portcullis/portcullis.toml")]
        config: PathBuf,
        /// The runtime's endpoint: wss://HOST/PATH (ws:// only to loopback).
        #[arg(long, value_name = "URL")]
        connect: String,
        /// The file holding the bearer token the endpoint expects.
        #[arg(long, value_name = "FILE")]
        token_file: PathBuf,
        /// CA certificates (PEM) the endpoint's certificate must chain to.
        #[arg(long, value_name = "FILE")]
        ca_file: Option<PathBuf>,
        /// Speak the plain profile (no Noise) as this principal.
        #[arg(long, value_name = "PRINCIPAL")]
        plain_principal: Option<String>,
        /// Speak relay.v1 frames instead of JSON-RPC.
        #[arg(long)]
        relay_protocol: bool,
    },
    /// Show a running daemon's state (through its admin socket).
    Status(cli::admin::Socket),
    /// Print a running daemon's Prometheus metrics (through its admin socket).
    Metrics(cli::admin::Socket),
    /// List a running daemon's sessions, or close one.
    Sessions {
        #[command(subcommand)]
        action: Option<SessionsCommand>,
        #[command(flatten)]
        socket: cli::admin::Socket,
    },
    /// Read and verify the audit log.
    Audit {
        #[command(subcommand)]
        action: AuditCommand,
        #[command(flatten)]
        source: cli::audit::Source,
    },
    /// Tool calls waiting for an operator: list, approve, deny.
    Approvals {
        #[command(subcommand)]
        action: Option<ApprovalsCommand>,
        #[command(flatten)]
        socket: cli::admin::Socket,
    },
    /// Operator-defined tools on a gateway: list, call.
    #[command(subcommand)]
    Tool(cli::tools::ToolCommand),
    /// Run a Rhai script on a gateway (`script run FILE`).
    #[command(subcommand)]
    Script(cli::tools::ScriptCommand),
    /// Emergency stop: close every session, fail its requests, kill running
    /// commands (but those whose grant says `survive_revocation`), refuse
    /// new sessions until `resume` (survives restarts). `--soft`: refuse new
    /// requests only.
    Pause {
        /// Refuse new requests only; sessions and running work go on.
        #[arg(long)]
        soft: bool,
        #[command(flatten)]
        socket: cli::admin::Socket,
    },
    /// Undo `pause`.
    Resume(cli::admin::Socket),
    /// Connect to a gateway and print its hello.
    Connect(cli::connect::Target),
    /// Serve the MCP (Model Context Protocol) in front of a gateway, on
    /// standard input and output or Streamable HTTP: its grants as MCP
    /// tools, its roots as resources. For an MCP client (docs/MCP.md).
    #[command(
        after_help = "Each MCP tool call is one request of this client's principal: \
        decided by the gateway's policy and written to its audit log (tool_call_id mcp-ID). \
        Over stdio, standard output carries MCP only; messages go to standard error.\n\nExamples:\n  \
        portcullis mcp ws://127.0.0.1:7443 --gateway-key KEY --identity agent.key\n  \
        portcullis mcp ws://127.0.0.1:7443 --identity agent.key --http 127.0.0.1:8765 --http-token-file mcp.token"
    )]
    Mcp(Box<cli::mcp::McpArgs>),
    /// Connect to a gateway and measure relay ping round trips.
    Ping {
        #[command(flatten)]
        target: cli::connect::Target,
        /// How many pings.
        #[arg(long, default_value_t = 3)]
        count: u32,
    },
    /// Print a file on a gateway (ROOT:PATH) to stdout.
    Cat(cli::files::Cat),
    /// Download a file from a gateway (its sha256 is printed).
    Get(cli::files::Get),
    /// Upload a file to a gateway (atomic replace, or --append).
    Put(cli::files::Put),
    /// List a directory on a gateway.
    Ls(cli::files::Ls),
    /// Show size, kind, mode and mtime of an entry on a gateway.
    Stat(cli::files::Stat),
    /// Remove a file (or, with -r, a directory) on a gateway.
    Rm(cli::files::Rm),
    /// Create a directory on a gateway.
    Mkdir(cli::files::Mkdir),
    /// Search files on a gateway (ripgrep's engine); exit 2 if nothing matched.
    Grep(cli::files::Grep),
    /// Run a command on a gateway, streaming its output; exits with its code.
    Exec(cli::shell::Exec),
    /// Open an interactive terminal on a gateway (`bash -l`, or the given
    /// command); exits with its code.
    Shell(cli::shell::Shell),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Generate a key pair into FILE (mode 0600) and print its public key.
    Generate {
        /// Where to write the private key file.
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
        /// Print the public key and fingerprint as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the public key (base64) and fingerprint of a private key file.
    Show {
        file: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// List entries, newest first.
    List(Box<cli::audit::ListArgs>),
    /// Show one entry in full.
    Show { seq: u64 },
    /// Recompute the hash chain and check the signed checkpoints (and, with
    /// --checkpoint, that the log still extends one kept off the host);
    /// exit 0 if intact, 2 if broken (naming the first broken link).
    Verify(cli::audit::VerifyArgs),
    /// Write the log (entries and signed checkpoints) as JSON Lines, for
    /// `audit verify --file` anywhere (through the daemon's admin socket
    /// while it runs, else from the store).
    Export {
        /// Write here instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Print the audit public key (base64) that signs checkpoints.
    Key,
    /// Print the newest signed checkpoint (it covers every acknowledged
    /// entry) as a signed note (C2SP tlog-checkpoint), to keep off this
    /// host; `audit verify --checkpoint FILE` proves the log still extends
    /// it.
    Checkpoint,
    /// Remove entries older than --before, leaving a signed marker so the
    /// rest still verifies.
    Prune {
        /// A duration back from now (`90d`) or a time (RFC 3339).
        #[arg(long)]
        before: String,
    },
    /// The last entries, oldest first; -f follows new ones.
    Tail {
        /// How many entries to show first.
        #[arg(short = 'n', long, default_value_t = 20)]
        lines: usize,
        /// Keep printing new entries as they are written.
        #[arg(short, long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// List the calls waiting (the default).
    List,
    /// Let a waiting call run (as your uid; `ask_once` approvals are remembered).
    Approve { id: u64 },
    /// Refuse a waiting call (it answers `approval_required`).
    Deny { id: u64 },
}

#[derive(Subcommand)]
enum SessionsCommand {
    /// List sessions (the default).
    List,
    /// Close a session; its requests in flight are answered first.
    Kill { id: u64 },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Make the running daemon reload its policy file (as SIGHUP does), and
    /// report errors if the file does not load.
    Reload(cli::admin::Socket),
    /// Validate a policy file. Exit 0 when valid; 1 with every error as
    /// FILE:LINE:COLUMN: message.
    Check {
        /// The policy file.
        #[arg(default_value = DEFAULT_POLICY)]
        file: PathBuf,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show how the policy decides one request, and the rule that decides
    /// it. Exit 0 when allowed, 2 when denied or approval is required,
    /// 1 on error.
    #[command(after_help = "Examples:\n  \
        portcullis policy explain --principal agent --method file.write --root workspace --path src/main.rs\n  \
        portcullis policy explain --principal agent --method shell.exec --command git --cwd-root workspace\n  \
        portcullis policy explain --principal agent --method tool.call --tool service_restart")]
    Explain(Box<cli::policy::ExplainArgs>),
}

#[derive(Subcommand)]
enum ProtocolCommand {
    /// Print the JSON Schema of ya-environment-protocol.v1 as this provider
    /// serves it: every method's params and result, the notifications, the
    /// error codes.
    #[command(after_help = "Examples:\n  \
        portcullis protocol schema > ya-environment-protocol.v1.schema.json\n  \
        portcullis protocol schema --method process.wait --part result")]
    Schema {
        /// Only this method's (or notification's) schema, standing alone.
        #[arg(long)]
        method: Option<String>,
        /// With --method: `params` or `result` (both when absent).
        #[arg(long, requires = "method", value_parser = ["params", "result"])]
        part: Option<String>,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// A new random token, and the `token_hash` line for the policy.
    New {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Token(TokenCommand::New { json }) => cli::keys::new_token(json),
        Command::Doctor { config, json } => cli::doctor::doctor(&config, json),
        Command::Man { dir } => man_pages(&dir),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "portcullis",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Keys(KeysCommand::Generate { file, force, json }) => {
            cli::keys::generate(&file, force, json)
        }
        Command::Keys(KeysCommand::Show { file, json }) => cli::keys::show(&file, json),
        Command::Policy(PolicyCommand::Check { file, json }) => cli::policy::check(&file, json),
        Command::Policy(PolicyCommand::Explain(args)) => cli::policy::explain(*args),
        Command::Serve { config, demo: None } => cli::serve::serve(&config),
        Command::Serve {
            demo: Some(dir), ..
        } => match cli::demo::prepare(&dir) {
            Ok(config) => cli::serve::serve(&config),
            Err(e) => cli::fail(e),
        },
        Command::Protocol(ProtocolCommand::Schema { method, part }) => {
            cli::stdio::schema(method.as_deref(), part.as_deref())
        }
        Command::Stdio { config, principal } => cli::stdio::stdio(&config, &principal),
        Command::Socket { config, listen } => cli::serve::socket(&config, &listen),
        Command::Websocket {
            config,
            connect,
            token_file,
            ca_file,
            plain_principal,
            relay_protocol,
        } => {
            let absolute = |p: PathBuf| std::path::absolute(&p).unwrap_or(p);
            let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
            let mut keys = format!(
                "url = {}\ntoken_file = {}\n",
                quote(&connect),
                quote(&absolute(token_file).to_string_lossy())
            );
            if !relay_protocol {
                keys += "protocol = \"ya-environment-protocol.v1\"\n";
            }
            if let Some(ca) = ca_file {
                keys += &format!("ca_file = {}\n", quote(&absolute(ca).to_string_lossy()));
            }
            if let Some(principal) = plain_principal {
                keys += &format!("profile = \"plain\"\nprincipal = {}\n", quote(&principal));
            }
            cli::serve::websocket(&config, &keys)
        }
        Command::Connect(target) => cli::connect::connect(target),
        Command::Mcp(args) => cli::mcp::mcp(*args),
        Command::Status(socket) => cli::admin::status(&socket),
        Command::Metrics(socket) => cli::admin::metrics(&socket),
        Command::Audit {
            action: AuditCommand::List(args),
            source,
        } => cli::audit::list(source, *args),
        Command::Audit {
            action: AuditCommand::Show { seq },
            source,
        } => cli::audit::show(source, seq),
        Command::Audit {
            action: AuditCommand::Verify(args),
            source,
        } => cli::audit::verify(source, args),
        Command::Audit {
            action: AuditCommand::Export { output },
            source,
        } => cli::audit::export(source, output),
        Command::Audit {
            action: AuditCommand::Key,
            source,
        } => cli::audit::key(source),
        Command::Audit {
            action: AuditCommand::Checkpoint,
            source,
        } => cli::audit::checkpoint(source),
        Command::Audit {
            action: AuditCommand::Tail { lines, follow },
            source,
        } => cli::audit::tail(source, lines, follow),
        Command::Audit {
            action: AuditCommand::Prune { before },
            source,
        } => cli::audit::prune(source, before),
        Command::Sessions {
            action: None | Some(SessionsCommand::List),
            socket,
        } => cli::admin::sessions(&socket),
        Command::Sessions {
            action: Some(SessionsCommand::Kill { id }),
            socket,
        } => cli::admin::kill(&socket, id),
        Command::Policy(PolicyCommand::Reload(socket)) => cli::admin::reload(&socket),
        Command::Approvals {
            action: None | Some(ApprovalsCommand::List),
            socket,
        } => cli::admin::approvals(&socket),
        Command::Approvals {
            action: Some(ApprovalsCommand::Approve { id }),
            socket,
        } => cli::admin::decide_approval(&socket, id, true),
        Command::Approvals {
            action: Some(ApprovalsCommand::Deny { id }),
            socket,
        } => cli::admin::decide_approval(&socket, id, false),
        Command::Tool(command) => cli::tools::tool(command),
        Command::Script(command) => cli::tools::script(command),
        Command::Pause { soft, socket } => cli::admin::pause(&socket, Some(soft)),
        Command::Resume(socket) => cli::admin::pause(&socket, None),
        Command::Ping { target, count } => cli::connect::ping(target, count),
        Command::Cat(args) => cli::files::cat(args),
        Command::Get(args) => cli::files::get(args),
        Command::Put(args) => cli::files::put(args),
        Command::Ls(args) => cli::files::ls(args),
        Command::Stat(args) => cli::files::stat(args),
        Command::Rm(args) => cli::files::rm(args),
        Command::Mkdir(args) => cli::files::mkdir(args),
        Command::Grep(args) => cli::files::grep(args),
        Command::Exec(args) => cli::shell::exec(args),
        Command::Shell(args) => cli::shell::shell(args),
    }
}

/// `portcullis.1` and one page per subcommand (`portcullis-audit.1`, …).
fn man_pages(dir: &std::path::Path) -> ExitCode {
    use clap::CommandFactory;
    let written =
        std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(Cli::command(), dir));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => cli::fail(format!("cannot write man pages to {}: {e}", dir.display())),
    }
}

//! `portcullis policy check|explain`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use portcullis_policy::{Decision, Policy, Query, Target, Verdict, decide, load_file};
use serde_json::json;

use crate::cli::{EXIT_NO, fail};

pub fn check(file: &Path, json: bool) -> ExitCode {
    // A tool whose script is missing or does not compile is an error here,
    // not a surprise at its first call.
    let loaded = load_file(file).and_then(|policy| {
        let policy = std::sync::Arc::new(policy);
        let problems = portcullis::tools::registry::Registry::compile(policy.clone()).problems();
        match problems.is_empty() {
            true => Ok(policy),
            false => Err(portcullis_policy::PolicyErrors(
                problems
                    .into_iter()
                    .map(|message| portcullis_policy::PolicyError {
                        file: file.display().to_string(),
                        line: 0,
                        column: 0,
                        message,
                    })
                    .collect(),
            )),
        }
    });
    match loaded {
        Ok(policy) => {
            if json {
                println!(
                    "{}",
                    json!({"ok": true, "file": file, "generation": policy.generation, "counts": counts(&policy)})
                );
            } else {
                let c = counts(&policy);
                println!(
                    "ok: {} (generation {}): {} principals, {} roots, {} grants, {} tools",
                    file.display(),
                    &policy.generation[..12],
                    c["principals"],
                    c["roots"],
                    c["grants"],
                    c["tools"]
                );
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            if json {
                println!("{}", json!({"ok": false, "file": file, "errors": errors.0}));
            } else {
                for e in &errors.0 {
                    eprintln!("{e}");
                }
                let n = errors.0.len();
                eprintln!(
                    "{} error{} in {}",
                    n,
                    if n == 1 { "" } else { "s" },
                    file.display()
                );
            }
            ExitCode::FAILURE
        }
    }
}

fn counts(policy: &Policy) -> serde_json::Value {
    json!({
        "principals": policy.principals.len(),
        "roots": policy.roots.len(),
        "grants": policy.grants.len(),
        "tools": policy.tools.len(),
    })
}

/// The policy file read when none is given.
pub const DEFAULT_POLICY: &str = "/etc/portcullis/policy.toml";

/// The flags of `policy explain`.
#[derive(clap::Args)]
pub struct ExplainArgs {
    /// The policy file.
    #[arg(long, default_value = DEFAULT_POLICY)]
    pub file: PathBuf,
    /// Principal id, as in the policy.
    #[arg(long)]
    pub principal: String,
    /// Relay method, e.g. file.read, shell.exec, tool.call, script.run.
    #[arg(long)]
    pub method: String,
    /// Root id for file methods (the source, for file.move and file.copy).
    #[arg(long)]
    pub root: Option<String>,
    /// Path within --root.
    #[arg(long, requires = "root")]
    pub path: Option<String>,
    /// Destination root for file.move and file.copy.
    #[arg(long, requires = "root")]
    pub to_root: Option<String>,
    /// Destination path within --to-root.
    #[arg(long, requires = "to_root")]
    pub to_path: Option<String>,
    /// Program for shell methods: a bare name or an absolute path.
    #[arg(long, conflicts_with_all = ["root", "tool"])]
    pub command: Option<String>,
    /// An argument of the command (repeat for each, in order): what a
    /// grant's command approval patterns see after the program.
    #[arg(long = "arg", requires = "command", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Root the command runs in.
    #[arg(long, requires = "command")]
    pub cwd_root: Option<String>,
    /// Directory within --cwd-root.
    #[arg(long, requires = "cwd_root")]
    pub cwd: Option<String>,
    /// Ask for a terminal.
    #[arg(long, requires = "command")]
    pub pty: bool,
    /// Tool name for tool.call.
    #[arg(long, conflicts_with = "root")]
    pub tool: Option<String>,
    /// Decide as of this time (RFC 3339) instead of now.
    #[arg(long)]
    pub at: Option<String>,
    /// Print the decision as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn explain(args: ExplainArgs) -> ExitCode {
    let policy = match load_file(&args.file) {
        Ok(policy) => policy,
        Err(errors) => return fail(format!("the policy does not load:\n{errors}")),
    };
    let now = match &args.at {
        None => jiff::Timestamp::now(),
        Some(at) => match at.parse() {
            Ok(t) => t,
            Err(_) => {
                return fail(format!(
                    "--at `{at}` is not a date-time like 2027-01-01T00:00:00Z"
                ));
            }
        },
    };
    let query = Query {
        method: args.method.clone(),
        target: target(&args),
    };
    let decision = decide(&policy, &args.principal, &query, now);
    if args.json {
        let out = json!({
            "principal": args.principal,
            "method": args.method,
            "at": now.to_string(),
            "generation": policy.generation,
            "allowed": decision.is_allowed(),
            "decision": decision,
        });
        println!("{out}");
    } else {
        println!("{}", describe(&decision));
    }
    if decision.is_allowed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_NO)
    }
}

fn target(args: &ExplainArgs) -> Target {
    if args.method == "script.run" {
        return Target::Script { requested: None };
    }
    if let Some(name) = &args.tool {
        return Target::Tool { name: name.clone() };
    }
    if let Some(program) = &args.command {
        let cwd = args
            .cwd_root
            .clone()
            .map(|root| (root, args.cwd.clone().unwrap_or_default()));
        return Target::Command {
            program: program.clone(),
            args: args.args.clone(),
            cwd,
            env: Vec::new(),
            pty: args.pty,
            lookup: Some(portcullis_policy::ProgramLookup(
                portcullis::shell::find_on_path,
            )),
        };
    }
    match (&args.root, &args.to_root) {
        (Some(root), Some(to_root)) => Target::Transfer {
            from: (root.clone(), args.path.clone().unwrap_or_default()),
            to: (to_root.clone(), args.to_path.clone().unwrap_or_default()),
        },
        (Some(root), None) => Target::Path {
            root: root.clone(),
            path: args.path.clone().unwrap_or_default(),
        },
        _ => Target::None,
    }
}

fn describe(decision: &Decision) -> String {
    match decision.verdict {
        Verdict::Allow => format!("allowed: {}", decision.rule),
        Verdict::RequireApproval(policy) => {
            format!("approval required ({}): {}", policy.as_str(), decision.rule)
        }
        Verdict::Deny(denial) => {
            format!(
                "denied ({}: {}): {}",
                denial.error_code(),
                denial.as_str(),
                decision.rule
            )
        }
    }
}

//! The decision: `decide(policy, principal, query, now) -> Decision`. Pure:
//! no I/O, no clock, no state. Every allow names the grant that allowed it;
//! every refusal says why.
//!
//! Overlap rules:
//! - file access is the union of the grants: the strongest mode wins;
//! - shell and scripts are decided by the first grant (in file order) that
//!   permits the whole request, and that grant's limits apply;
//! - a tool is callable if any grant allows its name; its approval policy is
//!   the strictest of the tool's own and every matching override in the
//!   principal's grants, so `block` and stricter policies always win.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::model::*;
use crate::path::{PathError, RelativePath, normalize};

/// What a request wants, reduced to the parameters that matter to policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub method: String,
    pub target: Target,
}

/// Finds a bare program name on a `PATH` value (`(path, name) ->
/// absolute path`): the one fact about the host that deciding a command
/// needs. The daemon passes one that looks at the filesystem; `decide`
/// stays a function of its inputs.
#[derive(Clone, Copy)]
pub struct ProgramLookup(pub fn(&str, &str) -> Option<String>);

impl std::fmt::Debug for ProgramLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgramLookup")
    }
}

/// Lookups are not compared: two queries differ by what they ask.
impl PartialEq for ProgramLookup {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ProgramLookup {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Methods with nothing to check beyond the capability (`shell.status`,
    /// `tool.list`, `resource.list`, …).
    None,
    /// One file path, as the client wrote it.
    Path {
        root: String,
        path: String,
    },
    /// `file.move` and `file.copy`.
    Transfer {
        from: (String, String),
        to: (String, String),
    },
    /// A program to run. `program` is as requested (bare name or absolute
    /// path); `cwd` is a root and a path in it. With `lookup`, bare names
    /// are resolved on the child's `PATH` before the grant's command list
    /// is checked.
    Command {
        program: String,
        /// The arguments after the program (what a command approval
        /// pattern is matched against, with the program).
        args: Vec<String>,
        cwd: Option<(String, String)>,
        env: Vec<(String, String)>,
        pty: bool,
        lookup: Option<ProgramLookup>,
    },
    Tool {
        name: String,
    },
    /// `script.run`, with the limits the request asks for (never more than
    /// the grant's).
    Script {
        requested: Option<ScriptLimits>,
    },
    /// An artifact the gateway would upload: its type and size in bytes.
    Artifact {
        mime_type: String,
        size: u64,
    },
}

/// A capability of the relay protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    Fileops,
    Shell,
    Tools,
    Scripts,
    Resources,
    /// Uploads to the runtime's storage (provider → runtime).
    Artifacts,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fileops => "fileops",
            Self::Shell => "shell",
            Self::Tools => "tools",
            Self::Scripts => "scripts",
            Self::Resources => "resources",
            Self::Artifacts => "artifacts",
        }
    }
}

/// What a method needs of a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// The capability a method belongs to, and for file methods the access.
fn classify(method: &str) -> Result<(Capability, Option<Access>), Denial> {
    use Capability::*;
    Ok(match method {
        "file.read" | "file.list" | "file.stat" | "file.search" | "file.watch" => {
            (Fileops, Some(Access::Read))
        }
        "file.write" | "file.append" | "file.edit" | "file.mkdir" | "file.delete" | "file.move"
        | "file.copy" => (Fileops, Some(Access::Write)),
        "shell.exec" | "shell.start" | "shell.input" | "shell.resize" | "shell.signal"
        | "shell.cancel" | "shell.status" | "shell.list" | "shell.attach" => (Shell, None),
        "tool.list" | "tool.call" | "tool.cancel" => (Tools, None),
        // The runtime's own tools, for scripts to call.
        "script.run" | "tool.register" | "tool.unregister" => (Scripts, None),
        "resource.list"
        | "resource.get"
        | "resource.dispose"
        | "resource.create"
        | "resource.export_state"
        | "resource.restore_state" => (Resources, None),
        // The gateway's own upload of a result to the runtime's storage;
        // the other `artifact.*` methods are what it asks of the runtime.
        "artifact.upload" => (Artifacts, None),
        m if m.starts_with("computer.") || m.starts_with("artifact.") => {
            return Err(Denial::CapabilityUnavailable);
        }
        _ => return Err(Denial::UnknownMethod),
    })
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    /// Why, in words an operator can act on; goes into the audit entry.
    pub rule: String,
    /// The grant that decided, when one did.
    pub grant: Option<String>,
    pub capability: Option<Capability>,
    /// What the handler must apply when the request runs.
    pub terms: Terms,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "detail", rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    /// Runs only once approved under this policy (never `allow` or `block`).
    RequireApproval(ApprovalPolicy),
    Deny(Denial),
}

/// Why a request is refused; each maps to a relay error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Denial {
    UnknownMethod,
    CapabilityUnavailable,
    UnknownPrincipal,
    PrincipalDisabled,
    PrincipalExpired,
    /// No grant of this principal allows it.
    NotGranted,
    /// The root is granted read-only.
    ReadOnly,
    /// The path is malformed or leaves its root.
    BadPath,
    UnknownRoot,
    UnknownTool,
    /// The tool's approval policy is `block`.
    Blocked,
    /// The query does not fit the method (e.g. `file.read` without a path).
    InvalidRequest,
}

impl Denial {
    /// A short name for logs and the CLI (`read_only`, `not_granted`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownMethod => "unknown_method",
            Self::CapabilityUnavailable => "capability_unavailable",
            Self::UnknownPrincipal => "unknown_principal",
            Self::PrincipalDisabled => "principal_disabled",
            Self::PrincipalExpired => "principal_expired",
            Self::NotGranted => "not_granted",
            Self::ReadOnly => "read_only",
            Self::BadPath => "bad_path",
            Self::UnknownRoot => "unknown_root",
            Self::UnknownTool => "unknown_tool",
            Self::Blocked => "blocked",
            Self::InvalidRequest => "invalid_request",
        }
    }

    /// The `ya-environment-relay.v1` error code for this refusal.
    pub fn error_code(self) -> &'static str {
        match self {
            Self::UnknownMethod => "unknown_method",
            Self::CapabilityUnavailable => "capability_unavailable",
            Self::UnknownTool => "not_found",
            Self::Blocked => "policy_blocked",
            Self::InvalidRequest => "invalid_request",
            Self::UnknownPrincipal
            | Self::PrincipalDisabled
            | Self::PrincipalExpired
            | Self::NotGranted
            | Self::ReadOnly
            | Self::BadPath
            | Self::UnknownRoot => "permission_denied",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Terms {
    None,
    File(FileTerms),
    Transfer { from: FileTerms, to: FileTerms },
    Shell(ShellTerms),
    Tool { name: String, risk: Risk },
    Script(ScriptLimits),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileTerms {
    pub root: String,
    /// Normalised, relative to the root; resolve it beneath the root's
    /// directory handle, never by string concatenation.
    pub path: String,
    pub mode: Mode,
    /// The root's directory on the host (the operator's word, trusted) and
    /// what clients call it. Neither is ever sent to a client or audited.
    pub host_root: std::path::PathBuf,
    pub virtual_root: String,
    pub follow_symlinks: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShellTerms {
    /// The program to run, resolved (when the query had a lookup and the
    /// name was found): exactly what the grant's list was checked against.
    pub program: Option<std::path::PathBuf>,
    /// The child's whole environment: the requested variables the grant
    /// allows, then the grant's fixed values.
    pub env: BTreeMap<String, String>,
    pub cwd: Option<FileTerms>,
    pub max_runtime: Duration,
    pub output_limit: u64,
    pub pty: bool,
    pub network: Network,
    pub max_processes: u32,
    pub persist: bool,
    pub idle_timeout: Duration,
    pub limits: ProcessLimits,
    pub sandbox: SandboxMode,
    pub survive_revocation: bool,
    /// Roots the child may write (`rw`) or read, for its sandbox.
    pub roots: BTreeMap<String, Mode>,
    /// The same roots' host directories (the operator's word), which the
    /// sandbox is built from. Never sent to a client or audited.
    pub host_roots: Vec<(std::path::PathBuf, Mode)>,
}

impl McpServer {
    /// The terms the server's process runs under: the command sandbox of
    /// `shell.*`, built from its own section instead of a grant (it is the
    /// operator's program, started by the daemon, not by a principal).
    /// `secrets` are the values of its secret variables, read by the caller.
    pub fn shell_terms(
        &self,
        policy: &Policy,
        secrets: impl IntoIterator<Item = (String, String)>,
    ) -> ShellTerms {
        let root_terms = |id: &str, mode: Mode| {
            let root = policy.root(id)?;
            let top = normalize(&root.virtual_path, &root.virtual_path).ok()?;
            Some(FileTerms {
                root: id.to_string(),
                path: top.as_str().to_string(),
                mode,
                host_root: root.host_path.clone(),
                virtual_root: root.virtual_path.clone(),
                follow_symlinks: root.follow_symlinks,
            })
        };
        let mut env = self.env.clone();
        env.extend(secrets);
        ShellTerms {
            program: None,
            env,
            cwd: self
                .cwd
                .as_deref()
                .and_then(|id| root_terms(id, *self.roots.get(id)?)),
            max_runtime: Duration::MAX,
            output_limit: 0,
            pty: false,
            network: self.network.clone(),
            // Its tasks (threads too), as `max_pids` says.
            max_processes: self
                .limits
                .pids
                .map_or(64, |pids| u32::try_from(pids).unwrap_or(u32::MAX)),
            persist: false,
            idle_timeout: Duration::MAX,
            limits: self.limits,
            sandbox: self.sandbox,
            survive_revocation: false,
            host_roots: self
                .roots
                .iter()
                .filter_map(|(id, mode)| Some((policy.root(id)?.host_path.clone(), *mode)))
                .collect(),
            roots: self.roots.clone(),
        }
    }
}

impl Decision {
    fn deny(denial: Denial, capability: Option<Capability>, rule: impl Into<String>) -> Self {
        Self {
            verdict: Verdict::Deny(denial),
            rule: rule.into(),
            grant: None,
            capability,
            terms: Terms::None,
        }
    }

    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allow
    }
}

/// Decides `query` for the principal `principal_id` at time `now`.
pub fn decide(
    policy: &Policy,
    principal_id: &str,
    query: &Query,
    now: jiff::Timestamp,
) -> Decision {
    let (capability, access) = match classify(&query.method) {
        Ok(found) => found,
        Err(denial) => {
            let rule = match denial {
                Denial::UnknownMethod => format!("no capability serves method `{}`", query.method),
                _ => format!(
                    "method `{}` belongs to a capability this gateway does not provide",
                    query.method
                ),
            };
            return Decision::deny(denial, None, rule);
        }
    };
    let cap = Some(capability);
    if let Err((denial, rule)) = principal_status(policy, principal_id, now) {
        return Decision::deny(denial, cap, rule);
    }
    let grants: Vec<&Grant> = active_grants(policy, principal_id, now).collect();
    let grants = grants.as_slice();

    match (capability, &query.target) {
        (Capability::Fileops, Target::Path { root, path }) => {
            let access = access.unwrap_or(Access::Write);
            match file_terms(policy, grants, principal_id, root, path, access) {
                Ok((terms, grant, rule)) => allow(cap, grant, rule, Terms::File(terms)),
                Err((denial, rule)) => Decision::deny(denial, cap, rule),
            }
        }
        (Capability::Fileops, Target::Transfer { from, to }) => {
            // A copy reads its source; a move also removes it.
            let from_access = if query.method == "file.move" {
                Access::Write
            } else {
                Access::Read
            };
            let source = file_terms(policy, grants, principal_id, &from.0, &from.1, from_access);
            let target = file_terms(policy, grants, principal_id, &to.0, &to.1, Access::Write);
            match (source, target) {
                (Ok((from, _, from_rule)), Ok((to, grant, to_rule))) => allow(
                    cap,
                    grant,
                    format!("source: {from_rule}; destination: {to_rule}"),
                    Terms::Transfer { from, to },
                ),
                (Err((denial, rule)), _) | (_, Err((denial, rule))) => {
                    Decision::deny(denial, cap, rule)
                }
            }
        }
        (Capability::Fileops, _) => Decision::deny(
            Denial::InvalidRequest,
            cap,
            format!("`{}` needs a root and a path", query.method),
        ),
        (Capability::Shell, command @ Target::Command { .. }) => {
            shell(policy, grants, principal_id, command)
        }
        (Capability::Shell, Target::None) => {
            first_grant_with(grants, cap, principal_id, |g| g.shell.is_some())
        }
        (Capability::Tools, Target::Tool { name }) => tool(policy, grants, principal_id, name),
        (Capability::Tools, Target::None) => {
            first_grant_with(grants, cap, principal_id, |g| g.tools.is_some())
        }
        (Capability::Scripts, Target::None) => {
            first_grant_with(grants, cap, principal_id, |g| g.scripts.is_some())
        }
        (Capability::Scripts, Target::Script { requested }) => {
            match grants
                .iter()
                .find_map(|g| g.scripts.map(|limits| (g, limits)))
            {
                Some((g, limits)) => {
                    let limits = requested.map_or(limits, |r| r.min(limits));
                    allow(
                        cap,
                        &g.id,
                        format!("grant `{}` allows scripts", g.id),
                        Terms::Script(limits),
                    )
                }
                None => not_granted(cap, principal_id, "scripts"),
            }
        }
        (Capability::Resources, Target::None) => {
            first_grant_with(grants, cap, principal_id, grants_resources)
        }
        (Capability::Artifacts, Target::Artifact { mime_type, size }) => {
            artifact(grants, principal_id, mime_type, *size)
        }
        (_, _) => Decision::deny(
            Denial::InvalidRequest,
            cap,
            format!(
                "`{}` was asked with parameters that do not fit it",
                query.method
            ),
        ),
    }
}

/// The first grant that lets the gateway upload an artifact of this type
/// and size for the principal, or why none does.
fn artifact(grants: &[&Grant], principal_id: &str, mime_type: &str, size: u64) -> Decision {
    let cap = Some(Capability::Artifacts);
    let mut refusals = Vec::new();
    for g in grants {
        let Some(a) = &g.artifacts else { continue };
        if !a.allows_type(mime_type) {
            refusals.push(format!(
                "grant `{}` allows artifacts of type {}, not `{mime_type}`",
                g.id,
                a.mime_types.join(", ")
            ));
        } else if size > a.max_size {
            refusals.push(format!(
                "grant `{}` allows artifacts of at most {} bytes, not {size}",
                g.id, a.max_size
            ));
        } else {
            let rule = format!("grant `{}` allows artifacts of type `{mime_type}`", g.id);
            return allow(cap, &g.id, rule, Terms::None);
        }
    }
    if refusals.is_empty() {
        return not_granted(cap, principal_id, "artifacts");
    }
    Decision::deny(Denial::NotGranted, cap, refusals.join("; "))
}

/// Where grant `grant`'s artifact upload may connect for `host:port`
/// (the upload URL the runtime gave; `resolved`: its addresses): the
/// addresses allowed, and the entry that allows them; or why none is.
pub fn artifact_destination(
    policy: &Policy,
    grant: &str,
    host: &str,
    port: u16,
    resolved: &[std::net::IpAddr],
) -> Result<(Vec<std::net::IpAddr>, String), String> {
    let Some(artifacts) = policy.grant(grant).and_then(|g| g.artifacts.as_ref()) else {
        return Err(format!("grant `{grant}` allows no artifacts"));
    };
    let allowed = artifacts
        .destinations
        .allows(host, port)
        .map_err(|refusal| format!("grant `{grant}`'s artifacts.destinations: {refusal}"))?;
    let rule = format!(
        "grant `{grant}`'s artifacts.destinations `{}`",
        allowed.text
    );
    artifacts
        .destinations
        .usable(host, port, resolved)
        .map(|usable| (usable, rule))
        .map_err(|refusal| format!("grant `{grant}`'s artifacts.destinations: {refusal}"))
}

/// Whether the principal exists and may act now.
pub fn principal_status(
    policy: &Policy,
    principal_id: &str,
    now: jiff::Timestamp,
) -> Result<(), (Denial, String)> {
    let Some(principal) = policy.principal(principal_id) else {
        return Err((
            Denial::UnknownPrincipal,
            format!("principal `{principal_id}` is not in the policy"),
        ));
    };
    if principal.disabled {
        return Err((
            Denial::PrincipalDisabled,
            format!("principal `{principal_id}` is disabled"),
        ));
    }
    if principal.expires_at.is_some_and(|t| t <= now) {
        return Err((
            Denial::PrincipalExpired,
            format!("principal `{principal_id}` expired"),
        ));
    }
    Ok(())
}

/// The principal's grants that have not expired, in file order.
pub fn active_grants<'p>(
    policy: &'p Policy,
    principal_id: &'p str,
    now: jiff::Timestamp,
) -> impl Iterator<Item = &'p Grant> {
    policy
        .grants
        .iter()
        .filter(move |g| g.principals.iter().any(|p| p == principal_id))
        .filter(move |g| g.expires_at.is_none_or(|t| t > now))
}

fn allow(capability: Option<Capability>, grant: &str, rule: String, terms: Terms) -> Decision {
    Decision {
        verdict: Verdict::Allow,
        rule,
        grant: Some(grant.to_string()),
        capability,
        terms,
    }
}

fn not_granted(capability: Option<Capability>, principal: &str, what: &str) -> Decision {
    Decision::deny(
        Denial::NotGranted,
        capability,
        format!("no grant gives principal `{principal}` {what} (deny by default)"),
    )
}

fn first_grant_with(
    grants: &[&Grant],
    cap: Option<Capability>,
    principal: &str,
    has: impl Fn(&Grant) -> bool,
) -> Decision {
    let what = cap.map_or("", |c| c.as_str());
    match grants.iter().find(|g| has(g)) {
        Some(g) => allow(
            cap,
            &g.id,
            format!("grant `{}` allows {what}", g.id),
            Terms::None,
        ),
        None => not_granted(cap, principal, what),
    }
}

type Refusal = (Denial, String);

/// The strongest mode any grant gives on `root`, with the grant's id.
fn root_mode<'g>(grants: &[&'g Grant], root: &str) -> Option<(Mode, &'g str)> {
    grants
        .iter()
        .filter_map(|g| g.fileops.get(root).map(|m| (*m, g.id.as_str())))
        .max_by_key(|(m, _)| *m)
}

fn file_terms<'g>(
    policy: &Policy,
    grants: &[&'g Grant],
    principal: &str,
    root_id: &str,
    path: &str,
    access: Access,
) -> Result<(FileTerms, &'g str, String), Refusal> {
    // Not granted, whether or not the root exists: the answer must not
    // tell a principal which roots there are beyond its own.
    let Some((mode, grant)) = root_mode(grants, root_id) else {
        return Err((
            Denial::NotGranted,
            format!("no grant gives principal `{principal}` root `{root_id}` (deny by default)"),
        ));
    };
    let Some(root) = policy.root(root_id) else {
        // Loading refuses a grant of an undefined root; kept for safety.
        return Err((
            Denial::UnknownRoot,
            format!("root `{root_id}` is not defined"),
        ));
    };
    let relative: RelativePath = normalize(&root.virtual_path, path)
        .map_err(|e: PathError| (Denial::BadPath, format!("root `{root_id}`: {e}")))?;
    if access == Access::Write && mode == Mode::Ro {
        return Err((
            Denial::ReadOnly,
            format!("grant `{grant}` gives root `{root_id}` read-only"),
        ));
    }
    let rule = format!("grant `{grant}` gives root `{root_id}` {}", mode.as_str());
    Ok((
        FileTerms {
            root: root_id.to_string(),
            path: relative.as_str().to_string(),
            mode,
            host_root: root.host_path.clone(),
            virtual_root: root.virtual_path.clone(),
            follow_symlinks: root.follow_symlinks,
        },
        grant,
        rule,
    ))
}

/// Whether the grant's list allows `program` (as requested), which
/// resolved to `resolved` on the child's `PATH`. An entry matches what was
/// requested exactly, or, resolved the same way, the same program: entry
/// `/usr/bin/git` allows a request for `git` that resolves there, entry
/// `git` a request for `/usr/bin/git` if `git` resolves there. So
/// `/tmp/x/git` never passes as `git`.
fn command_allowed(
    rule: &CommandRule,
    program: &str,
    resolved: Option<&str>,
    find: impl Fn(&str) -> Option<String>,
) -> bool {
    match rule {
        CommandRule::Any => true,
        CommandRule::Listed(entries) => {
            entries.contains(program)
                || resolved.is_some_and(|resolved| {
                    entries.iter().any(|entry| {
                        entry == resolved
                            || (!entry.starts_with('/') && find(entry).as_deref() == Some(resolved))
                    })
                })
        }
    }
}

/// `command` is a [`Target::Command`].
fn shell(policy: &Policy, grants: &[&Grant], principal: &str, command: &Target) -> Decision {
    let cap = Some(Capability::Shell);
    let Target::Command {
        program,
        args,
        cwd,
        env,
        pty,
        lookup,
    } = command
    else {
        return Decision::deny(Denial::InvalidRequest, cap, "not a command");
    };
    let (cwd, pty, lookup) = (cwd.as_ref(), *pty, *lookup);
    if program.is_empty()
        || program.contains('\0')
        || (program.contains('/') && !program.starts_with('/'))
    {
        return Decision::deny(
            Denial::InvalidRequest,
            cap,
            "the program must be a bare name or an absolute path",
        );
    }
    let mut last_refusal: Option<Refusal> = None;
    for g in grants {
        let Some(shell) = &g.shell else { continue };
        let mut child_env: BTreeMap<String, String> = env
            .iter()
            .filter(|(k, _)| shell.env_allow.contains(k))
            .cloned()
            .collect();
        child_env.extend(shell.env_set.clone());
        let find = |name: &str| {
            let path = child_env.get("PATH")?;
            (lookup?.0)(path, name).filter(|found| found.starts_with('/'))
        };
        let resolved = match program.starts_with('/') {
            true => Some(program.to_string()),
            false => find(program),
        };
        if !command_allowed(&shell.commands, program, resolved.as_deref(), find) {
            last_refusal = Some((
                Denial::NotGranted,
                format!("grant `{}` does not list command `{program}`", g.id),
            ));
            continue;
        }
        if pty && !shell.pty {
            last_refusal = Some((
                Denial::NotGranted,
                format!("grant `{}` does not allow terminals", g.id),
            ));
            continue;
        }
        let cwd_terms = match cwd {
            None => None,
            Some((root, path)) if shell.cwd_roots.iter().any(|r| r == root) => {
                match file_terms(policy, grants, principal, root, path, Access::Read) {
                    Ok((terms, _, _)) => Some(terms),
                    Err(refusal) => return Decision::deny(refusal.0, cap, refusal.1),
                }
            }
            Some((root, _)) => {
                last_refusal = Some((
                    Denial::NotGranted,
                    format!("grant `{}` does not allow commands in root `{root}`", g.id),
                ));
                continue;
            }
        };
        let roots = grants.iter().flat_map(|g| g.fileops.iter()).fold(
            BTreeMap::new(),
            |mut acc: BTreeMap<String, Mode>, (root, mode)| {
                let entry = acc.entry(root.clone()).or_insert(*mode);
                *entry = (*entry).max(*mode);
                acc
            },
        );
        let host_roots = roots
            .iter()
            .filter_map(|(id, mode)| Some((policy.root(id)?.host_path.clone(), *mode)))
            .collect();
        let terms = ShellTerms {
            program: resolved.map(std::path::PathBuf::from),
            host_roots,
            env: child_env,
            cwd: cwd_terms,
            max_runtime: shell.max_runtime,
            output_limit: shell.output_limit,
            pty,
            network: shell.network.clone(),
            max_processes: shell.max_processes,
            persist: shell.persist,
            idle_timeout: shell.idle_timeout,
            limits: shell.limits,
            sandbox: shell.sandbox,
            survive_revocation: shell.survive_revocation,
            roots,
        };
        let allowed = format!("grant `{}` allows command `{program}`", g.id);
        let resolved = terms
            .program
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        let (approval, rule) =
            command_approval(grants, program, resolved.as_deref(), args, allowed);
        let verdict = match approval {
            ApprovalPolicy::Allow => Verdict::Allow,
            ApprovalPolicy::Block => Verdict::Deny(Denial::Blocked),
            other => Verdict::RequireApproval(other),
        };
        return Decision {
            verdict,
            rule,
            grant: Some(g.id.clone()),
            capability: cap,
            terms: Terms::Shell(terms),
        };
    }
    match last_refusal {
        Some((denial, rule)) => Decision::deny(denial, cap, rule),
        None => not_granted(cap, principal, "shell"),
    }
}

/// The strictest approval any shell grant's `approval` patterns give this
/// command line (`program arg …`, and the same with the resolved program),
/// and the rule that says so.
fn command_approval(
    grants: &[&Grant],
    program: &str,
    resolved: Option<&str>,
    args: &[String],
    allowed: String,
) -> (ApprovalPolicy, String) {
    let line = |program: &str| {
        std::iter::once(program)
            .chain(args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let lines = [Some(line(program)), resolved.map(line)];
    let (mut approval, mut rule) = (ApprovalPolicy::Allow, allowed);
    for g in grants {
        let Some(shell) = &g.shell else { continue };
        for ((pattern, policy), matcher) in shell.approval.iter().zip(&shell.approval_matchers) {
            let matches = lines.iter().flatten().any(|l| matcher.is_match(l));
            if *policy > approval && matches {
                approval = *policy;
                rule = format!(
                    "{}; grant `{}` makes it {} (`{pattern}`)",
                    rule.split("; grant").next().unwrap_or_default(),
                    g.id,
                    policy.as_str()
                );
            }
        }
    }
    (approval, rule)
}

fn tool(policy: &Policy, grants: &[&Grant], principal: &str, name: &str) -> Decision {
    let cap = Some(Capability::Tools);
    // Not granted, whether or not the tool exists (as for roots); only a
    // name the principal's grants match can be unknown.
    let Some(allowing) = grants
        .iter()
        .find(|g| g.tools.as_ref().is_some_and(|t| t.allow_set.is_match(name)))
    else {
        return not_granted(cap, principal, &format!("tool `{name}`"));
    };
    let Some(tool) = policy.tool(name) else {
        return Decision::deny(
            Denial::UnknownTool,
            cap,
            format!("tool `{name}` is not defined"),
        );
    };
    // Strictest of the tool's own policy and every matching override.
    let mut approval = tool.approval_policy;
    let mut rule = format!(
        "grant `{}` allows tool `{name}`; the tool's approval policy is {}",
        allowing.id,
        approval.as_str()
    );
    for g in grants {
        let Some(tools) = &g.tools else { continue };
        for ((pattern, policy), matcher) in tools.approval.iter().zip(&tools.approval_matchers) {
            if *policy > approval && matcher.is_match(name) {
                approval = *policy;
                rule = format!(
                    "grant `{}` allows tool `{name}`; grant `{}` makes it {} (`{pattern}`)",
                    allowing.id,
                    g.id,
                    policy.as_str()
                );
            }
        }
    }
    let verdict = match approval {
        ApprovalPolicy::Allow => Verdict::Allow,
        ApprovalPolicy::Block => Verdict::Deny(Denial::Blocked),
        other => Verdict::RequireApproval(other),
    };
    Decision {
        verdict,
        rule,
        grant: Some(allowing.id.clone()),
        capability: cap,
        terms: Terms::Tool {
            name: name.to_string(),
            risk: tool.risk,
        },
    }
}

/// The principal whose public key is `key`, if any.
pub fn principal_by_key<'p>(policy: &'p Policy, key: &[u8; 32]) -> Option<&'p Principal> {
    policy
        .principals
        .iter()
        .find(|p| p.public_key.as_ref() == Some(key))
}

/// The principal a local process of user `uid` is, on the environment
/// socket (`unix_uid`).
pub fn principal_by_uid(policy: &Policy, uid: u32) -> Option<&Principal> {
    policy.principals.iter().find(|p| p.unix_uid == Some(uid))
}

/// The principal whose token hashes to a configured `token_hash`. Every
/// principal's hash is compared, in constant time, so timing does not tell
/// which (or whether any) matched.
pub fn principal_by_token<'p>(policy: &'p Policy, token: &str) -> Option<&'p Principal> {
    use sha2::{Digest, Sha256};
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let mut found = None;
    for p in &policy.principals {
        if let Some(hash) = &p.token_sha256
            && bool::from(hash.ct_eq(&digest))
            && found.is_none()
        {
            found = Some(p);
        }
    }
    found
}

/// What a principal may use now, for the provider's `hello`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub fileops: BTreeMap<String, Mode>,
    pub shell: bool,
    pub pty: bool,
    /// Whether every shell grant keeps processes past their session
    /// (`persist`): only then can a runtime count on it.
    pub persist: bool,
    /// The roots commands may run in, of every shell grant.
    pub cwd_roots: BTreeSet<String>,
    pub tools: Vec<String>,
    pub scripts: bool,
    pub resources: bool,
    /// Whether the gateway may upload artifacts for the principal.
    pub artifacts: bool,
    /// Resources one session may hold: the largest `max_resources` of the
    /// principal's `resources` grants (64 where none says).
    pub max_resources: u32,
}

/// `max_resources` where no `resources` grant says.
pub const DEFAULT_MAX_RESOURCES: u32 = 64;

/// Whether grant `g` gives the `resources` capability: a `resources`
/// table, or file access, which makes resources (watches) to list and
/// dispose of. (A command's processes have `shell.list` and
/// `shell.cancel`.)
fn grants_resources(g: &Grant) -> bool {
    g.resources.is_some() || !g.fileops.is_empty()
}

/// The tools `principal` may call now, by name and descriptor (what
/// `tool.list` answers and a hello's updates announce), in the policy's
/// order, with the approval each needs.
pub fn tool_descriptors(
    policy: &Policy,
    principal: &str,
    now: jiff::Timestamp,
) -> Vec<(String, serde_json::Value)> {
    policy
        .tools
        .iter()
        .filter_map(|tool| {
            let query = Query {
                method: "tool.call".into(),
                target: Target::Tool {
                    name: tool.name.clone(),
                },
            };
            let approval = match decide(policy, principal, &query, now).verdict {
                Verdict::Allow => "allow",
                Verdict::RequireApproval(p) => p.as_str(),
                Verdict::Deny(_) => return None,
            };
            let descriptor = serde_json::json!({
                "name": tool.name,
                "title": tool.title,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "capability": "tools",
                "risk": tool.risk,
                "approval_policy": approval,
            });
            Some((tool.name.clone(), descriptor))
        })
        .collect()
}

/// The capability `method` belongs to, or `None` for a method no
/// capability serves (or one this gateway does not provide). Providers
/// declare theirs; a test checks that the two agree.
pub fn capability_of(method: &str) -> Option<Capability> {
    classify(method).ok().map(|(capability, _)| capability)
}

/// The union of the principal's active grants; empty when the principal
/// may not act.
pub fn summary(policy: &Policy, principal_id: &str, now: jiff::Timestamp) -> Summary {
    let mut out = Summary::default();
    if principal_status(policy, principal_id, now).is_err() {
        return out;
    }
    let mut persist = true;
    for g in active_grants(policy, principal_id, now) {
        for (root, mode) in &g.fileops {
            let entry = out.fileops.entry(root.clone()).or_insert(*mode);
            *entry = (*entry).max(*mode);
        }
        if let Some(shell) = &g.shell {
            out.shell = true;
            out.pty |= shell.pty;
            persist &= shell.persist;
            out.cwd_roots.extend(shell.cwd_roots.iter().cloned());
        }
        out.scripts |= g.scripts.is_some();
        out.resources |= grants_resources(g);
        out.artifacts |= g.artifacts.is_some();
        if let Some(r) = &g.resources {
            out.max_resources = out.max_resources.max(r.max_resources);
        }
    }
    out.persist = out.shell && persist;
    if out.resources && out.max_resources == 0 {
        out.max_resources = DEFAULT_MAX_RESOURCES;
    }
    out.tools = policy
        .tools
        .iter()
        .filter(|t| {
            let query = Query {
                method: "tool.call".into(),
                target: Target::Tool {
                    name: t.name.clone(),
                },
            };
            !matches!(
                decide(policy, principal_id, &query, now).verdict,
                Verdict::Deny(_)
            )
        })
        .map(|t| t.name.clone())
        .collect();
    out
}

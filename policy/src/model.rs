//! The validated policy: every reference resolved, every value in range.
//! Built only by `load.rs`; read by `decide.rs` and by the daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A loaded, validated policy file.
#[derive(Debug)]
pub struct Policy {
    /// SHA-256 (hex) of the file's bytes: identifies this version of the
    /// policy in the audit log (shared by every entry it decides).
    pub generation: std::sync::Arc<str>,
    pub principals: Vec<Principal>,
    pub roots: Vec<Root>,
    pub grants: Vec<Grant>,
    pub tools: Vec<Tool>,
    pub mcp_servers: Vec<McpServer>,
}

#[derive(Debug, Clone)]
pub struct Principal {
    pub id: String,
    pub description: Option<String>,
    pub public_key: Option<[u8; 32]>,
    /// SHA-256 of the bearer token; the token itself is never stored.
    pub token_sha256: Option<[u8; 32]>,
    /// A local process of this user, on the environment socket
    /// (`SO_PEERCRED`).
    pub unix_uid: Option<u32>,
    pub expires_at: Option<jiff::Timestamp>,
    pub disabled: bool,
}

#[derive(Debug, Clone)]
pub struct Root {
    pub id: String,
    pub description: Option<String>,
    /// Absolute and lexically normalised. Its existence is not checked here
    /// (the policy crate reads no file but the policy): see `portcullis doctor`.
    pub host_path: PathBuf,
    /// What clients see, e.g. `/workspace/main`.
    pub virtual_path: String,
    pub follow_symlinks: bool,
}

#[derive(Debug, Clone)]
pub struct Grant {
    pub id: String,
    pub description: Option<String>,
    pub principals: Vec<String>,
    pub expires_at: Option<jiff::Timestamp>,
    /// Root id → mode.
    pub fileops: BTreeMap<String, Mode>,
    pub shell: Option<ShellGrant>,
    pub tools: Option<ToolsGrant>,
    pub scripts: Option<ScriptLimits>,
    pub resources: Option<ResourcesGrant>,
    pub artifacts: Option<ArtifactsGrant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Ro,
    Rw,
}

#[derive(Debug, Clone)]
pub struct ShellGrant {
    pub commands: CommandRule,
    /// Roots a command may run in; empty means none (only the default cwd).
    pub cwd_roots: Vec<String>,
    pub env_allow: BTreeSet<String>,
    pub env_set: BTreeMap<String, String>,
    pub max_runtime: Duration,
    pub output_limit: u64,
    pub pty: bool,
    pub network: Network,
    pub max_processes: u32,
    /// Whether processes survive the session that started them.
    pub persist: bool,
    /// A persistent process nobody follows is ended after this long without
    /// output, input or attach; an exited one is forgotten.
    pub idle_timeout: Duration,
    pub limits: ProcessLimits,
    /// What happens when the host cannot confine a command.
    pub sandbox: SandboxMode,
    /// Whether a process keeps running when its grant is revoked (by a
    /// reload or an expiry); by default it is killed.
    pub survive_revocation: bool,
    /// Command-line glob → the approval a matching command needs (the
    /// strictest match wins, as for tools).
    pub approval: Vec<(String, ApprovalPolicy)>,
    pub(crate) approval_matchers: Vec<globset::GlobMatcher>,
}

/// When the host lacks a confinement mechanism a command needs (Landlock;
/// for a denied network Landlock ABI 6 and seccomp), a grant either refuses to run commands or runs
/// them with what the host has, recording a warning in the audit entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    #[default]
    Require,
    BestEffort,
}

/// Resource limits every child of a grant runs under (rlimits, and its
/// cgroup's where the daemon can make one); `None` is no limit of the
/// grant's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLimits {
    /// Bytes of address space (`RLIMIT_AS`).
    pub memory: Option<u64>,
    /// Bytes one file may grow to (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// Bytes each of a command's own `/tmp` and `/dev/shm` may hold
    /// (otherwise `memory`, else the launcher's default).
    pub tmp: Option<u64>,
    /// Open descriptors (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Thousandths of a CPU the command's cgroup may use (`cpu.max`).
    pub cpu_millis: Option<u64>,
    /// Processes and threads the command's cgroup may hold at once
    /// (`pids.max`; otherwise `max_processes` and the sandbox's own).
    pub pids: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandRule {
    Any,
    /// Entries with a `/` match that exact program path; bare names match a
    /// program requested by that bare name (resolved later through the
    /// grant's `PATH`, which the operator controls).
    Listed(BTreeSet<String>),
}

/// What a grant's commands may reach over the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// The host's network, as the daemon has it.
    Allow,
    /// None: an empty network namespace.
    Deny,
    /// Only what the allow-list names, through the gateway's egress proxy
    /// (`network = { allow = [...] }`).
    Egress(std::sync::Arc<crate::egress::Egress>),
}

/// As the policy writes it.
impl Serialize for Network {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        match self {
            Self::Allow => s.serialize_str("allow"),
            Self::Deny => s.serialize_str("deny"),
            Self::Egress(egress) => {
                let texts: Vec<&str> = egress.entries.iter().map(|d| d.text.as_str()).collect();
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("allow", &texts)?;
                map.end()
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct ToolsGrant {
    /// Tool names or globs (`fmt_*`).
    pub allow: Vec<String>,
    pub(crate) allow_set: globset::GlobSet,
    /// Glob → stricter approval policy, in file order.
    pub approval: Vec<(String, ApprovalPolicy)>,
    pub(crate) approval_matchers: Vec<globset::GlobMatcher>,
}

/// Limits for `script.run`. A request may ask for less, never more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScriptLimits {
    pub max_operations: u64,
    #[serde(with = "seconds")]
    pub max_wall_time: Duration,
    pub max_string_size: u64,
    pub max_array_len: u64,
    pub max_map_len: u64,
    pub max_call_depth: u64,
    pub max_tool_calls: u64,
    pub max_output: u64,
    /// Whether `call_tool` may reach a tool the runtime holds (a `tool.call`
    /// request to the runtime) when the gateway has none of that name.
    #[serde(default)]
    pub runtime_tools: bool,
}

impl ScriptLimits {
    pub const DEFAULT: Self = Self {
        max_operations: 10_000_000,
        max_wall_time: Duration::from_secs(10),
        max_string_size: 1 << 20,
        max_array_len: 100_000,
        max_map_len: 100_000,
        max_call_depth: 64,
        max_tool_calls: 1_000,
        max_output: 1 << 20,
        runtime_tools: false,
    };

    /// The tighter of each limit.
    pub fn min(self, other: Self) -> Self {
        Self {
            max_operations: self.max_operations.min(other.max_operations),
            max_wall_time: self.max_wall_time.min(other.max_wall_time),
            max_string_size: self.max_string_size.min(other.max_string_size),
            max_array_len: self.max_array_len.min(other.max_array_len),
            max_map_len: self.max_map_len.min(other.max_map_len),
            max_call_depth: self.max_call_depth.min(other.max_call_depth),
            max_tool_calls: self.max_tool_calls.min(other.max_tool_calls),
            max_output: self.max_output.min(other.max_output),
            runtime_tools: self.runtime_tools && other.runtime_tools,
        }
    }
}

mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourcesGrant {
    pub max_resources: u32,
}

/// `max_size` of an artifacts grant that names none.
pub const DEFAULT_ARTIFACT_MAX_SIZE: u64 = 64 << 20;

/// What the gateway may upload to the runtime's storage for the
/// principal (the spec's artifacts, provider → runtime).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactsGrant {
    /// `type/subtype`, `type/*` or `*/*`, lower case.
    pub mime_types: Vec<String>,
    /// Bytes one artifact may hold.
    pub max_size: u64,
    /// Where uploads may go (the runtime's storage), as an egress
    /// allow-list: the upload URL's host and port must be listed, and a
    /// name must resolve to public addresses unless an address entry
    /// covers them.
    pub destinations: crate::egress::Egress,
}

impl ArtifactsGrant {
    /// Whether `mime_type` (its parameters ignored) is one of the grant's.
    pub fn allows_type(&self, mime_type: &str) -> bool {
        let essence = mime_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let Some((kind, _)) = essence.split_once('/') else {
            return false;
        };
        self.mime_types.iter().any(|allowed| {
            allowed == "*/*"
                || *allowed == essence
                || allowed
                    .strip_suffix("/*")
                    .is_some_and(|family| family == kind)
        })
    }
}

#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub title: Option<String>,
    pub description: String,
    /// A JSON Schema (checked to compile when the policy loads).
    pub input_schema: serde_json::Value,
    pub risk: Risk,
    pub approval_policy: ApprovalPolicy,
    pub action: ToolAction,
    /// Names of secrets this tool may read (a script's; an MCP server's
    /// secrets are its own).
    pub secrets: Vec<String>,
}

/// What a tool call runs.
#[derive(Debug, Clone)]
pub enum ToolAction {
    /// A Rhai script; a relative path is taken from the policy file's
    /// directory.
    Script(PathBuf),
    /// A tool of one of the policy's `[[mcp_server]]`s.
    Mcp { server: String, tool: String },
}

/// How the daemon reaches an MCP server.
#[derive(Debug, Clone, Serialize)]
pub enum McpReach {
    /// It starts the server: the program (an absolute path, or a name
    /// looked up on the `PATH` of `env`) and its arguments; MCP over its
    /// stdin and stdout.
    Start { command: Vec<String> },
    /// A server already running on this host: Streamable HTTP at a
    /// loopback `http://` URL, with a bearer token from a secret.
    Http {
        url: String,
        bearer_secret: Option<String>,
    },
}

/// A local MCP server the daemon starts in the command sandbox (the same
/// world, Landlock, seccomp and cgroup as `shell.*`), speaking MCP over
/// its stdin and stdout. Its tools are reached only through `[[tool]]`s
/// that name it.
#[derive(Debug, Clone, Serialize)]
pub struct McpServer {
    pub name: String,
    pub description: Option<String>,
    pub reach: McpReach,
    /// Roots its world shows, each `ro` or `rw`.
    pub roots: BTreeMap<String, Mode>,
    /// The root it starts in.
    pub cwd: Option<String>,
    /// Its environment, besides its secrets (a `PATH` of the usual
    /// directories when none is set).
    pub env: BTreeMap<String, String>,
    /// Environment variable → secret name: given to the server, and
    /// redacted from everything its tools answer.
    pub secrets: BTreeMap<String, String>,
    pub network: Network,
    /// How long one tool call may take; past it the call fails and the
    /// server, taken to hang, is restarted.
    pub call_timeout: Duration,
    pub limits: ProcessLimits,
    pub sandbox: SandboxMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Low,
    Medium,
    High,
    Critical,
}

/// How a tool call is approved, in order of strictness: when policies meet,
/// the later (stricter) one wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Runs without asking.
    Allow,
    /// Asks once per principal and tool; the answer is remembered.
    AskOnce,
    /// Asks once per `run_id` of the request context.
    AskOncePerRun,
    /// Asks every time.
    AlwaysAsk,
    /// Never runs.
    Block,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Critical => "critical",
        }
    }
}

impl ApprovalPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::AskOnce => "ask_once",
            Self::AskOncePerRun => "ask_once_per_run",
            Self::AlwaysAsk => "always_ask",
            Self::Block => "block",
        }
    }
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ro => "ro",
            Self::Rw => "rw",
        }
    }
}

impl Policy {
    pub fn principal(&self, id: &str) -> Option<&Principal> {
        self.principals.iter().find(|p| p.id == id)
    }

    pub fn root(&self, id: &str) -> Option<&Root> {
        self.roots.iter().find(|r| r.id == id)
    }

    pub fn grant(&self, id: &str) -> Option<&Grant> {
        self.grants.iter().find(|g| g.id == id)
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    pub fn mcp_server(&self, name: &str) -> Option<&McpServer> {
        self.mcp_servers.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serialised_names() {
        for risk in [Risk::Low, Risk::Medium, Risk::High, Risk::Critical] {
            assert_eq!(serde_json::to_value(risk).unwrap(), risk.as_str());
        }
        for policy in [
            ApprovalPolicy::Allow,
            ApprovalPolicy::AskOnce,
            ApprovalPolicy::AskOncePerRun,
            ApprovalPolicy::AlwaysAsk,
            ApprovalPolicy::Block,
        ] {
            assert_eq!(serde_json::to_value(policy).unwrap(), policy.as_str());
        }
    }
}

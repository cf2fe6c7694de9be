//! The policy file as written: serde structs that mirror the TOML exactly,
//! with spans kept on everything a later check may need to point at.
//! `deny_unknown_fields` everywhere, so a misspelt key is an error, not a
//! silently ignored grant. `load.rs` turns this into the validated model.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use crate::model::{ApprovalPolicy, Mode, Risk, SandboxMode};
use crate::units;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    #[serde(default)]
    pub principal: Vec<RawPrincipal>,
    #[serde(default)]
    pub root: Vec<RawRoot>,
    #[serde(default)]
    pub grant: Vec<RawGrant>,
    #[serde(default)]
    pub tool: Vec<RawTool>,
    #[serde(default)]
    pub mcp_server: Vec<RawMcpServer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrincipal {
    pub id: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub public_key: Option<Spanned<String>>,
    #[serde(default)]
    pub token_hash: Option<Spanned<String>>,
    #[serde(default)]
    pub unix_uid: Option<Spanned<u32>>,
    #[serde(default)]
    pub expires_at: Option<Expiry>,
    #[serde(default)]
    pub disabled: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoot {
    pub id: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub path: Spanned<String>,
    pub virtual_path: Spanned<String>,
    #[serde(default)]
    pub follow_symlinks: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGrant {
    pub id: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub principals: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub expires_at: Option<Expiry>,
    #[serde(default)]
    pub fileops: BTreeMap<Spanned<String>, Mode>,
    #[serde(default)]
    pub shell: Option<RawShell>,
    #[serde(default)]
    pub tools: Option<RawTools>,
    #[serde(default)]
    pub scripts: Option<RawScripts>,
    #[serde(default)]
    pub resources: Option<RawResources>,
    #[serde(default)]
    pub artifacts: Option<RawArtifacts>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawShell {
    pub commands: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub cwd_roots: Vec<Spanned<String>>,
    #[serde(default)]
    pub env_allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub env_set: BTreeMap<Spanned<String>, String>,
    #[serde(default)]
    pub max_runtime: Option<DurationValue>,
    #[serde(default)]
    pub output_limit: Option<SizeValue>,
    #[serde(default)]
    pub pty: bool,
    #[serde(default)]
    pub network: Option<Spanned<RawNetwork>>,
    #[serde(default)]
    pub max_processes: Option<Spanned<u32>>,
    #[serde(default)]
    pub persist: bool,
    #[serde(default)]
    pub idle_timeout: Option<DurationValue>,
    #[serde(default)]
    pub max_memory: Option<SizeValue>,
    #[serde(default)]
    pub max_file_size: Option<SizeValue>,
    #[serde(default)]
    pub max_tmp: Option<Spanned<SizeValue>>,
    #[serde(default)]
    pub max_open_files: Option<Spanned<u64>>,
    #[serde(default)]
    pub max_cpu: Option<Spanned<f64>>,
    #[serde(default)]
    pub max_pids: Option<Spanned<u64>>,
    #[serde(default)]
    pub sandbox: SandboxMode,
    #[serde(default)]
    pub survive_revocation: Option<Spanned<bool>>,
    /// Command-line glob → the approval a matching command needs.
    #[serde(default)]
    pub approval: BTreeMap<Spanned<String>, ApprovalPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTools {
    pub allow: Vec<Spanned<String>>,
    /// Tool name or glob → a stricter approval policy for this grant.
    #[serde(default)]
    pub approval: BTreeMap<Spanned<String>, ApprovalPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScripts {
    #[serde(default)]
    pub max_operations: Option<u64>,
    #[serde(default)]
    pub max_wall_time: Option<DurationValue>,
    #[serde(default)]
    pub max_string_size: Option<SizeValue>,
    #[serde(default)]
    pub max_array_len: Option<u64>,
    #[serde(default)]
    pub max_map_len: Option<u64>,
    #[serde(default)]
    pub max_call_depth: Option<u64>,
    #[serde(default)]
    pub max_tool_calls: Option<u64>,
    #[serde(default)]
    pub max_output: Option<SizeValue>,
    #[serde(default)]
    pub runtime_tools: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawResources {
    #[serde(default)]
    pub max_resources: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawArtifacts {
    pub mime_types: Spanned<Vec<Spanned<String>>>,
    pub destinations: Spanned<Vec<Spanned<String>>>,
    #[serde(default)]
    pub max_size: Option<SizeValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTool {
    pub name: Spanned<String>,
    #[serde(default)]
    pub title: Option<String>,
    pub description: String,
    pub input_schema: Spanned<toml::Table>,
    pub risk: Risk,
    pub approval_policy: ApprovalPolicy,
    /// What the tool runs: a Rhai script, or a tool of an `[[mcp_server]]`.
    #[serde(default)]
    pub script: Option<Spanned<String>>,
    #[serde(default)]
    pub mcp: Option<Spanned<RawMcpTool>>,
    #[serde(default)]
    pub secrets: Vec<Spanned<String>>,
}

/// `mcp = { server = "notes", tool = "add_note" }` (`tool` defaults to the
/// `[[tool]]`'s name).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMcpTool {
    pub server: Spanned<String>,
    #[serde(default)]
    pub tool: Option<Spanned<String>>,
}

/// `[[mcp_server]]`: a local MCP server the daemon starts in the command
/// sandbox and speaks to over its stdin and stdout.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMcpServer {
    pub name: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// A server the gateway starts (stdio)…
    #[serde(default)]
    pub command: Option<Spanned<Vec<Spanned<String>>>>,
    /// …or one it reaches: Streamable HTTP on loopback.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// The secret sent as the bearer token to a `url` server.
    #[serde(default)]
    pub bearer_secret: Option<Spanned<String>>,
    /// Root id → `"ro"` or `"rw"`: what of the host its world shows.
    #[serde(default)]
    pub roots: BTreeMap<Spanned<String>, Mode>,
    /// A root it starts in (`/` of its world otherwise).
    #[serde(default)]
    pub cwd: Option<Spanned<String>>,
    #[serde(default)]
    pub env: BTreeMap<Spanned<String>, String>,
    /// Environment variable → the name of the secret it is set to.
    #[serde(default)]
    pub secrets: BTreeMap<Spanned<String>, Spanned<String>>,
    #[serde(default)]
    pub network: Option<Spanned<RawNetwork>>,
    #[serde(default)]
    pub call_timeout: Option<DurationValue>,
    #[serde(default)]
    pub max_memory: Option<SizeValue>,
    #[serde(default)]
    pub max_pids: Option<Spanned<u64>>,
    #[serde(default)]
    pub sandbox: SandboxMode,
}

/// `expires_at`: a TOML offset date-time (`2027-01-01T00:00:00Z`) or the
/// same as a string.
pub(crate) struct Expiry(pub jiff::Timestamp);

impl<'de> Deserialize<'de> for Expiry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = match toml::Value::deserialize(deserializer)? {
            toml::Value::Datetime(datetime) => datetime.to_string(),
            toml::Value::String(text) => text,
            _ => return Err(serde::de::Error::custom(EXPIRY_HELP)),
        };
        text.parse()
            .map(Expiry)
            .map_err(|_| serde::de::Error::custom(EXPIRY_HELP))
    }
}

const EXPIRY_HELP: &str = "expected a date-time with an offset, like 2027-01-01T00:00:00Z";

/// A byte count: an integer or a string like `"16 MiB"`.
pub(crate) struct SizeValue(pub u64);

impl<'de> Deserialize<'de> for SizeValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match IntOrText::deserialize(deserializer)? {
            IntOrText::Int(n) => u64::try_from(n)
                .map(SizeValue)
                .map_err(|_| serde::de::Error::custom("a size cannot be negative")),
            IntOrText::Text(text) => units::parse_size(&text)
                .map(SizeValue)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A duration: whole seconds as an integer, or a string like `"10m"`.
pub(crate) struct DurationValue(pub Duration);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match IntOrText::deserialize(deserializer)? {
            IntOrText::Int(n) => u64::try_from(n)
                .map(|s| DurationValue(Duration::from_secs(s)))
                .map_err(|_| serde::de::Error::custom("a duration cannot be negative")),
            IntOrText::Text(text) => units::parse_duration(&text)
                .map(DurationValue)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "an integer or a string")]
enum IntOrText {
    Int(i64),
    Text(String),
}

/// `network = "allow" | "deny" | { allow = [...] }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawNetwork {
    Word(String),
    AllowList(RawAllowList),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAllowList {
    pub allow: Vec<String>,
}

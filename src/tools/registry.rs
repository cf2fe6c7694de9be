//! The operator's tools as the current policy defines them, compiled once
//! per policy (a reload compiles again, so an edited tool script takes
//! effect at the next reload): each tool's Rhai AST and its input
//! schema's validator. And the secrets tools may read, with redaction.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use portcullis_policy::{Policy, ScriptLimits, Tool, ToolAction};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use zeroize::Zeroizing;

use super::engine;
use portcullis_wire::frame::{ErrorBody, ErrorCode};

/// Longest tool script read from disk.
const MAX_SCRIPT_BYTES: u64 = 1 << 20;
/// Longest secret value read.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

pub struct CompiledTool {
    pub tool: Tool,
    /// The script, or why it cannot run; `None` for an MCP server's tool.
    pub ast: Option<Result<rhai::AST, ScriptError>>,
    pub schema: Result<jsonschema::Validator, jsonschema::ValidationError<'static>>,
}

/// Why a tool's script cannot run; reported when the tool is called.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{path} does not compile: {source}")]
    Compile {
        path: std::path::PathBuf,
        source: rhai::ParseError,
    },
}

pub struct Registry {
    policy: Arc<Policy>,
    pub tools: Vec<CompiledTool>,
}

impl Registry {
    /// The policy these tools are from.
    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    /// Compiles every tool of `policy` (the provider keeps the last one).
    pub fn compile(policy: Arc<Policy>) -> Self {
        let limits = ScriptLimits::DEFAULT;
        let watch = engine::Watch::new(Instant::now(), CancellationToken::new());
        let engine = engine::sandboxed(&limits, &watch);
        let tools = policy
            .tools
            .iter()
            .map(|tool| {
                let ast = match &tool.action {
                    ToolAction::Script(script) => Some(compile_script(&engine, script)),
                    ToolAction::Mcp { .. } => None,
                };
                if let Some(Err(e)) = &ast {
                    tracing::warn!(tool = %tool.name, "tool script: {e}");
                }
                let schema = jsonschema::validator_for(&tool.input_schema);
                CompiledTool {
                    tool: tool.clone(),
                    ast,
                    schema,
                }
            })
            .collect();
        Self { policy, tools }
    }

    /// What makes a tool unusable — its script cannot be read or does not
    /// compile, its input schema is not one — for `policy check`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for compiled in &self.tools {
            let name = &compiled.tool.name;
            if let Some(Err(e)) = &compiled.ast {
                problems.push(format!("tool `{name}`: {e}"));
            }
            if let Err(e) = &compiled.schema {
                problems.push(format!(
                    "tool `{name}`: input_schema is not a JSON Schema: {e}"
                ));
            }
        }
        problems
    }

    pub fn tool(&self, name: &str) -> Result<&CompiledTool, ErrorBody> {
        let found = self.tools.iter().find(|t| t.tool.name == name);
        found.ok_or_else(|| {
            ErrorBody::new(ErrorCode::NotFound, format!("tool `{name}` is not defined"))
        })
    }
}

impl CompiledTool {
    /// Checks `args` against the input schema; the error names each field
    /// that is wrong and why.
    pub fn validate(&self, args: &Value) -> Result<(), ErrorBody> {
        let validator = self.schema.as_ref().map_err(|e| {
            ErrorBody::new(
                ErrorCode::ProviderError,
                format!(
                    "tool `{}` has an unusable input_schema: {e}",
                    self.tool.name
                ),
            )
        })?;
        let problems: Vec<String> = validator
            .iter_errors(args)
            .take(10)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "/".to_string() } else { at };
                format!("{at}: {e}")
            })
            .collect();
        if problems.is_empty() {
            return Ok(());
        }
        Err(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!(
                "arguments of tool `{}` do not match its input_schema: {}",
                self.tool.name,
                problems.join("; ")
            ),
        )
        .with_details(serde_json::json!({"errors": problems})))
    }
}

fn compile_script(engine: &rhai::Engine, script: &Path) -> Result<rhai::AST, ScriptError> {
    let text = read_limited(script, MAX_SCRIPT_BYTES).map_err(|source| ScriptError::Read {
        path: script.to_path_buf(),
        source,
    })?;
    engine
        .compile(String::from_utf8_lossy(&text).as_ref())
        .map_err(|source| ScriptError::Compile {
            path: script.to_path_buf(),
            source,
        })
}

fn read_limited(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut data = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(std::io::Error::other(format!("longer than {max} bytes")));
    }
    Ok(data)
}

/// The secrets one tool may read, loaded when it is called: name and
/// value. Values are zeroized when dropped.
#[derive(Default)]
pub struct Secrets {
    values: Vec<(String, Zeroizing<String>)>,
}

impl Secrets {
    /// Reads each of `names` from `dir` (one file per secret; a trailing
    /// newline is dropped). A secret that cannot be read is an error that
    /// names the secret (the log names its file), never its content.
    pub fn load(names: &[String], dir: Option<&Path>) -> Result<Self, ErrorBody> {
        let mut values = Vec::new();
        for name in names {
            let Some(dir) = dir else {
                return Err(ErrorBody::new(
                    ErrorCode::ProviderError,
                    format!(
                        "secret `{name}`: no secrets directory (set secrets_dir in portcullis.toml, or LoadCredential= under systemd)"
                    ),
                ));
            };
            let path = dir.join(name);
            let data = Zeroizing::new(read_limited(&path, MAX_SECRET_BYTES).map_err(|e| {
                // The host path is for the operator's log, not the caller.
                tracing::warn!("secret `{name}` ({}): {e}", path.display());
                ErrorBody::new(
                    ErrorCode::ProviderError,
                    format!("secret `{name}` cannot be read (the gateway's log says why)"),
                )
            })?);
            let text = Zeroizing::new(String::from_utf8_lossy(&data).into_owned());
            let value = Zeroizing::new(text.strip_suffix('\n').unwrap_or(&text).to_string());
            values.push((name.clone(), value));
        }
        Ok(Self { values })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `text` with every secret value replaced by `[REDACTED:name]`: as it
    /// is, and in the escaped forms a script gets without changing a
    /// character of it — inside a JSON string, and as Rhai's `debug`,
    /// `to_debug` and a map's display quote it (Rust's `{:?}`). The
    /// longest forms go first, so none is left half replaced.
    pub fn redact_text(&self, text: &str) -> String {
        let mut forms: Vec<(Zeroizing<String>, &str)> = Vec::new();
        for (name, value) in &self.values {
            let escaped = [
                serde_json::to_string(value.as_str()).unwrap_or_default(),
                format!("{:?}", value.as_str()),
            ];
            let inner = escaped
                .into_iter()
                .map(|quoted| Zeroizing::new(quoted[1..quoted.len().max(2) - 1].to_string()));
            for form in std::iter::once(value.clone()).chain(inner) {
                if !form.is_empty() && !forms.iter().any(|(f, _)| **f == *form) {
                    forms.push((form, name.as_str()));
                }
            }
        }
        forms.sort_by_key(|(form, _)| std::cmp::Reverse(form.len()));
        let mut out = text.to_string();
        for (form, name) in &forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), &format!("[REDACTED:{name}]"));
            }
        }
        out
    }

    /// Every string (and key) in `value`, redacted.
    pub fn redact(&self, value: Value) -> Value {
        if self.values.is_empty() {
            return value;
        }
        match value {
            Value::String(s) => Value::String(self.redact_text(&s)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.redact_text(&k), self.redact(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    pub fn redact_error(&self, mut error: ErrorBody) -> ErrorBody {
        error.message = self.redact_text(&error.message);
        error.details = error.details.map(|d| self.redact(d));
        error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn redaction_replaces_every_occurrence_in_strings_and_keys() {
        let secrets = Secrets {
            values: vec![
                ("api".into(), Zeroizing::new("s3cr3t".into())),
                ("empty".into(), Zeroizing::new(String::new())),
            ],
        };
        let value = json!({"a": "xs3cr3ts3cr3t", "s3cr3t": [1, "s3cr3t"], "n": 5});
        assert_eq!(
            secrets.redact(value),
            json!({"a": "x[REDACTED:api][REDACTED:api]", "[REDACTED:api]": [1, "[REDACTED:api]"], "n": 5})
        );
        // An empty secret redacts nothing (it would match everywhere).
        assert_eq!(secrets.redact_text("plain"), "plain");
    }

    #[test]
    fn redaction_matches_the_json_and_debug_escaped_forms() {
        let key = "a\nb\"c\\d\u{1}é";
        let secrets = Secrets {
            values: vec![("k".into(), Zeroizing::new(key.into()))],
        };
        for text in [
            key.to_string(),
            serde_json::to_string(key).unwrap(),
            format!("{key:?}"),
            format!("{:?}", json!({"x": key})),
            json!({"x": key}).to_string(),
        ] {
            let redacted = secrets.redact_text(&text);
            assert!(redacted.contains("[REDACTED:k]"), "{text} -> {redacted}");
            assert!(
                !redacted.contains("a\\nb") && !redacted.contains("a\nb"),
                "{redacted}"
            );
        }
    }
}

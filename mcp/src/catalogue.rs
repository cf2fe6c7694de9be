//! What a principal may use, as MCP tools and resources, and how each
//! MCP call becomes one relay request. Pure: from the gateway's `hello`
//! capabilities and the principal's `tool.list`, no I/O.
//!
//! Paths are the gateway's virtual paths (`/workspace/main/src/lib.rs`):
//! a path picks the root whose virtual path holds it (the longest such),
//! and the gateway confines it there again. Only what is granted appears:
//! file tools when a root is, write tools when a root is `rw`, commands
//! with a shell grant, `run_script` with a scripts grant, each operator
//! tool the principal may call under its own name.

use portcullis_wire::frame::announced_roots;
use serde_json::{Map, Value, json};

/// A root of the grant, as the hello announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub id: String,
    pub label: String,
    pub virtual_path: String,
    pub writable: bool,
}

/// An operator tool the principal may call (`tool.list`'s descriptor).
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorTool {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub input_schema: Value,
    pub risk: Option<String>,
}

/// Why an MCP call cannot become a relay request; the caller sees the
/// message as the tool's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    UnknownTool(String),
    Arguments(String),
    NoRoot(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownTool(name) => write!(f, "no tool `{name}` (tools/list names them)"),
            Self::Arguments(why) => write!(f, "invalid arguments: {why}"),
            Self::NoRoot(why) => write!(f, "{why}"),
        }
    }
}

/// The relay request an MCP call becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayCall {
    pub method: String,
    pub params: Value,
    /// How the result is shown as text: a file's content as it is, any
    /// other result as JSON.
    pub text_field: Option<&'static str>,
    pub shape: Shape,
}

/// When the MCP call is answered, and with what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The relay result, when it comes.
    Result,
    /// `shell.start`: answered once the process runs (its `started`
    /// frame); the request goes on until the process ends.
    Started,
    /// `shell.attach`: its output gathered into the answer.
    Output,
}

/// The principal's grants, as MCP sees them.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    pub roots: Vec<Root>,
    pub shell: bool,
    pub scripts: bool,
    pub tools: Vec<OperatorTool>,
}

const BUILT_IN: &[&str] = &[
    "read_file",
    "write_file",
    "edit_file",
    "list_directory",
    "stat",
    "search_files",
    "run_command",
    "start_process",
    "read_process_output",
    "wait_process",
    "write_process_input",
    "signal_process",
    "kill_process",
    "run_script",
];

impl Catalogue {
    /// From the hello's `capabilities` and `tool.list`'s `tools`.
    pub fn new(capabilities: &Map<String, Value>, tools: &[Value]) -> Self {
        let roots = announced_roots(capabilities)
            .into_iter()
            .map(|r| Root {
                writable: r.mode == "rw",
                id: r.root_id,
                label: r.label,
                virtual_path: r.virtual_path,
            })
            .collect();
        let enabled = |name: &str| {
            capabilities
                .get(name)
                .and_then(|c| c.get("enabled"))
                .and_then(Value::as_bool)
                == Some(true)
        };
        let tools = tools
            .iter()
            .filter_map(|t| {
                let name = t.get("name")?.as_str()?.to_string();
                // A built-in name stays the built-in's; the operator's tool
                // is not offered rather than offered under another name.
                if BUILT_IN.contains(&name.as_str()) {
                    return None;
                }
                let text = |field: &str| t.get(field).and_then(Value::as_str).map(str::to_string);
                Some(OperatorTool {
                    title: text("title"),
                    description: text("description"),
                    input_schema: match t.get("input_schema") {
                        Some(schema @ Value::Object(_)) => schema.clone(),
                        _ => json!({"type": "object"}),
                    },
                    risk: text("risk"),
                    name,
                })
            })
            .collect();
        Self {
            roots,
            shell: enabled("shell"),
            scripts: enabled("scripts"),
            tools,
        }
    }

    /// The MCP tools, as `tools/list` gives them (JSON of the spec's `Tool`).
    pub fn mcp_tools(&self) -> Vec<Value> {
        let mut list = Vec::new();
        let paths = self
            .roots
            .iter()
            .map(|r| r.virtual_path.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let path = |what: &str| json!({"type": "string", "description": format!("{what}: an absolute path under one of the roots ({paths})")});
        if !self.roots.is_empty() {
            list.push(tool(
                "read_file",
                "Read a text file",
                "Read a file under the gateway's roots (UTF-8 text, at most 4 MiB a call; use offset and length for more).",
                json!({"type": "object", "required": ["path"], "properties": {
                    "path": path("the file"),
                    "offset": {"type": "integer", "minimum": 0},
                    "length": {"type": "integer", "minimum": 0}}}),
                hints(true, false, true, false),
            ));
            list.push(tool(
                "list_directory",
                "List a directory",
                "List the entries of a directory (sorted; hidden ones only when asked).",
                json!({"type": "object", "required": ["path"], "properties": {
                    "path": path("the directory"),
                    "depth": {"type": "integer", "minimum": 1, "maximum": 64},
                    "include_hidden": {"type": "boolean"}}}),
                hints(true, false, true, false),
            ));
            list.push(tool(
                "stat",
                "Describe a path",
                "A file's or directory's kind, size, mode and modification time.",
                json!({"type": "object", "required": ["path"], "properties": {"path": path("the path")}}),
                hints(true, false, true, false),
            ));
            list.push(tool(
                "search_files",
                "Search file contents",
                "Search the files under a path for a regular expression (or a literal), ripgrep style: one match per matching line.",
                json!({"type": "object", "required": ["path", "pattern"], "properties": {
                    "path": path("the file or directory to search"),
                    "pattern": {"type": "string", "minLength": 1},
                    "literal": {"type": "boolean"},
                    "case_insensitive": {"type": "boolean"},
                    "globs": {"type": "array", "items": {"type": "string"}},
                    "max_results": {"type": "integer", "minimum": 1}}}),
                hints(true, false, true, false),
            ));
        }
        if self.roots.iter().any(|r| r.writable) {
            list.push(tool(
                "write_file",
                "Write a file",
                "Write a whole file (atomically: replaced, never half-written), under a root granted read-write.",
                json!({"type": "object", "required": ["path", "content"], "properties": {
                    "path": path("the file"),
                    "content": {"type": "string"},
                    "create_parents": {"type": "boolean"}}}),
                hints(false, true, true, false),
            ));
            list.push(tool(
                "edit_file",
                "Edit a file",
                "Replace exact text in a UTF-8 file: each edit's old_text must occur once (or set replace_all); the edits apply in order, all or none, and the file is replaced atomically.",
                json!({"type": "object", "required": ["path", "edits"], "properties": {
                    "path": path("the file"),
                    "edits": {"type": "array", "minItems": 1, "maxItems": 64, "items": {
                        "type": "object", "required": ["old_text", "new_text"], "properties": {
                            "old_text": {"type": "string", "minLength": 1},
                            "new_text": {"type": "string"},
                            "replace_all": {"type": "boolean"}}}}}}),
                hints(false, true, false, false),
            ));
        }
        if self.shell {
            list.push(tool(
                "run_command",
                "Run a command",
                "Run a program with its arguments in the gateway's sandbox and return its exit code and output. The policy decides which programs and working directories are allowed.",
                json!({"type": "object", "required": ["command"], "properties": {
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                "description": "the program and its arguments, e.g. [\"ls\", \"-l\"]"},
                    "cwd": path("the working directory"),
                    "stdin": {"type": "string"},
                    "timeout_ms": {"type": "integer", "minimum": 1}}}),
                hints(false, true, false, true),
            ));
        }
        if self.shell {
            let process_id =
                json!({"type": "string", "description": "the process id start_process answered"});
            list.push(tool(
                "start_process",
                "Start a background process",
                "Start a program in the gateway's sandbox and answer at once with its process id; read its output with read_process_output or wait_process. It ends when this MCP server's connection does, unless the policy keeps processes.",
                json!({"type": "object", "required": ["command"], "properties": {
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "cwd": path("the working directory"),
                    "timeout_ms": {"type": "integer", "minimum": 1}}}),
                hints(false, true, false, true),
            ));
            let read_schema = |wait: &str| {
                json!({"type": "object", "required": ["process_id"], "properties": {
                "process_id": process_id.clone(),
                "from_seq": {"type": "integer", "minimum": 0, "description": "where to start: the next_seq an earlier read answered (default: the oldest output kept)"},
                wait: {"type": "integer", "minimum": 0}}})
            };
            list.push(tool(
                "read_process_output",
                "Read a process's output",
                "The output a process has written since from_seq (up to 1 MiB a stream), whether it still runs, and next_seq to read on from. With wait_ms, waits that long for the process to end first.",
                read_schema("wait_ms"),
                hints(true, false, true, false),
            ));
            list.push(tool(
                "wait_process",
                "Wait for a process to end",
                "Waits up to timeout_ms (default 30 s) for the process to end; answers its exit code and output, or that it still runs.",
                read_schema("timeout_ms"),
                hints(true, false, true, false),
            ));
            list.push(tool(
                "write_process_input",
                "Write to a process's input",
                "Write text to a process's standard input (or its terminal); eof closes it after.",
                json!({"type": "object", "required": ["process_id", "data"], "properties": {
                    "process_id": process_id.clone(), "data": {"type": "string"}, "eof": {"type": "boolean"}}}),
                hints(false, false, false, false),
            ));
            list.push(tool(
                "signal_process",
                "Signal a process",
                "Send a signal (TERM, INT, KILL, HUP, QUIT, USR1, USR2, STOP, CONT, WINCH) to a process and all it started.",
                json!({"type": "object", "required": ["process_id", "signal"], "properties": {
                    "process_id": process_id.clone(),
                    "signal": {"enum": ["TERM", "INT", "KILL", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT", "WINCH"]}}}),
                hints(false, true, false, false),
            ));
            list.push(tool(
                "kill_process",
                "Kill a process",
                "End a process and everything it started.",
                json!({"type": "object", "required": ["process_id"], "properties": {"process_id": process_id}}),
                hints(false, true, true, false),
            ));
        }
        if self.scripts {
            list.push(tool(
                "run_script",
                "Run a Rhai script",
                "Run a Rhai script in the gateway's script sandbox; it may call the tools, files and commands granted (each call decided and audited on its own).",
                json!({"type": "object", "required": ["source"], "properties": {
                    "source": {"type": "string"},
                    "args": {"type": "object"}}}),
                hints(false, true, false, true),
            ));
        }
        for t in &self.tools {
            let risky = matches!(t.risk.as_deref(), Some("high" | "critical"));
            let mut described = tool(
                &t.name,
                t.title.as_deref().unwrap_or(&t.name),
                t.description
                    .as_deref()
                    .unwrap_or("An operator tool of the gateway."),
                t.input_schema.clone(),
                hints(false, risky, false, true),
            );
            if t.title.is_none() {
                described.as_object_mut().map(|o| o.remove("title"));
            }
            list.push(described);
        }
        list
    }

    /// The roots as MCP resources: one directory resource each.
    pub fn mcp_resources(&self) -> Vec<Value> {
        self.roots
            .iter()
            .map(|r| {
                json!({"uri": root_uri(&r.virtual_path), "name": r.id, "title": r.label,
                       "description": format!("the gateway's root `{}` ({}), {}", r.id, r.virtual_path,
                                              if r.writable { "read-write" } else { "read-only" }),
                       "mimeType": "inode/directory"})
            })
            .collect()
    }

    /// The relay request for a `resources/read`: a directory (a URI that
    /// ends in `/`) is listed, a file read.
    pub fn resource_call(&self, uri: &str) -> Result<RelayCall, CallError> {
        let path = uri
            .strip_prefix("file://")
            .ok_or_else(|| CallError::Arguments(format!("`{uri}` is not a file:// URI")))?;
        let name = if path.ends_with('/') {
            "list_directory"
        } else {
            "read_file"
        };
        let trimmed = match path.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        };
        let mut args = Map::new();
        args.insert("path".into(), json!(trimmed));
        self.call(name, &args)
    }

    /// The relay request for MCP tool `name` with `args`.
    pub fn call(&self, name: &str, args: &Map<String, Value>) -> Result<RelayCall, CallError> {
        let relay = |method: &str, params: Value| RelayCall {
            method: method.to_string(),
            params,
            text_field: None,
            shape: Shape::Result,
        };
        let process = |extra: &[&str]| -> Result<Map<String, Value>, CallError> {
            let mut params = Map::new();
            params.insert("process_id".into(), string(args, "process_id")?);
            copy(args, &mut params, extra);
            Ok(params)
        };
        match name {
            "read_file" if !self.roots.is_empty() => {
                let mut params = self.at(args, "path")?;
                copy(args, &mut params, &["offset", "length"]);
                Ok(RelayCall {
                    text_field: Some("content"),
                    ..relay("file.read", Value::Object(params))
                })
            }
            "list_directory" if !self.roots.is_empty() => {
                let mut params = self.at(args, "path")?;
                copy(args, &mut params, &["depth"]);
                if let Some(hidden) = args.get("include_hidden") {
                    params.insert("hidden".into(), hidden.clone());
                }
                Ok(relay("file.list", Value::Object(params)))
            }
            "stat" if !self.roots.is_empty() => {
                Ok(relay("file.stat", Value::Object(self.at(args, "path")?)))
            }
            "search_files" if !self.roots.is_empty() => {
                let mut params = self.at(args, "path")?;
                params.insert("pattern".into(), string(args, "pattern")?);
                copy(
                    args,
                    &mut params,
                    &["literal", "case_insensitive", "globs", "max_results"],
                );
                Ok(relay("file.search", Value::Object(params)))
            }
            "write_file" if self.roots.iter().any(|r| r.writable) => {
                let mut params = self.at(args, "path")?;
                params.insert("content".into(), string(args, "content")?);
                copy(args, &mut params, &["create_parents"]);
                params.insert("sha256".into(), json!(false));
                Ok(relay("file.write", Value::Object(params)))
            }
            "edit_file" if self.roots.iter().any(|r| r.writable) => {
                let mut params = self.at(args, "path")?;
                let edits = args.get("edits").cloned().ok_or_else(|| {
                    CallError::Arguments("`edits` is required: [{old_text, new_text}]".into())
                })?;
                params.insert("edits".into(), edits);
                Ok(relay("file.edit", Value::Object(params)))
            }
            "run_command" if self.shell => {
                let mut params = self.command(args)?;
                copy(args, &mut params, &["stdin"]);
                Ok(relay("shell.exec", Value::Object(params)))
            }
            "start_process" if self.shell => Ok(RelayCall {
                shape: Shape::Started,
                ..relay("shell.start", Value::Object(self.command(args)?))
            }),
            "read_process_output" | "wait_process" if self.shell => {
                let mut params = process(&["from_seq"])?;
                let (field, default) = match name {
                    "wait_process" => ("timeout_ms", 30_000),
                    _ => ("wait_ms", 0),
                };
                let wait = args.get(field).cloned().unwrap_or(json!(default));
                params.insert("wait_ms".into(), wait);
                Ok(RelayCall {
                    shape: Shape::Output,
                    ..relay("shell.attach", Value::Object(params))
                })
            }
            "write_process_input" if self.shell => {
                let mut params = process(&["eof"])?;
                params.insert("data".into(), string(args, "data")?);
                Ok(relay("shell.input", Value::Object(params)))
            }
            "signal_process" if self.shell => {
                let mut params = process(&[])?;
                params.insert("signal".into(), string(args, "signal")?);
                Ok(relay("shell.signal", Value::Object(params)))
            }
            "kill_process" if self.shell => Ok(relay("shell.cancel", Value::Object(process(&[])?))),
            "run_script" if self.scripts => {
                let mut params = Map::new();
                params.insert("source".into(), string(args, "source")?);
                copy(args, &mut params, &["args"]);
                Ok(relay("script.run", Value::Object(params)))
            }
            other => match self.tools.iter().find(|t| t.name == other) {
                Some(t) => Ok(relay(
                    "tool.call",
                    json!({"name": t.name, "arguments": Value::Object(args.clone())}),
                )),
                None => Err(CallError::UnknownTool(other.to_string())),
            },
        }
    }

    /// A command's `command`, working directory and time limit.
    fn command(&self, args: &Map<String, Value>) -> Result<Map<String, Value>, CallError> {
        let command = match args.get("command") {
            Some(Value::Array(words))
                if !words.is_empty() && words.iter().all(Value::is_string) =>
            {
                Value::Array(words.clone())
            }
            _ => {
                return Err(CallError::Arguments(
                    "`command` is the program and its arguments, an array of strings".into(),
                ));
            }
        };
        let mut params = Map::new();
        params.insert("command".into(), command);
        if args.contains_key("cwd") {
            let at = self.at(args, "cwd")?;
            params.insert("root_id".into(), at["root_id"].clone());
            params.insert("cwd".into(), at["path"].clone());
        }
        copy(args, &mut params, &["timeout_ms"]);
        Ok(params)
    }

    /// `root_id` and `path` for the virtual path in `args[field]`.
    fn at(&self, args: &Map<String, Value>, field: &str) -> Result<Map<String, Value>, CallError> {
        let Some(path) = args.get(field).and_then(Value::as_str) else {
            return Err(CallError::Arguments(format!(
                "`{field}` (a string) is required"
            )));
        };
        let under = |root: &&Root| {
            let base = root.virtual_path.trim_end_matches('/');
            base.is_empty()
                || path == base
                || path
                    .strip_prefix(base)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let root = self
            .roots
            .iter()
            .filter(under)
            .max_by_key(|r| r.virtual_path.len())
            .ok_or_else(|| {
                let roots: Vec<&str> = self.roots.iter().map(|r| r.virtual_path.as_str()).collect();
                CallError::NoRoot(format!(
                    "`{path}` is not under any root of this gateway (they are: {})",
                    roots.join(", ")
                ))
            })?;
        let mut params = Map::new();
        params.insert("root_id".into(), json!(root.id));
        params.insert("path".into(), json!(path));
        Ok(params)
    }
}

/// A root's resource URI: `file://` and its virtual path, ending in `/`.
pub fn root_uri(virtual_path: &str) -> String {
    format!("file://{}/", virtual_path.trim_end_matches('/'))
}

fn tool(name: &str, title: &str, description: &str, schema: Value, annotations: Value) -> Value {
    json!({"name": name, "title": title, "description": description,
           "inputSchema": schema, "annotations": annotations})
}

fn hints(read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> Value {
    json!({"readOnlyHint": read_only, "destructiveHint": destructive,
           "idempotentHint": idempotent, "openWorldHint": open_world})
}

fn string(args: &Map<String, Value>, field: &str) -> Result<Value, CallError> {
    match args.get(field) {
        Some(Value::String(s)) => Ok(json!(s)),
        _ => Err(CallError::Arguments(format!(
            "`{field}` (a string) is required"
        ))),
    }
}

fn copy(args: &Map<String, Value>, params: &mut Map<String, Value>, fields: &[&str]) {
    for field in fields {
        if let Some(value) = args.get(*field) {
            params.insert((*field).to_string(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalogue() -> Catalogue {
        let caps = json!({
            "fileops": {"enabled": true, "roots": [
                {"root_id": "main", "label": "main", "virtual_path": "/workspace/main", "mode": "rw"},
                {"root_id": "docs", "label": "docs", "virtual_path": "/workspace/main/docs", "mode": "ro"}]},
            "shell": {"enabled": true},
        });
        let tools = vec![
            json!({"name": "deploy", "description": "ship it", "input_schema": {"type": "object"}, "risk": "high"}),
            json!({"name": "read_file", "input_schema": {}}),
        ];
        Catalogue::new(caps.as_object().unwrap(), &tools)
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn only_what_is_granted_is_offered() {
        let names: Vec<String> = catalogue()
            .mcp_tools()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "read_file",
                "list_directory",
                "stat",
                "search_files",
                "write_file",
                "edit_file",
                "run_command",
                "start_process",
                "read_process_output",
                "wait_process",
                "write_process_input",
                "signal_process",
                "kill_process",
                "deploy"
            ]
        );
        let read_only = Catalogue::new(
            json!({"fileops": {"enabled": true, "roots": [{"root_id": "r", "virtual_path": "/r", "mode": "ro"}]}})
                .as_object()
                .unwrap(),
            &[],
        );
        let names: Vec<Value> = read_only
            .mcp_tools()
            .iter()
            .map(|t| t["name"].clone())
            .collect();
        assert!(!names.contains(&json!("write_file")), "{names:?}");
        assert!(!names.contains(&json!("edit_file")), "{names:?}");
        assert!(!names.contains(&json!("run_command")), "{names:?}");
        assert!(Catalogue::default().mcp_tools().is_empty());
    }

    #[test]
    fn annotations_follow_what_a_tool_does() {
        let tools = catalogue().mcp_tools();
        let of =
            |name: &str| tools.iter().find(|t| t["name"] == name).unwrap()["annotations"].clone();
        assert_eq!(of("read_file")["readOnlyHint"], true);
        assert_eq!(of("write_file")["destructiveHint"], true);
        assert_eq!(of("write_file")["idempotentHint"], true);
        assert_eq!(of("run_command")["openWorldHint"], true);
        assert_eq!(of("deploy")["destructiveHint"], true);
    }

    #[test]
    fn a_path_picks_the_innermost_root_and_never_one_it_is_not_under() {
        let c = catalogue();
        let call = c
            .call(
                "read_file",
                &args(json!({"path": "/workspace/main/docs/a.md"})),
            )
            .unwrap();
        assert_eq!(call.method, "file.read");
        assert_eq!(call.params["root_id"], "docs");
        assert_eq!(call.text_field, Some("content"));
        let call = c
            .call("stat", &args(json!({"path": "/workspace/main"})))
            .unwrap();
        assert_eq!(call.params["root_id"], "main");
        // A sibling whose name starts the same is not under the root.
        let err = c
            .call("stat", &args(json!({"path": "/workspace/mainframe/x"})))
            .unwrap_err();
        assert!(matches!(err, CallError::NoRoot(_)), "{err:?}");
        assert!(err.to_string().contains("/workspace/main"), "{err}");
        let err = c.call("stat", &args(json!({}))).unwrap_err();
        assert!(matches!(err, CallError::Arguments(_)), "{err:?}");
    }

    #[test]
    fn each_tool_is_one_relay_request() {
        let c = catalogue();
        let exec = c
            .call("run_command", &args(json!({"command": ["ls", "-l"], "cwd": "/workspace/main/src", "timeout_ms": 5000})))
            .unwrap();
        assert_eq!(exec.method, "shell.exec");
        assert_eq!(
            exec.params,
            json!({"command": ["ls", "-l"], "root_id": "main", "cwd": "/workspace/main/src", "timeout_ms": 5000})
        );
        let err = c
            .call("run_command", &args(json!({"command": "ls -l"})))
            .unwrap_err();
        assert!(matches!(err, CallError::Arguments(_)));
        let write = c
            .call(
                "write_file",
                &args(json!({"path": "/workspace/main/a", "content": "x"})),
            )
            .unwrap();
        assert_eq!(write.method, "file.write");
        assert_eq!(write.params["sha256"], false);
        let tool = c.call("deploy", &args(json!({"to": "prod"}))).unwrap();
        assert_eq!(
            tool.params,
            json!({"name": "deploy", "arguments": {"to": "prod"}})
        );
        assert_eq!(
            c.call("run_script", &args(json!({"source": "1"})))
                .unwrap_err(),
            CallError::UnknownTool("run_script".into())
        );
        let start = c
            .call("start_process", &args(json!({"command": ["sleep", "9"]})))
            .unwrap();
        assert_eq!(
            (start.method.as_str(), start.shape),
            ("shell.start", Shape::Started)
        );
        let wait = c
            .call("wait_process", &args(json!({"process_id": "p1-x"})))
            .unwrap();
        assert_eq!(wait.params, json!({"process_id": "p1-x", "wait_ms": 30000}));
        assert_eq!(wait.shape, Shape::Output);
        let read = c
            .call(
                "read_process_output",
                &args(json!({"process_id": "p1-x", "from_seq": 7})),
            )
            .unwrap();
        assert_eq!(
            read.params,
            json!({"process_id": "p1-x", "from_seq": 7, "wait_ms": 0})
        );
        assert!(
            c.call("signal_process", &args(json!({"process_id": 3})))
                .is_err()
        );
        let listed = c.resource_call("file:///workspace/main/").unwrap();
        assert_eq!(
            (listed.method.as_str(), listed.params["path"].clone()),
            ("file.list", json!("/workspace/main"))
        );
        let read = c.resource_call("file:///workspace/main/a.txt").unwrap();
        assert_eq!(read.method, "file.read");
        assert!(c.resource_call("https://example.com/").is_err());
    }
}

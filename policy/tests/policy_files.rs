//! The shipped default policy loads; each broken policy in `tests/broken/`
//! fails with the exact line, column and message its first line expects:
//!
//! ```text
//! # expect: LINE:COLUMN: message text (a prefix is enough)
//! ```

use std::path::Path;

use portcullis_policy::{DEFAULT_POLICY, McpReach, Mode, Network, SandboxMode, ToolAction, parse};

#[test]
fn the_default_policy_is_valid() {
    let policy = parse(
        DEFAULT_POLICY,
        "default-policy.toml",
        Path::new("/etc/portcullis"),
    )
    .unwrap();
    assert_eq!(policy.principals.len(), 1);
    assert!(
        policy.principals[0].disabled,
        "the shipped policy must grant nothing until edited"
    );
    // Its tools are commented-out examples: no script ships with it.
    assert_eq!(policy.tools.len(), 0);
    assert!(DEFAULT_POLICY.contains("# name = \"disk_usage\""));
    assert_eq!(policy.generation.len(), 64);
}

#[test]
fn broken_policies_fail_at_the_exact_position() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 12,
        "expected at least a dozen broken policies, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| {
                panic!(
                    "{} must start with `# expect: LINE:COLUMN: message`",
                    file.display()
                )
            });
        let (line, rest) = expect.split_once(':').unwrap();
        let (column, message) = rest.split_once(": ").unwrap();
        let (line, column): (usize, usize) = (line.parse().unwrap(), column.parse().unwrap());
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        match parse(&text, &name, Path::new("/etc/portcullis")) {
            Ok(_) => failures.push(format!("{name}: loaded, but should fail with {expect}")),
            Err(errors) => {
                let hit = errors.0.iter().any(|e| {
                    e.line == line && e.column == column && e.message.starts_with(message)
                });
                if !hit {
                    failures.push(format!("{name}: expected {expect}\n  got: {errors}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn an_mcp_server_runs_under_the_terms_of_its_own_section() {
    let text = r#"
[[root]]
id = "work"
path = "/srv/work"
virtual_path = "/workspace/work"

[[mcp_server]]
name = "notes"
command = ["python3", "/opt/mcp/notes.py", "--stdio"]
roots = { work = "rw" }
cwd = "work"
env = { LOG_LEVEL = "debug" }
secrets = { NOTES_TOKEN = "notes_token" }
call_timeout = "5s"
max_pids = 16

[[tool]]
name = "notes_add"
description = "Adds a note"
risk = "medium"
approval_policy = "ask_once"
mcp = { server = "notes", tool = "add_note" }
input_schema = { type = "object" }

[[tool]]
name = "shout"
description = "Named as the server names it"
risk = "low"
approval_policy = "allow"
mcp = { server = "notes" }
input_schema = { type = "object" }
"#;
    let policy = parse(text, "policy.toml", Path::new("/etc/portcullis")).unwrap();
    let tool = |name: &str| match &policy.tool(name).unwrap().action {
        ToolAction::Mcp { server, tool } => (server.clone(), tool.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(tool("notes_add"), ("notes".into(), "add_note".into()));
    assert_eq!(tool("shout"), ("notes".into(), "shout".into()));
    let server = policy.mcp_server("notes").unwrap();
    assert_eq!(server.call_timeout, std::time::Duration::from_secs(5));
    let terms = server.shell_terms(&policy, [("NOTES_TOKEN".into(), "s3cret".into())]);
    assert_eq!(terms.env["NOTES_TOKEN"], "s3cret");
    assert_eq!(terms.env["LOG_LEVEL"], "debug");
    // A PATH of the usual directories when the section sets none.
    assert_eq!(terms.env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert_eq!(terms.roots["work"], Mode::Rw);
    assert_eq!(
        terms.host_roots,
        vec![(std::path::PathBuf::from("/srv/work"), Mode::Rw)]
    );
    assert_eq!(terms.cwd.as_ref().unwrap().root, "work");
    assert_eq!(terms.network, Network::Deny);
    assert_eq!((terms.max_processes, terms.limits.pids), (16, Some(16)));
    assert_eq!(terms.sandbox, SandboxMode::Require);
}

#[test]
fn an_mcp_server_on_loopback_is_reached_at_its_url() {
    for (url, ok) in [
        ("http://127.0.0.1:8931/mcp", true),
        ("http://[::1]:8931/mcp", true),
        ("http://localhost:8931/mcp", true),
        ("https://127.0.0.1:8931/mcp", false),
        ("http://user:pw@127.0.0.1:8931/mcp", false),
        ("http://127.0.0.1.example.com:80/mcp", false),
        ("http://[::2]:8931/mcp", false),
    ] {
        let text = format!(
            "[[mcp_server]]\nname = \"search\"\nurl = \"{url}\"\nbearer_secret = \"search_token\"\n"
        );
        let parsed = parse(&text, "policy.toml", Path::new("/etc/portcullis"));
        assert_eq!(parsed.is_ok(), ok, "{url}: {:?}", parsed.err());
        if let Ok(policy) = parsed {
            match &policy.mcp_server("search").unwrap().reach {
                McpReach::Http {
                    url: u,
                    bearer_secret,
                } => {
                    assert_eq!(
                        (u.as_str(), bearer_secret.as_deref()),
                        (url, Some("search_token"))
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

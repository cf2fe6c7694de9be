//! Table tests for every capability, expiry and overlap, and properties:
//! `decide` never allows a path outside its root and never allows what no
//! grant names.

use std::path::Path;

use portcullis_policy::*;
use proptest::prelude::*;

const KEY_A: &str = "u/waKPEvrQUqJN1AsX4dBMwS/m9E7SLvwyjJJDyCJgI=";
// sha256("secret-token"), computed with Python hashlib
const TOKEN_HASH: &str = "sha256:930bbdc51b6aed5c2a5678fd6e28dee7a05e8a4b643cfc0b4427c3efb86c0d94";

fn now() -> jiff::Timestamp {
    "2026-11-21T12:00:00Z".parse().unwrap()
}

fn policy(text: &str) -> Policy {
    parse(text, "test.toml", Path::new("/etc/portcullis")).unwrap_or_else(|e| panic!("{e}"))
}

fn query(method: &str, target: Target) -> Query {
    Query {
        method: method.into(),
        target,
    }
}

fn path(root: &str, path: &str) -> Target {
    Target::Path {
        root: root.into(),
        path: path.into(),
    }
}

fn run(program: &str) -> Target {
    command(program, None, false)
}

fn command(program: &str, cwd: Option<(&str, &str)>, pty: bool) -> Target {
    let cwd = cwd.map(|(root, path)| (root.to_string(), path.to_string()));
    Target::Command {
        program: program.into(),
        args: vec![],
        cwd,
        env: vec![],
        pty,
        lookup: None,
    }
}

fn tool(name: &str) -> Target {
    Target::Tool { name: name.into() }
}

fn verdict(p: &Policy, principal: &str, q: Query) -> Verdict {
    decide(p, principal, &q, now()).verdict
}

const BASE: &str = r#"
[[principal]]
id = "alice"
public_key = "u/waKPEvrQUqJN1AsX4dBMwS/m9E7SLvwyjJJDyCJgI="

[[principal]]
id = "bob"
token_hash = "TOKEN"

[[principal]]
id = "old"
public_key = "u/waKPEvrQUqJN1AsX4dBMwS/m9E7SLvwyjJJDyCJgI="
expires_at = 2026-01-01T00:00:00Z

[[principal]]
id = "off"
public_key = "u/waKPEvrQUqJN1AsX4dBMwS/m9E7SLvwyjJJDyCJgI="
disabled = true

[[root]]
id = "main"
path = "/srv/main"
virtual_path = "/workspace/main"

[[root]]
id = "logs"
path = "/var/log"
virtual_path = "/host/logs"

[[tool]]
name = "disk_usage"
description = "d"
risk = "low"
approval_policy = "allow"
script = "tools/du.rhai"
input_schema = { type = "object" }

[[tool]]
name = "restart"
description = "r"
risk = "high"
approval_policy = "ask_once"
script = "tools/restart.rhai"
input_schema = { type = "object" }

[[tool]]
name = "wipe"
description = "w"
risk = "critical"
approval_policy = "block"
script = "tools/wipe.rhai"
input_schema = { type = "object" }
"#;

fn with_grants(grants: &str) -> Policy {
    policy(&format!("{}\n{grants}", BASE.replace("TOKEN", TOKEN_HASH)))
}

#[test]
fn files_read_write_and_read_only() {
    let p = with_grants(
        r#"
[[grant]]
id = "dev"
principals = ["alice"]
fileops = { main = "rw", logs = "ro" }
"#,
    );
    assert_eq!(
        verdict(&p, "alice", query("file.write", path("main", "src/lib.rs"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("file.read", path("logs", "syslog"))),
        Verdict::Allow
    );
    for method in ["file.write", "file.append", "file.mkdir", "file.delete"] {
        assert_eq!(
            verdict(&p, "alice", query(method, path("logs", "x"))),
            Verdict::Deny(Denial::ReadOnly),
            "{method}"
        );
    }
    assert_eq!(
        verdict(&p, "bob", query("file.read", path("main", "a"))),
        Verdict::Deny(Denial::NotGranted)
    );
    // A root that does not exist is not granted either: the answer does
    // not tell which roots exist.
    assert_eq!(
        verdict(&p, "alice", query("file.read", path("etc", "a"))),
        Verdict::Deny(Denial::NotGranted)
    );
    assert_eq!(
        verdict(
            &p,
            "alice",
            query("file.read", path("main", "../../etc/passwd"))
        ),
        Verdict::Deny(Denial::BadPath)
    );
    assert_eq!(
        verdict(&p, "alice", query("file.read", path("main", "/etc/passwd"))),
        Verdict::Deny(Denial::BadPath)
    );
    assert_eq!(
        verdict(&p, "alice", query("file.read", path("main", "a\0b"))),
        Verdict::Deny(Denial::BadPath)
    );
    assert_eq!(
        verdict(&p, "alice", query("file.read", Target::None)),
        Verdict::Deny(Denial::InvalidRequest)
    );

    let d = decide(
        &p,
        "alice",
        &query(
            "file.read",
            path("main", "/workspace/main/./src/../README.md"),
        ),
        now(),
    );
    assert_eq!(
        d.terms,
        Terms::File(FileTerms {
            root: "main".into(),
            path: "README.md".into(),
            mode: Mode::Rw,
            host_root: "/srv/main".into(),
            virtual_root: "/workspace/main".into(),
            follow_symlinks: false,
        })
    );
    assert_eq!(d.grant.as_deref(), Some("dev"));
    assert!(
        d.rule.contains("grant `dev` gives root `main` rw"),
        "{}",
        d.rule
    );
}

#[test]
fn move_needs_write_on_both_copy_reads_the_source() {
    let p = with_grants(
        r#"
[[grant]]
id = "dev"
principals = ["alice"]
fileops = { main = "rw", logs = "ro" }
"#,
    );
    let transfer = |from: &str, to: &str| Target::Transfer {
        from: (from.into(), "a".into()),
        to: (to.into(), "b".into()),
    };
    assert_eq!(
        verdict(&p, "alice", query("file.copy", transfer("logs", "main"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("file.move", transfer("logs", "main"))),
        Verdict::Deny(Denial::ReadOnly)
    );
    assert_eq!(
        verdict(&p, "alice", query("file.copy", transfer("main", "logs"))),
        Verdict::Deny(Denial::ReadOnly)
    );
    assert_eq!(
        verdict(&p, "alice", query("file.move", transfer("main", "main"))),
        Verdict::Allow
    );
}

#[test]
fn overlapping_grants_union_and_the_stronger_mode_wins() {
    let p = with_grants(
        r#"
[[grant]]
id = "reader"
principals = ["alice", "bob"]
fileops = { main = "ro" }

[[grant]]
id = "writer"
principals = ["alice"]
fileops = { main = "rw" }
"#,
    );
    let d = decide(&p, "alice", &query("file.write", path("main", "a")), now());
    assert_eq!(
        (d.verdict, d.grant.as_deref()),
        (Verdict::Allow, Some("writer"))
    );
    assert_eq!(
        verdict(&p, "bob", query("file.write", path("main", "a"))),
        Verdict::Deny(Denial::ReadOnly)
    );
}

#[test]
fn expiry_and_disabled_principals() {
    let p = with_grants(
        r#"
[[grant]]
id = "everyone"
principals = ["alice", "bob", "old", "off"]
fileops = { main = "rw" }

[[grant]]
id = "temporary"
principals = ["bob"]
expires_at = 2026-11-21T11:59:59Z
fileops = { logs = "ro" }
"#,
    );
    assert_eq!(
        verdict(&p, "old", query("file.read", path("main", "a"))),
        Verdict::Deny(Denial::PrincipalExpired)
    );
    assert_eq!(
        verdict(&p, "off", query("file.read", path("main", "a"))),
        Verdict::Deny(Denial::PrincipalDisabled)
    );
    assert_eq!(
        verdict(&p, "mallory", query("file.read", path("main", "a"))),
        Verdict::Deny(Denial::UnknownPrincipal)
    );
    assert_eq!(
        verdict(&p, "bob", query("file.read", path("logs", "a"))),
        Verdict::Deny(Denial::NotGranted)
    );
    // One second earlier the temporary grant was still in force.
    let before: jiff::Timestamp = "2026-11-21T11:59:58Z".parse().unwrap();
    let q = query("file.read", path("logs", "a"));
    assert_eq!(decide(&p, "bob", &q, before).verdict, Verdict::Allow);
}

/// A pretend host: `git` and `sh` live in /usr/bin, on a PATH of
/// "/usr/bin:/bin"; `evil` is a lookup that answers a relative path.
fn host(path: &str, name: &str) -> Option<String> {
    let on_path = path.split(':').any(|d| d == "/usr/bin");
    match name {
        "git" | "sh" if on_path => Some(format!("/usr/bin/{name}")),
        "evil" => Some("evil".into()),
        _ => None,
    }
}

#[test]
fn programs_are_resolved_on_the_child_path_before_the_command_list() {
    let p = with_grants(
        r#"
[[grant]]
id = "g"
principals = ["alice"]
shell = { commands = ["/usr/bin/git", "sh", "evil"], env_set = { PATH = "/usr/bin:/bin" } }
"#,
    );
    let resolved = |program: &str, lookup: bool| {
        let target = Target::Command {
            program: program.into(),
            args: vec![],
            cwd: None,
            env: vec![],
            pty: false,
            lookup: lookup.then_some(ProgramLookup(host)),
        };
        let d = decide(&p, "alice", &query("shell.exec", target), now());
        match (d.verdict, d.terms) {
            (Verdict::Allow, Terms::Shell(terms)) => Ok(terms.program),
            (verdict, _) => Err(verdict),
        }
    };
    let usr = |name: &str| Ok(Some(std::path::PathBuf::from(format!("/usr/bin/{name}"))));
    // A bare name is found on the child's PATH, and its path is listed.
    assert_eq!(resolved("git", true), usr("git"));
    // A path is allowed when a listed bare name resolves to it.
    assert_eq!(resolved("/usr/bin/sh", true), usr("sh"));
    assert_eq!(resolved("sh", true), usr("sh"));
    // Not the same program: refused.
    assert_eq!(
        resolved("/tmp/x/sh", true),
        Err(Verdict::Deny(Denial::NotGranted))
    );
    // Without a lookup only exact entries match; what is not found stays
    // as requested (the shell reports it missing).
    assert_eq!(
        resolved("git", false),
        Err(Verdict::Deny(Denial::NotGranted))
    );
    assert_eq!(resolved("sh", false), Ok(None));
    // A lookup's relative answer is not taken as a resolution.
    assert_eq!(resolved("evil", true), Ok(None));
}

#[test]
fn shell_commands_cwd_env_and_terminals() {
    let p = with_grants(
        r#"
[[grant]]
id = "build"
principals = ["alice"]
fileops = { main = "rw", logs = "ro" }
[grant.shell]
commands = ["git", "/usr/bin/make"]
cwd_roots = ["main"]
env_allow = ["LANG"]
env_set = { PATH = "/usr/bin:/bin" }
max_runtime = "1m"

[[grant]]
id = "anything"
principals = ["bob"]
shell = { commands = ["*"], pty = true, network = "allow" }
"#,
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", run("git"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", run("/usr/bin/make"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", run("make"))),
        Verdict::Deny(Denial::NotGranted)
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", run("/tmp/evil/git"))),
        Verdict::Deny(Denial::NotGranted),
        "a path never passes as a bare name"
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", run("bin/git"))),
        Verdict::Deny(Denial::InvalidRequest)
    );
    assert_eq!(
        verdict(&p, "bob", query("shell.start", run("/anything/at/all"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("shell.status", Target::None)),
        Verdict::Allow
    );

    let pty = command("git", None, true);
    assert_eq!(
        verdict(&p, "alice", query("shell.start", pty)),
        Verdict::Deny(Denial::NotGranted)
    );

    let in_logs = command("git", Some(("logs", "")), false);
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", in_logs)),
        Verdict::Deny(Denial::NotGranted)
    );
    let escape = command("git", Some(("main", "..")), false);
    assert_eq!(
        verdict(&p, "alice", query("shell.exec", escape)),
        Verdict::Deny(Denial::BadPath)
    );

    let request_env = vec![
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("LD_PRELOAD".to_string(), "/tmp/x.so".to_string()),
        ("PATH".to_string(), "/tmp".to_string()),
    ];
    let target = Target::Command {
        program: "git".into(),
        args: vec![],
        cwd: Some(("main".into(), "src".into())),
        env: request_env,
        pty: false,
        lookup: None,
    };
    let d = decide(&p, "alice", &query("shell.exec", target), now());
    let Terms::Shell(terms) = d.terms else {
        panic!("{d:?}")
    };
    let env: Vec<_> = terms.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(
        env,
        ["LANG=C.UTF-8", "PATH=/usr/bin:/bin"],
        "allowlist ∩ request, then fixed values"
    );
    assert_eq!(terms.max_runtime, std::time::Duration::from_secs(60));
    assert_eq!(terms.network, Network::Deny);
    assert_eq!(terms.cwd.unwrap().path, "src");
    assert_eq!(terms.roots.get("logs"), Some(&Mode::Ro));
}

#[test]
fn tools_globs_approval_overrides_and_block() {
    let p = with_grants(
        r#"
[[grant]]
id = "ops"
principals = ["alice", "bob"]
tools = { allow = ["disk_*", "restart", "wipe"] }

[[grant]]
id = "careful"
principals = ["bob"]
tools = { allow = [], approval = { "disk_*" = "always_ask" } }
"#,
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("disk_usage"))),
        Verdict::Allow
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("restart"))),
        Verdict::RequireApproval(ApprovalPolicy::AskOnce)
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("wipe"))),
        Verdict::Deny(Denial::Blocked)
    );
    // A name no grant matches is not granted, defined or not; a name a
    // grant's glob matches may be unknown.
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("nope"))),
        Verdict::Deny(Denial::NotGranted)
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("disk_nope"))),
        Verdict::Deny(Denial::UnknownTool)
    );
    let d = decide(&p, "bob", &query("tool.call", tool("disk_usage")), now());
    assert_eq!(
        d.verdict,
        Verdict::RequireApproval(ApprovalPolicy::AlwaysAsk),
        "the stricter override wins"
    );
    assert!(d.rule.contains("grant `careful`"), "{}", d.rule);
    assert_eq!(
        verdict(&p, "alice", query("tool.list", Target::None)),
        Verdict::Allow
    );
    assert_eq!(
        summary(&p, "alice", now()).tools,
        ["disk_usage", "restart"],
        "blocked tools are not advertised"
    );
}

#[test]
fn a_looser_override_never_relaxes_a_tool() {
    let p = with_grants(
        r#"
[[grant]]
id = "lax"
principals = ["alice"]
tools = { allow = ["*"], approval = { "*" = "allow" } }
"#,
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("restart"))),
        Verdict::RequireApproval(ApprovalPolicy::AskOnce)
    );
    assert_eq!(
        verdict(&p, "alice", query("tool.call", tool("wipe"))),
        Verdict::Deny(Denial::Blocked)
    );
}

#[test]
fn scripts_never_get_more_than_the_grant() {
    let p = with_grants(
        r#"
[[grant]]
id = "scripting"
principals = ["alice"]
scripts = { max_operations = 1000, max_wall_time = "2s" }
"#,
    );
    let greedy = ScriptLimits {
        max_operations: u64::MAX,
        ..ScriptLimits::DEFAULT
    };
    let d = decide(
        &p,
        "alice",
        &query(
            "script.run",
            Target::Script {
                requested: Some(greedy),
            },
        ),
        now(),
    );
    let Terms::Script(limits) = d.terms else {
        panic!("{d:?}")
    };
    assert_eq!(limits.max_operations, 1000);
    assert_eq!(limits.max_wall_time, std::time::Duration::from_secs(2));
    let modest = ScriptLimits {
        max_operations: 10,
        ..ScriptLimits::DEFAULT
    };
    let d = decide(
        &p,
        "alice",
        &query(
            "script.run",
            Target::Script {
                requested: Some(modest),
            },
        ),
        now(),
    );
    assert!(matches!(d.terms, Terms::Script(l) if l.max_operations == 10));
    assert_eq!(
        verdict(
            &p,
            "bob",
            query("script.run", Target::Script { requested: None })
        ),
        Verdict::Deny(Denial::NotGranted)
    );
}

#[test]
fn methods_outside_the_protocol_or_unserved() {
    let p = with_grants(
        r#"
[[grant]]
id = "all"
principals = ["alice"]
resources = {}
"#,
    );
    assert_eq!(
        verdict(&p, "alice", query("file.teleport", Target::None)),
        Verdict::Deny(Denial::UnknownMethod)
    );
    assert_eq!(
        verdict(&p, "alice", query("computer.see", Target::None)),
        Verdict::Deny(Denial::CapabilityUnavailable)
    );
    assert_eq!(
        verdict(&p, "alice", query("resource.list", Target::None)),
        Verdict::Allow
    );
    assert_eq!(Denial::Blocked.error_code(), "policy_blocked");
    assert_eq!(Denial::ReadOnly.error_code(), "permission_denied");
}

#[test]
fn authentication_by_key_and_token() {
    let p = with_grants("");
    use base64::Engine as _;
    let key: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(KEY_A)
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(
        principal_by_key(&p, &key).map(|p| p.id.as_str()),
        Some("alice")
    );
    assert!(principal_by_key(&p, &[0u8; 32]).is_none());
    assert_eq!(
        principal_by_token(&p, "secret-token").map(|p| p.id.as_str()),
        Some("bob")
    );
    assert!(principal_by_token(&p, "secret-token2").is_none());
}

#[test]
fn summary_is_the_union_of_active_grants() {
    let p = with_grants(
        r#"
[[grant]]
id = "a"
principals = ["alice"]
fileops = { main = "ro" }

[[grant]]
id = "b"
principals = ["alice"]
fileops = { main = "rw", logs = "ro" }
shell = { commands = ["ls"], pty = true }
"#,
    );
    let s = summary(&p, "alice", now());
    assert_eq!(s.fileops.get("main"), Some(&Mode::Rw));
    assert_eq!(s.fileops.get("logs"), Some(&Mode::Ro));
    assert!(s.shell && s.pty && !s.scripts);
    assert_eq!(summary(&p, "off", now()), Summary::default());
}

// ── Properties ───────────────────────────────────────────────────────────────

/// A randomly generated policy, kept as data so the oracle can read it.
#[derive(Debug, Clone)]
struct Gen {
    grants: Vec<GenGrant>,
    tool_policies: [ApprovalPolicy; 3],
}

#[derive(Debug, Clone)]
struct GenGrant {
    principals: Vec<usize>,
    expired: bool,
    fileops: Vec<(usize, Mode)>,
    commands: Option<Vec<&'static str>>,
    tools: Option<Vec<&'static str>>,
    overrides: Vec<(&'static str, ApprovalPolicy)>,
    scripts: bool,
}

const COMMANDS: [&str; 4] = ["ls", "git", "/usr/bin/env", "*"];
const TOOL_PATTERNS: [&str; 4] = ["t0", "t1", "t2", "t*"];
const PRINCIPALS: [&str; 3] = ["p0", "p1", "p2"];

fn approval() -> impl Strategy<Value = ApprovalPolicy> {
    prop_oneof![
        Just(ApprovalPolicy::Allow),
        Just(ApprovalPolicy::AskOnce),
        Just(ApprovalPolicy::AskOncePerRun),
        Just(ApprovalPolicy::AlwaysAsk),
        Just(ApprovalPolicy::Block),
    ]
}

fn gen_grant() -> impl Strategy<Value = GenGrant> {
    (
        prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
        any::<bool>(),
        prop::collection::vec(
            (0usize..3, prop_oneof![Just(Mode::Ro), Just(Mode::Rw)]),
            0..3,
        ),
        prop::option::of(prop::sample::subsequence(COMMANDS.to_vec(), 0..=4)),
        prop::option::of(prop::sample::subsequence(TOOL_PATTERNS.to_vec(), 0..=4)),
        prop::collection::vec(
            (prop::sample::select(TOOL_PATTERNS.to_vec()), approval()),
            0..2,
        ),
        any::<bool>(),
    )
        .prop_map(
            |(principals, expired, fileops, commands, tools, overrides, scripts)| {
                let mut fileops = fileops;
                fileops.sort_by_key(|(r, _)| *r);
                fileops.dedup_by_key(|(r, _)| *r);
                let mut overrides = overrides;
                overrides.sort_by_key(|(p, _)| *p);
                overrides.dedup_by_key(|(p, _)| *p);
                GenGrant {
                    principals,
                    expired,
                    fileops,
                    commands,
                    tools,
                    overrides,
                    scripts,
                }
            },
        )
}

fn gen_policy() -> impl Strategy<Value = Gen> {
    (
        prop::collection::vec(gen_grant(), 0..4),
        [approval(), approval(), approval()],
    )
        .prop_map(|(grants, tool_policies)| Gen {
            grants,
            tool_policies,
        })
}

impl Gen {
    fn to_toml(&self) -> String {
        let mut out = String::new();
        for p in PRINCIPALS {
            out += &format!("[[principal]]\nid = \"{p}\"\npublic_key = \"{KEY_A}\"\n\n");
        }
        for r in 0..3 {
            out += &format!(
                "[[root]]\nid = \"r{r}\"\npath = \"/srv/r{r}\"\nvirtual_path = \"/v/r{r}\"\n\n"
            );
        }
        for (t, policy) in self.tool_policies.iter().enumerate() {
            out += &format!(
                "[[tool]]\nname = \"t{t}\"\ndescription = \"t\"\nrisk = \"low\"\napproval_policy = \"{}\"\nscript = \"t.rhai\"\ninput_schema = {{}}\n\n",
                policy.as_str()
            );
        }
        for (i, g) in self.grants.iter().enumerate() {
            let principals: Vec<String> =
                g.principals.iter().map(|p| format!("\"p{p}\"")).collect();
            out += &format!(
                "[[grant]]\nid = \"g{i}\"\nprincipals = [{}]\n",
                principals.join(", ")
            );
            let expiry = if g.expired {
                "2000-01-01T00:00:00Z"
            } else {
                "2100-01-01T00:00:00Z"
            };
            out += &format!("expires_at = {expiry}\n");
            // A grant must grant something: resources is the filler.
            out += "resources = {}\n";
            if g.scripts {
                out += "scripts = {}\n";
            }
            if let Some(commands) = &g.commands {
                let list: Vec<String> = commands.iter().map(|c| format!("\"{c}\"")).collect();
                out += &format!("shell = {{ commands = [{}] }}\n", list.join(", "));
            }
            if let Some(tools) = &g.tools {
                let list: Vec<String> = tools.iter().map(|c| format!("\"{c}\"")).collect();
                let overrides: Vec<String> = g
                    .overrides
                    .iter()
                    .map(|(p, a)| format!("\"{p}\" = \"{}\"", a.as_str()))
                    .collect();
                out += &format!(
                    "tools = {{ allow = [{}], approval = {{ {} }} }}\n",
                    list.join(", "),
                    overrides.join(", ")
                );
            }
            if !g.fileops.is_empty() {
                out += "[grant.fileops]\n";
                for (root, mode) in &g.fileops {
                    out += &format!("r{root} = \"{}\"\n", mode.as_str());
                }
            }
            out += "\n";
        }
        out
    }

    /// The oracle: an independent, naive reading of the rules.
    fn active(&self, principal: usize) -> impl Iterator<Item = &GenGrant> {
        self.grants
            .iter()
            .filter(move |g| !g.expired && g.principals.contains(&principal))
    }

    fn may(&self, principal: usize, q: &Query) -> bool {
        let write =
            ["file.write", "file.append", "file.mkdir", "file.delete"].contains(&q.method.as_str());
        match &q.target {
            Target::Path { root, .. } => self.active(principal).any(|g| {
                g.fileops
                    .iter()
                    .any(|(r, m)| format!("r{r}") == *root && (!write || *m == Mode::Rw))
            }),
            Target::Command { program, .. } => self.active(principal).any(|g| {
                g.commands
                    .as_ref()
                    .is_some_and(|c| c.contains(&"*") || c.contains(&program.as_str()))
            }),
            Target::Tool { name } => {
                let matches = |pattern: &str, name: &str| {
                    pattern == name || (pattern == "t*" && name.starts_with('t'))
                };
                let allowed = self.active(principal).any(|g| {
                    g.tools
                        .as_ref()
                        .is_some_and(|t| t.iter().any(|p| matches(p, name)))
                });
                let index: usize = name[1..].parse().unwrap();
                let relaxed = self.tool_policies[index] == ApprovalPolicy::Allow
                    && self.active(principal).all(|g| {
                        g.tools.is_none()
                            || g.overrides
                                .iter()
                                .all(|(p, a)| !matches(p, name) || *a == ApprovalPolicy::Allow)
                    });
                allowed && relaxed
            }
            Target::Script { .. } => self.active(principal).any(|g| g.scripts),
            _ => unreachable!(),
        }
    }
}

fn gen_query() -> impl Strategy<Value = Query> {
    let file = (
        prop::sample::select(vec!["file.read", "file.list", "file.write", "file.delete"]),
        0usize..3,
        "[a-z./]{0,12}",
    )
        .prop_map(|(m, r, p)| query(m, path(&format!("r{r}"), &p)));
    let shell = prop::sample::select(vec!["ls", "git", "/usr/bin/env", "make", "/bin/ls"])
        .prop_map(|c| query("shell.exec", run(c)));
    let tools = (0usize..3).prop_map(|t| query("tool.call", tool(&format!("t{t}"))));
    let script = Just(query("script.run", Target::Script { requested: None }));
    prop_oneof![file, shell, tools, script]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Deny by default: whatever is allowed, some active grant of that
    /// principal names it; and whatever the oracle allows, decide allows too.
    #[test]
    fn decide_matches_the_grants(generated in gen_policy(), principal in 0usize..3, q in gen_query()) {
        let p = policy(&generated.to_toml());
        let d = decide(&p, PRINCIPALS[principal], &q, now());
        let path_ok = match &q.target {
            Target::Path { root, path } => path_normalizes(&p, root, path),
            _ => true,
        };
        let expected = generated.may(principal, &q) && path_ok;
        prop_assert_eq!(d.verdict == Verdict::Allow, expected, "query {:?} gave {:?} ({})\n{}", q, d.verdict, d.rule, generated.to_toml());
    }

    /// An allowed path, joined to its root's host directory, stays inside it.
    #[test]
    fn allowed_paths_stay_inside_their_root(parts in prop::collection::vec(
        prop_oneof![Just("..".to_string()), Just(".".to_string()), Just("/".to_string()), "[a-z]{1,4}", Just("/v/r0".to_string())], 0..10)) {
        let p = policy(&Gen { grants: vec![GenGrant {
            principals: vec![0], expired: false, fileops: vec![(0, Mode::Rw)], commands: None, tools: None, overrides: vec![], scripts: false,
        }], tool_policies: [ApprovalPolicy::Allow; 3] }.to_toml());
        let raw = parts.concat();
        let d = decide(&p, "p0", &query("file.write", path("r0", &raw)), now());
        if let Terms::File(terms) = d.terms {
            let host = Path::new("/srv/r0").join(&terms.path);
            prop_assert!(host.starts_with("/srv/r0"));
            prop_assert!(host.components().all(|c| c != std::path::Component::ParentDir), "{}", host.display());
        }
    }
}

fn path_normalizes(p: &Policy, root: &str, path: &str) -> bool {
    p.root(root)
        .is_some_and(|r| portcullis_policy::path::normalize(&r.virtual_path, path).is_ok())
}

#[test]
fn artifacts_are_bounded_by_type_and_size() {
    let p = with_grants(
        r#"
[[grant]]
id = "logs"
principals = ["alice"]
artifacts = { mime_types = ["text/*", "application/json"], max_size = "1KiB", destinations = ["storage.example", "10.0.0.0/8:9000"] }

[[grant]]
id = "images"
principals = ["alice"]
artifacts = { mime_types = ["image/png"], destinations = ["*.images.example"] }
"#,
    );
    let upload = |mime: &str, size: u64| {
        let target = Target::Artifact {
            mime_type: mime.into(),
            size,
        };
        decide(&p, "alice", &query("artifact.upload", target), now())
    };
    assert!(upload("text/plain; charset=utf-8", 1024).is_allowed());
    assert!(upload("Application/JSON", 10).is_allowed());
    // Past the first grant's size, the second's type does not fit either.
    let big = upload("text/plain", 1025);
    assert_eq!(big.verdict, Verdict::Deny(Denial::NotGranted));
    assert!(big.rule.contains("at most 1024 bytes"), "{}", big.rule);
    // The second grant's default max_size (64 MiB).
    assert!(upload("image/png", 60 << 20).is_allowed());
    assert!(!upload("image/png", 65 << 20).is_allowed());
    assert!(!upload("image/jpeg", 1).is_allowed());
    assert!(!upload("nonsense", 1).is_allowed());
    // bob has no artifacts grant; summary offers the capability to alice.
    assert!(
        !decide(
            &p,
            "bob",
            &query(
                "artifact.upload",
                Target::Artifact {
                    mime_type: "text/plain".into(),
                    size: 1
                }
            ),
            now()
        )
        .is_allowed()
    );
    assert!(summary(&p, "alice", now()).artifacts);
    // What the runtime is asked is not a method a peer may call.
    assert_eq!(
        verdict(&p, "alice", query("artifact.reserve", Target::None)),
        Verdict::Deny(Denial::CapabilityUnavailable)
    );
}

#[test]
fn artifacts_grants_name_mime_patterns() {
    for (bad, says) in [
        (
            "mime_types = [], destinations = [\"s.example\"]",
            "is empty",
        ),
        (
            "mime_types = [\"text\"], destinations = [\"s.example\"]",
            "not a MIME type pattern",
        ),
        (
            "mime_types = [\"*/png\"], destinations = [\"s.example\"]",
            "not a MIME type pattern",
        ),
        (
            "mime_types = [\"text/*\"], destinations = [\"s.example\"], max_size = \"lots\"",
            "not a size",
        ),
        ("mime_types = [\"text/*\"]", "destinations"),
        (
            "mime_types = [\"text/*\"], destinations = []",
            "destinations is empty",
        ),
        (
            "mime_types = [\"text/*\"], destinations = [\"s.example:99999\"]",
            "a port must be",
        ),
    ] {
        let text = format!(
            "{}\n[[grant]]\nid = \"a\"\nprincipals = [\"alice\"]\nartifacts = {{ {bad} }}\n",
            BASE.replace("TOKEN", TOKEN_HASH)
        );
        let error = parse(&text, "test.toml", Path::new("/etc/portcullis"))
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(error.to_string().contains(says), "{bad}: {error}");
    }
}

#[test]
fn a_command_approval_pattern_sees_the_whole_command_line() {
    let p = with_grants(
        r#"
[[grant]]
id = "dev"
principals = ["alice"]
shell = { commands = ["rm", "git", "ls"], approval = { "rm *" = "ask_once", "git push*" = "always_ask", "rm -rf /*" = "block" } }

[[grant]]
id = "stricter"
principals = ["alice"]
shell = { commands = ["git"], approval = { "git push --force*" = "block" } }
"#,
    );
    let line = |words: &[&str]| {
        let target = Target::Command {
            program: words[0].into(),
            args: words[1..].iter().map(|w| w.to_string()).collect(),
            cwd: None,
            env: vec![],
            pty: false,
            lookup: None,
        };
        decide(&p, "alice", &query("shell.exec", target), now())
    };
    assert_eq!(line(&["ls", "-l"]).verdict, Verdict::Allow);
    assert_eq!(line(&["git", "status"]).verdict, Verdict::Allow);
    // `*` crosses `/`: arguments are paths.
    let rm = line(&["rm", "build/out.o"]);
    assert_eq!(
        rm.verdict,
        Verdict::RequireApproval(ApprovalPolicy::AskOnce)
    );
    assert!(rm.rule.contains("`rm *`"), "{}", rm.rule);
    assert_eq!(
        line(&["git", "push", "origin"]).verdict,
        Verdict::RequireApproval(ApprovalPolicy::AlwaysAsk)
    );
    // The strictest match of every grant wins.
    assert_eq!(
        line(&["rm", "-rf", "/home"]).verdict,
        Verdict::Deny(Denial::Blocked)
    );
    assert_eq!(
        line(&["git", "push", "--force", "x"]).verdict,
        Verdict::Deny(Denial::Blocked)
    );
}

//! `portcullis policy check|explain` as an operator runs them: the real
//! binary, real files, exit codes and output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn portcullis(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .output()
        .expect("run portcullis")
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The shipped policy with its principal enabled and its example
/// `service_restart` tool defined (explain reads no script), in a
/// temporary file.
fn enabled_policy() -> PathBuf {
    let text = std::fs::read_to_string(repo("policy/default-policy.toml")).unwrap();
    let path =
        std::env::temp_dir().join(format!("portcullis-cli-policy-{}.toml", std::process::id()));
    let tool = "\n[[tool]]\nname = \"service_restart\"\ndescription = \"d\"\nrisk = \"high\"\n\
                approval_policy = \"ask_once\"\nscript = \"tools/service_restart.rhai\"\n\
                input_schema = { type = \"object\" }\n";
    std::fs::write(
        &path,
        text.replace("disabled = true", "disabled = false") + tool,
    )
    .unwrap();
    path
}

#[test]
fn check_accepts_the_shipped_policy() {
    let out = portcullis(&[
        "policy",
        "check",
        repo("policy/default-policy.toml").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("ok: "),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn check_reports_file_line_and_column() {
    let file = repo("policy/tests/broken/02-undefined-root.toml");
    let out = portcullis(&["policy", "check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("02-undefined-root.toml:15:1: grant `ops`: root `logs` is not defined"),
        "{stderr}"
    );

    let out = portcullis(&["policy", "check", "--json", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], false);
    assert_eq!(
        (
            json["errors"][0]["line"].as_u64(),
            json["errors"][0]["column"].as_u64()
        ),
        (Some(15), Some(1))
    );
}

#[test]
fn check_of_a_missing_file_says_so() {
    let out = portcullis(&["policy", "check", "/nonexistent/policy.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot read"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn explain_prints_the_decision_and_its_rule() {
    let policy = enabled_policy();
    let file = policy.to_str().unwrap();
    let explain = |extra: &[&str]| {
        let mut args = vec!["policy", "explain", "--file", file, "--principal", "agent"];
        args.extend_from_slice(extra);
        portcullis(&args)
    };

    let out = explain(&[
        "--method",
        "file.write",
        "--root",
        "workspace",
        "--path",
        "src/main.rs",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        "allowed: grant `agent-dev` gives root `workspace` rw"
    );

    let out = explain(&[
        "--method",
        "file.delete",
        "--root",
        "logs",
        "--path",
        "syslog",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stdout).trim(),
        "denied (permission_denied: read_only): grant `agent-dev` gives root `logs` read-only"
    );

    let out = explain(&[
        "--method",
        "tool.call",
        "--tool",
        "service_restart",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["decision"]["verdict"]["verdict"], "require_approval");
    assert_eq!(json["decision"]["verdict"]["detail"], "always_ask");

    let out = explain(&[
        "--method",
        "shell.exec",
        "--command",
        "git",
        "--cwd-root",
        "workspace",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    // A malformed --at is an error (exit 1), not a decision.
    let out = explain(&[
        "--method",
        "file.read",
        "--root",
        "workspace",
        "--at",
        "not-a-time",
    ]);
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_file(policy).unwrap();
}

/// A tool whose script is missing or does not compile fails the check,
/// each named; a good one passes.
#[test]
fn check_reports_tools_whose_scripts_are_missing_or_do_not_compile() {
    let dir = std::env::temp_dir().join(format!("portcullis-cli-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("tools")).unwrap();
    std::fs::write(dir.join("tools/good.rhai"), "1 + 1").unwrap();
    std::fs::write(dir.join("tools/broken.rhai"), "let = ;").unwrap();
    let tool = |name: &str| {
        format!(
            "[[tool]]\nname = \"{name}\"\ndescription = \"d\"\ninput_schema = {{ type = \"object\" }}\n\
             risk = \"low\"\napproval_policy = \"allow\"\nscript = \"tools/{name}.rhai\"\n\n"
        )
    };
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, tool("good")).unwrap();
    let out = portcullis(&["policy", "check", policy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    std::fs::write(
        &policy,
        [tool("good"), tool("broken"), tool("missing")].concat(),
    )
    .unwrap();
    let out = portcullis(&["policy", "check", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("tool `broken`") && stderr.contains("does not compile"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tool `missing`") && stderr.contains("cannot read"),
        "{stderr}"
    );
    assert!(!stderr.contains("tool `good`"), "{stderr}");
    assert!(stderr.contains("2 errors"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

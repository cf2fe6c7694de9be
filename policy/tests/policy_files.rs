//! The shipped default policy loads; each broken policy in `tests/broken/`
//! fails with the exact line, column and message its first line expects:
//!
//! ```text
//! # expect: LINE:COLUMN: message text (a prefix is enough)
//! ```

use std::path::Path;

use portcullis_policy::{DEFAULT_POLICY, parse};

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

//! Arbitrary bytes as a policy file: parsing and validation never panic,
//! every error has a position inside the text, and a policy that loads can
//! be asked anything without panicking.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use portcullis_policy::{Query, Target, decide, parse, summary};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text, "fuzz.toml", Path::new("/etc/portcullis")) {
        Err(errors) => {
            assert!(
                !errors.0.is_empty(),
                "a failed parse reports at least one error"
            );
            let lines = text.lines().count().max(1) + 1;
            for e in &errors.0 {
                assert!(
                    e.line >= 1 && e.line <= lines,
                    "error line {} outside the text: {e}",
                    e.line
                );
            }
        }
        Ok(policy) => {
            let now = jiff::Timestamp::UNIX_EPOCH;
            for principal in policy
                .principals
                .iter()
                .map(|p| p.id.clone())
                .chain(["nobody".to_string()])
            {
                let _ = summary(&policy, &principal, now);
                for root in policy.roots.iter().map(|r| r.id.clone()) {
                    for method in ["file.read", "file.write", "file.move"] {
                        let target = Target::Path {
                            root: root.clone(),
                            path: "a/../b".into(),
                        };
                        let _ = decide(
                            &policy,
                            &principal,
                            &Query {
                                method: method.into(),
                                target,
                            },
                            now,
                        );
                    }
                }
                for tool in policy.tools.iter().map(|t| t.name.clone()) {
                    let target = Target::Tool { name: tool };
                    let _ = decide(
                        &policy,
                        &principal,
                        &Query {
                            method: "tool.call".into(),
                            target,
                        },
                        now,
                    );
                }
                let target = Target::Command {
                    program: "sh".into(),
                    args: vec![],
                    cwd: None,
                    env: vec![],
                    pty: true,
                    lookup: None,
                };
                let _ = decide(
                    &policy,
                    &principal,
                    &Query {
                        method: "shell.exec".into(),
                        target,
                    },
                    now,
                );
            }
        }
    }
});

//! The `hello` a session opens with, and what changes of it a policy
//! reload announces: only what the principal is granted.

use std::collections::{BTreeMap, BTreeSet};

use portcullis_policy::{Capability, Policy, Summary};
use serde_json::{Map, Value, json};

/// The descriptors of the tools `principal` may call, by name.
pub(super) fn tools_by_name(
    policy: &Policy,
    principal: &str,
    now: jiff::Timestamp,
) -> BTreeMap<String, Value> {
    portcullis_policy::tool_descriptors(policy, principal, now)
        .into_iter()
        .collect()
}

/// The `capabilities` of a hello: only what the principal is granted.
pub fn capabilities_json(policy: &Policy, granted: &Summary) -> Map<String, Value> {
    let mut caps = Map::new();
    if !granted.fileops.is_empty() {
        let roots: Vec<Value> = granted
            .fileops
            .iter()
            .filter_map(|(id, mode)| {
                let root = policy.root(id)?;
                Some(json!({"root_id": id, "label": root.description.clone().unwrap_or_else(|| id.clone()),
                            "virtual_path": root.virtual_path, "mode": mode.as_str(),
                            "follow_symlinks": root.follow_symlinks}))
            })
            .collect();
        // `generation` (additive): the policy's, which a reload changes.
        caps.insert(
            "fileops".into(),
            json!({"enabled": true, "roots": roots, "generation": policy.generation}),
        );
    }
    if granted.shell {
        // `persist` and `cwd_roots` (additive): whether every process
        // outlives its session, and where commands may run.
        caps.insert(
            "shell".into(),
            json!({"enabled": true, "runtime": "portcullis", "interactive": granted.pty,
                   "persist": granted.persist, "cwd_roots": granted.cwd_roots}),
        );
    }
    if !granted.tools.is_empty() {
        caps.insert(
            "tools".into(),
            json!({"enabled": true, "tool_count": granted.tools.len()}),
        );
    }
    if granted.scripts {
        caps.insert("scripts".into(), json!({"enabled": true}));
    }
    if granted.resources {
        caps.insert("resources".into(), json!({"enabled": true}));
    }
    if granted.artifacts {
        caps.insert(
            "artifacts".into(),
            json!({"enabled": true, "upload": "http"}),
        );
    }
    caps
}

pub(super) fn granted_names(granted: &Summary) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let caps = [
        (Capability::Fileops, !granted.fileops.is_empty()),
        (Capability::Shell, granted.shell),
        (Capability::Tools, !granted.tools.is_empty()),
        (Capability::Scripts, granted.scripts),
        (Capability::Resources, granted.resources),
        (Capability::Artifacts, granted.artifacts),
    ];
    for (cap, on) in caps {
        if on {
            names.insert(cap.as_str().to_string());
        }
    }
    names
}

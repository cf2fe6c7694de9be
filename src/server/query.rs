//! From a decoded request to the policy's [`Query`]: which of its params
//! matter to the decision. A param of the wrong type is `invalid_request`
//! here, before policy sees it.

use portcullis_policy::{Query, Target};
use serde_json::{Map, Value};

use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};

pub fn query_for(request: &Request) -> Result<Query, ErrorBody> {
    let p = &request.params;
    let method = request.method.as_str();
    let target = match method {
        "file.move" | "file.copy" => {
            let root = string(p, "root_id")?;
            let to_root = optional_string(p, "to_root_id")?.unwrap_or_else(|| root.clone());
            Target::Transfer {
                from: (root, string(p, "path")?),
                to: (to_root, string(p, "to_path")?),
            }
        }
        "file.read" | "file.write" | "file.append" | "file.list" | "file.stat" | "file.mkdir"
        | "file.delete" | "file.search" | "file.watch" => Target::Path {
            root: string(p, "root_id")?,
            path: string(p, "path")?,
        },
        "shell.exec" | "shell.start" => {
            let program = match p.get("command") {
                Some(Value::Array(argv)) => match argv.first() {
                    Some(Value::String(program)) => program.clone(),
                    _ => return Err(invalid("`command` must be a non-empty array of strings")),
                },
                _ => {
                    return Err(invalid(
                        "`command` (an array of strings: program and arguments) is required",
                    ));
                }
            };
            let cwd = match optional_string(p, "root_id")? {
                Some(root) => Some((root, optional_string(p, "cwd")?.unwrap_or_default())),
                None => None,
            };
            let env = match p.get("env") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(vars)) => vars
                    .iter()
                    .map(|(k, v)| match v {
                        Value::String(v) => Ok((k.clone(), v.clone())),
                        _ => Err(invalid("`env` values must be strings")),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(invalid("`env` must be an object of strings")),
            };
            let pty = matches!(p.get("pty"), Some(Value::Bool(true)));
            Target::Command {
                program,
                cwd,
                env,
                pty,
                lookup: Some(portcullis_policy::ProgramLookup(crate::shell::find_on_path)),
            }
        }
        "tool.call" => Target::Tool {
            name: string(p, "name")?,
        },
        "script.run" => Target::Script {
            requested: requested_limits(p)?,
        },
        _ => Target::None,
    };
    Ok(Query {
        method: request.method.clone(),
        target,
    })
}

/// Whether the policy still allows `request` for `principal` now: how a
/// policy change is applied to what already runs (requests in flight,
/// resources, persistent processes).
pub fn still_allowed(
    policy: &portcullis_policy::Policy,
    principal: &str,
    request: &Request,
    now: jiff::Timestamp,
) -> bool {
    query_for(request).is_ok_and(|query| {
        let decision = portcullis_policy::decide(policy, principal, &query, now);
        matches!(decision.verdict, portcullis_policy::Verdict::Allow)
    })
}

/// `script.run`'s `limits`: the ones the request names (it may ask for
/// less than the grant, never more: policy takes the smaller of each).
fn requested_limits(
    params: &Map<String, Value>,
) -> Result<Option<portcullis_policy::ScriptLimits>, ErrorBody> {
    let Some(asked) = params.get("limits") else {
        return Ok(None);
    };
    let Value::Object(asked) = asked else {
        return Err(invalid("`limits` must be an object"));
    };
    let mut limits = portcullis_policy::ScriptLimits {
        max_operations: u64::MAX,
        max_wall_time: std::time::Duration::MAX,
        max_string_size: u64::MAX,
        max_array_len: u64::MAX,
        max_map_len: u64::MAX,
        max_call_depth: u64::MAX,
        max_tool_calls: u64::MAX,
        max_output: u64::MAX,
    };
    for (key, value) in asked {
        let n = value
            .as_u64()
            .ok_or_else(|| invalid(&format!("limits.{key} must be a non-negative integer")))?;
        let field = match key.as_str() {
            "max_operations" => &mut limits.max_operations,
            "max_string_size" => &mut limits.max_string_size,
            "max_array_len" => &mut limits.max_array_len,
            "max_map_len" => &mut limits.max_map_len,
            "max_call_depth" => &mut limits.max_call_depth,
            "max_tool_calls" => &mut limits.max_tool_calls,
            "max_output" => &mut limits.max_output,
            "max_wall_time_ms" => {
                limits.max_wall_time = std::time::Duration::from_millis(n);
                continue;
            }
            other => return Err(invalid(&format!("limits.{other} is not a script limit"))),
        };
        *field = n;
    }
    Ok(Some(limits))
}

fn invalid(message: &str) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

fn string(params: &Map<String, Value>, key: &str) -> Result<String, ErrorBody> {
    optional_string(params, key)?.ok_or_else(|| invalid(&format!("`{key}` (a string) is required")))
}

fn optional_string(params: &Map<String, Value>, key: &str) -> Result<Option<String>, ErrorBody> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(&format!("`{key}` must be a string"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_wire::frame::RequestId;
    use serde_json::json;

    fn request(method: &str, params: Value) -> Request {
        let Value::Object(params) = params else {
            panic!()
        };
        Request {
            id: RequestId::new("r").unwrap(),
            method: method.into(),
            params,
            context: None,
        }
    }

    #[test]
    fn maps_params_to_targets() {
        let q = query_for(&request(
            "file.read",
            json!({"root_id": "main", "path": "a"}),
        ))
        .unwrap();
        assert_eq!(
            q.target,
            Target::Path {
                root: "main".into(),
                path: "a".into()
            }
        );
        let q = query_for(&request(
            "file.move",
            json!({"root_id": "main", "path": "a", "to_path": "b"}),
        ))
        .unwrap();
        assert_eq!(
            q.target,
            Target::Transfer {
                from: ("main".into(), "a".into()),
                to: ("main".into(), "b".into())
            }
        );
        let q = query_for(&request(
            "shell.exec",
            json!({"command": ["git", "status"], "env": {"LANG": "C"}}),
        ))
        .unwrap();
        assert_eq!(
            q.target,
            Target::Command {
                program: "git".into(),
                cwd: None,
                env: vec![("LANG".into(), "C".into())],
                pty: false,
                lookup: Some(portcullis_policy::ProgramLookup(crate::shell::find_on_path)),
            }
        );
        assert_eq!(
            query_for(&request("resource.list", json!({})))
                .unwrap()
                .target,
            Target::None
        );
        // Unknown methods are left for policy to call unknown, whatever their params.
        assert_eq!(
            query_for(&request("file.teleport", json!({})))
                .unwrap()
                .target,
            Target::None
        );
    }

    #[test]
    fn wrong_types_are_invalid_requests() {
        for (method, params) in [
            ("file.read", json!({"root_id": "main"})),
            ("file.read", json!({"root_id": 7, "path": "a"})),
            ("shell.exec", json!({"command": "git status"})),
            ("shell.exec", json!({"command": []})),
            ("shell.exec", json!({"command": ["ls"], "env": {"A": 1}})),
            ("tool.call", json!({})),
        ] {
            let err = query_for(&request(method, params.clone())).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{method} {params}");
        }
    }
}

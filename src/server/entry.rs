//! A request's audit entry: what the session (and a script, for the
//! requests it makes) records about it when it starts and when it ends.

use portcullis_policy::{Denial, Target};
use portcullis_store::{Record as AuditRecord, Status};
use serde_json::Value;

use crate::provider::Usage;
use portcullis_wire::frame::{ErrorBody, ErrorCode};

/// Methods that get an audit entry when they start as well as when they end.
pub const LONG_RUNNING: &[&str] = &[
    "shell.exec",
    "shell.start",
    "shell.attach",
    "tool.call",
    "script.run",
    "file.search",
];

/// Root, path, command or tool, as the client asked (cut to 256 characters).
pub fn describe_target(record: &mut AuditRecord, target: &Target) {
    let cut = |s: &str| s.chars().take(256).collect::<String>();
    match target {
        Target::Path { root, path } => {
            (record.root, record.path) = (Some(cut(root)), Some(cut(path)))
        }
        Target::Transfer { from, to } => {
            record.root = Some(cut(&from.0));
            record.path = Some(format!("{} -> {}:{}", cut(&from.1), cut(&to.0), cut(&to.1)));
        }
        Target::Command { program, cwd, .. } => {
            record.command = Some(cut(program));
            if let Some((root, path)) = cwd {
                (record.root, record.path) = (Some(cut(root)), Some(cut(path)));
            }
        }
        Target::Tool { name } => record.tool = Some(cut(name)),
        Target::Script { .. } | Target::None => {}
    }
}

/// The wire name of an error code (`permission_denied`, …).
pub fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

pub fn error_code(denial: Denial) -> ErrorCode {
    serde_json::from_value(Value::String(denial.error_code().to_string()))
        .unwrap_or(ErrorCode::PermissionDenied)
}

/// Fills in how a request ended: completion time, bytes, status and error
/// code, and a command's exit code and sandbox warning when the result
/// carries them.
pub fn complete(
    record: &mut AuditRecord,
    result: Option<&Value>,
    error: Option<&ErrorBody>,
    usage: &Usage,
) {
    record.completed_at = Some(jiff::Timestamp::now().to_string());
    (record.bytes_in, record.bytes_out) = usage.totals();
    record.exit_code = result
        .and_then(|r| r.get("exit_code")?.as_i64())
        .and_then(|code| i32::try_from(code).ok());
    record.warning = result
        .and_then(|r| r.get("sandbox_warning")?.as_str())
        .map(str::to_string);
    (record.status, record.error_code) = match error {
        None => (Some(Status::Succeeded), None),
        Some(e) if e.code == ErrorCode::Cancelled => {
            (Some(Status::Cancelled), Some(code_name(e.code)))
        }
        Some(e) => (Some(Status::Failed), Some(code_name(e.code))),
    };
}

//! A request's audit entry: what the session (and a script, for the
//! requests it makes) records about it when it starts and when it ends.

use portcullis_policy::Target;
use portcullis_store::{Record as AuditRecord, Status};
use serde_json::Value;

use crate::provider::Usage;
pub use crate::provider::{audit_unavailable, error_code};
use portcullis_wire::frame::{ErrorBody, ErrorCode};

/// Root, path, command or tool, as the client asked (cut to 256 characters).
pub fn describe_target(record: &mut AuditRecord, target: &Target) {
    let cut = |s: &str| s.chars().take(256).collect::<String>();
    match target {
        Target::Path { root, path } => {
            (record.root, record.path) = (Some(cut(root)), Some(cut(path)));
            record.mount_ids = vec![cut(root)];
        }
        Target::Transfer { from, to } => {
            record.root = Some(cut(&from.0));
            record.path = Some(format!("{} -> {}:{}", cut(&from.1), cut(&to.0), cut(&to.1)));
            record.mount_ids = vec![cut(&from.0)];
            if to.0 != from.0 {
                record.mount_ids.push(cut(&to.0));
            }
        }
        Target::Command { program, cwd, .. } => {
            record.command = Some(cut(program));
            if let Some((root, path)) = cwd {
                (record.root, record.path) = (Some(cut(root)), Some(cut(path)));
                record.mount_ids = vec![cut(root)];
            }
        }
        Target::Tool { name } => record.tool = Some(cut(name)),
        Target::Artifact { mime_type, size } => {
            record.detail = Some(format!("{} bytes of {}", size, cut(mime_type)))
        }
        Target::Script { .. } | Target::None => {}
    }
}

/// The wire name of an error code, as an entry records it.
pub fn code_name(code: ErrorCode) -> String {
    code.as_str().to_string()
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
    let (status, code) = crate::provider::audit_status(error);
    (record.status, record.error_code) = (Some(status), code);
    let details = error.and_then(|e| e.details.as_ref());
    let lost = details.and_then(|d| d.get("lost")?.as_bool()) == Some(true);
    if lost {
        record.status = Some(Status::Lost);
    }
    record.error_name = error.map(|e| error_name(e.code, details).to_string());
    // What a result (or a timed-out command's, in `details`) says was cut.
    let outcome = result.or(details);
    let truncated = ["stdout_truncated", "stderr_truncated", "output_truncated"]
        .iter()
        .any(|field| outcome.and_then(|r| r.get(*field)?.as_bool()) == Some(true));
    record.output_truncated = outcome.is_some().then_some(truncated);
    if record.resource_id.is_none() {
        record.resource_id = result
            .and_then(|r| r.get("process_id").or(r.get("watch")).or(r.get("id")))
            .and_then(Value::as_str)
            .map(|id| id.chars().take(128).collect());
    }
}

/// The 0.92 profile's name for an error (`envproto::codes::error_name`);
/// a lost handle is a session's when its details say `terminal`.
pub fn error_name(code: ErrorCode, details: Option<&Value>) -> &'static str {
    let session = details.and_then(|d| d.get("terminal")?.as_bool()) == Some(true);
    portcullis_wire::envproto::codes::error_name(code, details, session)
}

/// The process, watch or resource a request's params name (the spec's
/// `resource_id`), cut to 128 characters.
pub fn resource_of(params: &serde_json::Map<String, Value>) -> Option<String> {
    ["process_id", "watch", "request_id"]
        .iter()
        .find_map(|field| params.get(*field)?.as_str())
        .or_else(|| params.get("id")?.as_str())
        .map(|id| id.chars().take(128).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversion agrees with the code names policy gives its denials
    /// (`policy explain` prints those).
    #[test]
    fn every_denial_answers_with_the_code_policy_names() {
        use portcullis_policy::Denial::*;
        for denial in [
            UnknownMethod,
            CapabilityUnavailable,
            UnknownPrincipal,
            PrincipalDisabled,
            PrincipalExpired,
            NotGranted,
            ReadOnly,
            BadPath,
            UnknownRoot,
            UnknownTool,
            Blocked,
            InvalidRequest,
        ] {
            assert_eq!(
                error_code(denial).as_str(),
                denial.error_code(),
                "{denial:?}"
            );
        }
    }
}

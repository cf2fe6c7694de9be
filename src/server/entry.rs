//! A request's audit entry: what the session (and a script, for the
//! requests it makes) records about it when it starts and when it ends.

use portcullis_policy::Target;
use portcullis_store::Record as AuditRecord;
use serde_json::Value;

use crate::provider::Usage;
pub use crate::provider::{audit_unavailable, error_code};
use portcullis_wire::frame::{ErrorBody, ErrorCode};

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

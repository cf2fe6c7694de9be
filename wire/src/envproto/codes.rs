//! The profile's error codes: JSON-RPC numbers, stable across releases,
//! each with its symbolic name from the spec's list (`data.name`).

use crate::frame::ErrorCode;

/// Every symbolic name the spec lists, with the number this provider
/// sends for it. The JSON-RPC reserved numbers are used where JSON-RPC or
/// LSP has one (`-32600`, `-32601`, `-32603`, `-32800`); the rest sit in
/// the server range, `permission_denied` at `-32040` as the spec's
/// example has it.
pub const ERROR_CODES: &[(&str, i64)] = &[
    ("parse_error", -32700),
    ("invalid_request", -32600),
    ("unknown_method", -32601),
    ("provider_error", -32603),
    ("cancelled", -32800),
    ("unsupported_protocol", -32001),
    ("capability_unavailable", -32010),
    ("provider_offline", -32011),
    ("provider_paused", -32012),
    ("transport_error", -32013),
    ("permission_denied", -32040),
    ("approval_required", -32041),
    ("policy_blocked", -32042),
    ("not_found", -32044),
    ("conflict", -32049),
    ("timeout", -32050),
    ("resource_lost", -32060),
    ("process_lost", -32061),
    ("session_lost", -32062),
    ("artifact_error", -32070),
];

/// The number for a symbolic name (`provider_error`'s for one not listed).
pub fn number(name: &str) -> i64 {
    ERROR_CODES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(-32603, |(_, code)| *code)
}

/// The symbolic name this profile uses for a relay error code.
pub fn name_of(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::RelayDisconnected => "transport_error",
        ErrorCode::Unrecognized => "provider_error",
        other => other.as_str(),
    }
}

/// The spec's name for a relay error: a handle of an earlier run (a
/// `not_found` with `details.lost`) is `session_lost` when it named a
/// shell session, `process_lost` otherwise; other errors as [`name_of`].
pub fn error_name(
    code: ErrorCode,
    details: Option<&serde_json::Value>,
    session: bool,
) -> &'static str {
    let lost = code == ErrorCode::NotFound
        && details
            .and_then(|d| d.get("lost"))
            .and_then(serde_json::Value::as_bool)
            == Some(true);
    match (lost, session) {
        (true, true) => "session_lost",
        (true, false) => "process_lost",
        (false, _) => name_of(code),
    }
}

/// The relay error code for a symbolic name a runtime answered with (a
/// request the gateway sent it); names the relay lacks are
/// `provider_error`.
pub fn relay_code(name: &str) -> ErrorCode {
    serde_json::from_value::<ErrorCode>(serde_json::Value::String(name.to_string()))
        .ok()
        .filter(|c| *c != ErrorCode::Unrecognized)
        .unwrap_or(ErrorCode::ProviderError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_are_each_unique_and_the_spec_s_example_holds() {
        let mut names: Vec<_> = ERROR_CODES.iter().map(|(n, _)| *n).collect();
        let mut numbers: Vec<_> = ERROR_CODES.iter().map(|(_, c)| *c).collect();
        names.sort_unstable();
        names.dedup();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(names.len(), ERROR_CODES.len());
        assert_eq!(numbers.len(), ERROR_CODES.len());
        // 02-protocol.md, "Error Codes".
        assert_eq!(number("permission_denied"), -32040);
    }

    #[test]
    fn every_name_the_spec_lists_has_a_number() {
        // 02-protocol.md, "Common symbolic names", as written there.
        let spec = "invalid_request unknown_method unsupported_protocol capability_unavailable \
                    provider_offline provider_paused permission_denied approval_required \
                    policy_blocked not_found conflict timeout cancelled resource_lost \
                    process_lost session_lost artifact_error provider_error transport_error";
        for name in spec.split_whitespace() {
            assert!(
                ERROR_CODES.iter().any(|(n, _)| *n == name),
                "{name} has no number"
            );
        }
    }

    #[test]
    fn every_relay_code_maps_to_a_listed_name() {
        use ErrorCode::*;
        for code in ErrorCode::ALL {
            let name = name_of(code);
            assert!(ERROR_CODES.iter().any(|(n, _)| *n == name), "{name}");
        }
        assert_eq!(relay_code("not_found"), NotFound);
        assert_eq!(relay_code("session_lost"), ProviderError);
        assert_eq!(relay_code("nonsense"), ProviderError);
    }
}

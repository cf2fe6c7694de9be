//! The `ya-environment-relay.v1` frames: typed, strict where it matters
//! (ids, method names, sizes, nesting), lenient where the protocol says so
//! (unknown fields are ignored, additive fields are fine).
//!
//! A frame travels as the JSON body of a record of kind `0x01`
//! (see [`crate::record`]). [`decode_frame`] is the only way bytes become a
//! [`Frame`]; it checks size and nesting before serde sees the input and
//! validates the result after.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

/// The protocol string a `hello` carries.
pub const PROTOCOL: &str = "ya-environment-relay.v1";

/// Deepest JSON nesting accepted in a frame (objects and arrays).
pub const MAX_JSON_DEPTH: usize = 64;

/// Longest request id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Longest method or event name, in bytes.
pub const MAX_NAME_LEN: usize = 64;

/// Longest value of the short string fields (context ids, reasons, versions).
pub const MAX_SHORT_FIELD_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Frame {
    Hello(Hello),
    Event(Event),
    Request(Request),
    Response(Response),
    Stream(Stream),
    Cancel(Cancel),
    Ping(Heartbeat),
    Pong(Heartbeat),
}

/// Sent first by the provider (the gateway), advertising what the
/// authenticated principal may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_version: Option<String>,
    /// Additive: changes each time the daemon starts, so a client can tell
    /// that handles from an earlier instance are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Additive: whom the gateway authenticated (`client_id` is the
    /// provider's own id, as the spec has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Additive: the largest frame (bytes of JSON) this side takes in
    /// parts (record kind 0x03); a larger one is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_frame: Option<u64>,
    #[serde(default)]
    pub capabilities: Map<String, Value>,
}

/// A root a hello announces (`capabilities.fileops.roots`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnouncedRoot {
    pub root_id: String,
    pub label: String,
    pub virtual_path: String,
    /// `ro` or `rw`.
    pub mode: String,
    pub follow_symlinks: bool,
}

impl Hello {
    /// The roots its capabilities announce, in order; an entry without an
    /// id or a virtual path is passed over.
    pub fn roots(&self) -> Vec<AnnouncedRoot> {
        announced_roots(&self.capabilities)
    }
}

/// [`Hello::roots`] of a hello's `capabilities` (or a
/// `capability.updated` event's).
pub fn announced_roots(capabilities: &Map<String, Value>) -> Vec<AnnouncedRoot> {
    let Some(roots) = capabilities
        .get("fileops")
        .and_then(|f| f.get("roots"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    roots
        .iter()
        .filter_map(|r| {
            let text = |field: &str| r.get(field).and_then(Value::as_str).map(str::to_string);
            let root_id = text("root_id")?;
            Some(AnnouncedRoot {
                label: text("label").unwrap_or_else(|| root_id.clone()),
                virtual_path: text("virtual_path")?,
                mode: text("mode").unwrap_or_else(|| "ro".into()),
                follow_symlinks: r.get("follow_symlinks").and_then(Value::as_bool) == Some(true),
                root_id,
            })
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub event: String,
    #[serde(default)]
    pub payload: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    #[serde(default)]
    pub params: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<RequestContext>,
}

/// Who in the runtime asked: carried into the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
}

/// The terminal answer to a request: exactly one of `result` and `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: RequestId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    pub fn ok(id: RequestId, result: Value) -> Self {
        Self {
            id,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(id: RequestId, error: ErrorBody) -> Self {
        Self {
            id,
            result: None,
            error: Some(error),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default)]
    pub recoverable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ErrorBody {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            recoverable: code.is_recoverable(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
}

/// The error codes of `ya-environment-relay.v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    UnknownMethod,
    CapabilityUnavailable,
    PermissionDenied,
    ApprovalRequired,
    PolicyBlocked,
    NotFound,
    Timeout,
    Cancelled,
    ProviderError,
    RelayDisconnected,
    ArtifactError,
    /// A code this build does not know (a newer peer); never sent.
    #[serde(other)]
    Unrecognized,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 13] = [
        Self::InvalidRequest,
        Self::UnknownMethod,
        Self::CapabilityUnavailable,
        Self::PermissionDenied,
        Self::ApprovalRequired,
        Self::PolicyBlocked,
        Self::NotFound,
        Self::Timeout,
        Self::Cancelled,
        Self::ProviderError,
        Self::RelayDisconnected,
        Self::ArtifactError,
        Self::Unrecognized,
    ];

    /// The code's wire name (`permission_denied`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::UnknownMethod => "unknown_method",
            Self::CapabilityUnavailable => "capability_unavailable",
            Self::PermissionDenied => "permission_denied",
            Self::ApprovalRequired => "approval_required",
            Self::PolicyBlocked => "policy_blocked",
            Self::NotFound => "not_found",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::ProviderError => "provider_error",
            Self::RelayDisconnected => "relay_disconnected",
            Self::ArtifactError => "artifact_error",
            Self::Unrecognized => "unrecognized",
        }
    }

    /// Whether retrying (perhaps after a change) can succeed, as a default
    /// for [`ErrorBody::recoverable`].
    pub fn is_recoverable(self) -> bool {
        !matches!(
            self,
            Self::UnknownMethod | Self::CapabilityUnavailable | Self::PolicyBlocked
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stream {
    pub id: RequestId,
    pub event: String,
    #[serde(default)]
    pub data: Value,
    /// Of output (`stdout`, `stderr`): where its first byte is in the
    /// request's output (all streams together, from 0), so a client that
    /// reattaches resumes at `sequence` + the bytes it holds of this frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// `base64` when `data` holds output that is not UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    pub id: RequestId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The body of `ping` and `pong`; a pong echoes the ping's id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<String>,
}

/// A request id: 1 to [`MAX_ID_LEN`] bytes of UTF-8 without control
/// characters. Unique within a connection while its request is in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RequestId(String);

impl RequestId {
    pub fn new(id: impl Into<String>) -> Result<Self, FrameError> {
        let id = id.into();
        check_id(&id)?;
        Ok(Self(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RequestId {
    type Error = FrameError;
    fn try_from(id: String) -> Result<Self, FrameError> {
        Self::new(id)
    }
}

impl From<RequestId> for String {
    fn from(id: RequestId) -> String {
        id.0
    }
}

// Lets maps keyed by id be searched with the id of a chunk header.
impl std::borrow::Borrow<str> for RequestId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why bytes are not a valid frame. Each message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("frame JSON nests deeper than {MAX_JSON_DEPTH} levels")]
    TooDeep,
    /// serde's description, which includes id errors found while parsing.
    /// `line` is 0 when the fault is not tied to a position.
    #[error("frame is not valid: {message}{}", position(*line, *column))]
    Json {
        message: String,
        line: usize,
        column: usize,
    },
    #[error("request id is empty")]
    EmptyId,
    #[error("request id is {len} bytes; at most {MAX_ID_LEN} are allowed")]
    IdTooLong { len: usize },
    #[error("request id contains a control character")]
    IdControlCharacter,
    #[error(
        "{what} `{name}` is not a valid name: use 1 to {MAX_NAME_LEN} of a-z, 0-9, `_`, `.` and `-`"
    )]
    InvalidName { what: &'static str, name: String },
    #[error("field `{field}` is {len} bytes; at most {max} are allowed")]
    FieldTooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("a response carries exactly one of `result` and `error`")]
    ResponseShape,
    #[error("`hello` names protocol `{0}`; this gateway speaks `{PROTOCOL}`")]
    WrongProtocol(String),
}

/// Parses and validates one frame from the JSON body of a record.
pub fn decode_frame(json: &[u8]) -> Result<Frame, FrameError> {
    check_depth(json)?;
    let frame: Frame = serde_json::from_slice(json).map_err(|e| FrameError::Json {
        message: strip_position(&e),
        line: e.line(),
        column: e.column(),
    })?;
    frame.validate()?;
    Ok(frame)
}

/// Serialises a frame to JSON. Frames built by this crate always serialise.
pub fn encode_frame_json(frame: &Frame, out: &mut Vec<u8>) {
    // Serialising these types into a Vec cannot fail: every map key is a
    // string and no Serialize impl here returns an error.
    let _ = serde_json::to_writer(out, frame);
}

/// When a frame fails to decode, the id of the request it was meant to be,
/// if one can be read: lets a provider answer `invalid_request` to the
/// right request instead of dropping it silently.
pub fn salvage_request_id(json: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct IdOnly {
        #[serde(rename = "type")]
        kind: String,
        id: String,
    }
    check_depth(json).ok()?;
    let probe: IdOnly = serde_json::from_slice(json).ok()?;
    (probe.kind == "request").then_some(())?;
    RequestId::new(probe.id).ok()
}

impl Frame {
    fn validate(&self) -> Result<(), FrameError> {
        match self {
            Frame::Hello(hello) => {
                if hello.protocol != PROTOCOL {
                    return Err(FrameError::WrongProtocol(truncate(&hello.protocol)));
                }
                for (field, value) in [
                    ("provider_id", &hello.provider_id),
                    ("client_id", &hello.client_id),
                    ("client_kind", &hello.client_kind),
                    ("client_version", &hello.client_version),
                    ("instance_id", &hello.instance_id),
                ] {
                    check_short(field, value.as_deref())?;
                }
                Ok(())
            }
            Frame::Event(event) => check_name("event", &event.event),
            Frame::Request(request) => {
                check_name("method", &request.method)?;
                if let Some(context) = &request.context {
                    check_short("context.session_id", context.session_id.as_deref())?;
                    check_short("context.run_id", context.run_id.as_deref())?;
                    check_short("context.tool_call_id", context.tool_call_id.as_deref())?;
                    check_short("context.workspace_id", context.workspace_id.as_deref())?;
                }
                Ok(())
            }
            Frame::Response(response) => match (&response.result, &response.error) {
                (Some(_), None) | (None, Some(_)) => Ok(()),
                _ => Err(FrameError::ResponseShape),
            },
            Frame::Stream(stream) => check_name("stream event", &stream.event),
            Frame::Cancel(cancel) => check_short("reason", cancel.reason.as_deref()),
            Frame::Ping(beat) | Frame::Pong(beat) => {
                check_short("id", beat.id.as_deref())?;
                check_short("ts", beat.ts.as_deref())
            }
        }
    }
}

fn check_id(id: &str) -> Result<(), FrameError> {
    if id.is_empty() {
        return Err(FrameError::EmptyId);
    }
    if id.len() > MAX_ID_LEN {
        return Err(FrameError::IdTooLong { len: id.len() });
    }
    if id.chars().any(char::is_control) {
        return Err(FrameError::IdControlCharacter);
    }
    Ok(())
}

pub(crate) fn validate_id(id: &str) -> Result<(), FrameError> {
    check_id(id)
}

fn check_name(what: &'static str, name: &str) -> Result<(), FrameError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if valid {
        Ok(())
    } else {
        Err(FrameError::InvalidName {
            what,
            name: truncate(name),
        })
    }
}

/// Whether a name a peer gives inside a payload (a connection id, an
/// artifact id) is fit to keep and log: not empty, at most
/// `MAX_SHORT_FIELD_LEN` bytes, no control characters.
pub fn is_short_name(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_SHORT_FIELD_LEN && !value.chars().any(char::is_control)
}

fn check_short(field: &'static str, value: Option<&str>) -> Result<(), FrameError> {
    match value {
        Some(v) if v.len() > MAX_SHORT_FIELD_LEN => Err(FrameError::FieldTooLong {
            field,
            len: v.len(),
            max: MAX_SHORT_FIELD_LEN,
        }),
        _ => Ok(()),
    }
}

/// Peer-supplied text quoted in an error is cut short and stripped of
/// control characters, so an error message cannot be used to flood a log.
fn truncate(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME_LEN)
        .collect()
}

fn position(line: usize, column: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(" (line {line}, column {column})")
    }
}

/// serde_json appends " at line L column C"; we report those as fields.
fn strip_position(e: &serde_json::Error) -> String {
    let message = e.to_string();
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message,
    }
}

/// Rejects JSON nested deeper than [`MAX_JSON_DEPTH`] before parsing, so
/// serde never recurses on hostile input. Brackets inside strings do not
/// count; malformed JSON is left for serde to describe.
fn check_depth(json: &[u8]) -> Result<(), FrameError> {
    let (mut depth, mut at) = (0usize, 0);
    while let Some(&byte) = json.get(at) {
        at += 1;
        match byte {
            // A string: skip to its closing quote (a large result is
            // mostly one string, so this is where the time goes).
            b'"' => loop {
                match memchr::memchr2(b'"', b'\\', &json[at.min(json.len())..]) {
                    Some(found) if json[at + found] == b'\\' => at += found + 2,
                    Some(found) => {
                        at += found + 1;
                        break;
                    }
                    None => return Ok(()),
                }
            },
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(FrameError::TooDeep);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_code_names_are_their_wire_names() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), json!(code.as_str()));
        }
    }

    fn decode(value: Value) -> Result<Frame, FrameError> {
        decode_frame(value.to_string().as_bytes())
    }

    #[test]
    fn decodes_the_spec_examples() {
        let request = decode(json!({
            "type": "request", "id": "req_123", "method": "file.read",
            "params": {"root_id": "main", "path": "README.md", "encoding": "utf-8"},
            "context": {"session_id": "session_abc", "run_id": "run_def", "tool_call_id": "call_ghi"}
        }))
        .unwrap();
        let Frame::Request(request) = request else {
            panic!("not a request")
        };
        assert_eq!(request.id.as_str(), "req_123");
        assert_eq!(request.method, "file.read");
        assert_eq!(request.params["path"], "README.md");
        assert_eq!(request.context.unwrap().run_id.as_deref(), Some("run_def"));

        let error = decode(json!({
            "type": "response", "id": "req_123",
            "error": {"code": "permission_denied", "message": "outside roots", "recoverable": true,
                      "details": {"root_id": "main"}}
        }))
        .unwrap();
        let Frame::Response(response) = error else {
            panic!("not a response")
        };
        assert_eq!(response.error.unwrap().code, ErrorCode::PermissionDenied);

        let cancel =
            decode(json!({"type": "cancel", "id": "req_shell_1", "reason": "user_cancelled"}));
        assert!(matches!(cancel, Ok(Frame::Cancel(_))));
        let ping = decode(json!({"type": "ping", "id": "ping_1", "ts": "2026-05-11T15:45:00Z"}));
        assert!(matches!(ping, Ok(Frame::Ping(_))));
        let accepted = decode(json!({"type": "event", "event": "relay.accepted",
            "payload": {"connection_id": "c", "accepted_capabilities": ["fileops"]}}));
        assert!(matches!(accepted, Ok(Frame::Event(_))));
    }

    #[test]
    fn ignores_unknown_fields_and_codes() {
        let frame =
            decode(json!({"type": "request", "id": "a", "method": "file.stat", "future": [1, 2]}));
        assert!(frame.is_ok());
        let frame = decode(json!({"type": "response", "id": "a",
            "error": {"code": "quota_exceeded", "message": "m"}}))
        .unwrap();
        let Frame::Response(response) = frame else {
            panic!()
        };
        assert_eq!(response.error.unwrap().code, ErrorCode::Unrecognized);
    }

    #[test]
    fn rejects_with_a_reason() {
        let unknown_type = decode(json!({"type": "teleport", "id": "a"})).unwrap_err();
        assert!(
            matches!(&unknown_type, FrameError::Json { message, .. } if message.contains("teleport"))
        );
        let no_method = decode(json!({"type": "request", "id": "a"})).unwrap_err();
        assert!(
            matches!(&no_method, FrameError::Json { message, .. } if message.contains("method"))
        );
        for (id, reason) in [
            (json!(""), "request id is empty"),
            (json!("a\nb"), "control character"),
            (json!("x".repeat(129)), "129 bytes"),
            (json!(7), "invalid type"),
        ] {
            let err = decode(json!({"type": "request", "id": id, "method": "x"})).unwrap_err();
            assert!(
                matches!(&err, FrameError::Json { message, .. } if message.contains(reason)),
                "{err}"
            );
            assert!(!err.to_string().contains("line 0"), "{err}");
        }
        assert_eq!(RequestId::new(""), Err(FrameError::EmptyId));
        assert_eq!(
            RequestId::new("a\u{7}"),
            Err(FrameError::IdControlCharacter)
        );
        assert_eq!(
            RequestId::new("x".repeat(129)),
            Err(FrameError::IdTooLong { len: 129 })
        );
        assert!(matches!(
            decode(json!({"type": "request", "id": "a", "method": "File.Read"})).unwrap_err(),
            FrameError::InvalidName { what: "method", .. }
        ));
        assert_eq!(
            decode(json!({"type": "response", "id": "a", "result": 1, "error": {"code": "timeout", "message": ""}}))
                .unwrap_err(),
            FrameError::ResponseShape
        );
        assert_eq!(
            decode(json!({"type": "response", "id": "a"})).unwrap_err(),
            FrameError::ResponseShape
        );
        assert!(matches!(
            decode(json!({"type": "hello", "protocol": "other.v9"})).unwrap_err(),
            FrameError::WrongProtocol(_)
        ));
        assert!(matches!(
            decode(json!({"type": "request", "id": "a", "method": "m", "params": [1]}))
                .unwrap_err(),
            FrameError::Json { .. }
        ));
    }

    #[test]
    fn nesting_is_bounded_but_brackets_in_strings_do_not_count() {
        let deep = format!(
            r#"{{"type":"request","id":"a","method":"m","params":{{"x":{}1{}}}}}"#,
            "[".repeat(70),
            "]".repeat(70)
        );
        assert_eq!(
            decode_frame(deep.as_bytes()).unwrap_err(),
            FrameError::TooDeep
        );
        let shallow_text = json!({"type": "request", "id": "a", "method": "m",
            "params": {"x": "[[[[[[[[[[".repeat(20), "y": "\\\"[[["}});
        assert!(decode(shallow_text).is_ok());
    }

    /// The pre-check, byte by byte as it was written first: what the
    /// skipping version must agree with.
    fn depth_byte_by_byte(json: &[u8]) -> bool {
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        for &byte in json {
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_JSON_DEPTH {
                        return false;
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        true
    }

    proptest::proptest! {
        /// Any bytes of the characters that matter (quotes, escapes,
        /// brackets), in any order: the same verdict as byte by byte.
        #[test]
        fn the_depth_check_skips_strings_as_a_byte_walk_would(
            json in proptest::collection::vec(
                // Opening brackets likelier, so both verdicts come up.
                proptest::sample::select(b"\"\\{{[[]}ax".to_vec()), 0..400)
        ) {
            proptest::prop_assert_eq!(check_depth(&json).is_ok(), depth_byte_by_byte(&json));
        }
    }

    #[test]
    fn salvages_the_id_of_a_malformed_request_only() {
        let bad = br#"{"type":"request","id":"r1","method":"NOT VALID"}"#;
        assert!(decode_frame(bad).is_err());
        assert_eq!(salvage_request_id(bad).unwrap().as_str(), "r1");
        assert_eq!(salvage_request_id(br#"{"type":"cancel","id":"r1"}"#), None);
        assert_eq!(salvage_request_id(b"not json"), None);
    }
}

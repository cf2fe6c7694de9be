//! Reading a request's params for its method's [`Target`]: a param of the
//! wrong type is `invalid_request`, before policy sees the request.
//!
//! [`Target`]: portcullis_policy::Target

use portcullis_wire::frame::{ErrorBody, ErrorCode};
use serde_json::{Map, Value};

pub fn invalid(message: &str) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, message)
}

/// `key`, a string the request must have.
pub fn string(params: &Map<String, Value>, key: &str) -> Result<String, ErrorBody> {
    optional_string(params, key)?.ok_or_else(|| invalid(&format!("`{key}` (a string) is required")))
}

/// `key`, a string or absent (`null` counts as absent).
pub fn optional_string(
    params: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, ErrorBody> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(&format!("`{key}` must be a string"))),
    }
}

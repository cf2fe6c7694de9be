//! What the log holds: the record a caller logs, the entry it becomes
//! (the record with its place in the chain and its hash), and how an entry
//! is stored.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A request, when it ends (or is refused).
    #[default]
    Request,
    /// A request that changes or runs anything (or reads for long): its
    /// intent, durable before it acts. Its completing entry names it in
    /// `start_seq`.
    RequestStart,
    /// Handshake and authentication failures, reloads, revocations.
    Security,
    /// A connection a command made through the egress proxy, allowed,
    /// before it is made (`request_id` names the command's request).
    EgressStart,
    /// A connection through the egress proxy, when refused or closed.
    Egress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allowed,
    Approved,
    Blocked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Succeeded,
    Failed,
    Cancelled,
    /// The gateway stopped (a crash, `kill -9`, power loss) between the
    /// request's start entry and its answer: whether its effect happened
    /// is unknown. Written when the log is next opened.
    Interrupted,
}

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

/// What a caller records. No secret, token or file content belongs here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub kind: Kind,
    /// RFC 3339.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// The gateway's session (connection) number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<RequestContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The policy rule that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// For an egress connection: `host:port` as the command asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default)]
    pub bytes_in: u64,
    #[serde(default)]
    pub bytes_out: u64,
    /// For security events: what happened (`auth_refused`, `policy_reloaded`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Something the operator should know about how the request ran (a
    /// command confined less than its grant asks, on a best-effort grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// For a completing entry of a request that left a start entry: that
    /// entry's sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_seq: Option<u64>,
    /// For a call a script made: the `script.run` request it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_request_id: Option<String>,
    /// For an approved call: who approved it (`uid 1000`, or `remembered`
    /// with the earlier approval's author).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
}

/// A stored entry: the record, its place in the chain, and its hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub prev: String,
    #[serde(flatten)]
    pub record: Record,
    pub hash: String,
}

/// The hashed part of an entry: everything but the hash itself.
#[derive(Serialize)]
pub(super) struct Hashed<'a> {
    seq: u64,
    prev: &'a str,
    #[serde(flatten)]
    record: &'a Record,
}

pub(super) fn entry_hash(seq: u64, prev: &str, record: &Record) -> String {
    stored_entry(seq, prev, record).0
}

/// An entry's hash and the entry as stored, from one serialization: the
/// stored JSON is the hashed JSON with `hash` added last, which is what
/// serializing [`Entry`] gives (a test holds them to it).
pub(super) fn stored_entry(seq: u64, prev: &str, record: &Record) -> (String, Vec<u8>) {
    let mut json = serde_json::to_vec(&Hashed { seq, prev, record }).unwrap_or_default();
    let hash = hex::encode(Sha256::digest(&json));
    json.pop(); // the closing brace
    json.extend_from_slice(b",\"hash\":\"");
    json.extend_from_slice(hash.as_bytes());
    json.extend_from_slice(b"\"}");
    (hash, json)
}

pub(super) fn key_seq(key: &[u8]) -> u64 {
    key.try_into().map(u64::from_be_bytes).unwrap_or(0)
}

pub(super) fn decode(key: &[u8], value: &[u8]) -> Result<Entry, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        seq: key_seq(key),
        message: e.to_string(),
    })
}

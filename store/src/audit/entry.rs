//! What the log holds: the record a caller logs, the entry it becomes
//! (the record with its place in the chain and its hash), and how an entry
//! is stored.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::codec::{self, Strings};
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
    /// A request the gateway sent to the runtime (`artifact.reserve`,
    /// `artifact.complete`, `artifact.abort`), when answered;
    /// `parent_request_id` names the request it was made for.
    ToRuntime,
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
    /// The request named a process or terminal session of an earlier run
    /// of the gateway, which ended with that run (the 0.92 spec's `lost`).
    Lost,
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
///
/// The fields every request of a session shares (peer, principal, the
/// connection's and the gateway's ids, transport, profile, the policy's
/// generation) are `Arc<str>`: a session makes them once, and each entry
/// clones a pointer instead of allocating a string on a runtime worker
/// that the audit writer's thread then frees.
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
    pub peer: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<Arc<str>>,
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
    pub policy_generation: Option<Arc<str>>,
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

    // The relay spec's `RelayAuditEntry` by its names (04-security-and-
    // policy.md), on request entries: `method`, `capability`,
    // `started_at`, `completed_at` and `status` above are already its;
    // these complete it. Entries written before them have none.
    /// The request's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The relay connection: the runtime's id for it (`relay.accepted`'s
    /// `connection_id`), else the gateway's session number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<Arc<str>>,
    /// The relay client, which is the provider: the gateway's `provider_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_decision: Option<Decision>,

    // The 0.92 spec's `EnvironmentAuditEntry` (ya-environment-protocol.v1,
    // 04-security-and-policy.md) by its names, on request entries of
    // either profile alike.
    /// The gateway's `provider_id` (the same as `client_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<Arc<str>>,
    /// The gateway run that served it (its hello's `instance_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<Arc<str>>,
    /// The roots (mounts) it named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mount_ids: Vec<String>,
    /// Where a command ran: `local` (this host, in the grant's sandbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_id: Option<String>,
    /// The process, session, watch or resource it made or acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<String>,
    /// The error's name in the 0.92 profile (`permission_denied`,
    /// `process_lost`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_name: Option<String>,
    /// Output was cut or dropped (a command's streams past their limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_truncated: Option<bool>,
    /// How the peer reached the gateway: `websocket` (dialed in),
    /// `websocket-out` (dialed out, Noise), `websocket-out-plain`, `stdio`
    /// or `unix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Arc<str>>,
    /// The protocol it spoke: `relay.v1` or `ya-environment-protocol.v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Arc<str>>,
}

impl Record {
    /// A request entry with the spec's fields filled from portcullis's own
    /// (the id, the context's ids at the top, the decision, a capability
    /// even for a method none serves: its namespace). Other kinds as they
    /// are.
    pub fn with_spec_names(mut self) -> Self {
        if !matches!(
            self.kind,
            Kind::Request | Kind::RequestStart | Kind::ToRuntime
        ) {
            return self;
        }
        self.id = self.id.or_else(|| self.request_id.clone());
        self.policy_decision = self.policy_decision.or(self.decision);
        if let Some(context) = &self.context {
            self.session_id = self.session_id.or_else(|| context.session_id.clone());
            self.run_id = self.run_id.or_else(|| context.run_id.clone());
            self.tool_call_id = self.tool_call_id.or_else(|| context.tool_call_id.clone());
        }
        if self.capability.is_none() {
            self.capability = self
                .method
                .as_deref()
                .map(|m| m.split('.').next().unwrap_or(m).to_string());
        }
        self
    }

    /// The request's run, session and tool call: the spec's top-level
    /// fields, or the context of an entry written before them.
    pub fn run(&self) -> Option<&str> {
        self.run_id
            .as_deref()
            .or(self.context.as_ref()?.run_id.as_deref())
    }

    pub fn session(&self) -> Option<&str> {
        self.session_id
            .as_deref()
            .or(self.context.as_ref()?.session_id.as_deref())
    }

    pub fn tool_call(&self) -> Option<&str> {
        self.tool_call_id
            .as_deref()
            .or(self.context.as_ref()?.tool_call_id.as_deref())
    }
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

/// An entry's hash and its JSON, from one serialization: the hashed JSON
/// with `hash` added last, which is what serializing [`Entry`] gives (a
/// test holds them to it). The journal holds this; sled the compact form.
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

/// The entries one value of sled's holds, each with the sequence number it
/// is stored at and its bytes (compact or JSON): one, under its own
/// number, or a group commit's, under the first one's (numbered on from
/// there).
pub(super) fn unpack<'v>(key: &[u8], value: &'v [u8]) -> Result<Vec<(u64, &'v [u8])>, StoreError> {
    let first = key_seq(key);
    if value.first() != Some(&codec::GROUP_V1) {
        return Ok(vec![(first, value)]);
    }
    let members = codec::members(value).map_err(|message| StoreError::Corrupt {
        seq: first,
        message,
    })?;
    Ok((first..).zip(members).collect())
}

/// The value holding entry `seq`: the last at or before it.
pub(super) fn holding(
    tree: &sled::Tree,
    seq: u64,
) -> Result<Option<(sled::IVec, sled::IVec)>, StoreError> {
    tree.range(..=seq.to_be_bytes())
        .next_back()
        .transpose()
        .map_err(StoreError::Sled)
}

/// Entry `seq`, if the log holds it.
pub(super) fn find(
    tree: &sled::Tree,
    seq: u64,
    strings: &Strings,
) -> Result<Option<Entry>, StoreError> {
    let Some((key, value)) = holding(tree, seq)? else {
        return Ok(None);
    };
    let found = unpack(&key, &value)?.into_iter().find(|(at, _)| *at == seq);
    found
        .map(|(at, bytes)| decode(&at.to_be_bytes(), bytes, strings))
        .transpose()
}

/// The last entry the log holds.
pub(super) fn last(tree: &sled::Tree, strings: &Strings) -> Result<Option<Entry>, StoreError> {
    let Some((key, value)) = tree.last().map_err(StoreError::Sled)? else {
        return Ok(None);
    };
    let last = unpack(&key, &value)?.pop();
    last.map(|(at, bytes)| decode(&at.to_be_bytes(), bytes, strings))
        .transpose()
}

/// One entry's bytes (see [`unpack`]): compact ([`super::codec`]), or JSON
/// as earlier builds stored it. `key` is where it is stored.
pub(super) fn decode(key: &[u8], value: &[u8], strings: &Strings) -> Result<Entry, StoreError> {
    let seq = key_seq(key);
    let corrupt = |message: String| StoreError::Corrupt { seq, message };
    match value.first() {
        Some(b'{') => serde_json::from_slice(value).map_err(|e| corrupt(e.to_string())),
        _ => codec::decode(value, strings).map_err(corrupt),
    }
}

/// The entry under `key` as JSON with its stored hash last — what its hash
/// is over, with the hash added: what an export carries and verification
/// reads. An entry stored as JSON is its bytes verbatim.
pub(super) fn entry_json<'v>(
    key: &[u8],
    value: &'v [u8],
    strings: &Strings,
) -> Result<Cow<'v, [u8]>, StoreError> {
    if value.first() == Some(&b'{') {
        return Ok(Cow::Borrowed(value));
    }
    let entry = decode(key, value, strings)?;
    // Serializing `Entry` gives the hashed JSON with `hash` last (a test
    // holds `stored_entry` to it).
    serde_json::to_vec(&entry)
        .map(Cow::Owned)
        .map_err(|e| StoreError::Corrupt {
            seq: entry.seq,
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as a gateway wrote it before the spec's names were added
    /// (the bytes as stored): it decodes, and re-serializing its record
    /// gives the same bytes and hash, so it still verifies.
    #[test]
    fn an_entry_written_before_the_spec_s_names_still_hashes_the_same() {
        let stored = br#"{"seq":7,"prev":"00","kind":"request","started_at":"2026-11-20T10:00:00Z","completed_at":"2026-11-20T10:00:01Z","connection":3,"principal":"alice","request_id":"r1","method":"file.read","context":{"run_id":"run_1"},"decision":"allowed","status":"succeeded","bytes_in":0,"bytes_out":0,"hash":"5db6c2db41f7913b0c04fea41b9775d02e9811f5ff79d1f9a47435b1ca60c328"}"#;
        let entry = decode(&7u64.to_be_bytes(), stored, &Strings::default()).unwrap();
        let (hash, again) = stored_entry(entry.seq, &entry.prev, &entry.record);
        assert_eq!(hash, entry.hash);
        assert_eq!(again, stored);
        assert_eq!(entry.record.run(), Some("run_1"));
        // Written now, the same request carries the spec's names too.
        let now = entry.record.with_spec_names();
        assert_eq!(now.id.as_deref(), Some("r1"));
        assert_eq!(now.run_id.as_deref(), Some("run_1"));
        assert_eq!(now.policy_decision, Some(Decision::Allowed));
        assert_eq!(now.capability.as_deref(), Some("file"));
    }
}

//! How sled stores an entry: a compact binary encoding of exactly what is
//! hashed, with the strings that repeat from entry to entry (principal,
//! method, rule, policy generation, roots, …) stored once in the tree
//! `audit_strings` and named by number.
//!
//! The hash is not over these bytes: it stays the SHA-256 of the entry's
//! JSON ([`super::entry::stored_entry`]), which an entry decoded from here
//! serializes to again byte for byte, because the encoding keeps every
//! field's value exactly (a timestamp only in the short form when it reads
//! back as the same text). So `audit export` writes the JSON that was
//! hashed, and exports verify anywhere as before. Entries stored as JSON by
//! earlier builds (they begin with `{`) are read and verified as they are.
//!
//! A value of sled's is one entry, or a group commit's entries
//! ([`GROUP_V1`]). An entry's layout: [`COMPACT_V1`], the sequence number,
//! a varint whose bits say which optional fields follow ([`Field`]), the
//! kind, `started_at`, the present fields in [`Field`] order, `bytes_in`,
//! `bytes_out`, `prev`, `hash`. A text is a varint header whose low three
//! bits say how it is kept ([`Text`]).
//!
//! Everything read here came from disk and is checked as it is read: a
//! damaged or forged value is an error, never a panic or a huge
//! allocation.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::entry::{Decision, Entry, Kind, Record, RequestContext, Status};

/// The first byte of a compact entry (JSON entries begin with `{`).
pub(super) const COMPACT_V1: u8 = 1;
/// The first byte of a group commit's entries in one value, under the
/// first one's sequence number: a varint count, then each compact entry
/// after its length (a varint). One sled insert per group, not per entry:
/// sled copies a leaf on each insert, and stores each value with about
/// 117 bytes of its own.
pub(super) const GROUP_V1: u8 = 2;

/// Strings interned at most; past this they are stored in each entry.
/// Peers choose some interned values (a method name that no provider
/// serves is still logged), so the table is bounded: a flood of new names
/// costs size, never memory without end.
const MAX_STRINGS: usize = 16_384;
/// Longer strings are not interned.
const MAX_INTERNED_LEN: usize = 256;

/// How a text is kept: the low three bits of its header.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Text {
    /// UTF-8 bytes follow; the header's high bits are their length.
    Literal = 0,
    /// The header's high bits are its number in the string table.
    Interned = 1,
    /// Lowercase hex: the header's high bits are the count of raw bytes
    /// that follow.
    Hex = 2,
    /// An RFC 3339 timestamp as written by jiff: a zigzag varint of
    /// nanoseconds since the epoch follows.
    Time = 3,
    /// The same as the field's reference (`id` as `request_id`, …).
    SameAsReference = 4,
    /// A timestamp as nanoseconds after `started_at` (zigzag varint).
    TimeAfterStart = 5,
}

/// Optional fields, in the order they are written; the bit of each in the
/// presence varint is its number.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Field {
    CompletedAt,
    Connection,
    Peer,
    Principal,
    RequestId,
    Method,
    Capability,
    Context,
    Decision,
    Rule,
    PolicyGeneration,
    Status,
    ErrorCode,
    Root,
    Path,
    Command,
    Destination,
    ExitCode,
    Tool,
    Event,
    Detail,
    Warning,
    StartSeq,
    ParentRequestId,
    ApprovedBy,
    Id,
    ConnectionId,
    ClientId,
    SessionId,
    RunId,
    ToolCallId,
    PolicyDecision,
    ProviderId,
    InstanceId,
    MountIds,
    TargetId,
    ResourceId,
    ErrorName,
    OutputTruncated,
    Transport,
    Profile,
}

/// The string table as readers see it: number → string. Shared with the
/// writer, which only appends.
#[derive(Clone, Default)]
pub(super) struct Strings(Arc<RwLock<Vec<Arc<str>>>>);

impl Strings {
    /// Reads the table from `tree` (key: number, 4 bytes big-endian). The
    /// numbers run from 0 without a gap; a gap (a damaged store) ends what
    /// is read, and entries naming what follows it do not decode.
    pub(super) fn load(tree: &sled::Tree) -> Result<Self, sled::Error> {
        let mut table = Vec::new();
        for item in tree.iter() {
            let (key, value) = item?;
            let expected = u32::try_from(table.len()).unwrap_or(u32::MAX);
            if key.as_ref() != expected.to_be_bytes() {
                break;
            }
            table.push(Arc::from(String::from_utf8_lossy(&value).as_ref()));
        }
        Ok(Self(Arc::new(RwLock::new(table))))
    }

    fn get(&self, id: u64) -> Option<Arc<str>> {
        let table = self.0.read().unwrap_or_else(|e| e.into_inner());
        usize::try_from(id).ok().and_then(|i| table.get(i).cloned())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A string new to the table: sled must hold it before any entry naming it.
pub(super) type NewString = (u32, Arc<str>);

/// The writer's side of the table: string → number.
pub(super) struct Interner {
    strings: Strings,
    ids: HashMap<Arc<str>, u32>,
}

impl Interner {
    pub(super) fn new(strings: Strings) -> Self {
        let ids = {
            let table = strings.0.read().unwrap_or_else(|e| e.into_inner());
            (0u32..)
                .zip(table.iter())
                .map(|(i, s)| (s.clone(), i))
                .collect()
        };
        Self { strings, ids }
    }

    /// The number of `s`, making one (and adding it to `new`) if there is
    /// room; None when it is not to be interned.
    fn id(&mut self, s: &str, new: &mut Vec<NewString>) -> Option<u32> {
        if let Some(&id) = self.ids.get(s) {
            return Some(id);
        }
        if s.len() > MAX_INTERNED_LEN || self.ids.len() >= MAX_STRINGS {
            return None;
        }
        let id = u32::try_from(self.ids.len()).ok()?;
        let s: Arc<str> = Arc::from(s);
        self.strings
            .0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(s.clone());
        self.ids.insert(s.clone(), id);
        new.push((id, s));
        Some(id)
    }

    /// How many strings the table holds; for [`Self::forget_from`].
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Forgets the strings numbered `len` and up, made for entries that
    /// were never committed (so sled never got them, and nothing names
    /// them).
    pub(super) fn forget_from(&mut self, len: usize) {
        let mut table = self.strings.0.write().unwrap_or_else(|e| e.into_inner());
        let from = len.min(table.len());
        for s in table.drain(from..) {
            self.ids.remove(&s);
        }
    }
}

/// Encodes an entry; strings worth interning go through `interner` (none:
/// every string in the entry itself), and those it makes are added to
/// `new`.
pub(super) fn encode(
    seq: u64,
    prev: &str,
    hash: &str,
    record: &Record,
    interner: Option<&mut Interner>,
    new: &mut Vec<NewString>,
) -> Vec<u8> {
    // Every field by name: a field added to `Record` does not compile here
    // until it is encoded.
    let Record {
        kind,
        started_at,
        completed_at,
        connection,
        peer,
        principal,
        request_id,
        method,
        capability,
        context,
        decision,
        rule,
        policy_generation,
        status,
        error_code,
        root,
        path,
        command,
        destination,
        exit_code,
        tool,
        bytes_in,
        bytes_out,
        event,
        detail,
        warning,
        start_seq,
        parent_request_id,
        approved_by,
        id,
        connection_id,
        client_id,
        session_id,
        run_id,
        tool_call_id,
        policy_decision,
        provider_id,
        instance_id,
        mount_ids,
        target_id,
        resource_id,
        error_name,
        output_truncated,
        transport,
        profile,
    } = record;
    let present = [
        (Field::CompletedAt, completed_at.is_some()),
        (Field::Connection, connection.is_some()),
        (Field::Peer, peer.is_some()),
        (Field::Principal, principal.is_some()),
        (Field::RequestId, request_id.is_some()),
        (Field::Method, method.is_some()),
        (Field::Capability, capability.is_some()),
        (Field::Context, context.is_some()),
        (Field::Decision, decision.is_some()),
        (Field::Rule, rule.is_some()),
        (Field::PolicyGeneration, policy_generation.is_some()),
        (Field::Status, status.is_some()),
        (Field::ErrorCode, error_code.is_some()),
        (Field::Root, root.is_some()),
        (Field::Path, path.is_some()),
        (Field::Command, command.is_some()),
        (Field::Destination, destination.is_some()),
        (Field::ExitCode, exit_code.is_some()),
        (Field::Tool, tool.is_some()),
        (Field::Event, event.is_some()),
        (Field::Detail, detail.is_some()),
        (Field::Warning, warning.is_some()),
        (Field::StartSeq, start_seq.is_some()),
        (Field::ParentRequestId, parent_request_id.is_some()),
        (Field::ApprovedBy, approved_by.is_some()),
        (Field::Id, id.is_some()),
        (Field::ConnectionId, connection_id.is_some()),
        (Field::ClientId, client_id.is_some()),
        (Field::SessionId, session_id.is_some()),
        (Field::RunId, run_id.is_some()),
        (Field::ToolCallId, tool_call_id.is_some()),
        (Field::PolicyDecision, policy_decision.is_some()),
        (Field::ProviderId, provider_id.is_some()),
        (Field::InstanceId, instance_id.is_some()),
        (Field::MountIds, !mount_ids.is_empty()),
        (Field::TargetId, target_id.is_some()),
        (Field::ResourceId, resource_id.is_some()),
        (Field::ErrorName, error_name.is_some()),
        (Field::OutputTruncated, output_truncated.is_some()),
        (Field::Transport, transport.is_some()),
        (Field::Profile, profile.is_some()),
    ];
    let bits = present
        .iter()
        .filter(|(_, there)| *there)
        .fold(0u64, |bits, (field, _)| bits | 1 << *field as u8);

    let mut out = Encoder {
        bytes: Vec::with_capacity(192),
        interner,
        new,
    };
    out.bytes.push(COMPACT_V1);
    // Not only its key: an entry moved to another key is told apart from
    // an edited one.
    out.varint(seq);
    out.varint(bits);
    out.bytes.push(kind_byte(*kind));
    let start = out.time(started_at);
    if let Some(completed_at) = completed_at {
        out.time_after(completed_at, start);
    }
    if let Some(connection) = connection {
        out.varint(*connection);
    }
    out.opt(peer.as_deref(), Keep::Plain);
    out.opt(principal.as_deref(), Keep::Interned);
    out.opt(request_id.as_deref(), Keep::Plain);
    out.opt(method.as_deref(), Keep::Interned);
    out.opt(capability.as_deref(), Keep::Interned);
    if let Some(context) = context {
        let RequestContext {
            session_id,
            run_id,
            tool_call_id,
            workspace_id,
        } = context;
        let parts = [session_id, run_id, tool_call_id, workspace_id];
        let bits = (0..)
            .zip(&parts)
            .filter(|(_, part)| part.is_some())
            .fold(0u8, |bits, (i, _)| bits | 1 << i);
        out.bytes.push(bits);
        for part in parts {
            out.opt(part.as_deref(), Keep::Plain);
        }
    }
    if let Some(decision) = decision {
        out.bytes.push(decision_byte(*decision));
    }
    out.opt(rule.as_deref(), Keep::Interned);
    out.opt(policy_generation.as_deref(), Keep::Interned);
    if let Some(status) = status {
        out.bytes.push(status_byte(*status));
    }
    out.opt(error_code.as_deref(), Keep::Interned);
    out.opt(root.as_deref(), Keep::Interned);
    out.opt(path.as_deref(), Keep::Plain);
    out.opt(command.as_deref(), Keep::Plain);
    out.opt(destination.as_deref(), Keep::Plain);
    if let Some(code) = exit_code {
        out.varint(zigzag(i64::from(*code)));
    }
    out.opt(tool.as_deref(), Keep::Interned);
    out.opt(event.as_deref(), Keep::Interned);
    out.opt(detail.as_deref(), Keep::Plain);
    out.opt(warning.as_deref(), Keep::Plain);
    if let Some(start_seq) = start_seq {
        out.varint(*start_seq);
    }
    out.opt(parent_request_id.as_deref(), Keep::Plain);
    out.opt(approved_by.as_deref(), Keep::Interned);
    let context = context.as_ref();
    out.opt(id.as_deref(), Keep::Like(request_id.as_deref()));
    let connection = connection.map(|c| c.to_string());
    out.opt(connection_id.as_deref(), Keep::Like(connection.as_deref()));
    out.opt(client_id.as_deref(), Keep::Interned);
    let like = |part: fn(&RequestContext) -> &Option<String>| {
        Keep::Like(context.and_then(|c| part(c).as_deref()))
    };
    out.opt(session_id.as_deref(), like(|c| &c.session_id));
    out.opt(run_id.as_deref(), like(|c| &c.run_id));
    out.opt(tool_call_id.as_deref(), like(|c| &c.tool_call_id));
    if let Some(decision) = policy_decision {
        out.bytes.push(decision_byte(*decision));
    }
    out.opt(provider_id.as_deref(), Keep::Like(client_id.as_deref()));
    out.opt(instance_id.as_deref(), Keep::Interned);
    if !mount_ids.is_empty() {
        out.varint(mount_ids.len() as u64);
        for mount in mount_ids {
            out.text(mount, Keep::Interned);
        }
    }
    out.opt(target_id.as_deref(), Keep::Interned);
    out.opt(resource_id.as_deref(), Keep::Plain);
    out.opt(error_name.as_deref(), Keep::Interned);
    if let Some(truncated) = output_truncated {
        out.bytes.push(u8::from(*truncated));
    }
    out.opt(transport.as_deref(), Keep::Interned);
    out.opt(profile.as_deref(), Keep::Interned);
    out.varint(*bytes_in);
    out.varint(*bytes_out);
    out.text(prev, Keep::Plain);
    out.text(hash, Keep::Plain);
    out.bytes
}

/// How a field's text is best kept.
#[derive(Clone, Copy)]
enum Keep<'a> {
    /// In the entry (as hex when it is hex).
    Plain,
    /// In the string table, when there is room.
    Interned,
    /// As a mark when it equals this (another field of the entry), else
    /// in the entry.
    Like(Option<&'a str>),
}

struct Encoder<'a> {
    bytes: Vec<u8>,
    interner: Option<&'a mut Interner>,
    new: &'a mut Vec<NewString>,
}

impl Encoder<'_> {
    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }

    fn header(&mut self, how: Text, value: u64) {
        self.varint(value << 3 | how as u64);
    }

    fn opt(&mut self, text: Option<&str>, keep: Keep<'_>) {
        if let Some(text) = text {
            self.text(text, keep);
        }
    }

    fn text(&mut self, text: &str, keep: Keep<'_>) {
        let intern = match keep {
            Keep::Like(Some(reference)) if reference == text => {
                return self.header(Text::SameAsReference, 0);
            }
            Keep::Interned => true,
            Keep::Like(_) | Keep::Plain => false,
        };
        if intern
            && let Some(interner) = self.interner.as_deref_mut()
            && let Some(id) = interner.id(text, self.new)
        {
            return self.header(Text::Interned, u64::from(id));
        }
        if is_lower_hex(text) {
            // Decoded in place: a vector per hex text was 7 % of the
            // gateway's allocations at 256 requests in flight.
            let at = self.bytes.len();
            self.header(Text::Hex, text.len() as u64 / 2);
            let raw = self.bytes.len();
            self.bytes.resize(raw + text.len() / 2, 0);
            if hex::decode_to_slice(text, &mut self.bytes[raw..]).is_ok() {
                return;
            }
            self.bytes.truncate(at);
        }
        self.header(Text::Literal, text.len() as u64);
        self.bytes.extend_from_slice(text.as_bytes());
    }

    /// A timestamp, short when it reads back as the same text; its
    /// nanoseconds then, for [`time_after`](Self::time_after).
    fn time(&mut self, text: &str) -> Option<i64> {
        let nanos = nanos_if_canonical(text);
        match nanos {
            Some(nanos) => {
                self.header(Text::Time, 0);
                self.varint(zigzag(nanos));
            }
            None => self.text(text, Keep::Plain),
        }
        nanos
    }

    /// A timestamp after `start` (what [`time`](Self::time) returned for
    /// it): an offset from it when both read back as the same text.
    fn time_after(&mut self, text: &str, start: Option<i64>) {
        match (nanos_if_canonical(text), start) {
            (Some(at), Some(start)) => {
                self.header(Text::TimeAfterStart, 0);
                self.varint(zigzag(at.wrapping_sub(start)));
            }
            _ => {
                self.time(text);
            }
        }
    }
}

/// One value holding `entries` (compact, in order): the entry itself when
/// it is alone, else a [`GROUP_V1`].
pub(super) fn group(entries: Vec<Vec<u8>>) -> Vec<u8> {
    if entries.len() == 1 {
        return entries.into_iter().next().unwrap_or_default();
    }
    let size = entries.iter().map(|e| e.len() + 3).sum::<usize>() + 6;
    let mut out = Encoder {
        bytes: Vec::with_capacity(size),
        interner: None,
        new: &mut Vec::new(),
    };
    out.bytes.push(GROUP_V1);
    out.varint(entries.len() as u64);
    for entry in entries {
        out.varint(entry.len() as u64);
        out.bytes.extend_from_slice(&entry);
    }
    out.bytes
}

/// The entries a [`GROUP_V1`] value holds, each one's bytes.
pub(super) fn members(value: &[u8]) -> Result<Vec<&[u8]>, String> {
    let strings = Strings::default();
    let mut input = Decoder {
        bytes: value,
        at: 0,
        strings: &strings,
    };
    if input.byte()? != GROUP_V1 {
        return Err("not a group of entries".into());
    }
    let count = input.varint()?;
    // Each takes two bytes at least: a count past that is forged.
    if count == 0 || count > input.left() as u64 / 2 {
        return Err(format!(
            "a group of {count} entries in {} bytes",
            value.len()
        ));
    }
    let mut members = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = input.varint()?;
        let at = input.at;
        input.take(len)?;
        members.push(&value[at..input.at]);
    }
    if input.left() != 0 {
        return Err("bytes after the group's last entry".into());
    }
    Ok(members)
}

/// `text`'s nanoseconds since the epoch, if it is a timestamp that jiff
/// writes back as exactly `text`.
fn nanos_if_canonical(text: &str) -> Option<i64> {
    let time: jiff::Timestamp = text.parse().ok()?;
    let nanos = i64::try_from(time.as_nanosecond()).ok()?;
    (time.to_string() == text).then_some(nanos)
}

/// Whether `text` is lowercase hex (at least 8 digits, an even count): its
/// bytes, written back in lowercase hex, give `text` again.
fn is_lower_hex(text: &str) -> bool {
    let lower = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    text.len() >= 8 && text.len().is_multiple_of(2) && text.as_bytes().iter().all(lower)
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    (value >> 1) as i64 ^ -((value & 1) as i64)
}

fn kind_byte(kind: Kind) -> u8 {
    match kind {
        Kind::Request => 0,
        Kind::RequestStart => 1,
        Kind::Security => 2,
        Kind::EgressStart => 3,
        Kind::Egress => 4,
        Kind::ToRuntime => 5,
    }
}

fn decision_byte(decision: Decision) -> u8 {
    match decision {
        Decision::Allowed => 0,
        Decision::Approved => 1,
        Decision::Blocked => 2,
    }
}

fn status_byte(status: Status) -> u8 {
    match status {
        Status::Succeeded => 0,
        Status::Failed => 1,
        Status::Cancelled => 2,
        Status::Interrupted => 3,
        Status::Lost => 4,
    }
}

/// Decodes a compact entry; the message says what is wrong with it.
pub(super) fn decode(bytes: &[u8], strings: &Strings) -> Result<Entry, String> {
    let mut input = Decoder {
        bytes,
        at: 0,
        strings,
    };
    if input.byte()? != COMPACT_V1 {
        return Err("an unknown entry encoding (written by a newer portcullis?)".into());
    }
    let seq = input.varint()?;
    let bits = input.varint()?;
    let has = |field: Field| bits & (1 << field as u8) != 0;
    let kind = match input.byte()? {
        0 => Kind::Request,
        1 => Kind::RequestStart,
        2 => Kind::Security,
        3 => Kind::EgressStart,
        4 => Kind::Egress,
        5 => Kind::ToRuntime,
        other => return Err(format!("unknown kind {other}")),
    };
    let started_at = input.text(None, None)?;
    let mut record = Record {
        kind,
        ..Record::default()
    };
    if has(Field::CompletedAt) {
        record.completed_at = Some(input.text(None, Some(&started_at))?);
    }
    record.started_at = started_at;
    if has(Field::Connection) {
        record.connection = Some(input.varint()?);
    }
    record.peer = input.opt_shared(has(Field::Peer), None)?;
    record.principal = input.opt_shared(has(Field::Principal), None)?;
    record.request_id = input.opt(has(Field::RequestId), None)?;
    record.method = input.opt(has(Field::Method), None)?;
    record.capability = input.opt(has(Field::Capability), None)?;
    if has(Field::Context) {
        let parts = input.byte()?;
        let mut part = |i: u8| input.opt(parts & (1 << i) != 0, None);
        record.context = Some(RequestContext {
            session_id: part(0)?,
            run_id: part(1)?,
            tool_call_id: part(2)?,
            workspace_id: part(3)?,
        });
    }
    if has(Field::Decision) {
        record.decision = Some(input.decision()?);
    }
    record.rule = input.opt(has(Field::Rule), None)?;
    record.policy_generation = input.opt_shared(has(Field::PolicyGeneration), None)?;
    if has(Field::Status) {
        record.status = Some(match input.byte()? {
            0 => Status::Succeeded,
            1 => Status::Failed,
            2 => Status::Cancelled,
            3 => Status::Interrupted,
            4 => Status::Lost,
            other => return Err(format!("unknown status {other}")),
        });
    }
    record.error_code = input.opt(has(Field::ErrorCode), None)?;
    record.root = input.opt(has(Field::Root), None)?;
    record.path = input.opt(has(Field::Path), None)?;
    record.command = input.opt(has(Field::Command), None)?;
    record.destination = input.opt(has(Field::Destination), None)?;
    if has(Field::ExitCode) {
        let code = unzigzag(input.varint()?);
        record.exit_code = Some(i32::try_from(code).map_err(|_| "an exit code out of range")?);
    }
    record.tool = input.opt(has(Field::Tool), None)?;
    record.event = input.opt(has(Field::Event), None)?;
    record.detail = input.opt(has(Field::Detail), None)?;
    record.warning = input.opt(has(Field::Warning), None)?;
    if has(Field::StartSeq) {
        record.start_seq = Some(input.varint()?);
    }
    record.parent_request_id = input.opt(has(Field::ParentRequestId), None)?;
    record.approved_by = input.opt(has(Field::ApprovedBy), None)?;
    record.id = input.opt(has(Field::Id), record.request_id.as_deref())?;
    let connection = record.connection.map(|c| c.to_string());
    record.connection_id = input.opt_shared(has(Field::ConnectionId), connection.as_deref())?;
    record.client_id = input.opt_shared(has(Field::ClientId), None)?;
    let context = record.context.clone().unwrap_or_default();
    record.session_id = input.opt(has(Field::SessionId), context.session_id.as_deref())?;
    record.run_id = input.opt(has(Field::RunId), context.run_id.as_deref())?;
    record.tool_call_id = input.opt(has(Field::ToolCallId), context.tool_call_id.as_deref())?;
    if has(Field::PolicyDecision) {
        record.policy_decision = Some(input.decision()?);
    }
    record.provider_id = input.opt_shared(has(Field::ProviderId), record.client_id.as_deref())?;
    record.instance_id = input.opt_shared(has(Field::InstanceId), None)?;
    if has(Field::MountIds) {
        let count = input.varint()?;
        // Each takes a byte at least: a count past what is left is forged.
        if count > input.left() as u64 {
            return Err("a mount count past the entry's end".into());
        }
        for _ in 0..count {
            let mount = input.text(None, None)?;
            record.mount_ids.push(mount);
        }
    }
    record.target_id = input.opt(has(Field::TargetId), None)?;
    record.resource_id = input.opt(has(Field::ResourceId), None)?;
    record.error_name = input.opt(has(Field::ErrorName), None)?;
    if has(Field::OutputTruncated) {
        record.output_truncated = Some(match input.byte()? {
            0 => false,
            1 => true,
            other => return Err(format!("unknown truth value {other}")),
        });
    }
    record.transport = input.opt_shared(has(Field::Transport), None)?;
    record.profile = input.opt_shared(has(Field::Profile), None)?;
    record.bytes_in = input.varint()?;
    record.bytes_out = input.varint()?;
    let prev = input.text(None, None)?;
    let hash = input.text(None, None)?;
    if bits >> (Field::Profile as u8 + 1) != 0 || input.left() != 0 {
        return Err("bytes or fields this build does not know".into());
    }
    Ok(Entry {
        seq,
        prev,
        record,
        hash,
    })
}

struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
    strings: &'a Strings,
}

impl Decoder<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("cut short")?;
        self.at += 1;
        Ok(byte)
    }

    fn take(&mut self, len: u64) -> Result<&[u8], String> {
        let len = usize::try_from(len).map_err(|_| "a length out of range")?;
        if len > self.left() {
            return Err("a length past the entry's end".into());
        }
        let taken = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(taken)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a number longer than 64 bits".into())
    }

    fn decision(&mut self) -> Result<Decision, String> {
        match self.byte()? {
            0 => Ok(Decision::Allowed),
            1 => Ok(Decision::Approved),
            2 => Ok(Decision::Blocked),
            other => Err(format!("unknown decision {other}")),
        }
    }

    fn opt(&mut self, present: bool, reference: Option<&str>) -> Result<Option<String>, String> {
        present.then(|| self.text(reference, None)).transpose()
    }

    /// [`Self::opt`] for a field entries share ([`Record`]'s `Arc<str>`s).
    /// An interned text is the table's own `Arc`, not a copy.
    fn opt_shared(
        &mut self,
        present: bool,
        reference: Option<&str>,
    ) -> Result<Option<Arc<str>>, String> {
        if !present {
            return Ok(None);
        }
        let at = self.at;
        let header = self.varint()?;
        if header & 7 == Text::Interned as u64 {
            return self.interned(header >> 3).map(Some);
        }
        self.at = at;
        Ok(Some(Arc::from(self.text(reference, None)?)))
    }

    fn interned(&self, id: u64) -> Result<Arc<str>, String> {
        self.strings
            .get(id)
            .ok_or_else(|| format!("string {id}, which the store's table lacks"))
    }

    /// A text; `reference` is what [`Text::SameAsReference`] stands for,
    /// `start` the timestamp [`Text::TimeAfterStart`] counts from.
    fn text(&mut self, reference: Option<&str>, start: Option<&str>) -> Result<String, String> {
        let header = self.varint()?;
        let value = header >> 3;
        match header & 7 {
            h if h == Text::Literal as u64 => String::from_utf8(self.take(value)?.to_vec())
                .map_err(|_| "a text that is not UTF-8".into()),
            h if h == Text::Interned as u64 => self.interned(value).map(|s| s.to_string()),
            h if h == Text::Hex as u64 => Ok(hex::encode(self.take(value)?)),
            h if h == Text::Time as u64 => Ok(time_text(unzigzag(self.varint()?))?),
            h if h == Text::SameAsReference as u64 => reference
                .map(str::to_string)
                .ok_or_else(|| "a reference to a field the entry lacks".into()),
            h if h == Text::TimeAfterStart as u64 => {
                let start = start
                    .and_then(nanos_if_canonical)
                    .ok_or("a time after a start that is not a time")?;
                time_text(start.wrapping_add(unzigzag(self.varint()?)))
            }
            other => Err(format!("unknown text kind {other}")),
        }
    }
}

fn time_text(nanos: i64) -> Result<String, String> {
    jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .map(|t| t.to_string())
        .map_err(|_| "a timestamp out of range".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn strings() -> (Strings, Interner) {
        let strings = Strings::default();
        let interner = Interner::new(strings.clone());
        (strings, interner)
    }

    /// A request entry as the gateway writes one.
    fn request() -> Record {
        Record {
            started_at: "2026-11-27T19:24:43.20591054Z".into(),
            completed_at: Some("2026-11-27T19:24:43.206090697Z".into()),
            connection: Some(1),
            peer: Some("127.0.0.1:53874".into()),
            principal: Some("demo".into()),
            request_id: Some("c1".into()),
            method: Some("file.stat".into()),
            decision: Some(Decision::Allowed),
            rule: Some("grant `demo` gives root `workspace` rw".into()),
            policy_generation: Some(
                "b63df776b510cc3159667ca7c577591f6a00def65938213979075140100aae34".into(),
            ),
            status: Some(Status::Succeeded),
            root: Some("workspace".into()),
            path: Some("a.txt".into()),
            connection_id: Some("1".into()),
            client_id: Some("portcullis-demo".into()),
            provider_id: Some("portcullis-demo".into()),
            instance_id: Some("8efb26e5288f8a85bef2f021d16d90bb".into()),
            mount_ids: vec!["workspace".into()],
            output_truncated: Some(false),
            transport: Some("websocket".into()),
            profile: Some("relay.v1".into()),
            context: Some(RequestContext {
                run_id: Some("run-7".into()),
                ..RequestContext::default()
            }),
            ..Record::default()
        }
        .with_spec_names()
    }

    const HASH: &str = "83f5390ec040070daf5ae87b265a54dfcbbcab2a1256d241c3a2f7d1b2eddf7b";

    #[test]
    fn a_request_entry_round_trips_and_is_small() {
        let (strings, mut interner) = strings();
        let record = request();
        let mut new = Vec::new();
        let first = encode(
            1,
            super::super::GENESIS,
            HASH,
            &record,
            Some(&mut interner),
            &mut new,
        );
        assert!(!new.is_empty());
        let mut again = Vec::new();
        let second = encode(2, HASH, HASH, &record, Some(&mut interner), &mut again);
        assert!(again.is_empty(), "the second entry interns nothing new");
        let entry = decode(&second, &strings).unwrap();
        assert_eq!(entry.record, record);
        assert_eq!(
            (entry.seq, entry.prev.as_str(), entry.hash.as_str()),
            (2, HASH, HASH)
        );
        assert_eq!(decode(&first, &strings).unwrap().record, record);
        let json = serde_json::to_vec(&record).unwrap().len();
        assert!(second.len() < 160, "{} bytes (JSON {json})", second.len());
    }

    #[test]
    fn without_a_table_every_string_is_in_the_entry() {
        let record = request();
        let mut new = Vec::new();
        let bytes = encode(5, HASH, HASH, &record, None, &mut new);
        assert!(new.is_empty());
        let entry = decode(&bytes, &Strings::default()).unwrap();
        assert_eq!((entry.seq, entry.record), (5, record));
    }

    #[test]
    fn a_string_the_table_lacks_is_an_error() {
        let (_, mut interner) = strings();
        let mut new = Vec::new();
        let bytes = encode(3, HASH, HASH, &request(), Some(&mut interner), &mut new);
        let error = decode(&bytes, &Strings::default()).unwrap_err();
        assert!(error.contains("table lacks"), "{error}");
    }

    #[test]
    fn forgotten_strings_are_made_again() {
        let (strings, mut interner) = strings();
        let mut new = Vec::new();
        encode(1, HASH, HASH, &request(), Some(&mut interner), &mut new);
        let made = new.len();
        interner.forget_from(0);
        assert_eq!(strings.len(), 0);
        new.clear();
        encode(1, HASH, HASH, &request(), Some(&mut interner), &mut new);
        assert_eq!(new.len(), made);
    }

    #[test]
    fn the_table_is_bounded() {
        let (strings, mut interner) = strings();
        let mut new = Vec::new();
        for i in 0..MAX_STRINGS + 10 {
            let record = Record {
                method: Some(format!("m{i}")),
                ..Record::default()
            };
            let bytes = encode(1, HASH, HASH, &record, Some(&mut interner), &mut new);
            assert_eq!(decode(&bytes, &strings).unwrap().record, record);
        }
        assert_eq!(strings.len(), MAX_STRINGS);
        let long = "x".repeat(MAX_INTERNED_LEN + 1);
        assert!(interner.id(&long, &mut new).is_none());
    }

    /// Timestamps that jiff would write differently, hex in capitals and
    /// references that do not match are kept as they are.
    #[test]
    fn unusual_values_are_kept_exactly() {
        let (strings, mut interner) = strings();
        let record = Record {
            started_at: "2026-11-27T19:24:43.500000000Z".into(),
            completed_at: Some("yesterday".into()),
            connection: Some(4),
            connection_id: Some("relay-conn-9".into()),
            request_id: Some("r".into()),
            id: Some("other".into()),
            path: Some("DEADBEEFCAFE".into()),
            command: Some("cafebabe".into()),
            exit_code: Some(-9),
            session_id: Some("s".into()),
            policy_decision: Some(Decision::Blocked),
            ..Record::default()
        };
        let mut new = Vec::new();
        let bytes = encode(u64::MAX, "", "x", &record, Some(&mut interner), &mut new);
        let entry = decode(&bytes, &strings).unwrap();
        assert_eq!(entry.seq, u64::MAX);
        assert_eq!(entry.record, record);
        assert_eq!((entry.prev.as_str(), entry.hash.as_str()), ("", "x"));
    }

    #[test]
    fn damaged_bytes_are_errors() {
        let (strings, mut interner) = strings();
        let mut new = Vec::new();
        let bytes = encode(1, HASH, HASH, &request(), Some(&mut interner), &mut new);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], &strings).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, &strings).is_err());
        assert!(decode(b"\x02", &strings).is_err());
    }

    #[test]
    fn a_group_holds_its_entries_in_order() {
        let (strings, mut interner) = strings();
        let mut new = Vec::new();
        let entries: Vec<Vec<u8>> = (1..=3)
            .map(|seq| encode(seq, HASH, HASH, &request(), Some(&mut interner), &mut new))
            .collect();
        let alone = group(vec![entries[0].clone()]);
        assert_eq!(alone, entries[0], "one entry is stored as itself");
        let value = group(entries.clone());
        assert_eq!(value[0], GROUP_V1);
        let held = members(&value).unwrap();
        assert_eq!(held, entries.iter().map(Vec::as_slice).collect::<Vec<_>>());
        assert_eq!(decode(held[2], &strings).unwrap().seq, 3);
        for cut in 0..value.len() {
            assert!(members(&value[..cut]).is_err(), "cut at {cut}");
        }
        assert!(members(&[GROUP_V1, 0]).is_err(), "an empty group");
        assert!(members(&[GROUP_V1, 0x7f, 1, 1]).is_err(), "a forged count");
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9._ -]{0,12}",
            "[0-9a-f]{8,20}",
            any::<String>(),
            Just("2026-11-27T19:24:43.206Z".to_string()),
        ]
    }

    fn opt() -> impl Strategy<Value = Option<String>> {
        proptest::option::of(text())
    }

    fn records() -> impl Strategy<Value = Record> {
        (
            proptest::collection::vec(opt(), 31),
            proptest::collection::vec(text(), 0..3),
            (
                any::<u64>(),
                any::<u64>(),
                proptest::option::of(any::<u64>()),
                proptest::option::of(any::<u64>()),
            ),
            (
                0u8..6,
                proptest::option::of(0u8..3),
                proptest::option::of(0u8..5),
                proptest::option::of(any::<bool>()),
                proptest::option::of(any::<i32>()),
            ),
            proptest::option::of(proptest::collection::vec(opt(), 4)),
            prop_oneof![
                text(),
                (0i64..4_000_000_000_000_000_000).prop_map(|n| time_text(n).unwrap())
            ],
        )
            .prop_map(|(texts, mount_ids, numbers, small, context, started_at)| {
                let mut texts = texts.into_iter();
                let mut next = move || texts.next().flatten();
                let decisions = [Decision::Allowed, Decision::Approved, Decision::Blocked];
                let statuses = [
                    Status::Succeeded,
                    Status::Failed,
                    Status::Cancelled,
                    Status::Interrupted,
                    Status::Lost,
                ];
                let kinds = [
                    Kind::Request,
                    Kind::RequestStart,
                    Kind::Security,
                    Kind::EgressStart,
                    Kind::Egress,
                    Kind::ToRuntime,
                ];
                Record {
                    kind: kinds[usize::from(small.0)],
                    started_at,
                    completed_at: next(),
                    peer: next().map(Arc::from),
                    principal: next().map(Arc::from),
                    request_id: next(),
                    method: next(),
                    capability: next(),
                    rule: next(),
                    policy_generation: next().map(Arc::from),
                    error_code: next(),
                    root: next(),
                    path: next(),
                    command: next(),
                    destination: next(),
                    tool: next(),
                    event: next(),
                    detail: next(),
                    warning: next(),
                    parent_request_id: next(),
                    approved_by: next(),
                    id: next(),
                    connection_id: next().map(Arc::from),
                    client_id: next().map(Arc::from),
                    session_id: next(),
                    run_id: next(),
                    tool_call_id: next(),
                    provider_id: next().map(Arc::from),
                    instance_id: next().map(Arc::from),
                    target_id: next(),
                    resource_id: next(),
                    error_name: next(),
                    transport: next().map(Arc::from),
                    profile: next().map(Arc::from),
                    mount_ids,
                    bytes_in: numbers.0,
                    bytes_out: numbers.1,
                    connection: numbers.2,
                    start_seq: numbers.3,
                    decision: small.1.map(|d| decisions[usize::from(d)]),
                    policy_decision: small.1.map(|d| decisions[2 - usize::from(d)]),
                    status: small.2.map(|s| statuses[usize::from(s)]),
                    output_truncated: small.3,
                    exit_code: small.4,
                    context: context.map(|parts| {
                        let mut parts = parts.into_iter();
                        let mut part = move || parts.next().flatten();
                        RequestContext {
                            session_id: part(),
                            run_id: part(),
                            tool_call_id: part(),
                            workspace_id: part(),
                        }
                    }),
                }
            })
    }

    proptest! {
        /// Whatever a record holds, it decodes to itself, so its JSON (and
        /// hash) is the one written.
        #[test]
        fn any_record_round_trips(record in records(), seq in any::<u64>(), prev in text(), hash in text()) {
            let (strings, mut interner) = strings();
            let mut new = Vec::new();
            let bytes = encode(seq, &prev, &hash, &record, Some(&mut interner), &mut new);
            let entry = decode(&bytes, &strings).unwrap();
            prop_assert_eq!(entry.seq, seq);
            prop_assert_eq!(&entry.record, &record);
            prop_assert_eq!(serde_json::to_vec(&entry.record).unwrap(), serde_json::to_vec(&record).unwrap());
            prop_assert_eq!((entry.prev, entry.hash), (prev, hash));
        }

        /// Bytes from anywhere decode to an entry or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let (strings, mut interner) = strings();
            let mut new = Vec::new();
            encode(1, HASH, HASH, &request(), Some(&mut interner), &mut new);
            let mut forged = vec![COMPACT_V1];
            forged.extend(bytes);
            let _ = decode(&forged, &strings);
            forged[0] = GROUP_V1;
            let _ = members(&forged);
        }
    }
}

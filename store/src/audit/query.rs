//! Reading the log: one entry, the filtered newest-first list `audit
//! list` shows, entries after a sequence number, its size, and the export.

use serde::Serialize;

use super::entry::{Decision, Entry, Status, decode, entry_json, find, holding, key_seq, unpack};
use super::{AuditLog, EXPORT_FORMAT};
use crate::StoreError;

/// How big the log is, for retention and `audit status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LogStats {
    pub entries: u64,
    /// Sequence number of the oldest entry kept (0 when empty).
    pub first_seq: u64,
    pub last_seq: u64,
    /// Bytes sled occupies on disk (all trees; sled reclaims space lazily).
    pub size_on_disk: u64,
}

impl AuditLog {
    pub fn get(&self, seq: u64) -> Result<Option<Entry>, StoreError> {
        find(self.entries(), seq, &self.strings)
    }

    /// Entries matching `filter`, newest first, at most `filter.limit`.
    pub fn list(&self, filter: &Filter) -> Result<Vec<Entry>, StoreError> {
        let matcher = filter.method_matcher();
        let mut out = Vec::new();
        for item in self.entries().iter().rev() {
            let (key, value) = item.map_err(StoreError::Sled)?;
            for (at, bytes) in unpack(&key, &value)?.into_iter().rev() {
                let entry = decode(&at.to_be_bytes(), bytes, &self.strings)?;
                if filter
                    .since
                    .as_ref()
                    .is_some_and(|since| !at_or_after(&entry.record.started_at, since))
                {
                    return Ok(out); // newest first: everything further is older
                }
                if filter.matches(&entry, matcher.as_ref()) {
                    out.push(entry);
                    if out.len() >= filter.limit {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Entries after `seq`, oldest first (for `audit tail -f`).
    pub fn after(&self, seq: u64, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let tree = self.entries();
        let next = seq.saturating_add(1);
        let from = holding(tree, next)?.map_or(next, |(key, _)| key_seq(&key));
        let mut out = Vec::new();
        for item in tree.range(from.to_be_bytes()..) {
            let (key, value) = item.map_err(StoreError::Sled)?;
            for (at, bytes) in unpack(&key, &value)? {
                if out.len() >= limit {
                    return Ok(out);
                }
                if at > seq {
                    out.push(decode(&at.to_be_bytes(), bytes, &self.strings)?);
                }
            }
        }
        Ok(out)
    }

    /// Entry count and disk use. Sequence numbers are contiguous from the
    /// oldest kept entry, so this reads two keys, not the whole log.
    pub fn stats(&self) -> Result<LogStats, StoreError> {
        let io = StoreError::Sled;
        let entries = self.entries();
        let first_seq = entries.first().map_err(io)?.map(|(k, _)| key_seq(&k));
        let last_seq = match entries.last().map_err(io)? {
            Some((key, value)) => unpack(&key, &value)?.last().map(|(at, _)| *at),
            None => None,
        };
        let size_on_disk = self.db.size_on_disk().map_err(io)?;
        Ok(match (first_seq, last_seq) {
            (Some(first_seq), Some(last_seq)) => LogStats {
                entries: last_seq - first_seq + 1,
                first_seq,
                last_seq,
                size_on_disk,
            },
            _ => LogStats {
                entries: 0,
                first_seq: 0,
                last_seq: 0,
                size_on_disk,
            },
        })
    }

    /// Writes the log as JSON Lines: a header, then every entry (the JSON
    /// its hash is over, with the hash), each checkpoint right after the
    /// entry it covers.
    /// Verifiable offline with [`super::verify_export`] and the audit
    /// public key. Returns the entry count.
    pub fn export(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        self.export_naming(out, self.public_key.as_deref())
    }

    /// [`export`](Self::export) whose header names `public_key` (a log
    /// opened without its signer, by a reader, knows no key of its own).
    pub fn export_naming(
        &self,
        out: &mut dyn std::io::Write,
        public_key: Option<&[u8]>,
    ) -> Result<u64, StoreError> {
        let io = |e| StoreError::io("writing the export", e);
        let header = serde_json::json!({"type": "header", "format": EXPORT_FORMAT,
            "public_key": public_key.map(|k| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, k))});
        writeln!(out, "{header}").map_err(io)?;
        if let Some(Ok(marker)) = self.prune_marker()? {
            writeln!(
                out,
                "{}",
                serde_json::json!({"type": "prune", "prune": marker})
            )
            .map_err(io)?;
        }
        // It ends with the head checkpoint, which covers its last entry:
        // entries written meanwhile are left for the next export.
        let head = self.head_checkpoint()?;
        let mut checkpoints = self.checkpoints.iter().peekable();
        let mut count = 0;
        'entries: for item in self.entries().iter() {
            let (key, value) = item.map_err(StoreError::Sled)?;
            for (seq, bytes) in unpack(&key, &value)? {
                if head.as_ref().is_some_and(|head| seq > head.seq) {
                    break 'entries;
                }
                // The JSON its hash is over, with the hash: an entry stored
                // as JSON verbatim (and always a single line).
                let json = entry_json(&seq.to_be_bytes(), bytes, &self.strings)?;
                if serde_json::from_slice::<&serde_json::value::RawValue>(&json).is_err() {
                    return Err(StoreError::Corrupt {
                        seq,
                        message: "not a JSON value".into(),
                    });
                }
                out.write_all(br#"{"type":"entry","entry":"#)
                    .and_then(|()| out.write_all(&json))
                    .and_then(|()| out.write_all(b"}\n"))
                    .map_err(io)?;
                count += 1;
                while let Some(Ok((ck, _))) = checkpoints.peek() {
                    if key_seq(ck) > seq {
                        break;
                    }
                    if let Some(Ok((_, cv))) = checkpoints.next() {
                        let checkpoint: serde_json::Value =
                            serde_json::from_slice(&cv).unwrap_or_default();
                        writeln!(
                            out,
                            "{}",
                            serde_json::json!({"type": "checkpoint", "checkpoint": checkpoint})
                        )
                        .map_err(io)?;
                    }
                }
            }
        }
        if let Some(head) = head {
            writeln!(
                out,
                "{}",
                serde_json::json!({"type": "checkpoint", "checkpoint": head})
            )
            .map_err(io)?;
        }
        Ok(count)
    }
}

/// What `audit list` selects.
#[derive(Debug, Clone)]
pub struct Filter {
    pub since: Option<jiff::Timestamp>,
    pub until: Option<jiff::Timestamp>,
    pub principal: Option<String>,
    /// A glob such as `file.*`.
    pub method: Option<String>,
    pub decision: Option<Decision>,
    pub status: Option<Status>,
    /// The spec's run, session and tool call ids, and the relay connection.
    pub run: Option<String>,
    pub session: Option<String>,
    pub tool_call: Option<String>,
    pub connection: Option<String>,
    /// How the peer came (`stdio`, `unix`, `websocket`, …) and what it
    /// spoke (`relay.v1`, `ya-environment-protocol.v1`).
    pub transport: Option<String>,
    pub profile: Option<String>,
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            since: None,
            until: None,
            principal: None,
            method: None,
            decision: None,
            status: None,
            run: None,
            session: None,
            tool_call: None,
            connection: None,
            transport: None,
            profile: None,
            limit: 100,
        }
    }
}

impl Filter {
    fn method_matcher(&self) -> Option<globset::GlobMatcher> {
        let pattern = self.method.as_ref()?;
        // An invalid glob matches literally.
        Some(
            globset::Glob::new(pattern)
                .or_else(|_| globset::Glob::new(&globset::escape(pattern)))
                .ok()?
                .compile_matcher(),
        )
    }

    fn matches(&self, entry: &Entry, method: Option<&globset::GlobMatcher>) -> bool {
        let r = &entry.record;
        self.until.as_ref().is_none_or(|until| {
            !at_or_after(&r.started_at, until) || r.started_at == until.to_string()
        }) && self
            .principal
            .as_ref()
            .is_none_or(|p| r.principal.as_deref() == Some(p.as_str()))
            && method.is_none_or(|m| r.method.as_ref().is_some_and(|name| m.is_match(name)))
            && self.decision.is_none_or(|d| r.decision == Some(d))
            && self.status.is_none_or(|s| r.status == Some(s))
            && self.run.as_deref().is_none_or(|run| r.run() == Some(run))
            && self
                .session
                .as_deref()
                .is_none_or(|s| r.session() == Some(s))
            && self
                .tool_call
                .as_deref()
                .is_none_or(|t| r.tool_call() == Some(t))
            && self.connection.as_deref().is_none_or(|c| {
                r.connection_id.as_deref() == Some(c)
                    || r.connection.is_some_and(|n| n.to_string() == c)
            })
            && self
                .transport
                .as_deref()
                .is_none_or(|t| r.transport.as_deref() == Some(t))
            && self
                .profile
                .as_deref()
                .is_none_or(|p| r.profile.as_deref() == Some(p))
    }
}

pub(super) fn at_or_after(time: &str, reference: &jiff::Timestamp) -> bool {
    time.parse::<jiff::Timestamp>()
        .is_ok_and(|t| t >= *reference)
}

//! Verification: the chain recomputed entry by entry and every signed
//! checkpoint checked, over the log in the store or an export of it.
//!
//! An entry is checked over its JSON: the SHA-256 of it up to
//! `,"hash":"…"}`, with the closing brace put back. An entry sled holds
//! in the compact form is turned back into the JSON that was hashed (the
//! form keeps every value exactly: [`super::codec`]), so a change to any
//! of its bytes, or to a string it names, is found. An entry stored as
//! JSON (by earlier builds), and every entry of an export, is checked over
//! its bytes as written, not over a re-serialization of what this build
//! decodes: one written by an older or newer build — fields this one does
//! not know, fields it has since added, another order — verifies as long
//! as its bytes are unchanged.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::entry::{Entry, entry_hash, entry_json, key_seq, unpack};
use super::{AuditLog, GENESIS};
use crate::StoreError;
use crate::checkpoint::{Checkpoint, PruneMarker};

impl AuditLog {
    /// Recomputes the whole chain and checks every checkpoint's signature
    /// with `key` (raw Ed25519 public key). The first problem is reported.
    pub fn verify(&self, key: Option<&[u8]>) -> Result<VerifyReport, StoreError> {
        self.verify_against(key, None)
    }

    /// [`verify`](Self::verify), and that the log still extends `kept`, a
    /// checkpoint kept off the host (its signature checked by the caller):
    /// entry `kept.seq` still has its head, and the log still reaches it.
    pub fn verify_against(
        &self,
        key: Option<&[u8]>,
        kept: Option<&Checkpoint>,
    ) -> Result<VerifyReport, StoreError> {
        let mut verifier = ChainVerifier::new(key);
        verifier.kept = kept.map(|k| (k.seq, k.head.clone()));
        if let Some(marker) = self.prune_marker()?
            && !verifier.start(marker)
        {
            return Ok(verifier.finish());
        }
        // The head checkpoint too: it covers the newest entry, so a log cut
        // short after it was signed shows (unless the key signed again).
        let head = self.head_checkpoint()?;
        let mut checkpoints = self.checkpoints.iter().peekable();
        for item in self.entries().iter() {
            let (key, value) = item.map_err(StoreError::Sled)?;
            let stored = match unpack(&key, &value) {
                Ok(stored) => stored,
                Err(e) => {
                    verifier.fail(VerifyError::Unreadable {
                        seq: key_seq(&key),
                        message: e.to_string(),
                    });
                    return Ok(verifier.finish());
                }
            };
            for (seq, bytes) in stored {
                let verified = match entry_json(&seq.to_be_bytes(), bytes, &self.strings) {
                    Ok(json) => verifier.entry(seq, &json),
                    Err(e) => verifier.fail(VerifyError::Unreadable {
                        seq,
                        message: e.to_string(),
                    }),
                };
                if !verified {
                    return Ok(verifier.finish());
                }
                while let Some(Ok((ck, _))) = checkpoints.peek() {
                    if key_seq(ck) > verifier.report.last_seq {
                        break;
                    }
                    let Some((ck, cv)) = checkpoints.next().transpose()? else {
                        break;
                    };
                    let checkpoint = serde_json::from_slice(&cv);
                    if !verifier.checkpoint(key_seq(&ck), checkpoint) {
                        return Ok(verifier.finish());
                    }
                }
                if let Some(head) = head.as_ref().filter(|head| head.seq == seq)
                    && !verifier.checkpoint(seq, Ok(head.clone()))
                {
                    return Ok(verifier.finish());
                }
            }
        }
        if let Some(Ok((ck, _))) = checkpoints.peek() {
            verifier.fail(VerifyError::CheckpointOrphan { seq: key_seq(ck) });
        }
        if let Some(head) = head.filter(|head| head.seq > verifier.report.last_seq) {
            verifier.fail(VerifyError::CheckpointOrphan { seq: head.seq });
        }
        Ok(verifier.finish())
    }
}

/// The first line of an export. Version 2 carries each entry's stored
/// bytes verbatim; version 1 (before 0.1.1) re-encoded them with their keys
/// sorted, so its entries are checked by re-serializing what they decode to.
pub const EXPORT_FORMAT: &str = "portcullis-audit-export v2";
const EXPORT_FORMAT_V1: &str = "portcullis-audit-export v1";

/// An entry's place in the chain: all verification reads of it besides its
/// bytes. Other fields are ignored here (and covered by the hash).
#[derive(Deserialize)]
struct Link {
    seq: u64,
    prev: String,
    hash: String,
}

/// Whether `stored` — `{…,"hash":"<hash>"}` — hashes to `hash`: the SHA-256
/// of everything before `,"hash":` with the closing brace put back.
fn stored_bytes_hash_to(stored: &[u8], hash: &str) -> bool {
    let suffix = format!(",\"hash\":\"{hash}\"}}");
    let Some(body) = stored.strip_suffix(suffix.as_bytes()) else {
        return false;
    };
    let digest = Sha256::new()
        .chain_update(body)
        .chain_update(b"}")
        .finalize();
    hex::encode(digest) == hash
}

/// How a request the gateway's stop cut short is completed (`Status`).
const INTERRUPTED: &[u8] = br#""status":"interrupted""#;

/// How an entry's hash is checked.
#[derive(Clone, Copy)]
enum Hashing {
    /// Over its bytes (the store, and exports of version 2).
    Stored,
    /// Over what it decodes to, serialized again (exports of version 1).
    Reencoded,
}

/// Verifies an export (see [`AuditLog::export`]) with only the audit public
/// key: the chain, and every checkpoint's signature.
pub fn verify_export(input: impl std::io::BufRead, key: &[u8]) -> Result<VerifyReport, StoreError> {
    verify_export_against(input, key, None)
}

/// [`verify_export`], and that the export extends `kept` (see
/// [`AuditLog::verify_against`]).
pub fn verify_export_against(
    input: impl std::io::BufRead,
    key: &[u8],
    kept: Option<&Checkpoint>,
) -> Result<VerifyReport, StoreError> {
    let mut verifier = ChainVerifier::new(Some(key));
    verifier.kept = kept.map(|k| (k.seq, k.head.clone()));
    for (index, line) in input.lines().enumerate() {
        let line = line.map_err(|e| StoreError::io("reading the export", e))?;
        let bad = |e: &dyn std::fmt::Display| StoreError::Export {
            line: index + 1,
            message: e.to_string(),
        };
        let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| bad(&e))?;
        let ok = match value["type"].as_str() {
            Some("header") if value["format"] == EXPORT_FORMAT => true,
            Some("header") if value["format"] == EXPORT_FORMAT_V1 => {
                verifier.hashing = Hashing::Reencoded;
                true
            }
            Some("prune") if verifier.report.entries == 0 => {
                verifier.start(serde_json::from_value(value["prune"].clone()))
            }
            Some("entry") => {
                #[derive(Deserialize)]
                struct EntryLine<'a> {
                    #[serde(borrow)]
                    entry: &'a serde_json::value::RawValue,
                }
                let entry: EntryLine<'_> = serde_json::from_str(&line).map_err(|e| bad(&e))?;
                let raw = entry.entry.get().as_bytes();
                let seq = serde_json::from_slice::<Link>(raw)
                    .map_or(verifier.report.last_seq + 1, |link| link.seq);
                verifier.entry(seq, raw)
            }
            Some("checkpoint") => {
                let checkpoint: Result<Checkpoint, _> =
                    serde_json::from_value(value["checkpoint"].clone());
                let seq = checkpoint.as_ref().map_or(0, |c| c.seq);
                verifier.checkpoint(seq, checkpoint)
            }
            _ => return Err(bad(&format_args!("not a {EXPORT_FORMAT} line"))),
        };
        if !ok {
            break;
        }
    }
    Ok(verifier.finish())
}

/// Checks a chain fed in order, entry by entry, with checkpoints after the
/// entries they cover. Stops at the first problem.
struct ChainVerifier<'k> {
    key: Option<&'k [u8]>,
    prev_hash: Option<String>,
    /// Entries below this were pruned (a crash may leave some behind).
    first_seq: u64,
    hashing: Hashing,
    /// A checkpoint kept off the host: (entry, its head), which the log
    /// must still reach and match.
    kept: Option<(u64, String)>,
    report: VerifyReport,
}

impl<'k> ChainVerifier<'k> {
    fn new(key: Option<&'k [u8]>) -> Self {
        Self {
            key,
            prev_hash: None,
            first_seq: 1,
            hashing: Hashing::Stored,
            kept: None,
            report: VerifyReport::default(),
        }
    }

    /// The log starts after a prune: check the marker, continue from it.
    fn start(&mut self, marker: Result<PruneMarker, serde_json::Error>) -> bool {
        let Ok(marker) = marker else {
            return self.fail(VerifyError::PruneInvalid { first_seq: 0 });
        };
        if marker.first_seq == 0 || self.key.is_some_and(|key| !marker.verify(key)) {
            return self.fail(VerifyError::PruneInvalid {
                first_seq: marker.first_seq,
            });
        }
        if let Some((seq, head)) = &self.kept
            && *seq < marker.first_seq
        {
            // Only the entry just before the kept ones can still be checked.
            if *seq + 1 != marker.first_seq {
                return self.fail(VerifyError::KeptPruned { seq: *seq });
            }
            if *head != marker.prev {
                return self.fail(VerifyError::Rewritten { seq: *seq });
            }
            self.report.kept_through = Some(*seq);
        }
        self.first_seq = marker.first_seq;
        self.report.last_seq = marker.first_seq - 1;
        self.report.pruned_before = marker.first_seq;
        self.prev_hash = Some(marker.prev);
        true
    }

    fn fail(&mut self, error: VerifyError) -> bool {
        self.report.error.get_or_insert(error);
        false
    }

    /// `stored_at` is where the entry was found (its key), `stored` its
    /// bytes; false on a problem.
    fn entry(&mut self, stored_at: u64, stored: &[u8]) -> bool {
        let link = match serde_json::from_slice::<Link>(stored) {
            Ok(link) => link,
            Err(e) => {
                return self.fail(VerifyError::Unreadable {
                    seq: stored_at,
                    message: e.to_string(),
                });
            }
        };
        let seq = link.seq;
        if seq < self.first_seq && stored_at < self.first_seq {
            return true; // left over from an interrupted prune
        }
        let hash_holds = match self.hashing {
            Hashing::Stored => stored_bytes_hash_to(stored, &link.hash),
            Hashing::Reencoded => serde_json::from_slice::<Entry>(stored)
                .is_ok_and(|e| entry_hash(e.seq, &e.prev, &e.record) == link.hash),
        };
        let expected = self.report.last_seq + 1;
        let problem = if seq != stored_at {
            Some(VerifyError::Moved {
                key: stored_at,
                seq,
            })
        } else if !hash_holds {
            Some(VerifyError::Edited { seq })
        } else if seq != expected {
            Some(VerifyError::MissingBefore { seq, expected })
        } else if link.prev != self.prev_hash.as_deref().unwrap_or(GENESIS) {
            Some(VerifyError::Unlinked { seq })
        } else {
            None
        };
        if let Some(problem) = problem {
            return self.fail(problem);
        }
        self.report.entries += 1;
        self.report.last_seq = seq;
        // Entries are stored compact, fields in a fixed order: the status
        // reads without decoding the entry.
        if stored
            .windows(INTERRUPTED.len())
            .any(|window| window == INTERRUPTED)
        {
            self.report.interrupted += 1;
        }
        if let Some((kept, head)) = &self.kept
            && *kept == seq
        {
            if *head != link.hash {
                return self.fail(VerifyError::Rewritten { seq });
            }
            self.report.kept_through = Some(seq);
        }
        self.report.head = link.hash.clone();
        self.prev_hash = Some(link.hash);
        true
    }

    fn checkpoint(
        &mut self,
        stored_at: u64,
        checkpoint: Result<Checkpoint, serde_json::Error>,
    ) -> bool {
        if stored_at < self.first_seq {
            return true; // covered pruned entries
        }
        let Ok(checkpoint) = checkpoint else {
            return self.fail(VerifyError::CheckpointInvalid { seq: stored_at });
        };
        if checkpoint.seq != self.report.last_seq || checkpoint.head != self.report.head {
            return self.fail(VerifyError::CheckpointMismatch {
                seq: checkpoint.seq,
            });
        }
        if let Some(key) = self.key
            && !checkpoint.verify(key)
        {
            return self.fail(VerifyError::CheckpointInvalid {
                seq: checkpoint.seq,
            });
        }
        self.report.checkpoints += 1;
        self.report.signed_through = checkpoint.seq;
        true
    }

    fn finish(mut self) -> VerifyReport {
        if let Some((seq, _)) = self.kept
            && self.report.error.is_none()
            && self.report.kept_through.is_none()
        {
            let last = self.report.last_seq;
            self.fail(VerifyError::Truncated { seq, last });
        }
        self.report
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub entries: u64,
    pub last_seq: u64,
    pub head: String,
    /// Checkpoints whose signature and head were checked.
    pub checkpoints: u64,
    /// The last entry covered by a good checkpoint; entries after it are
    /// chained but not yet signed.
    pub signed_through: u64,
    /// Entries before this one were pruned (0: never pruned).
    #[serde(default)]
    pub pruned_before: u64,
    /// Requests completed as interrupted: started, and cut short by a
    /// stop of the gateway before they answered (not missing: see
    /// `audit list --status interrupted`).
    #[serde(default)]
    pub interrupted: u64,
    /// With a checkpoint kept off the host: the entry it covers, found
    /// unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_through: Option<u64>,
    /// The first broken link; `None` when the whole chain holds.
    pub error: Option<VerifyError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum VerifyError {
    #[error("entry {seq} was edited: its content does not match its hash")]
    Edited { seq: u64 },
    #[error("entry {seq} follows a gap: entry {expected} is missing (deleted)")]
    MissingBefore { seq: u64, expected: u64 },
    #[error("entry {seq} does not link to the entry before it (reordered or replaced)")]
    Unlinked { seq: u64 },
    #[error("the entry stored under {key} says it is entry {seq} (moved)")]
    Moved { key: u64, seq: u64 },
    #[error("entry {seq} is unreadable: {message}")]
    Unreadable { seq: u64, message: String },
    #[error("the checkpoint at entry {seq} does not match the chain (the log was rewritten)")]
    CheckpointMismatch { seq: u64 },
    #[error("the checkpoint at entry {seq} has no valid signature from the audit key")]
    CheckpointInvalid { seq: u64 },
    #[error("a checkpoint covers entry {seq}, which is not in the log")]
    CheckpointOrphan { seq: u64 },
    #[error(
        "the prune marker (log starting at entry {first_seq}) has no valid signature from the audit key"
    )]
    PruneInvalid { first_seq: u64 },
    #[error(
        "entry {seq} is not the one the checkpoint kept off the host covers (the log was rewritten)"
    )]
    Rewritten { seq: u64 },
    #[error(
        "the log ends at entry {last}, but the checkpoint kept off the host covers entry {seq}: entries were deleted from its end"
    )]
    Truncated { seq: u64, last: u64 },
    #[error(
        "the checkpoint kept off the host covers entry {seq}, which was pruned since; keep a newer one"
    )]
    KeptPruned { seq: u64 },
}

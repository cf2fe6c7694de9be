//! Signed checkpoints: the writer signs (sequence, chain head, time) with
//! the gateway's Ed25519 audit key — after every group commit (the head
//! checkpoint, which covers every acknowledged entry) and every so often
//! for good (in exports). A chain can be
//! recomputed by anyone who can rewrite the store; a signature cannot, so
//! an export plus the audit public key proves what the log said.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::StoreError;

/// A checkpoint covers every entry up to and including `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seq: u64,
    /// The hash of entry `seq`.
    pub head: String,
    pub time: String,
    /// The audit public key (base64) that signed it.
    pub key: String,
    /// Ed25519 over [`Checkpoint::signed_bytes`], base64.
    pub signature: String,
    /// The log's name in its signed note (C2SP `tlog-checkpoint`); the
    /// signature is over that note's text. Absent in checkpoints from
    /// before notes, whose signature is over [`Checkpoint::message`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// The em dash that starts a signature line of a signed note.
const NOTE_DASH: &str = "\u{2014}";

impl Checkpoint {
    /// The signed bytes of a checkpoint without an origin.
    pub fn message(seq: u64, head: &str, time: &str) -> Vec<u8> {
        format!("portcullis-audit-checkpoint v1\n{seq}\n{head}\n{time}\n").into_bytes()
    }

    /// The text of its signed note: origin, size (the entries it covers),
    /// root hash (the chain head, base64), and the time as an extension
    /// line.
    fn note_body(origin: &str, seq: u64, head: &str, time: &str) -> String {
        let head = hex::decode(head).map_or_else(|_| head.to_string(), |h| STANDARD.encode(h));
        format!("{origin}\n{seq}\n{head}\ntime {time}\n")
    }

    /// What its signature is over.
    pub fn signed_bytes(&self) -> Vec<u8> {
        match &self.origin {
            Some(origin) => Self::note_body(origin, self.seq, &self.head, &self.time).into_bytes(),
            None => Self::message(self.seq, &self.head, &self.time),
        }
    }

    /// Whether `public_key` (raw 32 bytes) signed this checkpoint.
    pub fn verify(&self, public_key: &[u8]) -> bool {
        let Ok(signature) = STANDARD.decode(&self.signature) else {
            return false;
        };
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&self.signed_bytes(), &signature)
            .is_ok()
    }

    /// The checkpoint as a signed note (C2SP `signed-note`,
    /// `tlog-checkpoint`), for an operator or a witness to keep off the
    /// host; `None` for one from before notes.
    pub fn note(&self) -> Option<String> {
        let origin = self.origin.as_deref()?;
        let key = STANDARD.decode(&self.key).ok()?;
        let mut signature = note_key_id(origin, &key).to_vec();
        signature.extend(STANDARD.decode(&self.signature).ok()?);
        let body = Self::note_body(origin, self.seq, &self.head, &self.time);
        let signature = STANDARD.encode(signature);
        Some(format!("{body}\n{NOTE_DASH} {origin} {signature}\n"))
    }

    /// Reads a note made by [`note`](Self::note) and checks that
    /// `public_key` signed it.
    pub fn from_note(text: &str, public_key: &[u8]) -> Result<Self, NoteError> {
        let (body, signatures) = text.split_once("\n\n").ok_or(NoteError::Shape)?;
        let mut lines = body.lines();
        let (Some(origin), Some(seq), Some(head), Some(time)) =
            (lines.next(), lines.next(), lines.next(), lines.next())
        else {
            return Err(NoteError::Shape);
        };
        let seq: u64 = seq.parse().map_err(|_| NoteError::Shape)?;
        let head = STANDARD
            .decode(head)
            .ok()
            .filter(|h| h.len() == 32)
            .ok_or(NoteError::Shape)?;
        let time = time.strip_prefix("time ").ok_or(NoteError::Shape)?;
        let id = note_key_id(origin, public_key);
        let signature = signatures
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("{NOTE_DASH} {origin} ")))
            .filter_map(|sig| STANDARD.decode(sig).ok())
            .find(|sig| sig.len() == 68 && sig[..4] == id)
            .ok_or(NoteError::NoSignature)?;
        let checkpoint = Self {
            seq,
            head: hex::encode(head),
            time: time.to_string(),
            key: STANDARD.encode(public_key),
            signature: STANDARD.encode(&signature[4..]),
            origin: Some(origin.to_string()),
        };
        match checkpoint.verify(public_key) {
            true => Ok(checkpoint),
            false => Err(NoteError::BadSignature),
        }
    }
}

/// Why a checkpoint note was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error(
        "not a portcullis checkpoint note (origin, size, root hash, time, a blank line, signatures)"
    )]
    Shape,
    #[error("the note has no signature by the audit key")]
    NoSignature,
    #[error("the note's signature by the audit key does not hold (the note was changed)")]
    BadSignature,
}

/// A signed note's key ID for an Ed25519 key: the first 4 bytes of
/// SHA-256(name, newline, 0x01, key) (C2SP `signed-note`).
fn note_key_id(name: &str, public_key: &[u8]) -> [u8; 4] {
    let digest = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update(b"\n\x01")
        .chain_update(public_key)
        .finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

/// The log's name in its notes: from its key, so stable for its life.
pub fn origin_of(public_key: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(public_key));
    format!("portcullis-audit/{}", &digest[..16])
}

/// Written when old entries are pruned: where the log now starts, and the
/// hash of the last entry removed, signed, so the rest still verifies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneMarker {
    /// The first entry kept.
    pub first_seq: u64,
    /// The hash of entry `first_seq - 1` (the `prev` of the first kept).
    pub prev: String,
    pub time: String,
    pub key: String,
    pub signature: String,
}

impl PruneMarker {
    pub fn message(first_seq: u64, prev: &str, time: &str) -> Vec<u8> {
        format!("portcullis-audit-prune v1\n{first_seq}\n{prev}\n{time}\n").into_bytes()
    }

    pub fn verify(&self, public_key: &[u8]) -> bool {
        let Ok(signature) = STANDARD.decode(&self.signature) else {
            return false;
        };
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(
                &Self::message(self.first_seq, &self.prev, &self.time),
                &signature,
            )
            .is_ok()
    }
}

/// The gateway's audit signing key.
pub struct AuditSigner {
    key: Ed25519KeyPair,
}

impl AuditSigner {
    /// Loads the PKCS#8 key at `path`, creating it (mode 0600) if absent.
    pub fn load_or_create(path: &Path) -> Result<Self, StoreError> {
        let io = |e| StoreError::io(format!("audit key {}", path.display()), e);
        if !path.exists() {
            let rng = ring::rand::SystemRandom::new();
            let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| StoreError::Key {
                path: path.into(),
                message: "cannot generate a key (no randomness?)".into(),
            })?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            file.write_all(pkcs8.as_ref())
                .and_then(|()| file.sync_all())
                .map_err(io)?;
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let key = Ed25519KeyPair::from_pkcs8(&bytes).map_err(|e| StoreError::Key {
            path: path.into(),
            message: format!("not an Ed25519 PKCS#8 key: {e}"),
        })?;
        Ok(Self { key })
    }

    /// Loads an existing key; `None` if there is none.
    pub fn load(path: &Path) -> Result<Option<Self>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        Self::load_or_create(path).map(Some)
    }

    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    pub fn public_key_base64(&self) -> String {
        STANDARD.encode(self.public_key())
    }

    pub fn sign_prune(&self, first_seq: u64, prev: &str) -> PruneMarker {
        let time = jiff::Timestamp::now().to_string();
        let signature = self.key.sign(&PruneMarker::message(first_seq, prev, &time));
        PruneMarker {
            first_seq,
            prev: prev.to_string(),
            time,
            key: self.public_key_base64(),
            signature: STANDARD.encode(signature.as_ref()),
        }
    }

    pub fn sign(&self, seq: u64, head: &str) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            seq,
            head: head.to_string(),
            time: jiff::Timestamp::now().to_string(),
            key: self.public_key_base64(),
            signature: String::new(),
            origin: Some(origin_of(self.public_key())),
        };
        let signature = self.key.sign(&checkpoint.signed_bytes());
        checkpoint.signature = STANDARD.encode(signature.as_ref());
        checkpoint
    }
}

/// Decodes a base64 audit public key.
pub fn decode_public_key(text: &str) -> Result<Vec<u8>, PublicKeyError> {
    let bytes = STANDARD
        .decode(text.trim())
        .map_err(|_| PublicKeyError::NotBase64)?;
    if bytes.len() != 32 {
        return Err(PublicKeyError::Length(bytes.len()));
    }
    Ok(bytes)
}

/// Why an audit public key given by an operator was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicKeyError {
    #[error("the audit key is not base64")]
    NotBase64,
    #[error("the audit key is {0} bytes; an Ed25519 public key is 32")]
    Length(usize),
}

//! Signed checkpoints: every so often the writer signs (sequence, chain
//! head, time) with the gateway's Ed25519 audit key. A chain can be
//! recomputed by anyone who can rewrite the store; a signature cannot, so
//! an export plus the audit public key proves what the log said.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

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
    /// Ed25519 over [`Checkpoint::message`], base64.
    pub signature: String,
}

impl Checkpoint {
    /// The signed bytes.
    pub fn message(seq: u64, head: &str, time: &str) -> Vec<u8> {
        format!("portcullis-audit-checkpoint v1\n{seq}\n{head}\n{time}\n").into_bytes()
    }

    /// Whether `public_key` (raw 32 bytes) signed this checkpoint.
    pub fn verify(&self, public_key: &[u8]) -> bool {
        let Ok(signature) = STANDARD.decode(&self.signature) else {
            return false;
        };
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&Self::message(self.seq, &self.head, &self.time), &signature)
            .is_ok()
    }
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
        let time = jiff::Timestamp::now().to_string();
        let signature = self.key.sign(&Checkpoint::message(seq, head, &time));
        Checkpoint {
            seq,
            head: head.to_string(),
            time,
            key: self.public_key_base64(),
            signature: STANDARD.encode(signature.as_ref()),
        }
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

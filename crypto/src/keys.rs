//! X25519 static keys: generation, the key file text format, base64 and
//! fingerprints for pinning. Pure: reading and writing the file (and its
//! mode 0600) is the caller's job.
//!
//! Key file format (UTF-8 text, one `name: value` per line; blank lines and
//! lines starting with `#` are ignored):
//!
//! ```text
//! portcullis-static-key v1
//! # X25519 key for the Noise handshake. Keep this file secret (mode 0600).
//! private: <32 bytes, standard base64>
//! public: <32 bytes, standard base64>
//! ```
//!
//! The first line is required and must be exactly `portcullis-static-key v1`.
//! `private` is required. `public` is optional; when present it must match the
//! key derived from `private` (a guard against mixed-up files).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use sha2::{Digest, Sha256};
use thiserror::Error;
use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

use crate::Error;

/// The first line of every key file.
pub const KEY_FILE_HEADER: &str = "portcullis-static-key v1";

/// A Curve25519 public key: what a client pins and what a policy names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Standard base64 with padding (44 characters).
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// Accepts standard base64, with or without padding, surrounding
    /// whitespace ignored.
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode_32(text.trim()).map(Self)
    }

    /// `SHA256:` followed by the unpadded base64 of the key's SHA-256, in the
    /// style of OpenSSH fingerprints.
    pub fn fingerprint(&self) -> String {
        format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(self.0)))
    }
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKey({})", self.to_base64())
    }
}

impl std::fmt::Display for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// A static X25519 key pair. The private half is zeroized on drop and never
/// printed by `Debug`.
#[derive(Clone)]
pub struct StaticKeypair {
    secret: StaticSecret,
    public: PublicKey,
}

impl StaticKeypair {
    /// A fresh key pair from the operating system's random number generator.
    pub fn generate() -> Result<Self, Error> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::fill(bytes.as_mut_slice()).map_err(|e| Error::Random(e.to_string()))?;
        Ok(Self::from_private_bytes(*bytes))
    }

    pub fn from_private_bytes(private: [u8; 32]) -> Self {
        let secret = StaticSecret::from(private);
        let public = PublicKey(x25519_dalek::PublicKey::from(&secret).to_bytes());
        Self { secret, public }
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    pub(crate) fn secret(&self) -> &StaticSecret {
        &self.secret
    }

    /// The key file text (see the module docs). Zeroized when dropped.
    pub fn to_key_file(&self) -> Zeroizing<String> {
        let private = Zeroizing::new(STANDARD.encode(self.secret.as_bytes()));
        Zeroizing::new(format!(
            "{KEY_FILE_HEADER}\n\
             # X25519 key for the Noise handshake. Keep this file secret (mode 0600).\n\
             # fingerprint: {}\n\
             private: {}\n\
             public: {}\n",
            self.public.fingerprint(),
            private.as_str(),
            self.public.to_base64(),
        ))
    }

    /// Parses key file text. Errors name the line and never echo key material.
    pub fn from_key_file(text: &str) -> Result<Self, KeyError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
        match lines.next() {
            Some((_, KEY_FILE_HEADER)) => {}
            _ => return Err(KeyError::MissingHeader),
        }
        let mut private: Option<Zeroizing<[u8; 32]>> = None;
        let mut public: Option<PublicKey> = None;
        for (line, content) in lines {
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let Some((name, value)) = content.split_once(':') else {
                return Err(KeyError::Syntax { line });
            };
            match name.trim() {
                "private" if private.is_none() => {
                    let bytes = decode_32(value.trim()).map_err(|e| e.at_line(line))?;
                    private = Some(Zeroizing::new(bytes));
                }
                "public" if public.is_none() => {
                    public = Some(PublicKey::from_base64(value).map_err(|e| e.at_line(line))?);
                }
                "private" | "public" => return Err(KeyError::Duplicate { line }),
                _ => return Err(KeyError::UnknownField { line }),
            }
        }
        let private = private.ok_or(KeyError::MissingPrivate)?;
        let pair = Self::from_private_bytes(*private);
        match public {
            Some(public) if public != pair.public => Err(KeyError::PublicMismatch),
            _ => Ok(pair),
        }
    }
}

impl std::fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

fn decode_32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = Zeroizing::new(
        STANDARD
            .decode(text)
            .or_else(|_| STANDARD_NO_PAD.decode(text))
            .map_err(|_| KeyError::NotBase64 { line: None })?,
    );
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| KeyError::WrongLength {
        len: bytes.len(),
        line: None,
    })
}

/// Why a key or key file was refused. Messages never contain key material.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("not a portcullis key file: the first line must be `{KEY_FILE_HEADER}`")]
    MissingHeader,
    #[error("{}not valid base64", at(*line))]
    NotBase64 { line: Option<usize> },
    #[error("{}key is {len} bytes; an X25519 key is 32 bytes", at(*line))]
    WrongLength { len: usize, line: Option<usize> },
    #[error("line {line}: expected `name: value`")]
    Syntax { line: usize },
    #[error("line {line}: unknown field (expected `private` or `public`)")]
    UnknownField { line: usize },
    #[error("line {line}: field given twice")]
    Duplicate { line: usize },
    #[error("the key file has no `private:` line")]
    MissingPrivate,
    #[error("the `public:` line does not match the private key; the file is corrupt or mixed up")]
    PublicMismatch,
}

impl KeyError {
    fn at_line(self, line: usize) -> Self {
        match self {
            Self::NotBase64 { .. } => Self::NotBase64 { line: Some(line) },
            Self::WrongLength { len, .. } => Self::WrongLength {
                len,
                line: Some(line),
            },
            other => other,
        }
    }
}

fn at(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_round_trips_and_checks_public() {
        let pair = StaticKeypair::generate().unwrap();
        let text = pair.to_key_file();
        let back = StaticKeypair::from_key_file(&text).unwrap();
        assert_eq!(back.public(), pair.public());
        assert_eq!(back.secret().as_bytes(), pair.secret().as_bytes());

        let other = StaticKeypair::generate().unwrap();
        let mixed = text.replace(&pair.public().to_base64(), &other.public().to_base64());
        assert_eq!(
            StaticKeypair::from_key_file(&mixed).unwrap_err(),
            KeyError::PublicMismatch
        );
    }

    #[test]
    fn key_file_errors_name_the_line() {
        let bad = format!("{KEY_FILE_HEADER}\n\nprivate: AAAA\n");
        assert_eq!(
            StaticKeypair::from_key_file(&bad).unwrap_err(),
            KeyError::WrongLength {
                len: 3,
                line: Some(3)
            }
        );
        assert_eq!(
            StaticKeypair::from_key_file("private: x").unwrap_err(),
            KeyError::MissingHeader
        );
        let unknown = format!("{KEY_FILE_HEADER}\nsecret: x\n");
        assert_eq!(
            StaticKeypair::from_key_file(&unknown).unwrap_err(),
            KeyError::UnknownField { line: 2 }
        );
        assert_eq!(
            StaticKeypair::from_key_file(KEY_FILE_HEADER).unwrap_err(),
            KeyError::MissingPrivate
        );
    }

    #[test]
    fn debug_does_not_print_the_private_key() {
        let pair = StaticKeypair::from_private_bytes([7u8; 32]);
        let shown = format!("{pair:?}");
        assert!(!shown.contains(&STANDARD.encode([7u8; 32])));
        assert!(shown.contains(&pair.public().to_base64()));
    }

    #[test]
    fn fingerprint_is_sha256_of_the_key() {
        // SHA-256 of 32 zero bytes, base64 without padding (computed with Python hashlib).
        let fp = PublicKey::from_bytes([0u8; 32]).fingerprint();
        assert_eq!(fp, "SHA256:Zmh6rfhivXdsj8GLjp+OIAiXFIVu4jOzkCpZHQ1fKSU");
    }
}

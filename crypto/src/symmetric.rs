//! Noise `SymmetricState` (revision 34, §5.2) for SHA256: the chaining key,
//! the handshake hash and the cipher state being built.

use hkdf::Hkdf;
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::Error;
use crate::cipher::CipherState;

pub(crate) const HASH_LEN: usize = 32;

pub(crate) struct SymmetricState {
    ck: Zeroizing<[u8; HASH_LEN]>,
    h: [u8; HASH_LEN],
    cipher: Option<CipherState>,
}

impl SymmetricState {
    /// `InitializeSymmetric(protocol_name)`: a name of at most 32 bytes is
    /// zero-padded into `h`, a longer one is hashed.
    pub(crate) fn new(protocol_name: &[u8]) -> Self {
        let mut h = [0u8; HASH_LEN];
        if protocol_name.len() <= HASH_LEN {
            h[..protocol_name.len()].copy_from_slice(protocol_name);
        } else {
            h = Sha256::digest(protocol_name).into();
        }
        Self {
            ck: Zeroizing::new(h),
            h,
            cipher: None,
        }
    }

    pub(crate) fn handshake_hash(&self) -> [u8; HASH_LEN] {
        self.h
    }

    /// `MixKey(ikm)`: new chaining key and a fresh cipher key from HKDF.
    pub(crate) fn mix_key(&mut self, ikm: &[u8]) {
        let (ck, k) = hkdf2(&self.ck, ikm);
        self.ck = ck;
        self.cipher = Some(CipherState::new(&k));
    }

    /// `MixHash(data)`: h = SHA256(h || data).
    pub(crate) fn mix_hash(&mut self, data: &[u8]) {
        self.h = Sha256::new()
            .chain_update(self.h)
            .chain_update(data)
            .finalize()
            .into();
    }

    /// `EncryptAndHash(plaintext)`, appending the result to `out`.
    pub(crate) fn encrypt_and_hash(
        &mut self,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let start = out.len();
        out.extend_from_slice(plaintext);
        if let Some(cipher) = &mut self.cipher {
            cipher.seal_in_place(&self.h, out, start)?;
        }
        let h = Sha256::new()
            .chain_update(self.h)
            .chain_update(&out[start..])
            .finalize();
        self.h = h.into();
        Ok(())
    }

    /// `DecryptAndHash(ciphertext)`.
    pub(crate) fn decrypt_and_hash(&mut self, ciphertext: &[u8]) -> Result<Vec<u8>, Error> {
        let mut buf = ciphertext.to_vec();
        if let Some(cipher) = &mut self.cipher {
            cipher.open_in_place(&self.h, &mut buf, 0)?;
        }
        self.mix_hash(ciphertext);
        Ok(buf)
    }

    /// `Split()`: the two transport cipher states, initiator→responder first.
    pub(crate) fn split(&self) -> (CipherState, CipherState) {
        let (k1, k2) = hkdf2(&self.ck, &[]);
        (CipherState::new(&k1), CipherState::new(&k2))
    }
}

/// Noise's `HKDF(ck, ikm, 2)`. It is RFC 5869 HKDF-SHA256 with `ck` as salt,
/// empty info and 64 bytes of output split in two.
fn hkdf2(
    ck: &[u8; HASH_LEN],
    ikm: &[u8],
) -> (Zeroizing<[u8; HASH_LEN]>, Zeroizing<[u8; HASH_LEN]>) {
    let mut okm = Zeroizing::new([0u8; 2 * HASH_LEN]);
    Hkdf::<Sha256>::new(Some(ck), ikm)
        .expand(&[], okm.as_mut_slice())
        .expect("64 bytes is within HKDF-SHA256's 8160-byte limit");
    let mut first = Zeroizing::new([0u8; HASH_LEN]);
    let mut second = Zeroizing::new([0u8; HASH_LEN]);
    first.copy_from_slice(&okm[..HASH_LEN]);
    second.copy_from_slice(&okm[HASH_LEN..]);
    (first, second)
}

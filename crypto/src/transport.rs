//! The transport phase: two independent directions, each a cipher state with
//! an implicit counter, `REKEY()` every [`REKEY_INTERVAL`] messages, and a
//! latch that refuses all further use after the first failure.

use crate::cipher::CipherState;
use crate::{Error, MAX_MESSAGE_LEN, MAX_PLAINTEXT_LEN, PublicKey, REKEY_INTERVAL, TAG_LEN};

/// Both directions of an established channel. [`Transport::split`] gives
/// them to separate reader and writer tasks.
pub struct Transport {
    sender: Sender,
    receiver: Receiver,
    handshake_hash: [u8; 32],
    remote_static: PublicKey,
}

impl Transport {
    pub(crate) fn new(
        send: CipherState,
        recv: CipherState,
        handshake_hash: [u8; 32],
        remote_static: PublicKey,
    ) -> Self {
        Self {
            sender: Sender(Direction::new(send)),
            receiver: Receiver(Direction::new(recv)),
            handshake_hash,
            remote_static,
        }
    }

    /// The final handshake hash, identical on both sides.
    pub fn handshake_hash(&self) -> &[u8; 32] {
        &self.handshake_hash
    }

    /// The peer's authenticated static key.
    pub fn remote_static(&self) -> &PublicKey {
        &self.remote_static
    }

    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        self.sender.seal(plaintext)
    }

    pub fn open(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        self.receiver.open(message)
    }

    pub fn split(self) -> (Sender, Receiver) {
        (self.sender, self.receiver)
    }
}

/// The sending direction.
pub struct Sender(Direction);

impl Sender {
    /// Seals `plaintext` (at most [`MAX_PLAINTEXT_LEN`] bytes) as the next
    /// transport message.
    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>, Error> {
        let mut buf = Vec::with_capacity(plaintext.len() + TAG_LEN);
        buf.extend_from_slice(plaintext);
        self.seal_in_place(&mut buf)?;
        Ok(buf)
    }

    /// Replaces the plaintext in `buf` with its transport message (the tag is
    /// appended; reserve 16 bytes of capacity to avoid a reallocation).
    pub fn seal_in_place(&mut self, buf: &mut Vec<u8>) -> Result<(), Error> {
        if buf.len() > MAX_PLAINTEXT_LEN {
            // Refusing is not a channel failure: nothing was sent.
            return Err(Error::PayloadTooLarge {
                len: buf.len(),
                max: MAX_PLAINTEXT_LEN,
            });
        }
        self.0.run(|cipher| cipher.seal_in_place(&[], buf, 0))
    }

    /// Messages sealed so far.
    pub fn messages(&self) -> u64 {
        self.0.cipher.nonce()
    }
}

/// The receiving direction.
pub struct Receiver(Direction);

impl Receiver {
    /// Opens the next transport message and returns its plaintext.
    pub fn open(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let mut buf = message.to_vec();
        self.open_in_place(&mut buf)?;
        Ok(buf)
    }

    /// Replaces the transport message in `buf` with its plaintext.
    pub fn open_in_place(&mut self, buf: &mut Vec<u8>) -> Result<(), Error> {
        let len = buf.len();
        self.0.run(|cipher| {
            if len > MAX_MESSAGE_LEN {
                return Err(Error::MessageTooLarge { len });
            }
            cipher.open_in_place(&[], buf, 0)
        })
    }

    /// Messages opened so far.
    pub fn messages(&self) -> u64 {
        self.0.cipher.nonce()
    }
}

/// One direction: a cipher state, the rekey schedule and the failure latch.
struct Direction {
    cipher: CipherState,
    failed: bool,
}

impl Direction {
    fn new(cipher: CipherState) -> Self {
        Self {
            cipher,
            failed: false,
        }
    }

    fn run(&mut self, op: impl FnOnce(&mut CipherState) -> Result<(), Error>) -> Result<(), Error> {
        if self.failed {
            return Err(Error::Failed);
        }
        if let Err(e) = op(&mut self.cipher) {
            self.failed = true;
            return Err(e);
        }
        if self.cipher.nonce().is_multiple_of(REKEY_INTERVAL) {
            self.cipher.rekey();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Transport, Transport) {
        let a = CipherState::new(&[1u8; 32]);
        let b = CipherState::new(&[2u8; 32]);
        let a2 = CipherState::new(&[1u8; 32]);
        let b2 = CipherState::new(&[2u8; 32]);
        let key = PublicKey::from_bytes([9u8; 32]);
        (
            Transport::new(a, b, [0; 32], key),
            Transport::new(b2, a2, [0; 32], key),
        )
    }

    #[test]
    fn refuses_the_reserved_nonce_and_latches() {
        let (mut alice, mut bob) = pair();
        alice.sender.0.cipher.set_nonce_for_test(u64::MAX - 1);
        bob.receiver.0.cipher.set_nonce_for_test(u64::MAX - 1);
        // Nonce 2^64-2 is the last usable one.
        let last = alice.seal(b"last").unwrap();
        assert_eq!(bob.open(&last).unwrap(), b"last");
        assert_eq!(alice.seal(b"one more"), Err(Error::NonceExhausted));
        assert_eq!(alice.seal(b"again"), Err(Error::Failed));
        assert_eq!(bob.open(&last), Err(Error::NonceExhausted));
    }

    #[test]
    fn rekeys_at_the_interval_in_both_directions() {
        let (mut alice, mut bob) = pair();
        alice.sender.0.cipher.set_nonce_for_test(REKEY_INTERVAL - 1);
        bob.receiver.0.cipher.set_nonce_for_test(REKEY_INTERVAL - 1);
        let before = alice.seal(b"before").unwrap();
        assert_eq!(bob.open(&before).unwrap(), b"before");
        // Both sides rekeyed after message 2^20; the old key no longer opens.
        let after = alice.seal(b"after").unwrap();
        let mut stale = CipherState::new(&[1u8; 32]);
        stale.set_nonce_for_test(REKEY_INTERVAL);
        let mut copy = after.clone();
        assert_eq!(stale.open_in_place(&[], &mut copy, 0), Err(Error::Decrypt));
        assert_eq!(bob.open(&after).unwrap(), b"after");
    }

    #[test]
    fn oversized_plaintext_is_refused_without_failing_the_channel() {
        let (mut alice, mut bob) = pair();
        let big = vec![0u8; MAX_PLAINTEXT_LEN + 1];
        assert!(matches!(
            alice.seal(&big),
            Err(Error::PayloadTooLarge { .. })
        ));
        let ok = alice.seal(&big[..MAX_PLAINTEXT_LEN]).unwrap();
        assert_eq!(ok.len(), MAX_MESSAGE_LEN);
        assert_eq!(bob.open(&ok).unwrap().len(), MAX_PLAINTEXT_LEN);
    }
}

//! The `Noise_XX_25519_AESGCM_SHA256` handshake (revision 34), as a sans-IO
//! state machine: each step takes or returns one handshake message as bytes.
//!
//! ```text
//! XX:
//!   -> e                 message 1, initiator writes   (payload: empty)
//!   <- e, ee, s, es      message 2, responder writes   (payload: gateway JSON)
//!   -> s, se             message 3, initiator writes   (payload: credentials JSON)
//! ```
//!
//! The three messages are written out below as they appear in the pattern
//! rather than interpreted from tokens: XX is the only pattern portcullis
//! speaks, and explicit code is easier to audit.

use x25519_dalek::StaticSecret;
use zeroize::Zeroizing;

use crate::symmetric::SymmetricState;
use crate::transport::Transport;
use crate::{Error, MAX_MESSAGE_LEN, PROTOCOL_NAME, PublicKey, StaticKeypair, TAG_LEN};

const DH_LEN: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Responder,
}

/// Where the handshake is: the number of the next message, or the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Message(u8),
    Done,
    Failed,
}

pub struct Handshake {
    role: Role,
    step: Step,
    symmetric: SymmetricState,
    s: StaticKeypair,
    e: Option<StaticSecret>,
    fixed_ephemeral: Option<Zeroizing<[u8; 32]>>,
    rs: Option<PublicKey>,
    re: Option<PublicKey>,
    pinned_remote: Option<PublicKey>,
}

impl Handshake {
    /// Starts a handshake as the connecting side (the client).
    pub fn initiator(static_key: &StaticKeypair, prologue: &[u8]) -> Self {
        Self::new(Role::Initiator, static_key, prologue)
    }

    /// Starts a handshake as the accepting side (the gateway).
    pub fn responder(static_key: &StaticKeypair, prologue: &[u8]) -> Self {
        Self::new(Role::Responder, static_key, prologue)
    }

    fn new(role: Role, static_key: &StaticKeypair, prologue: &[u8]) -> Self {
        let mut symmetric = SymmetricState::new(PROTOCOL_NAME.as_bytes());
        symmetric.mix_hash(prologue);
        Self {
            role,
            step: Step::Message(1),
            symmetric,
            s: static_key.clone(),
            e: None,
            fixed_ephemeral: None,
            rs: None,
            re: None,
            pinned_remote: None,
        }
    }

    /// Initiator only: fail message 2 with [`Error::RemoteKeyMismatch`]
    /// unless the responder's static key is `key`. This is how a client pins
    /// the gateway; the mismatch is detected before message 3 (and so before
    /// any credential) is sent.
    pub fn pin_remote_static(mut self, key: PublicKey) -> Self {
        self.pinned_remote = Some(key);
        self
    }

    /// Uses `private` as the ephemeral key instead of a random one. Only for
    /// reproducing published test vectors and deterministic benchmarks: a
    /// fixed ephemeral key destroys the handshake's forward secrecy.
    #[doc(hidden)]
    pub fn with_fixed_ephemeral_for_testing_only(mut self, private: [u8; 32]) -> Self {
        self.fixed_ephemeral = Some(Zeroizing::new(private));
        self
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// True once message 3 has been written or read.
    pub fn is_finished(&self) -> bool {
        self.step == Step::Done
    }

    /// The peer's static key, known to the initiator after message 2 and to
    /// the responder after message 3.
    pub fn remote_static(&self) -> Option<&PublicKey> {
        self.rs.as_ref()
    }

    /// The handshake hash `h` (channel binding); final once finished.
    pub fn handshake_hash(&self) -> [u8; 32] {
        self.symmetric.handshake_hash()
    }

    /// Writes the next handshake message carrying `payload`.
    pub fn write_message(&mut self, payload: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.guarded(|hs| match (hs.role, hs.step) {
            (Role::Initiator, Step::Message(1)) => hs.write_message_1(payload, &mut out),
            (Role::Responder, Step::Message(2)) => hs.write_message_2(payload, &mut out),
            (Role::Initiator, Step::Message(3)) => hs.write_message_3(payload, &mut out),
            (_, step) => Err(hs.out_of_order("write", step)),
        })?;
        Ok(out)
    }

    /// Reads the next handshake message and returns its payload.
    pub fn read_message(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        if message.len() > MAX_MESSAGE_LEN {
            self.step = Step::Failed;
            return Err(Error::MessageTooLarge { len: message.len() });
        }
        self.guarded(|hs| match (hs.role, hs.step) {
            (Role::Responder, Step::Message(1)) => hs.read_message_1(message),
            (Role::Initiator, Step::Message(2)) => hs.read_message_2(message),
            (Role::Responder, Step::Message(3)) => hs.read_message_3(message),
            (_, step) => Err(hs.out_of_order("read", step)),
        })
    }

    /// The transport cipher states, once the handshake is finished.
    pub fn into_transport(self) -> Result<Transport, Error> {
        if self.step != Step::Done {
            return Err(Error::HandshakeIncomplete);
        }
        let rs = self.rs.ok_or(Error::HandshakeIncomplete)?;
        let (initiator_to_responder, responder_to_initiator) = self.symmetric.split();
        let (send, recv) = match self.role {
            Role::Initiator => (initiator_to_responder, responder_to_initiator),
            Role::Responder => (responder_to_initiator, initiator_to_responder),
        };
        Ok(Transport::new(
            send,
            recv,
            self.symmetric.handshake_hash(),
            rs,
        ))
    }

    // -> e
    fn write_message_1(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        check_payload(payload, DH_LEN, false)?;
        let e_pub = self.generate_ephemeral()?;
        out.extend_from_slice(e_pub.as_bytes());
        self.symmetric.mix_hash(e_pub.as_bytes());
        self.symmetric.encrypt_and_hash(payload, out)?;
        self.step = Step::Message(2);
        Ok(())
    }

    fn read_message_1(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let (re, rest) = split_key(message)?;
        self.symmetric.mix_hash(re.as_bytes());
        self.re = Some(re);
        let payload = self.symmetric.decrypt_and_hash(rest)?;
        self.step = Step::Message(2);
        Ok(payload)
    }

    // <- e, ee, s, es
    fn write_message_2(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        check_payload(payload, DH_LEN + DH_LEN + TAG_LEN, true)?;
        let re = self.re.ok_or(Error::HandshakeIncomplete)?;
        let e_pub = self.generate_ephemeral()?;
        out.extend_from_slice(e_pub.as_bytes());
        self.symmetric.mix_hash(e_pub.as_bytes());
        let ee = self.dh_ephemeral(&re)?;
        self.symmetric.mix_key(ee.as_slice());
        let s_pub = *self.s.public().as_bytes();
        self.symmetric.encrypt_and_hash(&s_pub, out)?;
        let es = dh(self.s.secret(), &re)?;
        self.symmetric.mix_key(es.as_slice());
        self.symmetric.encrypt_and_hash(payload, out)?;
        self.step = Step::Message(3);
        Ok(())
    }

    fn read_message_2(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let (re, rest) = split_key(message)?;
        self.symmetric.mix_hash(re.as_bytes());
        self.re = Some(re);
        let ee = self.dh_ephemeral(&re)?;
        self.symmetric.mix_key(ee.as_slice());
        let (encrypted_s, rest) = split_encrypted_key(rest)?;
        let rs = to_public_key(&self.symmetric.decrypt_and_hash(encrypted_s)?)?;
        if let Some(pinned) = self.pinned_remote
            && pinned != rs
        {
            return Err(Error::RemoteKeyMismatch {
                got: rs.fingerprint(),
                expected: pinned.fingerprint(),
            });
        }
        self.rs = Some(rs);
        let es = self.dh_ephemeral(&rs)?;
        self.symmetric.mix_key(es.as_slice());
        let payload = self.symmetric.decrypt_and_hash(rest)?;
        self.step = Step::Message(3);
        Ok(payload)
    }

    // -> s, se
    fn write_message_3(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), Error> {
        check_payload(payload, DH_LEN + TAG_LEN, true)?;
        let re = self.re.ok_or(Error::HandshakeIncomplete)?;
        let s_pub = *self.s.public().as_bytes();
        self.symmetric.encrypt_and_hash(&s_pub, out)?;
        let se = dh(self.s.secret(), &re)?;
        self.symmetric.mix_key(se.as_slice());
        self.symmetric.encrypt_and_hash(payload, out)?;
        self.step = Step::Done;
        Ok(())
    }

    fn read_message_3(&mut self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let (encrypted_s, rest) = split_encrypted_key(message)?;
        let rs = to_public_key(&self.symmetric.decrypt_and_hash(encrypted_s)?)?;
        self.rs = Some(rs);
        let se = self.dh_ephemeral(&rs)?;
        self.symmetric.mix_key(se.as_slice());
        let payload = self.symmetric.decrypt_and_hash(rest)?;
        self.step = Step::Done;
        Ok(payload)
    }

    /// Runs one step; any error fails the whole handshake for good.
    fn guarded<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        if self.step == Step::Failed {
            return Err(Error::Failed);
        }
        let result = step(self);
        if result.is_err() {
            self.step = Step::Failed;
            self.e = None;
        }
        result
    }

    fn out_of_order(&self, action: &'static str, step: Step) -> Error {
        let role = match self.role {
            Role::Initiator => "initiator",
            Role::Responder => "responder",
        };
        match step {
            Step::Message(number) => Error::OutOfOrder {
                role,
                action,
                number,
            },
            Step::Done => Error::OutOfOrder {
                role,
                action,
                number: 4,
            },
            Step::Failed => Error::Failed,
        }
    }

    fn generate_ephemeral(&mut self) -> Result<PublicKey, Error> {
        let private = match self.fixed_ephemeral.take() {
            Some(fixed) => fixed,
            None => {
                let mut bytes = Zeroizing::new([0u8; 32]);
                getrandom::fill(bytes.as_mut_slice()).map_err(|e| Error::Random(e.to_string()))?;
                bytes
            }
        };
        let e = StaticSecret::from(*private);
        let public = PublicKey::from_bytes(x25519_dalek::PublicKey::from(&e).to_bytes());
        self.e = Some(e);
        Ok(public)
    }

    fn dh_ephemeral(&self, remote: &PublicKey) -> Result<Zeroizing<[u8; 32]>, Error> {
        let e = self.e.as_ref().ok_or(Error::HandshakeIncomplete)?;
        dh(e, remote)
    }
}

/// `DH(private, public)`, refusing low-order points (an all-zero result),
/// which Noise permits implementations to reject.
fn dh(private: &StaticSecret, remote: &PublicKey) -> Result<Zeroizing<[u8; 32]>, Error> {
    let shared = private.diffie_hellman(&x25519_dalek::PublicKey::from(*remote.as_bytes()));
    if !shared.was_contributory() {
        return Err(Error::WeakPublicKey);
    }
    Ok(Zeroizing::new(shared.to_bytes()))
}

/// A payload must leave room for the message's keys (and its own tag when
/// the message is encrypted) under the 65535-byte limit.
fn check_payload(payload: &[u8], overhead: usize, encrypted: bool) -> Result<(), Error> {
    let max = MAX_MESSAGE_LEN - overhead - if encrypted { TAG_LEN } else { 0 };
    if payload.len() > max {
        return Err(Error::PayloadTooLarge {
            len: payload.len(),
            max,
        });
    }
    Ok(())
}

fn split_key(message: &[u8]) -> Result<(PublicKey, &[u8]), Error> {
    if message.len() < DH_LEN {
        return Err(Error::Truncated {
            need: DH_LEN,
            got: message.len(),
        });
    }
    let (key, rest) = message.split_at(DH_LEN);
    Ok((to_public_key(key)?, rest))
}

fn split_encrypted_key(message: &[u8]) -> Result<(&[u8], &[u8]), Error> {
    let need = DH_LEN + TAG_LEN;
    if message.len() < need {
        return Err(Error::Truncated {
            need,
            got: message.len(),
        });
    }
    Ok(message.split_at(need))
}

fn to_public_key(bytes: &[u8]) -> Result<PublicKey, Error> {
    let bytes: [u8; 32] = bytes.try_into().map_err(|_| Error::Truncated {
        need: DH_LEN,
        got: bytes.len(),
    })?;
    Ok(PublicKey::from_bytes(bytes))
}

//! Proof that `portcullis-crypto` speaks `Noise_XX_25519_AESGCM_SHA256`
//! exactly as code written elsewhere does:
//!
//! 1. the published test vectors of cacophony and snow, byte for byte, read
//!    from `../shared/vectors/` at test time (or `$PORTCULLIS_VECTORS_DIR`);
//! 2. live round trips with the `snow` crate in both roles;
//! 3. tampered, truncated, replayed, reordered, dropped and oversized
//!    messages rejected.

use std::path::PathBuf;

use portcullis_crypto::{
    Error, Handshake, MAX_MESSAGE_LEN, MAX_PLAINTEXT_LEN, PROLOGUE, PROTOCOL_NAME, PublicKey,
    REKEY_INTERVAL, StaticKeypair, Transport,
};
use serde_json::Value;

// ---------------------------------------------------------------------------
// 1. Published vectors
// ---------------------------------------------------------------------------

fn vectors_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_VECTORS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors"),
    }
}

/// The `Noise_XX_25519_AESGCM_SHA256` vectors of one file. Panics with a clear
/// message when the file is missing: these tests must never pass vacuously.
fn xx_vectors(file: &str) -> Vec<Value> {
    let path = vectors_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read Noise test vectors at {}: {e}. They live in ../shared/vectors beside \
             the repository; set PORTCULLIS_VECTORS_DIR to point elsewhere.",
            path.display()
        )
    });
    let doc: Value = serde_json::from_str(&text).expect("vector file is JSON");
    let cases: Vec<Value> = doc["vectors"]
        .as_array()
        .expect("vector file has a `vectors` array")
        .iter()
        .filter(|v| v["protocol_name"] == PROTOCOL_NAME)
        .cloned()
        .collect();
    assert!(
        !cases.is_empty(),
        "{} has no {PROTOCOL_NAME} case",
        path.display()
    );
    cases
}

fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("hex string");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn key32(v: &Value) -> [u8; 32] {
    hex(v).try_into().expect("32-byte key")
}

/// Replays one vector: every message sealed by the sending side must equal
/// the published ciphertext, and the receiving side must recover the payload.
/// Returns the number of messages checked.
fn replay_vector(case: &Value) -> usize {
    let init_static = StaticKeypair::from_private_bytes(key32(&case["init_static"]));
    let resp_static = StaticKeypair::from_private_bytes(key32(&case["resp_static"]));
    let mut initiator = Handshake::initiator(&init_static, &hex(&case["init_prologue"]))
        .with_fixed_ephemeral_for_testing_only(key32(&case["init_ephemeral"]));
    let mut responder = Handshake::responder(&resp_static, &hex(&case["resp_prologue"]))
        .with_fixed_ephemeral_for_testing_only(key32(&case["resp_ephemeral"]));

    let messages = case["messages"].as_array().expect("messages array");
    assert!(
        messages.len() >= 3,
        "an XX vector has at least the three handshake messages"
    );

    for (i, message) in messages[..3].iter().enumerate() {
        let (payload, expected) = (hex(&message["payload"]), hex(&message["ciphertext"]));
        let (writer, reader) = if i % 2 == 0 {
            (&mut initiator, &mut responder)
        } else {
            (&mut responder, &mut initiator)
        };
        let written = writer
            .write_message(&payload)
            .expect("write handshake message");
        assert_eq!(
            written,
            expected,
            "handshake message {} differs from the vector",
            i + 1
        );
        assert_eq!(
            reader
                .read_message(&written)
                .expect("read handshake message"),
            payload
        );
    }
    assert!(initiator.is_finished() && responder.is_finished());
    assert_eq!(initiator.remote_static(), Some(resp_static.public()));
    assert_eq!(responder.remote_static(), Some(init_static.public()));
    if let Some(h) = case.get("handshake_hash") {
        assert_eq!(
            initiator.handshake_hash().to_vec(),
            hex(h),
            "handshake hash differs from the vector"
        );
        assert_eq!(responder.handshake_hash().to_vec(), hex(h));
    }

    let mut initiator = initiator.into_transport().unwrap();
    let mut responder = responder.into_transport().unwrap();
    for (i, message) in messages.iter().enumerate().skip(3) {
        let (payload, expected) = (hex(&message["payload"]), hex(&message["ciphertext"]));
        let (writer, reader) = if i % 2 == 0 {
            (&mut initiator, &mut responder)
        } else {
            (&mut responder, &mut initiator)
        };
        let sealed = writer.seal(&payload).unwrap();
        assert_eq!(
            sealed, expected,
            "transport message {i} differs from the vector"
        );
        assert_eq!(reader.open(&sealed).unwrap(), payload);
    }
    messages.len()
}

#[test]
fn cacophony_vectors_byte_for_byte() {
    let cases = xx_vectors("cacophony.txt");
    let with_hash = cases
        .iter()
        .filter(|c| c.get("handshake_hash").is_some())
        .count();
    assert!(
        with_hash >= 1,
        "the cacophony XX case carries a handshake hash"
    );
    let checked: usize = cases.iter().map(replay_vector).sum();
    eprintln!(
        "cacophony: {} case(s), {checked} messages, {with_hash} handshake hash(es) checked",
        cases.len()
    );
}

#[test]
fn snow_vectors_byte_for_byte() {
    let cases = xx_vectors("snow.txt");
    let checked: usize = cases.iter().map(replay_vector).sum();
    eprintln!("snow: {} case(s), {checked} messages checked", cases.len());
}

// ---------------------------------------------------------------------------
// 2. Live round trips with snow
// ---------------------------------------------------------------------------

/// A small deterministic generator for sizes and contents (splitmix64), so a
/// failure can be reproduced from its seed. Keys still come from the OS.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn snow_builder(key: &StaticKeypair) -> snow::Builder<'static> {
    let private: &'static [u8] = Box::leak(private_bytes(key).into_boxed_slice());
    snow::Builder::new(PROTOCOL_NAME.parse().unwrap())
        .local_private_key(private)
        .unwrap()
        .prologue(PROLOGUE)
        .unwrap()
}

/// The private key bytes, taken from the key file text (the crate does not
/// otherwise expose them).
fn private_bytes(key: &StaticKeypair) -> Vec<u8> {
    use base64::Engine as _;
    let text = key.to_key_file();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("private: "))
        .unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(line)
        .unwrap()
}

/// One handshake between portcullis and snow, with random
/// payloads; returns both transports after checking hashes and keys agree.
fn handshake_with_snow(rng: &mut Rng, ours_initiates: bool) -> (Transport, snow::TransportState) {
    let our_key = StaticKeypair::generate().unwrap();
    let snow_key = StaticKeypair::generate().unwrap();
    let mut ours = if ours_initiates {
        Handshake::initiator(&our_key, PROLOGUE)
    } else {
        Handshake::responder(&our_key, PROLOGUE)
    };
    let mut theirs = if ours_initiates {
        snow_builder(&snow_key).build_responder().unwrap()
    } else {
        snow_builder(&snow_key).build_initiator().unwrap()
    };
    // Payload ceilings of messages 1, 2 and 3 under the 65535-byte limit.
    // snow's writer reserves room for a tag even in the unencrypted message 1
    // (snow 0.10 handshakestate.rs), so when snow writes it, 16 bytes less.
    let first = if ours_initiates {
        MAX_MESSAGE_LEN - 32
    } else {
        MAX_MESSAGE_LEN - 32 - 16
    };
    let ceilings = [first, MAX_MESSAGE_LEN - 96, MAX_MESSAGE_LEN - 64];
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    for (i, ceiling) in ceilings.into_iter().enumerate() {
        let len = match rng.below(4) {
            0 => 0,
            1 => ceiling,
            _ => rng.below(ceiling + 1),
        };
        let payload = rng.bytes(len);
        let ours_writes = (i % 2 == 0) == ours_initiates;
        if ours_writes {
            let msg = ours.write_message(&payload).unwrap();
            let n = theirs.read_message(&msg, &mut buf).unwrap();
            assert_eq!(&buf[..n], payload.as_slice());
        } else {
            let n = theirs.write_message(&payload, &mut buf).unwrap();
            assert_eq!(ours.read_message(&buf[..n]).unwrap(), payload);
        }
    }
    assert!(ours.is_finished() && theirs.is_handshake_finished());
    assert_eq!(
        ours.handshake_hash().as_slice(),
        theirs.get_handshake_hash()
    );
    assert_eq!(ours.remote_static(), Some(snow_key.public()));
    assert_eq!(
        theirs.get_remote_static(),
        Some(our_key.public().as_bytes().as_slice())
    );
    (
        ours.into_transport().unwrap(),
        theirs.into_transport_mode().unwrap(),
    )
}

/// Sends one message of each size each way, alternating directions.
fn exchange(
    ours: &mut Transport,
    theirs: &mut snow::TransportState,
    rng: &mut Rng,
    sizes: &[usize],
) {
    let mut buf = vec![0u8; MAX_MESSAGE_LEN];
    for &len in sizes {
        let payload = rng.bytes(len);
        let sealed = ours.seal(&payload).unwrap();
        let n = theirs.read_message(&sealed, &mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            payload.as_slice(),
            "snow opened something else ({len} bytes)"
        );

        let n = theirs.write_message(&payload, &mut buf).unwrap();
        assert_eq!(
            ours.open(&buf[..n]).unwrap(),
            payload,
            "we opened something else ({len} bytes)"
        );
    }
}

fn edge_and_random_sizes(rng: &mut Rng, random: usize) -> Vec<usize> {
    let mut sizes = vec![
        0,
        1,
        15,
        16,
        17,
        255,
        256,
        1024,
        4096,
        65_503,
        MAX_PLAINTEXT_LEN - 1,
        MAX_PLAINTEXT_LEN,
    ];
    sizes.extend((0..random).map(|_| rng.below(MAX_PLAINTEXT_LEN + 1)));
    sizes
}

/// 48 handshakes with fresh random keys, each followed by traffic of edge
/// and random sizes in both directions.
fn round_trips(seed: u64, ours_initiates: bool) {
    let mut rng = Rng(seed);
    for _ in 0..48 {
        let (mut ours, mut theirs) = handshake_with_snow(&mut rng, ours_initiates);
        let sizes = edge_and_random_sizes(&mut rng, 8);
        exchange(&mut ours, &mut theirs, &mut rng, &sizes);
    }
}

#[test]
fn round_trips_with_snow_as_responder() {
    round_trips(0x5EED_0001, true);
}

#[test]
fn round_trips_with_snow_as_initiator() {
    round_trips(0x5EED_0002, false);
}

/// Both directions cross the first REKEY boundary (after message 2^20) and
/// keep going; snow rekeys when told to, at the same message counts.
#[test]
fn traffic_across_a_rekey_boundary_with_snow() {
    let mut rng = Rng(0x5EED_0003);
    let (mut ours, mut theirs) = handshake_with_snow(&mut rng, true);
    let total = REKEY_INTERVAL + 3;
    let mut buf = vec![0u8; 64];
    let mut out = vec![0u8; 64];
    for i in 1..=total {
        let payload = (i as u32).to_be_bytes();

        let sealed = ours.seal(&payload).unwrap();
        let n = theirs.read_message(&sealed, &mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            payload.as_slice(),
            "initiator→responder message {i}"
        );
        if i.is_multiple_of(REKEY_INTERVAL) {
            theirs.rekey_incoming();
        }

        let n = theirs.write_message(&payload, &mut out).unwrap();
        if i.is_multiple_of(REKEY_INTERVAL) {
            theirs.rekey_outgoing();
        }
        assert_eq!(
            ours.open(&out[..n]).unwrap(),
            payload,
            "responder→initiator message {i}"
        );
    }
    // Large messages after the boundary still agree.
    let sizes = edge_and_random_sizes(&mut rng, 4);
    exchange(&mut ours, &mut theirs, &mut rng, &sizes);
}

// ---------------------------------------------------------------------------
// 3. Hostile messages
// ---------------------------------------------------------------------------

struct Pair {
    client: Handshake,
    gateway: Handshake,
    gateway_key: StaticKeypair,
}

fn fresh_pair() -> Pair {
    let gateway_key = StaticKeypair::generate().unwrap();
    let client_key = StaticKeypair::generate().unwrap();
    Pair {
        client: Handshake::initiator(&client_key, PROLOGUE),
        gateway: Handshake::responder(&gateway_key, PROLOGUE),
        gateway_key,
    }
}

fn established() -> (Transport, Transport) {
    let Pair {
        mut client,
        mut gateway,
        ..
    } = fresh_pair();
    let m1 = client.write_message(b"").unwrap();
    gateway.read_message(&m1).unwrap();
    let m2 = gateway.write_message(br#"{"provider_id":"test"}"#).unwrap();
    client.read_message(&m2).unwrap();
    let m3 = client.write_message(b"{}").unwrap();
    gateway.read_message(&m3).unwrap();
    (
        client.into_transport().unwrap(),
        gateway.into_transport().unwrap(),
    )
}

fn flip(mut message: Vec<u8>, index: usize) -> Vec<u8> {
    let i = index % message.len();
    message[i] ^= 0x01;
    message
}

#[test]
fn every_bit_flip_in_message_2_or_3_is_detected() {
    // Each fork is a fresh pair up to message 2 ("hello" as its payload).
    let to_message_2 = || {
        let mut pair = fresh_pair();
        let m1 = pair.client.write_message(b"").unwrap();
        pair.gateway.read_message(&m1).unwrap();
        let m2 = pair.gateway.write_message(b"hello").unwrap();
        (pair, m2)
    };
    let message_2_len = to_message_2().1.len();
    for i in 0..message_2_len {
        let (mut fork, m2) = to_message_2();
        let result = fork.client.read_message(&flip(m2, i));
        assert!(
            matches!(result, Err(Error::Decrypt | Error::WeakPublicKey)),
            "flip at byte {i} of message 2: {result:?}"
        );
        // And the failed handshake refuses to continue.
        assert_eq!(fork.client.write_message(b"{}"), Err(Error::Failed));
    }
    for i in 0.. {
        let (mut fork, m2) = to_message_2();
        fork.client.read_message(&m2).unwrap();
        let m3 = fork.client.write_message(b"{}").unwrap();
        if i == m3.len() {
            break;
        }
        let result = fork.gateway.read_message(&flip(m3, i));
        assert_eq!(result, Err(Error::Decrypt), "flip at byte {i} of message 3");
        assert!(matches!(
            fork.gateway.into_transport(),
            Err(Error::HandshakeIncomplete)
        ));
    }
}

#[test]
fn altered_message_1_is_caught_by_message_2() {
    // Message 1 is plaintext, so the gateway cannot tell; the transcripts
    // then differ and the client rejects message 2.
    let Pair {
        mut client,
        mut gateway,
        ..
    } = fresh_pair();
    let m1 = client.write_message(b"").unwrap();
    gateway.read_message(&flip(m1, 3)).unwrap();
    let m2 = gateway.write_message(b"").unwrap();
    assert!(matches!(
        client.read_message(&m2),
        Err(Error::Decrypt | Error::WeakPublicKey)
    ));
}

#[test]
fn truncated_handshake_messages_are_rejected() {
    let Pair { mut gateway, .. } = fresh_pair();
    assert_eq!(
        gateway.read_message(&[0u8; 31]),
        Err(Error::Truncated { need: 32, got: 31 })
    );

    // Message 2 is e (32) + encrypted s (48) + encrypted payload (7 + 16).
    for cut in [0, 31, 32, 79, 80, 95, 102] {
        let Pair {
            mut client,
            mut gateway,
            ..
        } = fresh_pair();
        let m1 = client.write_message(b"").unwrap();
        gateway.read_message(&m1).unwrap();
        let m2 = gateway.write_message(b"payload").unwrap();
        assert_eq!(m2.len(), 103);
        let result = client.read_message(&m2[..cut]);
        assert!(
            matches!(result, Err(Error::Truncated { .. } | Error::Decrypt)),
            "message 2 cut to {cut} bytes: {result:?}"
        );
    }
}

#[test]
fn a_client_pinning_another_key_aborts_before_message_3() {
    let Pair { mut gateway, .. } = fresh_pair();
    let impostor_pin = *StaticKeypair::generate().unwrap().public();
    let mut client = Handshake::initiator(&StaticKeypair::generate().unwrap(), PROLOGUE)
        .pin_remote_static(impostor_pin);
    let m1 = client.write_message(b"").unwrap();
    gateway.read_message(&m1).unwrap();
    let m2 = gateway.write_message(b"").unwrap();
    assert!(matches!(
        client.read_message(&m2),
        Err(Error::RemoteKeyMismatch { .. })
    ));
    assert_eq!(
        client.write_message(br#"{"token":"secret"}"#),
        Err(Error::Failed)
    );
}

#[test]
fn a_client_pinning_the_right_key_completes() {
    let Pair {
        mut gateway,
        gateway_key,
        ..
    } = fresh_pair();
    let mut client = Handshake::initiator(&StaticKeypair::generate().unwrap(), PROLOGUE)
        .pin_remote_static(*gateway_key.public());
    let m1 = client.write_message(b"").unwrap();
    gateway.read_message(&m1).unwrap();
    let m2 = gateway.write_message(b"").unwrap();
    client.read_message(&m2).unwrap();
    let m3 = client.write_message(b"{}").unwrap();
    assert_eq!(gateway.read_message(&m3).unwrap(), b"{}");
}

#[test]
fn a_low_order_ephemeral_key_is_refused() {
    let Pair { mut gateway, .. } = fresh_pair();
    // The all-zero point has order 1: every DH with it is zero.
    gateway.read_message(&[0u8; 32]).unwrap();
    assert_eq!(gateway.write_message(b""), Err(Error::WeakPublicKey));
}

#[test]
fn different_prologues_do_not_agree() {
    let mut client = Handshake::initiator(&StaticKeypair::generate().unwrap(), b"portcullis.v0");
    let Pair { mut gateway, .. } = fresh_pair();
    let m1 = client.write_message(b"").unwrap();
    gateway.read_message(&m1).unwrap();
    let m2 = gateway.write_message(b"").unwrap();
    assert_eq!(client.read_message(&m2), Err(Error::Decrypt));
}

#[test]
fn out_of_order_calls_are_refused() {
    let Pair {
        mut client,
        mut gateway,
        ..
    } = fresh_pair();
    assert!(matches!(
        client.read_message(&[0u8; 32]),
        Err(Error::OutOfOrder { number: 1, .. })
    ));
    assert!(matches!(
        gateway.write_message(b""),
        Err(Error::OutOfOrder { number: 1, .. })
    ));
    let Pair { client, .. } = fresh_pair();
    assert!(matches!(
        client.into_transport(),
        Err(Error::HandshakeIncomplete)
    ));
}

#[test]
fn oversized_handshake_messages_and_payloads_are_refused() {
    let Pair {
        mut client,
        mut gateway,
        ..
    } = fresh_pair();
    assert_eq!(
        gateway.read_message(&vec![0u8; MAX_MESSAGE_LEN + 1]),
        Err(Error::MessageTooLarge {
            len: MAX_MESSAGE_LEN + 1
        })
    );
    assert!(matches!(
        client.write_message(&vec![0u8; MAX_MESSAGE_LEN - 31]),
        Err(Error::PayloadTooLarge { .. })
    ));
}

#[test]
fn transport_rejects_tampered_replayed_reordered_dropped_truncated_and_oversized() {
    // Altered: every byte position of one record.
    let (mut client, _) = established();
    let record = client.seal(b"some frame").unwrap();
    for i in 0..record.len() {
        let (mut client, mut gateway) = established();
        let record = client.seal(b"some frame").unwrap();
        assert_eq!(
            gateway.open(&flip(record.clone(), i)),
            Err(Error::Decrypt),
            "flip at byte {i}"
        );
        // Fail closed: even the genuine record is refused afterwards.
        assert_eq!(gateway.open(&record), Err(Error::Failed));
    }
    drop(record);

    // Replayed.
    let (mut client, mut gateway) = established();
    let first = client.seal(b"one").unwrap();
    assert_eq!(gateway.open(&first).unwrap(), b"one");
    assert_eq!(gateway.open(&first), Err(Error::Decrypt));

    // Reordered.
    let (mut client, mut gateway) = established();
    let (a, b) = (client.seal(b"a").unwrap(), client.seal(b"b").unwrap());
    assert_eq!(gateway.open(&b), Err(Error::Decrypt));
    assert_eq!(gateway.open(&a), Err(Error::Failed));

    // Dropped.
    let (mut client, mut gateway) = established();
    let _lost = client.seal(b"lost").unwrap();
    let next = client.seal(b"next").unwrap();
    assert_eq!(gateway.open(&next), Err(Error::Decrypt));

    // Truncated.
    let (mut client, mut gateway) = established();
    let record = client.seal(b"truncate me").unwrap();
    assert_eq!(
        gateway.open(&record[..15]),
        Err(Error::Truncated { need: 16, got: 15 })
    );
    let (mut client, mut gateway) = established();
    let record = client.seal(b"truncate me").unwrap();
    assert_eq!(
        gateway.open(&record[..record.len() - 1]),
        Err(Error::Decrypt)
    );

    // Oversized.
    let (_, mut gateway) = established();
    assert_eq!(
        gateway.open(&vec![0u8; MAX_MESSAGE_LEN + 1]),
        Err(Error::MessageTooLarge {
            len: MAX_MESSAGE_LEN + 1
        })
    );
    let (mut client, _) = established();
    assert!(matches!(
        client.seal(&vec![0u8; MAX_PLAINTEXT_LEN + 1]),
        Err(Error::PayloadTooLarge { .. })
    ));

    // Reflected: a record sent back to its sender does not open.
    let (mut client, _) = established();
    let record = client.seal(b"mirror").unwrap();
    assert_eq!(client.open(&record), Err(Error::Decrypt));
}

#[test]
fn public_key_base64_round_trips() {
    let key = *StaticKeypair::generate().unwrap().public();
    assert_eq!(PublicKey::from_base64(&key.to_base64()).unwrap(), key);
    assert!(PublicKey::from_base64("AAAA").is_err());
    assert!(key.fingerprint().starts_with("SHA256:"));
}

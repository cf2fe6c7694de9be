//! `cargo bench -p portcullis-crypto`
//!
//! - handshake CPU per side: each side's three steps plus `into_transport`,
//!   replaying the other side's messages from a fixed transcript (the fixed
//!   ephemeral key still costs its scalar multiplication; only the OS random
//!   call is skipped), and a whole handshake with fresh random ephemerals;
//! - transport throughput with full-size records (65519 plaintext bytes,
//!   the most one 65535-byte Noise message carries): seal, open, and both,
//!   with ring's AES-256-GCM on the same buffers as a reference row.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use portcullis_crypto::{Handshake, MAX_PLAINTEXT_LEN, PROLOGUE, StaticKeypair, Transport};

const CLIENT_HELLO: &[u8] = br#"{"token":"0123456789abcdef0123456789abcdef"}"#;
const GATEWAY_HELLO: &[u8] = br#"{"provider_id":"bench","protocol":"ya-environment-relay.v1"}"#;

struct Keys {
    client: StaticKeypair,
    gateway: StaticKeypair,
}

fn client(keys: &Keys) -> Handshake {
    Handshake::initiator(&keys.client, PROLOGUE).with_fixed_ephemeral_for_testing_only([0x11; 32])
}

fn gateway(keys: &Keys) -> Handshake {
    Handshake::responder(&keys.gateway, PROLOGUE).with_fixed_ephemeral_for_testing_only([0x22; 32])
}

/// Messages 1, 2 and 3 of the deterministic handshake.
fn transcript(keys: &Keys) -> [Vec<u8>; 3] {
    let (mut c, mut g) = (client(keys), gateway(keys));
    let m1 = c.write_message(b"").unwrap();
    g.read_message(&m1).unwrap();
    let m2 = g.write_message(GATEWAY_HELLO).unwrap();
    c.read_message(&m2).unwrap();
    let m3 = c.write_message(CLIENT_HELLO).unwrap();
    [m1, m2, m3]
}

/// A complete handshake with fresh random ephemerals; both transports.
fn full_handshake(keys: &Keys) -> (Transport, Transport) {
    let (mut c, mut g) = (
        Handshake::initiator(&keys.client, PROLOGUE),
        Handshake::responder(&keys.gateway, PROLOGUE),
    );
    let m1 = c.write_message(b"").unwrap();
    g.read_message(&m1).unwrap();
    let m2 = g.write_message(GATEWAY_HELLO).unwrap();
    c.read_message(&m2).unwrap();
    let m3 = c.write_message(CLIENT_HELLO).unwrap();
    g.read_message(&m3).unwrap();
    (c.into_transport().unwrap(), g.into_transport().unwrap())
}

fn established() -> (Transport, Transport) {
    full_handshake(&Keys {
        client: StaticKeypair::generate().unwrap(),
        gateway: StaticKeypair::generate().unwrap(),
    })
}

fn handshake(c: &mut Criterion) {
    let keys = Keys {
        client: StaticKeypair::from_private_bytes([1; 32]),
        gateway: StaticKeypair::from_private_bytes([2; 32]),
    };
    let [m1, m2, m3] = transcript(&keys);
    let mut group = c.benchmark_group("handshake");

    group.bench_function("initiator", |b| {
        b.iter(|| {
            let mut hs = client(&keys);
            black_box(hs.write_message(b"").unwrap());
            hs.read_message(black_box(&m2)).unwrap();
            black_box(hs.write_message(CLIENT_HELLO).unwrap());
            black_box(hs.into_transport().unwrap())
        })
    });

    group.bench_function("responder", |b| {
        b.iter(|| {
            let mut hs = gateway(&keys);
            hs.read_message(black_box(&m1)).unwrap();
            black_box(hs.write_message(GATEWAY_HELLO).unwrap());
            hs.read_message(black_box(&m3)).unwrap();
            black_box(hs.into_transport().unwrap())
        })
    });

    group.bench_function("both_sides_random_ephemerals", |b| {
        b.iter(|| black_box(full_handshake(&keys)))
    });
    group.finish();
}

fn transport(c: &mut Criterion) {
    let plaintext = vec![0x5Au8; MAX_PLAINTEXT_LEN];
    let mut group = c.benchmark_group("transport_65519B");
    group.throughput(Throughput::Bytes(MAX_PLAINTEXT_LEN as u64));

    let (client, gateway) = established();
    let (mut sender, _) = client.split();
    let (_, mut receiver) = gateway.split();
    let mut buf = Vec::with_capacity(MAX_PLAINTEXT_LEN + 16);
    group.bench_function("seal_then_open", |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&plaintext);
            sender.seal_in_place(&mut buf).unwrap();
            receiver.open_in_place(&mut buf).unwrap();
            black_box(&buf);
        })
    });

    let (client, _) = established();
    let (mut sender, _) = client.split();
    group.bench_function("seal", |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&plaintext);
            sender.seal_in_place(&mut buf).unwrap();
            black_box(&buf);
        })
    });

    group.finish();
}

criterion_group!(benches, handshake, transport);
criterion_main!(benches);

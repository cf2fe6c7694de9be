//! A plaintext record (what a peer can put inside a transport message)
//! through the record and frame decoder. Beyond "never panics": whatever
//! decodes must re-encode to a record that decodes to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portcullis_wire::frame::RequestId;
use portcullis_wire::record::{self, Record};

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = record::decode(data) else {
        return;
    };
    let mut again = Vec::new();
    match &decoded {
        Record::Frame(frame) => {
            record::encode_frame(frame, &mut again)
                .expect("a decoded frame re-encodes within a record");
        }
        Record::Chunk(chunk) => {
            let id = RequestId::new(chunk.request_id).expect("a decoded chunk id is valid");
            record::encode_chunk(&id, chunk.channel, chunk.data, &mut again)
                .expect("a decoded chunk re-encodes");
            assert_eq!(again, data, "chunk encoding is canonical");
        }
        Record::Part(part) => {
            again.extend([record::KIND_PART, u8::from(part.last)]);
            again.extend_from_slice(part.json);
            assert_eq!(again, data, "a part is its flag and bytes");
            // Alone, or as the last of a frame, through a small assembler:
            // bounded, and what it joins is only ever decoded, never trusted.
            let mut parts = record::Assembler::new(1 << 10);
            if let Some(Ok(json)) = parts.push(*part) {
                let _ = portcullis_wire::frame::decode_frame(&json);
            }
        }
    }
    assert_eq!(
        record::decode(&again).expect("re-encoded record decodes"),
        decoded
    );
});

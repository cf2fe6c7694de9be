//! A runtime's JSON-RPC messages (ya-environment-protocol.v1) through the
//! profile's translator, past a hello: whatever a peer sends never panics,
//! and every record handed to the session is one its decoder takes (a
//! frame or a part) or a refusal it audits; answering anything the session
//! might send back never panics either.

#![no_main]

use libfuzzer_sys::fuzz_target;
use portcullis_wire::envproto::Translator;

const HELLO: &[u8] = br#"{"type":"hello","protocol":"ya-environment-relay.v1","provider_id":"p","instance_id":"i","capabilities":{"fileops":{"enabled":true,"generation":"0123456789abcdef","roots":[{"root_id":"main","virtual_path":"/workspace/main","mode":"rw"}]},"shell":{"enabled":true,"interactive":true,"persist":true}}}"#;

fuzz_target!(|data: &[u8]| {
    let mut t = Translator::new();
    t.outbound(HELLO);
    // Messages separated by NUL bytes: several in one input.
    for message in data.split(|&b| b == 0).take(16) {
        let Ok(records) = t.inbound(message, 1 << 20) else {
            return;
        };
        for record in records {
            assert!(!record.is_empty());
            // What the session sends back about it, as the writer sees it.
            if let Ok(portcullis_wire::record::Record::Frame(frame)) =
                portcullis_wire::record::decode(&record)
            {
                let mut json = Vec::new();
                portcullis_wire::frame::encode_frame_json(&frame, &mut json);
                let _ = t.outbound(&json);
            }
        }
        // The session's own frames, shaped by the input.
        let _ = t.outbound(message);
    }
});

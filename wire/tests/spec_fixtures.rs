//! Every JSON example in the relay spec (`../shared/specs/relay-0.74/`,
//! or `$PORTCULLIS_SPECS_DIR`) is a fixture: a frame decodes with this
//! crate's types, validates, and encodes back to the same JSON (nothing
//! the spec wrote is lost or renamed). Examples that are parts of a frame
//! (a request's `method` and `params`, a `context`) are decoded as part of
//! one.

mod spec_text;

use std::path::PathBuf;

use portcullis_wire::frame::{Frame, decode_frame};
use serde_json::{Value, json};

fn specs_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_SPECS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/specs/relay-0.74"),
    }
}

/// The ```json blocks of one spec file, with their line numbers.
fn json_blocks(file: &str) -> Vec<(usize, Value)> {
    spec_text::json_blocks(&specs_dir(), file)
}

/// `value` as a frame: decoded, validated, and encoded back to itself
/// (every field the spec wrote, by its name and value).
fn round_trip(place: &str, value: &Value) -> Frame {
    let text = serde_json::to_vec(value).unwrap();
    let frame = decode_frame(&text).unwrap_or_else(|e| panic!("{place}: {e}\n{value:#}"));
    let again = serde_json::to_value(&frame).unwrap();
    assert_eq!(
        &again, value,
        "{place}: the frame does not encode back as written"
    );
    frame
}

#[test]
fn every_frame_in_the_protocol_text_decodes_and_encodes_back() {
    let blocks = json_blocks("02-protocol.md");
    assert!(blocks.len() >= 15, "{} examples", blocks.len());
    let mut kinds = std::collections::BTreeSet::new();
    for (line, value) in &blocks {
        let place = format!("02-protocol.md:{line}");
        assert!(value.get("type").is_some(), "{place}: not a frame");
        let frame = round_trip(&place, value);
        kinds.insert(
            serde_json::to_value(&frame).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Every frame type the spec names has an example here.
    let expected = json!([
        "cancel", "event", "hello", "ping", "pong", "request", "response", "stream"
    ]);
    assert_eq!(json!(kinds), expected);
}

#[test]
fn the_environment_text_s_frames_and_fragments_decode() {
    let blocks = json_blocks("03-environment.md");
    assert_eq!(blocks.len(), 5, "the examples of 03-environment.md");
    for (line, value) in &blocks {
        let place = format!("03-environment.md:{line}");
        if value.get("type").is_some() {
            round_trip(&place, value);
        } else if value.get("method").is_some() {
            // A request as the runtime writes it, less its envelope.
            let mut frame = value.clone();
            frame["type"] = json!("request");
            frame["id"] = json!("req_fixture");
            round_trip(&place, &frame);
        } else if let Some(context) = value.get("context") {
            let frame = json!({"type": "request", "id": "req_fixture", "method": "file.read",
                "params": {}, "context": context});
            let Frame::Request(request) = round_trip(&place, &frame) else {
                panic!("{place}: not a request")
            };
            let context = request.context.unwrap();
            assert_eq!(context.workspace_id.as_deref(), Some("workspace_abc"));
        } else {
            // The tool descriptor: what `tool.list` and `tool.registered`
            // carry; the daemon's e2e tests compare its fields.
            assert!(value.get("input_schema").is_some(), "{place}: {value}");
        }
    }
}

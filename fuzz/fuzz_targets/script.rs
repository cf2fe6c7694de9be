//! Arbitrary text as a Rhai script under small limits: it never panics the
//! host, always ends (libFuzzer's -timeout catches a hang), ends within
//! its wall-clock limit, never counts more operations than allowed, and a
//! value it returns respects the size limits.

#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use portcullis_script::run_pure;
use portcullis_policy::ScriptLimits;
use serde_json::Value;

const LIMITS: ScriptLimits = ScriptLimits {
    max_operations: 50_000,
    max_wall_time: Duration::from_millis(500),
    max_string_size: 4096,
    max_array_len: 256,
    max_map_len: 256,
    max_call_depth: 16,
    max_tool_calls: 0,
    max_output: 4096,
    runtime_tools: false,
};

fn within_limits(value: &Value) {
    match value {
        Value::String(s) => assert!(s.len() as u64 <= LIMITS.max_string_size, "string {}", s.len()),
        Value::Array(items) => {
            assert!(items.len() as u64 <= LIMITS.max_array_len, "array {}", items.len());
            items.iter().for_each(within_limits);
        }
        Value::Object(map) => {
            assert!(map.len() as u64 <= LIMITS.max_map_len, "map {}", map.len());
            map.values().for_each(within_limits);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let started = Instant::now();
    let result = run_pure(source, &LIMITS);
    assert!(
        started.elapsed() < LIMITS.max_wall_time + Duration::from_secs(2),
        "ran {:?}",
        started.elapsed()
    );
    if let Ok((value, operations)) = result {
        assert!(operations <= LIMITS.max_operations, "{operations} operations");
        within_limits(&value);
    }
});

//! `portcullis protocol schema` against the 0.92 spec texts
//! (`../shared/specs/protocol-0.92/`, or `$PORTCULLIS_SPECS_092_DIR`):
//! every method the spec names is in the schema (or listed as one this
//! provider answers `capability_unavailable`), every schema compiles, and
//! every JSON example of a request or notification matches its schema,
//! and every result, mount, target or tool descriptor the types it gives. (The end-to-end tests check the
//! provider's own messages against it: `tests/e2e_envproto.rs`.)

#[path = "../wire/tests/spec_text/mod.rs"]
mod spec_text;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use portcullis_wire::envproto::schema;
use serde_json::{Value, json};

fn specs_dir() -> PathBuf {
    match std::env::var_os("PORTCULLIS_SPECS_092_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/specs/protocol-0.92"),
    }
}

/// The problems of `value` against `schema`, as `pointer: why`.
fn problems(schema: &Value, value: &Value) -> Vec<String> {
    let validator = jsonschema::validator_for(schema)
        .unwrap_or_else(|e| panic!("not a valid JSON Schema: {e}\n{schema:#}"));
    validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn check(place: &str, schema: Option<Value>, value: &Value) {
    let schema = schema.unwrap_or_else(|| panic!("{place}: the schema has nothing for it"));
    let wrong = problems(&schema, value);
    assert!(wrong.is_empty(), "{place}: {wrong:#?}\n{value:#}");
}

/// `schema` without its `required` lists: for a result the spec shows,
/// whose fields must have the types the schema gives, while the provider's
/// own results carry more (`wire/tests/envproto_spec_fixtures.rs` checks
/// that they have every field the example has).
fn types_only(schema: Option<Value>) -> Option<Value> {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("required");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    schema.map(|mut schema| {
        strip(&mut schema);
        schema
    })
}

/// A `$defs` entry of the document, standing alone.
fn def(name: &str) -> Option<Value> {
    let document = schema::document();
    Some(json!({"$ref": format!("#/$defs/{name}"), "$defs": document["$defs"].clone()}))
}

#[test]
fn every_method_the_spec_names_is_in_the_schema() {
    let text = std::fs::read_to_string(specs_dir().join("02-protocol.md")).unwrap();
    let namespaces = text
        .split("## Method Namespaces")
        .nth(1)
        .and_then(|rest| rest.split("```text").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("02-protocol.md has its Method Namespaces block");
    let document = schema::document();
    let unavailable: Vec<&str> = document["unavailable"]["methods"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut named = 0;
    for method in namespaces.split_whitespace() {
        named += 1;
        let served = document["methods"].get(method).is_some();
        assert!(
            served || unavailable.contains(&method),
            "`{method}` is in the spec but not in the schema"
        );
        if served {
            for part in ["params", "result"] {
                let schema = schema::of(method, part).unwrap();
                jsonschema::validator_for(&schema)
                    .unwrap_or_else(|e| panic!("{method} {part}: {e}"));
            }
        }
    }
    assert!(named >= 40, "only {named} methods read from the spec");
}

#[test]
fn every_example_of_the_spec_matches_the_schema() {
    let mut checked = 0;
    for file in ["02-protocol.md", "03-environment.md"] {
        // Requests by id (for results that name theirs), and the last
        // request (for the "It returns:" blocks that follow it).
        let mut by_id: HashMap<String, String> = HashMap::new();
        let mut last: Option<String> = None;
        for (line, example) in spec_text::json_blocks(&specs_dir(), file) {
            let place = format!("{file}:{line}");
            let id = example.get("id").map(Value::to_string);
            if let Some(method) = example.get("method").and_then(Value::as_str) {
                check(&place, schema::of(method, "params"), &example["params"]);
                if let Some(id) = id {
                    by_id.insert(id, method.to_string());
                }
                last = Some(method.to_string());
            } else if let Some(result) = example.get("result") {
                let method = id.and_then(|id| by_id.get(&id)).expect(&place);
                check(&place, types_only(schema::of(method, "result")), result);
            } else if example.get("error").is_some() {
                let name = example["error"]["data"]["name"].as_str().unwrap();
                let code = example["error"]["code"].as_i64().unwrap();
                let listed = schema::document()["errors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == name && e["code"] == code);
                assert!(
                    listed,
                    "{place}: error {name} {code} is not in the schema's table"
                );
            } else if example.get("virtual_path").is_some() && example.get("mode").is_some() {
                check(&place, def("mount"), &example);
            } else if example.get("platform").is_some() {
                check(&place, def("target"), &example);
            } else if example.get("input_schema").is_some() {
                let tools = json!({"tools": [example]});
                check(&place, schema::of("tool.list", "result"), &tools);
            } else if example.get("mount_id").is_some() && example.get("path").is_some() {
                check(&place, def("file_params"), &example);
            } else {
                let method = last.take().expect(&place);
                check(&place, types_only(schema::of(&method, "result")), &example);
            }
            checked += 1;
        }
    }
    assert!(checked >= 25, "only {checked} examples checked");
}

#[test]
fn the_cli_prints_the_document_and_one_method() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(args)
            .output()
            .unwrap()
    };
    let whole = run(&["protocol", "schema"]);
    assert!(whole.status.success());
    let document: Value = serde_json::from_slice(&whole.stdout).unwrap();
    assert_eq!(document, schema::document());
    let one = run(&[
        "protocol",
        "schema",
        "--method",
        "process.wait",
        "--part",
        "result",
    ]);
    assert!(one.status.success());
    let result: Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(Some(result), schema::of("process.wait", "result"));
    let unknown = run(&["protocol", "schema", "--method", "computer.see"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("not a method"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
}

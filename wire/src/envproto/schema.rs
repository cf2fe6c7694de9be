//! `portcullis protocol schema`: the JSON Schema of every method's params
//! and result in this profile, as the provider serves it. The document is
//! `schema.json` with the error table of [`codes`](super::codes) added, so
//! the numbers are written once. The daemon's end-to-end tests check every
//! message of their conversations against it, and every request in the
//! spec's texts.

use serde_json::{Value, json};

use super::codes::ERROR_CODES;
use super::translate::PROTOCOL;

const DOCUMENT: &str = include_str!("schema.json");

/// The whole schema document: `$defs`, `methods` (each with `params` and
/// `result`), `notifications`, `unavailable`, and `errors` (name → code).
pub fn document() -> Value {
    // A constant of this crate's, parsed by a unit test: it cannot fail
    // here unless that test does.
    let mut document: Value = serde_json::from_str(DOCUMENT)
        .unwrap_or_else(|e| json!({"error": format!("schema.json does not parse: {e}")}));
    document["protocol"] = json!(PROTOCOL);
    document["errors"] = ERROR_CODES
        .iter()
        .map(|(name, code)| json!({"name": name, "code": code}))
        .collect();
    document
}

/// The schema of `method`'s `params` or `result` (`part`), with the
/// document's `$defs` so it stands alone; `None` for a method or part the
/// document lacks. Notifications have `params` only.
pub fn of(method: &str, part: &str) -> Option<Value> {
    let document = document();
    let entry = document["methods"]
        .get(method)
        .or_else(|| document["notifications"].get(method))?;
    let mut schema = entry.get(part)?.clone();
    if let Value::Object(map) = &mut schema {
        map.insert("$schema".into(), document["$schema"].clone());
        map.insert("$defs".into(), document["$defs"].clone());
    }
    Some(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_parses_and_every_method_has_params_and_result() {
        let document: Value = serde_json::from_str(DOCUMENT).expect("schema.json is JSON");
        let methods = document["methods"].as_object().unwrap();
        assert!(methods.len() >= 45, "{}", methods.len());
        for (name, entry) in methods {
            assert!(entry["params"].is_object(), "{name}");
            assert!(entry["result"].is_object(), "{name}");
            assert!(entry["direction"].is_string(), "{name}");
            assert!(of(name, "params").unwrap()["$defs"].is_object());
        }
        for name in ["$/cancelRequest", "$/stream", "$/event"] {
            assert!(of(name, "params").is_some(), "{name}");
        }
        let errors = document_errors();
        assert_eq!(errors.len(), ERROR_CODES.len());
        assert!(errors.contains(&("process_lost".to_string(), -32061)));
    }

    fn document_errors() -> Vec<(String, i64)> {
        document()["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["code"].as_i64().unwrap(),
                )
            })
            .collect()
    }
}

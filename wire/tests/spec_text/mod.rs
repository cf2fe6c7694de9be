//! The ```json examples of a spec's Markdown texts, for the fixture tests.

use std::path::Path;

use serde_json::Value;

/// The ```json blocks of `dir/file`, each with the line it starts on.
pub fn json_blocks(dir: &Path, file: &str) -> Vec<(usize, Value)> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}. The specs live in ../shared/specs beside the repository \
             (or set the directory's variable: PORTCULLIS_SPECS_DIR, PORTCULLIS_SPECS_092_DIR)",
            path.display()
        )
    });
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut current, line.trim()) {
            (None, "```json") => current = Some((n + 1, String::new())),
            (Some((start, body)), "```") => {
                let value = serde_json::from_str(body)
                    .unwrap_or_else(|e| panic!("{file}:{start}: not JSON: {e}"));
                blocks.push((*start, value));
                current = None;
            }
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

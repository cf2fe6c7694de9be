//! `file.edit`: exact-text replacements in a UTF-8 file, as one request —
//! the file read, every edit applied in memory, the result written
//! atomically (or nothing written when any edit does not apply).

use serde::Deserialize;

/// Edits one request may make.
pub const MAX_EDITS: usize = 64;
/// Bytes a file may have to be edited (it is held in memory twice).
pub const MAX_FILE: u64 = 8 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub old_text: String,
    pub new_text: String,
    /// Replace every occurrence; without it `old_text` must occur once.
    #[serde(default)]
    pub replace_all: bool,
}

/// `text` with `edits` applied in order, and how many replacements were
/// made; or why edit `n` (from 1) does not apply.
pub fn apply(text: &str, edits: &[Edit]) -> Result<(String, usize), String> {
    let mut text = text.to_string();
    let mut replaced = 0;
    for (n, edit) in edits.iter().enumerate() {
        let n = n + 1;
        if edit.old_text.is_empty() {
            return Err(format!("edit {n}: old_text is empty"));
        }
        if edit.old_text == edit.new_text {
            return Err(format!("edit {n}: old_text and new_text are the same"));
        }
        let found = text.matches(edit.old_text.as_str()).count();
        match (found, edit.replace_all) {
            (0, _) => {
                return Err(format!(
                    "edit {n}: old_text is not in the file (after the edits before it)"
                ));
            }
            (1, _) | (_, true) => {
                text = text.replace(edit.old_text.as_str(), &edit.new_text);
                replaced += found;
            }
            (many, false) => {
                return Err(format!(
                    "edit {n}: old_text occurs {many} times; give more context to make it unique, or replace_all"
                ));
            }
        }
    }
    Ok((text, replaced))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str, all: bool) -> Edit {
        Edit {
            old_text: old.into(),
            new_text: new.into(),
            replace_all: all,
        }
    }

    #[test]
    fn edits_apply_in_order_and_count_their_replacements() {
        let (text, n) = apply(
            "a = 1\nb = 1\n",
            &[edit("a = 1", "a = 2", false), edit("= 1", "= 3", false)],
        )
        .unwrap();
        assert_eq!((text.as_str(), n), ("a = 2\nb = 3\n", 2));
        let (text, n) = apply("x x x", &[edit("x", "y", true)]).unwrap();
        assert_eq!((text.as_str(), n), ("y y y", 3));
    }

    #[test]
    fn an_edit_that_does_not_apply_says_which_and_why() {
        let missing = apply("abc", &[edit("b", "B", false), edit("zz", "", false)]);
        assert_eq!(
            missing.unwrap_err(),
            "edit 2: old_text is not in the file (after the edits before it)"
        );
        let ambiguous = apply("x x", &[edit("x", "y", false)]).unwrap_err();
        assert!(
            ambiguous.starts_with("edit 1: old_text occurs 2 times"),
            "{ambiguous}"
        );
        assert!(apply("x", &[edit("", "y", false)]).is_err());
        assert!(apply("x", &[edit("x", "x", false)]).is_err());
    }
}

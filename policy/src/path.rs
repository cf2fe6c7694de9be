//! Virtual path normalisation: pure, lexical, and strict. This is the first
//! line of confinement; the files provider then resolves the normalised path
//! with the kernel's help (`openat2` with `RESOLVE_BENEATH`), which also
//! stops symlinks and races that no string check can see.

use thiserror::Error;

/// Longest accepted path, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// Longest accepted path component, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    #[error("path contains a NUL byte")]
    Nul,
    #[error("path is {len} bytes; at most {MAX_PATH_LEN} are allowed")]
    TooLong { len: usize },
    #[error("a path component is {len} bytes; at most {MAX_COMPONENT_LEN} are allowed")]
    ComponentTooLong { len: usize },
    #[error("path climbs above its root with `..`")]
    EscapesRoot,
    #[error("absolute path `{0}` is not under the root's virtual path")]
    OutsideRoot(String),
}

/// A path relative to a root, normalised: no empty, `.` or `..` components,
/// no leading or trailing `/`. The empty path is the root itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelativePath(String);

impl RelativePath {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|c| !c.is_empty())
    }
}

impl std::fmt::Display for RelativePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Normalises `path` as seen by a client of the root mounted at
/// `virtual_root` (for example `/workspace/main`).
///
/// A relative path is taken relative to the root. An absolute path is
/// accepted only when it lies under `virtual_root`, and is made relative to
/// it. `.` and empty components are dropped; `..` removes the previous
/// component and is an error if there is none.
pub fn normalize(virtual_root: &str, path: &str) -> Result<RelativePath, PathError> {
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong { len: path.len() });
    }
    let relative = match path.strip_prefix('/') {
        None => path,
        Some(_) => strip_virtual_root(virtual_root, path)
            .ok_or_else(|| PathError::OutsideRoot(shorten(path)))?,
    };
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or(PathError::EscapesRoot)?;
            }
            name if name.len() > MAX_COMPONENT_LEN => {
                return Err(PathError::ComponentTooLong { len: name.len() });
            }
            name => parts.push(name),
        }
    }
    Ok(RelativePath(parts.join("/")))
}

/// `/workspace/main/src` under `/workspace/main` is `src`; `/workspace/mainx`
/// is not under it.
fn strip_virtual_root<'a>(virtual_root: &str, path: &'a str) -> Option<&'a str> {
    let root = virtual_root.trim_end_matches('/');
    let rest = path.strip_prefix(root)?;
    if rest.is_empty() || rest.starts_with('/') {
        Some(rest)
    } else {
        None
    }
}

/// Quoting a peer's path in an error: cut long ones short.
fn shorten(path: &str) -> String {
    path.chars().take(120).collect()
}

/// Why a root's `virtual_path` in the policy file was refused; the message
/// completes "virtual_path …".
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum VirtualRootError {
    #[error("must be absolute (start with `/`)")]
    Relative,
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("must not be `/` itself")]
    Slash,
    #[error("is not normalised; write `{0}`")]
    NotNormal(String),
}

/// Checks a virtual root path from the policy file: absolute, normalised,
/// not `/` itself.
pub(crate) fn check_virtual_root(path: &str) -> Result<(), VirtualRootError> {
    if !path.starts_with('/') {
        return Err(VirtualRootError::Relative);
    }
    let normal = normalize("/", path)?;
    if normal.is_root() {
        return Err(VirtualRootError::Slash);
    }
    if format!("/{normal}") != path {
        return Err(VirtualRootError::NotNormal(format!("/{normal}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ROOT: &str = "/workspace/main";

    fn ok(path: &str) -> String {
        normalize(ROOT, path).unwrap().as_str().to_string()
    }

    #[test]
    fn table() {
        assert_eq!(ok(""), "");
        assert_eq!(ok("."), "");
        assert_eq!(ok("a/b/../c"), "a/c");
        assert_eq!(ok("./a//b/"), "a/b");
        assert_eq!(ok("a/.."), "");
        assert_eq!(ok("/workspace/main"), "");
        assert_eq!(ok("/workspace/main/src/lib.rs"), "src/lib.rs");
        assert_eq!(
            ok("a\\..\\b"),
            "a\\..\\b",
            "backslash is an ordinary byte on POSIX"
        );
        assert_eq!(normalize(ROOT, ".."), Err(PathError::EscapesRoot));
        assert_eq!(normalize(ROOT, "a/../../b"), Err(PathError::EscapesRoot));
        assert_eq!(
            normalize(ROOT, "/workspace/main/../other"),
            Err(PathError::EscapesRoot)
        );
        assert_eq!(
            normalize(ROOT, "/etc/passwd"),
            Err(PathError::OutsideRoot("/etc/passwd".into()))
        );
        assert_eq!(
            normalize(ROOT, "/workspace/mainx/a"),
            Err(PathError::OutsideRoot("/workspace/mainx/a".into()))
        );
        assert_eq!(normalize(ROOT, "a\0b"), Err(PathError::Nul));
        assert_eq!(
            normalize(ROOT, &"a/".repeat(2049)),
            Err(PathError::TooLong { len: 4098 })
        );
        assert_eq!(
            normalize(ROOT, &"x".repeat(256)),
            Err(PathError::ComponentTooLong { len: 256 })
        );
    }

    #[test]
    fn virtual_roots_are_checked() {
        assert!(check_virtual_root("/workspace/main").is_ok());
        assert!(check_virtual_root("workspace").is_err());
        assert!(check_virtual_root("/").is_err());
        assert!(check_virtual_root("/a/../b").is_err());
        assert!(check_virtual_root("/a/").is_err());
    }

    proptest! {
        /// Whatever the input, a normalised path never climbs out: joined
        /// onto a host root it stays below that root, lexically.
        #[test]
        fn never_escapes(parts in prop::collection::vec(
            prop_oneof![
                Just("..".to_string()), Just(".".to_string()), Just(String::new()), Just("/".to_string()),
                "[a-z]{1,3}", Just("/workspace/main".to_string())
            ], 0..12)) {
            let path = parts.concat();
            if let Ok(normal) = normalize(ROOT, &path) {
                prop_assert!(!normal.as_str().starts_with('/'));
                prop_assert!(normal.components().all(|c| c != ".." && c != "."));
                let host = std::path::Path::new("/srv/root").join(normal.as_str());
                prop_assert!(host.starts_with("/srv/root"));
                prop_assert!(host.components().all(|c| c != std::path::Component::ParentDir));
            }
        }

        #[test]
        fn is_idempotent(path in "[a-z./]{0,40}") {
            if let Ok(normal) = normalize(ROOT, &path) {
                prop_assert_eq!(normalize(ROOT, normal.as_str()).unwrap(), normal);
            }
        }
    }
}

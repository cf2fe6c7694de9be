//! The client's own files, in `$XDG_CONFIG_HOME/portcullis/` (or
//! `~/.config/portcullis/`):
//!
//! - `identity.key`: this user's static key, created (mode 0600) on first
//!   use; `portcullis keys show` prints the public key to put in a policy.
//! - `gateways.toml`: the pinned key of every gateway connected to with
//!   `--gateway-key`, so later connections need only the URL:
//!
//!   ```toml
//!   [gateway."ws://127.0.0.1:7443"]
//!   key = "<base64>"
//!   ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use portcullis_crypto::{PublicKey, StaticKeypair};
use serde::{Deserialize, Serialize};

use portcullis_wire::keyfile;

/// The directory, or `None` when neither `XDG_CONFIG_HOME` nor `HOME` is set.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(base) => Some(PathBuf::from(base).join("portcullis")),
        None => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config/portcullis")),
    }
}

/// This user's identity key, created on first use.
pub fn identity(dir: &Path) -> Result<StaticKeypair, String> {
    let path = dir.join("identity.key");
    if path.exists() {
        return keyfile::load(&path).map_err(|e| e.to_string());
    }
    create_private_dir(dir)?;
    let pair = keyfile::generate(&path, false).map_err(|e| e.to_string())?;
    eprintln!(
        "created your identity key {} (public key {}); add it to a gateway's policy to be let in",
        path.display(),
        pair.public().to_base64()
    );
    Ok(pair)
}

#[derive(Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Gateways {
    #[serde(default)]
    gateway: BTreeMap<String, Remembered>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Remembered {
    key: String,
}

fn read(dir: &Path) -> Result<Gateways, String> {
    let path = dir.join("gateways.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.message()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Gateways::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The remembered key of the gateway at `url`.
pub fn remembered_key(dir: &Path, url: &str) -> Result<Option<PublicKey>, String> {
    let gateways = read(dir)?;
    gateways
        .gateway
        .get(url)
        .map(|g| PublicKey::from_base64(&g.key).map_err(|e| format!("gateways.toml, `{url}`: {e}")))
        .transpose()
}

/// Remembers `key` for `url` (replacing what was there); writes nothing
/// when that key is remembered already.
pub fn remember(dir: &Path, url: &str, key: &PublicKey) -> Result<(), String> {
    let mut gateways = read(dir)?;
    let key = key.to_base64();
    if gateways
        .gateway
        .get(url)
        .is_some_and(|known| known.key == key)
    {
        return Ok(());
    }
    gateways.gateway.insert(url.to_string(), Remembered { key });
    create_private_dir(dir)?;
    let text = toml::to_string(&gateways).map_err(|e| e.to_string())?;
    let path = dir.join("gateways.toml");
    let tmp = dir.join("gateways.toml.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn create_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn a_key_is_remembered_once_and_replaced_when_it_changes() {
        let dir_dir = tempfile::Builder::new()
            .prefix("portcullis-gateways-")
            .tempdir()
            .unwrap();
        let dir = dir_dir.path().to_path_buf();
        let _ = std::fs::remove_dir_all(&dir);
        let url = "ws://127.0.0.1:7443";
        let (first, second) = (
            PublicKey::from_bytes([1; 32]),
            PublicKey::from_bytes([2; 32]),
        );
        let inode = || std::fs::metadata(dir.join("gateways.toml")).unwrap().ino();
        remember(&dir, url, &first).unwrap();
        let written = inode();
        // The same key again: the file is not rewritten (a rewrite renames
        // a new file into place, with a new inode).
        remember(&dir, url, &first).unwrap();
        assert_eq!(inode(), written);
        assert_eq!(remembered_key(&dir, url).unwrap(), Some(first));
        remember(&dir, url, &second).unwrap();
        assert_ne!(inode(), written);
        assert_eq!(remembered_key(&dir, url).unwrap(), Some(second));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

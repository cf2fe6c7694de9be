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

use portcullis_wire::keyfile::{self, KeyFileError};

/// What went wrong with the client's own files.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{}: the key remembered for `{url}`: {source}", path.display())]
    BadKey {
        path: PathBuf,
        url: String,
        #[source]
        source: portcullis_crypto::KeyError,
    },
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
}

/// The directory, or `None` when neither `XDG_CONFIG_HOME` nor `HOME` is set.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(base) => Some(PathBuf::from(base).join("portcullis")),
        None => std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config/portcullis")),
    }
}

/// This user's identity key, created on first use.
pub fn identity(dir: &Path) -> Result<StaticKeypair, ConfigError> {
    let path = dir.join("identity.key");
    if path.exists() {
        return Ok(keyfile::load(&path)?);
    }
    create_private_dir(dir)?;
    let pair = keyfile::generate(&path, false)?;
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

fn read(dir: &Path) -> Result<Gateways, ConfigError> {
    let path = dir.join("gateways.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => toml::from_str(&text).map_err(|e| ConfigError::Syntax {
            message: e.message().to_string(),
            path,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Gateways::default()),
        Err(source) => Err(ConfigError::Io { path, source }),
    }
}

/// The remembered key of the gateway at `url`.
pub fn remembered_key(dir: &Path, url: &str) -> Result<Option<PublicKey>, ConfigError> {
    let gateways = read(dir)?;
    let bad_key = |source| ConfigError::BadKey {
        path: dir.join("gateways.toml"),
        url: url.to_string(),
        source,
    };
    gateways
        .gateway
        .get(url)
        .map(|g| PublicKey::from_base64(&g.key).map_err(bad_key))
        .transpose()
}

/// Remembers `key` for `url` (replacing what was there); writes nothing
/// when that key is remembered already.
pub fn remember(dir: &Path, url: &str, key: &PublicKey) -> Result<(), ConfigError> {
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
    let path = dir.join("gateways.toml");
    let text = toml::to_string(&gateways).map_err(|e| ConfigError::Syntax {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let tmp = dir.join("gateways.toml.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| ConfigError::Io { path, source })
}

fn create_private_dir(dir: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| ConfigError::Io {
            path: dir.to_path_buf(),
            source,
        })
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

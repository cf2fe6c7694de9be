//! Reading and writing static key files on disk. The text format is
//! `portcullis_crypto`'s; this module adds the file rules: created with mode
//! 0600 and never over an existing file unless asked, refused when group or
//! others may read it (as OpenSSH refuses such private keys).

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use portcullis_crypto::{KeyError, StaticKeypair};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum KeyFileError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write key file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key file {path} already exists; pass --force to replace it")]
    Exists { path: PathBuf },
    #[error(
        "key file {path} has mode {mode:04o}, readable by group or others; \
         run `chmod 600 {path}`"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("key file {path}: {source}")]
    Format { path: PathBuf, source: KeyError },
    #[error("cannot generate a key: {0}")]
    Generate(portcullis_crypto::Error),
}

/// Loads a private key file, checking its permissions first.
pub fn load(path: &Path) -> Result<StaticKeypair, KeyFileError> {
    let read_error = |source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    };
    let mode = fs::metadata(path).map_err(read_error)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    let text = zeroize::Zeroizing::new(fs::read_to_string(path).map_err(read_error)?);
    StaticKeypair::from_key_file(&text).map_err(|source| KeyFileError::Format {
        path: path.to_owned(),
        source,
    })
}

/// Generates a key pair and writes it to `path` with mode 0600.
pub fn generate(path: &Path, overwrite: bool) -> Result<StaticKeypair, KeyFileError> {
    let pair = StaticKeypair::generate().map_err(KeyFileError::Generate)?;
    write(path, &pair, overwrite)?;
    Ok(pair)
}

/// Writes `pair` to `path` (mode 0600, synced). Without `overwrite` an
/// existing file is an error; with it the file is replaced atomically.
pub fn write(path: &Path, pair: &StaticKeypair, overwrite: bool) -> Result<(), KeyFileError> {
    let write_error = |source| KeyFileError::Write {
        path: path.to_owned(),
        source,
    };
    if !overwrite && path.symlink_metadata().is_ok() {
        return Err(KeyFileError::Exists {
            path: path.to_owned(),
        });
    }
    // Write a sibling temporary file, then rename: a crash leaves either the
    // old key or the new one, never half a key.
    let tmp = path.with_extension("tmp-new");
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(write_error)?;
    let result = file
        .write_all(pair.to_key_file().as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(write_error(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "portcullis-keyfile-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn generate_writes_0600_and_load_reads_it_back() {
        let dir = temp_dir();
        let path = dir.join("gateway.key");
        let pair = generate(&path, false).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load(&path).unwrap().public(), pair.public());
        assert!(matches!(
            generate(&path, false),
            Err(KeyFileError::Exists { .. })
        ));
        let replaced = generate(&path, true).unwrap();
        assert_ne!(replaced.public(), pair.public());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn load_refuses_a_group_readable_key() {
        let dir = temp_dir();
        let path = dir.join("open.key");
        generate(&path, false).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = load(&path).unwrap_err();
        assert!(
            matches!(err, KeyFileError::TooOpen { mode: 0o640, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"));
        fs::remove_dir_all(dir).unwrap();
    }
}

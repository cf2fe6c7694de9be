//! The client's TLS connector (rustls with the ring provider): it trusts
//! exactly the CA certificates it is given. The Noise channel inside is
//! what authenticates the gateway; TLS is for deployments that require
//! HTTPS on the wire.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Why a TLS connector could not be made from a CA file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS CA file {}: {message}", path.display())]
    CaFile { path: PathBuf, message: String },
    #[error("TLS: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS connector that trusts exactly the CA certificates in `ca` (PEM).
pub fn connector(ca: &Path) -> Result<tokio_rustls::TlsConnector, TlsError> {
    let bad = |message: String| TlsError::CaFile {
        path: ca.to_path_buf(),
        message,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

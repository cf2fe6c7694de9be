//! The client's TLS connector (rustls with the ring provider): it trusts
//! exactly the CA certificates it is given. The Noise channel inside is
//! what authenticates the gateway; TLS is for deployments that require
//! HTTPS on the wire.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS connector that trusts exactly the CA certificates in `ca` (PEM).
pub fn connector(ca: &Path) -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)
        .map_err(|e| format!("TLS CA file {}: {e}", ca.display()))?
    {
        let cert = cert.map_err(|e| format!("TLS CA file {}: {e}", ca.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("TLS CA file {}: {e}", ca.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "TLS CA file {}: no certificate in the file",
            ca.display()
        ));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

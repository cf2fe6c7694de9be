//! Optional TLS (rustls with the ring provider) under the WebSocket: the
//! gateway's acceptor (the client's connector is `portcullis_client::tls`). The
//! Noise channel inside is what authenticates the gateway and protects the
//! protocol; TLS is for deployments that require HTTPS on the wire.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why the configured certificate and key cannot serve TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS certificate {}: {message}", path.display())]
    Certificate { path: PathBuf, message: String },
    #[error("TLS key {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
    #[error("TLS certificate and key: {0}")]
    Config(#[from] rustls::Error),
}

/// A TLS acceptor from a PEM certificate chain and a PEM private key.
pub fn acceptor(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let bad_cert = |message: String| TlsError::Certificate {
        path: cert.to_path_buf(),
        message,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|iter| iter.collect())
        .map_err(|e| bad_cert(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad_cert("no certificate in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Where a server's certificate is checked from when no CA file is given:
/// Debian's bundle (package `ca-certificates`).
pub const DEBIAN_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A TLS connector for the gateway's own outgoing connections (artifact
/// uploads, relay endpoints it dials): servers are checked against the CA
/// certificates in `ca_file` (PEM), or Debian's bundle.
pub fn client_connector(ca_file: Option<&Path>) -> Result<tokio_rustls::TlsConnector, String> {
    let path = ca_file.unwrap_or(Path::new(DEBIAN_CA_BUNDLE));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("{}: no CA certificate", path.display()));
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A TLS connector that accepts exactly one server certificate: the one
/// whose DER encoding has SHA-256 `pin` (a relay endpoint's
/// `cert_sha256`). The handshake's signatures are still checked with that
/// certificate's key; names, chains and expiry are not (the pin is the
/// trust).
pub fn pinned_connector(pin: [u8; 32]) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = provider();
    let verifier = Arc::new(PinnedCertificate {
        sha256: pin,
        provider: provider.clone(),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[derive(Debug)]
struct PinnedCertificate {
    sha256: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let digest = ring::digest::digest(&ring::digest::SHA256, end_entity.as_ref());
        match digest.as_ref() == self.sha256 {
            true => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            false => Err(rustls::Error::General(format!(
                "the server's certificate (SHA-256 {}) is not the pinned one",
                hex::encode(digest.as_ref())
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

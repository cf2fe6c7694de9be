//! TLS under the WebSocket: the real binary with `[tls]`, a client over
//! `wss://` that trusts exactly the test CA, and the refusals around it.

mod common;

use common::{Gateway, key_b64};
use portcullis_client::{Client, ClientError, ClientOptions};
use portcullis_crypto::StaticKeypair;
use serde_json::json;

/// A self-signed certificate for localhost, written as PEM files.
fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

#[tokio::test]
async fn wss_with_the_right_ca_works_and_everything_else_is_refused() {
    let alice = StaticKeypair::generate().unwrap();
    let certs_dir = tempfile::Builder::new()
        .prefix("portcullis-tls-")
        .tempdir()
        .unwrap();
    let certs = certs_dir.path().to_path_buf();
    let (cert, key) = certificate(&certs);
    let policy = format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n[[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nresources = {{}}\n",
        key_b64(&alice)
    );
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let gw = Gateway::start(&policy, &tls);
    let wss = format!("wss://localhost:{}", gw.addr.port());

    let mut options = ClientOptions::new(&wss, gw.key, alice.clone());
    options.tls_ca = Some(cert.clone());
    let client = Client::connect(options)
        .await
        .expect("wss with the right CA");
    client.accept_all().await.unwrap();
    assert_eq!(
        client.request("resource.list", json!({})).await.unwrap(),
        json!({"resources": []})
    );

    // No CA given: refused before connecting.
    let err = Client::connect(ClientOptions::new(&wss, gw.key, alice.clone()))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ClientError::Tls(_)), "{err}");

    // Another CA: the TLS handshake fails.
    let (other_ca, _) = certificate(&certs.join("other"));
    let mut options = ClientOptions::new(&wss, gw.key, alice.clone());
    options.tls_ca = Some(other_ca);
    let err = Client::connect(options).await.err().unwrap();
    assert!(
        matches!(&err, ClientError::Tls(m) if m.contains("certificate")),
        "{err}"
    );

    // Plain WebSocket to the TLS port: no upgrade.
    let err = Client::connect(ClientOptions::new(&gw.url, gw.key, alice))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, ClientError::Upgrade(_) | ClientError::Timeout),
        "{err}"
    );
    gw.assert_requests_audited(1);
    let _ = std::fs::remove_dir_all(certs);
}

//! `portcullis keys generate|show`.

use std::path::Path;
use std::process::ExitCode;

use portcullis_crypto::PublicKey;

use crate::cli::fail;
use portcullis_wire::keyfile;

pub fn generate(file: &Path, force: bool, json: bool) -> ExitCode {
    match keyfile::generate(file, force) {
        Ok(pair) => print_public(pair.public(), json),
        Err(e) => fail(e),
    }
}

pub fn show(file: &Path, json: bool) -> ExitCode {
    match keyfile::load(file) {
        Ok(pair) => print_public(pair.public(), json),
        Err(e) => fail(e),
    }
}

fn print_public(key: &PublicKey, json: bool) -> ExitCode {
    if json {
        println!(
            "{}",
            serde_json::json!({"public_key": key.to_base64(), "fingerprint": key.fingerprint()})
        );
    } else {
        println!("public key:  {}", key.to_base64());
        println!("fingerprint: {}", key.fingerprint());
    }
    ExitCode::SUCCESS
}

/// `portcullis token new`: a fresh bearer token, printed once, and the
/// `token_hash` line for the principal in the policy (only the hash is
/// ever stored).
pub fn new_token(json: bool) -> ExitCode {
    use base64::Engine as _;
    use sha2::{Digest, Sha256};
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    if let Err(e) = getrandom::fill(bytes.as_mut()) {
        return fail(format!("no randomness: {e}"));
    }
    let token = zeroize::Zeroizing::new(format!(
        "pct_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes.as_ref())
    ));
    let hash = hex::encode(Sha256::digest(token.as_bytes()));
    if json {
        println!(
            "{}",
            serde_json::json!({"token": token.as_str(), "token_hash": format!("sha256:{hash}")})
        );
    } else {
        println!("token:      {}", token.as_str());
        println!("token_hash = \"sha256:{hash}\"");
        eprintln!(
            "Give the token to the client once (it is not stored anywhere); put the token_hash line in the principal's entry in the policy, then reload."
        );
    }
    ExitCode::SUCCESS
}

//! `portcullis keys generate|show`.

use std::path::Path;
use std::process::ExitCode;

use portcullis_crypto::PublicKey;

use crate::cli::fail;
use portcullis::keyfile;

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

//! The `portcullis` command: the daemon and its operator and client verbs.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use portcullis::keyfile;

#[derive(Parser)]
#[command(
    name = "portcullis",
    version,
    about = "A hardened gateway for AI agents on this host."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create and inspect X25519 static keys (the gateway's and clients').
    #[command(subcommand)]
    Keys(KeysCommand),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Generate a key pair into FILE (mode 0600) and print its public key.
    Generate {
        /// Where to write the private key file.
        file: PathBuf,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
        /// Print the public key and fingerprint as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the public key (base64) and fingerprint of a private key file.
    Show {
        file: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Keys(KeysCommand::Generate { file, force, json }) => {
            keyfile::generate(&file, force).map(|pair| print_public(pair.public(), json))
        }
        Command::Keys(KeysCommand::Show { file, json }) => {
            keyfile::load(&file).map(|pair| print_public(pair.public(), json))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portcullis: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_public(key: &portcullis_crypto::PublicKey, json: bool) {
    if json {
        let value =
            serde_json::json!({"public_key": key.to_base64(), "fingerprint": key.fingerprint()});
        println!("{value}");
    } else {
        println!("public key:  {}", key.to_base64());
        println!("fingerprint: {}", key.fingerprint());
    }
}

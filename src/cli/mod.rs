//! The command-line verbs. `main.rs` parses arguments; each verb lives in a
//! module here and returns an exit code.

pub mod admin;
pub mod audit;
pub mod connect;
pub mod demo;
pub mod doctor;
pub mod files;
pub mod keys;
pub mod mcp;
pub mod policy;
pub mod serve;
pub mod shell;
pub mod stdio;
pub mod tools;

use std::process::ExitCode;

/// Exit status for "the command ran, but the answer is no" (e.g. a denied
/// `policy explain`), distinct from 1 for errors.
pub const EXIT_NO: u8 = 2;

/// The single-threaded runtime a client verb runs its requests on.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

/// Prints an error the way every verb does and returns exit code 1.
pub fn fail(error: impl std::fmt::Display) -> ExitCode {
    eprintln!("portcullis: {error}");
    ExitCode::FAILURE
}

//! The launcher `portcullis` starts commands through: it confines itself
//! (Landlock, no_new_privs, its own session) and execs the program. See
//! `src/shell/sandbox.rs`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    portcullis::shell::sandbox::main(std::env::args_os().skip(1))
}

//! The launcher `portcullis` starts commands through: it confines itself
//! (Landlock, seccomp, no_new_privs, its own session) and execs the
//! program. See the library's documentation.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    portcullis_sandbox::main(std::env::args_os().skip(1))
}

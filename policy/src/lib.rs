//! `portcullis-policy`: the operator's policy file and the decisions it
//! makes.
//!
//! - [`parse`] / [`load_file`] turn TOML into a validated [`Policy`], or into
//!   [`PolicyErrors`] that name file, line and column.
//! - [`decide()`] is pure: policy, principal, query and time in; a
//!   [`Decision`] with the rule that made it out.
//! - [`path::normalize`] is the lexical half of path confinement.
//!
//! The schema is documented in `docs/POLICY.md`.

#![forbid(unsafe_code)]

mod decide;
pub mod egress;
mod load;
mod model;
pub mod path;
mod schema;
pub mod units;

use std::ops::Range;

pub use decide::{
    Capability, Decision, Denial, FileTerms, ProgramLookup, Query, ShellTerms, Summary, Target,
    Terms, Verdict, active_grants, artifact_destination, capability_of, decide, principal_by_key,
    principal_by_token, principal_by_uid, principal_status, summary, tool_descriptors,
};
pub use load::{load_file, parse, valid_id};
pub use model::*;

/// The default policy shipped with portcullis: valid, commented, and
/// granting nothing until an operator enables a principal.
pub const DEFAULT_POLICY: &str = include_str!("../default-policy.toml");

/// One problem in a policy file, at a position.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyError {
    pub file: String,
    /// 1-based; 0 when the problem has no position (an unreadable file).
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl PolicyError {
    fn at(file: &str, text: &str, span: Range<usize>, message: String) -> Self {
        let (line, column) = load::line_column(text, span.start);
        Self {
            file: file.to_string(),
            line,
            column,
            message,
        }
    }
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

/// Every problem found in a policy file (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl std::fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

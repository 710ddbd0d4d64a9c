//! Errors of the CRUSH crate. Parse errors name the line; map errors name the bucket, rule or
//! item, so that an operator can fix the map instead of guessing.

/// Anything wrong with a CRUSH map or a request to map with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CrushError {
    /// The text map could not be parsed.
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },

    /// The map parsed but is not a valid CRUSH map (dangling reference, cycle, duplicate id…).
    #[error("invalid CRUSH map: {0}")]
    Invalid(String),

    /// The map uses a CRUSH feature that Kelp does not implement (it is refused rather than
    /// mapped differently from Ceph).
    #[error("unsupported CRUSH feature: {0}")]
    Unsupported(String),

    /// A tunable name that CRUSH does not have (the text map's `tunable` lines and
    /// [`crate::Tunables::set`]).
    #[error("unknown tunable '{name}'")]
    UnknownTunable { name: String },

    /// A mapping request named a rule that is not in the map.
    #[error("rule {rule} does not exist (rules in this map: {known})")]
    NoSuchRule { rule: u32, known: String },

    /// A mapping request asked for an impossible number of replicas.
    #[error("num_rep {num_rep} is out of range: must be between 1 and {max}")]
    BadNumRep { num_rep: usize, max: usize },
}

pub type Result<T, E = CrushError> = std::result::Result<T, E>;

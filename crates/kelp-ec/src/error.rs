//! Errors of the erasure-code crate.

/// What can go wrong with a profile or a coding call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcError {
    /// A profile key is unknown, or its value is malformed or out of range.
    #[error("erasure-code profile: {0}")]
    InvalidProfile(String),
    /// Fewer than `k` shards were readable: the data cannot be rebuilt.
    #[error("only {have} of the {need} shards needed are readable")]
    NotEnoughShards { have: usize, need: usize },
    /// Shard buffers handed to the codec differ in length or are not whole `ALIGN` blocks
    /// (a caller's bug, not a data problem).
    #[error("shard buffers must be equal, non-empty multiples of {align} bytes: {detail}")]
    BadShardSize { align: usize, detail: String },
    /// The Reed-Solomon library refused the call.
    #[error("reed-solomon: {0}")]
    Codec(String),
}

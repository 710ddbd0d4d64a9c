//! `[version byte][postcard body]` encoding for every message's metadata.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The current (and only) message format version.
pub const PROTO_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("empty message metadata")]
    Empty,
    #[error("message format version {got} is not supported (this build speaks {PROTO_VERSION})")]
    Version { got: u8 },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
}

pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(PROTO_VERSION);
    // postcard only fails on I/O errors of its writer, which a Vec does not have.
    out.extend(postcard::to_stdvec(msg).expect("encoding into a Vec cannot fail"));
    out
}

pub fn decode<T: DeserializeOwned>(meta: &[u8], what: &'static str) -> Result<T, ProtoError> {
    let (&v, body) = meta.split_first().ok_or(ProtoError::Empty)?;
    if v != PROTO_VERSION {
        return Err(ProtoError::Version { got: v });
    }
    postcard::from_bytes(body).map_err(|e| ProtoError::Malformed {
        what,
        reason: e.to_string(),
    })
}

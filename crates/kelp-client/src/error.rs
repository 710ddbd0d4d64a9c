//! Errors of the client library: what failed and why, with the object or pool named.

use std::time::Duration;

use kelp_proto::ErrorCode;
use kelp_types::PgId;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("object '{object}' does not exist")]
    NotFound { object: String },
    #[error("object '{object}' already exists")]
    Exists { object: String },
    /// A guard (version, xattr comparison) did not hold.
    #[error("condition failed on '{object}': {message}")]
    Canceled { object: String, message: String },
    #[error("'{object}' has no attribute '{name}'")]
    NoData { object: String, name: String },
    #[error("pool '{0}' does not exist")]
    NoSuchPool(String),
    #[error("too large: {0}")]
    TooBig(String),
    #[error("the cluster is full: {0}")]
    Full(String),
    #[error("stored data failed its checksum: {0}")]
    Corrupt(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The pool cannot do this (omap on an erasure-coded pool).
    #[error("not supported: {0}")]
    NotSupported(String),
    #[error("I/O error on the OSD: {0}")]
    Io(String),
    /// This client instance is on the OSD map's blocklist (fenced): every op is refused
    /// (ESHUTDOWN; Ceph's EBLOCKLISTED). Connect again to get a new instance.
    #[error("blocklisted: {0}")]
    Blocklisted(String),
    /// A watch was lost: the OSD dropped it (not pinged within `osd_client_watch_timeout`) or
    /// it could not be registered again after a failover (ENOTCONN). Watch again.
    #[error("watch on '{object}' lost: {reason}")]
    WatchLost { object: String, reason: String },
    /// The operation did not complete within the op timeout; `last` says what went wrong
    /// on the last attempt.
    #[error("{what} timed out after {after:?} (last problem: {last})")]
    Timeout {
        what: String,
        after: Duration,
        last: String,
    },
    #[error(transparent)]
    Mon(#[from] kelp_monc::MonClientError),
    #[error(transparent)]
    Msgr(#[from] kelp_msgr::MsgrError),
    #[error(transparent)]
    Proto(#[from] kelp_proto::ProtoError),
    #[error("configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// Maps an OSD error code for `object` to a client error.
    pub(crate) fn from_code(code: ErrorCode, object: &str, message: String) -> ClientError {
        let object = object.to_string();
        match code {
            ErrorCode::NotFound => ClientError::NotFound { object },
            ErrorCode::Exists => ClientError::Exists { object },
            ErrorCode::Canceled => ClientError::Canceled { object, message },
            ErrorCode::NoData => ClientError::NoData {
                object,
                name: message,
            },
            ErrorCode::NoSuchPool => ClientError::NoSuchPool(message),
            ErrorCode::TooBig => ClientError::TooBig(message),
            ErrorCode::Full => ClientError::Full(message),
            ErrorCode::Corrupt => ClientError::Corrupt(message),
            ErrorCode::Invalid => ClientError::Invalid(message),
            ErrorCode::NotSupported => ClientError::NotSupported(message),
            ErrorCode::Blocklisted => ClientError::Blocklisted(message),
            ErrorCode::Io | ErrorCode::Misdirected | ErrorCode::Inactive => {
                ClientError::Io(message)
            }
        }
    }
}

/// Why an op cannot be sent to its PG's primary at one map epoch. Always retryable: the op
/// waits for a newer map (or a short pause) and tries again until its timeout, which then
/// reports this as the last problem.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoPrimary {
    #[error(transparent)]
    Mapping(#[from] kelp_maps::MapError),
    #[error("PG {pg} has no OSD up at epoch {epoch}")]
    NoneUp { pg: PgId, epoch: u32 },
    #[error("osd.{osd} has no address")]
    NoAddress { osd: i32 },
}

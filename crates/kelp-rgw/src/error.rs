//! Errors of the gateway's storage layer, each naming what it is about. The S3 front end maps
//! them to S3 error codes (`s3.rs`); the admin commands print them as they are.

use kelp_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum RgwError {
    #[error("no such user '{0}'")]
    NoSuchUser(String),
    #[error("user '{0}' already exists")]
    UserExists(String),
    #[error("access key '{0}' does not exist")]
    NoSuchAccessKey(String),
    #[error("no such bucket '{0}'")]
    NoSuchBucket(String),
    #[error("bucket '{0}' already exists (owned by someone else)")]
    BucketExists(String),
    #[error("bucket '{0}' already exists and is yours")]
    BucketOwnedByYou(String),
    #[error("bucket '{0}' is not empty")]
    BucketNotEmpty(String),
    #[error("no such key '{0}'")]
    NoSuchKey(String),
    #[error("no such multipart upload '{0}'")]
    NoSuchUpload(String),
    #[error("invalid part: {0}")]
    InvalidPart(String),
    #[error("parts are not in ascending order")]
    InvalidPartOrder,
    #[error("part {part} is {size} bytes; every part but the last must be at least 5 MiB")]
    EntityTooSmall { part: i32, size: u64 },
    #[error("too large: {0}")]
    EntityTooLarge(String),
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("invalid bucket name '{name}': {why}")]
    InvalidBucketName { name: String, why: &'static str },
    #[error("user '{0}' may not do this")]
    AccessDenied(String),
    #[error("too many concurrent changes to '{0}'; try again")]
    Busy(String),
    #[error("stored record '{object}' is damaged: {message}")]
    Corrupt { object: String, message: String },
    #[error("the request body could not be read: {0}")]
    Body(String),
    /// One of the gateway's pools exists but is of the wrong kind for what it holds (an
    /// erasure-coded index, or a data pool of another kind than asked).
    #[error("the {role} pool '{pool}' is {have}; {need}")]
    PoolKind {
        role: &'static str,
        pool: String,
        have: String,
        need: String,
    },
    /// A fault of the gateway itself (not of the request or the cluster).
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Rados(#[from] ClientError),
}

pub type Result<T, E = RgwError> = std::result::Result<T, E>;

/// Treats a RADOS "not found" as `None`.
pub(crate) fn found<T>(r: std::result::Result<T, ClientError>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ClientError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

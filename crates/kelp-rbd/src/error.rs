//! Errors of the image library; the CLI prints them, the NBD server maps them to NBD errors.

use kelp_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum RbdError {
    #[error("image '{0}' does not exist")]
    NoSuchImage(String),
    #[error("image '{0}' already exists")]
    ImageExists(String),
    #[error("snapshot '{0}' does not exist")]
    NoSuchSnap(String),
    #[error("snapshot '{0}' already exists")]
    SnapExists(String),
    #[error("invalid: {0}")]
    Invalid(String),
    /// The image (or snapshot) is in a state that forbids this: it has snapshots, a protected
    /// snapshot has clones, a snapshot view is read-only…
    #[error("{0}")]
    Busy(String),
    #[error("read-only: {0}")]
    ReadOnly(String),
    #[error("the I/O range {offset}+{len} is beyond the image's end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("the image's metadata is damaged: {0}")]
    Corrupt(String),
    /// Another client changed the image header at the same time, too often to retry.
    #[error("the image header kept changing under this update: {0}")]
    Conflict(String),
    /// This client lost the image's exclusive lock and was fenced off (blocklisted).
    #[error("this client lost the image's exclusive lock: {0}")]
    LockLost(String),
    #[error(transparent)]
    Rados(#[from] ClientError),
}

impl RbdError {
    /// The errno a block client should see for this error (the NBD server's edge).
    pub fn errno(&self) -> i32 {
        const EIO: i32 = 5;
        const ENOENT: i32 = 2;
        const EEXIST: i32 = 17;
        const EINVAL: i32 = 22;
        const EBUSY: i32 = 16;
        const EROFS: i32 = 30;
        const ENOSPC: i32 = 28;
        const EOPNOTSUPP: i32 = 95;
        const ESHUTDOWN: i32 = 108;
        match self {
            RbdError::NoSuchImage(_) | RbdError::NoSuchSnap(_) => ENOENT,
            RbdError::ImageExists(_) | RbdError::SnapExists(_) => EEXIST,
            RbdError::Invalid(_) | RbdError::OutOfRange { .. } => EINVAL,
            RbdError::Busy(_) | RbdError::Conflict(_) => EBUSY,
            RbdError::ReadOnly(_) => EROFS,
            RbdError::Unsupported(_) => EOPNOTSUPP,
            RbdError::LockLost(_) => ESHUTDOWN,
            RbdError::Corrupt(_) => EIO,
            RbdError::Rados(ClientError::Full(_)) => ENOSPC,
            RbdError::Rados(ClientError::Blocklisted(_)) => ESHUTDOWN,
            RbdError::Rados(_) => EIO,
        }
    }
}

//! Errors of the file-system library, typed; mapped to errno only at the FUSE edge.

use crate::types::errno;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Rados(#[from] kelp_client::ClientError),
    #[error(transparent)]
    Msgr(#[from] kelp_msgr::MsgrError),
    /// A stored record or a message could not be decoded.
    #[error("malformed {what}: {detail}")]
    Malformed { what: String, detail: String },
    /// The MDS answered with an errno.
    #[error("errno {0}")]
    Errno(i32),
    /// This MDS has been fenced (blocklisted) and must stop.
    #[error("this MDS is fenced: {0}")]
    Fenced(String),
    #[error("the metadata server speaks protocol {theirs}, this client {ours}")]
    Version { ours: u16, theirs: u16 },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(String),
}

impl FsError {
    /// The errno a FUSE reply carries for this error (EIO for anything not more precise).
    pub fn errno(&self) -> i32 {
        use kelp_client::ClientError as C;
        match self {
            FsError::Errno(e) => *e,
            FsError::Rados(C::Full(_)) => errno::ENOSPC,
            FsError::Rados(C::NotFound { .. }) => errno::ENOENT,
            FsError::Rados(C::Blocklisted(_)) => errno::ESHUTDOWN,
            FsError::Rados(C::TooBig(_)) => libc::EFBIG,
            _ => errno::EIO,
        }
    }
}

pub type Result<T, E = FsError> = std::result::Result<T, E>;

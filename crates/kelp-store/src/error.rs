//! The store's error type.
//!
//! One enum for the whole crate, with structured variants so that callers (the OSD) can react
//! to the kind of failure: a [`StoreError::ChecksumMismatch`] means "this replica's copy is bad,
//! repair it from a healthy one", [`StoreError::NoSpace`] is retryable after deletes, while
//! [`StoreError::Failed`] means the store hit an I/O error during a commit and refuses all further
//! writes (after a failed fsync the kernel may have dropped dirty pages, so continuing would risk
//! silently acknowledging lost data).

use std::path::PathBuf;

use crate::types::{CollectionId, ObjectId};

/// Everything that can go wrong in an object store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("collection {coll} does not exist")]
    CollectionNotFound { coll: CollectionId },
    #[error("collection {coll} already exists")]
    CollectionExists { coll: CollectionId },
    #[error("collection {coll} is not empty")]
    CollectionNotEmpty { coll: CollectionId },
    #[error("object {object} does not exist in collection {coll}")]
    ObjectNotFound {
        coll: CollectionId,
        object: ObjectId,
    },
    /// Stored data does not match its checksum. Never returned together with data: the caller
    /// must fetch the object from another replica.
    #[error(
        "checksum mismatch in object {object} at offset {offset}: stored crc32c {expected:#010x}, computed {actual:#010x}"
    )]
    ChecksumMismatch {
        object: String,
        offset: u64,
        expected: u32,
        actual: u32,
    },
    /// The device has no room for the transaction; nothing of it was applied. Retryable after
    /// deletes free space.
    #[error("no space left in the store: transaction needs {needed} bytes, {free} bytes free")]
    NoSpace { needed: u64, free: u64 },
    /// A transaction or argument is malformed (for example zero-sized write at a huge offset,
    /// split into the same collection).
    #[error("invalid argument: {reason}")]
    InvalidArgument { reason: String },
    /// The superblock file is missing, truncated or not a Kelp store.
    #[error("bad superblock {path}: {reason}")]
    BadSuperblock { path: PathBuf, reason: String },
    /// Something on disk was written by a newer (or unknown) format version.
    #[error("unsupported {what} format version {found} (this build reads up to {supported})")]
    UnsupportedVersion {
        what: &'static str,
        found: u32,
        supported: u32,
    },
    /// Metadata could not be decoded: the store is damaged.
    #[error("corrupt metadata: {what}")]
    Corrupt { what: String },
    #[error("store directory {path} is already in use by another process")]
    Locked { path: PathBuf },
    #[error("{path} already contains a store (refusing to mkfs over it)")]
    AlreadyExists { path: PathBuf },
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata database error while {context}: {message}")]
    Kv { context: String, message: String },
    /// The store failed a commit earlier and refuses further work until restarted.
    #[error("store failed and is read-only until restart: {reason}")]
    Failed { reason: String },
    /// Only inside [`crate::nowait::attempt`]: the call needs the device or the metadata
    /// database; run it again where blocking is allowed.
    #[error("the read needs to wait for the device (retry it on a blocking thread)")]
    WouldBlock,
}

impl StoreError {
    /// True when the same request may succeed later without operator action.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. })
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kv(context: impl Into<String>, err: impl std::fmt::Display) -> Self {
        StoreError::Kv {
            context: context.into(),
            message: err.to_string(),
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> Self {
        StoreError::Corrupt { what: what.into() }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

//! The monitor's errors. Refusals of a command (`Map`, `UnknownConfigKey`, …) are turned into
//! `MonReply::Error` with the same text at the protocol edge; the others are daemon failures.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MonError {
    #[error(transparent)]
    Map(#[from] kelp_maps::MapError),
    #[error("unknown config key '{key}' (see `kelp mon` docs/MONITOR.md for the list)")]
    UnknownConfigKey { key: String },
    #[error("invalid value '{value}' for {key}: {reason}")]
    InvalidConfigValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("invalid config target '{who}' (global, mon, osd, client, mgr, mds or type.id)")]
    InvalidWho { who: String },
    #[error("unknown cluster flag '{flag}'")]
    UnknownFlag { flag: String },
    #[error("osd.{id} is registered with uuid {expected}, not {got}")]
    UuidMismatch {
        id: i32,
        expected: String,
        got: String,
    },
    #[error("invalid entity name '{entity}': {reason}")]
    InvalidEntity { entity: String, reason: String },
    #[error("entity '{entity}' has no key")]
    NoSuchEntity { entity: String },
    #[error("the key of monitor '{entity}' cannot be removed")]
    MonKeyProtected { entity: String },
    #[error("the monitors are not initialised yet (no cluster maps)")]
    NotInitialized,
    #[error("{path}: {reason}")]
    DataDir { path: PathBuf, reason: String },
    #[error("{what}: stored format version {got}; this build reads up to {max}")]
    UnsupportedFormat {
        what: &'static str,
        got: u8,
        max: u8,
    },
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: &'static str, reason: String },
    #[error("database: {0}")]
    Db(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error(transparent)]
    Msgr(#[from] kelp_msgr::MsgrError),
    #[error("invalid monitor spec: {0}")]
    InvalidSpec(String),
    /// An erasure-code profile's words are malformed or out of range.
    #[error(transparent)]
    Ec(#[from] kelp_ec::EcError),
}

impl MonError {
    pub(crate) fn data_dir(path: &std::path::Path, e: impl std::fmt::Display) -> MonError {
        MonError::DataDir {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    }
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for MonError {
            fn from(e: $t) -> Self {
                MonError::Db(e.to_string())
            }
        }
    )*};
}
db_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

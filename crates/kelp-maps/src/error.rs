//! Errors of map decisions and map encoding. Each names what was asked and why it is refused,
//! so the monitor can hand it to the operator unchanged.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("pool '{0}' already exists")]
    PoolExists(String),
    #[error("pool '{0}' does not exist")]
    NoSuchPool(String),
    #[error("pool id {0} does not exist")]
    NoSuchPoolId(u32),
    #[error("osd.{0} does not exist")]
    NoSuchOsd(i32),
    #[error("osd.{0} already exists")]
    OsdExists(i32),
    #[error("CRUSH rule {0} does not exist")]
    NoSuchRule(String),
    #[error("invalid value for {field}: {reason}")]
    InvalidValue { field: &'static str, reason: String },
    #[error("incremental for epoch {got} cannot apply to a map at epoch {have} (needs {want})")]
    EpochGap { have: u32, got: u32, want: u32 },
    #[error("CRUSH: {0}")]
    Crush(#[from] kelp_crush::CrushError),
    #[error("cannot decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("{what} is format version {got}; this build reads up to {max}")]
    UnsupportedVersion {
        what: &'static str,
        got: u8,
        max: u8,
    },
}

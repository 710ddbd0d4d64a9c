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
    #[error("erasure-code profile '{0}' does not exist")]
    NoSuchEcProfile(String),
    /// `erasure-code-profile rm` of a profile pools were created from (Ceph refuses too, even
    /// though each pool keeps its own copy of the profile).
    #[error(
        "erasure-code profile '{name}' is used by pool(s) {}: delete them first",
        pools.join(", ")
    )]
    EcProfileInUse { name: String, pools: Vec<String> },
    /// `erasure-code-profile set` of an existing name with different settings, without
    /// `force` (Ceph's message). `used_by` lists the pools made from the profile.
    #[error(
        "will not override erasure code profile {name} because the existing profile {existing} \
         is different from the proposed profile {proposed}{}",
        if used_by.is_empty() {
            " (--force replaces it)".to_string()
        } else {
            format!(
                " (used by pool(s) {}, which keep their own copy; --force replaces it)",
                used_by.join(", ")
            )
        }
    )]
    EcProfileDiffers {
        name: String,
        existing: String,
        proposed: String,
        used_by: Vec<String>,
    },
    /// An erasure-coded pool needs `k+m` distinct failure domains; CRUSH would leave holes.
    #[error(
        "profile '{profile}' needs k+m = {need} failure domains of type {domain}{} under root \
         {root}, the CRUSH map has {have}: {}",
        class.as_ref().map(|c| format!(" with device class {c}")).unwrap_or_default(),
        if domain == "osd" {
            "add OSDs or use a profile with a smaller k+m".to_string()
        } else {
            format!("use crush-failure-domain=osd or add {domain}s")
        }
    )]
    NotEnoughFailureDomains {
        profile: String,
        need: u32,
        domain: String,
        class: Option<String>,
        root: String,
        have: u32,
    },
    #[error(transparent)]
    Ec(#[from] kelp_ec::EcError),
    #[error("cannot decode {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("{what} is format version {got}; this build reads up to {max}")]
    UnsupportedVersion {
        what: &'static str,
        got: u8,
        max: u8,
    },
    // File-system map (`crate::fsmap`).
    #[error("file system '{0}' already exists")]
    FsExists(String),
    #[error("file system '{0}' does not exist")]
    NoSuchFs(String),
    #[error("MDS '{0}' is not in the file-system map")]
    NoSuchMds(String),
    #[error("pool '{pool}' is already used by file system '{fs}'")]
    PoolInUseByFs { pool: String, fs: String },
    #[error(
        "pool '{0}' is erasure-coded and cannot be a metadata pool: the namespace is kept in \
         omap, which erasure-coded pools do not have; use a replicated pool"
    )]
    FsEcMetadataPool(String),
    #[error(
        "pool '{0}' is erasure-coded: a replicated default data pool is recommended (add \
         erasure-coded pools with `fs add_data_pool` and place directories there by layout); \
         --force uses it anyway"
    )]
    FsEcDefaultDataPool(String),
    #[error("pool '{0}' cannot be both the metadata and the data pool")]
    FsSamePool(String),
    #[error("file system '{fs}' has an active MDS ({mds}): fail it first with `kelp fs fail {fs}`")]
    FsHasActiveMds { fs: String, mds: String },
    #[error("max_mds {0} is not supported: only one active MDS per file system (max_mds 1)")]
    FsMaxMdsUnsupported(u32),
    #[error("pool '{pool}' is not a data pool of file system '{fs}'")]
    NotAFsDataPool { pool: String, fs: String },
    #[error("pool '{pool}' is the default data pool of file system '{fs}' and cannot be removed")]
    FsDefaultDataPool { pool: String, fs: String },
}

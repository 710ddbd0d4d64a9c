//! One module per subcommand group; each exposes a clap `Subcommand`/`Args` type and a `run`.

pub mod common;
pub mod config;
pub mod crush;
pub mod df;
pub mod ec_profile;
pub mod help;
pub mod mon;
pub mod nbd;
pub mod osd;
pub mod pg;
pub mod pool;
pub mod rados;
pub mod rbd;
pub mod rgw;
pub mod scrub;
pub mod service_map;
pub mod status;
pub mod store;
pub mod up;
pub mod watch;
// File-system map and MDS administration.
pub mod fs;
pub mod mds;
// file system: the FUSE client and the metadata server daemon
pub mod filesystem;
// Manager, dashboard, progress and cluster log.
pub mod mgr;

/// Output format of commands that can print machine-readable results.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// Human-readable text.
    #[default]
    #[value(alias = "text")]
    Plain,
    /// One JSON document.
    Json,
}

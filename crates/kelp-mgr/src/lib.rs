//! Kelp's manager (`kelp mgr run`): one active daemon, any number of standbys.
//!
//! Why it exists: the monitors keep the authoritative maps and the OSDs' latest statistics,
//! but nothing follows the cluster *over time*. The active manager polls what `kelp status`
//! reads (status, the statistics digest, the OSD map, the primaries' scrub summaries) every
//! couple of seconds and turns it into time series of client and recovery I/O
//! ([`series`], bounded rings), progress items of long work ([`progress`], published to the
//! monitors so that `kelp status` and `kelp progress` show them), scrub-error entries in the
//! cluster log, and the web dashboard with its JSON API ([`http`], [`view`]).
//!
//! Active/standby: every manager beacons to the monitors each second; the leader's manager map
//! names the active one and replaces it with a standby once it is silent for
//! `mgr_beacon_grace`. A standby serves only a redirect to the active dashboard.
//!
//! Layering: a RADOS client (kelp-client); it never links the monitors, the OSD or the S3
//! gateway. Buckets are read from the gateway's metadata pool (records the gateways write).
//! Pure cores ([`progress`], [`series`], [`auth`], [`view`]) are unit-tested; the daemon
//! ([`daemon`]) is the I/O around them. The full contract: docs/MANAGER.md.

pub mod auth;
pub mod daemon;
mod error;
pub mod http;
pub mod progress;
pub mod series;
pub mod view;

pub use daemon::{MgrOptions, run};
pub use error::MgrError;

//! The file-system map through the monitors: defining file systems (`kelp fs new/rm/set/...`),
//! reading the map (clients find the active MDS there), and the MDS side: beacons that
//! register a daemon and tell it its role, and `mds fail`.
//!
//! Fencing barrier: when a beacon promotes this MDS (it beaconed `Standby` and is told
//! `Active`), the monitors have blocklisted the previous holder in the same step. Before
//! answering, [`Rados::mds_beacon`] waits until this client's OSD map is at least as new as
//! the monitors' current one, so every op the new MDS sends carries an epoch that fences the
//! old one (OSDs catch up to an op's epoch before checking the blocklist).

use std::time::Duration;

use kelp_maps::{FsMap, MdsAssignment, MdsBeacon, MdsState};
use kelp_proto::{MonCommand, MonReply};

use crate::error::ClientError;
use crate::rados::Rados;

fn unexpected(other: MonReply) -> ClientError {
    match other {
        MonReply::Error { message } => ClientError::Invalid(message),
        other => ClientError::Invalid(format!("unexpected reply {other:?}")),
    }
}

impl Rados {
    /// `fs new NAME METADATA_POOL DATA_POOL`: a file system on two existing pools (the
    /// metadata pool replicated). Waits until this client's OSD map is current.
    pub async fn fs_new(
        &self,
        name: &str,
        metadata_pool: &str,
        data_pool: &str,
    ) -> Result<(), ClientError> {
        self.fs_new_with(name, metadata_pool, data_pool, false)
            .await
    }

    /// [`Rados::fs_new`] with `--force`: also accepts an erasure-coded default data pool.
    pub async fn fs_new_with(
        &self,
        name: &str,
        metadata_pool: &str,
        data_pool: &str,
        force: bool,
    ) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsNew {
            name: name.to_string(),
            metadata_pool: metadata_pool.to_string(),
            data_pool: data_pool.to_string(),
            force,
        })
        .await
        .map(drop)
    }

    /// `fs rm NAME`: refused while an MDS is active (fail it first, [`Rados::fs_fail`]). The
    /// pools and their objects stay.
    pub async fn fs_rm(&self, name: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsRm {
            name: name.to_string(),
        })
        .await
        .map(drop)
    }

    /// `fs set NAME KEY VALUE`: `max_mds` (only 1), `standby_count_wanted`, `joinable`.
    pub async fn fs_set(&self, name: &str, key: &str, value: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsSet {
            name: name.to_string(),
            key: key.to_string(),
            value: value.to_string(),
        })
        .await
        .map(drop)
    }

    /// `fs add_data_pool NAME POOL`.
    pub async fn fs_add_data_pool(&self, name: &str, pool: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsAddDataPool {
            name: name.to_string(),
            pool: pool.to_string(),
        })
        .await
        .map(drop)
    }

    /// `fs rm_data_pool NAME POOL` (not the default data pool).
    pub async fn fs_rm_data_pool(&self, name: &str, pool: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsRmDataPool {
            name: name.to_string(),
            pool: pool.to_string(),
        })
        .await
        .map(drop)
    }

    /// `fs fail NAME`: fences and removes the active MDS; no MDS takes the file system until
    /// `fs set NAME joinable true`. Returns once this client's map has the blocklist entry.
    pub async fn fs_fail(&self, name: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::FsFail {
            name: name.to_string(),
        })
        .await
        .map(drop)
    }

    /// The file-system map (which MDS is active for which file system, the standbys).
    pub async fn fs_map(&self) -> Result<FsMap, ClientError> {
        match self.mon_command(MonCommand::FsMapGet).await? {
            MonReply::FsMap(m) => Ok(m),
            other => Err(unexpected(other)),
        }
    }

    /// An MDS's beacon; the answer is its role. When this beacon promoted the MDS (it was
    /// `Standby` and is told `Active`), returns only once this client's OSD map has the
    /// blocklisting of the previous holder (see the module docs).
    pub async fn mds_beacon(&self, beacon: &MdsBeacon) -> Result<MdsAssignment, ClientError> {
        let reply = self
            .mon_command(MonCommand::MdsBeacon(beacon.clone()))
            .await?;
        let assignment = match reply {
            MonReply::MdsAssignment(a) => a,
            other => return Err(unexpected(other)),
        };
        let promoted =
            beacon.state == MdsState::Standby && matches!(assignment, MdsAssignment::Active { .. });
        if promoted {
            match self.mon_command(MonCommand::Status).await? {
                MonReply::Status(s) => {
                    self.wait_for_epoch(s.epoch).await?;
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(assignment)
    }

    /// How often MDS `name` should beacon: `mds_beacon_interval` from the central config
    /// (set for `mds.NAME`, `mds` or `global`), else the registry's default (1 s). An MDS
    /// reads it again now and then to follow `kelp config set`.
    pub async fn mds_beacon_interval(&self, name: &str) -> Result<Duration, ClientError> {
        let key = kelp_config::keys::MDS_BEACON_INTERVAL;
        let entries = match self.mon_command(MonCommand::ConfigDump).await? {
            MonReply::Config(entries) => entries,
            other => return Err(unexpected(other)),
        };
        let set = [format!("mds.{name}"), "mds".into(), "global".into()]
            .into_iter()
            .find_map(|who| {
                entries
                    .iter()
                    .find(|e| e.who == who && e.key == key.name)
                    .and_then(|e| e.value.parse::<f64>().ok())
            });
        let secs = set
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(key.default.as_f64());
        Ok(Duration::from_secs_f64(secs))
    }

    /// `mds fail NAME`: as if its beacons had stopped (an active MDS is fenced and a standby
    /// takes its role).
    pub async fn mds_fail(&self, name: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::MdsFail {
            name: name.to_string(),
        })
        .await
        .map(drop)
    }
}

//! The file-system map: which file systems exist (their metadata and data pools, settings) and
//! which metadata server (MDS) holds each one's rank 0, plus the standby MDS daemons waiting
//! for a role.
//!
//! Pure code, like the OSD map: the monitors apply every change with the same deterministic
//! methods (no clock: the leader's wall-clock time comes in as `now_ms`), so all monitors hold
//! the same map. A method either changes the map (the epoch grows by exactly one) and returns
//! the [`FsAction`]s the monitors must carry out on the OSD map (blocklisting a failed MDS's
//! client instance), or returns a typed error and leaves the map untouched.
//!
//! Invariants:
//! - an MDS name appears at most once: as one file system's `active` or among `standbys`;
//! - a pool belongs to at most one file system (as its metadata pool or one of its data pools);
//! - a file system's metadata pool is never erasure-coded (the namespace lives in omap);
//! - `FsInfo::last_incarnation` only grows: every MDS that becomes active for a file system
//!   gets a number never handed out for it before, so an MDS that lost its role can be told
//!   apart from the one that holds it now (its beacons get [`MdsAssignment::Stop`]);
//! - an active MDS that is removed for any reason other than its own clean stop is fenced:
//!   its client instance is blocklisted ([`FsAction::Blocklist`]) before another MDS takes
//!   the role, so it can never write late.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::error::MapError;
use crate::osdmap::OsdMap;

/// Format version of an encoded [`FsMap`].
pub const FS_MAP_FORMAT: u8 = 1;

/// The settings `fs set NAME KEY VALUE` accepts.
pub const FS_SET_KEYS: &[&str] = &["max_mds", "standby_count_wanted", "joinable"];

/// The file-system map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsMap {
    /// Grows by one per change (0: nothing has ever been defined).
    pub epoch: u32,
    /// File systems by name.
    pub filesystems: BTreeMap<String, FsInfo>,
    /// MDS daemons without a role, by name.
    pub standbys: BTreeMap<String, MdsInfo>,
    /// The id the next new file system gets (ids are never reused).
    pub next_fs_id: u32,
}

/// One file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsInfo {
    pub name: String,
    pub id: u32,
    pub metadata_pool: u32,
    /// Data pools; `data_pools[0]` is the default (where files without a layout go).
    pub data_pools: Vec<u32>,
    /// Active MDS ranks wanted; only 1 is supported.
    pub max_mds: u32,
    /// Standbys wanted; health warns (`MDS_INSUFFICIENT_STANDBY`) when fewer exist.
    pub standby_count_wanted: u32,
    /// The MDS holding rank 0.
    pub active: Option<MdsInfo>,
    /// Set by `fs fail` or `fs set NAME joinable false`: no MDS takes the file system until
    /// `fs set NAME joinable true`.
    pub failed: bool,
    /// The newest incarnation handed out for this file system (0: none yet).
    pub last_incarnation: u64,
}

/// One MDS daemon as the map knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsInfo {
    pub name: String,
    pub addr: SocketAddr,
    /// The MDS's RADOS client instance (`Rados::instance()`): what is blocklisted if it fails.
    pub instance: String,
    /// Which incarnation of its file system's rank 0 this MDS holds (0 for a standby).
    pub incarnation: u64,
    pub state: MdsState,
    /// Unix ms (the leader monitor's clock) when it entered `state`.
    pub since_ms: u64,
    /// The file system this MDS wants to serve (`None`: any).
    pub fs: Option<String>,
}

/// An MDS's state, with Ceph's names (`up:standby`, `up:replay`, `up:active`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MdsState {
    /// Waiting for a role.
    Standby,
    /// Given a role; replaying the journal before serving.
    Replay,
    /// Serving clients.
    Active,
}

impl MdsState {
    /// `standby`, `replay`, `active`.
    pub fn name(self) -> &'static str {
        match self {
            MdsState::Standby => "standby",
            MdsState::Replay => "replay",
            MdsState::Active => "active",
        }
    }
}

impl std::fmt::Display for MdsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "up:{}", self.name())
    }
}

/// What an MDS tells the monitors every `mds_beacon_interval`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdsBeacon {
    pub name: String,
    pub addr: SocketAddr,
    /// The MDS's RADOS client instance (`Rados::instance()`).
    pub instance: String,
    /// The file system it wants to serve (`None`: any).
    pub fs: Option<String>,
    /// The state the MDS believes it is in: `Standby` until told otherwise, then `Replay` while
    /// it replays the journal of the role it was given, then `Active`.
    pub state: MdsState,
    /// The incarnation of the role it holds (0 as a standby).
    pub incarnation: u64,
}

/// The monitors' answer to a beacon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MdsAssignment {
    /// Stay (or become) a standby.
    Standby,
    /// Hold rank 0 of `fs` as incarnation `incarnation`: replay the journal, then serve and
    /// beacon `state: Active` with this incarnation.
    Active { fs: String, incarnation: u64 },
    /// The role this MDS claims is no longer its own (it was failed, replaced by a newer
    /// incarnation, or its file system was removed): stop serving at once. It may register
    /// again as a standby with a new client instance.
    Stop,
}

/// What the monitors must do besides storing the new file-system map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsAction {
    /// Fence this client instance in the OSD map (a failed active MDS).
    Blocklist { instance: String },
}

/// File-system and MDS names: 1-64 letters, digits, `-`, `_`, `.`.
fn check_name(what: &'static str, name: &str) -> Result<(), MapError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(MapError::InvalidValue {
            field: what,
            reason: format!("'{name}' must be 1-64 letters, digits, '-', '_' or '.'"),
        })
    }
}

impl FsMap {
    pub fn new() -> FsMap {
        FsMap::default()
    }

    /// `[FS_MAP_FORMAT][postcard]`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![FS_MAP_FORMAT];
        out.extend(postcard::to_stdvec(self).expect("maps always encode"));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<FsMap, MapError> {
        match bytes.split_first() {
            None => Err(MapError::Decode {
                what: "file-system map",
                reason: "empty input".into(),
            }),
            Some((&FS_MAP_FORMAT, body)) => {
                postcard::from_bytes(body).map_err(|e| MapError::Decode {
                    what: "file-system map",
                    reason: e.to_string(),
                })
            }
            Some((&v, _)) => Err(MapError::UnsupportedVersion {
                what: "file-system map",
                got: v,
                max: FS_MAP_FORMAT,
            }),
        }
    }

    /// The file system using pool `pool` (as metadata or data pool), if any.
    pub fn fs_using_pool(&self, pool: u32) -> Option<&FsInfo> {
        self.filesystems
            .values()
            .find(|f| f.metadata_pool == pool || f.data_pools.contains(&pool))
    }

    /// The file system whose rank 0 MDS `name` holds.
    pub fn active_of(&self, name: &str) -> Option<&FsInfo> {
        self.filesystems
            .values()
            .find(|f| f.active.as_ref().is_some_and(|a| a.name == name))
    }

    /// Every MDS in the map (actives, then standbys).
    pub fn mds_daemons(&self) -> impl Iterator<Item = &MdsInfo> {
        self.filesystems
            .values()
            .filter_map(|f| f.active.as_ref())
            .chain(self.standbys.values())
    }

    /// Standbys that may take `fs` (wanting it or any file system).
    pub fn standbys_for<'a>(&'a self, fs: &'a str) -> impl Iterator<Item = &'a MdsInfo> + 'a {
        self.standbys
            .values()
            .filter(move |s| s.fs.as_deref().is_none_or(|w| w == fs))
    }

    /// Runs `f` on a copy; if it succeeds and changed anything, the copy (one epoch newer)
    /// replaces the map. On error the map is untouched.
    fn change<T>(
        &mut self,
        f: impl FnOnce(&mut FsMap) -> Result<T, MapError>,
    ) -> Result<T, MapError> {
        let mut next = self.clone();
        let out = f(&mut next)?;
        if next != *self {
            next.epoch = self.epoch + 1;
            *self = next;
        }
        Ok(out)
    }

    fn fs_mut(&mut self, name: &str) -> Result<&mut FsInfo, MapError> {
        self.filesystems
            .get_mut(name)
            .ok_or_else(|| MapError::NoSuchFs(name.to_string()))
    }

    /// `fs new NAME METADATA_POOL DATA_POOL [--force]`. Refuses an existing name, unknown pools,
    /// an erasure-coded metadata pool (the namespace is kept in omap, which erasure-coded pools
    /// do not have), an erasure-coded default data pool unless `force`, one pool for both, and
    /// pools another file system uses. A standby takes the new file system at once.
    pub fn fs_new(
        &mut self,
        osdmap: &OsdMap,
        name: &str,
        metadata_pool: &str,
        data_pool: &str,
        force: bool,
        now_ms: u64,
    ) -> Result<u32, MapError> {
        check_name("file system name", name)?;
        if self.filesystems.contains_key(name) {
            return Err(MapError::FsExists(name.to_string()));
        }
        let meta = osdmap
            .pool_by_name(metadata_pool)
            .ok_or_else(|| MapError::NoSuchPool(metadata_pool.to_string()))?;
        let data = osdmap
            .pool_by_name(data_pool)
            .ok_or_else(|| MapError::NoSuchPool(data_pool.to_string()))?;
        if meta.ec().is_some() {
            return Err(MapError::FsEcMetadataPool(metadata_pool.to_string()));
        }
        if data.ec().is_some() && !force {
            return Err(MapError::FsEcDefaultDataPool(data_pool.to_string()));
        }
        if meta.id == data.id {
            return Err(MapError::FsSamePool(metadata_pool.to_string()));
        }
        for p in [meta, data] {
            if let Some(other) = self.fs_using_pool(p.id) {
                return Err(MapError::PoolInUseByFs {
                    pool: p.name.clone(),
                    fs: other.name.clone(),
                });
            }
        }
        let (meta_id, data_id) = (meta.id, data.id);
        self.change(|m| {
            let id = m.next_fs_id;
            m.next_fs_id += 1;
            m.filesystems.insert(
                name.to_string(),
                FsInfo {
                    name: name.to_string(),
                    id,
                    metadata_pool: meta_id,
                    data_pools: vec![data_id],
                    max_mds: 1,
                    standby_count_wanted: 1,
                    active: None,
                    failed: false,
                    last_incarnation: 0,
                },
            );
            m.assign_standbys(now_ms);
            Ok(id)
        })
    }

    /// `fs rm NAME`: refused while an MDS holds it (fail it first with `fs fail`). Its pools
    /// and their objects stay.
    pub fn fs_rm(&mut self, name: &str) -> Result<(), MapError> {
        let fs = self
            .filesystems
            .get(name)
            .ok_or_else(|| MapError::NoSuchFs(name.to_string()))?;
        if let Some(a) = &fs.active {
            return Err(MapError::FsHasActiveMds {
                fs: name.to_string(),
                mds: a.name.clone(),
            });
        }
        self.change(|m| {
            m.filesystems.remove(name);
            Ok(())
        })
    }

    /// `fs set NAME KEY VALUE` for the keys in [`FS_SET_KEYS`].
    pub fn fs_set(
        &mut self,
        name: &str,
        key: &str,
        value: &str,
        now_ms: u64,
    ) -> Result<(), MapError> {
        if !self.filesystems.contains_key(name) {
            return Err(MapError::NoSuchFs(name.to_string()));
        }
        let invalid = |reason: String| MapError::InvalidValue {
            field: "fs set",
            reason,
        };
        let number = || {
            value
                .parse::<u32>()
                .map_err(|_| invalid(format!("{key} must be a whole number, not '{value}'")))
        };
        match key {
            "max_mds" => {
                let n = number()?;
                if n != 1 {
                    return Err(MapError::FsMaxMdsUnsupported(n));
                }
                self.change(|m| {
                    m.fs_mut(name)?.max_mds = n;
                    Ok(())
                })
            }
            "standby_count_wanted" => {
                let n = number()?;
                self.change(|m| {
                    m.fs_mut(name)?.standby_count_wanted = n;
                    Ok(())
                })
            }
            "joinable" => {
                let joinable = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(invalid(format!(
                            "joinable must be true or false, not '{value}'"
                        )));
                    }
                };
                self.change(|m| {
                    m.fs_mut(name)?.failed = !joinable;
                    m.assign_standbys(now_ms);
                    Ok(())
                })
            }
            _ => Err(invalid(format!(
                "unknown key '{key}' (settable: {})",
                FS_SET_KEYS.join(", ")
            ))),
        }
    }

    /// File system `name` and pool `pool`, both of which must exist.
    fn fs_and_pool<'a>(
        &self,
        osdmap: &'a OsdMap,
        name: &str,
        pool: &str,
    ) -> Result<(&FsInfo, &'a crate::Pool), MapError> {
        let fs = self
            .filesystems
            .get(name)
            .ok_or_else(|| MapError::NoSuchFs(name.to_string()))?;
        let p = osdmap
            .pool_by_name(pool)
            .ok_or_else(|| MapError::NoSuchPool(pool.to_string()))?;
        Ok((fs, p))
    }

    /// `fs add_data_pool NAME POOL`: files can then be placed in `pool` by layout. Adding a
    /// pool the file system already has is a no-op.
    pub fn fs_add_data_pool(
        &mut self,
        osdmap: &OsdMap,
        name: &str,
        pool: &str,
    ) -> Result<(), MapError> {
        let (fs, p) = self.fs_and_pool(osdmap, name, pool)?;
        if fs.data_pools.contains(&p.id) {
            return Ok(());
        }
        if let Some(other) = self.fs_using_pool(p.id) {
            return Err(MapError::PoolInUseByFs {
                pool: pool.to_string(),
                fs: other.name.clone(),
            });
        }
        let id = p.id;
        self.change(|m| {
            m.fs_mut(name)?.data_pools.push(id);
            Ok(())
        })
    }

    /// `fs rm_data_pool NAME POOL`: the default data pool (the first) cannot be removed.
    pub fn fs_rm_data_pool(
        &mut self,
        osdmap: &OsdMap,
        name: &str,
        pool: &str,
    ) -> Result<(), MapError> {
        let (fs, p) = self.fs_and_pool(osdmap, name, pool)?;
        match fs.data_pools.iter().position(|&d| d == p.id) {
            None => Err(MapError::NotAFsDataPool {
                pool: pool.to_string(),
                fs: name.to_string(),
            }),
            Some(0) => Err(MapError::FsDefaultDataPool {
                pool: pool.to_string(),
                fs: name.to_string(),
            }),
            Some(i) => self.change(|m| {
                m.fs_mut(name)?.data_pools.remove(i);
                Ok(())
            }),
        }
    }

    /// `fs fail NAME`: marks the file system failed (no MDS may take it until `fs set NAME
    /// joinable true`) and fails its active MDS (fenced, removed from the map).
    pub fn fs_fail(&mut self, name: &str) -> Result<Vec<FsAction>, MapError> {
        if !self.filesystems.contains_key(name) {
            return Err(MapError::NoSuchFs(name.to_string()));
        }
        self.change(|m| {
            let fs = m.fs_mut(name)?;
            fs.failed = true;
            Ok(fs
                .active
                .take()
                .map(|a| FsAction::Blocklist {
                    instance: a.instance,
                })
                .into_iter()
                .collect())
        })
    }

    /// `mds fail NAME`: as if its beacons had stopped. An active MDS is fenced and a standby
    /// takes its role; a standby is dropped from the map (it registers again with its next
    /// beacon).
    pub fn mds_fail(&mut self, name: &str, now_ms: u64) -> Result<Vec<FsAction>, MapError> {
        if self.active_of(name).is_none() && !self.standbys.contains_key(name) {
            return Err(MapError::NoSuchMds(name.to_string()));
        }
        self.change(|m| Ok(m.remove_mds(name, now_ms)))
    }

    /// The leader saw no beacon from MDS `name` for `mds_beacon_grace`. Applies only if the
    /// MDS of that name is still the same client `instance` (it did not restart meanwhile);
    /// otherwise, or if it is gone already, nothing happens.
    pub fn mds_timed_out(&mut self, name: &str, instance: &str, now_ms: u64) -> Vec<FsAction> {
        let same = self
            .mds_daemons()
            .any(|d| d.name == name && d.instance == instance);
        if !same {
            return Vec::new();
        }
        self.change(|m| Ok(m.remove_mds(name, now_ms)))
            .unwrap_or_default()
    }

    /// Removes MDS `name` from the map: an active one is fenced and its role given to a
    /// standby.
    fn remove_mds(&mut self, name: &str, now_ms: u64) -> Vec<FsAction> {
        let mut actions = Vec::new();
        self.standbys.remove(name);
        for fs in self.filesystems.values_mut() {
            if fs.active.as_ref().is_some_and(|a| a.name == name)
                && let Some(a) = fs.active.take()
            {
                actions.push(FsAction::Blocklist {
                    instance: a.instance,
                });
            }
        }
        self.assign_standbys(now_ms);
        actions
    }

    /// Gives every joinable file system without an active MDS a standby: one that wants
    /// this file system if any, else one that takes any, lowest name first. The new holder
    /// starts in `Replay` with the file system's next incarnation.
    fn assign_standbys(&mut self, now_ms: u64) {
        let names: Vec<String> = self
            .filesystems
            .values()
            .filter(|f| f.active.is_none() && !f.failed)
            .map(|f| f.name.clone())
            .collect();
        for fs_name in names {
            let pick = self
                .standbys
                .values()
                .find(|s| s.fs.as_deref() == Some(fs_name.as_str()))
                .or_else(|| self.standbys.values().find(|s| s.fs.is_none()))
                .map(|s| s.name.clone());
            let Some(pick) = pick else { continue };
            let Some(mut mds) = self.standbys.remove(&pick) else {
                continue;
            };
            let Some(fs) = self.filesystems.get_mut(&fs_name) else {
                continue;
            };
            fs.last_incarnation += 1;
            mds.incarnation = fs.last_incarnation;
            mds.state = MdsState::Replay;
            mds.since_ms = now_ms;
            fs.active = Some(mds);
        }
    }

    /// A beacon from an MDS: registers a new standby (and gives it a role at once if a file
    /// system needs one), records a promoted MDS's move from `Replay` to `Active`, and answers
    /// with what the MDS must be. A beacon claiming a role this MDS (this name *and* client
    /// instance *and* incarnation) does not hold gets `Stop`. A restarted MDS (same name, new
    /// instance) that held a role is treated as failed first (its old instance is fenced).
    pub fn mds_beacon(
        &mut self,
        beacon: &MdsBeacon,
        now_ms: u64,
    ) -> Result<(MdsAssignment, Vec<FsAction>), MapError> {
        check_name("MDS name", &beacon.name)?;
        if let Some(fs) = &beacon.fs {
            check_name("file system name", fs)?;
        }
        if beacon.instance.is_empty() || beacon.instance.chars().any(char::is_whitespace) {
            return Err(MapError::InvalidValue {
                field: "MDS instance",
                reason: format!("'{}' is not a client instance name", beacon.instance),
            });
        }
        self.change(|m| {
            let holder = m.active_of(&beacon.name).map(|f| {
                let a = f.active.as_ref().expect("active_of found it");
                (f.name.clone(), a.instance.clone(), a.incarnation)
            });
            if beacon.state != MdsState::Standby {
                // Claims a role: only the exact holder keeps it.
                let Some((fs, instance, incarnation)) = holder else {
                    return Ok((MdsAssignment::Stop, Vec::new()));
                };
                if instance != beacon.instance || incarnation != beacon.incarnation {
                    return Ok((MdsAssignment::Stop, Vec::new()));
                }
                let info = m.fs_mut(&fs)?.active.as_mut().expect("active_of found it");
                if beacon.state == MdsState::Active && info.state == MdsState::Replay {
                    info.state = MdsState::Active;
                    info.since_ms = now_ms;
                }
                if info.addr != beacon.addr {
                    info.addr = beacon.addr;
                }
                return Ok((MdsAssignment::Active { fs, incarnation }, Vec::new()));
            }
            let mut actions = Vec::new();
            if let Some((fs, instance, incarnation)) = holder {
                if instance == beacon.instance {
                    // Promoted, and learning it now.
                    return Ok((MdsAssignment::Active { fs, incarnation }, Vec::new()));
                }
                // The same name with a new instance: the holder restarted, so its old
                // instance is dead and must be fenced before anyone takes the role.
                actions = m.remove_mds(&beacon.name, now_ms);
            }
            let entry = m
                .standbys
                .entry(beacon.name.clone())
                .or_insert_with(|| MdsInfo {
                    name: beacon.name.clone(),
                    addr: beacon.addr,
                    instance: beacon.instance.clone(),
                    incarnation: 0,
                    state: MdsState::Standby,
                    since_ms: now_ms,
                    fs: beacon.fs.clone(),
                });
            entry.addr = beacon.addr;
            entry.instance = beacon.instance.clone();
            entry.fs = beacon.fs.clone();
            m.assign_standbys(now_ms);
            let reply = match m.active_of(&beacon.name) {
                Some(f) => MdsAssignment::Active {
                    fs: f.name.clone(),
                    incarnation: f.active.as_ref().map_or(0, |a| a.incarnation),
                },
                None => MdsAssignment::Standby,
            };
            Ok((reply, actions))
        })
    }
}

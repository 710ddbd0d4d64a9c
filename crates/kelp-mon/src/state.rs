//! The monitors' replicated state and the deterministic function that advances it.
//!
//! Why: the Raft log holds *requests* ([`MonEntry`]), not results. Every monitor applies the
//! same committed entries in the same order to the same state with [`MonState::apply`], which
//! calls the pure `kelp-maps` decisions (`propose_*`) on its current map and then `apply`s the
//! incremental they return. There is no proposer race (two leaders cannot both decide "epoch 7"
//! from different maps) and a refused request is refused identically everywhere.
//!
//! Invariants:
//! - `apply` is a pure function of the state and the entry: no clock, no randomness, no I/O
//!   (random secrets are drawn by the leader *before* proposing and carried in the entry);
//! - the OSD map epoch grows by one per incremental, and `incrementals` holds the encoded
//!   incrementals for the consecutive epochs `(epoch - incrementals.len(), epoch]`, at most
//!   `mon_max_incrementals` of them;
//! - `auth` always holds the key of every monitor in the monitor map (removing one is refused).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;

use kelp_maps::{Change, ClusterFlag, FsAction, FsMap, Incremental, OsdMap, PoolSpec};
use kelp_proto::{
    ActivationVerdict, ClusterStatus, ConfigEntry, LogEntry, MapUpdate, MonCommand, MonReply,
    OsdBoot, PgRecord,
};
use kelp_types::PgId;
use serde::{Deserialize, Serialize};

use crate::central_config;
use crate::error::MonError;

/// In/out weight meaning "fully in" (16.16 fixed point).
const WEIGHT_IN: u32 = 0x1_0000;

/// Format version of an encoded [`MonState`] (snapshots). 2 added `auto_out`, 3 `pg_history`,
/// 4 `fsmap`, 5 `cluster_log`; older formats are still read (as "no OSD was marked out
/// automatically", "no PG records", "no file systems", "an empty cluster log").
pub const STATE_FORMAT: u8 = 5;

/// One monitor of the monitor map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MonInfo {
    pub name: String,
    pub addr: SocketAddr,
}

/// What a new cluster starts from (the same on every monitor: it comes from `mkfs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitSpec {
    pub fsid: String,
    /// CRUSH failure domain of the default rule: `host` or `osd`.
    pub failure_domain: String,
    /// Initial keys: entity -> base64 secret.
    pub keys: Vec<(String, String)>,
    pub monmap: Vec<MonInfo>,
}

/// One entry of the monitors' Raft log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MonEntry {
    /// Creates the cluster state; ignored once the state exists.
    Init(InitSpec),
    /// An operator/daemon command (mutations; read-only commands are answered without the log).
    Command(MonCommand),
    /// `auth get-or-create`, with the secret the leader drew in case the entity is new.
    AuthGetOrCreate { entity: String, secret: String },
    /// An OSD booted (the leader checked that it came from `osd.<id>`).
    OsdBoot(OsdBoot),
    /// The leader saw no session of an OSD for `mon_osd_session_grace`. Applies only if the OSD
    /// is still up since `up_from` (it did not re-boot meanwhile).
    MarkDown { id: i32, up_from: u32 },
    /// The OSD has been down for `mon_osd_down_out_interval`. Applies only if it is still down
    /// since `down_at`, still in, and `noout` is not set. The OSD is remembered as marked out
    /// automatically, so that it is marked in again when it boots (unless `noin`).
    MarkOut { id: i32, down_at: u32 },
    /// The leader's statistics say some up OSD is at or past `mon_osd_full_ratio` (`on`), or
    /// that every up OSD has reported below it (`!on`): sets or clears the map's `full` flag.
    SetFull { on: bool },
    // New variants at the end (the log is persisted, numbered by position).
    /// `osd blocklist add`, with the expiry the leader computed from its clock (unix ms).
    BlocklistAdd {
        instance: String,
        until_ms: Option<u64>,
    },
    /// The leader's clock says blocklist entries expiring at or before `now_ms` are due.
    BlocklistExpire { now_ms: u64 },
    // File-system map and MDS roles.
    /// A file-system or MDS command (`FsNew`, `FsRm`, `FsSet`, `FsAddDataPool`,
    /// `FsRmDataPool`, `FsFail`, `MdsFail`, `MdsBeacon`), with the leader's wall-clock time
    /// (unix ms) for the map's `since_ms` and blocklist expiries.
    Fs { cmd: MonCommand, now_ms: u64 },
    /// The leader heard no beacon from MDS `name` for `mds_beacon_grace`. Applies only if that
    /// MDS is still the client `instance` the leader timed (it did not restart meanwhile).
    MdsTimedOut {
        name: String,
        instance: String,
        now_ms: u64,
    },
    // Cluster log.
    /// Events the leader saw (OSDs up/down/in/out, pools, health, manager failover), stamped
    /// by its clock; `seq` is assigned when applied (the entries' own `seq` is ignored).
    ClusterLog(Vec<LogEntry>),
}

/// The replicated state of the monitors.
#[derive(Debug, Clone, Default)]
pub struct MonState {
    /// `None` until the `Init` entry is applied.
    osdmap: Option<OsdMap>,
    /// `(epoch, encoded incremental)`, consecutive epochs ending at the map's epoch.
    incrementals: VecDeque<(u32, Vec<u8>)>,
    /// `(who, key) -> value`, values normalised.
    config: BTreeMap<(String, String), String>,
    /// entity -> base64 secret.
    auth: BTreeMap<String, String>,
    monmap: Vec<MonInfo>,
    /// OSDs the monitors marked out themselves (down-out interval, or created under `noin`):
    /// they are marked in again when they boot, unless `noin` is set. An operator's `osd out`
    /// or `osd in` removes an OSD from this set, so an OSD an operator marked out stays out
    /// (Ceph's `mon_osd_auto_mark_auto_out_in`).
    auto_out: BTreeSet<i32>,
    /// Each PG's latest activation record (`crate::pg_history`).
    pg_history: BTreeMap<PgId, PgRecord>,
    /// File systems and MDS roles.
    fsmap: FsMap,
    /// The cluster log, oldest first, at most `mon_cluster_log_max` entries.
    cluster_log: VecDeque<LogEntry>,
}

/// Format 1 of the encoded state.
#[derive(Serialize, Deserialize)]
struct StateWireV1 {
    osdmap: Option<Vec<u8>>,
    incrementals: Vec<(u32, Vec<u8>)>,
    config: Vec<(String, String, String)>,
    auth: Vec<(String, String)>,
    monmap: Vec<MonInfo>,
}

/// Format 2: format 1 plus `auto_out`.
#[derive(Serialize, Deserialize)]
struct StateWireV2 {
    osdmap: Option<Vec<u8>>,
    incrementals: Vec<(u32, Vec<u8>)>,
    config: Vec<(String, String, String)>,
    auth: Vec<(String, String)>,
    monmap: Vec<MonInfo>,
    auto_out: Vec<i32>,
}

/// Format 3: format 2 plus `pg_history`.
#[derive(Serialize, Deserialize)]
struct StateWireV3 {
    osdmap: Option<Vec<u8>>,
    incrementals: Vec<(u32, Vec<u8>)>,
    config: Vec<(String, String, String)>,
    auth: Vec<(String, String)>,
    monmap: Vec<MonInfo>,
    auto_out: Vec<i32>,
    pg_history: Vec<(PgId, PgRecord)>,
}

/// Format 4: format 3 plus the encoded file-system map.
#[derive(Serialize, Deserialize)]
struct StateWireV4 {
    osdmap: Option<Vec<u8>>,
    incrementals: Vec<(u32, Vec<u8>)>,
    config: Vec<(String, String, String)>,
    auth: Vec<(String, String)>,
    monmap: Vec<MonInfo>,
    auto_out: Vec<i32>,
    pg_history: Vec<(PgId, PgRecord)>,
    fsmap: Vec<u8>,
}

/// Format 5: format 4 plus `cluster_log`.
#[derive(Serialize, Deserialize)]
struct StateWire {
    osdmap: Option<Vec<u8>>,
    incrementals: Vec<(u32, Vec<u8>)>,
    config: Vec<(String, String, String)>,
    auth: Vec<(String, String)>,
    monmap: Vec<MonInfo>,
    auto_out: Vec<i32>,
    pg_history: Vec<(PgId, PgRecord)>,
    fsmap: Vec<u8>,
    cluster_log: Vec<LogEntry>,
}

impl From<StateWireV3> for StateWireV4 {
    fn from(v3: StateWireV3) -> StateWireV4 {
        StateWireV4 {
            osdmap: v3.osdmap,
            incrementals: v3.incrementals,
            config: v3.config,
            auth: v3.auth,
            monmap: v3.monmap,
            auto_out: v3.auto_out,
            pg_history: v3.pg_history,
            fsmap: FsMap::new().encode(),
        }
    }
}

impl From<StateWireV4> for StateWire {
    fn from(v4: StateWireV4) -> StateWire {
        StateWire {
            osdmap: v4.osdmap,
            incrementals: v4.incrementals,
            config: v4.config,
            auth: v4.auth,
            monmap: v4.monmap,
            auto_out: v4.auto_out,
            pg_history: v4.pg_history,
            fsmap: v4.fsmap,
            cluster_log: Vec::new(),
        }
    }
}

impl From<StateWireV1> for StateWireV2 {
    fn from(v1: StateWireV1) -> StateWireV2 {
        StateWireV2 {
            osdmap: v1.osdmap,
            incrementals: v1.incrementals,
            config: v1.config,
            auth: v1.auth,
            monmap: v1.monmap,
            auto_out: Vec::new(),
        }
    }
}

impl From<StateWireV2> for StateWireV3 {
    fn from(v2: StateWireV2) -> StateWireV3 {
        StateWireV3 {
            osdmap: v2.osdmap,
            incrementals: v2.incrementals,
            config: v2.config,
            auth: v2.auth,
            monmap: v2.monmap,
            auto_out: v2.auto_out,
            pg_history: Vec::new(),
        }
    }
}

fn refuse(e: impl std::fmt::Display) -> MonReply {
    MonReply::Error {
        message: e.to_string(),
    }
}

impl MonState {
    pub fn is_initialized(&self) -> bool {
        self.osdmap.is_some()
    }

    pub fn osdmap(&self) -> Option<&OsdMap> {
        self.osdmap.as_ref()
    }

    pub fn epoch(&self) -> u32 {
        self.osdmap.as_ref().map_or(0, |m| m.epoch)
    }

    pub fn monmap(&self) -> &[MonInfo] {
        &self.monmap
    }

    /// OSDs marked out by the monitors (not by an operator): they go in again at boot.
    pub fn auto_out(&self) -> &BTreeSet<i32> {
        &self.auto_out
    }

    /// File systems and MDS roles.
    pub fn fsmap(&self) -> &FsMap {
        &self.fsmap
    }

    /// The base64 secret of `entity`.
    pub fn secret(&self, entity: &str) -> Option<&str> {
        self.auth.get(entity).map(String::as_str)
    }

    /// The effective value of a known config key for `who`.
    pub fn config_value(&self, who: &str, key: &str) -> Option<String> {
        central_config::effective(&self.config, who, key)
    }

    fn config_u64(&self, key: &str) -> u64 {
        self.config_value("mon", key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// A config value in seconds (for the monitor's own timers).
    pub fn config_secs(&self, key: &str) -> f64 {
        self.config_value("mon", key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Applies one committed entry and returns the reply for whoever proposed it.
    pub fn apply(&mut self, entry: &MonEntry) -> MonReply {
        if let MonEntry::Init(spec) = entry {
            return self.init(spec);
        }
        let Some(map) = self.osdmap.as_ref() else {
            return refuse(MonError::NotInitialized);
        };
        let epoch = map.epoch;
        let result = match entry {
            MonEntry::Init(_) => unreachable!("handled above"),
            MonEntry::Command(cmd) => self.command(cmd),
            MonEntry::AuthGetOrCreate { entity, secret } => self.auth_get_or_create(entity, secret),
            MonEntry::OsdBoot(boot) => self.osd_boot(boot),
            MonEntry::MarkDown { id, up_from } => {
                let still = map
                    .osds
                    .get(id)
                    .is_some_and(|o| o.up && o.up_from == *up_from);
                if still && !map.has_flag(ClusterFlag::NoDown) {
                    let inc = map.propose_osd_down(*id);
                    self.commit(inc.map_err(Into::into))
                } else {
                    Ok(MonReply::Done { epoch })
                }
            }
            MonEntry::MarkOut { id, down_at } => {
                let still = map
                    .osds
                    .get(id)
                    .is_some_and(|o| !o.up && o.down_at == *down_at && o.is_in());
                if still && !map.has_flag(ClusterFlag::NoOut) {
                    let inc = map.propose_osd_weight(*id, 0);
                    let r = self.commit(inc.map_err(Into::into));
                    if r.is_ok() {
                        self.auto_out.insert(*id);
                    }
                    r
                } else {
                    Ok(MonReply::Done { epoch })
                }
            }
            MonEntry::SetFull { on } => {
                let inc = map.propose_flag(ClusterFlag::Full, *on);
                self.commit(Ok(inc))
            }
            MonEntry::BlocklistAdd { instance, until_ms } => {
                let inc = map.propose_blocklist_add(instance, *until_ms);
                self.commit(inc.map_err(Into::into))
            }
            MonEntry::BlocklistExpire { now_ms } => {
                let inc = map.propose_blocklist_expire(*now_ms);
                self.commit(Ok(inc))
            }
            MonEntry::Fs { cmd, now_ms } => self.fs_command(cmd, *now_ms),
            MonEntry::MdsTimedOut {
                name,
                instance,
                now_ms,
            } => {
                let mut fsmap = self.fsmap.clone();
                let actions = fsmap.mds_timed_out(name, instance, *now_ms);
                self.fs_actions(&actions, *now_ms).map(|()| {
                    self.fsmap = fsmap;
                    MonReply::Done {
                        epoch: self.epoch(),
                    }
                })
            }
            MonEntry::ClusterLog(entries) => {
                self.append_log(entries);
                Ok(MonReply::Done { epoch })
            }
        };
        result.unwrap_or_else(refuse)
    }

    fn init(&mut self, spec: &InitSpec) -> MonReply {
        if let Some(map) = &self.osdmap {
            return MonReply::Done { epoch: map.epoch };
        }
        match OsdMap::new(&spec.fsid, &spec.failure_domain) {
            Ok(map) => {
                self.auth = spec.keys.iter().cloned().collect();
                let mut monmap = spec.monmap.clone();
                monmap.sort();
                self.monmap = monmap;
                let epoch = map.epoch;
                self.osdmap = Some(map);
                self.incrementals.clear();
                MonReply::Done { epoch }
            }
            Err(e) => refuse(e),
        }
    }

    /// Applies the incremental a decision returned (if any) and answers `Done`.
    fn commit(&mut self, inc: Result<Option<Incremental>, MonError>) -> Result<MonReply, MonError> {
        if let Some(inc) = inc? {
            self.apply_incremental(&inc)?;
        }
        Ok(MonReply::Done {
            epoch: self.epoch(),
        })
    }

    fn apply_incremental(&mut self, inc: &Incremental) -> Result<(), MonError> {
        let map = self.osdmap.as_mut().ok_or(MonError::NotInitialized)?;
        map.apply(inc)?;
        self.incrementals.push_back((inc.epoch, inc.encode()));
        self.trim_incrementals();
        Ok(())
    }

    fn trim_incrementals(&mut self) {
        let max = self.config_u64("mon_max_incrementals") as usize;
        while self.incrementals.len() > max {
            self.incrementals.pop_front();
        }
    }

    fn map(&self) -> Result<&OsdMap, MonError> {
        self.osdmap.as_ref().ok_or(MonError::NotInitialized)
    }

    fn command(&mut self, cmd: &MonCommand) -> Result<MonReply, MonError> {
        let map = self.map()?;
        match cmd {
            MonCommand::Status
            | MonCommand::ConfigDump
            | MonCommand::AuthList
            | MonCommand::AuthGet { .. } => Ok(self.read_only(cmd)),
            MonCommand::LogLast { .. } => Ok(self.read_only(cmd)),
            MonCommand::LogAppend { entries } => {
                self.append_log(entries);
                Ok(MonReply::Done {
                    epoch: self.epoch(),
                })
            }
            MonCommand::MgrBeacon { .. }
            | MonCommand::MgrStat
            | MonCommand::ProgressReport { .. }
            | MonCommand::ProgressGet => Err(MonError::InvalidSpec(
                "the manager map and progress are kept by the leader in memory, not in the log"
                    .into(),
            )),
            MonCommand::PgStats | MonCommand::OsdPerf => Err(MonError::InvalidSpec(
                "PG statistics are answered by the leader from memory, not through the log".into(),
            )),
            MonCommand::ServiceBeacon { .. } | MonCommand::ServiceMap => {
                Err(MonError::InvalidSpec(
                    "the service map is kept by the leader in memory, not through the log".into(),
                ))
            }
            MonCommand::OsdCreate {
                id: want,
                uuid,
                host,
                crush_weight,
            } => {
                let (id, mut inc) =
                    map.propose_osd_create_with_id(uuid, host, *crush_weight, *want)?;
                // `noin`: a new OSD starts out, and goes in at its first boot after `noin` is
                // unset.
                let noin = map.has_flag(ClusterFlag::NoIn);
                if let Some(inc) = inc.as_mut().filter(|_| noin) {
                    inc.changes.push(Change::OsdWeight { id, weight: 0 });
                }
                let created = inc.is_some();
                self.commit(Ok(inc))?;
                if created && noin {
                    self.auto_out.insert(id);
                }
                Ok(MonReply::OsdId {
                    id,
                    epoch: self.epoch(),
                })
            }
            MonCommand::OsdDown { id } => {
                let inc = map.propose_osd_down(*id);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::OsdOut { id } => {
                let inc = map.propose_osd_weight(*id, 0);
                let r = self.commit(inc.map_err(Into::into))?;
                self.auto_out.remove(id);
                Ok(r)
            }
            MonCommand::OsdIn { id } => {
                let inc = map.propose_osd_weight(*id, WEIGHT_IN);
                let r = self.commit(inc.map_err(Into::into))?;
                self.auto_out.remove(id);
                Ok(r)
            }
            MonCommand::OsdReweight { id, weight } => {
                let inc = map.propose_osd_weight(*id, *weight);
                let r = self.commit(inc.map_err(Into::into))?;
                self.auto_out.remove(id);
                Ok(r)
            }
            MonCommand::OsdRemove { id } => {
                let inc = map.propose_osd_remove(*id)?;
                let r = self.commit(Ok(Some(inc)))?;
                self.auto_out.remove(id);
                // A removed OSD never comes back: PGs must not wait for it.
                self.forget_osd(*id);
                Ok(r)
            }
            MonCommand::OsdLost { id } => {
                match map.osds.get(id) {
                    None => return Err(MonError::InvalidSpec(format!("osd.{id} does not exist"))),
                    Some(o) if o.up => {
                        return Err(MonError::InvalidSpec(format!(
                            "osd.{id} is up; only a down OSD can be declared lost"
                        )));
                    }
                    Some(_) => {}
                }
                self.forget_osd(*id);
                Ok(MonReply::Done {
                    epoch: self.epoch(),
                })
            }
            MonCommand::PgActivate { activations } => {
                // Per activation: whether its PG exists, and how many members of the last
                // write set must vouch for its history (an erasure-coded PG needs `k` shards).
                let exists: Vec<Option<usize>> = activations
                    .iter()
                    .map(|a| {
                        map.pools
                            .get(&a.pg.pool.0)
                            .filter(|p| a.pg.seed < p.pg_num)
                            .map(|p| p.ec().map_or(1, |c| c.k as usize))
                    })
                    .collect();
                let mut verdicts = Vec::with_capacity(activations.len());
                for (a, exists) in activations.iter().zip(exists) {
                    let Some(vouchers) = exists else {
                        verdicts.push(ActivationVerdict::NoSuchPg);
                        continue;
                    };
                    let v = crate::pg_history::check(self.pg_history.get(&a.pg), a, vouchers);
                    if v == ActivationVerdict::Recorded {
                        self.pg_history.insert(a.pg, a.record.clone());
                    }
                    verdicts.push(v);
                }
                Ok(MonReply::PgActivated(verdicts))
            }
            MonCommand::PgRecordGet { .. }
            | MonCommand::EcProfileGet { .. }
            | MonCommand::EcProfileLs
            | MonCommand::BlocklistLs => Ok(self.read_only(cmd)),
            MonCommand::BlocklistAdd {
                instance,
                expire_secs: None,
            } => {
                let inc = map.propose_blocklist_add(instance, None);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::BlocklistAdd { .. } => Err(MonError::InvalidSpec(
                "a blocklist entry with an expiry is logged with the leader's clock \
                 (MonEntry::BlocklistAdd)"
                    .into(),
            )),
            MonCommand::BlocklistRm { instance } => {
                let inc = map.propose_blocklist_rm(instance);
                self.commit(Ok(inc))
            }
            MonCommand::EcProfileSet { name, words, force } => {
                let profile = kelp_ec::Profile::from_words(words)?;
                let inc = map.propose_ec_profile_set(name, &profile, *force);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::EcProfileRm { name } => {
                let inc = map.propose_ec_profile_rm(name)?;
                self.commit(Ok(Some(inc)))
            }
            MonCommand::PoolCreate(spec) => {
                let spec = self.pool_defaults(spec);
                let (id, inc) = self.map()?.propose_pool_create(&spec)?;
                self.commit(Ok(Some(inc)))?;
                Ok(MonReply::PoolId {
                    id,
                    epoch: self.epoch(),
                })
            }
            MonCommand::FsNew { .. }
            | MonCommand::FsRm { .. }
            | MonCommand::FsSet { .. }
            | MonCommand::FsAddDataPool { .. }
            | MonCommand::FsRmDataPool { .. }
            | MonCommand::FsFail { .. }
            | MonCommand::MdsFail { .. }
            | MonCommand::MdsBeacon(_) => Err(MonError::InvalidSpec(
                "file-system commands are logged with the leader's clock (MonEntry::Fs)".into(),
            )),
            MonCommand::FsMapGet => Ok(self.read_only(cmd)),
            MonCommand::PoolDelete { name } => {
                let pool = map.pool_by_name(name).map(|p| p.id);
                if let Some(fs) = pool.and_then(|id| self.fsmap.fs_using_pool(id)) {
                    return Err(MonError::InvalidSpec(format!(
                        "pool '{name}' is in use by file system '{}': remove the file system \
                         first (kelp fs fail {0}; kelp fs rm {0} --yes-i-really-mean-it)",
                        fs.name
                    )));
                }
                let inc = map.propose_pool_delete(name)?;
                let r = self.commit(Ok(Some(inc)))?;
                if let Some(pool) = pool {
                    self.pg_history.retain(|pg, _| pg.pool.0 != pool);
                }
                Ok(r)
            }
            MonCommand::PoolSet { name, key, value } => {
                let inc = map.propose_pool_set(name, key, value);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::PoolSnapCreate { pool } => {
                let (snap, inc) = map.propose_pool_snap_create(pool)?;
                self.commit(Ok(Some(inc)))?;
                Ok(MonReply::SnapId {
                    snap,
                    epoch: self.epoch(),
                })
            }
            MonCommand::PoolSnapRemove { pool, snap } => {
                let inc = map.propose_pool_snap_remove(pool, *snap);
                self.commit(inc.map_err(Into::into))
            }
            // --- device classes and replicated rules ---
            MonCommand::CrushSetDeviceClass { class, osds } => {
                let inc = map.propose_set_device_class(class, osds);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::CrushRmDeviceClass { osds } => {
                let inc = map.propose_rm_device_class(osds);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::CrushRuleCreateReplicated {
                name,
                root,
                failure_domain,
                class,
            } => {
                let inc = map.propose_replicated_rule(name, root, failure_domain, class.as_deref());
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::SetFlag { flag, .. } if flag == ClusterFlag::Full.name() => {
                Err(MonError::InvalidSpec(
                    "the full flag is set and cleared by the monitors from the OSDs' usage \
                     (mon_osd_full_ratio); free space or raise the ratio instead"
                        .into(),
                ))
            }
            MonCommand::PgTemp { pg, osds } => {
                let inc = map.propose_pg_temp(*pg, osds);
                self.commit(inc.map_err(Into::into))
            }
            MonCommand::SetFlag { flag, on } => {
                let f = ClusterFlag::from_name(flag)
                    .ok_or_else(|| MonError::UnknownFlag { flag: flag.clone() })?;
                let inc = map.propose_flag(f, *on);
                self.commit(Ok(inc))
            }
            MonCommand::ConfigSet { who, key, value } => {
                central_config::validate_who(who)?;
                let value = central_config::normalize(key, value)?;
                self.config.insert((who.clone(), key.clone()), value);
                if key == "mon_max_incrementals" {
                    self.trim_incrementals();
                }
                Ok(MonReply::Done {
                    epoch: self.epoch(),
                })
            }
            MonCommand::ConfigRm { who, key } => {
                central_config::validate_who(who)?;
                if central_config::key_def(key).is_none() {
                    return Err(MonError::UnknownConfigKey { key: key.clone() });
                }
                self.config.remove(&(who.clone(), key.clone()));
                Ok(MonReply::Done {
                    epoch: self.epoch(),
                })
            }
            MonCommand::AuthGetOrCreate { entity } => {
                // The leader turns this into `MonEntry::AuthGetOrCreate` with a fresh secret;
                // only an existing key can be answered without one.
                match self.auth.get(entity) {
                    Some(secret) => Ok(MonReply::Key {
                        entity: entity.clone(),
                        secret: secret.clone(),
                    }),
                    None => Err(MonError::NoSuchEntity {
                        entity: entity.clone(),
                    }),
                }
            }
            MonCommand::AuthRm { entity } => {
                if self
                    .monmap
                    .iter()
                    .any(|m| format!("mon.{}", m.name) == *entity)
                {
                    return Err(MonError::MonKeyProtected {
                        entity: entity.clone(),
                    });
                }
                if self.auth.remove(entity).is_none() {
                    return Err(MonError::NoSuchEntity {
                        entity: entity.clone(),
                    });
                }
                Ok(MonReply::Done {
                    epoch: self.epoch(),
                })
            }
        }
    }

    /// Applies a file-system or MDS command (`MonEntry::Fs`): the file-system map's decision,
    /// then what it asks of the OSD map (blocklisting failed MDS instances), in one entry.
    fn fs_command(&mut self, cmd: &MonCommand, now_ms: u64) -> Result<MonReply, MonError> {
        let map = self.map()?;
        let mut fsmap = self.fsmap.clone();
        let (reply, actions) = match cmd {
            MonCommand::FsNew {
                name,
                metadata_pool,
                data_pool,
                force,
            } => {
                fsmap.fs_new(map, name, metadata_pool, data_pool, *force, now_ms)?;
                (None, Vec::new())
            }
            MonCommand::FsRm { name } => {
                fsmap.fs_rm(name)?;
                (None, Vec::new())
            }
            MonCommand::FsSet { name, key, value } => {
                fsmap.fs_set(name, key, value, now_ms)?;
                (None, Vec::new())
            }
            MonCommand::FsAddDataPool { name, pool } => {
                fsmap.fs_add_data_pool(map, name, pool)?;
                (None, Vec::new())
            }
            MonCommand::FsRmDataPool { name, pool } => {
                fsmap.fs_rm_data_pool(map, name, pool)?;
                (None, Vec::new())
            }
            MonCommand::FsFail { name } => (None, fsmap.fs_fail(name)?),
            MonCommand::MdsFail { name } => (None, fsmap.mds_fail(name, now_ms)?),
            MonCommand::MdsBeacon(b) => {
                let (a, actions) = fsmap.mds_beacon(b, now_ms)?;
                (Some(MonReply::MdsAssignment(a)), actions)
            }
            other => {
                return Err(MonError::InvalidSpec(format!(
                    "{other:?} is not a file-system command"
                )));
            }
        };
        // Fence first: a promotion must never be recorded without the old holder's blocklist
        // entry (if that commit fails, the map stays as it was).
        self.fs_actions(&actions, now_ms)?;
        self.fsmap = fsmap;
        Ok(reply.unwrap_or(MonReply::Done {
            epoch: self.epoch(),
        }))
    }

    /// Carries out what a file-system map change asks of the OSD map: a failed MDS's client
    /// instance goes on the blocklist for `mds_blocklist_interval`.
    fn fs_actions(&mut self, actions: &[FsAction], now_ms: u64) -> Result<(), MonError> {
        let secs = self.config_secs(kelp_config::keys::MDS_BLOCKLIST_INTERVAL.name);
        let until = now_ms.saturating_add((secs * 1000.0) as u64);
        for a in actions {
            match a {
                FsAction::Blocklist { instance } => {
                    let inc = self.map()?.propose_blocklist_add(instance, Some(until))?;
                    self.commit(Ok(inc))?;
                }
            }
        }
        Ok(())
    }

    /// Appends to the cluster log, numbering the entries, and drops the oldest past
    /// `mon_cluster_log_max`.
    fn append_log(&mut self, entries: &[LogEntry]) {
        let last = self.cluster_log.back().map_or(0, |e| e.seq);
        for (seq, e) in (last + 1..).zip(entries) {
            self.cluster_log.push_back(LogEntry { seq, ..e.clone() });
        }
        let max = (self.config_u64(kelp_config::keys::MON_CLUSTER_LOG_MAX.name) as usize).max(1);
        while self.cluster_log.len() > max {
            self.cluster_log.pop_front();
        }
    }

    /// The newest `n` cluster-log entries, oldest first.
    pub fn log_last(&self, n: usize) -> Vec<LogEntry> {
        let skip = self.cluster_log.len().saturating_sub(n);
        self.cluster_log.iter().skip(skip).cloned().collect()
    }

    /// Takes `id` out of every PG's activation record (`osd lost`, `osd rm`).
    fn forget_osd(&mut self, id: i32) {
        for r in self.pg_history.values_mut() {
            r.members.retain(|&m| m != id);
        }
    }

    /// A PG's latest activation record.
    pub fn pg_record(&self, pg: PgId) -> Option<&PgRecord> {
        self.pg_history.get(&pg)
    }

    /// Fills what the operator left out from the central config. An erasure-coded pool's size
    /// and min_size come from its profile instead (`propose_pool_create`).
    fn pool_defaults(&self, spec: &PoolSpec) -> PoolSpec {
        let mut spec = spec.clone();
        let get = |k: &str| u32::try_from(self.config_u64(k)).unwrap_or(u32::MAX);
        if spec.pg_num.is_none() {
            spec.pg_num = Some(get("osd_pool_default_pg_num"));
        }
        if spec.erasure.is_some() {
            return spec;
        }
        if spec.size.is_none() {
            spec.size = Some(get("osd_pool_default_size"));
        }
        if spec.min_size.is_none() {
            let m = get("osd_pool_default_min_size");
            if m != 0 {
                spec.min_size = Some(m);
            }
        }
        spec
    }

    fn auth_get_or_create(&mut self, entity: &str, secret: &str) -> Result<MonReply, MonError> {
        kelp_msgr::validate_entity(entity).map_err(|e| MonError::InvalidEntity {
            entity: entity.to_string(),
            reason: e.to_string(),
        })?;
        let secret = self
            .auth
            .entry(entity.to_string())
            .or_insert_with(|| secret.to_string());
        Ok(MonReply::Key {
            entity: entity.to_string(),
            secret: secret.clone(),
        })
    }

    fn osd_boot(&mut self, boot: &OsdBoot) -> Result<MonReply, MonError> {
        let map = self.map()?;
        let osd = map
            .osds
            .get(&boot.id)
            .ok_or(kelp_maps::MapError::NoSuchOsd(boot.id))?;
        if osd.uuid != boot.uuid {
            return Err(MonError::UuidMismatch {
                id: boot.id,
                expected: osd.uuid.clone(),
                got: boot.uuid.clone(),
            });
        }
        let mut inc = map.propose_osd_boot(boot.id, boot.addr)?;
        // Marked out by the monitors while it was down: in again (unless `noin`).
        let auto_in =
            self.auto_out.contains(&boot.id) && !osd.is_in() && !map.has_flag(ClusterFlag::NoIn);
        if auto_in {
            inc.get_or_insert_with(|| Incremental {
                epoch: map.epoch + 1,
                changes: Vec::new(),
            })
            .changes
            .push(Change::OsdWeight {
                id: boot.id,
                weight: WEIGHT_IN,
            });
        }
        let r = self.commit(Ok(inc))?;
        if auto_in {
            self.auto_out.remove(&boot.id);
        }
        Ok(r)
    }

    /// Answers the read-only commands from this state (Status without the Raft part).
    pub fn read_only(&self, cmd: &MonCommand) -> MonReply {
        match cmd {
            MonCommand::Status => match self.status() {
                Some(s) => MonReply::Status(s),
                None => refuse(MonError::NotInitialized),
            },
            MonCommand::ConfigDump => MonReply::Config(
                self.config
                    .iter()
                    .map(|((who, key), value)| ConfigEntry {
                        who: who.clone(),
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
            ),
            MonCommand::AuthList => MonReply::Entities(self.auth.keys().cloned().collect()),
            MonCommand::AuthGet { entity } => match self.auth.get(entity) {
                Some(secret) => MonReply::Key {
                    entity: entity.clone(),
                    secret: secret.clone(),
                },
                None => MonReply::Error {
                    message: format!("no entity {entity}"),
                },
            },
            MonCommand::PgRecordGet { pg } => MonReply::PgRecord(self.pg_history.get(pg).cloned()),
            MonCommand::EcProfileGet { name } => {
                match self.osdmap.as_ref().and_then(|m| m.ec_profiles.get(name)) {
                    Some(p) => MonReply::EcProfile {
                        name: name.clone(),
                        pairs: p.to_pairs().into_iter().collect(),
                    },
                    None => refuse(kelp_maps::MapError::NoSuchEcProfile(name.clone())),
                }
            }
            MonCommand::BlocklistLs => MonReply::Blocklist(
                self.osdmap
                    .as_ref()
                    .map(|m| {
                        m.blocklist
                            .iter()
                            .map(|(instance, expires)| kelp_proto::BlocklistEntry {
                                instance: instance.clone(),
                                expires: *expires,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            MonCommand::FsMapGet => MonReply::FsMap(self.fsmap.clone()),
            MonCommand::LogLast { n } => MonReply::ClusterLog(self.log_last(*n as usize)),
            MonCommand::EcProfileLs => MonReply::EcProfileNames(
                self.osdmap
                    .as_ref()
                    .map(|m| m.ec_profiles.keys().cloned().collect())
                    .unwrap_or_default(),
            ),
            other => refuse(format!("{other:?} is not a read-only command")),
        }
    }

    /// The status as far as the replicated state knows it (`monitors` all out of quorum,
    /// `leader` unknown: the daemon fills those in).
    pub fn status(&self) -> Option<ClusterStatus> {
        let map = self.osdmap.as_ref()?;
        Some(ClusterStatus {
            fsid: map.fsid.clone(),
            epoch: map.epoch,
            num_osds: map.osds.len() as u32,
            num_up_osds: map.num_up() as u32,
            num_in_osds: map.num_in() as u32,
            num_pools: map.pools.len() as u32,
            num_pgs: map.pools.values().map(|p| p.pg_num).sum(),
            flags: map.flags.iter().map(|f| f.name().to_string()).collect(),
            monitors: self
                .monmap
                .iter()
                .map(|m| (m.name.clone(), false))
                .collect(),
            leader: None,
        })
    }

    /// What a subscriber at `have_epoch` needs: nothing if it is current (or ahead), the
    /// incrementals after its epoch if they are all still kept, otherwise the full map.
    pub fn catch_up(&self, have_epoch: u32) -> MapUpdate {
        let empty = MapUpdate {
            full: None,
            incrementals: Vec::new(),
        };
        let Some(map) = &self.osdmap else {
            return empty;
        };
        if have_epoch >= map.epoch {
            return empty;
        }
        let oldest = self.incrementals.front().map(|(e, _)| *e);
        if have_epoch > 0 && oldest.is_some_and(|o| o <= have_epoch + 1) {
            return MapUpdate {
                full: None,
                incrementals: self
                    .incrementals
                    .iter()
                    .filter(|(e, _)| *e > have_epoch)
                    .map(|(_, b)| b.clone())
                    .collect(),
            };
        }
        MapUpdate {
            full: Some(map.encode()),
            incrementals: Vec::new(),
        }
    }

    /// `[STATE_FORMAT][postcard]` of the whole state (snapshots).
    pub fn encode(&self) -> Vec<u8> {
        let wire = StateWire {
            osdmap: self.osdmap.as_ref().map(OsdMap::encode),
            incrementals: self.incrementals.iter().cloned().collect(),
            config: self
                .config
                .iter()
                .map(|((w, k), v)| (w.clone(), k.clone(), v.clone()))
                .collect(),
            auth: self
                .auth
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            monmap: self.monmap.clone(),
            auto_out: self.auto_out.iter().copied().collect(),
            pg_history: self
                .pg_history
                .iter()
                .map(|(pg, r)| (*pg, r.clone()))
                .collect(),
            fsmap: self.fsmap.encode(),
            cluster_log: self.cluster_log.iter().cloned().collect(),
        };
        let mut out = vec![STATE_FORMAT];
        out.extend(postcard::to_stdvec(&wire).expect("encoding into a Vec cannot fail"));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<MonState, MonError> {
        let (&v, body) = bytes.split_first().ok_or(MonError::Corrupt {
            what: "monitor state",
            reason: "empty".into(),
        })?;
        let corrupt = |e: postcard::Error| MonError::Corrupt {
            what: "monitor state",
            reason: e.to_string(),
        };
        let wire: StateWire = match v {
            1 => StateWireV4::from(StateWireV3::from(StateWireV2::from(
                postcard::from_bytes::<StateWireV1>(body).map_err(corrupt)?,
            )))
            .into(),
            2 => StateWireV4::from(StateWireV3::from(
                postcard::from_bytes::<StateWireV2>(body).map_err(corrupt)?,
            ))
            .into(),
            3 => StateWireV4::from(postcard::from_bytes::<StateWireV3>(body).map_err(corrupt)?)
                .into(),
            4 => postcard::from_bytes::<StateWireV4>(body)
                .map_err(corrupt)?
                .into(),
            STATE_FORMAT => postcard::from_bytes(body).map_err(corrupt)?,
            _ => {
                return Err(MonError::UnsupportedFormat {
                    what: "monitor state",
                    got: v,
                    max: STATE_FORMAT,
                });
            }
        };
        let osdmap = wire.osdmap.as_deref().map(OsdMap::decode).transpose()?;
        Ok(MonState {
            osdmap,
            incrementals: wire.incrementals.into(),
            config: wire
                .config
                .into_iter()
                .map(|(w, k, v)| ((w, k), v))
                .collect(),
            auth: wire.auth.into_iter().collect(),
            monmap: wire.monmap,
            auto_out: wire.auto_out.into_iter().collect(),
            pg_history: wire.pg_history.into_iter().collect(),
            fsmap: FsMap::decode(&wire.fsmap)?,
            cluster_log: wire.cluster_log.into(),
        })
    }
}

#[cfg(test)]
mod format_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A state written before the file-system map existed (format 3) still reads, with no
    /// file systems.
    #[test]
    fn format_3_states_decode_without_file_systems() {
        let v3 = StateWireV3 {
            osdmap: None,
            incrementals: Vec::new(),
            config: vec![("mon".into(), "mon_max_incrementals".into(), "5".into())],
            auth: vec![("client.admin".into(), "YWRtaW4=".into())],
            monmap: Vec::new(),
            auto_out: vec![3],
            pg_history: Vec::new(),
        };
        let mut bytes = vec![3u8];
        bytes.extend(postcard::to_stdvec(&v3).unwrap());
        let s = MonState::decode(&bytes).unwrap();
        assert_eq!(s.fsmap(), &FsMap::new());
        assert_eq!(s.secret("client.admin"), Some("YWRtaW4="));
        assert!(s.auto_out().contains(&3));
        let again = MonState::decode(&s.encode()).unwrap();
        assert_eq!(again.encode(), s.encode());
    }

    /// A state written before the cluster log existed (format 4) still reads, with an empty
    /// log and its file systems.
    #[test]
    fn format_4_states_decode_with_an_empty_cluster_log() {
        let v4 = StateWireV4 {
            osdmap: None,
            incrementals: Vec::new(),
            config: Vec::new(),
            auth: vec![("client.admin".into(), "YWRtaW4=".into())],
            monmap: Vec::new(),
            auto_out: Vec::new(),
            pg_history: Vec::new(),
            fsmap: FsMap::new().encode(),
        };
        let mut bytes = vec![4u8];
        bytes.extend(postcard::to_stdvec(&v4).unwrap());
        let s = MonState::decode(&bytes).unwrap();
        assert!(s.log_last(10).is_empty());
        assert_eq!(s.fsmap(), &FsMap::new());
        assert_eq!(s.encode()[0], STATE_FORMAT);
    }
}

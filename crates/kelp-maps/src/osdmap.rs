//! The OSD map, its incrementals, the monitors' decisions about it, and PG → OSD mapping.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;

use kelp_crush::{
    CrushMap, ITEM_NONE, ItemId, PoolPlacement, RULE_TYPE_ERASURE, RULE_TYPE_REPLICATED, Rule,
    WEIGHT_ONE,
};
use kelp_ec::Profile;
use kelp_types::PgId;
use serde::{Deserialize, Serialize};

use crate::error::MapError;

/// Version byte in front of every encoded map and incremental. 2 added the blocklist (format
/// 1 maps still decode, with an empty blocklist; incrementals did not change shape, their new
/// `Change` variants are appended).
pub const OSD_MAP_FORMAT: u8 = 2;

/// Cluster-wide flags, with Ceph's names and meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClusterFlag {
    /// Down OSDs are not marked out automatically.
    NoOut,
    /// OSDs may not be marked up (booting OSDs wait).
    NoUp,
    /// OSDs are not marked down on failure reports.
    NoDown,
    /// Booting OSDs that were out are not marked in.
    NoIn,
    NoRecover,
    NoBackfill,
    NoRebalance,
    NoScrub,
    NoDeepScrub,
    /// Client reads and writes are paused.
    Pause,
    /// Set and cleared by the monitors, not by operators: some OSD is at or past
    /// `mon_osd_full_ratio`, so client writes are refused (deletes and reads still work).
    Full,
}

impl ClusterFlag {
    /// The flags operators set and unset (`full` is the monitors' own).
    pub const ALL: [ClusterFlag; 10] = [
        ClusterFlag::NoOut,
        ClusterFlag::NoUp,
        ClusterFlag::NoDown,
        ClusterFlag::NoIn,
        ClusterFlag::NoRecover,
        ClusterFlag::NoBackfill,
        ClusterFlag::NoRebalance,
        ClusterFlag::NoScrub,
        ClusterFlag::NoDeepScrub,
        ClusterFlag::Pause,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ClusterFlag::NoOut => "noout",
            ClusterFlag::NoUp => "noup",
            ClusterFlag::NoDown => "nodown",
            ClusterFlag::NoIn => "noin",
            ClusterFlag::NoRecover => "norecover",
            ClusterFlag::NoBackfill => "nobackfill",
            ClusterFlag::NoRebalance => "norebalance",
            ClusterFlag::NoScrub => "noscrub",
            ClusterFlag::NoDeepScrub => "nodeep-scrub",
            ClusterFlag::Pause => "pause",
            ClusterFlag::Full => "full",
        }
    }

    pub fn from_name(name: &str) -> Option<ClusterFlag> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for ClusterFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One OSD as the map knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdInfo {
    pub id: i32,
    /// Identity of the OSD's store, so that a restarted OSD gets its id back.
    pub uuid: String,
    /// Where clients and peers reach it (set at boot).
    pub addr: Option<SocketAddr>,
    pub up: bool,
    /// In/out weight, 16.16 (`0x10000` in, `0` out): CRUSH's reweight for this OSD.
    pub weight: u32,
    /// Epoch it was last marked up / down.
    pub up_from: u32,
    pub down_at: u32,
    /// CRUSH host bucket it sits under.
    pub host: String,
}

impl OsdInfo {
    pub fn is_in(&self) -> bool {
        self.weight > 0
    }
}

/// How a pool keeps its objects safe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolKind {
    /// `size` full copies.
    Replicated,
    /// Each object cut into `k` data and `m` parity shards, shard `i` on the `i`-th OSD of the
    /// PG's acting set (`size = k + m`). `profile` is the name of the erasure-code profile the
    /// pool was created from; `code` is a copy of that profile taken at creation, so that
    /// changing (`--force`) or removing the named profile later never changes how the pool's
    /// objects are coded.
    Erasure { profile: String, code: Profile },
}

/// A pool.
///
/// Maps are postcard-encoded, which has no field names: new fields go at the end. Maps
/// persisted before `kind` could be `Erasure` and `fast_read` existed (and before
/// `OsdMap::ec_profiles`) do not decode; clusters from before that change are recreated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub id: u32,
    pub name: String,
    pub kind: PoolKind,
    /// Replicas kept (replicated), or shards per object `k + m` (erasure-coded; fixed at
    /// creation).
    pub size: u32,
    /// Fewest replicas (or shards, at least `k`) with which the pool still serves I/O.
    pub min_size: u32,
    pub pg_num: u32,
    pub pgp_num: u32,
    pub crush_rule: u32,
    pub hashpspool: bool,
    /// Epoch the pool was created in.
    pub created: u32,
    /// Erasure-coded pools only (Ceph's `fast_read`): a read asks every shard and decodes from
    /// the first `k` answers instead of reading the `k` data shards. Always false for
    /// replicated pools.
    pub fast_read: bool,
    /// Self-managed snapshots: the newest snapshot id allocated in the pool (0: none yet).
    /// Ids are allocated by the monitors (`propose_pool_snap_create`), never reused.
    pub snap_seq: u64,
    /// Snapshot ids removed from the pool (`propose_pool_snap_remove`): their clones are
    /// trimmed by the PGs' primaries, and reads at them find nothing.
    pub removed_snaps: BTreeSet<u64>,
}

impl Pool {
    /// The erasure code of an erasure-coded pool (its own copy of the profile), `None` for a
    /// replicated pool.
    pub fn ec(&self) -> Option<&Profile> {
        match &self.kind {
            PoolKind::Replicated => None,
            PoolKind::Erasure { code, .. } => Some(code),
        }
    }

    /// Name of the erasure-code profile an erasure-coded pool was created from.
    pub fn ec_profile_name(&self) -> Option<&str> {
        match &self.kind {
            PoolKind::Replicated => None,
            PoolKind::Erasure { profile, .. } => Some(profile),
        }
    }

    /// `replicated` or `erasure`, as Ceph prints a pool's type.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            PoolKind::Replicated => "replicated",
            PoolKind::Erasure { .. } => "erasure",
        }
    }

    /// What CRUSH needs to place the pool's PGs. Erasure-coded pools map with
    /// `erasure: true`: positions are kept and holes stay [`ITEM_NONE`].
    pub fn placement(&self) -> PoolPlacement {
        PoolPlacement {
            pool_id: self.id,
            pg_num: self.pg_num,
            pgp_num: self.pgp_num,
            hashpspool: self.hashpspool,
            crush_rule: self.crush_rule,
            size: self.size as usize,
            erasure: self.ec().is_some(),
        }
    }
}

/// What an operator asks for when creating a pool; unset fields take defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub name: String,
    pub pg_num: Option<u32>,
    /// Replicated: replicas (default 3). Erasure-coded: must be `k + m` if given.
    pub size: Option<u32>,
    /// Replicated: default `size - size/2`. Erasure-coded: default the profile's
    /// `default_min_size()` (`k + 1`, at most `k + m`), within `k..=k+m`.
    pub min_size: Option<u32>,
    /// Rule name or id. Erasure-coded pools: an existing `type erasure` rule; by default a new
    /// rule named after the pool is made from the profile (as Ceph does).
    pub crush_rule: Option<String>,
    /// `Some(profile name)`: an erasure-coded pool with that profile (appended field: see
    /// [`Pool`] on encoding).
    pub erasure: Option<String>,
}

/// One change within an incremental.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A new OSD, placed in CRUSH under `host` (created under the root if missing).
    NewOsd {
        id: i32,
        uuid: String,
        host: String,
        crush_weight: u32,
    },
    /// The OSD booted at `addr` and is up.
    OsdUp {
        id: i32,
        addr: SocketAddr,
    },
    OsdDown {
        id: i32,
    },
    /// In/out weight (16.16).
    OsdWeight {
        id: i32,
        weight: u32,
    },
    /// The OSD is gone: removed from the map and from CRUSH.
    RemoveOsd {
        id: i32,
    },
    /// Creates or replaces a pool.
    SetPool(Pool),
    RemovePool {
        id: u32,
    },
    /// Replaces the CRUSH map (text form).
    SetCrush(String),
    SetFlag {
        flag: ClusterFlag,
        on: bool,
    },
    /// Temporary acting set for a PG; empty removes it. For an erasure-coded pool it has one
    /// entry per shard position (`ITEM_NONE` where no OSD serves that shard).
    SetPgTemp {
        pg: PgId,
        osds: Vec<i32>,
    },
    /// Creates or replaces an erasure-code profile (pools keep their own copy).
    SetEcProfile {
        name: String,
        profile: Profile,
    },
    RemoveEcProfile {
        name: String,
    },
    /// Fences a client instance (`osd blocklist add`), until `until_ms` (unix ms) if given.
    Blocklist {
        instance: String,
        until_ms: Option<u64>,
    },
    /// Lifts a client instance's fence (`osd blocklist rm`, or its expiry).
    Unblocklist {
        instance: String,
    },
}

/// The difference between map `epoch - 1` and map `epoch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incremental {
    pub epoch: u32,
    pub changes: Vec<Change>,
}

impl Incremental {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![OSD_MAP_FORMAT];
        out.extend(postcard::to_stdvec(self).expect("incrementals always encode"));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Incremental, MapError> {
        let (_, body) = check_version(bytes, "OSD map incremental")?;
        postcard::from_bytes(body).map_err(|e| MapError::Decode {
            what: "OSD map incremental",
            reason: e.to_string(),
        })
    }
}

fn check_version<'a>(bytes: &'a [u8], what: &'static str) -> Result<(u8, &'a [u8]), MapError> {
    match bytes.split_first() {
        None => Err(MapError::Decode {
            what,
            reason: "empty input".into(),
        }),
        Some((&v, body)) if (1..=OSD_MAP_FORMAT).contains(&v) => Ok((v, body)),
        Some((&v, _)) => Err(MapError::UnsupportedVersion {
            what,
            got: v,
            max: OSD_MAP_FORMAT,
        }),
    }
}

/// Where a PG lives: the up set (CRUSH result minus down OSDs) and the acting set (who serves
/// it: the up set, or `pg_temp` while data moves).
///
/// `up` and `acting` list OSDs only, gaps closed (fewer entries than `size` when CRUSH found
/// too few or some are down), for every pool: what counts members, checks `min_size` or sends
/// writes needs nothing else.
///
/// Erasure-coded pools also need positions (entry `i` holds shard `i`): `up_shards` and
/// `acting_shards` always have exactly `size` (`k + m`) entries, and a position with no OSD —
/// CRUSH could not fill it (fewer failure domains than `k + m`), or its OSD is down or gone —
/// holds the hole marker [`ITEM_NONE`] (`kelp_crush::ITEM_NONE` = `0x7fff_ffff`, re-exported
/// as `kelp_maps::ITEM_NONE`). For replicated pools the fields are left empty (no copy on the
/// client-op path) and the `up_shards()`/`acting_shards()` accessors return `up`/`acting`.
///
/// `up_primary` / `acting_primary` are the first OSD of the set, or `-1` when there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMapping {
    pub up: Vec<i32>,
    pub up_primary: i32,
    pub acting: Vec<i32>,
    pub acting_primary: i32,
    pub up_shards: Vec<i32>,
    pub acting_shards: Vec<i32>,
}

impl PgMapping {
    /// The OSDs of the up set.
    pub fn up_osds(&self) -> impl Iterator<Item = i32> + '_ {
        self.up.iter().copied()
    }

    /// The OSDs of the acting set.
    pub fn acting_osds(&self) -> impl Iterator<Item = i32> + '_ {
        self.acting.iter().copied()
    }

    /// The up set by shard position (see the type's docs).
    pub fn up_shards(&self) -> &[i32] {
        if self.up_shards.is_empty() {
            &self.up
        } else {
            &self.up_shards
        }
    }

    /// The acting set by shard position (see the type's docs).
    pub fn acting_shards(&self) -> &[i32] {
        if self.acting_shards.is_empty() {
            &self.acting
        } else {
            &self.acting_shards
        }
    }
}

/// The OSD map.
#[derive(Debug, Clone, PartialEq)]
pub struct OsdMap {
    pub fsid: String,
    pub epoch: u32,
    pub flags: BTreeSet<ClusterFlag>,
    pub osds: BTreeMap<i32, OsdInfo>,
    pub pools: BTreeMap<u32, Pool>,
    /// Highest pool id ever used (ids are never reused).
    pub pool_max: u32,
    pub crush: CrushMap,
    pub pg_temp: BTreeMap<PgId, Vec<i32>>,
    /// Erasure-code profiles by name (`kelp osd erasure-code-profile set`); a new map has
    /// `default` (k=2 m=2, one shard per host, as Ceph). Pools copy the profile they are
    /// created from, so changing one here never changes an existing pool.
    pub ec_profiles: BTreeMap<String, Profile>,
    /// Fenced client instances (`osd blocklist`), each with its expiry (unix ms) if any: OSDs
    /// refuse their ops. An expired entry no longer fences (the leader monitor also removes
    /// it); see [`OsdMap::is_blocklisted`].
    pub blocklist: BTreeMap<String, Option<u64>>,
    /// CRUSH reweight vector derived from `osds` (rebuilt on every change).
    reweights: Vec<u32>,
}

/// The serialized shape of an `OsdMap` (CRUSH as Ceph's text format).
#[derive(Serialize, Deserialize)]
struct OsdMapWire {
    fsid: String,
    epoch: u32,
    flags: BTreeSet<ClusterFlag>,
    osds: BTreeMap<i32, OsdInfo>,
    pools: BTreeMap<u32, Pool>,
    pool_max: u32,
    crush: String,
    pg_temp: BTreeMap<PgId, Vec<i32>>,
    /// Appended with erasure-coded pools: older encoded maps do not decode (see [`Pool`]).
    ec_profiles: BTreeMap<String, Profile>,
    /// Format 2.
    blocklist: BTreeMap<String, Option<u64>>,
}

/// Format 1 of an encoded map: format 2 without the blocklist.
#[derive(Serialize, Deserialize)]
struct OsdMapWireV1 {
    fsid: String,
    epoch: u32,
    flags: BTreeSet<ClusterFlag>,
    osds: BTreeMap<i32, OsdInfo>,
    pools: BTreeMap<u32, Pool>,
    pool_max: u32,
    crush: String,
    pg_temp: BTreeMap<PgId, Vec<i32>>,
    ec_profiles: BTreeMap<String, Profile>,
}

/// Name of the root bucket and the default rule Kelp creates.
pub const DEFAULT_ROOT: &str = "default";
pub const DEFAULT_RULE: &str = "replicated_rule";
/// Name of the erasure-code profile every new map has (`kelp pool create NAME --erasure`).
pub const DEFAULT_EC_PROFILE: &str = "default";

impl OsdMap {
    /// A new cluster's map at epoch 1: no OSDs, no pools, a CRUSH root `default` and rule 0
    /// `replicated_rule` spreading replicas over distinct `failure_domain`s (`host`, or `osd`
    /// for a single-host cluster).
    pub fn new(fsid: &str, failure_domain: &str) -> Result<OsdMap, MapError> {
        let mut crush = CrushMap::with_default_types();
        let domain = crush
            .type_id(failure_domain)
            .ok_or_else(|| MapError::InvalidValue {
                field: "failure_domain",
                reason: format!("'{failure_domain}' is not a CRUSH type (use host or osd)"),
            })?;
        let root_type = crush.type_id("root").expect("default types have root");
        let root = crush.add_bucket(None, DEFAULT_ROOT, root_type, &[])?;
        crush.add_rule(Rule::replicated(0, DEFAULT_RULE, root, domain))?;
        crush.finalize()?;
        let mut map = OsdMap {
            fsid: fsid.to_string(),
            epoch: 1,
            flags: BTreeSet::new(),
            osds: BTreeMap::new(),
            pools: BTreeMap::new(),
            pool_max: 0,
            crush,
            pg_temp: BTreeMap::new(),
            ec_profiles: BTreeMap::from([(DEFAULT_EC_PROFILE.to_string(), Profile::default())]),
            blocklist: BTreeMap::new(),
            reweights: Vec::new(),
        };
        map.rebuild_reweights();
        Ok(map)
    }

    pub fn encode(&self) -> Vec<u8> {
        let wire = OsdMapWire {
            fsid: self.fsid.clone(),
            epoch: self.epoch,
            flags: self.flags.clone(),
            osds: self.osds.clone(),
            pools: self.pools.clone(),
            pool_max: self.pool_max,
            crush: self.crush.to_text(),
            pg_temp: self.pg_temp.clone(),
            ec_profiles: self.ec_profiles.clone(),
            blocklist: self.blocklist.clone(),
        };
        let mut out = vec![OSD_MAP_FORMAT];
        out.extend(postcard::to_stdvec(&wire).expect("maps always encode"));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<OsdMap, MapError> {
        let (version, body) = check_version(bytes, "OSD map")?;
        let bad = |e: postcard::Error| MapError::Decode {
            what: "OSD map",
            reason: e.to_string(),
        };
        let wire: OsdMapWire = if version == 1 {
            let v1: OsdMapWireV1 = postcard::from_bytes(body).map_err(bad)?;
            OsdMapWire {
                fsid: v1.fsid,
                epoch: v1.epoch,
                flags: v1.flags,
                osds: v1.osds,
                pools: v1.pools,
                pool_max: v1.pool_max,
                crush: v1.crush,
                pg_temp: v1.pg_temp,
                ec_profiles: v1.ec_profiles,
                blocklist: BTreeMap::new(),
            }
        } else {
            postcard::from_bytes(body).map_err(bad)?
        };
        let crush = kelp_crush::parse_text(&wire.crush)?;
        let mut map = OsdMap {
            fsid: wire.fsid,
            epoch: wire.epoch,
            flags: wire.flags,
            osds: wire.osds,
            pools: wire.pools,
            pool_max: wire.pool_max,
            crush,
            pg_temp: wire.pg_temp,
            ec_profiles: wire.ec_profiles,
            blocklist: wire.blocklist,
            reweights: Vec::new(),
        };
        map.rebuild_reweights();
        Ok(map)
    }

    fn rebuild_reweights(&mut self) {
        let n = self.crush.max_devices().max(0) as usize;
        let mut w = vec![0u32; n];
        for osd in self.osds.values() {
            if let Some(slot) = w.get_mut(osd.id as usize) {
                *slot = osd.weight;
            }
        }
        self.reweights = w;
    }

    pub fn has_flag(&self, flag: ClusterFlag) -> bool {
        self.flags.contains(&flag)
    }

    /// Whether client `instance` is fenced at wall-clock time `now_ms` (unix ms): on the
    /// blocklist with no expiry or one still ahead.
    pub fn is_blocklisted(&self, instance: &str, now_ms: u64) -> bool {
        self.blocklist
            .get(instance)
            .is_some_and(|until| until.is_none_or(|t| now_ms < t))
    }

    /// `osd blocklist add`: fences `instance` until `until_ms` (unix ms; `None`: until
    /// removed). Re-adding replaces the expiry; `None` if nothing changes.
    pub fn propose_blocklist_add(
        &self,
        instance: &str,
        until_ms: Option<u64>,
    ) -> Result<Option<Incremental>, MapError> {
        if instance.is_empty() || instance.chars().any(char::is_whitespace) {
            return Err(MapError::InvalidValue {
                field: "blocklist",
                reason: format!("'{instance}' is not a client instance name"),
            });
        }
        if self.blocklist.get(instance) == Some(&until_ms) {
            return Ok(None);
        }
        Ok(Some(self.next(vec![Change::Blocklist {
            instance: instance.to_string(),
            until_ms,
        }])))
    }

    /// `osd blocklist rm`: `None` if `instance` is not on the blocklist.
    pub fn propose_blocklist_rm(&self, instance: &str) -> Option<Incremental> {
        self.blocklist.contains_key(instance).then(|| {
            self.next(vec![Change::Unblocklist {
                instance: instance.to_string(),
            }])
        })
    }

    /// Removes the blocklist entries whose expiry is at or before `now_ms` (the leader
    /// monitor's housekeeping); `None` if none has expired.
    pub fn propose_blocklist_expire(&self, now_ms: u64) -> Option<Incremental> {
        let changes: Vec<Change> = self
            .blocklist
            .iter()
            .filter(|(_, until)| until.is_some_and(|t| t <= now_ms))
            .map(|(instance, _)| Change::Unblocklist {
                instance: instance.clone(),
            })
            .collect();
        (!changes.is_empty()).then(|| self.next(changes))
    }

    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }

    pub fn is_up(&self, osd: i32) -> bool {
        self.osds.get(&osd).is_some_and(|o| o.up)
    }

    pub fn num_up(&self) -> usize {
        self.osds.values().filter(|o| o.up).count()
    }

    pub fn num_in(&self) -> usize {
        self.osds.values().filter(|o| o.is_in()).count()
    }

    // ---- applying -----------------------------------------------------------------------

    /// Applies the incremental for the next epoch.
    pub fn apply(&mut self, inc: &Incremental) -> Result<(), MapError> {
        if inc.epoch != self.epoch + 1 {
            return Err(MapError::EpochGap {
                have: self.epoch,
                got: inc.epoch,
                want: self.epoch + 1,
            });
        }
        // Work on a copy so that a failing change leaves the map untouched.
        let mut next = self.clone();
        for change in &inc.changes {
            next.apply_change(change, inc.epoch)?;
        }
        next.crush.finalize()?;
        next.epoch = inc.epoch;
        next.rebuild_reweights();
        *self = next;
        Ok(())
    }

    fn apply_change(&mut self, change: &Change, epoch: u32) -> Result<(), MapError> {
        match change {
            Change::NewOsd {
                id,
                uuid,
                host,
                crush_weight,
            } => {
                if self.osds.contains_key(id) {
                    return Err(MapError::OsdExists(*id));
                }
                let name = format!("osd.{id}");
                self.crush.add_device(*id, &name, None)?;
                let host_id = match self.crush.item_id(host) {
                    Some(h) => h,
                    None => {
                        let host_type = self.crush.type_id("host").unwrap_or(1);
                        let h = self.crush.add_bucket(None, host, host_type, &[])?;
                        let root = self.crush.item_id(DEFAULT_ROOT).ok_or_else(|| {
                            MapError::InvalidValue {
                                field: "crush",
                                reason: "the CRUSH map has no 'default' root".into(),
                            }
                        })?;
                        self.crush.insert_item(root, h, 0)?;
                        h
                    }
                };
                self.crush.insert_item(host_id, *id, *crush_weight)?;
                self.osds.insert(
                    *id,
                    OsdInfo {
                        id: *id,
                        uuid: uuid.clone(),
                        addr: None,
                        up: false,
                        weight: WEIGHT_ONE,
                        up_from: 0,
                        down_at: epoch,
                        host: host.clone(),
                    },
                );
            }
            Change::OsdUp { id, addr } => {
                let osd = self.osds.get_mut(id).ok_or(MapError::NoSuchOsd(*id))?;
                osd.up = true;
                osd.addr = Some(*addr);
                osd.up_from = epoch;
            }
            Change::OsdDown { id } => {
                let osd = self.osds.get_mut(id).ok_or(MapError::NoSuchOsd(*id))?;
                osd.up = false;
                osd.down_at = epoch;
            }
            Change::OsdWeight { id, weight } => {
                let osd = self.osds.get_mut(id).ok_or(MapError::NoSuchOsd(*id))?;
                osd.weight = (*weight).min(WEIGHT_ONE);
            }
            Change::RemoveOsd { id } => {
                self.osds.remove(id).ok_or(MapError::NoSuchOsd(*id))?;
                self.crush.remove_device(*id)?;
                self.pg_temp.retain(|_, osds| !osds.contains(id));
            }
            Change::SetPool(pool) => {
                if self.crush.rule(pool.crush_rule).is_none() {
                    return Err(MapError::NoSuchRule(pool.crush_rule.to_string()));
                }
                self.pool_max = self.pool_max.max(pool.id);
                self.pools.insert(pool.id, pool.clone());
            }
            Change::RemovePool { id } => {
                self.pools.remove(id).ok_or(MapError::NoSuchPoolId(*id))?;
                self.pg_temp.retain(|pg, _| pg.pool.0 != *id);
            }
            Change::SetCrush(text) => {
                self.crush = kelp_crush::parse_text(text)?;
            }
            Change::SetFlag { flag, on } => {
                if *on {
                    self.flags.insert(*flag);
                } else {
                    self.flags.remove(flag);
                }
            }
            Change::SetPgTemp { pg, osds } => {
                if osds.is_empty() {
                    self.pg_temp.remove(pg);
                } else {
                    self.pg_temp.insert(*pg, osds.clone());
                }
            }
            Change::SetEcProfile { name, profile } => {
                self.ec_profiles.insert(name.clone(), profile.clone());
            }
            Change::RemoveEcProfile { name } => {
                self.ec_profiles
                    .remove(name)
                    .ok_or_else(|| MapError::NoSuchEcProfile(name.clone()))?;
            }
            Change::Blocklist { instance, until_ms } => {
                self.blocklist.insert(instance.clone(), *until_ms);
            }
            Change::Unblocklist { instance } => {
                self.blocklist.remove(instance);
            }
        }
        Ok(())
    }

    // ---- decisions (the monitor's pure core) -------------------------------------------

    pub(crate) fn next(&self, changes: Vec<Change>) -> Incremental {
        Incremental {
            epoch: self.epoch + 1,
            changes,
        }
    }

    /// `osd create`: the id for an OSD with this uuid (an existing one is returned unchanged,
    /// so a re-created OSD keeps its id), and the incremental adding it if it is new.
    pub fn propose_osd_create(
        &self,
        uuid: &str,
        host: &str,
        crush_weight: u32,
    ) -> Result<(i32, Option<Incremental>), MapError> {
        self.propose_osd_create_with_id(uuid, host, crush_weight, None)
    }

    /// As `propose_osd_create`, asking for a specific id (like `ceph osd new UUID ID`): the id
    /// must be free or already belong to this uuid.
    pub fn propose_osd_create_with_id(
        &self,
        uuid: &str,
        host: &str,
        crush_weight: u32,
        want: Option<i32>,
    ) -> Result<(i32, Option<Incremental>), MapError> {
        if let Some(w) = want {
            if w < 0 {
                return Err(MapError::InvalidValue {
                    field: "id",
                    reason: format!("osd id {w} is negative"),
                });
            }
            if let Some(existing) = self.osds.get(&w)
                && existing.uuid != uuid
            {
                return Err(MapError::InvalidValue {
                    field: "id",
                    reason: format!(
                        "osd.{w} already exists with another uuid ({})",
                        existing.uuid
                    ),
                });
            }
            if let Some(other) = self.osds.values().find(|o| o.uuid == uuid)
                && other.id != w
            {
                return Err(MapError::InvalidValue {
                    field: "id",
                    reason: format!("uuid {uuid} is already osd.{}", other.id),
                });
            }
        }
        if uuid.is_empty() {
            return Err(MapError::InvalidValue {
                field: "uuid",
                reason: "must not be empty".into(),
            });
        }
        if let Some(osd) = self.osds.values().find(|o| o.uuid == uuid) {
            return Ok((osd.id, None));
        }
        if host.is_empty() || host.contains(char::is_whitespace) || host.contains('~') {
            return Err(MapError::InvalidValue {
                field: "host",
                reason: format!("'{host}' is not a valid host name"),
            });
        }
        if let Some(existing) = self.crush.item_id(host)
            && self.crush.bucket(existing).is_none()
        {
            return Err(MapError::InvalidValue {
                field: "host",
                reason: format!("'{host}' is the name of a device"),
            });
        }
        let id = match want {
            Some(w) => w,
            None => (0..).find(|i| !self.osds.contains_key(i)).unwrap_or(0),
        };
        let inc = self.next(vec![Change::NewOsd {
            id,
            uuid: uuid.to_string(),
            host: host.to_string(),
            crush_weight,
        }]);
        Ok((id, Some(inc)))
    }

    /// An OSD booted at `addr`: mark it up (and back in, unless `noin`, if it was marked out
    /// automatically is decided by the monitor; this only marks up). `None` if nothing changes.
    pub fn propose_osd_boot(
        &self,
        id: i32,
        addr: SocketAddr,
    ) -> Result<Option<Incremental>, MapError> {
        let osd = self.osds.get(&id).ok_or(MapError::NoSuchOsd(id))?;
        if self.has_flag(ClusterFlag::NoUp) {
            return Err(MapError::InvalidValue {
                field: "boot",
                reason: "the noup flag is set: OSDs are not marked up".into(),
            });
        }
        if osd.up && osd.addr == Some(addr) {
            return Ok(None);
        }
        Ok(Some(self.next(vec![Change::OsdUp { id, addr }])))
    }

    pub fn propose_osd_down(&self, id: i32) -> Result<Option<Incremental>, MapError> {
        let osd = self.osds.get(&id).ok_or(MapError::NoSuchOsd(id))?;
        Ok(osd.up.then(|| self.next(vec![Change::OsdDown { id }])))
    }

    /// Sets the in/out weight (1.0 = in, 0 = out).
    pub fn propose_osd_weight(
        &self,
        id: i32,
        weight: u32,
    ) -> Result<Option<Incremental>, MapError> {
        let osd = self.osds.get(&id).ok_or(MapError::NoSuchOsd(id))?;
        let weight = weight.min(WEIGHT_ONE);
        Ok((osd.weight != weight).then(|| self.next(vec![Change::OsdWeight { id, weight }])))
    }

    pub fn propose_osd_remove(&self, id: i32) -> Result<Incremental, MapError> {
        let osd = self.osds.get(&id).ok_or(MapError::NoSuchOsd(id))?;
        if osd.up {
            return Err(MapError::InvalidValue {
                field: "osd",
                reason: format!("osd.{id} is up; stop it (and mark it down) first"),
            });
        }
        Ok(self.next(vec![Change::RemoveOsd { id }]))
    }

    pub fn propose_flag(&self, flag: ClusterFlag, on: bool) -> Option<Incremental> {
        (self.has_flag(flag) != on).then(|| self.next(vec![Change::SetFlag { flag, on }]))
    }

    /// Sets (or, with an empty list or one equal to the up set, removes) a PG's temporary
    /// acting set. Every member must exist and be up. For an erasure-coded pool the list keeps
    /// positions: exactly `size` entries, `ITEM_NONE` for a shard no OSD serves. `None` when
    /// nothing changes.
    pub fn propose_pg_temp(&self, pg: PgId, osds: &[i32]) -> Result<Option<Incremental>, MapError> {
        let pool = self
            .pools
            .get(&pg.pool.0)
            .ok_or(MapError::NoSuchPoolId(pg.pool.0))?;
        if pg.seed >= pool.pg_num {
            return Err(MapError::InvalidValue {
                field: "pg",
                reason: format!(
                    "pool {} has {} PGs, there is no PG {pg}",
                    pool.name, pool.pg_num
                ),
            });
        }
        let erasure = pool.ec().is_some();
        if erasure && !osds.is_empty() && osds.len() != pool.size as usize {
            return Err(MapError::InvalidValue {
                field: "pg_temp",
                reason: format!(
                    "pool {} is erasure-coded: a temporary acting set has one entry per shard \
                     ({}, ITEM_NONE for a shard no OSD serves), not {}",
                    pool.name,
                    pool.size,
                    osds.len()
                ),
            });
        }
        if erasure && !osds.is_empty() && osds.iter().all(|&o| o == ITEM_NONE) {
            return Err(MapError::InvalidValue {
                field: "pg_temp",
                reason: "a temporary acting set needs at least one OSD".into(),
            });
        }
        for &o in osds {
            if erasure && o == ITEM_NONE {
                continue;
            }
            if !self.osds.contains_key(&o) || !self.is_up(o) {
                return Err(MapError::InvalidValue {
                    field: "pg_temp",
                    reason: format!("osd.{o} does not exist or is down"),
                });
            }
        }
        let up = self.pg_mapping(pg)?.up;
        let wanted: Vec<i32> = if osds == up.as_slice() {
            Vec::new()
        } else {
            osds.to_vec()
        };
        let current = self.pg_temp.get(&pg).cloned().unwrap_or_default();
        if current == wanted {
            return Ok(None);
        }
        Ok(Some(
            self.next(vec![Change::SetPgTemp { pg, osds: wanted }]),
        ))
    }

    fn resolve_rule(&self, rule: &str) -> Result<u32, MapError> {
        if let Some(r) = self.crush.rule_by_name(rule) {
            return Ok(r.id);
        }
        match rule.parse::<u32>() {
            Ok(id) if self.crush.rule(id).is_some() => Ok(id),
            _ => Err(MapError::NoSuchRule(rule.to_string())),
        }
    }

    /// Resolves a rule for a replicated or an erasure-coded pool: the rule's type
    /// (`replicated` / `erasure`) must match the pool's, as Ceph requires.
    fn resolve_rule_for(&self, rule: &str, erasure: bool) -> Result<u32, MapError> {
        let id = self.resolve_rule(rule)?;
        let (want, kind, pool) = if erasure {
            (RULE_TYPE_ERASURE, "erasure", "an erasure-coded")
        } else {
            (RULE_TYPE_REPLICATED, "replicated", "a replicated")
        };
        if self.crush.rule(id).map(|r| r.rule_type) != Some(want) {
            return Err(MapError::InvalidValue {
                field: "crush_rule",
                reason: format!("rule '{rule}' is not a type {kind} rule, which {pool} pool needs"),
            });
        }
        Ok(id)
    }

    /// `pool create`. Replicated defaults: 32 PGs, size 3, min_size = size - size/2, the
    /// default rule. Erasure-coded (`spec.erasure = Some(profile)`): size `k+m`, min_size the
    /// profile's default (within `k..=k+m`), and, unless `spec.crush_rule` names an erasure
    /// rule, a new `type erasure` rule named after the pool made from the profile (its root,
    /// device class and failure domain; an existing erasure rule of that name is reused, as
    /// Ceph does). Refused when the CRUSH map has fewer failure domains of the profile's type
    /// than `k+m`: every PG would have holes.
    pub fn propose_pool_create(&self, spec: &PoolSpec) -> Result<(u32, Incremental), MapError> {
        let name = spec.name.trim();
        if name.is_empty() || name.len() > 128 || name.contains(char::is_whitespace) {
            return Err(MapError::InvalidValue {
                field: "name",
                reason: format!("'{}' is not a valid pool name", spec.name),
            });
        }
        if self.pool_by_name(name).is_some() {
            return Err(MapError::PoolExists(name.to_string()));
        }
        let pg_num = spec.pg_num.unwrap_or(32);
        if !(1..=65_536).contains(&pg_num) {
            return Err(MapError::InvalidValue {
                field: "pg_num",
                reason: format!("{pg_num} is outside 1..=65536"),
            });
        }
        let mut changes = Vec::new();
        let (kind, size, min_size, crush_rule) = match &spec.erasure {
            None => {
                let size = spec.size.unwrap_or(3);
                let min_size = spec.min_size.unwrap_or(size - size / 2);
                check_sizes(size, min_size)?;
                let rule = spec.crush_rule.as_deref().unwrap_or(DEFAULT_RULE);
                let crush_rule = self.resolve_rule_for(rule, false)?;
                (PoolKind::Replicated, size, min_size, crush_rule)
            }
            Some(profile) => {
                let code = self
                    .ec_profiles
                    .get(profile)
                    .ok_or_else(|| MapError::NoSuchEcProfile(profile.clone()))?
                    .clone();
                let size = code.size();
                if let Some(asked) = spec.size
                    && asked != size
                {
                    return Err(MapError::InvalidValue {
                        field: "size",
                        reason: format!(
                            "the size of an erasure-coded pool is k+m = {size} (profile \
                             '{profile}': k={} m={}), not {asked}",
                            code.k, code.m
                        ),
                    });
                }
                let min_size = spec.min_size.unwrap_or(code.default_min_size());
                check_ec_min_size(&code, min_size)?;
                let have = self.failure_domains(&code)?;
                if have < size {
                    return Err(MapError::NotEnoughFailureDomains {
                        profile: profile.clone(),
                        need: size,
                        domain: code.failure_domain.clone(),
                        class: code.device_class.clone(),
                        root: code.root.clone(),
                        have,
                    });
                }
                let crush_rule = match &spec.crush_rule {
                    Some(rule) => self.resolve_rule_for(rule, true)?,
                    None => match self.crush.rule_by_name(name) {
                        Some(r) if r.rule_type == RULE_TYPE_ERASURE => r.id,
                        Some(_) => {
                            return Err(MapError::InvalidValue {
                                field: "crush_rule",
                                reason: format!(
                                    "a replicated CRUSH rule named '{name}' exists, and an \
                                     erasure-coded pool's own rule is named after the pool: \
                                     choose another pool name or give an erasure rule"
                                ),
                            });
                        }
                        None => {
                            let (id, crush) = self.with_ec_rule(name, &code)?;
                            changes.push(Change::SetCrush(crush.to_text()));
                            id
                        }
                    },
                };
                let kind = PoolKind::Erasure {
                    profile: profile.clone(),
                    code,
                };
                (kind, size, min_size, crush_rule)
            }
        };
        let id = self.pool_max + 1;
        changes.push(Change::SetPool(Pool {
            id,
            name: name.to_string(),
            kind,
            size,
            min_size,
            pg_num,
            pgp_num: pg_num,
            crush_rule,
            hashpspool: true,
            created: self.epoch + 1,
            fast_read: false,
            snap_seq: 0,
            removed_snaps: BTreeSet::new(),
        }));
        Ok((id, self.next(changes)))
    }

    /// The CRUSH map with a new erasure rule named `name` for `code` (Ceph's shape:
    /// `set_chooseleaf_tries 5`, `set_choose_tries 100`, `take ROOT [class C]`,
    /// `chooseleaf indep 0 type DOMAIN` or `choose indep 0 type osd`, `emit`), and its id.
    fn with_ec_rule(&self, name: &str, code: &Profile) -> Result<(u32, CrushMap), MapError> {
        let (take, domain) = self.ec_take_and_domain(code)?;
        let take = take.ok_or_else(|| MapError::InvalidValue {
            field: "crush-device-class",
            reason: format!(
                "no OSD of device class '{}' under root {}",
                code.device_class.as_deref().unwrap_or(""),
                code.root
            ),
        })?;
        let mut crush = self.crush.clone();
        let id = crush.free_rule_id();
        crush.add_rule(Rule::erasure(id, name, take, domain))?;
        crush.finalize()?;
        Ok((id, crush))
    }

    /// Where an erasure rule for `code` starts (the root, or its shadow for the device class;
    /// `None` when the class has no shadow under the root) and the failure domain's type id.
    fn ec_take_and_domain(&self, code: &Profile) -> Result<(Option<ItemId>, u32), MapError> {
        let root = self
            .crush
            .item_id(&code.root)
            .filter(|&id| self.crush.bucket(id).is_some())
            .ok_or_else(|| MapError::InvalidValue {
                field: "crush-root",
                reason: format!("'{}' is not a bucket of the CRUSH map", code.root),
            })?;
        let domain =
            self.crush
                .type_id(&code.failure_domain)
                .ok_or_else(|| MapError::InvalidValue {
                    field: "crush-failure-domain",
                    reason: format!(
                        "'{}' is not a CRUSH type (known: {})",
                        code.failure_domain,
                        self.crush
                            .types()
                            .map(|(_, n)| n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
        let take = match &code.device_class {
            None => Some(root),
            Some(class) => self
                .crush
                .class_id(class)
                .and_then(|c| self.crush.shadow_of(root, c)),
        };
        Ok((take, domain))
    }

    /// How many distinct failure domains of `code`'s type, with CRUSH weight > 0, lie under
    /// its root (only counting OSDs of its device class, if set): the most shards CRUSH can
    /// place apart.
    pub fn failure_domains(&self, code: &Profile) -> Result<u32, MapError> {
        let (take, domain) = self.ec_take_and_domain(code)?;
        let Some(take) = take else { return Ok(0) };
        Ok(self.domains_under(take, domain))
    }

    /// How many distinct buckets of type `domain` (devices for type 0) with weight > 0 lie
    /// under `take` (a root or one of its shadows).
    pub(crate) fn domains_under(&self, take: ItemId, domain: u32) -> u32 {
        let crush = &self.crush;
        if crush.bucket(take).is_some_and(|b| b.type_id == domain) {
            return u32::from(crush.bucket(take).is_some_and(|b| b.weight > 0));
        }
        let mut found = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![take];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let Some(b) = crush.bucket(id) else { continue };
            for (&item, &w) in b.items.iter().zip(&b.item_weights) {
                if w == 0 {
                    continue;
                }
                if item >= 0 {
                    // devices are CRUSH type 0 (`osd`)
                    if domain == 0 {
                        found.insert(item);
                    }
                } else if crush.bucket(item).is_some_and(|c| c.type_id == domain) {
                    found.insert(item);
                } else {
                    stack.push(item);
                }
            }
        }
        found.len() as u32
    }

    /// `pool rm`. An erasure-coded pool's own rule (named after it, `type erasure`) goes with
    /// it when no other pool uses it.
    pub fn propose_pool_delete(&self, name: &str) -> Result<Incremental, MapError> {
        let pool = self
            .pool_by_name(name)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))?;
        let mut changes = vec![Change::RemovePool { id: pool.id }];
        let own_rule = pool.ec().is_some()
            && self
                .crush
                .rule(pool.crush_rule)
                .is_some_and(|r| r.name == pool.name && r.rule_type == RULE_TYPE_ERASURE);
        let shared = self
            .pools
            .values()
            .any(|p| p.id != pool.id && p.crush_rule == pool.crush_rule);
        if own_rule && !shared {
            let mut crush = self.crush.clone();
            crush.remove_rule(pool.crush_rule)?;
            crush.finalize()?;
            changes.push(Change::SetCrush(crush.to_text()));
        }
        Ok(self.next(changes))
    }

    /// `pool set NAME KEY VALUE` for `size`, `min_size`, `crush_rule` and `fast_read`. An
    /// erasure-coded pool's size is `k+m` for good; its `min_size` stays within `k..=k+m`;
    /// `fast_read` (`true`/`false`/`1`/`0`) is for erasure-coded pools only.
    pub fn propose_pool_set(
        &self,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<Option<Incremental>, MapError> {
        let mut pool = self
            .pool_by_name(name)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))?
            .clone();
        let number = |field: &'static str| {
            value.parse::<u32>().map_err(|_| MapError::InvalidValue {
                field,
                reason: format!("'{value}' is not a number"),
            })
        };
        let code = pool.ec().cloned();
        match key {
            "size" => {
                let size = number("size")?;
                if let Some(code) = &code {
                    if size == pool.size {
                        return Ok(None);
                    }
                    return Err(MapError::InvalidValue {
                        field: "size",
                        reason: format!(
                            "the size of an erasure-coded pool is k+m and cannot change \
                             (pool '{}': k={} m={}, size {})",
                            pool.name, code.k, code.m, pool.size
                        ),
                    });
                }
                pool.size = size;
                if pool.min_size > pool.size {
                    pool.min_size = pool.size;
                }
            }
            "min_size" => pool.min_size = number("min_size")?,
            "crush_rule" => pool.crush_rule = self.resolve_rule_for(value, code.is_some())?,
            "fast_read" => {
                if code.is_none() {
                    return Err(MapError::InvalidValue {
                        field: "fast_read",
                        reason: format!(
                            "fast_read applies to erasure-coded pools only; pool '{}' is \
                             replicated",
                            pool.name
                        ),
                    });
                }
                pool.fast_read = match value {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(MapError::InvalidValue {
                            field: "fast_read",
                            reason: format!("'{other}' is not true or false"),
                        });
                    }
                };
            }
            "pg_num" | "pgp_num" => {
                return Err(MapError::InvalidValue {
                    field: "pg_num",
                    reason: "changing pg_num (PG splitting) is not supported yet".into(),
                });
            }
            other => {
                return Err(MapError::InvalidValue {
                    field: "key",
                    reason: format!(
                        "unknown pool setting '{other}' (size, min_size, crush_rule, fast_read)"
                    ),
                });
            }
        }
        match &code {
            Some(code) => check_ec_min_size(code, pool.min_size)?,
            None => check_sizes(pool.size, pool.min_size)?,
        }
        if Some(&pool) == self.pools.get(&pool.id) {
            return Ok(None);
        }
        Ok(Some(self.next(vec![Change::SetPool(pool)])))
    }

    /// Allocates the next self-managed snapshot id of pool `name` (`snap_seq + 1`): the id
    /// and the incremental that records it.
    pub fn propose_pool_snap_create(&self, name: &str) -> Result<(u64, Incremental), MapError> {
        let mut pool = self
            .pool_by_name(name)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))?
            .clone();
        pool.snap_seq += 1;
        let snap = pool.snap_seq;
        Ok((snap, self.next(vec![Change::SetPool(pool)])))
    }

    /// Marks self-managed snapshot `snap` of pool `name` removed (its clones are then
    /// trimmed). Removing a removed snapshot changes nothing (`None`); an id never allocated
    /// is refused.
    pub fn propose_pool_snap_remove(
        &self,
        name: &str,
        snap: u64,
    ) -> Result<Option<Incremental>, MapError> {
        let mut pool = self
            .pool_by_name(name)
            .ok_or_else(|| MapError::NoSuchPool(name.to_string()))?
            .clone();
        if snap == 0 || snap > pool.snap_seq {
            return Err(MapError::InvalidValue {
                field: "snap",
                reason: format!(
                    "pool '{name}' has allocated snapshot ids 1..={} only, not {snap}",
                    pool.snap_seq
                ),
            });
        }
        if !pool.removed_snaps.insert(snap) {
            return Ok(None);
        }
        Ok(Some(self.next(vec![Change::SetPool(pool)])))
    }

    /// Pools created from erasure-code profile `name`.
    fn pools_using_profile(&self, name: &str) -> Vec<String> {
        self.pools
            .values()
            .filter(|p| p.ec_profile_name() == Some(name))
            .map(|p| p.name.clone())
            .collect()
    }

    /// `osd erasure-code-profile set NAME ...`. Setting an existing profile to the same
    /// settings changes nothing (`None`); to different ones is refused unless `force` (Ceph's
    /// rule), naming the pools made from it — they keep their own copy either way.
    pub fn propose_ec_profile_set(
        &self,
        name: &str,
        profile: &Profile,
        force: bool,
    ) -> Result<Option<Incremental>, MapError> {
        if name.is_empty() || name.len() > 128 || name.contains(char::is_whitespace) {
            return Err(MapError::InvalidValue {
                field: "name",
                reason: format!("'{name}' is not a valid erasure-code profile name"),
            });
        }
        match self.ec_profiles.get(name) {
            Some(existing) if existing == profile => return Ok(None),
            Some(existing) if !force => {
                return Err(MapError::EcProfileDiffers {
                    name: name.to_string(),
                    existing: profile_text(existing),
                    proposed: profile_text(profile),
                    used_by: self.pools_using_profile(name),
                });
            }
            _ => {}
        }
        Ok(Some(self.next(vec![Change::SetEcProfile {
            name: name.to_string(),
            profile: profile.clone(),
        }])))
    }

    /// `osd erasure-code-profile rm NAME`: refused while pools made from it exist.
    pub fn propose_ec_profile_rm(&self, name: &str) -> Result<Incremental, MapError> {
        if !self.ec_profiles.contains_key(name) {
            return Err(MapError::NoSuchEcProfile(name.to_string()));
        }
        let pools = self.pools_using_profile(name);
        if !pools.is_empty() {
            return Err(MapError::EcProfileInUse {
                name: name.to_string(),
                pools,
            });
        }
        Ok(self.next(vec![Change::RemoveEcProfile {
            name: name.to_string(),
        }]))
    }

    // ---- mapping -------------------------------------------------------------------------

    /// The PG holding an object.
    pub fn object_pg(
        &self,
        pool_id: u32,
        name: &str,
        key: Option<&str>,
        namespace: &str,
    ) -> Result<PgId, MapError> {
        let pool = self
            .pools
            .get(&pool_id)
            .ok_or(MapError::NoSuchPoolId(pool_id))?;
        Ok(pool.placement().object_pg(name, key, namespace))
    }

    /// Up and acting sets of a PG (see [`PgMapping`] for holes in erasure-coded pools).
    pub fn pg_mapping(&self, pg: PgId) -> Result<PgMapping, MapError> {
        let pool = self
            .pools
            .get(&pg.pool.0)
            .ok_or(MapError::NoSuchPoolId(pg.pool.0))?;
        let placement = pool.placement();
        let raw = placement.raw_osds(&self.crush, pg.seed, &self.reweights)?;
        let serves = |o: i32| o != ITEM_NONE && self.osds.contains_key(&o) && self.is_up(o);
        // Without OSDs that do not exist or are down: replicated pools close the gaps,
        // erasure-coded pools keep positions (holes are ITEM_NONE).
        let mut up = placement.up_osds(&raw, serves);
        if placement.erasure {
            up.resize(placement.size, ITEM_NONE);
        }
        let first = |set: &[i32]| set.iter().copied().find(|&o| o != ITEM_NONE).unwrap_or(-1);
        let up_primary = first(&up);
        // A temporary acting set, without its members that are down or gone since (holes in
        // their place for an erasure-coded pool); one with no member left is ignored.
        let temp: Vec<i32> = self
            .pg_temp
            .get(&pg)
            .map(|t| placement.up_osds(t, serves))
            .filter(|t| t.iter().any(|&o| o != ITEM_NONE))
            .unwrap_or_default();
        let acting_shards = if temp.is_empty() { up.clone() } else { temp };
        let acting_primary = first(&acting_shards);
        let osds_only =
            |set: &[i32]| -> Vec<i32> { set.iter().copied().filter(|&o| o != ITEM_NONE).collect() };
        if !placement.erasure {
            return Ok(PgMapping {
                up,
                up_primary,
                acting: acting_shards,
                acting_primary,
                up_shards: Vec::new(),
                acting_shards: Vec::new(),
            });
        }
        Ok(PgMapping {
            up: osds_only(&up),
            up_primary,
            acting: osds_only(&acting_shards),
            acting_primary,
            up_shards: up,
            acting_shards,
        })
    }

    /// Every PG of a pool.
    pub fn pool_pgs(&self, pool_id: u32) -> Result<impl Iterator<Item = PgId> + '_, MapError> {
        let pool = self
            .pools
            .get(&pool_id)
            .ok_or(MapError::NoSuchPoolId(pool_id))?;
        Ok((0..pool.pg_num).map(move |s| PgId::new(pool_id, s)))
    }

    /// CRUSH item id of an OSD's host bucket.
    pub fn host_of(&self, osd: i32) -> Option<ItemId> {
        self.crush.parents_of(osd).first().copied()
    }
}

fn check_sizes(size: u32, min_size: u32) -> Result<(), MapError> {
    if !(1..=10).contains(&size) {
        return Err(MapError::InvalidValue {
            field: "size",
            reason: format!("{size} is outside 1..=10"),
        });
    }
    if min_size == 0 || min_size > size {
        return Err(MapError::InvalidValue {
            field: "min_size",
            reason: format!("{min_size} must be between 1 and size ({size})"),
        });
    }
    Ok(())
}

/// An erasure-coded pool serves I/O with at least `k` shards (fewer cannot decode) and at most
/// `k+m` can be asked for.
fn check_ec_min_size(code: &Profile, min_size: u32) -> Result<(), MapError> {
    if !(code.k..=code.size()).contains(&min_size) {
        return Err(MapError::InvalidValue {
            field: "min_size",
            reason: format!(
                "{min_size} must be between k = {} and k+m = {} for an erasure-coded pool",
                code.k,
                code.size()
            ),
        });
    }
    Ok(())
}

/// A profile as Ceph prints one in messages: `{k=2,m=1,...}`.
fn profile_text(p: &Profile) -> String {
    let pairs: Vec<String> = p
        .to_pairs()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A map with `osds` OSDs created and booted (hosts `host0`..`host2`), CRUSH failure
    /// domain `domain`. Also used by the other modules' tests.
    pub(crate) fn cluster(osds: i32, domain: &str) -> OsdMap {
        let mut map = OsdMap::new("fsid-1", domain).unwrap();
        for i in 0..osds {
            let (id, inc) = map
                .propose_osd_create(&format!("uuid-{i}"), &format!("host{}", i % 3), WEIGHT_ONE)
                .unwrap();
            assert_eq!(id, i);
            map.apply(&inc.unwrap()).unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{}", 6800 + i).parse().unwrap();
            map.apply(&map.propose_osd_boot(id, addr).unwrap().unwrap())
                .unwrap();
        }
        map
    }

    #[test]
    fn builds_a_cluster_by_incrementals() {
        let mut map = cluster(6, "host");
        assert_eq!(map.epoch, 1 + 12);
        assert_eq!(map.num_up(), 6);
        assert_eq!(
            map.crush.bucket(map.host_of(4).unwrap()).unwrap().name,
            "host1"
        );
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "rbd".into(),
                pg_num: Some(64),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        assert_eq!(map.pools[&pool].min_size, 2);
        for pg in map.pool_pgs(pool).unwrap() {
            let m = map.pg_mapping(pg).unwrap();
            assert_eq!(m.up.len(), 3, "{pg}");
            let hosts: BTreeSet<_> = m.up.iter().map(|&o| map.host_of(o)).collect();
            assert_eq!(hosts.len(), 3, "replicas on distinct hosts");
            assert_eq!(m.acting, m.up);
            assert_eq!(m.acting_primary, m.up[0]);
        }
        // the same uuid gets the same id back
        assert_eq!(
            map.propose_osd_create("uuid-4", "host1", WEIGHT_ONE)
                .unwrap(),
            (4, None)
        );
    }

    #[test]
    fn self_managed_snapshot_ids_are_allocated_and_removed_per_pool() {
        let mut map = cluster(3, "host");
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "p".into(),
                pg_num: Some(8),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        assert_eq!(map.pools[&pool].snap_seq, 0);
        for want in 1..=3 {
            let (snap, inc) = map.propose_pool_snap_create("p").unwrap();
            assert_eq!(snap, want);
            map.apply(&inc).unwrap();
        }
        assert_eq!(map.pools[&pool].snap_seq, 3);
        let inc = map.propose_pool_snap_remove("p", 2).unwrap().unwrap();
        map.apply(&inc).unwrap();
        assert_eq!(map.pools[&pool].removed_snaps, BTreeSet::from([2]));
        // removing twice is a no-op; ids never allocated, and unknown pools, are refused
        assert!(map.propose_pool_snap_remove("p", 2).unwrap().is_none());
        assert!(map.propose_pool_snap_remove("p", 4).is_err());
        assert!(map.propose_pool_snap_remove("p", 0).is_err());
        assert!(map.propose_pool_snap_create("nope").is_err());
        // ids are never reused after a removal
        let (snap, _) = map.propose_pool_snap_create("p").unwrap();
        assert_eq!(snap, 4);
        // the map (and its incrementals) carry the fields
        let back = OsdMap::decode(&map.encode()).unwrap();
        assert_eq!(back.pools[&pool].removed_snaps, BTreeSet::from([2]));
        assert_eq!(back.pools[&pool].snap_seq, 3);
    }

    #[test]
    fn pg_temp_overrides_the_acting_set_until_removed() {
        let mut map = cluster(6, "host");
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "p".into(),
                pg_num: Some(8),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        let pg = PgId::new(pool, 3);
        let up = map.pg_mapping(pg).unwrap().up;
        let temp = vec![up[1], up[2]];
        map.apply(&map.propose_pg_temp(pg, &temp).unwrap().unwrap())
            .unwrap();
        let m = map.pg_mapping(pg).unwrap();
        assert_eq!((m.up.clone(), m.acting.clone()), (up.clone(), temp.clone()));
        assert_eq!(m.acting_primary, up[1]);
        assert!(
            map.propose_pg_temp(pg, &temp).unwrap().is_none(),
            "unchanged: no epoch"
        );
        // a member that goes down leaves the temporary acting set
        map.apply(&map.propose_osd_down(up[1]).unwrap().unwrap())
            .unwrap();
        assert_eq!(map.pg_mapping(pg).unwrap().acting, vec![up[2]]);
        // members must be up; the PG must exist
        assert!(map.propose_pg_temp(pg, &[up[1]]).is_err());
        assert!(map.propose_pg_temp(PgId::new(pool, 99), &[up[2]]).is_err());
        // empty removes it: the acting set is the up set again
        map.apply(&map.propose_pg_temp(pg, &[]).unwrap().unwrap())
            .unwrap();
        let m = map.pg_mapping(pg).unwrap();
        assert_eq!(m.acting, m.up);
        // a list equal to the up set stores nothing
        assert!(map.propose_pg_temp(pg, &m.up).unwrap().is_none());
    }

    #[test]
    fn down_osds_leave_the_up_set_and_out_osds_leave_crush() {
        let mut map = cluster(6, "host");
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "p".into(),
                pg_num: Some(32),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        map.apply(&map.propose_osd_down(2).unwrap().unwrap())
            .unwrap();
        for pg in map.pool_pgs(pool).unwrap() {
            let m = map.pg_mapping(pg).unwrap();
            assert!(!m.up.contains(&2));
            assert!(m.up.len() >= 2);
        }
        map.apply(&map.propose_osd_weight(2, 0).unwrap().unwrap())
            .unwrap();
        for pg in map.pool_pgs(pool).unwrap() {
            assert_eq!(
                map.pg_mapping(pg).unwrap().up.len(),
                3,
                "CRUSH remaps around an out OSD"
            );
        }
        assert!(map.propose_osd_weight(2, 0).unwrap().is_none(), "no-op");
    }

    #[test]
    fn single_host_clusters_use_osd_failure_domain() {
        let mut map = OsdMap::new("f", "osd").unwrap();
        for i in 0..3 {
            let (id, inc) = map
                .propose_osd_create(&format!("u{i}"), "localhost", WEIGHT_ONE)
                .unwrap();
            map.apply(&inc.unwrap()).unwrap();
            map.apply(
                &map.propose_osd_boot(id, "127.0.0.1:1".parse().unwrap())
                    .unwrap()
                    .unwrap(),
            )
            .unwrap();
        }
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "a".into(),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        for pg in map.pool_pgs(pool).unwrap() {
            assert_eq!(map.pg_mapping(pg).unwrap().up.len(), 3);
        }
    }

    #[test]
    fn decisions_refuse_bad_requests() {
        let mut map = cluster(3, "host");
        let spec = |name: &str| PoolSpec {
            name: name.into(),
            ..PoolSpec::default()
        };
        let (_, inc) = map.propose_pool_create(&spec("a")).unwrap();
        map.apply(&inc).unwrap();
        assert_eq!(
            map.propose_pool_create(&spec("a")).unwrap_err(),
            MapError::PoolExists("a".into())
        );
        assert!(map.propose_pool_create(&spec("has space")).is_err());
        assert!(
            map.propose_pool_create(&PoolSpec {
                pg_num: Some(0),
                ..spec("b")
            })
            .is_err()
        );
        assert!(
            map.propose_pool_create(&PoolSpec {
                size: Some(2),
                min_size: Some(3),
                ..spec("b")
            })
            .is_err()
        );
        assert!(
            map.propose_pool_create(&PoolSpec {
                crush_rule: Some("nope".into()),
                ..spec("b")
            })
            .is_err()
        );
        assert!(map.propose_pool_set("a", "size", "x").is_err());
        assert!(map.propose_pool_set("a", "colour", "1").is_err());
        assert!(map.propose_pool_set("zz", "size", "2").is_err());
        assert!(map.propose_pool_set("a", "size", "3").unwrap().is_none());
        assert!(
            map.propose_osd_remove(0).is_err(),
            "up OSDs cannot be removed"
        );
        assert!(
            map.propose_osd_boot(9, "127.0.0.1:1".parse().unwrap())
                .is_err()
        );
        // an incremental from the wrong epoch is refused and changes nothing
        let inc = map.propose_flag(ClusterFlag::NoOut, true).unwrap();
        let mut stale = inc.clone();
        stale.epoch += 1;
        let before = map.clone();
        assert!(matches!(map.apply(&stale), Err(MapError::EpochGap { .. })));
        assert_eq!(map, before);
        map.apply(&inc).unwrap();
        assert!(map.has_flag(ClusterFlag::NoOut));
        assert!(map.propose_flag(ClusterFlag::NoOut, true).is_none());
    }

    #[test]
    fn maps_and_incrementals_round_trip_through_encoding() {
        let mut map = cluster(4, "host");
        let (_, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "x".into(),
                ..PoolSpec::default()
            })
            .unwrap();
        let bytes = inc.encode();
        assert_eq!(Incremental::decode(&bytes).unwrap(), inc);
        map.apply(&inc).unwrap();
        let decoded = OsdMap::decode(&map.encode()).unwrap();
        assert_eq!(decoded, map);
        let mut bad = map.encode();
        bad[0] = 9;
        assert!(matches!(
            OsdMap::decode(&bad),
            Err(MapError::UnsupportedVersion { got: 9, .. })
        ));
        assert!(OsdMap::decode(&[]).is_err());
        assert!(OsdMap::decode(&[OSD_MAP_FORMAT, 1, 2, 3]).is_err());
    }

    #[test]
    fn removing_an_osd_removes_it_from_crush() {
        let mut map = cluster(4, "host");
        map.apply(&map.propose_osd_down(3).unwrap().unwrap())
            .unwrap();
        map.apply(&map.propose_osd_remove(3).unwrap()).unwrap();
        assert!(!map.osds.contains_key(&3));
        assert!(map.crush.device(3).is_none());
        let (id, _) = map.propose_osd_create("new", "host0", WEIGHT_ONE).unwrap();
        assert_eq!(id, 3, "ids are reused once free");
    }

    #[test]
    fn blocklist_fences_until_removed_or_expired() {
        let mut map = cluster(3, "host");
        assert!(!map.is_blocklisted("client.a.1", 0));
        let inc = map
            .propose_blocklist_add("client.a.1", None)
            .unwrap()
            .unwrap();
        map.apply(&Incremental::decode(&inc.encode()).unwrap())
            .unwrap();
        assert!(map.is_blocklisted("client.a.1", u64::MAX));
        assert!(
            map.propose_blocklist_add("client.a.1", None)
                .unwrap()
                .is_none()
        );
        assert!(map.propose_blocklist_add("bad name", None).is_err());
        let inc = map
            .propose_blocklist_add("client.b.2", Some(1_000))
            .unwrap()
            .unwrap();
        map.apply(&inc).unwrap();
        assert!(map.is_blocklisted("client.b.2", 999));
        assert!(!map.is_blocklisted("client.b.2", 1_000));
        assert_eq!(OsdMap::decode(&map.encode()).unwrap(), map);
        // Expiry removes only the entries that are due.
        assert!(map.propose_blocklist_expire(999).is_none());
        let inc = map.propose_blocklist_expire(1_000).unwrap();
        map.apply(&inc).unwrap();
        assert!(!map.blocklist.contains_key("client.b.2"));
        assert!(map.blocklist.contains_key("client.a.1"));
        let inc = map.propose_blocklist_rm("client.a.1").unwrap();
        map.apply(&inc).unwrap();
        assert!(map.blocklist.is_empty());
        assert!(map.propose_blocklist_rm("client.a.1").is_none());
    }

    #[test]
    fn format_1_maps_still_decode() {
        let map = cluster(3, "host");
        let v1 = OsdMapWireV1 {
            fsid: map.fsid.clone(),
            epoch: map.epoch,
            flags: map.flags.clone(),
            osds: map.osds.clone(),
            pools: map.pools.clone(),
            pool_max: map.pool_max,
            crush: map.crush.to_text(),
            pg_temp: map.pg_temp.clone(),
            ec_profiles: map.ec_profiles.clone(),
        };
        let mut bytes = vec![1u8];
        bytes.extend(postcard::to_stdvec(&v1).unwrap());
        let decoded = OsdMap::decode(&bytes).unwrap();
        assert_eq!(decoded, map);
        assert!(decoded.blocklist.is_empty());
    }
}

//! The monitor daemon: `mkfs` of a data directory, and [`Monitor`], which runs openraft over
//! the durable [`crate::store`], serves the protocol over kelp-msgr, pushes map updates to
//! subscribers and, on the leader, watches OSD sessions.
//!
//! Request handling (see docs/MONITOR.md for the full contract):
//! - `MON_COMMAND`: mutations go through the Raft log; read-only commands are answered by the
//!   leader from its state after `ensure_linearizable`. A follower *forwards* the command to
//!   the leader once and relays the reply; a command that was itself forwarded (it comes from a
//!   `mon.*` entity) is never forwarded again: it gets `NotLeader { leader }`.
//! - `MON_SUBSCRIBE`: answered by any monitor from its own applied state; later epochs are
//!   pushed as `MON_MAP_UPDATE` on the same connection, in order, by one pusher task.
//! - `MON_OSD_BOOT`: only the leader accepts it (followers answer `NotLeader`), only from the
//!   entity `osd.<id>`, because the leader watches the OSD's session on that connection.
//! - `MON_OSD_STATS`: OSD statistics, kept by the leader in memory only ([`crate::pgmap`]);
//!   followers answer `NotLeader`. `MonCommand::PgStats` is answered by the leader from them
//!   (followers forward it); the leader's stats task sets and clears the map's `full` flag.
//! - `MON_OSD_FAILURE`: heartbeat failure reports, leader only, from `osd.<reporter>`; kept in
//!   memory by [`Liveness`] (see `liveness.rs`), which decides when an OSD is marked down.
//!
//! Invariants: only the leader proposes `Init`, `MarkDown` and `MarkOut`, and each carries a
//! guard (`up_from`, `down_at`) so a stale proposal is a no-op when applied.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use kelp_config::keys;
use kelp_maps::OsdMap;
use kelp_msgr::{
    Dispatcher, KeyLookup, Keyring, Messenger, Peer, RemoteError, Request, Response, Secret,
};
use kelp_proto::{
    LogEntry, LogLevel, MapUpdate, MgrInfo, MonCommand, MonReply, OsdBoot, OsdFailure,
    OsdStatsReport, ProgressItem, StatsAck, Subscribe, msg_type,
};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cluster_log::LogView;
use crate::error::MonError;
use crate::liveness::{Liveness, LivenessParams};
use crate::mds_liveness::MdsLiveness;
use crate::metrics::ServiceMap;
use crate::mgrmap::{MgrEvent, MgrTracker};
use crate::network::{self, MsgrNetwork, RaftRpc, RaftRpcReply};
use crate::pgmap::{FullRatios, PgMap, ratio_ppm};
use crate::state::{InitSpec, MonEntry, MonInfo};
use crate::store::{self, LogStore, Shared, StateMachine};
use crate::{NodeId, TypeConfig};

/// Auth entities `dashboard.<role>.<user>` are dashboard logins (see docs/MANAGER.md).
pub const DASHBOARD_ENTITY_PREFIX: &str = "dashboard.";

/// Format version of `DIR/mon.json`.
pub const MON_META_FORMAT: u8 = 1;

/// Error codes of `RemoteError` replies from the monitor (below the messenger's reserved range).
pub mod code {
    /// The request's meta could not be decoded.
    pub const BAD_REQUEST: u32 = 0x0100;
    /// The authenticated entity may not send this request.
    pub const FORBIDDEN: u32 = 0x0101;
    /// Unknown msg_type for a monitor.
    pub const UNKNOWN_TYPE: u32 = 0x0102;
    /// The monitor is starting or stopping.
    pub const UNAVAILABLE: u32 = 0x0103;
}

/// What `kelp mon mkfs` records in `DIR/mon.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MonMeta {
    format: u8,
    name: String,
    fsid: String,
    failure_domain: String,
    monmap: Vec<MonInfo>,
}

/// Inputs of [`mkfs`].
#[derive(Debug, Clone)]
pub struct MkfsOptions {
    /// This monitor's name (`a`); its entity is `mon.a`.
    pub name: String,
    pub data: PathBuf,
    pub fsid: String,
    /// Every monitor of the cluster, this one included.
    pub monmap: Vec<MonInfo>,
    /// Initial keys: `mon.<name>` of every monitor and `client.admin` at least.
    pub keyring: Keyring,
    /// `host` or `osd`.
    pub failure_domain: String,
}

fn valid_mon_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Initialises a monitor's data directory: `mon.json` (identity, fsid, monitor map), `keyring`
/// (mode 0600) and an empty `mon.redb`. Refuses a directory that already holds a monitor.
pub fn mkfs(opts: &MkfsOptions) -> Result<(), MonError> {
    let mut names = HashSet::new();
    for m in &opts.monmap {
        if !valid_mon_name(&m.name) {
            return Err(MonError::InvalidSpec(format!(
                "monitor name '{}' must be 1-64 letters, digits or '-'",
                m.name
            )));
        }
        if !names.insert(m.name.clone()) {
            return Err(MonError::InvalidSpec(format!(
                "monitor '{}' listed twice",
                m.name
            )));
        }
        if opts
            .keyring
            .secret_for(&format!("mon.{}", m.name))
            .is_none()
        {
            return Err(MonError::InvalidSpec(format!(
                "the keyring has no key for mon.{}",
                m.name
            )));
        }
    }
    if !names.contains(&opts.name) {
        return Err(MonError::InvalidSpec(format!(
            "this monitor ('{}') is not in the monitor map",
            opts.name
        )));
    }
    if opts.keyring.secret_for("client.admin").is_none() {
        return Err(MonError::InvalidSpec(
            "the keyring has no key for client.admin".into(),
        ));
    }
    if opts.fsid.trim().is_empty() {
        return Err(MonError::InvalidSpec("the fsid must not be empty".into()));
    }
    if opts.failure_domain != "host" && opts.failure_domain != "osd" {
        return Err(MonError::InvalidSpec(format!(
            "failure domain '{}' must be host or osd",
            opts.failure_domain
        )));
    }
    OsdMap::new(&opts.fsid, &opts.failure_domain)?;
    let dir = &opts.data;
    std::fs::create_dir_all(dir).map_err(|e| MonError::data_dir(dir, e))?;
    let meta_path = dir.join("mon.json");
    if meta_path.exists() {
        return Err(MonError::data_dir(
            dir,
            "already holds a monitor (mon.json exists)",
        ));
    }
    opts.keyring.save(dir.join("keyring"))?;
    store::open_db(&dir.join("mon.redb"))?;
    let mut monmap = opts.monmap.clone();
    monmap.sort();
    let meta = MonMeta {
        format: MON_META_FORMAT,
        name: opts.name.clone(),
        fsid: opts.fsid.clone(),
        failure_domain: opts.failure_domain.clone(),
        monmap,
    };
    let text = serde_json::to_string_pretty(&meta).expect("plain struct serialises");
    let tmp = dir.join("mon.json.tmp");
    write_synced(&tmp, text.as_bytes()).map_err(|e| MonError::data_dir(&tmp, e))?;
    std::fs::rename(&tmp, &meta_path).map_err(|e| MonError::data_dir(&meta_path, e))?;
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The name of the monitor whose data directory `dir` is (from its `mon.json`).
pub fn data_dir_name(dir: &Path) -> Result<String, MonError> {
    Ok(load_meta(dir)?.name)
}

fn load_meta(dir: &Path) -> Result<MonMeta, MonError> {
    let path = dir.join("mon.json");
    let text = std::fs::read_to_string(&path).map_err(|e| MonError::data_dir(&path, e))?;
    let meta: MonMeta = serde_json::from_str(&text).map_err(|e| MonError::Corrupt {
        what: "mon.json",
        reason: e.to_string(),
    })?;
    if meta.format != MON_META_FORMAT {
        return Err(MonError::UnsupportedFormat {
            what: "mon.json",
            got: meta.format,
            max: MON_META_FORMAT,
        });
    }
    Ok(meta)
}

/// Local tunables of one monitor daemon (the cluster-wide ones are in the central config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonConfig {
    /// Raft heartbeat interval, ms. Default 150.
    pub heartbeat_interval_ms: u64,
    /// Raft election timeout range, ms. Default 750..1500.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot (and purge the log before it) every this many entries. Default 500.
    pub snapshot_every: u64,
    /// Period of the leader's housekeeping (Init, OSD session and down-out checks), ms.
    /// Default 250.
    pub tick_ms: u64,
    /// Deadline of a command forwarded to the leader, ms. Default 10000.
    pub forward_timeout_ms: u64,
}

impl Default for MonConfig {
    fn default() -> Self {
        MonConfig {
            heartbeat_interval_ms: 150,
            election_timeout_min_ms: 750,
            election_timeout_max_ms: 1500,
            snapshot_every: 500,
            tick_ms: 250,
            forward_timeout_ms: 10_000,
        }
    }
}

/// The messenger's key lookup on a monitor: the replicated auth table once the cluster state
/// exists, the mkfs keyring before (so the monitors can reach each other to create it).
struct MonKeys {
    shared: Arc<Shared>,
    bootstrap: Keyring,
}

impl KeyLookup for MonKeys {
    fn secret_for(&self, entity: &str) -> Option<Secret> {
        // Dashboard login keys are kept in the auth table but open only the dashboard: they
        // never authenticate a session with the monitors.
        if entity.starts_with(DASHBOARD_ENTITY_PREFIX) {
            return None;
        }
        let a = self.shared.read();
        if a.state.is_initialized() {
            a.state
                .secret(entity)
                .and_then(|s| Secret::from_base64(s).ok())
        } else {
            self.bootstrap.secret_for(entity)
        }
    }
}

struct Subscriber {
    peer: Peer,
    /// The last epoch this subscriber has been sent (or had).
    sent: u32,
}

struct Inner {
    name: String,
    node_id: NodeId,
    monmap: Vec<MonInfo>,
    init: InitSpec,
    raft: Raft<TypeConfig>,
    msgr: Messenger,
    shared: Arc<Shared>,
    subscribers: Mutex<Vec<Subscriber>>,
    config: MonConfig,
    /// The OSDs' latest statistics (leader only; never replicated).
    pgmap: Mutex<PgMap>,
    /// Origin of the monotonic clock the statistics are timed with.
    clock: Instant,
    /// The leader's failure reports and timers (empty on followers).
    liveness: Mutex<Liveness>,
    /// The leader's MDS beacon timers (empty on followers).
    mds_liveness: Mutex<MdsLiveness>,
    /// `kelp_mon_commands` (`crate::metrics`).
    commands: kelp_metrics::CounterVec,
    /// The leader's service map (daemons' beacons; empty on followers).
    service_map: Mutex<ServiceMap>,
    /// This monitor's own endpoints for its beacon (`"metrics"` → URL); `None`: no beacon.
    service_addrs: Mutex<Option<std::collections::BTreeMap<String, String>>>,
    // Manager, progress and cluster log (leader only, in memory).
    /// The manager map, from the managers' beacons.
    mgr: Mutex<MgrTracker>,
    /// The active manager's last progress report.
    progress: Mutex<Vec<ProgressItem>>,
    /// Cluster-log events seen outside the log loop (manager failovers), to be proposed.
    log_pending: Mutex<Vec<(LogLevel, String)>>,
}

/// A running monitor.
pub struct Monitor {
    inner: Arc<Inner>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    /// Kept to close the database ourselves on shutdown: once Raft's storage tasks have dropped
    /// their handles, dropping this last one closes the file (redb writes its allocator state
    /// and releases the lock), so the data directory can be reopened as soon as `shutdown`
    /// returns.
    db: Arc<redb::Database>,
}

/// Forwards the messenger's callbacks to the monitor once it exists (the messenger must be
/// built before Raft, which needs it for its network).
struct MonDispatcher {
    inner: OnceLock<Weak<Inner>>,
}

fn node_id_of(monmap: &[MonInfo], name: &str) -> Option<NodeId> {
    monmap
        .iter()
        .position(|m| m.name == name)
        .map(|i| i as NodeId + 1)
}

impl Monitor {
    /// Opens the data directory made by [`mkfs`], binds the monitor's address from the monitor
    /// map and joins the Raft group. The monitor with the lowest name initialises the group's
    /// membership on a fresh cluster.
    pub async fn start(data: &Path, config: MonConfig) -> Result<Monitor, MonError> {
        let meta = load_meta(data)?;
        let keyring = Keyring::load(data.join("keyring"))?;
        let me = meta
            .monmap
            .iter()
            .find(|m| m.name == meta.name)
            .cloned()
            .ok_or_else(|| MonError::InvalidSpec("this monitor is not in its monmap".into()))?;
        let node_id = node_id_of(&meta.monmap, &meta.name).unwrap_or(1);
        let entity = format!("mon.{}", meta.name);
        let secret = keyring
            .secret_for(&entity)
            .ok_or_else(|| MonError::InvalidSpec(format!("no key for {entity} in the keyring")))?;
        let init = InitSpec {
            fsid: meta.fsid.clone(),
            failure_domain: meta.failure_domain.clone(),
            keys: keyring
                .entities()
                .filter_map(|e| {
                    keyring
                        .secret_for(e)
                        .map(|s| (e.to_string(), s.to_base64()))
                })
                .collect(),
            monmap: meta.monmap.clone(),
        };

        let db = store::open_db(&data.join("mon.redb"))?;
        let db_handle = db.clone();
        let log = LogStore::new(db.clone());
        let sm = StateMachine::open(db)?;
        let shared = sm.shared();

        let dispatcher = Arc::new(MonDispatcher {
            inner: OnceLock::new(),
        });
        let msgr = Messenger::builder(entity)
            .secret(secret)
            .keys(Arc::new(MonKeys {
                shared: shared.clone(),
                bootstrap: keyring,
            }))
            .dispatcher(dispatcher.clone())
            .build()?;
        let addr = msgr.bind(me.addr).await?;

        let raft_config = openraft::Config {
            cluster_name: format!("kelp-{}", meta.fsid),
            heartbeat_interval: config.heartbeat_interval_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.snapshot_every,
            ..Default::default()
        }
        .validate()
        .map_err(|e| MonError::Raft(e.to_string()))?;
        let raft = Raft::new(
            node_id,
            Arc::new(raft_config),
            MsgrNetwork { msgr: msgr.clone() },
            log,
            sm,
        )
        .await
        .map_err(|e| MonError::Raft(e.to_string()))?;

        let inner = Arc::new(Inner {
            name: meta.name.clone(),
            node_id,
            monmap: meta.monmap.clone(),
            init,
            raft: raft.clone(),
            msgr: msgr.clone(),
            shared,
            subscribers: Mutex::new(Vec::new()),
            config,
            pgmap: Mutex::new(PgMap::default()),
            clock: Instant::now(),
            liveness: Mutex::new(Liveness::default()),
            mds_liveness: Mutex::new(MdsLiveness::default()),
            commands: kelp_metrics::CounterVec::new(&crate::metrics::METRICS[0]),
            service_map: Mutex::new(ServiceMap::default()),
            service_addrs: Mutex::new(Default::default()),
            mgr: Mutex::new(MgrTracker::default()),
            progress: Mutex::new(Vec::new()),
            log_pending: Mutex::new(Vec::new()),
        });
        let _ = dispatcher.inner.set(Arc::downgrade(&inner));

        let lowest = meta.monmap.iter().map(|m| &m.name).min();
        if lowest == Some(&meta.name)
            && !raft
                .is_initialized()
                .await
                .map_err(|e| MonError::Raft(e.to_string()))?
        {
            let members: std::collections::BTreeMap<NodeId, BasicNode> = meta
                .monmap
                .iter()
                .enumerate()
                .map(|(i, m)| (i as NodeId + 1, BasicNode::new(m.addr.to_string())))
                .collect();
            info!(members = members.len(), "initialising the monitor group");
            if let Err(e) = raft.initialize(members).await {
                // Another run got there first (the log is not empty): nothing to do.
                debug!(error = %e, "initialize refused");
            }
        }
        info!(mon = %meta.name, %addr, node_id, "monitor started");

        let tasks = vec![
            tokio::spawn(pusher(inner.clone())),
            tokio::spawn(leader_loop(inner.clone())),
            tokio::spawn(stats_loop(inner.clone())),
            tokio::spawn(beacon_loop(inner.clone())),
            tokio::spawn(cluster_log_loop(inner.clone())),
        ];
        Ok(Monitor {
            inner,
            addr,
            tasks,
            db: db_handle,
        })
    }

    /// The address the monitor listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// This monitor's copy of the OSD map (`None` before the cluster state exists).
    pub fn osdmap(&self) -> Option<OsdMap> {
        self.inner.shared.read().state.osdmap().cloned()
    }

    /// This monitor's copy of the whole replicated state, encoded (for comparing monitors).
    pub fn state_bytes(&self) -> Vec<u8> {
        self.inner.shared.read().state.encode()
    }

    /// The leader's name, as this monitor knows it.
    pub fn leader(&self) -> Option<String> {
        self.inner.leader_name()
    }

    pub fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// Exports this monitor's metrics into `reg` (`crate::metrics`): commands received, its
    /// Raft and map state and, on the leader, the cluster's.
    pub fn register_metrics(&self, reg: &mut kelp_metrics::Registry) {
        reg.add_counter_vec(&self.inner.commands);
        let msgr = self.inner.msgr.clone();
        reg.register_msgr(move || kelp_msgr::metrics_counts(std::slice::from_ref(&msgr)));
        let weak = Arc::downgrade(&self.inner);
        reg.snapshot(crate::metrics::snapshot_metrics(), move |s| {
            if let Some(inner) = weak.upgrade() {
                inner.metrics_snapshot(s);
            }
        });
    }

    /// Sets the endpoints this monitor announces in its service-map beacon (`"metrics"` →
    /// URL); the beacon is sent every [`BEACON_INTERVAL`] once set.
    pub fn set_service_addrs(&self, addrs: std::collections::BTreeMap<String, String>) {
        *self
            .inner
            .service_addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(addrs);
    }

    /// Stops serving, stops Raft and closes every connection.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Err(e) = self.inner.raft.shutdown().await {
            warn!(error = %e, "raft shutdown");
        }
        self.inner.msgr.shutdown();
        let name = self.inner.name.clone();
        let db = self.db;
        for t in self.tasks {
            let _ = t.await;
        }
        drop(self.inner);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&db) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if Arc::strong_count(&db) > 1 {
            warn!(mon = %name, "database still in use after shutdown");
        }
        // The last handle: closing writes and fsyncs, so do it off the async workers.
        let _ = tokio::task::spawn_blocking(move || drop(db)).await;
        info!(mon = %name, "monitor stopped");
    }
}

fn encode_reply(r: &MonReply) -> Response {
    Response::new(msg_type::MON_COMMAND, kelp_proto::encode(r), Bytes::new())
}

impl Inner {
    fn liveness(&self) -> std::sync::MutexGuard<'_, Liveness> {
        self.liveness.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mds_liveness(&self) -> std::sync::MutexGuard<'_, MdsLiveness> {
        self.mds_liveness.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A heartbeat failure report (or its withdrawal) from `osd.<reporter>`. Leader only.
    fn failure_report(&self, f: OsdFailure, from: &Peer) -> MonReply {
        if from.entity() != format!("osd.{}", f.reporter) {
            return MonReply::Error {
                message: format!(
                    "a failure report by osd.{} must come from entity osd.{} (not {})",
                    f.reporter,
                    f.reporter,
                    from.entity()
                ),
            };
        }
        if !self.is_leader() {
            return self.not_leader();
        }
        let a = self.shared.read();
        let Some(map) = a.state.osdmap() else {
            return MonReply::Error {
                message: MonError::NotInitialized.to_string(),
            };
        };
        let outcome = self.liveness().report(map, &f, Instant::now());
        if f.alive {
            debug!(
                reporter = f.reporter,
                target = f.target,
                "failure report withdrawn"
            );
        } else {
            info!(
                reporter = f.reporter,
                target = f.target,
                failed_for_ms = f.failed_for_ms,
                ?outcome,
                "failure report"
            );
        }
        MonReply::Done { epoch: map.epoch }
    }

    fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    fn leader_id(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    fn leader_name(&self) -> Option<String> {
        let id = self.leader_id()?;
        self.monmap
            .get((id as usize).checked_sub(1)?)
            .map(|m| m.name.clone())
    }

    fn leader_addr(&self) -> Option<SocketAddr> {
        let id = self.leader_id()?;
        if id == self.node_id {
            return None;
        }
        self.monmap
            .get((id as usize).checked_sub(1)?)
            .map(|m| m.addr)
    }

    fn not_leader(&self) -> MonReply {
        MonReply::NotLeader {
            leader: self.leader_addr(),
        }
    }

    async fn command(&self, cmd: MonCommand, from: &Peer) -> MonReply {
        let forwarded = from.entity().starts_with("mon.");
        if let Some(daemon) = beacon_daemon(&cmd)
            && !may_speak_for(from.entity(), &daemon)
        {
            return MonReply::Error {
                message: format!(
                    "{} may not send beacons or reports for {daemon}",
                    from.entity()
                ),
            };
        }
        self.commands
            .with(&[&crate::metrics::command_name(&cmd)])
            .inc();
        match &cmd {
            MonCommand::ServiceBeacon { .. } | MonCommand::ServiceMap => {
                if self.is_leader() {
                    self.service_command(&cmd)
                } else {
                    self.forward(cmd, forwarded).await
                }
            }
            MonCommand::Status
            | MonCommand::ConfigDump
            | MonCommand::AuthList
            | MonCommand::AuthGet { .. }
            | MonCommand::PgRecordGet { .. }
            | MonCommand::EcProfileGet { .. }
            | MonCommand::EcProfileLs
            | MonCommand::BlocklistLs
            | MonCommand::FsMapGet
            | MonCommand::LogLast { .. } => {
                if self.is_leader() && self.raft.ensure_linearizable().await.is_ok() {
                    self.read_only(&cmd)
                } else {
                    self.forward(cmd, forwarded).await
                }
            }
            MonCommand::PgStats => {
                if self.is_leader() {
                    self.pg_stats()
                } else {
                    self.forward(cmd, forwarded).await
                }
            }
            MonCommand::OsdPerf => {
                if self.is_leader() {
                    self.osd_perf()
                } else {
                    self.forward(cmd, forwarded).await
                }
            }
            MonCommand::MgrBeacon { .. }
            | MonCommand::MgrStat
            | MonCommand::ProgressReport { .. }
            | MonCommand::ProgressGet => {
                if self.is_leader() {
                    self.mgr_command(cmd)
                } else {
                    self.forward(cmd, forwarded).await
                }
            }
            MonCommand::LogAppend { entries } => {
                let now = unix_ms();
                let entries = entries
                    .iter()
                    .map(|e| LogEntry {
                        stamp_ms: if e.stamp_ms == 0 { now } else { e.stamp_ms },
                        ..e.clone()
                    })
                    .collect();
                self.write(MonEntry::ClusterLog(entries), cmd, forwarded)
                    .await
            }
            MonCommand::BlocklistAdd {
                instance,
                expire_secs,
            } => {
                // The expiry becomes a wall-clock time here, on the leader (applying the log
                // entry reads no clock).
                let entry = MonEntry::BlocklistAdd {
                    instance: instance.clone(),
                    until_ms: expire_secs.map(|s| unix_ms().saturating_add(s.saturating_mul(1000))),
                };
                self.write(entry, cmd, forwarded).await
            }
            MonCommand::MdsBeacon(b) => {
                if !self.is_leader() {
                    return self.forward(cmd, forwarded).await;
                }
                self.mds_liveness()
                    .beacon(&b.name, &b.instance, Instant::now());
                // Most beacons change nothing: answer them from the map without the log.
                let now_ms = unix_ms();
                let (epoch, mut fsmap) = {
                    let a = self.shared.read();
                    (a.state.fsmap().epoch, a.state.fsmap().clone())
                };
                match fsmap.mds_beacon(b, now_ms) {
                    Err(e) => MonReply::Error {
                        message: e.to_string(),
                    },
                    Ok((assignment, actions)) if fsmap.epoch == epoch && actions.is_empty() => {
                        MonReply::MdsAssignment(assignment)
                    }
                    Ok(_) => {
                        let entry = MonEntry::Fs {
                            cmd: cmd.clone(),
                            now_ms,
                        };
                        self.write(entry, cmd, forwarded).await
                    }
                }
            }
            MonCommand::FsNew { .. }
            | MonCommand::FsRm { .. }
            | MonCommand::FsSet { .. }
            | MonCommand::FsAddDataPool { .. }
            | MonCommand::FsRmDataPool { .. }
            | MonCommand::FsFail { .. }
            | MonCommand::MdsFail { .. } => {
                // The leader's clock goes into the entry (`since_ms`, blocklist expiries).
                let entry = MonEntry::Fs {
                    cmd: cmd.clone(),
                    now_ms: unix_ms(),
                };
                self.write(entry, cmd, forwarded).await
            }
            MonCommand::AuthGetOrCreate { entity } => {
                let entry = MonEntry::AuthGetOrCreate {
                    entity: entity.clone(),
                    secret: kelp_msgr::generate_secret().to_base64(),
                };
                self.write(entry, cmd, forwarded).await
            }
            _ => {
                self.write(MonEntry::Command(cmd.clone()), cmd, forwarded)
                    .await
            }
        }
    }

    fn read_only(&self, cmd: &MonCommand) -> MonReply {
        let reply = self.shared.read().state.read_only(cmd);
        match reply {
            MonReply::Status(mut s) => {
                let m = self.raft.metrics().borrow().clone();
                let last = m.last_log_index;
                let repl = m.replication.clone().unwrap_or_default();
                for (i, (_, in_quorum)) in s.monitors.iter_mut().enumerate() {
                    let id = i as NodeId + 1;
                    *in_quorum = id == self.node_id
                        || repl
                            .get(&id)
                            .and_then(|x| x.as_ref())
                            .is_some_and(|l| Some(l.index) == last);
                }
                s.leader = self.leader_name();
                MonReply::Status(s)
            }
            other => other,
        }
    }

    /// Proposes `entry`; on a follower, forwards `cmd` to the leader instead.
    async fn write(&self, entry: MonEntry, cmd: MonCommand, forwarded: bool) -> MonReply {
        match self.raft.client_write(entry).await {
            Ok(resp) => resp.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                self.forward(cmd, forwarded).await
            }
            Err(e) => MonReply::Error {
                message: format!("raft: {e}"),
            },
        }
    }

    async fn forward(&self, cmd: MonCommand, forwarded: bool) -> MonReply {
        let Some(addr) = self.leader_addr().filter(|_| !forwarded) else {
            return self.not_leader();
        };
        let timeout = Duration::from_millis(self.config.forward_timeout_ms);
        let conn = self.msgr.connection(addr);
        match conn
            .call(
                msg_type::MON_COMMAND,
                kelp_proto::encode(&cmd),
                Bytes::new(),
                timeout,
            )
            .await
        {
            Ok(resp) => {
                kelp_proto::decode(&resp.meta, "MonReply").unwrap_or_else(|e| MonReply::Error {
                    message: format!("bad reply from the leader: {e}"),
                })
            }
            Err(e) => {
                debug!(error = %e, "forwarding to the leader failed");
                self.not_leader()
            }
        }
    }

    async fn boot(&self, boot: OsdBoot, from: &Peer) -> MonReply {
        if from.entity() != format!("osd.{}", boot.id) {
            return MonReply::Error {
                message: format!(
                    "the boot of osd.{} must come from entity osd.{} (not {})",
                    boot.id,
                    boot.id,
                    from.entity()
                ),
            };
        }
        if !self.is_leader() {
            return self.not_leader();
        }
        match self.raft.client_write(MonEntry::OsdBoot(boot)).await {
            Ok(resp) => resp.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => self.not_leader(),
            Err(e) => MonReply::Error {
                message: format!("raft: {e}"),
            },
        }
    }

    /// `ServiceBeacon` and `ServiceMap` (leader only, in memory).
    fn service_command(&self, cmd: &MonCommand) -> MonReply {
        let mut sm = self.service_map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match cmd {
            MonCommand::ServiceBeacon {
                name,
                kind,
                addrs,
                version,
            } => {
                sm.beacon(name, kind, addrs.clone(), version, now);
                MonReply::Done {
                    epoch: self.shared.read().state.epoch(),
                }
            }
            _ => MonReply::ServiceMap(sm.entries(now)),
        }
    }

    /// The scrape-time metrics: this monitor's own, and the cluster's on the leader. Takes
    /// the state's read lock and the statistics lock briefly (as `kelp status` does).
    fn metrics_snapshot(&self, s: &mut kelp_metrics::Snapshot) {
        let leader = self.is_leader();
        let (term, applied) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.last_applied.map(|l| l.index).unwrap_or(0))
        };
        let a = self.shared.read();
        crate::metrics::mon_snapshot(s, leader, term, applied, a.state.epoch());
        if !leader {
            return;
        }
        let Some(map) = a.state.osdmap() else {
            return;
        };
        let ratios = full_ratios(&a.state);
        let stale_after = stale_after(&a.state);
        let digest = {
            let mut pm = self.pgmap.lock().unwrap_or_else(|p| p.into_inner());
            pm.prune(map);
            pm.digest(map, &ratios, self.now(), stale_after)
        };
        crate::metrics::cluster_snapshot(s, map, &digest, a.state.fsmap());
        self.service_map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .snapshot(s, Instant::now());
    }

    fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    fn mgr_tracker(&self) -> std::sync::MutexGuard<'_, MgrTracker> {
        self.mgr.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mgr_grace(&self) -> Duration {
        let secs = self
            .shared
            .read()
            .state
            .config_value("mon", keys::MGR_BEACON_GRACE.name)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(keys::MGR_BEACON_GRACE.default.as_f64());
        Duration::from_secs_f64(secs.max(0.1))
    }

    fn note_mgr_events(&self, events: Vec<MgrEvent>) {
        if events.is_empty() {
            return;
        }
        let mut pending = self.log_pending.lock().unwrap_or_else(|p| p.into_inner());
        for e in events {
            pending.push(match e {
                MgrEvent::Active {
                    name,
                    previous: Some(prev),
                } => (
                    LogLevel::Warn,
                    format!("Manager daemon {prev} is unresponsive, replacing it with standby daemon {name}"),
                ),
                MgrEvent::Active {
                    name,
                    previous: None,
                } => (LogLevel::Info, format!("Manager daemon {name} is now available")),
                MgrEvent::StandbyGone { name } => (
                    LogLevel::Info,
                    format!("Standby manager daemon {name} is unresponsive"),
                ),
            });
        }
    }

    /// The manager map, beacons and progress reports (leader only, in memory).
    fn mgr_command(&self, cmd: MonCommand) -> MonReply {
        match cmd {
            MonCommand::MgrBeacon {
                name,
                dashboard_url,
                instance,
            } => {
                let grace = self.mgr_grace();
                let (active, events, map) = {
                    let mut t = self.mgr_tracker();
                    let (active, events) = t.beacon(
                        MgrInfo {
                            name,
                            dashboard_url,
                            instance,
                        },
                        Instant::now(),
                        grace,
                    );
                    (active, events, t.map())
                };
                self.note_mgr_events(events);
                MonReply::MgrBeacon { active, map }
            }
            MonCommand::MgrStat => MonReply::MgrMap(self.mgr_tracker().map()),
            MonCommand::ProgressReport { mgr, items } => {
                if !self.mgr_tracker().is_active(&mgr) {
                    return MonReply::Error {
                        message: format!("mgr.{mgr} is not the active manager"),
                    };
                }
                *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = items;
                MonReply::Done {
                    epoch: self.shared.read().state.epoch(),
                }
            }
            MonCommand::ProgressGet => MonReply::Progress(
                self.progress
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            ),
            other => MonReply::Error {
                message: format!("{other:?} is not a manager command"),
            },
        }
    }

    /// The digest of the OSDs' latest statistics against the current map.
    fn pg_stats(&self) -> MonReply {
        let a = self.shared.read();
        let Some(map) = a.state.osdmap() else {
            return MonReply::Error {
                message: "the cluster state is not initialised yet".into(),
            };
        };
        let ratios = full_ratios(&a.state);
        let stale_after = stale_after(&a.state);
        let mut pm = self.pgmap.lock().unwrap_or_else(|p| p.into_inner());
        pm.prune(map);
        MonReply::PgStats(Box::new(pm.digest(map, &ratios, self.now(), stale_after)))
    }

    /// The up OSDs' recent write latencies, from their latest reports (`kelp osd perf`).
    fn osd_perf(&self) -> MonReply {
        let a = self.shared.read();
        let mut pm = self.pgmap.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(map) = a.state.osdmap() {
            pm.prune(map);
        }
        MonReply::OsdPerf(pm.perf())
    }

    /// Takes an OSD's statistics (leader only) and answers with its settings.
    fn osd_stats(&self, report: OsdStatsReport, from: &Peer) -> MonReply {
        if from.entity() != format!("osd.{}", report.osd) {
            return MonReply::Error {
                message: format!(
                    "the stats of osd.{} must come from entity osd.{} (not {})",
                    report.osd,
                    report.osd,
                    from.entity()
                ),
            };
        }
        if !self.is_leader() {
            return self.not_leader();
        }
        let a = self.shared.read();
        let who = format!("osd.{}", report.osd);
        let interval = a
            .state
            .config_value(&who, keys::OSD_STATS_INTERVAL.name)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(keys::OSD_STATS_INTERVAL.default.as_f64());
        let ack = StatsAck {
            interval_ms: (interval * 1000.0) as u64,
            full_ratio_ppm: full_ratios(&a.state).full_ppm,
        };
        let up = a
            .state
            .osdmap()
            .and_then(|m| m.osds.get(&report.osd))
            .is_some_and(|o| o.up);
        drop(a);
        // A report from an OSD the map has down (it is re-booting) is not kept: its PGs are
        // not its to report until it is up again.
        if up {
            let now = self.now();
            self.pgmap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .ingest(report, now);
        }
        MonReply::StatsAck(ack)
    }

    fn subscribe(&self, peer: Peer, have: u32) -> MapUpdate {
        let a = self.shared.read();
        let update = a.state.catch_up(have);
        let sent = a.state.epoch().max(have);
        let mut subs = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| !s.peer.is_closed() && !same_peer(&s.peer, &peer));
        subs.push(Subscriber { peer, sent });
        update
    }

    async fn raft_rpc(&self, rpc: RaftRpc) -> RaftRpcReply {
        match rpc {
            RaftRpc::AppendEntries(r) => {
                RaftRpcReply::AppendEntries(self.raft.append_entries(r).await)
            }
            RaftRpc::Vote(r) => RaftRpcReply::Vote(self.raft.vote(r).await),
            RaftRpc::InstallSnapshot(r) => {
                RaftRpcReply::InstallSnapshot(self.raft.install_snapshot(r).await)
            }
        }
    }
}

/// Wall-clock time, unix ms (blocklist expiries).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn same_peer(a: &Peer, b: &Peer) -> bool {
    a.addr() == b.addr() && a.entity() == b.entity()
}

fn bad_request(e: impl std::fmt::Display) -> RemoteError {
    RemoteError::new(code::BAD_REQUEST, e.to_string())
}

#[async_trait]
impl Dispatcher for MonDispatcher {
    async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
        let inner =
            self.inner.get().and_then(Weak::upgrade).ok_or_else(|| {
                RemoteError::new(code::UNAVAILABLE, "monitor starting or stopping")
            })?;
        match req.msg_type {
            msg_type::MON_RAFT => {
                if !req.peer.entity().starts_with("mon.") {
                    return Err(RemoteError::new(
                        code::FORBIDDEN,
                        format!("{} may not send raft traffic", req.peer.entity()),
                    ));
                }
                let rpc: RaftRpc = network::decode(&req.meta).map_err(bad_request)?;
                let reply = inner.raft_rpc(rpc).await;
                Ok(Response::new(
                    msg_type::MON_RAFT,
                    network::encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::MON_COMMAND => {
                let cmd: MonCommand =
                    kelp_proto::decode(&req.meta, "MonCommand").map_err(bad_request)?;
                debug!(peer = %req.peer, ?cmd, "command");
                Ok(encode_reply(&inner.command(cmd, &req.peer).await))
            }
            msg_type::MON_SUBSCRIBE => {
                let sub: Subscribe =
                    kelp_proto::decode(&req.meta, "Subscribe").map_err(bad_request)?;
                let update = inner.subscribe(req.peer.clone(), sub.have_epoch);
                Ok(Response::new(
                    msg_type::MON_MAP_UPDATE,
                    kelp_proto::encode(&update),
                    Bytes::new(),
                ))
            }
            msg_type::MON_OSD_STATS => {
                // reports from OSDs that predate a field are read too
                let report = OsdStatsReport::decode(&req.meta).map_err(bad_request)?;
                Ok(encode_reply(&inner.osd_stats(report, &req.peer)))
            }
            msg_type::MON_OSD_BOOT => {
                let boot: OsdBoot =
                    kelp_proto::decode(&req.meta, "OsdBoot").map_err(bad_request)?;
                Ok(encode_reply(&inner.boot(boot, &req.peer).await))
            }
            msg_type::MON_OSD_FAILURE => {
                let f: OsdFailure =
                    kelp_proto::decode(&req.meta, "OsdFailure").map_err(bad_request)?;
                Ok(encode_reply(&inner.failure_report(f, &req.peer)))
            }
            other => Err(RemoteError::new(
                code::UNKNOWN_TYPE,
                format!("a monitor does not handle msg_type {other:#06x}"),
            )),
        }
    }
}

/// Pushes new epochs to subscribers, in order, whenever the applied epoch changes.
async fn pusher(inner: Arc<Inner>) {
    let mut rx = inner.shared.epoch_tx.subscribe();
    while rx.changed().await.is_ok() {
        let targets: Vec<(Peer, u32)> = {
            let mut subs = inner.subscribers.lock().unwrap_or_else(|p| p.into_inner());
            subs.retain(|s| !s.peer.is_closed());
            subs.iter().map(|s| (s.peer.clone(), s.sent)).collect()
        };
        for (peer, sent) in targets {
            let (update, epoch) = {
                let a = inner.shared.read();
                (a.state.catch_up(sent), a.state.epoch())
            };
            if update.full.is_none() && update.incrementals.is_empty() {
                continue;
            }
            let send = peer.send(
                msg_type::MON_MAP_UPDATE,
                kelp_proto::encode(&update),
                Bytes::new(),
            );
            let ok = matches!(
                tokio::time::timeout(Duration::from_secs(5), send).await,
                Ok(Ok(()))
            );
            let mut subs = inner.subscribers.lock().unwrap_or_else(|p| p.into_inner());
            if ok {
                for s in subs.iter_mut().filter(|s| same_peer(&s.peer, &peer)) {
                    s.sent = s.sent.max(epoch);
                }
            } else {
                debug!(%peer, "dropping subscriber: push failed");
                subs.retain(|s| !same_peer(&s.peer, &peer));
            }
        }
    }
}

/// The `mon_osd_*_ratio`s from the central config.
fn full_ratios(state: &crate::state::MonState) -> FullRatios {
    let get = |key: &str, default: u32| {
        state
            .config_value("mon", key)
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(default, ratio_ppm)
    };
    let d = FullRatios::default();
    FullRatios {
        nearfull_ppm: get("mon_osd_nearfull_ratio", d.nearfull_ppm),
        backfillfull_ppm: get("mon_osd_backfillfull_ratio", d.backfillfull_ppm),
        full_ppm: get("mon_osd_full_ratio", d.full_ppm),
    }
}

/// After how long without a report from its primary a PG is `stale`: three report intervals,
/// at least 5 s.
fn stale_after(state: &crate::state::MonState) -> f64 {
    let interval = state
        .config_value("osd", keys::OSD_STATS_INTERVAL.name)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(keys::OSD_STATS_INTERVAL.default.as_f64());
    (3.0 * interval).max(5.0)
}

/// The leader's statistics housekeeping: forgets the reports of OSDs that went down, and sets
/// or clears the map's `full` flag from the OSDs' usage (`PgMap::full_decision`). A monitor
/// that is not the leader holds no statistics.
/// How often a monitor sends its own service-map beacon.
pub const BEACON_INTERVAL: Duration = Duration::from_secs(5);

/// Sends this monitor's beacon (once its endpoints are set): handled here on the leader,
/// forwarded to it by a follower.
async fn beacon_loop(inner: Arc<Inner>) {
    // checked every second so that the first beacon goes out as soon as the endpoints are set
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last: Option<Instant> = None;
    loop {
        tick.tick().await;
        if last.is_some_and(|t| t.elapsed() < BEACON_INTERVAL) {
            continue;
        }
        let Some(addrs) = inner
            .service_addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            continue;
        };
        let cmd = MonCommand::ServiceBeacon {
            name: format!("mon.{}", inner.name),
            kind: "mon".into(),
            addrs,
            version: env!("CARGO_PKG_VERSION").into(),
        };
        last = Some(Instant::now());
        if inner.is_leader() {
            inner.service_command(&cmd);
        } else {
            let _ = inner.forward(cmd, false).await;
        }
    }
}

async fn stats_loop(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_millis(inner.config.tick_ms.max(10)));
    loop {
        tick.tick().await;
        if !inner.is_leader() {
            inner
                .pgmap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clear();
            continue;
        }
        let proposal = {
            let a = inner.shared.read();
            let Some(map) = a.state.osdmap() else {
                continue;
            };
            let ratios = full_ratios(&a.state);
            let mut pm = inner.pgmap.lock().unwrap_or_else(|p| p.into_inner());
            pm.prune(map);
            match pm.full_decision(map, &ratios) {
                Some(on) if on != map.has_flag(kelp_maps::ClusterFlag::Full) => Some(on),
                _ => None,
            }
        };
        if let Some(on) = proposal {
            if on {
                warn!("an OSD is at or past mon_osd_full_ratio: setting the full flag");
            } else {
                info!("every OSD is below mon_osd_full_ratio: clearing the full flag");
            }
            if let Err(e) = inner.raft.client_write(MonEntry::SetFull { on }).await {
                warn!(error = %e, "proposing the full flag failed");
            }
        }
    }
}

/// The leader's cluster log: every second, compares the map and the health checks with the
/// previous look and proposes the differences (and the manager failovers noted meanwhile) as
/// one `MonEntry::ClusterLog`. A monitor that becomes leader starts from its first look, so a
/// change that happens during an election is not logged.
async fn cluster_log_loop(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut before: Option<LogView> = None;
    let mut was_leader = false;
    loop {
        tick.tick().await;
        if !inner.is_leader() {
            before = None;
            if was_leader {
                inner.mgr_tracker().reset();
                inner
                    .progress
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clear();
            }
            was_leader = false;
            continue;
        }
        let grace = inner.mgr_grace();
        let events = inner.mgr_tracker().tick(Instant::now(), grace);
        inner.note_mgr_events(events);
        let now_view = {
            let a = inner.shared.read();
            let Some(map) = a.state.osdmap() else {
                continue;
            };
            // health is compared once the OSDs have had time to report to this leader
            let checks = (inner.now() > stale_after(&a.state)).then(|| {
                let ratios = full_ratios(&a.state);
                let mut pm = inner.pgmap.lock().unwrap_or_else(|p| p.into_inner());
                pm.prune(map);
                let d = pm.digest(map, &ratios, inner.now(), stale_after(&a.state));
                kelp_health::cluster_checks(map, Some(&d))
            });
            LogView::of(map, checks.as_deref())
        };
        let mut found: Vec<(LogLevel, String)> = Vec::new();
        if !was_leader {
            found.push((
                LogLevel::Info,
                format!("mon.{} is now the leader", inner.name),
            ));
            was_leader = true;
        }
        if let Some(b) = &before {
            found.extend(crate::cluster_log::events(b, &now_view));
        }
        found.extend(std::mem::take(
            &mut *inner.log_pending.lock().unwrap_or_else(|p| p.into_inner()),
        ));
        before = Some(now_view);
        if found.is_empty() {
            continue;
        }
        let stamp_ms = unix_ms();
        let who = format!("mon.{}", inner.name);
        let entries = found
            .into_iter()
            .map(|(level, message)| LogEntry {
                seq: 0,
                stamp_ms,
                level,
                who: who.clone(),
                message,
            })
            .collect();
        if let Err(e) = inner.raft.client_write(MonEntry::ClusterLog(entries)).await {
            warn!(error = %e, "proposing cluster log entries failed");
        }
    }
}

/// The leader's housekeeping: creates the cluster state on a fresh group, then every tick asks
/// [`Liveness`] what to propose (OSDs to mark down for failure reports or a lost session, OSDs
/// down for `mon_osd_down_out_interval` to mark out). Leader only; the bookkeeping is dropped
/// whenever this monitor is not the leader, so a new leader starts its timers afresh.
async fn leader_loop(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_millis(inner.config.tick_ms.max(10)));
    loop {
        tick.tick().await;
        if !inner.is_leader() {
            inner.liveness().reset();
            inner.mds_liveness().reset();
            continue;
        }
        let initialized = inner.shared.read().state.is_initialized();
        if !initialized {
            info!("creating the cluster state");
            if let Err(e) = inner
                .raft
                .client_write(MonEntry::Init(inner.init.clone()))
                .await
            {
                warn!(error = %e, "proposing the initial state failed");
            }
            continue;
        }
        let proposals = {
            let a = inner.shared.read();
            let Some(map) = a.state.osdmap() else {
                continue;
            };
            let params = liveness_params(&a.state);
            let connected: HashSet<i32> = inner
                .msgr
                .peers()
                .iter()
                .filter_map(|p| p.entity().strip_prefix("osd.")?.parse().ok())
                .collect();
            let mut liveness = inner.liveness();
            let mut proposals = liveness.tick(map, &connected, Instant::now(), &params);
            let now_ms = unix_ms();
            if map.propose_blocklist_expire(now_ms).is_some() {
                proposals.push(MonEntry::BlocklistExpire { now_ms });
            }
            let mds_grace = Duration::from_secs_f64(
                a.state
                    .config_value("mon", keys::MDS_BEACON_GRACE.name)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(keys::MDS_BEACON_GRACE.default.as_f64())
                    .max(0.0),
            );
            let silent = inner
                .mds_liveness()
                .tick(a.state.fsmap(), Instant::now(), mds_grace);
            for (name, instance) in silent {
                info!(mds = %name, %instance, grace = ?mds_grace, "no beacon from the MDS within mds_beacon_grace; failing it");
                proposals.push(MonEntry::MdsTimedOut {
                    name,
                    instance,
                    now_ms,
                });
            }
            for p in &proposals {
                match p {
                    MonEntry::MarkDown { id, .. } => {
                        info!(osd = id, why = %liveness.describe(*id), "marking the OSD down")
                    }
                    MonEntry::MarkOut { id, .. } => {
                        info!(
                            osd = id,
                            "OSD down for the down-out interval; marking it out"
                        )
                    }
                    _ => {}
                }
            }
            proposals
        };
        for p in proposals {
            if let Err(e) = inner.raft.client_write(p).await {
                warn!(error = %e, "leader proposal failed");
            }
        }
    }
}

/// The liveness settings from the central config.
fn liveness_params(state: &crate::state::MonState) -> LivenessParams {
    let secs = |k: &str| Duration::from_secs_f64(state.config_secs(k).max(0.0));
    let down_out = state.config_secs("mon_osd_down_out_interval");
    LivenessParams {
        session_grace: secs("mon_osd_session_grace"),
        report_grace: secs("osd_heartbeat_grace"),
        min_down_reporters: state
            .config_value("mon", keys::MON_OSD_MIN_DOWN_REPORTERS.name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(keys::MON_OSD_MIN_DOWN_REPORTERS.default.as_u64() as usize),
        down_out_interval: (down_out > 0.0).then(|| Duration::from_secs_f64(down_out)),
    }
}

/// The daemon a beacon or manager report speaks for (`osd.3`, `rgw.gw1`, `mgr.x`), if `cmd`
/// is one.
fn beacon_daemon(cmd: &MonCommand) -> Option<String> {
    match cmd {
        MonCommand::ServiceBeacon { name, .. } => Some(name.clone()),
        MonCommand::MgrBeacon { name, .. } => Some(format!("mgr.{name}")),
        MonCommand::ProgressReport { mgr, .. } => Some(format!("mgr.{mgr}")),
        _ => None,
    }
}

/// Whether the authenticated `entity` may send beacons for `daemon`: the daemon's own entity
/// (`osd.3` for `osd.3`), `client.<daemon>`, the admin (`client.admin`, which `kelp up`'s
/// gateways and managers run as), or a monitor (its own beacons, and requests it forwards
/// after checking them).
pub(crate) fn may_speak_for(entity: &str, daemon: &str) -> bool {
    entity == daemon
        || entity.starts_with("mon.")
        || entity == "client.admin"
        || entity.strip_prefix("client.") == Some(daemon)
}

#[cfg(test)]
mod beacon_tests {
    use super::*;

    #[test]
    fn beacons_are_bound_to_the_sender() {
        assert!(may_speak_for("osd.3", "osd.3"));
        assert!(!may_speak_for("osd.3", "osd.4"));
        assert!(!may_speak_for("osd.3", "mgr.x"));
        assert!(may_speak_for("client.rgw.gw1", "rgw.gw1"));
        assert!(!may_speak_for("client.rgw.gw1", "rgw.gw2"));
        assert!(may_speak_for("client.admin", "mgr.y"));
        assert!(may_speak_for("mon.b", "mgr.y"));
        // any other entity speaks for no daemon
        assert!(!may_speak_for("dashboard.read-only.viewer", "mgr.x"));
        let beacon = MonCommand::MgrBeacon {
            name: "x".into(),
            dashboard_url: String::new(),
            instance: "i".into(),
        };
        assert_eq!(beacon_daemon(&beacon).as_deref(), Some("mgr.x"));
        let report = MonCommand::ProgressReport {
            mgr: "y".into(),
            items: vec![],
        };
        assert_eq!(beacon_daemon(&report).as_deref(), Some("mgr.y"));
        assert_eq!(beacon_daemon(&MonCommand::Status), None);
    }
}

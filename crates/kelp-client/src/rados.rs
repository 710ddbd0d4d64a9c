//! The cluster handle: monitor session, the current OSD map, and op submission with retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_maps::{ClusterFlag, OsdMap, PoolSpec};
use kelp_monc::MonClient;
use kelp_msgr::Messenger;
use kelp_proto::{
    ErrorCode, ListCursor, MonCommand, MonReply, ObjectLocator, OpKind, OsdOp, OsdOpReply, PgList,
    PgListReply, decode, encode, msg_type,
};
use kelp_types::PgId;
use tokio::sync::watch;
use tracing::debug;

use crate::config::ClientConfig;
use crate::error::{ClientError, NoPrimary};
use crate::ioctx::IoCtx;

pub(crate) struct Inner {
    pub(crate) cfg: ClientConfig,
    pub(crate) mon: Arc<MonClient>,
    pub(crate) map_rx: watch::Receiver<Arc<OsdMap>>,
    /// PG mappings of the current map (every op needs its PG's primary).
    pub(crate) mappings: kelp_maps::MappingCache,
    next_reqid: AtomicU64,
    subscription: tokio::task::JoinHandle<()>,
    /// This connection's instance name (`Rados::instance`), sent with every op.
    pub(crate) instance: String,
    /// OSD traffic, on a messenger of its own whose pushes are watch events.
    osd_msgr: Messenger,
    /// The watches of this instance (`crate::watch`).
    pub(crate) watches: Arc<crate::watch::Registry>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.subscription.abort();
        self.osd_msgr.shutdown();
        self.mon.shutdown();
    }
}

/// A connected cluster handle. Cheap to clone.
#[derive(Clone)]
pub struct Rados {
    pub(crate) inner: Arc<Inner>,
}

impl Rados {
    /// Connects to the monitors, authenticates, and waits for the first OSD map.
    pub async fn connect(cfg: ClientConfig) -> Result<Rados, ClientError> {
        let mon = Arc::new(
            MonClient::new(&cfg.entity, cfg.secret.clone(), cfg.mons.clone())?
                .with_timeout(cfg.mon_timeout),
        );
        // One command first: a wrong key or an unreachable cluster fails here, by name,
        // instead of as a subscription that never delivers.
        mon.command(&MonCommand::Status).await?;
        let mut sub = mon.subscribe(None)?;
        let first = tokio::time::timeout(cfg.mon_timeout, sub.next())
            .await
            .map_err(|_| ClientError::Timeout {
                what: "fetching the OSD map from the monitors".into(),
                after: cfg.mon_timeout,
                last: format!("monitors {:?} sent no map", cfg.mons),
            })?
            .ok_or_else(|| ClientError::Config("the monitor subscription ended".into()))?;
        let (tx, map_rx) = watch::channel(first);
        let subscription = tokio::spawn(async move {
            while let Some(map) = sub.next().await {
                debug!(epoch = map.epoch, "new OSD map");
                tx.send_replace(map);
            }
        });
        // Request ids must not repeat across restarts of a client with the same name while
        // the OSDs still remember old ones: start from the clock.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        let instance = crate::watch::instance_name(&cfg.entity);
        let (osd_msgr, watches) = crate::watch::osd_messenger(&cfg)?;
        Ok(Rados {
            inner: Arc::new(Inner {
                cfg,
                mon,
                map_rx,
                mappings: kelp_maps::MappingCache::new(),
                next_reqid: AtomicU64::new(start),
                subscription,
                instance,
                osd_msgr,
                watches,
            }),
        })
    }

    /// The newest OSD map this client has.
    pub fn osd_map(&self) -> Arc<OsdMap> {
        self.inner.map_rx.borrow().clone()
    }

    /// Whether the OSD map's `full` flag is set: writes other than removals (and `FullTry`
    /// ones) are refused.
    pub fn cluster_full(&self) -> bool {
        self.osd_map().has_flag(ClusterFlag::Full)
    }

    /// Waits until the client has a map of at least `epoch` (bounded by the op timeout).
    pub async fn wait_for_epoch(&self, epoch: u32) -> Result<Arc<OsdMap>, ClientError> {
        self.inner
            .wait_for_epoch(epoch, Instant::now() + self.inner.cfg.op_timeout)
            .await
            .ok_or_else(|| ClientError::Timeout {
                what: format!("waiting for OSD map epoch {epoch}"),
                after: self.inner.cfg.op_timeout,
                last: format!("have epoch {}", self.osd_map().epoch),
            })
    }

    /// Sends a command to the monitors.
    pub async fn mon_command(&self, cmd: MonCommand) -> Result<MonReply, ClientError> {
        Ok(self.inner.mon.command(&cmd).await?)
    }

    /// A central-config value (`kelp config set WHO KEY VALUE`): the last of `sections` that
    /// sets `key` wins (`["global", "rgw"]`); `None` when none sets it.
    pub async fn config_value(
        &self,
        sections: &[&str],
        key: &str,
    ) -> Result<Option<String>, ClientError> {
        let MonReply::Config(entries) = self.mon_command(MonCommand::ConfigDump).await? else {
            return Err(ClientError::Invalid(
                "unexpected reply to config dump".into(),
            ));
        };
        let mut value = None;
        for who in sections {
            if let Some(e) = entries.iter().find(|e| e.who == *who && e.key == key) {
                value = Some(e.value.clone());
            }
        }
        Ok(value)
    }

    /// Sends one service-map beacon: this daemon's `name` (`rgw.gw1`), `kind` (`rgw`) and
    /// endpoints (`"metrics"` → URL). Daemons send one every
    /// [`kelp_monc::SERVICE_BEACON_INTERVAL`] ([`Rados::spawn_service_beacons`]).
    pub async fn service_beacon(
        &self,
        name: &str,
        kind: &str,
        addrs: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), ClientError> {
        Ok(self.inner.mon.service_beacon(name, kind, addrs).await?)
    }

    /// Sends beacons in the background until the returned task is aborted.
    pub fn spawn_service_beacons(
        &self,
        name: String,
        kind: String,
        addrs: std::collections::BTreeMap<String, String>,
    ) -> tokio::task::JoinHandle<()> {
        self.inner.mon.spawn_service_beacons(name, kind, addrs)
    }

    /// The service map: every daemon that sent a beacon lately (stale ones flagged), sorted by
    /// name.
    pub async fn service_map(&self) -> Result<Vec<kelp_proto::ServiceEntry>, ClientError> {
        match self.mon_command(MonCommand::ServiceMap).await? {
            MonReply::ServiceMap(v) => Ok(v),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// Runs a monitor command that changes the OSD map; returns the epoch that has the change,
    /// once this client's map has it.
    pub(crate) async fn map_command(&self, cmd: MonCommand) -> Result<u32, ClientError> {
        match self.mon_command(cmd).await? {
            MonReply::Done { epoch } => {
                self.wait_for_epoch(epoch).await?;
                Ok(epoch)
            }
            MonReply::Error { message } => Err(ClientError::Invalid(message)),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// Creates a pool and waits until this client's map has it. Returns its id.
    pub async fn create_pool(&self, spec: PoolSpec) -> Result<u32, ClientError> {
        match self.mon_command(MonCommand::PoolCreate(spec)).await? {
            MonReply::PoolId { id, epoch } => {
                self.wait_for_epoch(epoch).await?;
                Ok(id)
            }
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// Deletes a pool and all its objects.
    pub async fn delete_pool(&self, name: &str) -> Result<(), ClientError> {
        let reply = self
            .mon_command(MonCommand::PoolDelete {
                name: name.to_string(),
            })
            .await?;
        if let MonReply::Done { epoch } = reply {
            self.wait_for_epoch(epoch).await?;
        }
        Ok(())
    }

    /// `osd erasure-code-profile set`: creates erasure-code profile `name` from `key=value`
    /// words (`k=4`, `m=2`, `crush-failure-domain=host`, ...; the monitors validate them), or
    /// replaces a different one of that name when `force`; waits until this client's map has
    /// it.
    pub async fn ec_profile_set(
        &self,
        name: &str,
        words: &[String],
        force: bool,
    ) -> Result<(), ClientError> {
        self.map_command(MonCommand::EcProfileSet {
            name: name.to_string(),
            words: words.to_vec(),
            force,
        })
        .await
        .map(drop)
    }

    /// `osd erasure-code-profile get`: the profile's `key=value` pairs, sorted by key.
    pub async fn ec_profile_get(&self, name: &str) -> Result<Vec<(String, String)>, ClientError> {
        let reply = self
            .mon_command(MonCommand::EcProfileGet {
                name: name.to_string(),
            })
            .await?;
        match reply {
            MonReply::EcProfile { pairs, .. } => Ok(pairs),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// `osd erasure-code-profile ls`: profile names, sorted.
    pub async fn ec_profile_ls(&self) -> Result<Vec<String>, ClientError> {
        match self.mon_command(MonCommand::EcProfileLs).await? {
            MonReply::EcProfileNames(names) => Ok(names),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// `osd erasure-code-profile rm`: removes a profile no pool was created from.
    pub async fn ec_profile_rm(&self, name: &str) -> Result<(), ClientError> {
        self.map_command(MonCommand::EcProfileRm {
            name: name.to_string(),
        })
        .await
        .map(drop)
    }

    /// Allocates a self-managed snapshot id in `pool` (the monitors count them per pool) and
    /// waits until this client's map has it. Writers then put it into their snapshot context
    /// (`IoCtx::set_snap_context`).
    pub async fn selfmanaged_snap_create(&self, pool: &str) -> Result<u64, ClientError> {
        let reply = self
            .mon_command(MonCommand::PoolSnapCreate {
                pool: pool.to_string(),
            })
            .await?;
        match reply {
            MonReply::SnapId { snap, epoch } => {
                self.wait_for_epoch(epoch).await?;
                Ok(snap)
            }
            MonReply::Error { message } => Err(ClientError::Invalid(message)),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }

    /// Removes self-managed snapshot `snap` of `pool`: reads at it find nothing from now on,
    /// and the OSDs trim its clones in the background.
    pub async fn selfmanaged_snap_remove(&self, pool: &str, snap: u64) -> Result<(), ClientError> {
        self.map_command(MonCommand::PoolSnapRemove {
            pool: pool.to_string(),
            snap,
        })
        .await
        .map(drop)
    }

    /// An I/O context on a pool (by name).
    pub async fn ioctx(&self, pool: &str) -> Result<IoCtx, ClientError> {
        let map = self.osd_map();
        let p = map
            .pool_by_name(pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        Ok(IoCtx::new(self.clone(), p.id, pool))
    }

    /// An I/O context on a pool (by id).
    pub fn ioctx_by_id(&self, pool: u32) -> Result<IoCtx, ClientError> {
        let map = self.osd_map();
        let p = map
            .pools
            .get(&pool)
            .ok_or_else(|| ClientError::NoSuchPool(format!("pool id {pool}")))?;
        Ok(IoCtx::new(self.clone(), pool, &p.name))
    }

    /// The messenger used for OSD traffic (this instance's own: OSDs push watch events on
    /// its connections).
    pub(crate) fn msgr(&self) -> &Messenger {
        &self.inner.osd_msgr
    }

    /// This handle's messengers (OSD traffic, then the monitors'), for their statistics
    /// (`Messenger::stats`): a daemon built on a RADOS client reports them as its own.
    pub fn messengers(&self) -> Vec<Messenger> {
        vec![
            self.inner.osd_msgr.clone(),
            self.inner.mon.messenger().clone(),
        ]
    }

    /// This connection's client instance name, `ENTITY.NONCE` (e.g.
    /// `client.admin.3f09c2d4e5a6b7c8`): unique per `Rados::connect`, sent with every op, and
    /// what `osd blocklist` fences and watchers are listed as.
    pub fn instance(&self) -> String {
        self.inner.instance.clone()
    }
}

impl Inner {
    pub(crate) async fn wait_for_epoch(
        &self,
        epoch: u32,
        deadline: Instant,
    ) -> Option<Arc<OsdMap>> {
        let mut rx = self.map_rx.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.wait_for(|m| m.epoch >= epoch)).await {
            Ok(Ok(m)) => Some(m.clone()),
            _ => None,
        }
    }

    /// Resolves once a map newer than `epoch` names another primary (or address) for `pg`
    /// than `primary` at `addr`: an op sent there will not be answered by the right OSD (it
    /// may be frozen or gone), so it is resent, like Ceph's Objecter does on a map change.
    async fn primary_moved(&self, pg: PgId, primary: i32, addr: std::net::SocketAddr, epoch: u32) {
        let mut rx = self.map_rx.clone();
        let moved = rx
            .wait_for(|m| {
                m.epoch > epoch
                    && primary_of(m, &self.mappings, pg)
                        .map_or(true, |(p, a)| p != primary || a != addr)
            })
            .await
            .map(|_| ());
        if moved.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// While the map has the `pause` flag, waits (without a deadline) until a map clears it.
    /// Returns how long it waited.
    async fn wait_unpaused(&self) -> Duration {
        let started = Instant::now();
        let mut rx = self.map_rx.clone();
        let unpaused = rx
            .wait_for(|m| !m.has_flag(ClusterFlag::Pause))
            .await
            .map(|_| ());
        if unpaused.is_err() {
            // The subscription ended (the client is shutting down): do not spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        started.elapsed()
    }

    pub(crate) fn next_reqid(&self) -> u64 {
        self.next_reqid.fetch_add(1, Ordering::Relaxed)
    }
}

/// Backoff between retries of one op.
struct Retry {
    deadline: Instant,
    pause: Duration,
    last: String,
}

impl Retry {
    fn new(timeout: Duration) -> Retry {
        Retry {
            deadline: Instant::now() + timeout,
            pause: Duration::from_millis(20),
            last: String::from("no attempt yet"),
        }
    }

    fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Waits for a newer map than `epoch`, or a backoff pause, whichever comes first.
    async fn wait(&mut self, inner: &Inner, epoch: u32, why: String) {
        self.last = why;
        let until = (Instant::now() + self.pause).min(self.deadline);
        let _ = inner.wait_for_epoch(epoch + 1, until).await;
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
    }
}

/// A reply from a PG's primary: an optional error and the OSD's map epoch.
pub(crate) trait PrimaryReply: serde::de::DeserializeOwned {
    const NAME: &'static str;
    fn error(&self) -> Option<&(ErrorCode, String)>;
    fn epoch(&self) -> u32;
}

impl PrimaryReply for OsdOpReply {
    const NAME: &'static str = "OsdOpReply";
    fn error(&self) -> Option<&(ErrorCode, String)> {
        self.error.as_ref()
    }
    fn epoch(&self) -> u32 {
        self.epoch
    }
}

impl PrimaryReply for PgListReply {
    const NAME: &'static str = "PgListReply";
    fn error(&self) -> Option<&(ErrorCode, String)> {
        self.error.as_ref()
    }
    fn epoch(&self) -> u32 {
        self.epoch
    }
}

impl Rados {
    /// Sends one op on `object` to its PG's primary, following map changes until it succeeds,
    /// fails for good, or the op timeout passes. Returns the reply and its data. Every resend
    /// carries the same request id, so the OSD never applies a write twice.
    pub(crate) async fn submit(
        &self,
        object: &ObjectLocator,
        ops: Vec<OpKind>,
        data: Bytes,
    ) -> Result<(OsdOpReply, Bytes), ClientError> {
        // A full cluster refuses writes at once (Ceph's clients wait; Kelp's fail clearly).
        // Reads and removals go on: they are what frees space.
        // A write flagged `FullTry` goes on: the OSDs let it pass up to their failsafe ratio.
        if self.cluster_full()
            && !ops.iter().all(OpKind::allowed_when_full)
            && !ops.iter().any(OpKind::is_full_try)
        {
            return Err(ClientError::Full(format!(
                "writing '{}' refused: an OSD is at or past mon_osd_full_ratio (the OSD map's \
                 full flag is set); delete data or add OSDs, writes resume once usage drops \
                 below the ratio",
                object.name
            )));
        }
        let reqid = self.inner.next_reqid();
        self.call_primary(
            &format!("operation on '{}'", object.name),
            &object.name,
            msg_type::OSD_OP,
            |map| object_pg(map, object),
            |pg, epoch| {
                encode(&OsdOp {
                    reqid,
                    epoch,
                    pg,
                    object: object.clone(),
                    ops: ops.clone(),
                    instance: self.inner.instance.clone(),
                })
            },
            data,
        )
        .await
    }

    /// Lists one page of a PG's objects from its primary.
    pub(crate) async fn list_pg(
        &self,
        pg: PgId,
        cursor: Option<ListCursor>,
        max: u32,
    ) -> Result<PgListReply, ClientError> {
        let (reply, _) = self
            .call_primary(
                &format!("listing PG {pg}"),
                &pg.to_string(),
                msg_type::OSD_PGLS,
                |map| {
                    if map.pools.contains_key(&pg.pool.0) {
                        Ok(pg)
                    } else {
                        Err(ClientError::NoSuchPool(pg.pool.to_string()))
                    }
                },
                |pg, epoch| {
                    encode(&PgList {
                        pg,
                        epoch,
                        cursor: cursor.clone(),
                        max,
                    })
                },
                Bytes::new(),
            )
            .await?;
        Ok(reply)
    }

    /// The one retry loop for requests to a PG's primary: locate the PG in the current map,
    /// send to its primary, and on a lost connection, a stale map (`Misdirected`), a PG that is
    /// not serving yet (`Inactive`) or a failed replica (`Io`) wait for a newer map (or a short,
    /// growing pause) and resend, until the op timeout. Other errors are final.
    pub(crate) async fn call_primary<R: PrimaryReply>(
        &self,
        what: &str,
        subject: &str,
        msg_type: u16,
        locate: impl Fn(&OsdMap) -> Result<PgId, ClientError>,
        request: impl Fn(PgId, u32) -> Vec<u8>,
        data: Bytes,
    ) -> Result<(R, Bytes), ClientError> {
        let timeout = self.inner.cfg.op_timeout;
        self.call_primary_within(timeout, what, subject, msg_type, locate, request, data)
            .await
    }

    /// [`Rados::call_primary`] with its own overall deadline (a notify waits for its
    /// watchers longer than an op may take).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call_primary_within<R: PrimaryReply>(
        &self,
        timeout: Duration,
        what: &str,
        subject: &str,
        msg_type: u16,
        locate: impl Fn(&OsdMap) -> Result<PgId, ClientError>,
        request: impl Fn(PgId, u32) -> Vec<u8>,
        data: Bytes,
    ) -> Result<(R, Bytes), ClientError> {
        let inner = &self.inner;
        let mut retry = Retry::new(timeout);
        loop {
            if retry.expired() {
                return Err(ClientError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                    last: retry.last,
                });
            }
            let map = self.osd_map();
            if map.has_flag(ClusterFlag::Pause) {
                // `pause` (Ceph's pauserd + pausewr): hold the op until it is unset; the time
                // held does not count against the op timeout.
                debug!(epoch = map.epoch, "cluster paused; holding {what}");
                retry.deadline += inner.wait_unpaused().await;
                continue;
            }
            let pg = locate(&map)?;
            let (primary, addr) = match primary_of(&map, &inner.mappings, pg) {
                Ok(p) => p,
                Err(why) => {
                    retry.wait(inner, map.epoch, why.to_string()).await;
                    continue;
                }
            };
            let conn = self.msgr().connection(addr);
            let call = conn.call(msg_type, request(pg, map.epoch), data.clone(), retry.left());
            let call = tokio::select! {
                r = call => r,
                () = inner.primary_moved(pg, primary, addr, map.epoch) => {
                    // Resent with the same request id: the OSDs never apply it twice.
                    retry.last = format!("osd.{primary} stopped being PG {pg}'s primary");
                    continue;
                }
            };
            let resp = match call {
                Ok(resp) => resp,
                Err(e) if e.is_retryable() => {
                    retry
                        .wait(inner, map.epoch, format!("osd.{primary}: {e}"))
                        .await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let reply: R = decode(&resp.meta, R::NAME)?;
            match reply.error() {
                None => return Ok((reply, resp.data)),
                Some((ErrorCode::Misdirected | ErrorCode::Inactive | ErrorCode::Io, msg)) => {
                    // Wait until our map is at least as new as the OSD's (or a short pause).
                    let epoch = map.epoch.max(reply.epoch().saturating_sub(1));
                    let why = format!("osd.{primary}: {msg}");
                    retry.wait(inner, epoch, why).await;
                }
                Some((code, msg)) => {
                    return Err(ClientError::from_code(*code, subject, msg.clone()));
                }
            }
        }
    }
}

pub(crate) fn primary_of(
    map: &Arc<OsdMap>,
    mappings: &kelp_maps::MappingCache,
    pg: PgId,
) -> Result<(i32, std::net::SocketAddr), NoPrimary> {
    let m = mappings.get(map, pg)?;
    if m.acting_primary < 0 {
        return Err(NoPrimary::NoneUp {
            pg,
            epoch: map.epoch,
        });
    }
    let osd = m.acting_primary;
    let addr = map
        .osds
        .get(&osd)
        .and_then(|o| o.addr)
        .ok_or(NoPrimary::NoAddress { osd })?;
    Ok((osd, addr))
}

/// The PG of `object` in `map`.
pub(crate) fn object_pg(map: &OsdMap, object: &ObjectLocator) -> Result<PgId, ClientError> {
    let pool = map
        .pools
        .get(&object.pool)
        .ok_or_else(|| ClientError::NoSuchPool(object.pool.to_string()))?;
    Ok(pool
        .placement()
        .object_pg(&object.name, object.key.as_deref(), &object.namespace))
}

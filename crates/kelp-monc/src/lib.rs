//! `MonClient`: how daemons and clients talk to the monitors.
//!
//! Its own crate (depending only on kelp-msgr, kelp-proto and kelp-maps) so that OSDs, the
//! client library and the tools can all use it without depending on the monitor itself.
//!
//! Behaviour:
//! - one messenger, one "current" monitor; a call that fails with a retryable transport error
//!   moves to the next monitor address, and a `NotLeader { leader: Some(addr) }` reply moves
//!   to that address, until the overall timeout;
//! - a retried mutation may apply twice if the first attempt committed but its reply was lost
//!   (e.g. `PoolCreate` then answers "pool exists"): the caller decides what that means;
//! - a subscription yields every OSD map epoch in order (one `OsdMap` per epoch when the
//!   monitor sends incrementals, or a jump when it sends a full map); on a gap, a lost
//!   connection or a change of monitor it resubscribes from the epoch it has.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_maps::{Incremental, MapError, OsdMap};
use kelp_msgr::{ChannelDispatcher, Message, Messenger, MsgrError, Secret};
use kelp_proto::{
    MapUpdate, MonCommand, MonReply, OsdBoot, OsdFailure, OsdStatsReport, ProtoError, StatsAck,
    Subscribe, msg_type,
};
use tokio::sync::mpsc;
use tracing::debug;

/// Errors of [`MonClient`].
#[derive(Debug, thiserror::Error)]
pub enum MonClientError {
    #[error("no monitor addresses given")]
    NoMonitors,
    /// No monitor answered within the deadline; `last` is the last transport error.
    #[error("no monitor answered within {after:?}: {last}")]
    Timeout { after: Duration, last: String },
    /// The monitors refused the command (`MonReply::Error`).
    #[error("refused: {message}")]
    Refused { message: String },
    /// Not retryable: authentication, protocol.
    #[error(transparent)]
    Msgr(#[from] MsgrError),
    #[error("bad reply: {0}")]
    Proto(#[from] ProtoError),
    #[error("bad map from the monitors: {0}")]
    Map(#[from] MapError),
    #[error("this client already has a subscription")]
    AlreadySubscribed,
}

/// A connection to the monitor cluster. Cheap to share behind an `Arc`.
pub struct MonClient {
    msgr: Messenger,
    mons: Mutex<Vec<SocketAddr>>,
    current: Mutex<usize>,
    timeout: Duration,
    pushes: Mutex<Option<mpsc::Receiver<Message>>>,
}

/// Applies one `MapUpdate` to `current`, returning each new map in epoch order. Incrementals
/// at or below the current epoch are skipped; `Ok(None)` means there is a gap (resubscribe).
pub fn apply_update(
    current: Option<&OsdMap>,
    update: &MapUpdate,
) -> Result<Option<Vec<OsdMap>>, MapError> {
    let mut out: Vec<OsdMap> = Vec::new();
    let mut cur: Option<OsdMap> = current.cloned();
    if let Some(full) = &update.full {
        let map = OsdMap::decode(full)?;
        if cur.as_ref().is_none_or(|c| map.epoch > c.epoch) {
            out.push(map.clone());
            cur = Some(map);
        }
    }
    for bytes in &update.incrementals {
        let inc = Incremental::decode(bytes)?;
        let Some(c) = cur.as_mut() else {
            return Ok(None);
        };
        if inc.epoch <= c.epoch {
            continue;
        }
        if inc.epoch != c.epoch + 1 {
            return Ok(None);
        }
        c.apply(&inc)?;
        out.push(c.clone());
    }
    Ok(Some(out))
}

/// A stream of OSD maps; dropping it ends the subscription.
pub struct MapSubscription {
    rx: mpsc::Receiver<Arc<OsdMap>>,
}

impl MapSubscription {
    /// The next map (epochs strictly increasing), or `None` once the client is shut down.
    pub async fn next(&mut self) -> Option<Arc<OsdMap>> {
        self.rx.recv().await
    }
}

/// How often daemons send their service-map beacon (the monitors show a daemon `stale` after
/// three missed beacons).
pub const SERVICE_BEACON_INTERVAL: Duration = Duration::from_secs(5);

impl MonClient {
    /// A client authenticating as `entity` (`client.admin`, `osd.3`) with `secret`, talking to
    /// any of `mons`. Each command is retried for up to 30 s (see [`Self::with_timeout`]).
    pub fn new(
        entity: &str,
        secret: Secret,
        mons: Vec<SocketAddr>,
    ) -> Result<MonClient, MonClientError> {
        if mons.is_empty() {
            return Err(MonClientError::NoMonitors);
        }
        let (dispatcher, pushes) = ChannelDispatcher::new(256);
        let msgr = Messenger::builder(entity)
            .secret(secret)
            .dispatcher(dispatcher)
            .build()?;
        Ok(MonClient {
            msgr,
            mons: Mutex::new(mons),
            current: Mutex::new(0),
            timeout: Duration::from_secs(30),
            pushes: Mutex::new(Some(pushes)),
        })
    }

    /// Sets the overall deadline of one command (all retries included).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The underlying messenger (its connection to the leader is the OSD's monitor session).
    pub fn messenger(&self) -> &Messenger {
        &self.msgr
    }

    /// The monitor currently talked to.
    pub fn current_monitor(&self) -> SocketAddr {
        let mons = self.mons.lock().unwrap_or_else(|p| p.into_inner());
        let i = *self.current.lock().unwrap_or_else(|p| p.into_inner());
        mons[i % mons.len()]
    }

    fn rotate(&self) {
        let n = self.mons.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut c = self.current.lock().unwrap_or_else(|p| p.into_inner());
        *c = (*c + 1) % n;
    }

    fn switch_to(&self, addr: SocketAddr) {
        let mut mons = self.mons.lock().unwrap_or_else(|p| p.into_inner());
        let i = match mons.iter().position(|a| *a == addr) {
            Some(i) => i,
            None => {
                mons.push(addr);
                mons.len() - 1
            }
        };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = i;
    }

    /// Sends `meta` as `mt` with leader-following and failover; returns the decoded reply.
    async fn call(&self, mt: u16, meta: Bytes) -> Result<MonReply, MonClientError> {
        self.call_within(mt, meta, self.timeout).await
    }

    async fn call_within(
        &self,
        mt: u16,
        meta: Bytes,
        timeout: Duration,
    ) -> Result<MonReply, MonClientError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no attempt");
        let mut pause = Duration::from_millis(50);
        while Instant::now() < deadline {
            let addr = self.current_monitor();
            let left = deadline.saturating_duration_since(Instant::now());
            let conn = self.msgr.connection(addr);
            match conn.call(mt, meta.clone(), Bytes::new(), left).await {
                Ok(resp) => match kelp_proto::decode::<MonReply>(&resp.meta, "MonReply")? {
                    MonReply::NotLeader { leader: Some(l) } if l != addr => {
                        debug!(%addr, leader = %l, "redirected to the leader");
                        self.switch_to(l);
                        continue;
                    }
                    MonReply::NotLeader { .. } => {
                        last = format!("{addr}: not the leader, leader unknown");
                        self.rotate();
                    }
                    MonReply::Error { message } => return Err(MonClientError::Refused { message }),
                    reply => return Ok(reply),
                },
                Err(e) if e.is_retryable() => {
                    last = e.to_string();
                    self.rotate();
                }
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
        Err(MonClientError::Timeout {
            after: timeout,
            last,
        })
    }

    /// Runs a command. `MonReply::Error` becomes [`MonClientError::Refused`]; `NotLeader` is
    /// handled here and never returned.
    pub async fn command(&self, cmd: &MonCommand) -> Result<MonReply, MonClientError> {
        self.call(msg_type::MON_COMMAND, Bytes::from(kelp_proto::encode(cmd)))
            .await
    }

    /// Sends one service-map beacon (`MonCommand::ServiceBeacon`): this daemon's `name`,
    /// `kind` and endpoints (`"metrics"` → URL).
    pub async fn service_beacon(
        &self,
        name: &str,
        kind: &str,
        addrs: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), MonClientError> {
        let cmd = MonCommand::ServiceBeacon {
            name: name.to_string(),
            kind: kind.to_string(),
            addrs: addrs.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        self.command(&cmd).await.map(|_| ())
    }

    /// Sends a beacon every [`SERVICE_BEACON_INTERVAL`] until the task is aborted (failures
    /// are logged at debug level and retried at the next tick).
    pub fn spawn_service_beacons(
        self: &Arc<Self>,
        name: String,
        kind: String,
        addrs: std::collections::BTreeMap<String, String>,
    ) -> tokio::task::JoinHandle<()> {
        let mon = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SERVICE_BEACON_INTERVAL);
            loop {
                tick.tick().await;
                let sent = tokio::time::timeout(
                    SERVICE_BEACON_INTERVAL,
                    mon.service_beacon(&name, &kind, &addrs),
                )
                .await;
                if let Ok(Err(e)) = sent {
                    tracing::debug!("service beacon not taken: {e}");
                }
            }
        })
    }

    /// Reports this OSD booted (goes to the leader, which then watches this client's session).
    /// Returns the epoch at which the OSD is up.
    pub async fn osd_boot(&self, boot: &OsdBoot) -> Result<u32, MonClientError> {
        match self
            .call(
                msg_type::MON_OSD_BOOT,
                Bytes::from(kelp_proto::encode(boot)),
            )
            .await?
        {
            MonReply::Done { epoch } => Ok(epoch),
            other => Err(MonClientError::Refused {
                message: format!("unexpected reply {other:?}"),
            }),
        }
    }

    /// Sends this OSD's statistics to the leader (followers answer `NotLeader`, which is
    /// followed). Returns the settings the leader answers with.
    pub async fn osd_stats(&self, report: &OsdStatsReport) -> Result<StatsAck, MonClientError> {
        match self
            .call(
                msg_type::MON_OSD_STATS,
                Bytes::from(kelp_proto::encode(report)),
            )
            .await?
        {
            MonReply::StatsAck(ack) => Ok(ack),
            other => Err(MonClientError::Refused {
                message: format!("unexpected reply {other:?}"),
            }),
        }
    }

    /// Sends a heartbeat failure report (or its withdrawal) to the leader, giving up after
    /// `timeout` (the reporter resends a standing report anyway).
    pub async fn osd_failure(
        &self,
        report: &OsdFailure,
        timeout: Duration,
    ) -> Result<(), MonClientError> {
        self.call_within(
            msg_type::MON_OSD_FAILURE,
            Bytes::from(kelp_proto::encode(report)),
            timeout,
        )
        .await
        .map(|_| ())
    }

    /// Subscribes to OSD maps, starting after `have` (or with the full map). One subscription
    /// per client.
    pub fn subscribe(
        self: &Arc<Self>,
        have: Option<OsdMap>,
    ) -> Result<MapSubscription, MonClientError> {
        let pushes = self
            .pushes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(MonClientError::AlreadySubscribed)?;
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(subscription(self.clone(), have, pushes, tx));
        Ok(MapSubscription { rx })
    }

    /// Closes every connection.
    pub fn shutdown(&self) {
        self.msgr.shutdown();
    }
}

/// Returns false when the subscriber is gone.
async fn deliver(
    cur: &mut Option<OsdMap>,
    update: &MapUpdate,
    tx: &mpsc::Sender<Arc<OsdMap>>,
) -> Result<bool, MapError> {
    match apply_update(cur.as_ref(), update)? {
        Some(maps) => {
            for m in maps {
                *cur = Some(m.clone());
                if tx.send(Arc::new(m)).await.is_err() {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        None => Err(MapError::Decode {
            what: "map update",
            reason: "gap in incrementals".into(),
        }),
    }
}

async fn subscription(
    client: Arc<MonClient>,
    mut cur: Option<OsdMap>,
    mut pushes: mpsc::Receiver<Message>,
    tx: mpsc::Sender<Arc<OsdMap>>,
) {
    let per_try = Duration::from_secs(5);
    'resubscribe: loop {
        if tx.is_closed() {
            return;
        }
        let addr = client.current_monitor();
        let have = cur.as_ref().map_or(0, |m| m.epoch);
        let meta = Bytes::from(kelp_proto::encode(&Subscribe { have_epoch: have }));
        let conn = client.msgr.connection(addr);
        let update = match conn
            .call(msg_type::MON_SUBSCRIBE, meta, Bytes::new(), per_try)
            .await
        {
            Ok(resp) => kelp_proto::decode::<MapUpdate>(&resp.meta, "MapUpdate"),
            Err(MsgrError::Shutdown) => return,
            Err(e) => {
                debug!(%addr, error = %e, "subscribe failed; trying another monitor");
                client.rotate();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        match update {
            Ok(u) => match deliver(&mut cur, &u, &tx).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => debug!(error = %e, "bad subscribe reply"),
            },
            Err(e) => debug!(error = %e, "undecodable subscribe reply"),
        }
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                msg = pushes.recv() => {
                    let Some(msg) = msg else { return };
                    if msg.msg_type != msg_type::MON_MAP_UPDATE {
                        continue;
                    }
                    let Ok(u) = kelp_proto::decode::<MapUpdate>(&msg.meta, "MapUpdate") else {
                        continue 'resubscribe;
                    };
                    match deliver(&mut cur, &u, &tx).await {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(e) => {
                            debug!(error = %e, "resubscribing");
                            continue 'resubscribe;
                        }
                    }
                }
                _ = check.tick() => {
                    if tx.is_closed() {
                        return;
                    }
                    let alive = conn.peer().is_some_and(|p| !p.is_closed());
                    if !alive || client.current_monitor() != addr {
                        continue 'resubscribe;
                    }
                }
            }
        }
    }
}

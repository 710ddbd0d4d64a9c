//! The cluster handle: monitor session, the current OSD map, and op submission with retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_maps::{OsdMap, PoolSpec};
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
use crate::error::ClientError;
use crate::ioctx::IoCtx;

pub(crate) struct Inner {
    pub(crate) cfg: ClientConfig,
    pub(crate) mon: Arc<MonClient>,
    map_rx: watch::Receiver<Arc<OsdMap>>,
    next_reqid: AtomicU64,
    subscription: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.subscription.abort();
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
        Ok(Rados {
            inner: Arc::new(Inner {
                cfg,
                mon,
                map_rx,
                next_reqid: AtomicU64::new(start),
                subscription,
            }),
        })
    }

    /// The newest OSD map this client has.
    pub fn osd_map(&self) -> Arc<OsdMap> {
        self.inner.map_rx.borrow().clone()
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

    /// An I/O context on a pool (by name).
    pub async fn ioctx(&self, pool: &str) -> Result<IoCtx, ClientError> {
        let map = self.osd_map();
        let p = map
            .pool_by_name(pool)
            .ok_or_else(|| ClientError::NoSuchPool(pool.to_string()))?;
        Ok(IoCtx::new(self.clone(), p.id, pool))
    }

    /// The messenger used for OSD traffic (the monitor client's).
    pub(crate) fn msgr(&self) -> &Messenger {
        self.inner.mon.messenger()
    }
}

impl Inner {
    async fn wait_for_epoch(&self, epoch: u32, deadline: Instant) -> Option<Arc<OsdMap>> {
        let mut rx = self.map_rx.clone();
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.wait_for(|m| m.epoch >= epoch)).await {
            Ok(Ok(m)) => Some(m.clone()),
            _ => None,
        }
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

impl Rados {
    /// Sends one op on `object` to its PG's primary, following map changes until it succeeds,
    /// fails for good, or the op timeout passes. Returns the reply and its data.
    pub(crate) async fn submit(
        &self,
        object: &ObjectLocator,
        ops: Vec<OpKind>,
        data: Bytes,
    ) -> Result<(OsdOpReply, Bytes), ClientError> {
        let inner = &self.inner;
        let reqid = inner.next_reqid();
        let mut retry = Retry::new(inner.cfg.op_timeout);
        loop {
            if retry.expired() {
                return Err(ClientError::Timeout {
                    what: format!("operation on '{}'", object.name),
                    after: inner.cfg.op_timeout,
                    last: retry.last,
                });
            }
            let map = self.osd_map();
            let Some(pool) = map.pools.get(&object.pool) else {
                return Err(ClientError::NoSuchPool(object.pool.to_string()));
            };
            let pg =
                pool.placement()
                    .object_pg(&object.name, object.key.as_deref(), &object.namespace);
            let (primary, addr) = match primary_of(&map, pg) {
                Ok(p) => p,
                Err(why) => {
                    retry.wait(inner, map.epoch, why).await;
                    continue;
                }
            };
            let op = OsdOp {
                reqid,
                epoch: map.epoch,
                pg,
                object: object.clone(),
                ops: ops.clone(),
            };
            let call = self
                .msgr()
                .connection(addr)
                .call(msg_type::OSD_OP, encode(&op), data.clone(), retry.left())
                .await;
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
            let reply: OsdOpReply = decode(&resp.meta, "OsdOpReply")?;
            match reply.error {
                None => return Ok((reply, resp.data)),
                Some((ErrorCode::Misdirected | ErrorCode::Inactive | ErrorCode::Io, msg)) => {
                    // Stale map, PG not serving yet, or a replica failed: wait for the map to
                    // move on (or a short pause) and resend with the same request id.
                    let epoch = map.epoch.max(reply.epoch.saturating_sub(1));
                    retry
                        .wait(inner, epoch, format!("osd.{primary}: {msg}"))
                        .await;
                }
                Some((code, msg)) => return Err(ClientError::from_code(code, &object.name, msg)),
            }
        }
    }

    /// Lists one page of a PG's objects from its primary.
    pub(crate) async fn list_pg(
        &self,
        pg: PgId,
        cursor: Option<ListCursor>,
        max: u32,
    ) -> Result<PgListReply, ClientError> {
        let inner = &self.inner;
        let mut retry = Retry::new(inner.cfg.op_timeout);
        loop {
            if retry.expired() {
                return Err(ClientError::Timeout {
                    what: format!("listing PG {pg}"),
                    after: inner.cfg.op_timeout,
                    last: retry.last,
                });
            }
            let map = self.osd_map();
            if !map.pools.contains_key(&pg.pool.0) {
                return Err(ClientError::NoSuchPool(pg.pool.to_string()));
            }
            let (primary, addr) = match primary_of(&map, pg) {
                Ok(p) => p,
                Err(why) => {
                    retry.wait(inner, map.epoch, why).await;
                    continue;
                }
            };
            let req = PgList {
                pg,
                epoch: map.epoch,
                cursor: cursor.clone(),
                max,
            };
            let call = self
                .msgr()
                .connection(addr)
                .call(msg_type::OSD_PGLS, encode(&req), Bytes::new(), retry.left())
                .await;
            let resp = match call {
                Ok(r) => r,
                Err(e) if e.is_retryable() => {
                    retry
                        .wait(inner, map.epoch, format!("osd.{primary}: {e}"))
                        .await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let reply: PgListReply = decode(&resp.meta, "PgListReply")?;
            match &reply.error {
                None => return Ok(reply),
                Some((ErrorCode::Misdirected | ErrorCode::Inactive | ErrorCode::Io, msg)) => {
                    let msg = msg.clone();
                    retry
                        .wait(inner, map.epoch, format!("osd.{primary}: {msg}"))
                        .await;
                }
                Some((code, msg)) => {
                    return Err(ClientError::from_code(*code, &pg.to_string(), msg.clone()));
                }
            }
        }
    }
}

fn primary_of(map: &OsdMap, pg: PgId) -> Result<(i32, std::net::SocketAddr), String> {
    let m = map.pg_mapping(pg).map_err(|e| e.to_string())?;
    if m.acting_primary < 0 {
        return Err(format!("PG {pg} has no OSD up at epoch {}", map.epoch));
    }
    let addr = map
        .osds
        .get(&m.acting_primary)
        .and_then(|o| o.addr)
        .ok_or_else(|| format!("osd.{} has no address", m.acting_primary))?;
    Ok((m.acting_primary, addr))
}

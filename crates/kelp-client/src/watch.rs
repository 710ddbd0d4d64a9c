//! Watch/notify (librados `watch2`/`notify2`) and fencing (`osd blocklist`), the client side.
//!
//! Each `Rados` has its own instance name and its own messenger for OSD traffic, whose
//! connections carry the OSDs' pushes (`OSD_WATCH_EVENT`); a router task hands each event to
//! its watch by cookie. Every watch has a keeper task that pings it (at a third of the OSD's
//! `osd_client_watch_timeout`) and registers it again with the object's primary when the map
//! names another primary, or when a ping finds the OSD without it while it is too young to
//! have been timed out (a new primary, or a restarted one). A watch the OSD dropped (error
//! event), or that could not be registered again before it would have timed out, ends with a
//! `WatchEvent::Error`.
//!
//! ```no_run
//! # async fn demo(io: kelp_client::IoCtx) -> Result<(), kelp_client::ClientError> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use kelp_client::WatchEvent;
//!
//! let mut watch = io.watch("img.header").await?;
//! let notifier = io.clone();
//! tokio::spawn(async move {
//!     let result = notifier
//!         .notify("img.header", Bytes::from_static(b"release"), Duration::from_secs(5))
//!         .await?;
//!     for ack in result.acks {
//!         println!("{} answered {:?}", ack.watcher.instance, ack.reply);
//!     }
//!     Ok::<_, kelp_client::ClientError>(())
//! });
//! while let Some(event) = watch.next().await {
//!     match event {
//!         WatchEvent::Notify(n) => watch.ack(n.id, Bytes::from_static(b"done")).await?,
//!         WatchEvent::Error(e) => return Err(e), // lost or fenced: watch again
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_msgr::{ChannelDispatcher, Message, Messenger};
use kelp_proto::{
    ErrorCode, MonCommand, MonReply, ObjectLocator, WatchEventKind, WatchOp, WatchReply,
    WatchRequest, WatchResult, WatcherId, decode, encode, msg_type,
};
use tokio::sync::mpsc;
use tracing::debug;

use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::ioctx::IoCtx;
use crate::rados::{Inner, PrimaryReply, Rados, primary_of};

/// One blocklisted client instance and when its entry expires (unix ms; `None`: never).
pub use kelp_proto::BlocklistEntry;

/// What a watch receives.
#[derive(Debug)]
pub enum WatchEvent {
    Notify(Notification),
    /// The watch is lost (`ClientError::WatchLost`, or `Blocklisted`); no event follows.
    Error(ClientError),
}

/// A notification: acknowledge it with [`Watch::ack`] (the notifier waits for that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub id: u64,
    /// The notifier's instance name.
    pub notifier: String,
    pub payload: Bytes,
}

/// The outcome of a notify: the watchers that acknowledged, with their replies, and those
/// that did not within the timeout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NotifyResult {
    pub acks: Vec<NotifyAck>,
    pub timed_out: Vec<WatcherInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyAck {
    pub watcher: WatcherInfo,
    pub reply: Bytes,
}

/// One watch of an object: the client instance and its cookie.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatcherInfo {
    pub instance: String,
    pub cookie: u64,
}

impl From<WatcherId> for WatcherInfo {
    fn from(w: WatcherId) -> Self {
        WatcherInfo {
            instance: w.instance,
            cookie: w.cookie,
        }
    }
}

impl PrimaryReply for WatchReply {
    const NAME: &'static str = "WatchReply";
    fn error(&self) -> Option<&(ErrorCode, String)> {
        self.error.as_ref()
    }
    fn epoch(&self) -> u32 {
        self.epoch
    }
}

/// `client.admin` → `client.admin.3f09c2d4e5a6b7c8`: the entity and a random nonce.
pub(crate) fn instance_name(entity: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    // `RandomState` is seeded from the OS's randomness; mixing in the clock and the pid keeps
    // two connections of one process apart as well.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{entity}.{:016x}", h.finish())
}

/// How many notify ids a watch remembers, to drop a notification resent after a reconnect.
const SEEN_NOTIFIES: usize = 256;

struct Slot {
    object: ObjectLocator,
    tx: mpsc::UnboundedSender<WatchEvent>,
    seen: VecDeque<u64>,
}

/// The watches of one instance, by cookie.
#[derive(Default)]
pub(crate) struct Registry {
    slots: Mutex<HashMap<u64, Slot>>,
    next_cookie: AtomicU64,
}

impl Registry {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn contains(&self, cookie: u64) -> bool {
        self.slots().contains_key(&cookie)
    }

    /// Ends a watch with an error event.
    fn fail(&self, cookie: u64, error: ClientError) {
        if let Some(slot) = self.slots().remove(&cookie) {
            let _ = slot.tx.send(WatchEvent::Error(error));
        }
    }

    fn route(&self, msg: Message) {
        if msg.msg_type != msg_type::OSD_WATCH_EVENT {
            return;
        }
        let event: kelp_proto::WatchEvent = match decode(&msg.meta, "WatchEvent") {
            Ok(e) => e,
            Err(e) => {
                debug!(peer = %msg.peer, "undecodable watch event: {e}");
                return;
            }
        };
        match event.kind {
            WatchEventKind::Notify {
                notify_id,
                notifier,
            } => {
                let mut slots = self.slots();
                let Some(slot) = slots.get_mut(&event.cookie) else {
                    return;
                };
                if slot.seen.contains(&notify_id) {
                    return;
                }
                if slot.seen.len() == SEEN_NOTIFIES {
                    slot.seen.pop_front();
                }
                slot.seen.push_back(notify_id);
                let _ = slot.tx.send(WatchEvent::Notify(Notification {
                    id: notify_id,
                    notifier,
                    payload: msg.data,
                }));
            }
            WatchEventKind::Error { code, message } => {
                let object = self
                    .slots()
                    .get(&event.cookie)
                    .map(|s| s.object.name.clone())
                    .unwrap_or_default();
                let error = match code {
                    ErrorCode::Blocklisted => ClientError::Blocklisted(message),
                    _ => ClientError::WatchLost {
                        object,
                        reason: message,
                    },
                };
                self.fail(event.cookie, error);
            }
        }
    }
}

/// The messenger for this instance's OSD traffic, and the watch registry its pushes go to.
pub(crate) fn osd_messenger(cfg: &ClientConfig) -> Result<(Messenger, Arc<Registry>), ClientError> {
    let (dispatcher, mut pushes) = ChannelDispatcher::new(1024);
    let msgr = Messenger::builder(cfg.entity.clone())
        .secret(cfg.secret.clone())
        .dispatcher(dispatcher)
        .build()?;
    let registry = Arc::new(Registry::default());
    let router = Arc::downgrade(&registry);
    tokio::spawn(async move {
        while let Some(msg) = pushes.recv().await {
            match router.upgrade() {
                Some(r) => r.route(msg),
                None => return,
            }
        }
    });
    Ok((msgr, registry))
}

/// A watch on an object. Dropping it unwatches (best effort).
pub struct Watch {
    rados: Rados,
    object: ObjectLocator,
    cookie: u64,
    rx: mpsc::UnboundedReceiver<WatchEvent>,
    keeper: tokio::task::JoinHandle<()>,
    unwatched: bool,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("object", &self.object.name)
            .field("cookie", &self.cookie)
            .finish_non_exhaustive()
    }
}

impl Watch {
    pub fn cookie(&self) -> u64 {
        self.cookie
    }

    /// The next event; `None` once the watch has ended (after an error event, or unwatch).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }

    /// Acknowledges notification `notify_id` with a reply for the notifier.
    pub async fn ack(&self, notify_id: u64, reply: Bytes) -> Result<(), ClientError> {
        let op = WatchOp::NotifyAck {
            notify_id,
            cookie: self.cookie,
        };
        self.rados
            .watch_call(&self.object, op, reply, None)
            .await
            .map(drop)
    }

    /// Ends the watch.
    pub async fn unwatch(mut self) -> Result<(), ClientError> {
        self.unwatched = true;
        self.stop();
        let op = WatchOp::Unwatch {
            cookie: self.cookie,
        };
        self.rados
            .watch_call(&self.object, op, Bytes::new(), None)
            .await
            .map(drop)
    }

    fn stop(&mut self) {
        self.keeper.abort();
        self.rados.inner.watches.slots().remove(&self.cookie);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.unwatched {
            return;
        }
        self.stop();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (rados, object, cookie) = (self.rados.clone(), self.object.clone(), self.cookie);
            rt.spawn(async move {
                let op = WatchOp::Unwatch { cookie };
                if let Err(e) = rados.watch_call(&object, op, Bytes::new(), None).await {
                    debug!(object = %object.name, "unwatch on drop failed: {e}");
                }
            });
        }
    }
}

impl Rados {
    /// Sends one watch operation on `object` to its PG's primary (following map changes,
    /// like every op), within `timeout` (default: the op timeout).
    pub(crate) async fn watch_call(
        &self,
        object: &ObjectLocator,
        op: WatchOp,
        data: Bytes,
        timeout: Option<Duration>,
    ) -> Result<(WatchReply, Bytes), ClientError> {
        let reqid = self.inner.next_reqid();
        let timeout = timeout.unwrap_or(self.inner.cfg.op_timeout);
        self.call_primary_within(
            timeout,
            &format!("{op:?} on '{}'", object.name),
            &object.name,
            msg_type::OSD_WATCH,
            |map| crate::rados::object_pg(map, object),
            |pg, epoch| {
                encode(&WatchRequest {
                    reqid,
                    epoch,
                    pg,
                    object: object.clone(),
                    instance: self.inner.instance.clone(),
                    op: op.clone(),
                })
            },
            data,
        )
        .await
    }

    /// `osd blocklist add`: fences client `instance` (for `expire`, or until removed). Returns
    /// the OSD map epoch that has it, once this client has that map; every op this client
    /// sends from then on carries that epoch, so an OSD applies the blocklist before it.
    pub async fn blocklist_add(
        &self,
        instance: &str,
        expire: Option<Duration>,
    ) -> Result<u32, ClientError> {
        let cmd = MonCommand::BlocklistAdd {
            instance: instance.to_string(),
            expire_secs: expire.map(|d| d.as_secs().max(1)),
        };
        self.map_command(cmd).await
    }

    /// `osd blocklist rm`: lifts the fence of `instance`; returns the epoch (as
    /// [`Rados::blocklist_add`]).
    pub async fn blocklist_rm(&self, instance: &str) -> Result<u32, ClientError> {
        let cmd = MonCommand::BlocklistRm {
            instance: instance.to_string(),
        };
        self.map_command(cmd).await
    }

    /// `osd blocklist ls`: the fenced instances, sorted.
    pub async fn blocklist_ls(&self) -> Result<Vec<BlocklistEntry>, ClientError> {
        match self.mon_command(MonCommand::BlocklistLs).await? {
            MonReply::Blocklist(entries) => Ok(entries),
            other => Err(ClientError::Invalid(format!("unexpected reply {other:?}"))),
        }
    }
}

impl IoCtx {
    /// Watches object `name` (which must exist): notifies on it arrive as
    /// [`WatchEvent::Notify`] until the watch is dropped or unwatched.
    pub async fn watch(&self, name: &str) -> Result<Watch, ClientError> {
        let rados = self.rados().clone();
        let object = self.loc(name);
        let registry = rados.inner.watches.clone();
        let cookie = registry.next_cookie.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = mpsc::unbounded_channel();
        // Registered before the OSD has it: a notify may arrive before the answer does.
        registry.slots().insert(
            cookie,
            Slot {
                object: object.clone(),
                tx,
                seen: VecDeque::new(),
            },
        );
        let primary = current_primary(&rados.inner, &object);
        let registered = rados
            .watch_call(&object, WatchOp::Watch { cookie }, Bytes::new(), None)
            .await;
        let timeout = match registered {
            Ok((reply, _)) => watch_timeout(&reply.result),
            Err(e) => {
                registry.slots().remove(&cookie);
                return Err(e);
            }
        };
        let keeper = tokio::spawn(keep(
            Arc::downgrade(&rados.inner),
            object.clone(),
            cookie,
            primary,
            timeout,
        ));
        Ok(Watch {
            rados,
            object,
            cookie,
            rx,
            keeper,
            unwatched: false,
        })
    }

    /// Notifies every watcher of object `name` (which must exist) with `payload` and waits
    /// until all acknowledged or `timeout` passed.
    pub async fn notify(
        &self,
        name: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<NotifyResult, ClientError> {
        let rados = self.rados();
        let op = WatchOp::Notify {
            timeout_ms: timeout.as_millis() as u64,
        };
        // The notify itself may take `timeout`; a failover may make it start over.
        let within = timeout + rados.inner.cfg.op_timeout;
        let (reply, data) = rados
            .watch_call(&self.loc(name), op, payload, Some(within))
            .await?;
        match reply.result {
            WatchResult::Notified { acks, timed_out } => {
                let mut at = 0usize;
                let mut out = Vec::with_capacity(acks.len());
                for (watcher, len) in acks {
                    let end = at.saturating_add(len as usize);
                    let reply = data.get(at..end).ok_or_else(|| {
                        ClientError::Invalid("notify replies shorter than announced".into())
                    })?;
                    out.push(NotifyAck {
                        watcher: watcher.into(),
                        reply: data.slice_ref(reply),
                    });
                    at = end;
                }
                Ok(NotifyResult {
                    acks: out,
                    timed_out: timed_out.into_iter().map(Into::into).collect(),
                })
            }
            other => Err(ClientError::Invalid(format!("notify returned {other:?}"))),
        }
    }

    /// The current watchers of object `name` (which must exist).
    pub async fn watchers(&self, name: &str) -> Result<Vec<WatcherInfo>, ClientError> {
        let (reply, _) = self
            .rados()
            .watch_call(&self.loc(name), WatchOp::ListWatchers, Bytes::new(), None)
            .await?;
        match reply.result {
            WatchResult::Watchers(w) => Ok(w.into_iter().map(Into::into).collect()),
            other => Err(ClientError::Invalid(format!(
                "listwatchers returned {other:?}"
            ))),
        }
    }
}

fn watch_timeout(result: &WatchResult) -> Duration {
    match result {
        WatchResult::Watching { timeout_ms } => Duration::from_millis(*timeout_ms),
        _ => kelp_config::keys::OSD_CLIENT_WATCH_TIMEOUT
            .default
            .as_duration(),
    }
}

/// The object's primary (and its address) in the client's current map.
fn current_primary(inner: &Inner, object: &ObjectLocator) -> Option<(i32, SocketAddr)> {
    let map = inner.map_rx.borrow().clone();
    let pool = map.pools.get(&object.pool)?;
    let pg = pool
        .placement()
        .object_pg(&object.name, object.key.as_deref(), &object.namespace);
    primary_of(&map, &inner.mappings, pg).ok()
}

/// Keeps one watch registered: pings it, and registers it again after a failover. Ends when
/// the watch ends or the client is dropped.
async fn keep(
    inner: Weak<Inner>,
    object: ObjectLocator,
    cookie: u64,
    mut primary: Option<(i32, SocketAddr)>,
    mut timeout: Duration,
) {
    let mut last_ok = Instant::now();
    let mut map_rx = match inner.upgrade() {
        Some(i) => i.map_rx.clone(),
        None => return,
    };
    loop {
        let interval = (timeout / 3).max(Duration::from_millis(200));
        let moved = tokio::select! {
            changed = map_rx.changed() => {
                if changed.is_err() {
                    return;
                }
                true
            }
            () = tokio::time::sleep(interval.saturating_sub(last_ok.elapsed())) => false,
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !inner.watches.contains(cookie) {
            return;
        }
        let now_primary = current_primary(&inner, &object);
        if moved && now_primary == primary {
            continue;
        }
        let rados = Rados {
            inner: inner.clone(),
        };
        let register = now_primary != primary;
        let outcome = if register {
            reregister(&rados, &object, cookie).await
        } else {
            let ping = rados
                .watch_call(
                    &object,
                    WatchOp::Ping { cookie },
                    Bytes::new(),
                    Some(timeout.min(inner.cfg.op_timeout)),
                )
                .await;
            match ping {
                Ok((reply, _)) if reply.result == WatchResult::NotWatching => {
                    if last_ok.elapsed() < timeout {
                        // Too young to have timed out: a new (or restarted) primary.
                        reregister(&rados, &object, cookie).await
                    } else {
                        Err(ClientError::WatchLost {
                            object: object.name.clone(),
                            reason: "the OSD dropped the watch (not pinged within \
                                     osd_client_watch_timeout)"
                                .into(),
                        })
                    }
                }
                other => other.map(|(reply, _)| watch_timeout(&reply.result)),
            }
        };
        match outcome {
            Ok(t) => {
                timeout = t;
                last_ok = Instant::now();
                primary = now_primary;
            }
            Err(e @ (ClientError::Blocklisted(_) | ClientError::WatchLost { .. })) => {
                inner.watches.fail(cookie, e);
                return;
            }
            Err(e @ (ClientError::NotFound { .. } | ClientError::NoSuchPool(_))) => {
                inner.watches.fail(cookie, e);
                return;
            }
            Err(e) if last_ok.elapsed() >= timeout => {
                inner.watches.fail(
                    cookie,
                    ClientError::WatchLost {
                        object: object.name.clone(),
                        reason: format!(
                            "could not reach the object's primary within the watch timeout: {e}"
                        ),
                    },
                );
                return;
            }
            Err(e) => {
                debug!(object = %object.name, cookie, "watch keeper: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

async fn reregister(
    rados: &Rados,
    object: &ObjectLocator,
    cookie: u64,
) -> Result<Duration, ClientError> {
    debug!(object = %object.name, cookie, "registering the watch again");
    let (reply, _) = rados
        .watch_call(object, WatchOp::Watch { cookie }, Bytes::new(), None)
        .await?;
    Ok(watch_timeout(&reply.result))
}

//! Watch/notify on objects (librados `watch2`/`notify2`) and client fencing (`osd blocklist`),
//! as the primary of the object's PG.
//!
//! Where the state lives: in the primary's memory only. Watches are not data: they are never
//! written to the store, replicated or logged, so they work the same on replicated and
//! erasure-coded pools and cost no I/O.
//!
//! Failover: a new primary starts with no watches. Clients re-register theirs (`WatchOp::Watch`
//! again) as soon as their map names another primary for the object's PG, and whenever a ping
//! is answered `NotWatching` while the watch is still young enough that this OSD cannot have
//! timed it out; re-registering moves the pushes to the connection it came on and resends the
//! notifies still waiting for that watch. An OSD drops the watches of PGs it is no longer the
//! primary of, and aborts their pending notifies (the notifier resends to the new primary).
//!
//! Expiry: a watch not pinged for `osd_client_watch_timeout` is dropped (its client is
//! presumed dead; an error event is pushed in case it is not), and a notify still waiting for
//! it counts it as timed out.
//!
//! Fencing: `fenced` says whether the map blocklists an op's instance; the service refuses
//! such ops before they start, and `Watches::on_map` drops the instance's watches.
//!
//! `WatchTable` is the pure core (no I/O, no clock: `now` is passed in; generic over the
//! connection handle so unit tests use plain values); `Watches` wraps it for the service:
//! locking, pushing over the messenger, and waking the notifier.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use kelp_maps::OsdMap;
use kelp_msgr::Peer;
use kelp_proto::{
    ErrorCode, ObjectLocator, WatchEvent, WatchEventKind, WatchOp, WatchReply, WatchRequest,
    WatchResult, WatcherId, encode, msg_type,
};
use kelp_types::PgId;
use tokio::sync::oneshot;
use tracing::debug;

/// Why an op of `instance` must be refused: the map blocklists it (now).
pub fn fenced(map: &OsdMap, instance: &str) -> Option<(ErrorCode, String)> {
    if map.blocklist.is_empty() {
        return None;
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    map.is_blocklisted(instance, now_ms).then(|| {
        (
            ErrorCode::Blocklisted,
            format!(
                "client instance {instance} is blocklisted (OSD map epoch {})",
                map.epoch
            ),
        )
    })
}

// ---- the pure core ------------------------------------------------------------------------

struct Watcher<C> {
    conn: C,
    last_ping: Instant,
    /// The timeout this watcher was told at its last registration or ping: it pings at a
    /// third of that, so a changed timeout applies to it from its next ping on.
    timeout: Duration,
}

struct Watched<C> {
    pg: PgId,
    watchers: BTreeMap<WatcherId, Watcher<C>>,
}

struct Pending {
    pg: PgId,
    object: ObjectLocator,
    notifier: String,
    payload: Bytes,
    /// Watchers that have not acknowledged yet.
    waiting: BTreeSet<WatcherId>,
    acks: Vec<(WatcherId, Bytes)>,
    /// Watchers dropped (timed out, fenced) before acknowledging: reported as timed out.
    gone: Vec<WatcherId>,
    deadline: Instant,
}

/// A message for one watcher's connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Push<C> {
    pub conn: C,
    pub cookie: u64,
    pub object: ObjectLocator,
    pub kind: PushKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PushKind {
    Notify {
        notify_id: u64,
        notifier: String,
        payload: Bytes,
    },
    /// The watch was dropped.
    Error { code: ErrorCode, message: String },
}

/// A finished notify: who acknowledged (with replies) and who did not in time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NotifyDone {
    pub id: u64,
    pub acks: Vec<(WatcherId, Bytes)>,
    pub timed_out: Vec<WatcherId>,
}

/// What a decision of the table asks the caller to do.
#[derive(Debug)]
pub struct Effects<C> {
    pub pushes: Vec<Push<C>>,
    pub done: Vec<NotifyDone>,
    /// Notifies given up without an answer (this OSD is no longer the PG's primary).
    pub aborted: Vec<u64>,
}

impl<C> Default for Effects<C> {
    fn default() -> Self {
        Effects {
            pushes: Vec::new(),
            done: Vec::new(),
            aborted: Vec::new(),
        }
    }
}

/// The watchers of the objects of the PGs this OSD is primary of, and the notifies in
/// progress. Invariant: a pending notify waits only for watchers it was sent to that have
/// neither acknowledged nor been dropped; it completes as soon as none is left.
pub struct WatchTable<C> {
    objects: BTreeMap<ObjectLocator, Watched<C>>,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
}

impl<C> Default for WatchTable<C> {
    fn default() -> Self {
        WatchTable {
            objects: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_id: 1,
        }
    }
}

impl<C: Clone> WatchTable<C> {
    /// A table whose notify ids start at `first_id` (notify ids must not repeat across
    /// primaries: clients drop a notification whose id they have seen, as a resend).
    pub fn starting_at(first_id: u64) -> Self {
        WatchTable {
            next_id: first_id.max(1),
            ..WatchTable::default()
        }
    }

    /// Registers (or re-registers) a watch, to expire if not pinged within `timeout`;
    /// resends the notifies still waiting for it.
    pub fn watch(
        &mut self,
        pg: PgId,
        object: &ObjectLocator,
        who: WatcherId,
        conn: C,
        now: Instant,
        timeout: Duration,
    ) -> Effects<C> {
        let watched = self
            .objects
            .entry(object.clone())
            .or_insert_with(|| Watched {
                pg,
                watchers: BTreeMap::new(),
            });
        watched.pg = pg;
        watched.watchers.insert(
            who.clone(),
            Watcher {
                conn: conn.clone(),
                last_ping: now,
                timeout,
            },
        );
        let mut fx = Effects::default();
        for (id, p) in &self.pending {
            if p.object == *object && p.waiting.contains(&who) {
                fx.pushes.push(Push {
                    conn: conn.clone(),
                    cookie: who.cookie,
                    object: object.clone(),
                    kind: PushKind::Notify {
                        notify_id: *id,
                        notifier: p.notifier.clone(),
                        payload: p.payload.clone(),
                    },
                });
            }
        }
        fx
    }

    /// Keeps a watch alive for another `timeout` (and its pushes on `conn`); false if there
    /// is no such watch.
    pub fn ping(
        &mut self,
        object: &ObjectLocator,
        who: &WatcherId,
        conn: C,
        now: Instant,
        timeout: Duration,
    ) -> bool {
        match self
            .objects
            .get_mut(object)
            .and_then(|w| w.watchers.get_mut(who))
        {
            Some(w) => {
                w.conn = conn;
                w.last_ping = now;
                w.timeout = timeout;
                true
            }
            None => false,
        }
    }

    /// Ends a watch. Notifies waiting for it stop waiting (it is neither an ack nor a timeout).
    pub fn unwatch(&mut self, object: &ObjectLocator, who: &WatcherId) -> Effects<C> {
        self.remove_watcher(object, who);
        let mut fx = Effects::default();
        self.settle(|p| p.waiting.remove(who), &mut fx);
        fx
    }

    /// Starts a notify from `notifier`; returns its id. Completes at once without watchers.
    pub fn notify(
        &mut self,
        pg: PgId,
        object: &ObjectLocator,
        notifier: &str,
        payload: Bytes,
        timeout: Duration,
        now: Instant,
    ) -> (u64, Effects<C>) {
        let id = self.next_id;
        self.next_id += 1;
        let mut fx = Effects::default();
        let mut waiting = BTreeSet::new();
        if let Some(w) = self.objects.get(object) {
            for (who, watcher) in &w.watchers {
                waiting.insert(who.clone());
                fx.pushes.push(Push {
                    conn: watcher.conn.clone(),
                    cookie: who.cookie,
                    object: object.clone(),
                    kind: PushKind::Notify {
                        notify_id: id,
                        notifier: notifier.to_string(),
                        payload: payload.clone(),
                    },
                });
            }
        }
        if waiting.is_empty() {
            fx.done.push(NotifyDone {
                id,
                ..NotifyDone::default()
            });
        } else {
            self.pending.insert(
                id,
                Pending {
                    pg,
                    object: object.clone(),
                    notifier: notifier.to_string(),
                    payload,
                    waiting,
                    acks: Vec::new(),
                    gone: Vec::new(),
                    deadline: now + timeout,
                },
            );
        }
        (id, fx)
    }

    /// A watcher's acknowledgement. Unknown notifies (finished, or started on another
    /// primary) and repeated acks are ignored.
    pub fn ack(&mut self, id: u64, who: &WatcherId, reply: Bytes) -> Effects<C> {
        let mut fx = Effects::default();
        if let Some(p) = self.pending.get_mut(&id)
            && p.waiting.remove(who)
        {
            p.acks.push((who.clone(), reply));
        }
        self.settle(|_| false, &mut fx);
        fx
    }

    /// The watchers of `object`.
    pub fn watchers(&self, object: &ObjectLocator) -> Vec<WatcherId> {
        self.objects
            .get(object)
            .map(|w| w.watchers.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Drops the watches not pinged within their timeout (with an error event to each) and
    /// finishes the notifies whose deadline has passed.
    pub fn tick(&mut self, now: Instant) -> Effects<C> {
        let expired: Vec<(ObjectLocator, WatcherId, C)> = self
            .objects
            .iter()
            .flat_map(|(object, w)| {
                w.watchers
                    .iter()
                    .filter(|(_, watcher)| {
                        now.saturating_duration_since(watcher.last_ping) >= watcher.timeout
                    })
                    .map(|(who, watcher)| (object.clone(), who.clone(), watcher.conn.clone()))
            })
            .collect();
        let message = "not pinged within osd_client_watch_timeout";
        self.drop_watchers(expired, ErrorCode::Io, message, now)
    }

    /// Drops every watch of the instances `fenced` says are blocklisted.
    pub fn drop_instances(&mut self, fenced: impl Fn(&str) -> bool, now: Instant) -> Effects<C> {
        let dropped: Vec<(ObjectLocator, WatcherId, C)> = self
            .objects
            .iter()
            .flat_map(|(object, w)| {
                w.watchers
                    .iter()
                    .filter(|(who, _)| fenced(&who.instance))
                    .map(|(who, watcher)| (object.clone(), who.clone(), watcher.conn.clone()))
            })
            .collect();
        self.drop_watchers(
            dropped,
            ErrorCode::Blocklisted,
            "the client instance is blocklisted",
            now,
        )
    }

    /// Forgets the watches of the PGs `keep` refuses (this OSD is no longer their primary:
    /// the clients re-register with the new one) and aborts their notifies.
    pub fn drop_pgs(&mut self, keep: impl Fn(PgId) -> bool) -> Effects<C> {
        self.objects.retain(|_, w| keep(w.pg));
        let mut fx = Effects::default();
        let aborted: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !keep(p.pg))
            .map(|(id, _)| *id)
            .collect();
        for id in &aborted {
            self.pending.remove(id);
        }
        fx.aborted = aborted;
        fx
    }

    fn remove_watcher(&mut self, object: &ObjectLocator, who: &WatcherId) {
        if let Some(w) = self.objects.get_mut(object) {
            w.watchers.remove(who);
            if w.watchers.is_empty() {
                self.objects.remove(object);
            }
        }
    }

    fn drop_watchers(
        &mut self,
        dropped: Vec<(ObjectLocator, WatcherId, C)>,
        code: ErrorCode,
        message: &str,
        now: Instant,
    ) -> Effects<C> {
        let mut fx = Effects::default();
        for (object, who, conn) in dropped {
            self.remove_watcher(&object, &who);
            for p in self.pending.values_mut() {
                if p.object == object && p.waiting.remove(&who) {
                    p.gone.push(who.clone());
                }
            }
            fx.pushes.push(Push {
                conn,
                cookie: who.cookie,
                object,
                kind: PushKind::Error {
                    code,
                    message: message.to_string(),
                },
            });
        }
        self.settle(|p| p.deadline <= now, &mut fx);
        fx
    }

    /// Finishes the notifies that wait for nobody, or for which `expire` holds (the rest of
    /// their watchers time out).
    fn settle(&mut self, mut expire: impl FnMut(&mut Pending) -> bool, fx: &mut Effects<C>) {
        let finished: Vec<u64> = self
            .pending
            .iter_mut()
            .filter_map(|(id, p)| {
                let expired = expire(p);
                (expired || p.waiting.is_empty()).then_some(*id)
            })
            .collect();
        for id in finished {
            let Some(p) = self.pending.remove(&id) else {
                continue;
            };
            let mut timed_out = p.gone;
            timed_out.extend(p.waiting);
            fx.done.push(NotifyDone {
                id,
                acks: p.acks,
                timed_out,
            });
        }
    }
}

// ---- the service's side -------------------------------------------------------------------

/// The OSD's watch state: the table, the notifiers waiting for their answers, and the watch
/// timeout (`osd_client_watch_timeout`, changed at runtime from the central config).
pub struct Watches {
    table: Mutex<WatchTable<Peer>>,
    waiters: Mutex<HashMap<u64, oneshot::Sender<NotifyDone>>>,
    timeout_ms: AtomicU64,
}

impl Default for Watches {
    fn default() -> Self {
        let timeout = kelp_config::keys::OSD_CLIENT_WATCH_TIMEOUT
            .default
            .as_duration();
        // Notify ids start from the clock: a later primary of the same objects (another OSD,
        // or this one restarted) never reuses one a watcher may have seen.
        let first_id = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Watches {
            table: Mutex::new(WatchTable::starting_at(first_id)),
            waiters: Mutex::new(HashMap::new()),
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
        }
    }
}

/// How often watches and notifies are checked for expiry.
const TICK: Duration = Duration::from_millis(200);
/// Longest notify timeout accepted.
const MAX_NOTIFY_TIMEOUT: Duration = Duration::from_secs(3600);

impl Watches {
    fn table(&self) -> std::sync::MutexGuard<'_, WatchTable<Peer>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<NotifyDone>>> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `osd_client_watch_timeout`.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// Sends the pushes, wakes finished notifiers, and drops aborted ones (their notifier is
    /// answered `Misdirected` and resends).
    fn apply(&self, fx: Effects<Peer>) {
        {
            let mut waiters = self.waiters();
            for done in fx.done {
                if let Some(tx) = waiters.remove(&done.id) {
                    let _ = tx.send(done);
                }
            }
            for id in fx.aborted {
                waiters.remove(&id);
            }
        }
        if fx.pushes.is_empty() {
            return;
        }
        // One task per batch keeps the pushes to one client in order.
        tokio::spawn(async move {
            for push in fx.pushes {
                let (kind, payload) = match push.kind {
                    PushKind::Notify {
                        notify_id,
                        notifier,
                        payload,
                    } => (
                        WatchEventKind::Notify {
                            notify_id,
                            notifier,
                        },
                        payload,
                    ),
                    PushKind::Error { code, message } => {
                        (WatchEventKind::Error { code, message }, Bytes::new())
                    }
                };
                let event = WatchEvent {
                    cookie: push.cookie,
                    object: push.object,
                    kind,
                };
                if let Err(e) = push
                    .conn
                    .send(msg_type::OSD_WATCH_EVENT, encode(&event), payload)
                    .await
                {
                    debug!(peer = %push.conn, "watch event not delivered: {e}");
                }
            }
        });
    }

    /// Serves an admitted watch request (the service checked the map, the PG and the object).
    pub async fn handle(
        &self,
        peer: Peer,
        req: &WatchRequest,
        data: Bytes,
        epoch: u32,
    ) -> (WatchReply, Bytes) {
        let reply = |result| WatchReply {
            error: None,
            epoch,
            result,
        };
        let who = |cookie| WatcherId {
            instance: req.instance.clone(),
            cookie,
        };
        let now = Instant::now();
        let timeout = self.timeout();
        let watching = WatchResult::Watching {
            timeout_ms: timeout.as_millis() as u64,
        };
        match &req.op {
            WatchOp::Watch { cookie } => {
                let fx = self
                    .table()
                    .watch(req.pg, &req.object, who(*cookie), peer, now, timeout);
                self.apply(fx);
                (reply(watching), Bytes::new())
            }
            WatchOp::Ping { cookie } => {
                let known = self
                    .table()
                    .ping(&req.object, &who(*cookie), peer, now, timeout);
                let result = if known {
                    watching
                } else {
                    WatchResult::NotWatching
                };
                (reply(result), Bytes::new())
            }
            WatchOp::Unwatch { cookie } => {
                let fx = self.table().unwatch(&req.object, &who(*cookie));
                self.apply(fx);
                (reply(WatchResult::None), Bytes::new())
            }
            WatchOp::NotifyAck { notify_id, cookie } => {
                let fx = self.table().ack(*notify_id, &who(*cookie), data);
                self.apply(fx);
                (reply(WatchResult::None), Bytes::new())
            }
            WatchOp::ListWatchers => (
                reply(WatchResult::Watchers(self.table().watchers(&req.object))),
                Bytes::new(),
            ),
            WatchOp::Notify { timeout_ms } => {
                let timeout = Duration::from_millis(*timeout_ms).clamp(TICK, MAX_NOTIFY_TIMEOUT);
                let (tx, rx) = oneshot::channel();
                let fx = {
                    let mut table = self.table();
                    let (id, fx) =
                        table.notify(req.pg, &req.object, &req.instance, data, timeout, now);
                    // Registered under the table's lock: no tick can finish it unseen.
                    self.waiters().insert(id, tx);
                    fx
                };
                self.apply(fx);
                match tokio::time::timeout(timeout + 4 * TICK, rx).await {
                    Ok(Ok(done)) => {
                        let mut out = BytesMut::new();
                        let acks = done
                            .acks
                            .into_iter()
                            .map(|(w, r)| {
                                out.extend_from_slice(&r);
                                (w, r.len() as u64)
                            })
                            .collect();
                        (
                            reply(WatchResult::Notified {
                                acks,
                                timed_out: done.timed_out,
                            }),
                            out.freeze(),
                        )
                    }
                    _ => (
                        WatchReply {
                            error: Some((
                                ErrorCode::Misdirected,
                                "the notify was interrupted by a change of the PG's primary".into(),
                            )),
                            epoch,
                            result: WatchResult::None,
                        },
                        Bytes::new(),
                    ),
                }
            }
        }
    }

    /// A new map: drops the watches of PGs this OSD is no longer the primary of and those of
    /// blocklisted instances.
    pub fn on_map(&self, map: &OsdMap, is_primary: impl Fn(PgId) -> bool) {
        let fx = {
            let mut table = self.table();
            let mut fx = table.drop_pgs(is_primary);
            if !map.blocklist.is_empty() {
                let dropped = table.drop_instances(|i| fenced(map, i).is_some(), Instant::now());
                fx.pushes.extend(dropped.pushes);
                fx.done.extend(dropped.done);
            }
            fx
        };
        self.apply(fx);
    }

    /// Expires watches and notifies.
    pub fn tick(&self) {
        let fx = self.table().tick(Instant::now());
        self.apply(fx);
    }
}

/// Runs `Watches::tick` every `TICK` until the OSD stops (the watches are dropped).
pub fn start(watches: std::sync::Weak<Watches>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        loop {
            tick.tick().await;
            match watches.upgrade() {
                Some(w) => w.tick(),
                None => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn obj(name: &str) -> ObjectLocator {
        ObjectLocator {
            pool: 1,
            namespace: String::new(),
            key: None,
            name: name.into(),
        }
    }

    fn w(instance: &str, cookie: u64) -> WatcherId {
        WatcherId {
            instance: instance.into(),
            cookie,
        }
    }

    fn pg0() -> PgId {
        PgId::new(1, 0)
    }
    const T: Duration = Duration::from_secs(30);

    fn notified(fx: &Effects<&'static str>) -> Vec<(&'static str, u64, u64)> {
        fx.pushes
            .iter()
            .filter_map(|p| match &p.kind {
                PushKind::Notify { notify_id, .. } => Some((p.conn, p.cookie, *notify_id)),
                PushKind::Error { .. } => None,
            })
            .collect()
    }

    #[test]
    fn notify_reaches_every_watcher_and_completes_on_the_last_ack() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        t.watch(pg0(), &o, w("client.a.1", 1), "conn-a", now, T);
        t.watch(pg0(), &o, w("client.b.2", 7), "conn-b", now, T);
        t.watch(pg0(), &obj("other"), w("client.c.3", 1), "conn-c", now, T);
        assert_eq!(t.watchers(&o), vec![w("client.a.1", 1), w("client.b.2", 7)]);
        let (id, fx) = t.notify(pg0(), &o, "client.n.9", Bytes::from_static(b"hi"), T, now);
        assert_eq!(notified(&fx), vec![("conn-a", 1, id), ("conn-b", 7, id)]);
        assert!(fx.done.is_empty());
        let fx = t.ack(id, &w("client.a.1", 1), Bytes::from_static(b"ra"));
        assert!(fx.done.is_empty());
        // A repeated ack or one from a stranger changes nothing.
        assert!(t.ack(id, &w("client.a.1", 1), Bytes::new()).done.is_empty());
        assert!(t.ack(id, &w("client.x.0", 1), Bytes::new()).done.is_empty());
        let fx = t.ack(id, &w("client.b.2", 7), Bytes::from_static(b"rb"));
        assert_eq!(
            fx.done,
            vec![NotifyDone {
                id,
                acks: vec![
                    (w("client.a.1", 1), Bytes::from_static(b"ra")),
                    (w("client.b.2", 7), Bytes::from_static(b"rb"))
                ],
                timed_out: vec![],
            }]
        );
        // Acks after completion are ignored.
        assert!(t.ack(id, &w("client.a.1", 1), Bytes::new()).done.is_empty());
    }

    #[test]
    fn notify_without_watchers_completes_at_once() {
        let mut t = WatchTable::<&'static str>::default();
        let (id, fx) = t.notify(pg0(), &obj("x"), "n", Bytes::new(), T, Instant::now());
        assert!(fx.pushes.is_empty());
        assert_eq!(
            fx.done,
            vec![NotifyDone {
                id,
                ..Default::default()
            }]
        );
    }

    #[test]
    fn a_notify_times_out_with_the_watchers_that_did_not_answer() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        t.watch(pg0(), &o, w("a", 1), "ca", now, T);
        t.watch(pg0(), &o, w("b", 2), "cb", now, T);
        let (id, _) = t.notify(pg0(), &o, "n", Bytes::new(), Duration::from_secs(5), now);
        t.ack(id, &w("a", 1), Bytes::from_static(b"ok"));
        // Before the deadline nothing happens (pings keep the watches).
        let fx = t.tick(now + Duration::from_secs(4));
        assert!(fx.done.is_empty() && fx.pushes.is_empty());
        let fx = t.tick(now + Duration::from_secs(5));
        assert_eq!(
            fx.done,
            vec![NotifyDone {
                id,
                acks: vec![(w("a", 1), Bytes::from_static(b"ok"))],
                timed_out: vec![w("b", 2)],
            }]
        );
        // The watches themselves stay.
        assert_eq!(t.watchers(&o).len(), 2);
    }

    #[test]
    fn unpinged_watches_expire_and_count_as_timed_out() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        let timeout = Duration::from_secs(3);
        t.watch(pg0(), &o, w("alive", 1), "c1", now, timeout);
        t.watch(pg0(), &o, w("dead", 2), "c2", now, timeout);
        let (id, _) = t.notify(pg0(), &o, "n", Bytes::new(), Duration::from_secs(60), now);
        t.ack(id, &w("alive", 1), Bytes::new());
        assert!(t.ping(
            &o,
            &w("alive", 1),
            "c1",
            now + Duration::from_secs(2),
            timeout
        ));
        let fx = t.tick(now + Duration::from_secs(3));
        // The dead one is dropped (with an error event) and the notify no longer waits.
        assert_eq!(t.watchers(&o), vec![w("alive", 1)]);
        assert!(matches!(
            &fx.pushes[..],
            [Push {
                conn: "c2",
                cookie: 2,
                kind: PushKind::Error {
                    code: ErrorCode::Io,
                    ..
                },
                ..
            }]
        ));
        assert_eq!(fx.done.len(), 1);
        assert_eq!(fx.done[0].timed_out, vec![w("dead", 2)]);
        assert!(!t.ping(
            &o,
            &w("dead", 2),
            "c2",
            now + Duration::from_secs(3),
            timeout
        ));
        // The pinged one expires too once its pings stop.
        t.tick(now + Duration::from_secs(5));
        assert!(t.watchers(&o).is_empty());
    }

    #[test]
    fn a_changed_timeout_applies_from_the_next_ping() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        let secs = Duration::from_secs;
        // Told 30 s: the watcher pings every 10 s, so a timeout lowered meanwhile must not
        // drop it before it has heard of it.
        t.watch(pg0(), &o, w("a", 1), "c", now, secs(30));
        t.tick(now + secs(9));
        assert_eq!(t.watchers(&o).len(), 1);
        assert!(t.ping(&o, &w("a", 1), "c", now + secs(10), secs(3)));
        t.tick(now + secs(12));
        assert_eq!(t.watchers(&o).len(), 1);
        t.tick(now + secs(13));
        assert!(t.watchers(&o).is_empty());
    }

    #[test]
    fn re_registering_resends_pending_notifies_on_the_new_connection() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        t.watch(pg0(), &o, w("a", 1), "old", now, T);
        let (id, _) = t.notify(pg0(), &o, "n", Bytes::from_static(b"p"), T, now);
        let fx = t.watch(pg0(), &o, w("a", 1), "new", now, T);
        assert_eq!(notified(&fx), vec![("new", 1, id)]);
        assert!(t.ping(&o, &w("a", 1), "new", now, T));
        assert_eq!(t.watchers(&o), vec![w("a", 1)]);
    }

    #[test]
    fn unwatch_stops_a_notify_waiting() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let o = obj("img");
        t.watch(pg0(), &o, w("a", 1), "c", now, T);
        let (id, _) = t.notify(pg0(), &o, "n", Bytes::new(), T, now);
        let fx = t.unwatch(&o, &w("a", 1));
        assert_eq!(
            fx.done,
            vec![NotifyDone {
                id,
                ..Default::default()
            }]
        );
        assert!(t.watchers(&o).is_empty());
    }

    #[test]
    fn fenced_instances_and_lost_pgs_are_dropped() {
        let mut t = WatchTable::<&'static str>::default();
        let now = Instant::now();
        let (o1, o2) = (obj("one"), obj("two"));
        let other = PgId::new(1, 5);
        t.watch(pg0(), &o1, w("bad", 1), "cb", now, T);
        t.watch(pg0(), &o1, w("good", 1), "cg", now, T);
        t.watch(other, &o2, w("good", 2), "cg", now, T);
        let (id, _) = t.notify(pg0(), &o1, "n", Bytes::new(), T, now);
        let fx = t.drop_instances(|i| i == "bad", now);
        assert!(matches!(
            &fx.pushes[..],
            [Push {
                conn: "cb",
                kind: PushKind::Error {
                    code: ErrorCode::Blocklisted,
                    ..
                },
                ..
            }]
        ));
        assert!(fx.done.is_empty(), "still waiting for the good watcher");
        assert_eq!(t.watchers(&o1), vec![w("good", 1)]);
        let (id2, _) = t.notify(other, &o2, "n", Bytes::new(), T, now);
        let fx = t.drop_pgs(|pg| pg != other);
        assert_eq!(fx.aborted, vec![id2]);
        assert!(t.watchers(&o2).is_empty());
        let fx = t.ack(id, &w("good", 1), Bytes::new());
        assert_eq!(fx.done[0].timed_out, vec![w("bad", 1)]);
    }
}

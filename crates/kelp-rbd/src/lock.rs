//! The exclusive lock: one writer per image at a time, handed over cleanly, with a dead
//! holder fenced off.
//!
//! Every open image (not a snapshot view) watches its header object. Before its first change
//! of the image, a client takes the lock: an omap key `lock` on the header, set with a
//! compare-and-swap from "absent" to its own `{instance, cookie}`. If another client holds it:
//!
//! - the holder is alive (it watches the header and answers notifications): the client
//!   notifies `request_lock` (naming itself, so a client ignores its own requests); the holder
//!   acknowledges at once, waits for its writes in flight and deletes the key; the client takes
//!   the key. Two writers therefore take turns, and each write happens under the lock;
//! - the holder is dead (no watch, or it does not acknowledge within the notify timeout): the
//!   client **blocklists** the holder's instance in the OSD map first (so any write it still
//!   has in flight, or sends late, is refused by the OSDs), then replaces the key by
//!   compare-and-swap against the dead holder's value.
//!
//! A holder that finds itself blocklisted (its writes fail with `Blocklisted`) reports
//! [`RbdError::LockLost`]; it must reconnect (a new instance) to write again.
//!
//! Other changes of the header (a snapshot taken or removed, a resize) are announced with a
//! `header_update` notification; every watcher reads the header again before acknowledging, so
//! a writer's next write carries the new snapshot context.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_client::{ClientError, ReadOp, ReadResult, WatchEvent, WriteOp};
use serde::{Deserialize, Serialize};

use crate::RbdError;
use crate::image::{Image, Inner, header_object};

const LOCK_KEY: &str = "lock";
const REQUEST_LOCK: &[u8] = b"request_lock";
const HEADER_UPDATE: &[u8] = b"header_update";
/// How long a holder has to acknowledge a lock request or a header update.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to wait for a live holder to let go before giving up.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a broken holder stays blocklisted.
const BLOCKLIST_FOR: Duration = Duration::from_secs(3600);

/// Who holds an image's exclusive lock (`kelp rbd lock ls`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockOwner {
    pub instance: String,
    pub cookie: u64,
}

/// This client's side of the lock.
#[derive(Default)]
pub(crate) struct LockState {
    pub(crate) held: bool,
    /// The cookie of this image's header watch (0 until it is set up).
    pub(crate) cookie: u64,
}

impl Image {
    /// Watches the header (lock requests, header updates) for as long as the image is open.
    pub(crate) async fn start_watch(&self) -> Result<(), RbdError> {
        let watch = self
            .inner
            .meta
            .watch(&header_object(&self.inner.id))
            .await?;
        self.inner.lock.lock().await.cookie = watch.cookie();
        let weak = Arc::downgrade(&self.inner);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(watch_loop(weak, watch, stopped));
        *self
            .inner
            .watch_task
            .lock()
            .expect("task lock is never poisoned") = Some((task, stop));
        Ok(())
    }

    /// The current holder of the exclusive lock, if any.
    pub async fn lock_owner(&self) -> Result<Option<LockOwner>, RbdError> {
        read_owner(&self.inner)
            .await
            .map(|o| o.map(|(owner, _)| owner))
    }

    /// Whether this client holds the lock now.
    pub async fn holds_lock(&self) -> bool {
        self.inner.lock.lock().await.held
    }

    /// Waits until this client holds the lock and returns a guard under which changes run
    /// (a lock hand-over waits for every guard to be dropped).
    pub(crate) async fn write_guard(
        &self,
    ) -> Result<tokio::sync::OwnedRwLockReadGuard<()>, RbdError> {
        self.check_writable()?;
        loop {
            let guard = self.inner.io_gate.clone().read_owned().await;
            if self.inner.lock.lock().await.held {
                return Ok(guard);
            }
            drop(guard);
            self.acquire().await?;
        }
    }

    async fn acquire(&self) -> Result<(), RbdError> {
        let inner = &self.inner;
        // One acquisition at a time; the state itself is only locked for short moments (the
        // watch loop needs it to answer notifications meanwhile).
        let _one = inner.acquiring.lock().await;
        let me = {
            let state = inner.lock.lock().await;
            if state.held {
                return Ok(());
            }
            LockOwner {
                instance: inner.rbd.rados().instance(),
                cookie: state.cookie,
            }
        };
        let rados = inner.rbd.rados().clone();
        let mine = serde_json::to_vec(&me).expect("a lock owner serialises");
        let request = request_payload(&me);
        let header = header_object(&inner.id);
        let deadline = Instant::now() + ACQUIRE_TIMEOUT;
        loop {
            let take = WriteOp::new()
                .cmp_omap(LOCK_KEY, None)
                .omap_set(&[(LOCK_KEY, &mine)]);
            match inner.meta.operate(take, &header).await {
                Ok(_) => break,
                Err(ClientError::Canceled { .. }) => {}
                Err(e) => return Err(lock_error(e)),
            }
            let Some((owner, raw)) = read_owner(inner).await? else {
                continue; // released meanwhile
            };
            if owner == me {
                break; // this very handle took it before
            }
            if Instant::now() > deadline {
                return Err(RbdError::Busy(format!(
                    "image '{}' is locked by {} which did not hand the lock over within {ACQUIRE_TIMEOUT:?}",
                    inner.name, owner.instance
                )));
            }
            let watching = inner
                .meta
                .watchers(&header)
                .await?
                .iter()
                .any(|w| w.instance == owner.instance && w.cookie == owner.cookie);
            let alive = watching && {
                // A live holder acknowledges at once and lets go in the background.
                let res = inner
                    .meta
                    .notify(&header, request.clone(), NOTIFY_TIMEOUT)
                    .await?;
                !res.timed_out
                    .iter()
                    .any(|w| w.instance == owner.instance && w.cookie == owner.cookie)
            };
            if alive {
                // Wait for the record to go (polling), then try to take it.
                let until = Instant::now() + NOTIFY_TIMEOUT;
                while Instant::now() < until {
                    match read_owner(inner).await? {
                        Some((o, _)) if o == owner => {
                            tokio::time::sleep(Duration::from_millis(10)).await
                        }
                        _ => break,
                    }
                }
                continue;
            }
            // Dead holder: fence it off, then take its lock.
            tracing::warn!(
                image = %inner.name,
                holder = %owner.instance,
                "the exclusive lock's holder is gone; blocklisting it and taking the lock"
            );
            rados
                .blocklist_add(&owner.instance, Some(BLOCKLIST_FOR))
                .await?;
            let op = WriteOp::new()
                .cmp_omap(LOCK_KEY, Some(&raw))
                .omap_set(&[(LOCK_KEY, &mine)]);
            match inner.meta.operate(op, &header).await {
                Ok(_) => break,
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(lock_error(e)),
            }
        }
        inner.lock.lock().await.held = true;
        // Changes sent under an earlier turn (a watch lost while they were in flight) land
        // before absence is learned again.
        drop(inner.io_gate.write().await);
        self.head_map().lock_taken();
        // Another client may have changed the image while it held the lock.
        self.refresh().await
    }

    /// Takes the exclusive lock now rather than at the first change. While it holds the lock,
    /// this client remembers which of the head's objects are absent, so reads of a clone's
    /// objects go straight to the parent after the first lookup (`crate::objmap`).
    pub async fn acquire_lock(&self) -> Result<(), RbdError> {
        self.check_writable()?;
        if !self.holds_lock().await {
            self.acquire().await?;
        }
        Ok(())
    }

    /// Gives the lock up (after the writes in flight), if held.
    pub async fn release_lock(&self) -> Result<(), RbdError> {
        release(&self.inner).await
    }

    /// Tells every other client that has the image open to read its header again (snapshot
    /// taken or removed, resize), and waits (a bounded time) for them to have done so.
    pub(crate) async fn header_changed(&self) {
        let header = header_object(&self.inner.id);
        if let Err(e) = self
            .inner
            .meta
            .notify(&header, Bytes::from_static(HEADER_UPDATE), NOTIFY_TIMEOUT)
            .await
        {
            tracing::warn!(image = %self.inner.name, "header update notification failed: {e}");
        }
    }

    /// Releases the lock and stops watching the header. (Dropping the image does the same in
    /// the background.)
    pub async fn close(&self) -> Result<(), RbdError> {
        let task = self
            .inner
            .watch_task
            .lock()
            .expect("task lock is never poisoned")
            .take();
        let released = release(&self.inner).await;
        if let Some((task, stop)) = task {
            let _ = stop.send(());
            let _ = task.await;
        }
        released
    }
}

fn lock_error(e: ClientError) -> RbdError {
    match e {
        ClientError::Blocklisted(why) => RbdError::LockLost(why),
        e => e.into(),
    }
}

async fn read_owner(inner: &Inner) -> Result<Option<(LockOwner, Bytes)>, RbdError> {
    let header = header_object(&inner.id);
    let mut res = inner
        .meta
        .operate_read(ReadOp::new().omap_get_vals_by_keys(&[LOCK_KEY]), &header)
        .await?;
    let Some(ReadResult::Pairs { entries, .. }) = res.pop() else {
        return Ok(None);
    };
    let Some((_, raw)) = entries.into_iter().find(|(k, _)| k == LOCK_KEY) else {
        return Ok(None);
    };
    let owner: LockOwner = serde_json::from_slice(&raw)
        .map_err(|e| RbdError::Corrupt(format!("{header}: lock record: {e}")))?;
    Ok(Some((owner, raw)))
}

/// This client no longer holds the lock: what it learned of the head's objects under it is
/// forgotten with it.
fn lost(inner: &Inner, state: &mut LockState) {
    state.held = false;
    inner
        .head_map
        .lock()
        .expect("map lock is never poisoned")
        .lock_lost();
}

pub(crate) async fn release(inner: &Inner) -> Result<(), RbdError> {
    // No change runs while the gate is held for writing.
    let _gate = inner.io_gate.write().await;
    let me = {
        let mut state = inner.lock.lock().await;
        if !state.held {
            return Ok(());
        }
        lost(inner, &mut state);
        LockOwner {
            instance: inner.rbd.rados().instance(),
            cookie: state.cookie,
        }
    };
    release_record(&inner.meta, &inner.id, &me).await
}

/// Deletes the lock record if it is exactly `me`'s.
pub(crate) async fn release_record(
    meta: &kelp_client::IoCtx,
    id: &str,
    me: &LockOwner,
) -> Result<(), RbdError> {
    let header = header_object(id);
    let mut res = meta
        .operate_read(ReadOp::new().omap_get_vals_by_keys(&[LOCK_KEY]), &header)
        .await?;
    let Some(ReadResult::Pairs { entries, .. }) = res.pop() else {
        return Ok(());
    };
    let Some((_, raw)) = entries.into_iter().find(|(k, _)| k == LOCK_KEY) else {
        return Ok(());
    };
    if serde_json::from_slice::<LockOwner>(&raw).is_ok_and(|o| o == *me) {
        let op = WriteOp::new()
            .cmp_omap(LOCK_KEY, Some(&raw))
            .omap_rm_keys(&[LOCK_KEY]);
        match meta.operate(op, &header).await {
            Ok(_) | Err(ClientError::Canceled { .. }) => {}
            Err(e) => return Err(lock_error(e)),
        }
    }
    Ok(())
}

/// A lock request names the requester, so that a client ignores its own.
fn request_payload(me: &LockOwner) -> Bytes {
    let mut p = REQUEST_LOCK.to_vec();
    p.push(b' ');
    p.extend(serde_json::to_vec(me).expect("a lock owner serialises"));
    Bytes::from(p)
}

fn requester(payload: &[u8]) -> Option<LockOwner> {
    let rest = payload.strip_prefix(REQUEST_LOCK)?.strip_prefix(b" ")?;
    serde_json::from_slice(rest).ok()
}

async fn watch_loop(
    inner: Weak<Inner>,
    mut watch: kelp_client::Watch,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        loop {
            let event = tokio::select! {
                e = watch.next() => e,
                _ = &mut stop => {
                    let _ = watch.unwatch().await;
                    return;
                }
            };
            let Some(event) = event else { break };
            let Some(inner) = inner.upgrade() else { return };
            match event {
                WatchEvent::Notify(n) => {
                    if let Some(from) = requester(&n.payload) {
                        let me = LockOwner {
                            instance: inner.rbd.rados().instance(),
                            cookie: inner.lock.lock().await.cookie,
                        };
                        if from != me {
                            // Acknowledge now; let go once the writes in flight are done.
                            let inner = inner.clone();
                            tokio::spawn(async move {
                                if let Err(e) = release(&inner).await {
                                    tracing::warn!(image = %inner.name, "releasing the lock: {e}");
                                }
                            });
                        }
                    } else if &n.payload[..] == HEADER_UPDATE {
                        let img = Image::from_inner(inner.clone());
                        if let Err(e) = img.refresh().await {
                            tracing::warn!(image = %inner.name, "reading the header again: {e}");
                        }
                    }
                    let _ = watch.ack(n.id, Bytes::new()).await;
                }
                WatchEvent::Error(e) => {
                    // Another client may now take the lock as from a dead holder (and fence
                    // this one): stop counting on it.
                    tracing::warn!(image = %inner.name, "header watch lost: {e}");
                    {
                        let mut state = inner.lock.lock().await;
                        lost(&inner, &mut state);
                    }
                    if matches!(e, ClientError::Blocklisted(_)) {
                        return;
                    }
                    break;
                }
            }
        }
        // Watch again (the image stays open), with a pause between attempts.
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = &mut stop => return,
            }
            let Some(inner) = inner.upgrade() else { return };
            match inner.meta.watch(&header_object(&inner.id)).await {
                Ok(w) => {
                    inner.lock.lock().await.cookie = w.cookie();
                    watch = w;
                    break;
                }
                Err(ClientError::Blocklisted(_)) => return,
                Err(e) => tracing::warn!(image = %inner.name, "watching the header again: {e}"),
            }
        }
    }
}

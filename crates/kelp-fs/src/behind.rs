//! Write-behind: the data writes a client has sent to RADOS and not yet seen stored.
//!
//! Under the exclusive capability a buffered write is acknowledged to the program as soon as
//! its data is on its way (the kernel keeps the same bytes in its page cache, so this mount
//! reads them back at once). Everything that must see the data stored waits for it here
//! first: a later write or a read overlapping it, a truncate or hole punch, the size's flush
//! to the MDS (so the MDS never records a size whose bytes are not in RADOS), the answer to a
//! revoke (so another client reads them), `fsync`, the delayed close, and unmount. A write
//! that fails in the background is reported by the next `write`, `fsync` or `close` of the
//! file (once, as the kernel reports write-back errors) and logged.
//!
//! In-flight writes are tracked by byte range: two writes to overlapping bytes never run at
//! once (the second waits for the first), so RADOS applies them in the program's order,
//! while writes to distinct bytes go out together. Waiting for writes to be stored waits for
//! those claimed before the wait began, never for later ones (a file written without pause
//! still gets its size flushed and its `fsync` answered).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::types::Ino;

/// Most bytes of buffered writes in flight at once per client; a write past it waits.
pub const MAX_BEHIND_BYTES: u64 = 64 << 20;

#[derive(Debug, Default)]
struct Pending {
    /// Byte ranges `[start, end)` being written, each with its claim's sequence number.
    ranges: Vec<(u64, u64, u64)>,
    /// The errno of a background write that failed, not yet reported.
    error: Option<i32>,
}

/// Writes in flight per inode (see the module's documentation).
#[derive(Debug, Default)]
pub struct WriteBehind {
    pending: Mutex<HashMap<Ino, Pending>>,
    changed: Notify,
    bytes: AtomicU64,
    /// The sequence number of the last claim.
    claims: AtomicU64,
}

/// A claimed byte range of one inode: released (and waiters woken) when dropped.
#[derive(Debug)]
pub struct Claim {
    behind: Arc<WriteBehind>,
    ino: Ino,
    range: (u64, u64, u64),
    /// Bytes counted against [`MAX_BEHIND_BYTES`] (buffered writes only).
    counted: u64,
    error: Option<i32>,
}

impl Claim {
    /// The write failed: its errno is kept for the file's next `write`, `fsync` or `close`.
    pub fn failed(&mut self, errno: i32) {
        self.error = Some(errno);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        {
            let mut pending = self.behind.pending.lock().expect("write-behind lock");
            if let Some(p) = pending.get_mut(&self.ino) {
                if let Some(at) = p.ranges.iter().position(|r| *r == self.range) {
                    p.ranges.swap_remove(at);
                }
                if self.error.is_some() {
                    p.error = self.error;
                }
                if p.ranges.is_empty() && p.error.is_none() {
                    pending.remove(&self.ino);
                }
            }
        }
        self.behind.bytes.fetch_sub(self.counted, Ordering::SeqCst);
        self.behind.changed.notify_waiters();
    }
}

fn overlaps(a: (u64, u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl WriteBehind {
    /// Runs `ready` under the lock until it returns `Some`, waiting for changes in between.
    async fn wait_for<T>(
        &self,
        mut ready: impl FnMut(&mut HashMap<Ino, Pending>) -> Option<T>,
    ) -> T {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(t) = ready(&mut self.pending.lock().expect("write-behind lock")) {
                return t;
            }
            changed.await;
        }
    }

    /// Waits until no write in flight overlaps `[off, end)` of `ino` and claims it.
    /// `buffered`: the caller will not wait for the write (it counts against
    /// [`MAX_BEHIND_BYTES`], waiting for room first).
    pub async fn claim(self: &Arc<Self>, ino: Ino, off: u64, end: u64, buffered: bool) -> Claim {
        let counted = if buffered { end - off } else { 0 };
        let range = self
            .wait_for(|pending| self.take_range(pending, ino, off, end, counted))
            .await;
        self.claimed(ino, range, counted)
    }

    /// [`WriteBehind::claim`] of a buffered write without waiting: `None` while a write in
    /// flight overlaps the range or the bytes in flight leave no room for it.
    pub fn try_claim(self: &Arc<Self>, ino: Ino, off: u64, end: u64) -> Option<Claim> {
        let counted = end - off;
        let range = {
            let mut pending = self.pending.lock().expect("write-behind lock");
            self.take_range(&mut pending, ino, off, end, counted)?
        };
        Some(self.claimed(ino, range, counted))
    }

    /// Claims `[off, end)` of `ino` if no write in flight overlaps it and `counted` bytes
    /// fit in flight.
    fn take_range(
        &self,
        pending: &mut HashMap<Ino, Pending>,
        ino: Ino,
        off: u64,
        end: u64,
        counted: u64,
    ) -> Option<(u64, u64, u64)> {
        if pending
            .get(&ino)
            .is_some_and(|p| p.ranges.iter().any(|r| overlaps(*r, (off, end))))
        {
            return None;
        }
        if counted > 0 {
            let now = self.bytes.load(Ordering::SeqCst);
            if now > 0 && now + counted > MAX_BEHIND_BYTES {
                return None;
            }
            self.bytes.fetch_add(counted, Ordering::SeqCst);
        }
        let range = (off, end, self.claims.fetch_add(1, Ordering::SeqCst) + 1);
        pending.entry(ino).or_default().ranges.push(range);
        Some(range)
    }

    fn claimed(self: &Arc<Self>, ino: Ino, range: (u64, u64, u64), counted: u64) -> Claim {
        Claim {
            behind: Arc::clone(self),
            ino,
            range,
            counted,
            error: None,
        }
    }

    /// Keeps `errno` for the file's next `write`, `fsync` or `close`: a failure found in the
    /// background after the call that caused it had returned.
    pub fn keep_error(&self, ino: Ino, errno: i32) {
        self.pending
            .lock()
            .expect("write-behind lock")
            .entry(ino)
            .or_default()
            .error = Some(errno);
    }

    /// Whether a failure of `ino` waits to be reported.
    pub fn has_error(&self, ino: Ino) -> bool {
        self.pending
            .lock()
            .expect("write-behind lock")
            .get(&ino)
            .is_some_and(|p| p.error.is_some())
    }

    /// Whether `ino` has writes in flight or an unreported failure.
    pub fn busy(&self, ino: Ino) -> bool {
        self.pending
            .lock()
            .expect("write-behind lock")
            .contains_key(&ino)
    }

    /// Waits until the writes of `ino` claimed so far are stored (not later ones).
    pub async fn settle(&self, ino: Ino) {
        if !self.busy(ino) {
            return;
        }
        let upto = self.claims.load(Ordering::SeqCst);
        self.wait_for(|pending| {
            pending
                .get(&ino)
                .is_none_or(|p| p.ranges.iter().all(|r| r.2 > upto))
                .then_some(())
        })
        .await;
    }

    /// Waits until the writes claimed so far, of every inode, are stored (the periodic
    /// flush, unmount).
    pub async fn settle_all(&self) {
        let upto = self.claims.load(Ordering::SeqCst);
        self.wait_for(|pending| {
            pending
                .values()
                .all(|p| p.ranges.iter().all(|r| r.2 > upto))
                .then_some(())
        })
        .await;
    }

    /// The errno of a background write of `ino` that failed, reported once.
    pub fn take_error(&self, ino: Ino) -> Option<i32> {
        let mut pending = self.pending.lock().expect("write-behind lock");
        let p = pending.get_mut(&ino)?;
        let e = p.error.take();
        if p.ranges.is_empty() {
            pending.remove(&ino);
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn overlapping_writes_wait_for_each_other_and_distinct_ones_do_not() {
        let wb = Arc::new(WriteBehind::default());
        let first = wb.claim(1, 0, 100, true).await;
        // distinct bytes, and another inode's same bytes: claimed at once
        let other = wb.claim(1, 100, 200, true).await;
        let elsewhere = wb.claim(2, 0, 100, false).await;
        let w = wb.clone();
        let overlapping = tokio::spawn(async move {
            let _c = w.claim(1, 50, 150, false).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!overlapping.is_finished(), "overlaps the first write");
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!overlapping.is_finished(), "still overlaps the second");
        drop(other);
        tokio::time::timeout(Duration::from_secs(5), overlapping)
            .await
            .expect("runs once both are stored")
            .unwrap();
        drop(elsewhere);
        assert!(!wb.busy(1) && !wb.busy(2));
        assert_eq!(wb.bytes.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_failure_is_reported_once_and_settling_waits_for_every_write() {
        let wb = Arc::new(WriteBehind::default());
        let mut c = wb.claim(7, 0, 10, true).await;
        let w = wb.clone();
        let settled = tokio::spawn(async move { w.settle(7).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!settled.is_finished());
        c.failed(5);
        drop(c);
        tokio::time::timeout(Duration::from_secs(5), settled)
            .await
            .expect("settles")
            .unwrap();
        assert!(wb.busy(7), "the failure is kept until reported");
        assert_eq!(wb.take_error(7), Some(5));
        assert_eq!(wb.take_error(7), None);
        assert!(!wb.busy(7));
        wb.settle_all().await;
    }

    #[tokio::test]
    async fn settling_waits_for_earlier_writes_never_for_later_ones() {
        let wb = Arc::new(WriteBehind::default());
        let earlier = wb.claim(1, 0, 10, true).await;
        let w = wb.clone();
        let settled = tokio::spawn(async move { w.settle(1).await });
        let w = wb.clone();
        let all = tokio::spawn(async move { w.settle_all().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // a later write, still in flight, holds up neither
        let later = wb.claim(1, 20, 30, true).await;
        drop(earlier);
        tokio::time::timeout(Duration::from_secs(5), settled)
            .await
            .expect("settles without the later write")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("settles without the later write")
            .unwrap();
        assert!(wb.busy(1));
        drop(later);
        assert!(!wb.busy(1));
    }

    #[tokio::test]
    async fn a_claim_without_waiting_is_refused_where_a_waiting_one_would_wait() {
        let wb = Arc::new(WriteBehind::default());
        let first = wb.try_claim(1, 0, 100).expect("nothing in flight");
        assert!(wb.try_claim(1, 50, 150).is_none(), "overlaps the first");
        let distinct = wb.try_claim(1, 100, 200).expect("distinct bytes");
        assert_eq!(wb.bytes.load(Ordering::SeqCst), 200, "counted as buffered");
        // no room in flight: refused, and nothing is counted for it
        assert!(wb.try_claim(2, 0, MAX_BEHIND_BYTES).is_none());
        assert_eq!(wb.bytes.load(Ordering::SeqCst), 200);
        drop((first, distinct));
        assert!(!wb.busy(1));
        // alone, even a claim past the bound goes (one write is never held up forever)
        let big = wb
            .try_claim(2, 0, MAX_BEHIND_BYTES + 1)
            .expect("nothing in flight");
        drop(big);
        assert_eq!(wb.bytes.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_failure_found_after_the_call_is_kept_for_the_next_one() {
        let wb = Arc::new(WriteBehind::default());
        assert!(!wb.has_error(3));
        wb.keep_error(3, libc::EDQUOT);
        assert!(wb.has_error(3) && wb.busy(3));
        // a write finishing meanwhile does not drop it
        drop(wb.try_claim(3, 0, 10).expect("nothing in flight"));
        assert_eq!(wb.take_error(3), Some(libc::EDQUOT));
        assert!(!wb.has_error(3) && !wb.busy(3));
    }

    #[tokio::test]
    async fn buffered_bytes_are_bounded() {
        let wb = Arc::new(WriteBehind::default());
        let big = wb.claim(1, 0, MAX_BEHIND_BYTES - 10, true).await;
        // one write alone may exceed the bound; the next waits for room
        let w = wb.clone();
        let next = tokio::spawn(async move {
            let _c = w.claim(2, 0, 100, true).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!next.is_finished());
        // a write the caller waits for is not held back by the bound
        drop(wb.claim(3, 0, 100, false).await);
        drop(big);
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("room made")
            .unwrap();
        let alone = wb.claim(4, 0, 2 * MAX_BEHIND_BYTES, true).await;
        drop(alone);
    }
}

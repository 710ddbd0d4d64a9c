//! Reused receive buffers for large segments.
//!
//! Every 4 MiB object write arrives as one large data segment, on the primary and again on each
//! replica; at a few hundred writes per second that is GB/s of buffers allocated and freed. A
//! general-purpose allocator either keeps the freed memory (the process's resident size then
//! grows by the high-water mark of buffers in flight, and stays there) or gives it back to the
//! kernel and pays a page fault per 4 KiB when it is reused (measured: ~365 faults per 4 MiB
//! write). This pool keeps recently freed large buffers for reuse instead, and frees what has
//! not been reused for [`IDLE_FREE`], so a busy daemon reuses its buffers and an idle one shrinks.
//!
//! Buffers are grouped in size classes (four per power of two, so at most ~25% of a buffer is
//! slack); at most [`MAX_RETAINED`] bytes are kept in all. Idle buffers are freed by a small
//! thread (`segpool-sweep`, started with the first returned buffer, so also in a process that
//! stops receiving) and by buffer returns; the frame-reading path never takes the pool's lock
//! except to take or give a large buffer.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Segments at least this large come from the pool.
pub(crate) const POOL_FROM: usize = 64 << 10;
/// A free buffer not reused for this long is given back to the allocator.
pub(crate) const IDLE_FREE: Duration = Duration::from_secs(2);
/// Upper bound of the bytes kept free in the pool.
pub(crate) const MAX_RETAINED: usize = 256 << 20;
/// Size classes: four per power of two from 64 KiB to 2^40.
const CLASSES: usize = 4 * (40 - 16 + 1);

struct Pool {
    free: Vec<VecDeque<(Instant, Vec<u8>)>>,
    retained: usize,
    last_sweep: Instant,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn pool() -> MutexGuard<'static, Option<Pool>> {
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The class of a buffer of at least `bytes` bytes, and that class's capacity.
fn class_of(bytes: usize) -> (usize, usize) {
    let bytes = bytes.max(POOL_FROM);
    let pow = usize::BITS - 1 - bytes.leading_zeros(); // 2^pow <= bytes
    let base = 1usize << pow;
    let quarter = base / 4;
    let step = (bytes - base).div_ceil(quarter); // 0..=4
    let (pow, step) = if step == 4 { (pow + 1, 0) } else { (pow, step) };
    let idx = (pow as usize - 16) * 4 + step;
    (idx, (1usize << pow) + step * ((1usize << pow) / 4))
}

/// An empty buffer with capacity for at least `bytes` bytes: a pooled one if there is one.
pub(crate) fn take(bytes: usize) -> Vec<u8> {
    let (idx, cap) = class_of(bytes);
    if idx < CLASSES {
        let mut guard = pool();
        if let Some(p) = guard.as_mut()
            && let Some((_, mut buf)) = p.free[idx].pop_back()
        {
            p.retained -= buf.capacity();
            buf.clear();
            return buf;
        }
    }
    Vec::with_capacity(cap)
}

/// Gives `buf` back for reuse (or frees it if the pool is full or it has no class).
pub(crate) fn give(buf: Vec<u8>) {
    let (idx, cap) = class_of(buf.capacity());
    // Only buffers whose capacity is exactly a class's go back; others are freed.
    if idx >= CLASSES || cap != buf.capacity() {
        return;
    }
    start_sweeper();
    let now = Instant::now();
    let mut freed = Vec::new();
    {
        let mut guard = pool();
        let p = guard.get_or_insert_with(|| Pool {
            free: (0..CLASSES).map(|_| VecDeque::new()).collect(),
            retained: 0,
            last_sweep: now,
        });
        if p.retained + cap <= MAX_RETAINED {
            p.retained += cap;
            p.free[idx].push_back((now, buf));
        } else {
            freed.push(buf);
        }
        if now.duration_since(p.last_sweep) >= IDLE_FREE / 4 {
            p.last_sweep = now;
            sweep(p, now, &mut freed);
        }
    }
    drop(freed); // outside the lock
}

/// Frees pooled buffers idle for [`IDLE_FREE`]; called from `give` and by the sweeper thread
/// ([`sweep_idle`]) so an idle daemon shrinks too.
fn sweep(p: &mut Pool, now: Instant, freed: &mut Vec<Vec<u8>>) {
    for class in &mut p.free {
        while class
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) >= IDLE_FREE)
        {
            let (_, buf) = class.pop_front().expect("front exists");
            p.retained -= buf.capacity();
            freed.push(buf);
        }
    }
}

/// Frees what has been idle for [`IDLE_FREE`] (the sweeper thread's work).
fn sweep_idle() {
    let now = Instant::now();
    let mut freed = Vec::new();
    {
        let mut guard = pool();
        let Some(p) = guard.as_mut() else { return };
        if p.retained == 0 || now.duration_since(p.last_sweep) < IDLE_FREE / 4 {
            return;
        }
        p.last_sweep = now;
        sweep(p, now, &mut freed);
    }
    drop(freed);
}

/// Starts (once per process) the thread that frees idle buffers when nothing else touches the
/// pool. If the thread cannot be created, idle buffers are still freed by later returns.
fn start_sweeper() {
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("segpool-sweep".into())
            .stack_size(64 << 10)
            .spawn(|| {
                loop {
                    std::thread::sleep(IDLE_FREE / 4);
                    sweep_idle();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread to free idle receive buffers");
        }
    });
}

/// Bytes currently kept free in the pool.
#[cfg(test)]
pub(crate) fn retained() -> usize {
    pool().as_ref().map_or(0, |p| p.retained)
}

/// A received segment in a pooled buffer: `buf[start..]` is the payload. Dropping the last
/// `Bytes` that refers to it gives the buffer back.
pub(crate) struct PooledSegment {
    buf: Vec<u8>,
    start: usize,
}

impl PooledSegment {
    /// Wraps a filled buffer whose payload starts at `start`.
    pub(crate) fn into_bytes(buf: Vec<u8>, start: usize) -> Bytes {
        Bytes::from_owner(PooledSegment { buf, start })
    }
}

impl AsRef<[u8]> for PooledSegment {
    fn as_ref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

impl Drop for PooledSegment {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_sizes_with_at_most_a_quarter_of_slack() {
        let mut last = 0;
        for bytes in [
            64 << 10,
            (64 << 10) + 1,
            80 << 10,
            100_000,
            1 << 20,
            (4 << 20) + 4096,
            5 << 20,
            (5 << 20) + 1,
            (8 << 20) - 1,
            8 << 20,
            64 << 20,
        ] {
            let (idx, cap) = class_of(bytes);
            assert!(cap >= bytes, "{bytes}: {cap}");
            assert!(cap - bytes <= bytes / 4, "{bytes}: {cap}");
            assert!(idx >= last, "classes grow with size");
            last = idx;
            assert_eq!(
                class_of(cap),
                (idx, cap),
                "a class's capacity is its own class"
            );
        }
        assert_eq!(class_of((4 << 20) + 4096), (4 * 6 + 1, 5 << 20));
        assert_eq!(class_of(1), class_of(64 << 10));
    }

    #[test]
    fn buffers_are_reused_then_freed_when_idle() {
        // A size no other test of this crate uses: its class is this test's alone.
        const SIZE: usize = 13 << 20;
        let (idx, cap) = class_of(SIZE);
        let pooled = || pool().as_ref().map_or(0, |p| p.free[idx].len());
        let mut a = take(SIZE);
        assert_eq!(a.capacity(), cap);
        let ptr = a.as_ptr();
        a.resize(100, 7);
        let bytes = PooledSegment::into_bytes(a, 10);
        assert_eq!(&bytes[..], &[7u8; 90][..]);
        let clone = bytes.slice(5..);
        drop(bytes);
        assert_eq!(pooled(), 0, "still referenced by the slice");
        drop(clone);
        assert_eq!(pooled(), 1, "given back with the last reference");
        let again = take(SIZE);
        assert_eq!(again.as_ptr(), ptr, "the freed buffer is reused");
        assert!(again.is_empty());
        let given = Instant::now();
        give(again);
        assert_eq!(pooled(), 1);
        assert!(retained() >= cap);
        // Nothing touches the pool now: the sweeper thread frees the buffer once it is idle
        // (within IDLE_FREE + IDLE_FREE / 4; polled, with room for a slow machine).
        while pooled() != 0 && given.elapsed() < IDLE_FREE * 5 {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            given.elapsed() >= IDLE_FREE,
            "kept until idle for IDLE_FREE"
        );
        assert_eq!(pooled(), 0, "freed once idle");
        // A buffer of a capacity that is not a class's is not pooled.
        give(Vec::with_capacity(cap + 1));
        assert_eq!(pooled(), 0);
    }
}

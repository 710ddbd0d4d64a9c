//! Data files that grow: written with zeros in large steps ahead of the allocator.
//!
//! Why: a commit on a file whose allocated units are all *written* (no holes, no unwritten
//! extents) needs one device flush, because an `O_DIRECT` write over written blocks changes
//! no file-system metadata; writing into a hole or a fallocated (unwritten) extent does, and
//! then the data file must be flushed before the log record, a second flush per commit
//! (docs/STORE.md, "Crash consistency"). Writing the whole file with zeros at mkfs buys that,
//! but costs one sequential write of the whole size before the first object and the whole size
//! in disk space. A growing file buys it step by step instead:
//!
//! * mkfs creates the file sparse (`set_len`, nothing allocated) and writes the first step;
//! * the superblock's [`crate::Superblock::data_written`] is the *frontier*: the allocator
//!   hands out units below it only ([`crate::alloc::Allocator::advance`]);
//! * a background thread (this module) writes the next step with zeros, flushes the data file
//!   (which makes the blocks' allocation durable), records the new frontier in the superblock
//!   (atomic rewrite) and only then lets the allocator use it. It starts when the units left
//!   below the frontier drop under one step, so it normally runs well ahead of the writers; a
//!   transaction that finds no room below the frontier waits for it (backpressure), and one
//!   that could never fit gets `NoSpace` at once.
//!
//! If the file system is full, the step fails: the store stops counting the space beyond the
//! frontier as available (so the OSD reports itself full and refuses writes cleanly instead of
//! failing them at random) and tries again every [`RETRY_AFTER`].
//!
//! Invariant: every unit ever allocated lies below the frontier recorded in the superblock, and
//! every byte below that frontier was written and flushed before the frontier was recorded.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Result, StoreError};
use crate::kelpstore::AlignedBuf;
use crate::superblock::Superblock;

/// How long the grower waits before trying again after a step failed (file system full).
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Bytes written per `pwrite` of zeros.
const ZERO_CHUNK: usize = 8 << 20;

/// The step by which a data file of `size` bytes grows: 1/64 of it, between 64 MiB and
/// 512 MiB (a step is written in well under a second on an SSD, and a small store still grows
/// in a few steps), a multiple of `unit`, at most `size`.
pub fn step_bytes(size: u64, unit: u64) -> u64 {
    let step = (size / 64).clamp(64 << 20, 512 << 20);
    (step / unit * unit).max(unit).min(size / unit * unit)
}

/// Writes zeros over `[from, to)` of the data file in `dir`, with `O_DIRECT` where the file
/// system has it (so the page cache is not flooded), falling back to buffered writes.
pub fn write_zeros(path: &Path, from: u64, to: u64) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
        .or_else(|_| OpenOptions::new().write(true).open(path))
        .map_err(|e| StoreError::io("opening the data file", e))?;
    write_zeros_to(&f, from, to)
}

fn write_zeros_to(f: &File, from: u64, to: u64) -> Result<()> {
    let chunk = AlignedBuf::zeroed(ZERO_CHUNK);
    let mut off = from;
    while off < to {
        let n = (to - off).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], off)
            .map_err(|e| StoreError::io("writing zeros over the data file", e))?;
        off += n as u64;
    }
    Ok(())
}

/// What the writers tell the grower.
#[derive(Debug, Default)]
struct Signal {
    /// Some allocation found the units below the frontier running low.
    kicked: bool,
    /// Units a waiting allocation needs (the grower grows until that many are usable).
    need: u64,
    shutdown: bool,
}

/// The grower's mailbox: shared by the store (which kicks it) and its thread.
#[derive(Debug)]
pub struct Grower {
    /// Units per step.
    pub step_units: u64,
    signal: Mutex<Signal>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Grower {
    pub fn new(step_units: u64) -> Self {
        Grower {
            step_units: step_units.max(1),
            signal: Mutex::new(Signal::default()),
            cv: Condvar::new(),
        }
    }

    /// Whether a store with `usable` units left below the frontier and `growable` beyond it
    /// should grow now.
    pub fn low(&self, usable: u64, growable: u64) -> bool {
        growable > 0 && usable < self.step_units
    }

    /// Asks the grower to grow until at least `need` units (and one step's worth) are usable
    /// below the frontier.
    pub fn kick(&self, need: u64) {
        let mut s = lock(&self.signal);
        s.kicked = true;
        s.need = s.need.max(need);
        self.cv.notify_one();
    }

    pub fn shutdown(&self) {
        lock(&self.signal).shutdown = true;
        self.cv.notify_all();
    }

    /// Waits for a kick (or `timeout`); returns `None` on shutdown, else the units a waiter
    /// needs (0 if none).
    fn wait(&self, timeout: Option<Duration>) -> Option<u64> {
        let mut s = lock(&self.signal);
        if !s.kicked && !s.shutdown {
            s = match timeout {
                None => self.cv.wait(s).unwrap_or_else(|p| p.into_inner()),
                Some(t) => {
                    self.cv
                        .wait_timeout(s, t)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        if s.shutdown {
            return None;
        }
        s.kicked = false;
        Some(std::mem::take(&mut s.need))
    }
}

/// What the grower thread works on, borrowed from the mounted store.
pub struct GrowTarget<'a> {
    pub dir: &'a Path,
    pub data_path: &'a Path,
    pub unit: u64,
    pub alloc: &'a Mutex<crate::alloc::Allocator>,
    /// Notified (with `alloc` held) when the frontier moved or a step failed.
    pub grown: &'a Condvar,
}

/// The grower thread's loop: grow whenever kicked (or, after a failure, every
/// [`RETRY_AFTER`]) until enough units are usable; ends on [`Grower::shutdown`].
pub fn run(grower: Arc<Grower>, t: GrowTarget<'_>, mut sb: Superblock) {
    let mut retry: Option<Duration> = None;
    while let Some(need) = grower.wait(retry) {
        // after a failed step, try again even if the writers see enough (they cannot see
        // the space beyond the frontier while growing fails)
        let mut retrying = retry.take().is_some();
        loop {
            let (frontier, end) = {
                let a = lock(t.alloc);
                let usable = a.usable_units();
                let enough = usable >= need && !grower.low(usable, a.growable_units());
                // a failed file system gets another try (growable is 0 while failed)
                if a.frontier() >= a.end_units() || (enough && !retrying) {
                    break;
                }
                (a.frontier(), a.end_units())
            };
            let to = (frontier + grower.step_units).min(end);
            match grow_step(&t, &mut sb, frontier, to) {
                Ok(()) => {
                    let mut a = lock(t.alloc);
                    a.advance(to);
                    t.grown.notify_all();
                    retrying = false;
                }
                Err(e) => {
                    tracing::error!(
                        "cannot grow the data file in {} from {} to {} bytes: {e}; the space \
                         beyond is not available until a later attempt succeeds",
                        t.dir.display(),
                        frontier * t.unit,
                        to * t.unit
                    );
                    let mut a = lock(t.alloc);
                    a.set_grow_failed(true);
                    t.grown.notify_all();
                    retry = Some(RETRY_AFTER);
                    break;
                }
            }
        }
    }
}

/// Writes units `[from, to)` with zeros, flushes the file (data and block allocation), then
/// records the new frontier in the superblock.
fn grow_step(t: &GrowTarget<'_>, sb: &mut Superblock, from: u64, to: u64) -> Result<()> {
    write_zeros(t.data_path, from * t.unit, to * t.unit)?;
    File::open(t.data_path)
        .and_then(|f| f.sync_data())
        .map_err(|e| StoreError::io("flushing the grown data file", e))?;
    sb.data_written = Some(to * t.unit);
    sb.write(t.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_a_64th_clamped_and_whole_units() {
        let unit = 4096;
        assert_eq!(step_bytes(8 << 30, unit), 128 << 20);
        assert_eq!(step_bytes(1 << 30, unit), 64 << 20, "at least 64 MiB");
        assert_eq!(step_bytes(1 << 40, unit), 512 << 20, "at most 512 MiB");
        assert_eq!(
            step_bytes(16 << 20, unit),
            16 << 20,
            "never more than the file"
        );
        assert_eq!(step_bytes((100 << 30) + 123, unit) % unit, 0);
    }

    #[test]
    fn low_means_under_one_step_with_room_to_grow() {
        let g = Grower::new(100);
        assert!(g.low(99, 1));
        assert!(!g.low(100, 1));
        assert!(!g.low(0, 0), "nothing left to grow into");
    }
}

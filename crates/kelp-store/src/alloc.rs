//! Space management of the data device, in allocation units (`min_alloc_size`).
//!
//! Two structures with different jobs:
//! - [`Bitmap`] is the *committed* allocation state, one bit per unit, persisted in the
//!   metadata database in chunks (`B` keys) in the same atomic batch as the object records that
//!   reference the units. It is what `fsck` checks against the extent maps.
//! - [`Allocator`] is the in-memory free-extent index used to hand out space. It runs ahead of
//!   the bitmap: units are taken from it when a transaction is prepared, and units freed by a
//!   transaction are only returned to it after that transaction is durable (and its deferred
//!   writes applied), so space referenced by committed metadata is never reused early.
//!
//! A data file that grows ([`crate::Superblock::data_written`]) is only written with zeros up
//! to a *frontier*: the allocator hands out units below it only, and the units beyond (all
//! free: nothing can have been allocated there) are held back until the store's grower has
//! written and flushed the next step and calls [`Allocator::advance`]. So every unit a
//! transaction writes lies in written file space, which is what lets one device flush make a
//! commit durable (docs/STORE.md, "Data files that grow").

use std::collections::{BTreeMap, BTreeSet};

use crate::codec::{BITMAP_CHUNK_UNITS, BITMAP_VERSION};
use crate::error::{Result, StoreError};

/// Free extents indexed by offset (for coalescing) and by size (for best fit).
#[derive(Debug, Default)]
pub struct Allocator {
    by_off: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    /// Free units below the frontier (what [`Allocator::allocate`] can hand out).
    free: u64,
    /// Units `[frontier, end)` are free but not written yet, held back from allocation.
    frontier: u64,
    end: u64,
    /// The last attempt to grow failed (the file system is full): the units beyond the
    /// frontier are not counted as free until a later attempt succeeds.
    grow_failed: bool,
}

impl Allocator {
    /// An allocator for a device of `end` units written up to unit `frontier`, with nothing
    /// free yet ([`Allocator::release`] the free runs below the frontier, as the bitmap has them).
    pub fn with_frontier(frontier: u64, end: u64) -> Self {
        Allocator {
            frontier: frontier.min(end),
            end,
            ..Allocator::default()
        }
    }

    /// Free units, counting those beyond the frontier unless growing failed (what the store
    /// reports as available).
    pub fn free_units(&self) -> u64 {
        self.free + self.growable_units()
    }

    /// Free units below the frontier: what can be allocated right now.
    pub fn usable_units(&self) -> u64 {
        self.free
    }

    /// Units beyond the frontier that growing the file can make usable (0 while it fails).
    pub fn growable_units(&self) -> u64 {
        if self.grow_failed {
            0
        } else {
            self.end - self.frontier
        }
    }

    /// Free extents below the frontier, and the length of the largest (units).
    pub fn fragments(&self) -> (u64, u64) {
        let largest = self.by_len.iter().next_back().map_or(0, |(len, _)| *len);
        (self.by_off.len() as u64, largest)
    }

    /// Units on the device.
    pub fn end_units(&self) -> u64 {
        self.end
    }

    /// The first unit not written yet.
    pub fn frontier(&self) -> u64 {
        self.frontier
    }

    /// Units `[frontier, to)` have been written and flushed: they become allocatable.
    pub fn advance(&mut self, to: u64) {
        let to = to.min(self.end);
        if to > self.frontier {
            let from = self.frontier;
            self.frontier = to;
            self.release(from, to - from);
        }
        self.grow_failed = false;
    }

    /// Records that growing failed (`true`) or may be tried again (`false`).
    pub fn set_grow_failed(&mut self, failed: bool) {
        self.grow_failed = failed;
    }

    /// Whether a request for `units` that [`Allocator::allocate`] refused can be served once
    /// the file has grown.
    pub fn fits_after_growth(&self, units: u64) -> bool {
        !self.grow_failed && units <= self.free + (self.end - self.frontier)
    }

    fn add(&mut self, off: u64, len: u64) {
        self.by_off.insert(off, len);
        self.by_len.insert((len, off));
    }

    fn del(&mut self, off: u64, len: u64) {
        self.by_off.remove(&off);
        self.by_len.remove(&(len, off));
    }

    /// Return `[off, off + len)` to the free pool, coalescing with neighbours.
    pub fn release(&mut self, mut off: u64, mut len: u64) {
        if len == 0 {
            return;
        }
        self.free += len;
        if let Some((&po, &pl)) = self.by_off.range(..off).next_back()
            && po + pl == off
        {
            self.del(po, pl);
            off = po;
            len += pl;
        }
        if let Some(&nl) = self.by_off.get(&(off + len)) {
            self.del(off + len, nl);
            len += nl;
        }
        self.add(off, len);
    }

    /// Take `units` units, as few runs as possible: the smallest free extent that fits, else
    /// the largest ones. Nothing is taken if there is not enough space.
    pub fn allocate(&mut self, units: u64) -> Option<Vec<(u64, u64)>> {
        if units == 0 {
            return Some(Vec::new());
        }
        if units > self.free {
            return None;
        }
        let mut out = Vec::new();
        let mut need = units;
        while need > 0 {
            let pick = match self.by_len.range((need, 0)..).next() {
                Some(&(len, off)) => (len, off),
                None => *self.by_len.iter().next_back()?,
            };
            let (len, off) = pick;
            let take = len.min(need);
            self.del(off, len);
            if take < len {
                self.add(off + take, len - take);
            }
            self.free -= take;
            need -= take;
            out.push((off, take));
        }
        Some(out)
    }
}

/// One bit per allocation unit; set = allocated by committed metadata.
#[derive(Debug, Clone)]
pub struct Bitmap {
    words: Vec<u64>,
    units: u64,
    dirty: BTreeSet<u32>,
}

impl Bitmap {
    pub fn new(units: u64) -> Self {
        Bitmap {
            words: vec![0; units.div_ceil(64) as usize],
            units,
            dirty: BTreeSet::new(),
        }
    }

    pub fn chunks(&self) -> u32 {
        self.units.div_ceil(BITMAP_CHUNK_UNITS) as u32
    }

    pub fn get(&self, unit: u64) -> bool {
        self.words
            .get((unit / 64) as usize)
            .is_some_and(|w| w & (1 << (unit % 64)) != 0)
    }

    pub fn set_range(&mut self, off: u64, len: u64, value: bool) {
        for u in off..(off + len).min(self.units) {
            let w = &mut self.words[(u / 64) as usize];
            if value {
                *w |= 1 << (u % 64);
            } else {
                *w &= !(1 << (u % 64));
            }
        }
        if len > 0 {
            let first = (off / BITMAP_CHUNK_UNITS) as u32;
            let last = ((off + len - 1) / BITMAP_CHUNK_UNITS) as u32;
            self.dirty.extend(first..=last);
        }
    }

    /// Chunks changed since the last call, encoded for the database.
    pub fn take_dirty(&mut self) -> Vec<(u32, Vec<u8>)> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|c| (c, self.encode_chunk(c)))
            .collect()
    }

    pub fn mark_all_dirty(&mut self) {
        self.dirty = (0..self.chunks()).collect();
    }

    fn encode_chunk(&self, chunk: u32) -> Vec<u8> {
        let wpc = (BITMAP_CHUNK_UNITS / 64) as usize;
        let start = chunk as usize * wpc;
        let mut v = Vec::with_capacity(1 + wpc * 8);
        v.push(BITMAP_VERSION);
        for i in start..start + wpc {
            v.extend_from_slice(&self.words.get(i).copied().unwrap_or(0).to_le_bytes());
        }
        v
    }

    pub fn load_chunk(&mut self, chunk: u32, value: &[u8]) -> Result<()> {
        let wpc = (BITMAP_CHUNK_UNITS / 64) as usize;
        match value.split_first() {
            Some((&BITMAP_VERSION, body)) if body.len() == wpc * 8 => {
                for (i, w) in body.chunks_exact(8).enumerate() {
                    let idx = chunk as usize * wpc + i;
                    let mut b = [0u8; 8];
                    b.copy_from_slice(w);
                    let word = u64::from_le_bytes(b);
                    match self.words.get_mut(idx) {
                        Some(slot) => *slot = word,
                        None if word == 0 => {}
                        None => {
                            return Err(StoreError::corrupt(format!(
                                "bitmap chunk {chunk} marks units beyond the device"
                            )));
                        }
                    }
                }
                Ok(())
            }
            Some((&v, _)) if v != BITMAP_VERSION => Err(StoreError::UnsupportedVersion {
                what: "allocation bitmap",
                found: u32::from(v),
                supported: u32::from(BITMAP_VERSION),
            }),
            _ => Err(StoreError::corrupt(format!(
                "bitmap chunk {chunk} has a bad length"
            ))),
        }
    }

    /// Free runs `(off, len)` of the bitmap.
    pub fn free_runs(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut u = 0;
        while u < self.units {
            if self.words[(u / 64) as usize] == u64::MAX && u % 64 == 0 {
                u += 64;
                continue;
            }
            if self.get(u) {
                u += 1;
                continue;
            }
            let s = u;
            while u < self.units && !self.get(u) {
                if u % 64 == 0 && self.words[(u / 64) as usize] == 0 && u + 64 <= self.units {
                    u += 64;
                } else {
                    u += 1;
                }
            }
            out.push((s, u - s));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_best_fit_and_coalesce() {
        let mut a = Allocator::default();
        a.release(0, 100);
        assert_eq!(a.allocate(10), Some(vec![(0, 10)]));
        assert_eq!(a.allocate(10), Some(vec![(10, 10)]));
        a.release(0, 10);
        assert_eq!(
            a.allocate(5),
            Some(vec![(0, 5)]),
            "best fit picks the small hole"
        );
        a.release(0, 5);
        a.release(10, 10);
        assert_eq!(a.free_units(), 100);
        assert_eq!(a.allocate(100), Some(vec![(0, 100)]), "fully coalesced");
        assert_eq!(a.allocate(1), None);
    }

    #[test]
    fn allocator_fragments_when_needed() {
        let mut a = Allocator::default();
        a.release(0, 3);
        a.release(10, 3);
        let got = a.allocate(5).unwrap();
        assert_eq!(got.iter().map(|r| r.1).sum::<u64>(), 5);
        assert_eq!(a.free_units(), 1);
        assert_eq!(a.allocate(2), None);
        assert_eq!(a.free_units(), 1, "a failed allocation takes nothing");
    }

    #[test]
    fn frontier_holds_back_unwritten_units_until_advanced() {
        let mut a = Allocator::with_frontier(10, 100);
        a.release(0, 10);
        assert_eq!(
            a.free_units(),
            100,
            "units beyond the frontier count as free"
        );
        assert_eq!(a.usable_units(), 10);
        assert_eq!(a.allocate(11), None, "but cannot be handed out");
        assert!(a.fits_after_growth(11));
        assert!(!a.fits_after_growth(101));
        assert_eq!(a.allocate(10), Some(vec![(0, 10)]));
        a.advance(40);
        assert_eq!(a.frontier(), 40);
        assert_eq!(a.allocate(30), Some(vec![(10, 30)]));
        a.set_grow_failed(true);
        assert_eq!(
            a.free_units(),
            0,
            "a full file system: nothing beyond is available"
        );
        assert!(!a.fits_after_growth(1));
        a.advance(1000);
        assert_eq!(a.frontier(), 100, "never past the end");
        assert_eq!(a.free_units(), 60);
        assert_eq!(a.allocate(60), Some(vec![(40, 60)]));
    }

    #[test]
    fn bitmap_round_trip_and_runs() {
        let mut b = Bitmap::new(10_000);
        b.set_range(5, 100, true);
        b.set_range(9000, 10, true);
        let dirty = b.take_dirty();
        let mut c = Bitmap::new(10_000);
        for (i, v) in &dirty {
            c.load_chunk(*i, v).unwrap();
        }
        assert_eq!(c.free_runs(), vec![(0, 5), (105, 8895), (9010, 990)]);
        assert!(c.load_chunk(0, &[9, 0]).is_err());
    }
}

//! Which large reads go through the page cache.
//!
//! A read larger than the small-read limit normally goes straight to the device (`O_DIRECT`):
//! on this kind of machine a cold buffered read moves the same bytes at the same speed but
//! costs the kernel about a core per GB/s (page allocation and copying), and a single pass
//! over a large data set (a backfill, a `rados bench seq`, a sequential scan) would only push
//! everything else out of the cache. But a range read again soon after (the hot objects of an
//! S3 workload) is cheaper from memory than from the device every time.
//!
//! So the store caches a large range on its *second* read within a window of recent large
//! reads, measured in bytes (a reuse distance): the first read goes to the device and is
//! remembered; a read of the same range while it is still remembered goes through the page
//! cache (filling it); later ones are answered from the page cache without waiting
//! (`RWF_NOWAIT`), and a range no longer cached (reclaimed by the kernel) goes back to the
//! device and must be read again within the window to be cached again. A scan of more data
//! than the window never reads through the cache, so it cannot thrash it; the window also
//! bounds how much of the page cache one store fills with large reads.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// How to read a large range.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Plan {
    /// From the device (`O_DIRECT`): not read recently.
    Direct,
    /// Through the page cache, filling it: read once before, within the window.
    Fill,
    /// From the page cache if all of it is there (`RWF_NOWAIT`), else from the device (then
    /// call [`HotReads::missed`]).
    Cached,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Heat {
    Seen,
    Filled,
}

/// Key of a range: its first physical unit and its length in units.
type Range = (u64, u64);

#[derive(Default)]
struct State {
    /// Ranges read within the window: their heat and the stamp of their latest read.
    ranges: HashMap<Range, (Heat, u64)>,
    /// Reads in order (range, stamp, bytes); entries whose stamp is not the range's latest
    /// are stale and only count towards the window.
    order: VecDeque<(Range, u64, u64)>,
    /// Bytes of the reads in `order`.
    bytes: u64,
    stamp: u64,
}

/// The window of recent large reads (see the module documentation).
pub(crate) struct HotReads {
    window: u64,
    state: Mutex<State>,
}

impl HotReads {
    /// A window of `window` bytes of large reads (0: never cache large reads).
    pub(crate) fn new(window: u64) -> HotReads {
        HotReads {
            window,
            state: Mutex::new(State::default()),
        }
    }

    /// Records a read of `units` units (`bytes` bytes) from physical unit `punit` and says how
    /// to do it.
    pub(crate) fn plan(&self, punit: u64, units: u64, bytes: u64) -> Plan {
        if self.window == 0 || bytes > self.window {
            return Plan::Direct;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.stamp += 1;
        let stamp = st.stamp;
        let key = (punit, units);
        let (heat, plan) = match st.ranges.get(&key) {
            None => (Heat::Seen, Plan::Direct),
            Some((Heat::Seen, _)) => (Heat::Filled, Plan::Fill),
            Some((Heat::Filled, _)) => (Heat::Filled, Plan::Cached),
        };
        st.ranges.insert(key, (heat, stamp));
        st.order.push_back((key, stamp, bytes));
        st.bytes += bytes;
        while st.bytes > self.window {
            let Some((old, old_stamp, old_bytes)) = st.order.pop_front() else {
                break;
            };
            st.bytes -= old_bytes;
            if st.ranges.get(&old).is_some_and(|&(_, s)| s == old_stamp) {
                st.ranges.remove(&old);
            }
        }
        plan
    }

    /// A [`Plan::Cached`] read found part of the range missing from the page cache and read
    /// the device: the range has to be read again within the window to be cached again.
    pub(crate) fn missed(&self, punit: u64, units: u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((heat, _)) = st.ranges.get_mut(&(punit, units)) {
            *heat = Heat::Seen;
        }
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.state.lock().unwrap().ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn second_read_fills_third_is_cached() {
        let h = HotReads::new(64 * MIB);
        assert_eq!(h.plan(100, 1024, 4 * MIB), Plan::Direct);
        assert_eq!(h.plan(100, 1024, 4 * MIB), Plan::Fill);
        assert_eq!(h.plan(100, 1024, 4 * MIB), Plan::Cached);
        assert_eq!(h.plan(100, 1024, 4 * MIB), Plan::Cached);
        // Another length at the same start is another range.
        assert_eq!(h.plan(100, 512, 2 * MIB), Plan::Direct);
    }

    #[test]
    fn a_scan_larger_than_the_window_never_uses_the_cache() {
        let h = HotReads::new(64 * MIB);
        for pass in 0..3 {
            for i in 0..32u64 {
                assert_eq!(h.plan(i * 1024, 1024, 4 * MIB), Plan::Direct, "pass {pass}");
            }
        }
        assert!(h.remembered() <= 16);
    }

    #[test]
    fn hot_ranges_stay_while_cold_ones_pass_through() {
        let h = HotReads::new(64 * MIB);
        // Two hot ranges read between every cold one: their latest reads stay in the window.
        let mut cold = 1_000_000u64;
        for round in 0..200 {
            for hot in [1u64, 2] {
                let p = h.plan(hot * 1024, 1024, 4 * MIB);
                if round >= 2 {
                    assert_eq!(p, Plan::Cached, "round {round}");
                }
            }
            assert_eq!(h.plan(cold, 1024, 4 * MIB), Plan::Direct);
            cold += 1024;
        }
        assert!(h.remembered() <= 16);
    }

    #[test]
    fn a_missed_cached_read_starts_over() {
        let h = HotReads::new(64 * MIB);
        h.plan(7, 256, MIB);
        h.plan(7, 256, MIB);
        assert_eq!(h.plan(7, 256, MIB), Plan::Cached);
        h.missed(7, 256);
        assert_eq!(h.plan(7, 256, MIB), Plan::Fill);
        assert_eq!(h.plan(7, 256, MIB), Plan::Cached);
    }

    #[test]
    fn zero_window_or_huge_read_is_direct() {
        let h = HotReads::new(0);
        for _ in 0..3 {
            assert_eq!(h.plan(1, 1024, 4 * MIB), Plan::Direct);
        }
        let h = HotReads::new(4 * MIB);
        for _ in 0..3 {
            assert_eq!(h.plan(1, 2048, 8 * MIB), Plan::Direct);
        }
        assert_eq!(h.remembered(), 0);
    }
}

//! The leader's MDS liveness bookkeeping, as a pure state machine: when each MDS in the
//! file-system map last sent a beacon, and which ones have been silent for `mds_beacon_grace`.
//!
//! Invariants:
//! - it lives on the leader only and is reset when leadership is lost; an MDS the bookkeeping
//!   does not know yet (after a leader change, or a newly registered one) gets a fresh grace
//!   from the first tick that sees it, so a new leader never fails an MDS sooner than a full
//!   grace after it took over;
//! - the timer is per client instance: an MDS that restarted under the same name starts afresh;
//! - a timed-out MDS is reported once per grace (its timer restarts when reported), and the
//!   proposal it becomes is guarded by the instance (`MonEntry::MdsTimedOut`), so a late or
//!   repeated one is a no-op.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kelp_maps::FsMap;

/// Last beacon per MDS name: `(client instance, when)`.
#[derive(Debug, Default)]
pub struct MdsLiveness {
    last: HashMap<String, (String, Instant)>,
}

impl MdsLiveness {
    /// A beacon from `name` (client `instance`) arrived at `now`.
    pub fn beacon(&mut self, name: &str, instance: &str, now: Instant) {
        self.last
            .insert(name.to_string(), (instance.to_string(), now));
    }

    /// The MDS daemons of `fsmap` silent for `grace` at `now`, as `(name, instance)`.
    pub fn tick(&mut self, fsmap: &FsMap, now: Instant, grace: Duration) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut seen = HashMap::new();
        for d in fsmap.mds_daemons() {
            let entry = match self.last.remove(&d.name) {
                Some((instance, t)) if instance == d.instance => (instance, t),
                _ => (d.instance.clone(), now),
            };
            let entry = if now.saturating_duration_since(entry.1) >= grace {
                out.push((d.name.clone(), d.instance.clone()));
                (entry.0, now)
            } else {
                entry
            };
            seen.insert(d.name.clone(), entry);
        }
        // Beacons not yet in the map (a registration still being committed) are kept.
        for (name, v) in self.last.drain() {
            seen.entry(name).or_insert(v);
        }
        self.last = seen;
        out
    }

    /// Forgets everything (this monitor is not the leader).
    pub fn reset(&mut self) {
        self.last.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kelp_maps::{MdsBeacon, MdsState};

    fn fsmap_with(names: &[&str]) -> FsMap {
        let mut m = FsMap::new();
        for n in names {
            let b = MdsBeacon {
                name: n.to_string(),
                addr: "127.0.0.1:1".parse().unwrap(),
                instance: format!("i.{n}"),
                fs: None,
                state: MdsState::Standby,
                incarnation: 0,
            };
            m.mds_beacon(&b, 0).unwrap();
        }
        m
    }

    #[test]
    fn silent_mds_time_out_after_grace_and_unknown_ones_get_a_fresh_grace() {
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let map = fsmap_with(&["a", "b"]);
        let mut l = MdsLiveness::default();
        l.beacon("a", "i.a", t0);
        // b was never heard by this leader: fresh grace from the first tick.
        assert!(l.tick(&map, t0 + Duration::from_secs(1), grace).is_empty());
        l.beacon("a", "i.a", t0 + Duration::from_secs(4));
        let out = l.tick(&map, t0 + Duration::from_secs(6), grace);
        assert_eq!(out, vec![("b".to_string(), "i.b".to_string())]);
        // reported once per grace
        assert!(l.tick(&map, t0 + Duration::from_secs(7), grace).is_empty());
        let out = l.tick(&map, t0 + Duration::from_secs(10), grace);
        assert_eq!(out, vec![("a".to_string(), "i.a".to_string())]);
        let out = l.tick(&map, t0 + Duration::from_secs(11), grace);
        assert_eq!(
            out,
            vec![("b".to_string(), "i.b".to_string())],
            "reported again"
        );
    }

    #[test]
    fn a_new_instance_restarts_the_timer_and_reset_forgets() {
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let map = fsmap_with(&["a"]);
        let mut l = MdsLiveness::default();
        l.beacon("a", "old", t0);
        assert!(l.tick(&map, t0 + Duration::from_secs(4), grace).is_empty());
        assert!(l.tick(&map, t0 + Duration::from_secs(8), grace).is_empty());
        assert_eq!(l.tick(&map, t0 + Duration::from_secs(9), grace).len(), 1);
        l.reset();
        assert!(l.tick(&map, t0 + Duration::from_secs(20), grace).is_empty());
    }
}

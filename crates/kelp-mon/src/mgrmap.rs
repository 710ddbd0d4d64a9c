//! The manager map on the leader: which `kelp mgr` daemon is active, which stand by.
//!
//! Why in memory: managers beacon every second, so a new leader rebuilds the map within one
//! beacon interval; putting beacons through Raft would write the log once per second per
//! manager for nothing. The decision is a pure state machine (time is passed in) so failover
//! can be tested without daemons.
//!
//! Invariants: at most one active manager; the active one changes only when it has been
//! silent for `grace` (or restarted as a new instance), and the first live standby (in beacon
//! order) takes over; the epoch grows by one at every change of the active manager.

use std::time::{Duration, Instant};

use kelp_proto::{MgrInfo, MgrMap};

#[derive(Debug, Clone)]
struct Member {
    info: MgrInfo,
    last_beacon: Instant,
}

/// What a tick or a beacon changed, for the cluster log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MgrEvent {
    /// `name` became the active manager (`previous`: the one it replaced).
    Active {
        name: String,
        previous: Option<String>,
    },
    /// A standby was dropped for silence.
    StandbyGone { name: String },
}

#[derive(Debug, Default)]
pub struct MgrTracker {
    epoch: u64,
    active: Option<Member>,
    standbys: Vec<Member>,
}

impl MgrTracker {
    /// A beacon from manager `info.name`: records it and answers whether it is active now.
    pub fn beacon(
        &mut self,
        info: MgrInfo,
        now: Instant,
        grace: Duration,
    ) -> (bool, Vec<MgrEvent>) {
        let name = info.name.clone();
        let mut events = self.tick(now, grace);
        if let Some(a) = &mut self.active
            && a.info.name == info.name
        {
            if a.info.instance == info.instance {
                a.info = info;
                a.last_beacon = now;
                return (true, events);
            }
            // The active manager restarted: the old run is gone, the new one starts as a
            // standby (another standby may take over at once, as in Ceph).
            let gone = self.active.take().map(|m| m.info.name);
            events.extend(self.promote(gone));
        }
        match self.standbys.iter_mut().find(|m| m.info.name == info.name) {
            Some(m) => {
                m.info = info;
                m.last_beacon = now;
            }
            None => self.standbys.push(Member {
                info,
                last_beacon: now,
            }),
        }
        if self.active.is_none() {
            events.extend(self.promote(None));
        }
        (self.is_active(&name), events)
    }

    /// Drops silent managers; a silent active one is replaced by the first live standby.
    pub fn tick(&mut self, now: Instant, grace: Duration) -> Vec<MgrEvent> {
        let mut events = Vec::new();
        let live = |m: &Member| now.saturating_duration_since(m.last_beacon) <= grace;
        let before: Vec<String> = self.standbys.iter().map(|m| m.info.name.clone()).collect();
        self.standbys.retain(live);
        for name in before {
            if self.standbys.iter().all(|m| m.info.name != name) {
                events.push(MgrEvent::StandbyGone { name });
            }
        }
        if self.active.as_ref().is_some_and(|a| !live(a)) {
            let gone = self.active.take().map(|m| m.info.name);
            events.extend(self.promote(gone));
        }
        events
    }

    /// Makes the first standby active (if any).
    fn promote(&mut self, previous: Option<String>) -> Option<MgrEvent> {
        if self.standbys.is_empty() {
            if previous.is_some() {
                self.epoch += 1;
            }
            return None;
        }
        let next = self.standbys.remove(0);
        self.epoch += 1;
        let name = next.info.name.clone();
        self.active = Some(next);
        Some(MgrEvent::Active { name, previous })
    }

    pub fn is_active(&self, name: &str) -> bool {
        self.active.as_ref().is_some_and(|a| a.info.name == name)
    }

    pub fn map(&self) -> MgrMap {
        MgrMap {
            epoch: self.epoch,
            active: self.active.as_ref().map(|m| m.info.clone()),
            standbys: self.standbys.iter().map(|m| m.info.clone()).collect(),
        }
    }

    /// Forgets everything (this monitor is no longer the leader).
    pub fn reset(&mut self) {
        let epoch = self.epoch;
        *self = MgrTracker::default();
        // keep epochs growing across leaderships of this monitor
        self.epoch = epoch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, inst: &str) -> MgrInfo {
        MgrInfo {
            name: name.into(),
            dashboard_url: format!("http://{name}/"),
            instance: inst.into(),
        }
    }

    #[test]
    fn first_live_is_active_and_a_silent_active_is_replaced() {
        let g = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut m = MgrTracker::default();
        assert!(m.beacon(info("x", "1"), t0, g).0);
        assert!(!m.beacon(info("y", "2"), t0, g).0);
        assert!(m.beacon(info("x", "1"), t0 + Duration::from_secs(1), g).0);
        assert_eq!(m.map().epoch, 1);
        assert_eq!(m.map().standbys.len(), 1);
        // y keeps beaconing, x falls silent
        for s in 2..=6 {
            assert!(!m.beacon(info("y", "2"), t0 + Duration::from_secs(s), g).0);
        }
        let (active, events) = m.beacon(info("y", "2"), t0 + Duration::from_secs(7), g);
        assert!(active);
        assert_eq!(
            events,
            vec![MgrEvent::Active {
                name: "y".into(),
                previous: Some("x".into())
            }]
        );
        assert_eq!(m.map().epoch, 2);
        assert!(m.map().standbys.is_empty());
        // x comes back: it stands by
        assert!(!m.beacon(info("x", "1"), t0 + Duration::from_secs(8), g).0);
        assert!(m.is_active("y"));
    }

    #[test]
    fn a_restarted_active_hands_over_to_a_standby() {
        let g = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut m = MgrTracker::default();
        m.beacon(info("x", "1"), t0, g);
        m.beacon(info("y", "2"), t0, g);
        let (active, _) = m.beacon(info("x", "3"), t0 + Duration::from_secs(1), g);
        assert!(!active);
        assert!(m.is_active("y"));
        // alone, a restarted manager becomes active again
        let mut solo = MgrTracker::default();
        solo.beacon(info("x", "1"), t0, g);
        assert!(solo.beacon(info("x", "2"), t0, g).0);
        assert_eq!(solo.map().active.map(|a| a.instance), Some("2".into()));
    }
}

//! The leader's OSD liveness decisions, as a pure state machine: failure reports from heartbeat
//! peers, lost monitor sessions, and the down → out timer.
//!
//! Why pure: every corner (reporters that disagree, stale reports, flags, a reboot between a
//! report and the decision) is unit-tested here without a network or a clock; the monitor's
//! `leader_loop` feeds it the current map, the set of OSDs with a live session and `now`, and
//! proposes the [`MonEntry`]s it returns.
//!
//! Invariants:
//! - it lives on the leader only and is reset when leadership is lost: reports are not
//!   replicated (OSDs resend a standing report every heartbeat interval, so a new leader
//!   knows it within one interval), and timers restart on a new leader, which can only delay a
//!   decision, never hasten it;
//! - a report counts only while it is fresher than `osd_heartbeat_grace`, and only for the
//!   incarnation of the target it was made about (`up_from`), from a reporter that is up;
//! - an OSD is marked down when `mon_osd_min_down_reporters` distinct OSDs agree, capped at the
//!   number of other up OSDs (at least one), so a two-OSD cluster can still mark one down;
//! - nothing is proposed for `nodown` (down) or `noout` (out); the down-out clock keeps running
//!   under `noout`, so an OSD down for long enough goes out as soon as `noout` is unset;
//! - every proposal is guarded (`up_from`, `down_at`) so that it is a no-op if the OSD changed
//!   state before it commits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use kelp_maps::{ClusterFlag, OsdMap};
use kelp_proto::OsdFailure;

use crate::state::MonEntry;

/// The settings the decisions depend on (from the central config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LivenessParams {
    /// `mon_osd_session_grace`: an up OSD without a monitor session this long is marked down.
    pub session_grace: Duration,
    /// `osd_heartbeat_grace`: how long a failure report stays valid without being resent.
    pub report_grace: Duration,
    /// `mon_osd_min_down_reporters`.
    pub min_down_reporters: usize,
    /// `mon_osd_down_out_interval`; `None` disables marking out.
    pub down_out_interval: Option<Duration>,
}

impl Default for LivenessParams {
    /// The registry's defaults of the keys named on the fields.
    fn default() -> Self {
        use kelp_config::keys;
        let down_out = keys::MON_OSD_DOWN_OUT_INTERVAL.default.as_duration();
        LivenessParams {
            session_grace: keys::MON_OSD_SESSION_GRACE.default.as_duration(),
            report_grace: keys::OSD_HEARTBEAT_GRACE.default.as_duration(),
            min_down_reporters: keys::MON_OSD_MIN_DOWN_REPORTERS.default.as_u64() as usize,
            down_out_interval: (!down_out.is_zero()).then_some(down_out),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Report {
    received: Instant,
    failed_for: Duration,
}

#[derive(Debug, Default)]
struct TargetReports {
    up_from: u32,
    by: BTreeMap<i32, Report>,
}

/// What became of one failure report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    /// Recorded (or refreshed).
    Recorded,
    /// The reporter withdrew its report (`alive`).
    Cancelled,
    /// Ignored: the target is unknown, already down or has re-booted since, or the reporter
    /// is not up.
    Stale,
}

/// The leader's liveness bookkeeping.
#[derive(Debug, Default)]
pub struct Liveness {
    /// Last time an up OSD had a session to this monitor.
    last_seen: HashMap<i32, Instant>,
    /// When this leader first saw a (still in) OSD down.
    down_since: HashMap<i32, Instant>,
    failures: BTreeMap<i32, TargetReports>,
    /// Why the last `tick` proposed marking each OSD down (for the log).
    why: BTreeMap<i32, String>,
}

impl Liveness {
    /// Forgets everything (leadership lost).
    pub fn reset(&mut self) {
        *self = Liveness::default();
    }

    /// Records a failure report (or its withdrawal) made against `map`.
    pub fn report(&mut self, map: &OsdMap, f: &OsdFailure, now: Instant) -> ReportOutcome {
        if f.alive {
            let Some(t) = self.failures.get_mut(&f.target) else {
                return ReportOutcome::Cancelled;
            };
            t.by.remove(&f.reporter);
            if t.by.is_empty() {
                self.failures.remove(&f.target);
            }
            return ReportOutcome::Cancelled;
        }
        let Some(target) = map.osds.get(&f.target) else {
            return ReportOutcome::Stale;
        };
        if !target.up || target.up_from != f.target_up_from || !map.is_up(f.reporter) {
            return ReportOutcome::Stale;
        }
        let t = self.failures.entry(f.target).or_default();
        if t.up_from != target.up_from {
            t.by.clear();
            t.up_from = target.up_from;
        }
        t.by.insert(
            f.reporter,
            Report {
                received: now,
                failed_for: Duration::from_millis(f.failed_for_ms),
            },
        );
        ReportOutcome::Recorded
    }

    /// Distinct valid reporters against `target` (after the last `tick`).
    pub fn reporters(&self, target: i32) -> Vec<i32> {
        self.failures
            .get(&target)
            .map(|t| t.by.keys().copied().collect())
            .unwrap_or_default()
    }

    /// The longest silence reported against `target`.
    pub fn failed_for(&self, target: i32) -> Option<Duration> {
        self.failures
            .get(&target)
            .and_then(|t| t.by.values().map(|r| r.failed_for).max())
    }

    /// How many distinct reporters it takes to mark `target` down in `map`.
    pub fn needed_reporters(map: &OsdMap, target: i32, min_down_reporters: usize) -> usize {
        let others = map.osds.values().filter(|o| o.up && o.id != target).count();
        min_down_reporters.min(others).max(1)
    }

    /// One step of the leader's housekeeping: the entries to propose now.
    pub fn tick(
        &mut self,
        map: &OsdMap,
        connected: &HashSet<i32>,
        now: Instant,
        p: &LivenessParams,
    ) -> Vec<MonEntry> {
        let nodown = map.has_flag(ClusterFlag::NoDown);
        let noout = map.has_flag(ClusterFlag::NoOut);
        self.failures.retain(|id, _| map.osds.contains_key(id));
        let mut out = Vec::new();
        self.why.clear();
        for osd in map.osds.values() {
            if osd.up {
                self.down_since.remove(&osd.id);
                // Failure reports: drop the stale ones, then count.
                let mut by_reports = false;
                if let Some(t) = self.failures.get_mut(&osd.id) {
                    if t.up_from != osd.up_from {
                        t.by.clear();
                    }
                    t.by.retain(|reporter, r| {
                        map.is_up(*reporter)
                            && now.saturating_duration_since(r.received) <= p.report_grace
                    });
                    let needed = Self::needed_reporters(map, osd.id, p.min_down_reporters);
                    by_reports = !t.by.is_empty() && t.by.len() >= needed;
                    if t.by.is_empty() {
                        self.failures.remove(&osd.id);
                    }
                }
                // The monitor session.
                let session_lost = if connected.contains(&osd.id) {
                    self.last_seen.insert(osd.id, now);
                    false
                } else {
                    let seen = *self.last_seen.entry(osd.id).or_insert(now);
                    now.saturating_duration_since(seen) > p.session_grace
                };
                if (by_reports || session_lost) && !nodown {
                    let why = match self.failures.get(&osd.id) {
                        Some(t) if by_reports => format!(
                            "reported failed by {} (silent for up to {:?})",
                            t.by.keys()
                                .map(|r| format!("osd.{r}"))
                                .collect::<Vec<_>>()
                                .join(", "),
                            t.by.values()
                                .map(|r| r.failed_for)
                                .max()
                                .unwrap_or_default()
                        ),
                        _ => "no monitor session".into(),
                    };
                    self.why.insert(osd.id, why);
                    out.push(MonEntry::MarkDown {
                        id: osd.id,
                        up_from: osd.up_from,
                    });
                    self.last_seen.remove(&osd.id);
                    self.failures.remove(&osd.id);
                }
            } else {
                self.last_seen.remove(&osd.id);
                self.failures.remove(&osd.id);
                match p.down_out_interval {
                    Some(interval) if osd.is_in() => {
                        let since = *self.down_since.entry(osd.id).or_insert(now);
                        if now.saturating_duration_since(since) > interval && !noout {
                            out.push(MonEntry::MarkOut {
                                id: osd.id,
                                down_at: osd.down_at,
                            });
                            self.down_since.remove(&osd.id);
                        }
                    }
                    _ => {
                        self.down_since.remove(&osd.id);
                    }
                }
            }
        }
        self.last_seen.retain(|id, _| map.osds.contains_key(id));
        self.down_since.retain(|id, _| map.osds.contains_key(id));
        out
    }

    /// Why the last `tick` proposed marking `id` down, for the log.
    pub fn describe(&self, id: i32) -> String {
        self.why.get(&id).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_maps::Incremental;

    /// A map with OSDs `0..n`, all up and in.
    fn map_with(n: i32) -> OsdMap {
        let mut map = OsdMap::new("fsid", "osd").unwrap();
        for i in 0..n {
            let (_, inc) = map
                .propose_osd_create_with_id(&format!("u{i}"), "h", 0x10000, Some(i))
                .unwrap();
            map.apply(&inc.unwrap()).unwrap();
            let addr = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
            map.apply(&map.propose_osd_boot(i, addr).unwrap().unwrap())
                .unwrap();
        }
        map
    }

    fn apply(map: &mut OsdMap, f: impl FnOnce(&OsdMap) -> Option<Incremental>) {
        let inc = f(map).expect("a change");
        map.apply(&inc).unwrap();
    }

    fn all(map: &OsdMap) -> HashSet<i32> {
        map.osds.keys().copied().collect()
    }

    fn fail(map: &OsdMap, reporter: i32, target: i32) -> OsdFailure {
        OsdFailure {
            reporter,
            target,
            target_up_from: map.osds[&target].up_from,
            failed_for_ms: 7000,
            alive: false,
        }
    }

    fn params() -> LivenessParams {
        LivenessParams {
            session_grace: Duration::from_secs(5),
            report_grace: Duration::from_secs(6),
            min_down_reporters: 2,
            down_out_interval: Some(Duration::from_secs(10)),
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn two_distinct_reporters_mark_down_one_does_not() {
        let map = map_with(4);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let conn = all(&map);
        assert_eq!(
            l.report(&map, &fail(&map, 1, 0), t0),
            ReportOutcome::Recorded
        );
        // The same reporter twice is still one reporter.
        l.report(&map, &fail(&map, 1, 0), t0 + s(1));
        assert!(l.tick(&map, &conn, t0 + s(1), &params()).is_empty());
        assert_eq!(l.reporters(0), vec![1]);
        l.report(&map, &fail(&map, 2, 0), t0 + s(2));
        let out = l.tick(&map, &conn, t0 + s(2), &params());
        assert_eq!(
            out,
            vec![MonEntry::MarkDown {
                id: 0,
                up_from: map.osds[&0].up_from
            }]
        );
        assert!(l.describe(0).starts_with("reported failed by osd.1, osd.2"));
    }

    #[test]
    fn reports_expire_after_the_grace_and_can_be_cancelled() {
        let map = map_with(4);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let conn = all(&map);
        l.report(&map, &fail(&map, 1, 0), t0);
        // Seven seconds later the first report has expired: a second reporter alone is one.
        l.report(&map, &fail(&map, 2, 0), t0 + s(7));
        assert!(l.tick(&map, &conn, t0 + s(7), &params()).is_empty());
        assert_eq!(l.reporters(0), vec![2]);
        // A withdrawal cancels.
        let mut alive = fail(&map, 2, 0);
        alive.alive = true;
        assert_eq!(l.report(&map, &alive, t0 + s(8)), ReportOutcome::Cancelled);
        l.report(&map, &fail(&map, 3, 0), t0 + s(8));
        assert!(l.tick(&map, &conn, t0 + s(8), &params()).is_empty());
        assert_eq!(l.reporters(0), vec![3]);
    }

    #[test]
    fn stale_reports_are_ignored() {
        let mut map = map_with(3);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        // About an earlier incarnation of the target.
        let mut old = fail(&map, 1, 0);
        old.target_up_from -= 1;
        assert_eq!(l.report(&map, &old, t0), ReportOutcome::Stale);
        // From a reporter that is down.
        apply(&mut map, |m| m.propose_osd_down(2).unwrap());
        assert_eq!(l.report(&map, &fail(&map, 2, 0), t0), ReportOutcome::Stale);
        // Against a target that is already down.
        assert_eq!(l.report(&map, &fail(&map, 0, 2), t0), ReportOutcome::Stale);
        // A target that re-boots after being reported starts from zero.
        let mut map = map_with(3);
        l.report(&map, &fail(&map, 1, 0), t0);
        apply(&mut map, |m| m.propose_osd_down(0).unwrap());
        apply(&mut map, |m| {
            m.propose_osd_boot(0, "127.0.0.1:7100".parse().unwrap())
                .unwrap()
        });
        l.report(&map, &fail(&map, 2, 0), t0 + s(1));
        assert!(l.tick(&map, &all(&map), t0 + s(1), &params()).is_empty());
        assert_eq!(l.reporters(0), vec![2]);
    }

    #[test]
    fn reporters_are_capped_at_the_other_up_osds() {
        // Two OSDs: the only possible reporter is enough.
        let map = map_with(2);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        assert_eq!(Liveness::needed_reporters(&map, 0, 2), 1);
        l.report(&map, &fail(&map, 1, 0), t0);
        assert_eq!(l.tick(&map, &all(&map), t0, &params()).len(), 1);
        // Three OSDs, one of them already down: one reporter is enough for the third.
        let mut map = map_with(3);
        apply(&mut map, |m| m.propose_osd_down(2).unwrap());
        assert_eq!(Liveness::needed_reporters(&map, 0, 2), 1);
        // Five up OSDs: the setting holds.
        assert_eq!(Liveness::needed_reporters(&map_with(5), 0, 3), 3);
    }

    #[test]
    fn nodown_ignores_reports_and_sessions() {
        let mut map = map_with(3);
        apply(&mut map, |m| m.propose_flag(ClusterFlag::NoDown, true));
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.report(&map, &fail(&map, 1, 0), t0);
        l.report(&map, &fail(&map, 2, 0), t0);
        let nobody = HashSet::new();
        assert!(l.tick(&map, &nobody, t0, &params()).is_empty());
        assert!(l.tick(&map, &nobody, t0 + s(6), &params()).is_empty());
        // Unset: the standing reports (still fresh) and the lost sessions apply.
        apply(&mut map, |m| m.propose_flag(ClusterFlag::NoDown, false));
        let out = l.tick(&map, &nobody, t0 + s(6), &params());
        assert_eq!(out.len(), 3, "{out:?}");
    }

    #[test]
    fn session_loss_marks_down_after_its_grace() {
        let map = map_with(3);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let mut conn = all(&map);
        assert!(l.tick(&map, &conn, t0, &params()).is_empty());
        conn.remove(&1);
        assert!(l.tick(&map, &conn, t0 + s(5), &params()).is_empty());
        let out = l.tick(&map, &conn, t0 + s(6), &params());
        assert_eq!(
            out,
            vec![MonEntry::MarkDown {
                id: 1,
                up_from: map.osds[&1].up_from
            }]
        );
    }

    #[test]
    fn down_out_timer_and_noout() {
        let mut map = map_with(3);
        apply(&mut map, |m| m.propose_osd_down(1).unwrap());
        let t0 = Instant::now();
        let mut l = Liveness::default();
        let conn = all(&map);
        assert!(l.tick(&map, &conn, t0, &params()).is_empty());
        assert!(l.tick(&map, &conn, t0 + s(10), &params()).is_empty());
        let out = l.tick(&map, &conn, t0 + s(11), &params());
        assert_eq!(
            out,
            vec![MonEntry::MarkOut {
                id: 1,
                down_at: map.osds[&1].down_at
            }]
        );
        // noout: nothing, but the clock runs; unset it and the OSD goes out at once.
        let mut l = Liveness::default();
        apply(&mut map, |m| m.propose_flag(ClusterFlag::NoOut, true));
        assert!(l.tick(&map, &conn, t0, &params()).is_empty());
        assert!(l.tick(&map, &conn, t0 + s(30), &params()).is_empty());
        apply(&mut map, |m| m.propose_flag(ClusterFlag::NoOut, false));
        assert_eq!(l.tick(&map, &conn, t0 + s(30), &params()).len(), 1);
        // Disabled interval: never.
        let mut l = Liveness::default();
        let p = LivenessParams {
            down_out_interval: None,
            ..params()
        };
        assert!(l.tick(&map, &conn, t0, &p).is_empty());
        assert!(l.tick(&map, &conn, t0 + s(3600), &p).is_empty());
        // An OSD that came back up restarts the clock.
        let mut l = Liveness::default();
        assert!(l.tick(&map, &conn, t0, &params()).is_empty());
        apply(&mut map, |m| {
            m.propose_osd_boot(1, "127.0.0.1:7200".parse().unwrap())
                .unwrap()
        });
        assert!(l.tick(&map, &conn, t0 + s(5), &params()).is_empty());
        apply(&mut map, |m| m.propose_osd_down(1).unwrap());
        assert!(l.tick(&map, &conn, t0 + s(12), &params()).is_empty());
        assert_eq!(l.tick(&map, &conn, t0 + s(23), &params()).len(), 1);
    }

    #[test]
    fn a_new_leader_starts_afresh() {
        let map = map_with(3);
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.report(&map, &fail(&map, 1, 0), t0);
        l.reset();
        l.report(&map, &fail(&map, 2, 0), t0 + s(1));
        assert!(l.tick(&map, &all(&map), t0 + s(1), &params()).is_empty());
    }
}

//! Progress items for long work, derived from successive looks at the cluster (pure: the
//! caller passes the time and what it saw; nothing here does I/O).
//!
//! Ceph's progress module shape: an item appears when work is seen, its fraction grows as the
//! work left shrinks, its ETA is the work left divided by the recent rate (so it moves with the
//! rate), and a finished item stays listed for `keep_ms` with fraction 1.
//!
//! - **recovery**: degraded object copies. The fraction is `1 - left / most seen`, so an item
//!   whose work grows (a second OSD fails) moves back rather than pretending. A recovery that
//!   starts and ends between two looks leaves no degraded copies to see; it shows in the OSDs'
//!   cumulative recovered-object counts instead, and becomes a finished item of its own.
//! - **backfill**: misplaced object copies, alike.
//! - **scrub / deep scrub**: a *wave* starts when a PG is seen scrubbing; PGs that finished
//!   since (their stamp moved past the wave's start) are done, PGs scrubbing now are left; the
//!   wave ends once none has scrubbed for two looks.
//! - **reshard**: buckets whose record names a reshard target (no fraction is visible from
//!   outside the gateway: it shows 0 until it disappears, then 1).
//!
//! - **snapshot trim**: clones the OSDs' snapshot trimmers still have to examine (each OSD
//!   reports its own in its statistics), counted down like recovery.
//! - **pool deletion**: objects the OSDs still have to remove from the PGs of deleted pools,
//!   alike.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kelp_proto::{ProgressItem, ProgressKind};
use kelp_types::PgId;

/// What one look at the cluster saw.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Unix ms.
    pub now_ms: u64,
    pub degraded: u64,
    pub misplaced: u64,
    /// PGs scrubbing now, and whether deeply.
    pub scrubbing: BTreeMap<PgId, bool>,
    /// Every PG's (last scrub, last deep scrub) stamps, unix seconds.
    pub stamps: BTreeMap<PgId, (u64, u64)>,
    /// Buckets being resharded: (bucket, target shards, started unix ms).
    pub resharding: Vec<(String, u32, u64)>,
    /// Clones left to examine by the snapshot trimmers.
    pub snaptrim_left: u64,
    /// Objects left to remove from deleted pools' PGs.
    pub deleting_left: u64,
    /// Each up OSD's cumulative count of objects recovered onto it since it started.
    pub recovered: BTreeMap<i32, u64>,
}

/// Follows work left that counts down (degraded or misplaced copies).
#[derive(Debug, Clone)]
struct Countdown {
    started_ms: u64,
    most: u64,
    left: u64,
    /// (unix ms, left) of the last minute, for the rate.
    recent: VecDeque<(u64, u64)>,
}

impl Countdown {
    fn new(now_ms: u64, left: u64) -> Countdown {
        Countdown {
            started_ms: now_ms,
            most: left,
            left,
            recent: VecDeque::from([(now_ms, left)]),
        }
    }

    fn update(&mut self, now_ms: u64, left: u64) {
        self.most = self.most.max(left);
        self.left = left;
        self.recent.push_back((now_ms, left));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now_ms.saturating_sub(*t) > 60_000)
        {
            self.recent.pop_front();
        }
    }

    fn fraction_ppm(&self) -> u32 {
        if self.most == 0 {
            return 1_000_000;
        }
        let done = self.most - self.left.min(self.most);
        ((done as u128 * 1_000_000) / self.most as u128) as u32
    }

    /// Seconds left at the rate of the last minute; `None` while nothing was done in it.
    fn eta_secs(&self) -> Option<u64> {
        let (t0, l0) = *self.recent.front()?;
        let (t1, l1) = *self.recent.back()?;
        let dt = t1.saturating_sub(t0);
        if l1 >= l0 || dt == 0 {
            return None;
        }
        let per_ms = (l0 - l1) as f64 / dt as f64;
        Some(((l1 as f64 / per_ms) / 1000.0).ceil() as u64)
    }
}

/// A scrub wave.
#[derive(Debug, Clone)]
struct Wave {
    started_ms: u64,
    /// PGs seen scrubbing in this wave.
    seen: BTreeSet<PgId>,
    /// Looks in a row with no PG scrubbing.
    idle: u32,
    done: u64,
    left: u64,
}

#[derive(Debug, Clone)]
pub struct ProgressTracker {
    keep_ms: u64,
    recovery: Option<Countdown>,
    backfill: Option<Countdown>,
    scrub: Option<Wave>,
    deep: Option<Wave>,
    reshards: BTreeMap<String, (u32, u64)>,
    finished: VecDeque<ProgressItem>,
    snaptrim: Option<Countdown>,
    deletion: Option<Countdown>,
    /// The previous look's time and recovered-object counts.
    last_recovered: Option<(u64, BTreeMap<i32, u64>)>,
}

const MAX_FINISHED: usize = 50;

impl ProgressTracker {
    /// Finished items stay listed `keep_ms`.
    pub fn new(keep_ms: u64) -> ProgressTracker {
        ProgressTracker {
            keep_ms,
            recovery: None,
            backfill: None,
            scrub: None,
            deep: None,
            reshards: BTreeMap::new(),
            finished: VecDeque::new(),
            snaptrim: None,
            deletion: None,
            last_recovered: None,
        }
    }

    pub fn observe(&mut self, o: &Observation) {
        let now = o.now_ms;
        let moving_before = self.recovery.is_some() || self.backfill.is_some();
        let finished_before = self.finished.len();
        Self::countdown(
            &mut self.recovery,
            &mut self.finished,
            now,
            o.degraded,
            ProgressKind::Recovery,
        );
        Self::countdown(
            &mut self.backfill,
            &mut self.finished,
            now,
            o.misplaced,
            ProgressKind::Backfill,
        );
        Self::countdown(
            &mut self.snaptrim,
            &mut self.finished,
            now,
            o.snaptrim_left,
            ProgressKind::SnapTrim,
        );
        Self::countdown(
            &mut self.deletion,
            &mut self.finished,
            now,
            o.deleting_left,
            ProgressKind::PoolDeletion,
        );
        let recovered = recovered_since(self.last_recovered.as_ref().map(|(_, m)| m), &o.recovered);
        let unseen = !moving_before
            && self.recovery.is_none()
            && self.backfill.is_none()
            && self.finished.len() == finished_before;
        if let (true, Some((since, _))) = (unseen && recovered > 0, &self.last_recovered) {
            self.finished.push_back(ProgressItem {
                id: format!("{}-{since}", ProgressKind::Recovery.name()),
                kind: ProgressKind::Recovery,
                message: format!(
                    "Recovering degraded object copies: done ({recovered} recovered between two looks)"
                ),
                fraction_ppm: 1_000_000,
                eta_secs: Some(0),
                started_ms: *since,
                finished_ms: Some(now),
            });
        }
        // a look without statistics (no digest yet) keeps the previous baseline
        if !o.recovered.is_empty() {
            self.last_recovered = Some((now, o.recovered.clone()));
        }
        for deep in [false, true] {
            let slot = if deep {
                &mut self.deep
            } else {
                &mut self.scrub
            };
            let kind = if deep {
                ProgressKind::DeepScrub
            } else {
                ProgressKind::Scrub
            };
            let now_scrubbing: BTreeSet<PgId> = o
                .scrubbing
                .iter()
                .filter(|(_, d)| **d == deep)
                .map(|(pg, _)| *pg)
                .collect();
            if slot.is_none() && !now_scrubbing.is_empty() {
                *slot = Some(Wave {
                    started_ms: now,
                    seen: BTreeSet::new(),
                    idle: 0,
                    done: 0,
                    left: 0,
                });
            }
            if let Some(w) = slot {
                w.seen.extend(now_scrubbing.iter().copied());
                let start_s = w.started_ms / 1000;
                let done: u64 = w
                    .seen
                    .iter()
                    .filter(|pg| !now_scrubbing.contains(pg))
                    .filter(|pg| {
                        o.stamps
                            .get(pg)
                            .is_some_and(|(s, d)| if deep { *d } else { *s } >= start_s)
                    })
                    .count() as u64;
                w.done = done;
                w.left = now_scrubbing.len() as u64;
                w.idle = if now_scrubbing.is_empty() {
                    w.idle + 1
                } else {
                    0
                };
                if w.idle >= 2 {
                    let mut item = wave_item(w, kind, now);
                    item.finished_ms = Some(now);
                    item.fraction_ppm = 1_000_000;
                    item.eta_secs = Some(0);
                    self.finished.push_back(item);
                    *slot = None;
                }
            }
        }
        let current: BTreeMap<String, (u32, u64)> = o
            .resharding
            .iter()
            .map(|(b, s, t)| (b.clone(), (*s, *t)))
            .collect();
        for (bucket, (shards, started)) in &self.reshards {
            if !current.contains_key(bucket) {
                let mut item = reshard_item(bucket, *shards, *started);
                item.fraction_ppm = 1_000_000;
                item.eta_secs = Some(0);
                item.finished_ms = Some(now);
                self.finished.push_back(item);
            }
        }
        self.reshards = current;
        while self.finished.len() > MAX_FINISHED
            || self
                .finished
                .front()
                .is_some_and(|i| now.saturating_sub(i.finished_ms.unwrap_or(now)) > self.keep_ms)
        {
            self.finished.pop_front();
        }
    }

    fn countdown(
        slot: &mut Option<Countdown>,
        finished: &mut VecDeque<ProgressItem>,
        now: u64,
        left: u64,
        kind: ProgressKind,
    ) {
        match slot {
            None if left > 0 => *slot = Some(Countdown::new(now, left)),
            None => {}
            Some(c) if left == 0 => {
                c.update(now, 0);
                let mut item = countdown_item(c, kind);
                item.finished_ms = Some(now);
                item.eta_secs = Some(0);
                finished.push_back(item);
                *slot = None;
            }
            Some(c) => c.update(now, left),
        }
    }

    /// Running items first (recovery, backfill, scrub, deep scrub, reshards, snapshot trim,
    /// pool deletion), then finished ones, newest first.
    pub fn items(&self) -> Vec<ProgressItem> {
        let mut out = Vec::new();
        if let Some(c) = &self.recovery {
            out.push(countdown_item(c, ProgressKind::Recovery));
        }
        if let Some(c) = &self.backfill {
            out.push(countdown_item(c, ProgressKind::Backfill));
        }
        if let Some(w) = &self.scrub {
            out.push(wave_item(w, ProgressKind::Scrub, 0));
        }
        if let Some(w) = &self.deep {
            out.push(wave_item(w, ProgressKind::DeepScrub, 0));
        }
        for (b, (s, t)) in &self.reshards {
            out.push(reshard_item(b, *s, *t));
        }
        if let Some(c) = &self.snaptrim {
            out.push(countdown_item(c, ProgressKind::SnapTrim));
        }
        if let Some(c) = &self.deletion {
            out.push(countdown_item(c, ProgressKind::PoolDeletion));
        }
        out.extend(self.finished.iter().rev().cloned());
        out
    }
}

/// Objects recovered between two looks: each OSD's count minus what it was at the previous
/// look (an OSD whose count went down restarted: all of its count is new). An OSD the previous
/// look did not have only sets its baseline (what it did before may be older than that look),
/// and so does the first look.
fn recovered_since(prev: Option<&BTreeMap<i32, u64>>, cur: &BTreeMap<i32, u64>) -> u64 {
    let Some(prev) = prev else {
        return 0;
    };
    cur.iter()
        .filter_map(|(id, &n)| prev.get(id).map(|&p| if n >= p { n - p } else { n }))
        .sum()
}

fn countdown_item(c: &Countdown, kind: ProgressKind) -> ProgressItem {
    let (verb, what) = match kind {
        ProgressKind::Recovery => ("Recovering", "degraded object copies"),
        ProgressKind::SnapTrim => ("Trimming", "clones of removed snapshots"),
        ProgressKind::PoolDeletion => ("Removing", "objects of deleted pools"),
        _ => ("Moving", "misplaced object copies"),
    };
    ProgressItem {
        id: format!("{}-{}", kind.name(), c.started_ms),
        kind,
        message: if c.left == 0 {
            format!("{verb} {what}: done ({} in all)", c.most)
        } else {
            format!("{verb} {what}: {} of {} left", c.left, c.most)
        },
        fraction_ppm: c.fraction_ppm(),
        eta_secs: c.eta_secs(),
        started_ms: c.started_ms,
        finished_ms: None,
    }
}

fn wave_item(w: &Wave, kind: ProgressKind, _now: u64) -> ProgressItem {
    let total = w.done + w.left;
    let fraction_ppm = if total == 0 {
        0
    } else {
        ((w.done as u128 * 1_000_000) / total as u128) as u32
    };
    let name = if kind == ProgressKind::DeepScrub {
        "Deep scrubbing"
    } else {
        "Scrubbing"
    };
    ProgressItem {
        id: format!("{}-{}", kind.name(), w.started_ms),
        kind,
        message: format!("{name} PGs: {} of {} done", w.done, total),
        fraction_ppm,
        eta_secs: None,
        started_ms: w.started_ms,
        finished_ms: None,
    }
}

fn reshard_item(bucket: &str, shards: u32, started_ms: u64) -> ProgressItem {
    ProgressItem {
        id: format!("reshard-{bucket}-{started_ms}"),
        kind: ProgressKind::Reshard,
        message: format!("Resharding bucket '{bucket}' to {shards} shards"),
        fraction_ppm: 0,
        eta_secs: None,
        started_ms,
        finished_ms: None,
    }
}

/// Adds a scrub wave's ETA: its rate so far (PGs done per second since it started).
pub fn with_wave_etas(mut items: Vec<ProgressItem>, now_ms: u64) -> Vec<ProgressItem> {
    for i in items.iter_mut().filter(|i| {
        matches!(i.kind, ProgressKind::Scrub | ProgressKind::DeepScrub) && i.finished_ms.is_none()
    }) {
        let elapsed_ms = now_ms.saturating_sub(i.started_ms) as u128;
        let done = u128::from(i.fraction_ppm.min(1_000_000));
        if done > 0 && elapsed_ms > 0 {
            let left_ms = elapsed_ms * (1_000_000 - done) / done;
            i.eta_secs = Some(left_ms.div_ceil(1000) as u64);
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(now_ms: u64, degraded: u64) -> Observation {
        Observation {
            now_ms,
            degraded,
            ..Observation::default()
        }
    }

    #[test]
    fn recovery_moves_and_finishes() {
        let mut t = ProgressTracker::new(60_000);
        t.observe(&obs(0, 0));
        assert!(t.items().is_empty());
        t.observe(&obs(1000, 100));
        let i = &t.items()[0];
        assert_eq!(i.kind, ProgressKind::Recovery);
        assert_eq!(i.fraction_ppm, 0);
        assert_eq!(i.eta_secs, None);
        t.observe(&obs(3000, 80));
        let i = &t.items()[0];
        assert_eq!(i.fraction_ppm, 200_000);
        // 20 copies in 2 s: 80 left need 8 s
        assert_eq!(i.eta_secs, Some(8));
        t.observe(&obs(5000, 20));
        let i = &t.items()[0];
        assert_eq!(i.fraction_ppm, 800_000);
        // 80 copies in 4 s: 20 left need 1 s
        assert_eq!(i.eta_secs, Some(1));
        // more work appears: the bar goes back, it does not stick at a lie
        t.observe(&obs(6000, 150));
        assert_eq!(t.items()[0].fraction_ppm, 0);
        t.observe(&obs(7000, 0));
        let items = t.items();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].fraction_ppm, 1_000_000);
        assert_eq!(items[0].finished_ms, Some(7000));
        // kept for a while, then dropped
        t.observe(&obs(60_000, 0));
        assert_eq!(t.items().len(), 1);
        t.observe(&obs(70_000, 0));
        assert!(t.items().is_empty());
    }

    #[test]
    fn a_recovery_between_two_looks_is_a_finished_item() {
        let mut t = ProgressTracker::new(60_000);
        let look = |now_ms, degraded, counts: &[(i32, u64)]| Observation {
            now_ms,
            degraded,
            recovered: counts.iter().copied().collect(),
            ..Observation::default()
        };
        // the first look only sets the baseline
        t.observe(&look(1_000, 0, &[(0, 5), (1, 7)]));
        assert!(t.items().is_empty());
        // a look without statistics changes nothing; an OSD new to the looks sets its baseline
        t.observe(&look(2_000, 0, &[]));
        t.observe(&look(3_000, 0, &[(0, 5), (1, 7), (2, 40)]));
        assert!(t.items().is_empty());
        // 4 objects onto osd.0, and osd.1 restarted and recovered 2 since
        t.observe(&look(5_000, 0, &[(0, 9), (1, 2), (2, 40)]));
        let items = t.items();
        assert_eq!(items.len(), 1, "{items:?}");
        let i = &items[0];
        assert_eq!(i.kind, ProgressKind::Recovery);
        assert_eq!((i.started_ms, i.finished_ms), (3_000, Some(5_000)));
        assert_eq!(i.fraction_ppm, 1_000_000);
        assert!(i.message.contains("6 recovered"), "{}", i.message);
        // a recovery the degraded count shows is one item, not two
        t.observe(&look(7_000, 10, &[(0, 9), (1, 2)]));
        t.observe(&look(9_000, 0, &[(0, 19), (1, 2)]));
        let items = t.items();
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(
            items[0].message.contains("10 in all"),
            "{}",
            items[0].message
        );
        // nothing recovered: nothing new
        t.observe(&look(11_000, 0, &[(0, 19), (1, 2)]));
        assert_eq!(t.items().len(), 2);
    }

    #[test]
    fn snapshot_trim_and_pool_deletion_count_down() {
        let mut t = ProgressTracker::new(60_000);
        let look = |now_ms, snaptrim_left, deleting_left| Observation {
            now_ms,
            snaptrim_left,
            deleting_left,
            ..Observation::default()
        };
        t.observe(&look(1_000, 40, 0));
        t.observe(&look(3_000, 20, 100));
        let items = t.items();
        let trim = items
            .iter()
            .find(|i| i.kind == ProgressKind::SnapTrim)
            .unwrap();
        assert_eq!(trim.fraction_ppm, 500_000);
        // 20 clones in 2 s: 20 left take 2 s more
        assert_eq!(trim.eta_secs, Some(2));
        assert!(trim.message.contains("20 of 40"), "{}", trim.message);
        let del = items
            .iter()
            .find(|i| i.kind == ProgressKind::PoolDeletion)
            .unwrap();
        assert_eq!(del.fraction_ppm, 0);
        t.observe(&look(5_000, 0, 0));
        let items = t.items();
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(
            items
                .iter()
                .all(|i| i.finished_ms == Some(5_000) && i.fraction_ppm == 1_000_000)
        );
    }

    #[test]
    fn scrub_wave_counts_pgs_done_of_those_seen() {
        let pg = |s| PgId::new(1, s);
        let mut t = ProgressTracker::new(60_000);
        let mut o = Observation {
            now_ms: 10_000,
            ..Observation::default()
        };
        o.scrubbing.insert(pg(0), true);
        o.scrubbing.insert(pg(1), true);
        t.observe(&o);
        let i = &t.items()[0];
        assert_eq!(i.kind, ProgressKind::DeepScrub);
        assert_eq!(i.fraction_ppm, 0);
        // pg 0 finished (its deep stamp moved), pg 2 started
        o.now_ms = 12_000;
        o.scrubbing.remove(&pg(0));
        o.scrubbing.insert(pg(2), true);
        o.stamps.insert(pg(0), (12, 12));
        t.observe(&o);
        let items = with_wave_etas(t.items(), 12_000);
        assert_eq!(items[0].fraction_ppm, 333_333);
        assert_eq!(items[0].eta_secs, Some(4));
        o.scrubbing.clear();
        o.stamps.insert(pg(1), (13, 13));
        o.stamps.insert(pg(2), (13, 13));
        o.now_ms = 14_000;
        t.observe(&o);
        assert_eq!(t.items()[0].fraction_ppm, 1_000_000);
        assert!(t.items()[0].finished_ms.is_none());
        o.now_ms = 16_000;
        t.observe(&o);
        let i = &t.items()[0];
        assert_eq!(i.finished_ms, Some(16_000));
        assert!(i.message.contains("3 of 3"));
    }
}

//! Peering's decision, as a pure function: given what each acting member of a PG reports (its
//! `last_update`, log tail and log entries), choose the authoritative history and say, for every
//! member, how to get there. No I/O: the OSD gathers the reports and carries out the plan.
//!
//! Rules (Ceph's, simplified to replicated pools):
//! * The authoritative member is the one with the newest `last_update`, compared as
//!   `(epoch, version)`: a write made in a newer epoch supersedes one from an older epoch with the
//!   same version (that older one was never acknowledged, since acks need every acting member).
//!   Ties go to the earliest member in the given order (the primary first).
//! * For each other member, the common point is the newest version at which both logs hold the
//!   same `(epoch, version)` entry (or the member's `last_update` itself, if the authoritative log
//!   has it). Entries the member has after that point are divergent and are undone; entries the
//!   authoritative member has after it are missing. Both are repaired the same way: copy the
//!   object's current state from the authoritative member (or delete it if it does not exist
//!   there), then adopt the authoritative log entries.
//! * If the authoritative log does not reach back to the common point, logs do not overlap and
//!   the member needs a backfill (a full walk of the PG).

use std::collections::{BTreeMap, BTreeSet};

use kelp_proto::ObjectLocator;

use crate::pglog::LogEntry;

/// What one member reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberReport {
    pub osd: i32,
    pub last_update: (u32, u64),
    /// Version just before its oldest log entry.
    pub log_tail: u64,
    /// Its log entries (all of `(log_tail, last_update]`), oldest first.
    pub entries: Vec<LogEntry>,
}

/// What to do for one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberPlan {
    UpToDate,
    /// Copy (or delete) these objects from the authoritative member, then append `entries`
    /// after truncating the member's log to `common_version`.
    Recover {
        common_version: u64,
        objects: BTreeSet<ObjectLocator>,
        entries: Vec<LogEntry>,
    },
    /// The logs do not overlap: walk the whole PG.
    Backfill,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeeringPlan {
    pub authoritative: i32,
    pub last_update: (u32, u64),
    pub members: BTreeMap<i32, MemberPlan>,
}

/// Plans recovery for the given reports (the primary's first). `None` if there are none.
pub fn plan(reports: &[MemberReport]) -> Option<PeeringPlan> {
    plan_with_authority(reports, None)
}

/// Like [`plan`], but with `authority` (when it reported) as the authoritative member even if
/// others are ahead of it: their entries past its history are divergent and undone. Used to
/// roll back writes that a member refused (`Full`): such a write was never acknowledged, and
/// the member that refused it has every earlier write (replicas apply in version order).
pub fn plan_with_authority(
    reports: &[MemberReport],
    authority: Option<i32>,
) -> Option<PeeringPlan> {
    let newest = || {
        reports
            .iter()
            .fold(None::<&MemberReport>, |best, r| match best {
                Some(b) if b.last_update >= r.last_update => Some(b),
                _ => Some(r),
            })
    };
    let auth = match authority.and_then(|a| reports.iter().find(|r| r.osd == a)) {
        Some(r) => r,
        None => newest()?,
    };
    let auth_at: BTreeMap<u64, &LogEntry> = auth.entries.iter().map(|e| (e.version, e)).collect();
    let mut members = BTreeMap::new();
    for r in reports {
        if r.osd == auth.osd || r.last_update == auth.last_update {
            members.insert(r.osd, MemberPlan::UpToDate);
            continue;
        }
        let (lu_epoch, lu_version) = r.last_update;
        // The newest point both histories share.
        let shares = |version: u64, epoch: u32| {
            if version == 0 {
                return true;
            }
            if version == auth.last_update.1 {
                return auth.last_update.0 == epoch;
            }
            auth_at.get(&version).is_some_and(|e| e.epoch == epoch)
        };
        let common = if lu_version <= auth.last_update.1 && shares(lu_version, lu_epoch) {
            Some(lu_version)
        } else {
            r.entries
                .iter()
                .rev()
                .find(|e| shares(e.version, e.epoch))
                .map(|e| e.version)
                .or((r.log_tail <= auth.log_tail).then_some(r.log_tail))
        };
        let plan = match common {
            Some(common) if common >= auth.log_tail => {
                let mut objects: BTreeSet<ObjectLocator> = BTreeSet::new();
                let divergent = r.entries.iter().filter(|e| e.version > common);
                let missing: Vec<LogEntry> = auth
                    .entries
                    .iter()
                    .filter(|e| e.version > common)
                    .cloned()
                    .collect();
                objects.extend(divergent.map(|e| e.object.clone()));
                objects.extend(missing.iter().map(|e| e.object.clone()));
                MemberPlan::Recover {
                    common_version: common,
                    objects,
                    entries: missing,
                }
            }
            _ => MemberPlan::Backfill,
        };
        members.insert(r.osd, plan);
    }
    Some(PeeringPlan {
        authoritative: auth.osd,
        last_update: auth.last_update,
        members,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(n: &str) -> ObjectLocator {
        ObjectLocator {
            pool: 1,
            namespace: String::new(),
            key: None,
            name: n.into(),
        }
    }

    fn entry(epoch: u32, version: u64, o: &str) -> LogEntry {
        LogEntry {
            epoch,
            version,
            object: obj(o),
            reqid: ("c".into(), version),
            deleted: false,
        }
    }

    fn report(osd: i32, entries: Vec<LogEntry>, tail: u64) -> MemberReport {
        let last_update = entries.last().map_or((0, tail), |e| (e.epoch, e.version));
        MemberReport {
            osd,
            last_update,
            log_tail: tail,
            entries,
        }
    }

    fn objs(names: &[&str]) -> BTreeSet<ObjectLocator> {
        names.iter().map(|n| obj(n)).collect()
    }

    #[test]
    fn everyone_equal_needs_nothing() {
        let log = vec![entry(1, 1, "a"), entry(1, 2, "b")];
        let p = plan(&[report(0, log.clone(), 0), report(1, log.clone(), 0)]).unwrap();
        assert_eq!(p.authoritative, 0);
        assert!(p.members.values().all(|m| *m == MemberPlan::UpToDate));
    }

    #[test]
    fn a_member_that_missed_writes_copies_just_those_objects() {
        let full = vec![
            entry(1, 1, "a"),
            entry(1, 2, "b"),
            entry(2, 3, "c"),
            entry(2, 4, "a"),
        ];
        let behind = full[..2].to_vec();
        // the restarted primary is behind: the replica is authoritative
        let p = plan(&[report(0, behind, 0), report(1, full.clone(), 0)]).unwrap();
        assert_eq!(p.authoritative, 1);
        assert_eq!(p.last_update, (2, 4));
        assert_eq!(
            p.members[&0],
            MemberPlan::Recover {
                common_version: 2,
                objects: objs(&["a", "c"]),
                entries: full[2..].to_vec()
            }
        );
        assert_eq!(p.members[&1], MemberPlan::UpToDate);
    }

    #[test]
    fn divergent_writes_from_an_older_epoch_are_undone() {
        // osd.0 applied v3 in epoch 1 as primary but no replica did (never acknowledged);
        // then osd.1 became primary and wrote its own v3, v4 in epoch 2.
        let common = vec![entry(1, 1, "a"), entry(1, 2, "b")];
        let mut old = common.clone();
        old.push(entry(1, 3, "x"));
        let mut new = common.clone();
        new.extend([entry(2, 3, "y"), entry(2, 4, "a")]);
        let p = plan(&[
            report(0, old, 0),
            report(1, new.clone(), 0),
            report(2, new.clone(), 0),
        ])
        .unwrap();
        assert_eq!(p.authoritative, 1);
        assert_eq!(
            p.members[&0],
            MemberPlan::Recover {
                common_version: 2,
                objects: objs(&["a", "x", "y"]),
                entries: new[2..].to_vec()
            }
        );
        assert_eq!(p.members[&2], MemberPlan::UpToDate);
    }

    #[test]
    fn a_newer_epoch_wins_over_a_higher_version_is_impossible_but_epoch_breaks_ties() {
        let a = vec![entry(1, 1, "a"), entry(3, 2, "b")];
        let b = vec![entry(1, 1, "a"), entry(2, 2, "c")];
        let p = plan(&[report(0, b, 0), report(1, a.clone(), 0)]).unwrap();
        assert_eq!(p.authoritative, 1);
        assert_eq!(
            p.members[&0],
            MemberPlan::Recover {
                common_version: 1,
                objects: objs(&["b", "c"]),
                entries: a[1..].to_vec()
            }
        );
    }

    #[test]
    fn logs_that_do_not_overlap_need_backfill() {
        // the authoritative log was trimmed past everything the member has
        let auth: Vec<LogEntry> = (50..=60).map(|v| entry(4, v, "o")).collect();
        let stale = vec![entry(1, 1, "a"), entry(1, 2, "b")];
        let p = plan(&[report(0, auth, 49), report(1, stale, 0)]).unwrap();
        assert_eq!(p.members[&1], MemberPlan::Backfill);
        // an empty new member (never had the PG) also backfills
        let auth: Vec<LogEntry> = (50..=60).map(|v| entry(4, v, "o")).collect();
        let p = plan(&[report(0, auth, 49), report(3, vec![], 0)]).unwrap();
        assert_eq!(p.members[&3], MemberPlan::Backfill);
    }

    #[test]
    fn an_empty_member_catches_up_from_a_complete_log() {
        let auth = vec![entry(1, 1, "a"), entry(1, 2, "b")];
        let p = plan(&[report(0, auth.clone(), 0), report(1, vec![], 0)]).unwrap();
        assert_eq!(
            p.members[&1],
            MemberPlan::Recover {
                common_version: 0,
                objects: objs(&["a", "b"]),
                entries: auth
            }
        );
    }

    #[test]
    fn no_reports_no_plan() {
        assert_eq!(plan(&[]), None);
    }

    #[test]
    fn a_preferred_authority_rolls_back_the_others() {
        let primary = MemberReport {
            osd: 0,
            last_update: (5, 3),
            log_tail: 0,
            entries: vec![entry(5, 1, "a"), entry(5, 2, "b"), entry(5, 3, "c")],
        };
        let refused = MemberReport {
            osd: 1,
            last_update: (5, 2),
            log_tail: 0,
            entries: vec![entry(5, 1, "a"), entry(5, 2, "b")],
        };
        let normal = plan(&[primary.clone(), refused.clone()]).unwrap();
        assert_eq!(normal.authoritative, 0);
        let p = plan_with_authority(&[primary, refused], Some(1)).unwrap();
        assert_eq!(p.authoritative, 1);
        assert_eq!(p.last_update, (5, 2));
        assert_eq!(p.members[&1], MemberPlan::UpToDate);
        assert_eq!(
            p.members[&0],
            MemberPlan::Recover {
                common_version: 2,
                objects: BTreeSet::from([obj("c")]),
                entries: vec![],
            }
        );
    }
}

//! Property: however writes, member crashes and map changes interleave, peering merges the
//! members' PG logs into one history in which no acknowledged write is lost.
//!
//! A model of one PG with three members, each with a real `PgMeta` (the ring of log slots,
//! trimming at a small `osd_max_pg_log_entries` so that long absences end in backfill) over its
//! own in-memory store. A write is applied by the primary first and then by the replicas it
//! reaches; it is acknowledged only when it reached every acting member (as the OSD answers a
//! client). A write that misses a replica makes the PG peer again; the primary may also crash
//! right after it. Crashes, returns and primary changes bump the map epoch and peer. Peering
//! is the OSD's: `peering::plan` over the acting members' reports, then each member adopts
//! the authoritative history with `PgMeta::rewrite`, exactly what a `PgSync` applies.
//!
//! After every peering: the acting members hold one history (same `last_update`, the same
//! entry wherever two logs overlap), every acknowledged write is in it (its version at the
//! same epoch and object, unless trimmed), and each member's log reloads from its store as it
//! is in memory.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::sync::Arc;

use kelp_osd::peering::{MemberPlan, MemberReport, plan};
use kelp_osd::{LogEntry, PgMeta};
use kelp_proto::ObjectLocator;
use kelp_store::{CollectionId, MemStore, ObjectStore, Transaction};
use kelp_types::PgId;
use proptest::prelude::*;

const MAX_ENTRIES: usize = 6;
const MEMBERS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// A client write to object `object`; `reach` says which replicas get it (bit per acting
    /// position after the primary); with `crash_primary`, the primary dies right after an
    /// unacknowledged write.
    Write {
        object: u8,
        reach: u8,
        crash_primary: bool,
    },
    Crash {
        who: u8,
    },
    Revive {
        who: u8,
    },
    /// A map change that makes another acting member primary.
    NewPrimary {
        rotate: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..5, prop_oneof![3 => Just(0xffu8), 1 => any::<u8>()], prop::bool::weighted(0.3))
            .prop_map(|(object, reach, crash_primary)| Op::Write { object, reach, crash_primary }),
        1 => (0u8..3).prop_map(|who| Op::Crash { who }),
        1 => (0u8..3).prop_map(|who| Op::Revive { who }),
        1 => (1u8..3).prop_map(|rotate| Op::NewPrimary { rotate }),
    ]
}

struct Member {
    store: Arc<MemStore>,
    meta: PgMeta,
    alive: bool,
}

fn coll() -> CollectionId {
    CollectionId(PgId::new(1, 0))
}

impl Member {
    fn new() -> Member {
        let store = Arc::new(MemStore::new());
        let mut txn = Transaction::new();
        let meta = PgMeta::create(&mut txn, coll(), MAX_ENTRIES);
        store.submit(txn).unwrap().wait().unwrap();
        Member {
            store,
            meta,
            alive: true,
        }
    }

    fn append(&mut self, e: LogEntry) {
        let mut txn = Transaction::new();
        self.meta.append(&mut txn, e);
        self.store.submit(txn).unwrap().wait().unwrap();
    }

    fn report(&self, osd: i32) -> MemberReport {
        MemberReport {
            osd,
            last_update: self.meta.info.last_update,
            log_tail: self.meta.info.log_tail,
            entries: self.meta.entries(),
        }
    }
}

struct Pg {
    members: Vec<Member>,
    epoch: u32,
    /// Acting members (indexes), the primary first.
    acting: Vec<usize>,
    /// `(epoch, version, object)` of every acknowledged write.
    acked: Vec<(u32, u64, String)>,
}

impl Pg {
    fn new_interval(&mut self) {
        self.epoch += 1;
    }

    /// Peering as the OSD does it; returns the authoritative report.
    fn peer(&mut self) -> Result<(), TestCaseError> {
        let reports: Vec<MemberReport> = self
            .acting
            .iter()
            .map(|&m| self.members[m].report(m as i32))
            .collect();
        let p = plan(&reports).expect("the primary reports");
        let auth = reports
            .iter()
            .find(|r| r.osd == p.authoritative)
            .unwrap()
            .clone();
        for (&osd, member_plan) in &p.members {
            let m = &mut self.members[osd as usize];
            let mut txn = Transaction::new();
            match member_plan {
                MemberPlan::UpToDate => continue,
                MemberPlan::Recover {
                    common_version,
                    entries,
                    ..
                } => m.meta.rewrite(
                    &mut txn,
                    Some(*common_version),
                    entries.clone(),
                    auth.log_tail,
                    p.last_update,
                ),
                MemberPlan::Backfill => m.meta.rewrite(
                    &mut txn,
                    None,
                    auth.entries.clone(),
                    auth.log_tail,
                    p.last_update,
                ),
            }
            m.store.submit(txn).unwrap().wait().unwrap();
        }
        self.check(&auth)
    }

    fn check(&self, auth: &MemberReport) -> Result<(), TestCaseError> {
        // One history among the acting members.
        for &m in &self.acting {
            let meta = &self.members[m].meta;
            prop_assert_eq!(meta.info.last_update, auth.last_update, "osd.{} differs", m);
            for e in meta.entries() {
                if let Some(a) = auth.entries.iter().find(|a| a.version == e.version) {
                    prop_assert_eq!(a, &e, "osd.{} has another entry at {}", m, e.version);
                }
            }
            // The log reloads from the store as it is in memory.
            let mut txn = Transaction::new();
            let loaded = PgMeta::load(&*self.members[m].store, coll(), MAX_ENTRIES, &mut txn)
                .expect("the log loads");
            prop_assert!(txn.is_empty(), "no relayout needed");
            prop_assert_eq!(&loaded.info, &meta.info);
            prop_assert_eq!(loaded.entries(), meta.entries());
        }
        // No acknowledged write lost.
        for (epoch, version, object) in &self.acked {
            prop_assert!(
                auth.last_update.1 >= *version,
                "acknowledged write {}'{} is past the history's end {:?}",
                epoch,
                version,
                auth.last_update
            );
            if *version > auth.log_tail {
                let e = auth.entries.iter().find(|e| e.version == *version);
                prop_assert!(
                    e.is_some_and(|e| e.epoch == *epoch && e.object.name == *object),
                    "acknowledged write {}'{} to {} lost: the history has {:?}",
                    epoch,
                    version,
                    object,
                    e
                );
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Write {
                object,
                reach,
                crash_primary,
            } => {
                let primary = self.acting[0];
                let version = self.members[primary].meta.next_version();
                let name = format!("o{object}");
                let entry = LogEntry {
                    epoch: self.epoch,
                    version,
                    object: ObjectLocator {
                        pool: 1,
                        namespace: String::new(),
                        key: None,
                        name: name.clone(),
                    },
                    reqid: ("client".into(), u64::from(self.epoch) << 32 | version),
                    deleted: false,
                };
                self.members[primary].append(entry.clone());
                let mut everyone = true;
                for (i, &r) in self.acting.iter().enumerate().skip(1) {
                    if reach & (1 << (i - 1)) != 0 {
                        prop_assert_eq!(self.members[r].meta.next_version(), version);
                        self.members[r].append(entry.clone());
                    } else {
                        everyone = false;
                    }
                }
                if everyone {
                    self.acked.push((self.epoch, version, name));
                    return Ok(());
                }
                // Not acknowledged: a replica failed it, and the PG peers again (after the
                // map drops the primary, if it died).
                if crash_primary && self.acting.len() > 1 {
                    self.members[primary].alive = false;
                    self.acting.remove(0);
                    self.new_interval();
                }
                self.peer()
            }
            Op::Crash { who } => {
                let who = who as usize % MEMBERS;
                if !self.members[who].alive || self.acting.len() == 1 {
                    return Ok(());
                }
                self.members[who].alive = false;
                self.acting.retain(|&m| m != who);
                self.new_interval();
                self.peer()
            }
            Op::Revive { who } => {
                let who = who as usize % MEMBERS;
                if self.members[who].alive {
                    return Ok(());
                }
                self.members[who].alive = true;
                self.acting.push(who);
                self.new_interval();
                self.peer()
            }
            Op::NewPrimary { rotate } => {
                let n = self.acting.len();
                self.acting.rotate_left(rotate as usize % n);
                self.new_interval();
                self.peer()
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn peering_merges_logs_into_one_history_without_losing_acknowledged_writes(
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut pg = Pg {
            members: (0..MEMBERS).map(|_| Member::new()).collect(),
            epoch: 1,
            acting: (0..MEMBERS).collect(),
            acked: Vec::new(),
        };
        for op in &ops {
            pg.apply(op)?;
        }
    }
}

//! One peering attempt of a PG as its primary, as a state machine without I/O.
//!
//! `peering::plan` says how every member gets to the authoritative history; this module says
//! everything else peering decides: whom to ask, when a `pg_temp` is better than copying
//! before serving, which members are synced before the PG serves and which are left behind
//! for background recovery (`norecover`/`nobackfill`, `min_size`), what write set the monitors
//! record, and how their verdict ends the attempt (active, `down`, `incomplete`, or a retry).
//!
//! The machine takes events (a member's answer, a finished sync, the monitors' verdict, a
//! newer map) and returns actions (query a member, request a `pg_temp`, sync, record the
//! activation); the OSD (`recovery::try_peer`) performs the actions, one at a time and in
//! order, and feeds their results back, until the machine reaches an [`Outcome`]. That is the
//! shape of raft-rs's `RawNode` and of the monitor's `liveness` module: every corner case of
//! peering can be driven by a unit test in microseconds.
//!
//! Invariants kept:
//! * an acting member that does not answer fails the attempt (it is retried): its history
//!   might be the only copy of acknowledged writes; a backfill target that does not answer is
//!   backfilled later and never holds the PG up; a stray (an OSD of the monitors' record
//!   outside the PG's sets) that does not answer is just not heard;
//! * the PG never serves with fewer than `min_size` members in sync: members are synced first
//!   (unless their recovery is paused by a flag, in which case the attempt fails and waits);
//! * the PG never serves before the monitors recorded its write set (a PG below `min_size`
//!   serves nothing, so it records nothing);
//! * once an outcome is reached, further events change nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kelp_proto::{ActivationVerdict, PgActivation, PgQueryReply, PgRecord, PgSync, SyncLog};
use kelp_types::PgId;

use crate::error::OsdError;
use crate::peering::{MemberPlan, MemberReport, PeeringPlan, plan_with_authority};
use crate::pglog::LogEntry;

/// A primary that misses more objects than this asks for a `pg_temp` instead of copying them
/// before it serves.
pub const PRIMARY_SYNC_MAX_OBJECTS: usize = 32;

/// The cluster flags that pause background recovery (Ceph's `norecover`, `nobackfill`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryFlags {
    pub norecover: bool,
    pub nobackfill: bool,
}

impl RecoveryFlags {
    /// The flags set in `map`.
    pub fn of(map: &kelp_maps::OsdMap) -> RecoveryFlags {
        RecoveryFlags {
            norecover: map.has_flag(kelp_maps::ClusterFlag::NoRecover),
            nobackfill: map.has_flag(kelp_maps::ClusterFlag::NoBackfill),
        }
    }

    /// Whether `job` may not run while these flags are set.
    pub fn pauses(&self, job: &Job) -> bool {
        match job {
            Job::Recover { .. } => self.norecover,
            Job::Backfill => self.nobackfill,
        }
    }
}

/// What a member left behind needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Log recovery: copy `objects`, then keep the log through `keep_through` and append
    /// `entries`, which reach `base`.
    Recover {
        keep_through: u64,
        objects: Vec<(String, String)>,
        entries: Vec<LogEntry>,
        log_tail: u64,
        base: (u32, u64),
    },
    /// A full walk of the PG.
    Backfill,
}

/// A member left behind at activation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lagging {
    pub osd: i32,
    pub job: Job,
    /// In the acting set (its missing copies are degraded), not just a backfill target.
    pub in_acting: bool,
    /// Erasure-coded pools: a member in step with the PG's history whose objects are another
    /// position's shard (its position changed): backfilled to its new shard, and meanwhile
    /// read from for the shard it holds (each object says which shard it is).
    pub donor: bool,
}

/// Why a PG cannot go active, as Ceph names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeeringBlocked {
    /// Every OSD with the PG's latest acknowledged writes is down.
    Down,
    /// The OSDs that should have the PG's latest writes answered without them (their copy
    /// was lost, e.g. a recreated store).
    Incomplete,
}

/// Everything a peering attempt starts from.
#[derive(Debug, Clone)]
pub struct PeeringStart {
    pub pg: PgId,
    pub epoch: u32,
    /// This OSD, the acting primary.
    pub me: i32,
    pub acting: Vec<i32>,
    pub up: Vec<i32>,
    /// OSDs outside the PG's sets that the monitors' record says hold its history.
    pub strays: Vec<i32>,
    /// Take this member's history as authoritative (rolling back writes it refused).
    pub authority: Option<i32>,
    /// The pool's `min_size`.
    pub min_size: usize,
    /// Members that must share a history for it to be readable: 1 for a replicated pool,
    /// `k` for an erasure-coded one (each member holds one shard; an object needs `k`).
    pub min_agree: usize,
    pub flags: RecoveryFlags,
    /// OSDs up in the map.
    pub up_osds: BTreeSet<i32>,
    /// Whether this OSD can ask the monitors for a `pg_temp` (false in tests without them).
    pub can_request_pg_temp: bool,
    /// Objects a sync copies at once (`osd_recovery_max_active`).
    pub parallel: u32,
    /// This primary's own log.
    pub primary: MemberReport,
    /// Erasure-coded pools: the shard position each acting member (and each backfill target
    /// outside the acting set) is to hold; empty for replicated pools.
    pub ec_positions: BTreeMap<i32, u32>,
    /// Erasure-coded pools: the shard position this primary's objects were written for, as
    /// its PG records it (`None`: not recorded).
    pub primary_ec_shard: Option<u32>,
}

/// What the OSD must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask a member for its log (left out if it is at `have`); answer with
    /// [`Event::Queried`].
    Query { osd: i32, have: (u32, u64) },
    /// Ask a member for its whole object listing; answer with [`Event::Listed`].
    List { osd: i32 },
    /// Ask the monitors for a `pg_temp` naming `osds` (`why`, for the log); answer with
    /// [`Event::PgTempRequested`] once it is on its way.
    RequestPgTemp { osds: Vec<i32>, why: &'static str },
    /// Apply this sync to this primary's own copy; answer with [`Event::PrimarySynced`].
    SyncPrimary(PgSync),
    /// Bring a member all the way to this primary's history now, before serving (for a
    /// backfill, from a snapshot of the primary's log and listing); answer with
    /// [`Event::MemberSynced`].
    SyncMember { osd: i32, job: Job },
    /// Ask the monitors to record the write set; answer with [`Event::Verdict`].
    RecordActivation(PgActivation),
}

/// What happened.
#[derive(Debug)]
pub enum Event {
    Queried {
        osd: i32,
        result: Result<PgQueryReply, OsdError>,
    },
    Listed {
        osd: i32,
        result: Result<Vec<(String, String)>, OsdError>,
    },
    /// The primary's own sync finished; these objects were unfound (no readable copy).
    PrimarySynced(Result<Vec<(String, String)>, OsdError>),
    MemberSynced {
        osd: i32,
        result: Result<(), OsdError>,
    },
    /// The `pg_temp` request left (or the monitor link is gone).
    PgTempRequested(Result<(), OsdError>),
    Verdict(Result<ActivationVerdict, OsdError>),
    /// The OSD's map moved to `epoch`.
    NewMap {
        epoch: u32,
    },
}

/// How the attempt ended.
#[derive(Debug)]
pub enum Outcome {
    /// Ready to serve; these members are left behind for background recovery.
    Active {
        recovered: usize,
        lagging: Vec<Lagging>,
    },
    /// This primary needs a backfill and asked the monitors for a `pg_temp`; the map that
    /// brings it makes another member primary.
    AwaitingPgTemp,
    /// The monitors' record names members this peering did not hear from with their history:
    /// ask `probe` (up, not yet asked), or wait (`blocked`: none of them is up, or those that
    /// answered lost their copy).
    Blocked {
        probe: Vec<i32>,
        blocked: Option<PeeringBlocked>,
        record: PgRecord,
    },
    /// A newer map arrived: its own peering takes over.
    Superseded,
    /// The attempt failed; try again (`OsdError::retryable` says whether it is worth it
    /// soon).
    Failed(OsdError),
}

#[derive(Debug)]
enum Phase {
    /// Waiting for the answers of these members.
    Querying {
        waiting: BTreeSet<i32>,
    },
    /// Waiting for the authoritative member's listing (this primary needs a backfill).
    Listing,
    /// Waiting for this primary's own sync.
    SyncingPrimary,
    /// Waiting for these members' syncs (too few would be in sync otherwise).
    SyncingMembers {
        waiting: BTreeSet<i32>,
    },
    /// Waiting for the `pg_temp` request to leave.
    RequestingPgTemp,
    /// Waiting for the monitors' verdict.
    Recording,
    Done,
}

/// One peering attempt (see the module docs).
#[derive(Debug)]
pub struct PeeringMachine {
    start: PeeringStart,
    phase: Phase,
    /// Reports heard, the primary's first, then in the order queries were issued.
    reports: Vec<MemberReport>,
    /// The order reports are kept in (the order the queries were issued).
    order: Vec<i32>,
    answered: BTreeMap<i32, MemberReport>,
    /// Strays that answered (their logs count, they get nothing).
    stray_reports: Vec<i32>,
    /// Backfill targets that did not answer.
    unanswered: Vec<i32>,
    plan: Option<PeeringPlan>,
    recovered: usize,
    lagging: Vec<Lagging>,
    outcome: Option<Outcome>,
    /// Erasure-coded pools: the shard position each member that answered records.
    ec_shards: BTreeMap<i32, u32>,
    /// Members in step whose shard position changed (see [`Lagging::donor`]).
    donors: BTreeSet<i32>,
    /// Members whose recorded shard position is not the one they are to hold.
    moved: BTreeSet<i32>,
}

impl PeeringMachine {
    /// Starts an attempt; returns the machine and its first actions (the queries).
    pub fn new(start: PeeringStart) -> (PeeringMachine, Vec<Action>) {
        let me = start.me;
        let have = start.primary.last_update;
        let mut order = Vec::new();
        for &osd in start.acting.iter().filter(|&&o| o != me) {
            push_once(&mut order, osd);
        }
        for &osd in start
            .up
            .iter()
            .filter(|&&o| o != me && !start.acting.contains(&o))
        {
            push_once(&mut order, osd);
        }
        for &osd in &start.strays {
            if osd == me
                || start.acting.contains(&osd)
                || start.up.contains(&osd)
                || !start.up_osds.contains(&osd)
            {
                continue;
            }
            push_once(&mut order, osd);
        }
        let actions = order
            .iter()
            .map(|&osd| Action::Query { osd, have })
            .collect();
        let mut m = PeeringMachine {
            reports: vec![start.primary.clone()],
            phase: Phase::Querying {
                waiting: order.iter().copied().collect(),
            },
            order,
            start,
            answered: BTreeMap::new(),
            stray_reports: Vec::new(),
            unanswered: Vec::new(),
            plan: None,
            recovered: 0,
            lagging: Vec::new(),
            outcome: None,
            ec_shards: Default::default(),
            donors: Default::default(),
            moved: Default::default(),
        };
        if let Some(shard) = m.start.primary_ec_shard {
            m.ec_shards.insert(me, shard);
        }
        let more = m.advance();
        let mut all: Vec<Action> = actions;
        all.extend(more);
        (m, all)
    }

    /// Erasure-coded pools: the members found holding another position's shard (backfilled).
    pub fn moved(&self) -> &BTreeSet<i32> {
        &self.moved
    }

    /// The outcome, once reached.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Takes the outcome, once reached.
    pub fn into_outcome(self) -> Option<Outcome> {
        self.outcome
    }

    /// Feeds one event; returns the actions it leads to.
    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        if self.outcome.is_some() {
            return Vec::new();
        }
        let pg = self.start.pg;
        match (event, &mut self.phase) {
            (Event::NewMap { epoch }, _) => {
                if epoch != self.start.epoch {
                    return self.finish(Outcome::Superseded);
                }
                Vec::new()
            }
            (Event::Queried { osd, result }, Phase::Querying { waiting }) => {
                if !waiting.remove(&osd) {
                    return Vec::new();
                }
                let role = self.role(osd);
                match result {
                    Ok(r) => {
                        if let Some(shard) = r.ec_shard {
                            self.ec_shards.insert(osd, shard);
                        }
                        let report = member_report(osd, r, &self.start.primary);
                        if role == Role::Stray {
                            self.stray_reports.push(osd);
                        }
                        self.answered.insert(osd, report);
                    }
                    Err(e) => match role {
                        Role::Acting => return self.finish(Outcome::Failed(e)),
                        Role::BackfillTarget => self.unanswered.push(osd),
                        Role::Stray => {}
                    },
                }
                self.advance()
            }
            (Event::Listed { result, .. }, Phase::Listing) => match result {
                Ok(listing) => {
                    let source = self.primary_source();
                    let (auth, plan) = self.auth_and_plan();
                    let sync = PgSync {
                        pg,
                        epoch: self.start.epoch,
                        source,
                        objects: listing.clone(),
                        keep_only: Some(listing),
                        parallel: self.start.parallel,
                        log: Some(SyncLog {
                            keep_through: None,
                            entries: auth.entries.iter().cloned().map(Into::into).collect(),
                            log_tail: auth.log_tail,
                            last_update: plan.last_update,
                        }),
                    };
                    self.phase = Phase::SyncingPrimary;
                    vec![Action::SyncPrimary(sync)]
                }
                Err(e) => self.finish(Outcome::Failed(e)),
            },
            (Event::PrimarySynced(result), Phase::SyncingPrimary) => match result {
                Ok(unfound) => {
                    self.recovered += 1;
                    if unfound.is_empty() {
                        self.after_primary()
                    } else {
                        self.primary_unfound(unfound)
                    }
                }
                Err(e) => self.finish(Outcome::Failed(e)),
            },
            (Event::MemberSynced { osd, result }, Phase::SyncingMembers { waiting }) => {
                if !waiting.remove(&osd) {
                    return Vec::new();
                }
                if let Err(e) = result {
                    return self.finish(Outcome::Failed(e));
                }
                self.recovered += 1;
                if waiting.is_empty() {
                    self.record()
                } else {
                    Vec::new()
                }
            }
            (Event::PgTempRequested(result), Phase::RequestingPgTemp) => match result {
                Ok(()) => self.finish(Outcome::AwaitingPgTemp),
                Err(e) => self.finish(Outcome::Failed(e)),
            },
            (Event::Verdict(result), Phase::Recording) => match result {
                Ok(verdict) => self.verdict(verdict),
                Err(e) => self.finish(Outcome::Failed(e)),
            },
            // An answer this phase does not wait for (a duplicate, or a late one): ignored.
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, outcome: Outcome) -> Vec<Action> {
        self.phase = Phase::Done;
        self.outcome = Some(outcome);
        Vec::new()
    }

    fn role(&self, osd: i32) -> Role {
        if self.start.acting.contains(&osd) {
            Role::Acting
        } else if self.start.up.contains(&osd) {
            Role::BackfillTarget
        } else {
            Role::Stray
        }
    }

    fn auth_and_plan(&self) -> (&MemberReport, &PeeringPlan) {
        let plan = self.plan.as_ref().expect("planned");
        let auth = self
            .reports
            .iter()
            .find(|r| r.osd == plan.authoritative)
            .expect("the authoritative member reported");
        (auth, plan)
    }

    /// Whom this primary copies from when it is behind: the authoritative member, unless that
    /// is this primary itself (an erasure-coded primary moved to another shard position, with
    /// the newest history): then another member in step, which rebuilds the shard from the
    /// others.
    fn primary_source(&self) -> i32 {
        let (auth, plan) = self.auth_and_plan();
        if auth.osd != self.start.me {
            return auth.osd;
        }
        self.order
            .iter()
            .copied()
            .filter(|o| self.start.acting.contains(o))
            .find(|o| plan.members.get(o) == Some(&MemberPlan::UpToDate) || self.donors.contains(o))
            .unwrap_or(auth.osd)
    }

    /// Moves on once every query is answered.
    fn advance(&mut self) -> Vec<Action> {
        let Phase::Querying { waiting } = &self.phase else {
            return Vec::new();
        };
        if !waiting.is_empty() {
            return Vec::new();
        }
        for osd in &self.order {
            if let Some(r) = self.answered.remove(osd) {
                self.reports.push(r);
            }
        }
        let authority = self
            .start
            .authority
            .or_else(|| readable_authority(&self.reports, self.start.min_agree));
        let Some(mut plan) = plan_with_authority(&self.reports, authority) else {
            return self.finish(Outcome::Active {
                recovered: 0,
                lagging: Vec::new(),
            });
        };
        (self.moved, self.donors) =
            moved_shards(&mut plan, &self.start.ec_positions, &self.ec_shards);
        self.plan = Some(plan);
        self.primary_first()
    }

    /// This primary first: it serves every read, so it must be complete. If it misses more
    /// than a few objects, the members that have the data serve the PG meanwhile (a
    /// `pg_temp`) and this OSD is recovered in the background like any other member.
    fn primary_first(&mut self) -> Vec<Action> {
        let s = &self.start;
        let me = s.me;
        let (auth, plan) = self.auth_and_plan();
        let big = match plan.members.get(&me) {
            Some(MemberPlan::Backfill) => true,
            Some(MemberPlan::Recover { objects, .. }) => objects.len() > PRIMARY_SYNC_MAX_OBJECTS,
            _ => false,
        };
        if big && s.can_request_pg_temp {
            let temp: Vec<i32> = std::iter::once(auth.osd)
                .chain(s.acting.iter().copied().filter(|&o| {
                    o != auth.osd
                        && o != me
                        && !matches!(plan.members.get(&o), Some(MemberPlan::Backfill))
                }))
                .collect();
            if temp.len() >= s.min_size && temp.as_slice() != s.acting {
                self.phase = Phase::RequestingPgTemp;
                return vec![Action::RequestPgTemp {
                    osds: temp,
                    why: "behind its members",
                }];
            }
        }
        match plan.members.get(&me) {
            Some(MemberPlan::Backfill) => {
                let osd = auth.osd;
                self.phase = Phase::Listing;
                vec![Action::List { osd }]
            }
            Some(MemberPlan::Recover {
                common_version,
                objects,
                entries,
            }) => {
                let sync = PgSync {
                    pg: s.pg,
                    epoch: s.epoch,
                    source: auth.osd,
                    objects: names(objects.iter().cloned()),
                    keep_only: None,
                    parallel: s.parallel,
                    log: Some(SyncLog {
                        keep_through: Some(*common_version),
                        entries: entries.iter().cloned().map(Into::into).collect(),
                        log_tail: auth.log_tail,
                        last_update: plan.last_update,
                    }),
                };
                self.phase = Phase::SyncingPrimary;
                vec![Action::SyncPrimary(sync)]
            }
            _ => self.after_primary(),
        }
    }

    /// Objects no member in sync can deliver readable: this primary cannot complete its copy.
    /// The authoritative member serves the PG meanwhile (reads of those objects fail with a
    /// checksum error there, never with other data) and this OSD is recovered in the
    /// background, which reports them as unfound.
    fn primary_unfound(&mut self, unfound: Vec<(String, String)>) -> Vec<Action> {
        let s = &self.start;
        let (auth, _) = self.auth_and_plan();
        let temp: Vec<i32> = std::iter::once(auth.osd)
            .chain(
                s.acting
                    .iter()
                    .copied()
                    .filter(|&o| o != auth.osd && o != s.me),
            )
            .collect();
        if s.can_request_pg_temp && temp.len() >= s.min_size && temp.as_slice() != s.acting {
            self.phase = Phase::RequestingPgTemp;
            vec![Action::RequestPgTemp {
                osds: temp,
                why: "objects unfound while bringing the primary up to date",
            }]
        } else {
            self.finish(Outcome::Failed(OsdError::Unfound { objects: unfound }))
        }
    }

    /// The others: in sync, or left behind for background recovery — unless fewer than
    /// `min_size` acting members would be in sync, in which case they are synced now.
    fn after_primary(&mut self) -> Vec<Action> {
        let s = &self.start;
        let me = s.me;
        let (auth, plan) = self.auth_and_plan();
        let in_sync = s
            .acting
            .iter()
            .filter(|&&o| o == me || plan.members.get(&o) == Some(&MemberPlan::UpToDate))
            .count();
        let sync_now = in_sync < s.min_size;
        let mut lagging = Vec::new();
        let mut syncs = Vec::new();
        for (&osd, member) in &plan.members {
            let job = match member {
                _ if osd == me => continue,
                _ if self.stray_reports.contains(&osd) => continue,
                MemberPlan::UpToDate => continue,
                MemberPlan::Recover {
                    common_version,
                    objects,
                    entries,
                } => Job::Recover {
                    keep_through: *common_version,
                    objects: names(objects.iter().cloned()),
                    entries: entries.clone(),
                    log_tail: auth.log_tail,
                    base: plan.last_update,
                },
                MemberPlan::Backfill => Job::Backfill,
            };
            let in_acting = s.acting.contains(&osd);
            if sync_now && in_acting && !s.flags.pauses(&job) {
                syncs.push(Action::SyncMember { osd, job });
                continue;
            }
            lagging.push(Lagging {
                osd,
                job,
                in_acting,
                donor: self.donors.contains(&osd),
            });
        }
        lagging.extend(self.unanswered.iter().map(|&osd| Lagging {
            osd,
            job: Job::Backfill,
            in_acting: false,
            donor: false,
        }));
        self.lagging = lagging;
        if syncs.is_empty() {
            return self.record();
        }
        self.phase = Phase::SyncingMembers {
            waiting: syncs
                .iter()
                .map(|a| match a {
                    Action::SyncMember { osd, .. } => *osd,
                    _ => unreachable!("only member syncs here"),
                })
                .collect(),
        };
        syncs
    }

    /// Before serving, the monitors record who has every acknowledged write from now on.
    fn record(&mut self) -> Vec<Action> {
        let s = &self.start;
        let acting = s.acting.len();
        // A PG with fewer acting members than min_size goes active as `peered`: it serves no
        // I/O (client ops are refused with `Inactive` and retried), but it is reported as Ceph
        // does (`undersized+degraded+peered`), not as forever `peering`.
        let behind = self.lagging.iter().filter(|l| l.in_acting).count();
        if acting >= s.min_size && acting - behind < s.min_size {
            return self.finish(Outcome::Failed(OsdError::BelowMinSize {
                pg: s.pg,
                in_sync: acting - behind,
                acting,
                min_size: s.min_size,
            }));
        }
        // A PG below min_size serves nothing, so it neither needs nor changes a record.
        if acting < s.min_size {
            return self.activate();
        }
        let left: Vec<i32> = self.lagging.iter().map(|l| l.osd).collect();
        let members: Vec<i32> = std::iter::once(s.me)
            .chain(write_targets(s.me, &s.acting, &s.up, &left))
            .collect();
        let plan = self.plan.as_ref().expect("planned");
        let activation = PgActivation {
            pg: s.pg,
            primary: s.me,
            record: PgRecord {
                epoch: s.epoch,
                members,
                last_update: plan.last_update,
            },
            heard: self
                .reports
                .iter()
                .map(|r| (r.osd, r.last_update))
                .collect(),
        };
        self.phase = Phase::Recording;
        vec![Action::RecordActivation(activation)]
    }

    fn verdict(&mut self, verdict: ActivationVerdict) -> Vec<Action> {
        let s = &self.start;
        match verdict {
            ActivationVerdict::Recorded => self.activate(),
            ActivationVerdict::Blocked { current } => {
                let heard: Vec<i32> = self.reports.iter().map(|r| r.osd).collect();
                let probe: Vec<i32> = current
                    .members
                    .iter()
                    .copied()
                    .filter(|&o| {
                        s.up_osds.contains(&o) && !heard.contains(&o) && !s.strays.contains(&o)
                    })
                    .collect();
                // Up members already asked (strays) that did not answer with a copy count as
                // answered: the PG is incomplete, not down (it keeps retrying).
                let any_up = current.members.iter().any(|o| s.up_osds.contains(o));
                let blocked = if !probe.is_empty() {
                    None
                } else if any_up {
                    Some(PeeringBlocked::Incomplete)
                } else {
                    Some(PeeringBlocked::Down)
                };
                self.finish(Outcome::Blocked {
                    probe,
                    blocked,
                    record: current,
                })
            }
            ActivationVerdict::Stale { current } => {
                let (pg, epoch) = (s.pg, s.epoch);
                self.finish(Outcome::Failed(OsdError::StaleEpoch {
                    pg,
                    epoch,
                    current: current.epoch,
                    what: "the monitors hold a newer activation than this peering's",
                }))
            }
            ActivationVerdict::NoSuchPg => {
                let pg = s.pg;
                self.finish(Outcome::Failed(OsdError::NoSuchPg { pg }))
            }
        }
    }

    fn activate(&mut self) -> Vec<Action> {
        let outcome = Outcome::Active {
            recovered: self.recovered,
            lagging: std::mem::take(&mut self.lagging),
        };
        self.finish(outcome)
    }
}

/// Erasure-coded PGs: the newest history that `min_agree` (`k`) members reached, so that every
/// object in it can be read. Members ahead of it hold writes that fewer than `k` shards have:
/// never acknowledged (an acknowledgement needs every member of a write set of at least
/// `min_size >= k`), and not decodable; they are rolled back, their shards rebuilt from the
/// others. `None` for replicated PGs (the newest history wins) or when fewer members reported
/// (the monitors' record check then decides whether the PG may go active at all).
pub fn readable_authority(reports: &[MemberReport], min_agree: usize) -> Option<i32> {
    if min_agree <= 1 || reports.len() < min_agree {
        return None;
    }
    let mut by_newest: Vec<&MemberReport> = reports.iter().collect();
    // Stable: among equals the earlier report (the primary first) stays first.
    by_newest.sort_by_key(|r| std::cmp::Reverse(r.last_update));
    let line = by_newest[min_agree - 1].last_update;
    reports
        .iter()
        .find(|r| r.last_update == line)
        .map(|r| r.osd)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Acting,
    BackfillTarget,
    Stray,
}

fn push_once(v: &mut Vec<i32>, osd: i32) {
    if !v.contains(&osd) {
        v.push(osd);
    }
}

/// A member's answer as a report. A member at this primary's `last_update` that sent no
/// entries shares its history: its entries are this primary's (within the member's own log
/// tail).
pub fn member_report(osd: i32, r: PgQueryReply, primary: &MemberReport) -> MemberReport {
    MemberReport {
        osd,
        last_update: r.last_update,
        log_tail: r.log_tail,
        entries: if r.last_update == primary.last_update && r.entries.is_empty() {
            primary
                .entries
                .iter()
                .filter(|e| e.version > r.log_tail)
                .cloned()
                .collect()
        } else {
            r.entries.into_iter().map(Into::into).collect()
        },
    }
}

/// Erasure-coded pools: members whose recorded shard position is not the one they are to
/// hold now (CRUSH moved a survivor to another position; or a backfill to a position was
/// interrupted) hold the wrong shard for their position, however complete their history:
/// they are backfilled. Returns them, and those of them that were otherwise in step (their
/// objects are whole shards of another position, readable for that shard until rewritten).
fn moved_shards(
    plan: &mut PeeringPlan,
    positions: &BTreeMap<i32, u32>,
    recorded: &BTreeMap<i32, u32>,
) -> (BTreeSet<i32>, BTreeSet<i32>) {
    let (mut moved, mut donors) = (BTreeSet::new(), BTreeSet::new());
    for (osd, member) in plan.members.iter_mut() {
        let (Some(want), Some(held)) = (positions.get(osd), recorded.get(osd)) else {
            continue;
        };
        if want == held {
            continue;
        }
        if *member == MemberPlan::UpToDate && *held != EC_SHARD_MIXED {
            donors.insert(*osd);
        }
        moved.insert(*osd);
        *member = MemberPlan::Backfill;
    }
    (moved, donors)
}

/// The shard-position record of an erasure-coded member whose backfill is under way: its
/// objects are of more than one position, it matches none.
pub const EC_SHARD_MIXED: u32 = u32::MAX;

/// The distinct `(namespace, name)` of `objects`, sorted.
pub fn names(
    objects: impl IntoIterator<Item = kelp_proto::ObjectLocator>,
) -> Vec<(String, String)> {
    let set: BTreeSet<(String, String)> =
        objects.into_iter().map(|o| (o.namespace, o.name)).collect();
    set.into_iter().collect()
}

/// The members besides the primary `me` that get a PG's writes once it is activated for
/// `acting` and `up` with `left_behind` not in sync (each once, in set order).
pub fn write_targets(me: i32, acting: &[i32], up: &[i32], left_behind: &[i32]) -> Vec<i32> {
    let mut to: Vec<i32> = Vec::new();
    for &o in acting.iter().chain(up) {
        if o != me && !left_behind.contains(&o) && !to.contains(&o) {
            to.push(o);
        }
    }
    to
}

/// Splits the members left behind into those whose recovery may run now and those paused by
/// `norecover`/`nobackfill`.
pub fn split_paused(lagging: Vec<Lagging>, flags: RecoveryFlags) -> (Vec<Lagging>, Vec<Lagging>) {
    lagging.into_iter().partition(|l| !flags.pauses(&l.job))
}

/// Runs a machine to its outcome with `perform` answering every action at once (tests, and
/// anything else that can answer synchronously). Actions are performed in the order they
/// were issued, as the OSD does.
pub fn run_to_outcome(
    start: PeeringStart,
    mut perform: impl FnMut(&Action) -> Option<Event>,
) -> Outcome {
    let pg = start.pg;
    let (mut m, first) = PeeringMachine::new(start);
    let mut queue: VecDeque<Action> = first.into();
    while let Some(action) = queue.pop_front() {
        if m.outcome().is_some() {
            break;
        }
        if let Some(ev) = perform(&action) {
            queue.extend(m.handle(ev));
        }
    }
    m.into_outcome().unwrap_or_else(|| {
        Outcome::Failed(OsdError::PgBusy {
            pg,
            reason: "peering stalled: an action was not answered".into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_proto::ObjectLocator;

    fn obj(n: &str) -> ObjectLocator {
        ObjectLocator {
            pool: 1,
            namespace: String::new(),
            key: None,
            name: n.into(),
        }
    }

    /// A log of writes `(epoch, version, object)` after `tail`.
    fn log(osd: i32, tail: u64, writes: &[(u32, u64, &str)]) -> MemberReport {
        let entries: Vec<LogEntry> = writes
            .iter()
            .map(|&(epoch, version, o)| LogEntry {
                epoch,
                version,
                object: obj(o),
                reqid: ("client".into(), version),
                deleted: false,
            })
            .collect();
        MemberReport {
            osd,
            last_update: entries.last().map_or((0, tail), |e| (e.epoch, e.version)),
            log_tail: tail,
            entries,
        }
    }

    fn writes(n: u64) -> Vec<(u32, u64, String)> {
        (1..=n).map(|v| (1, v, format!("o{v}"))).collect()
    }

    fn log_n(osd: i32, tail: u64, w: &[(u32, u64, String)]) -> MemberReport {
        let w: Vec<(u32, u64, &str)> = w.iter().map(|(e, v, o)| (*e, *v, o.as_str())).collect();
        log(osd, tail, &w)
    }

    fn reply(r: &MemberReport) -> PgQueryReply {
        PgQueryReply {
            error: None,
            last_update: r.last_update,
            log_tail: r.log_tail,
            entries: r.entries.iter().cloned().map(Into::into).collect(),
            objects: None,
            ec_shard: None,
        }
    }

    fn pg() -> PgId {
        PgId::new(1, 0)
    }

    fn start(primary: MemberReport, acting: &[i32], up: &[i32]) -> PeeringStart {
        PeeringStart {
            pg: pg(),
            epoch: 10,
            me: primary.osd,
            acting: acting.to_vec(),
            up: up.to_vec(),
            strays: Vec::new(),
            authority: None,
            min_agree: 1,
            min_size: 2,
            flags: RecoveryFlags::default(),
            up_osds: acting.iter().chain(up).copied().collect(),
            can_request_pg_temp: true,
            parallel: 4,
            primary,
            ec_positions: BTreeMap::new(),
            primary_ec_shard: None,
        }
    }

    /// A cluster that answers every action at once; records what was asked.
    struct Fake {
        members: BTreeMap<i32, MemberReport>,
        listing: Vec<(String, String)>,
        primary_unfound: Vec<(String, String)>,
        verdict: ActivationVerdict,
        done: Vec<Action>,
        /// Erasure-coded pools: the shard position each member's PG records.
        ec_shards: BTreeMap<i32, u32>,
    }

    impl Fake {
        fn new(members: &[MemberReport]) -> Fake {
            Fake {
                members: members.iter().map(|r| (r.osd, r.clone())).collect(),
                listing: vec![(String::new(), "o1".into())],
                primary_unfound: Vec::new(),
                verdict: ActivationVerdict::Recorded,
                done: Vec::new(),
                ec_shards: BTreeMap::new(),
            }
        }

        fn answer(&mut self, a: &Action) -> Option<Event> {
            self.done.push(a.clone());
            Some(match a {
                Action::Query { osd, .. } => Event::Queried {
                    osd: *osd,
                    result: self
                        .members
                        .get(osd)
                        .map(|r| PgQueryReply {
                            ec_shard: self.ec_shards.get(osd).copied(),
                            ..reply(r)
                        })
                        .ok_or(OsdError::PeerUnreachable {
                            osd: *osd,
                            reason: "down".into(),
                        }),
                },
                Action::List { osd } => Event::Listed {
                    osd: *osd,
                    result: Ok(self.listing.clone()),
                },
                Action::RequestPgTemp { .. } => Event::PgTempRequested(Ok(())),
                Action::SyncPrimary(_) => Event::PrimarySynced(Ok(self.primary_unfound.clone())),
                Action::SyncMember { osd, .. } => Event::MemberSynced {
                    osd: *osd,
                    result: Ok(()),
                },
                Action::RecordActivation(_) => Event::Verdict(Ok(self.verdict.clone())),
            })
        }

        fn run(&mut self, s: PeeringStart) -> Outcome {
            run_to_outcome(s, |a| self.answer(a))
        }

        fn recorded(&self) -> Option<&PgActivation> {
            self.done.iter().find_map(|a| match a {
                Action::RecordActivation(x) => Some(x),
                _ => None,
            })
        }
    }

    fn active(o: Outcome) -> (usize, Vec<Lagging>) {
        match o {
            Outcome::Active { recovered, lagging } => (recovered, lagging),
            other => panic!("expected active, got {other:?}"),
        }
    }

    #[test]
    fn an_erasure_coded_pg_takes_the_newest_history_k_members_reached() {
        let w = [(1, 5, "a"), (1, 6, "b"), (1, 7, "c")];
        let reports = vec![
            log(1, 0, &w),
            log(2, 0, &w),
            log(3, 0, &w[..2]),
            log(4, 0, &w[..2]),
            log(5, 0, &w[..2]),
            log(6, 0, &w[..1]),
        ];
        // k = 4: only version 6 is on four shards; the primary (at 7) rolls back.
        assert_eq!(readable_authority(&reports, 4), Some(3));
        let plan = plan_with_authority(&reports, readable_authority(&reports, 4)).unwrap();
        assert_eq!(plan.last_update, (1, 6));
        match &plan.members[&1] {
            MemberPlan::Recover { objects, .. } => assert!(objects.contains(&obj("c"))),
            other => panic!("the primary's divergent write is undone: {other:?}"),
        }
        // k = 2: version 7 is on two shards, readable.
        assert_eq!(readable_authority(&reports, 2), Some(1));
        // Replicated (or too few reports): the newest history wins, as before.
        assert_eq!(readable_authority(&reports, 1), None);
        assert_eq!(readable_authority(&reports[..3], 4), None);
    }

    #[test]
    fn ec_members_moved_to_another_position_are_backfilled_and_read_meanwhile() {
        let w = writes(5);
        let reports: Vec<MemberReport> = (1..=6).map(|o| log_n(o, 0, &w)).collect();
        let mut s = start(reports[0].clone(), &[1, 2, 3, 4, 5, 6], &[1, 2, 3, 4, 5, 6]);
        s.min_agree = 2;
        s.min_size = 3;
        s.ec_positions = (1..=6).map(|o| (o, (o - 1) as u32)).collect();
        s.primary_ec_shard = Some(0);
        let mut f = Fake::new(&reports[1..]);
        // osd.2 and osd.4 swapped positions; osd.5's backfill was cut short; osd.6 has no
        // record (a PG from before records were kept): trusted at its position.
        f.ec_shards = [(2, 3), (3, 2), (4, 1), (5, EC_SHARD_MIXED)].into();
        let (_, mut lagging) = active(f.run(s.clone()));
        lagging.sort_by_key(|l| l.osd);
        let got: Vec<(i32, &Job, bool)> =
            lagging.iter().map(|l| (l.osd, &l.job, l.donor)).collect();
        assert_eq!(
            got,
            vec![
                (2, &Job::Backfill, true),
                (4, &Job::Backfill, true),
                (5, &Job::Backfill, false),
            ]
        );
        let rec = f.recorded().expect("recorded");
        assert_eq!(rec.record.members, vec![1, 3, 6]);
        // Too few would be in sync to serve: they are backfilled first.
        s.min_size = 4;
        let mut f2 = Fake::new(&reports[1..]);
        f2.ec_shards = f.ec_shards.clone();
        let (_, lagging) = active(f2.run(s));
        assert!(lagging.is_empty());
        let synced: Vec<i32> = f2
            .done
            .iter()
            .filter_map(|a| match a {
                Action::SyncMember {
                    osd,
                    job: Job::Backfill,
                } => Some(*osd),
                _ => None,
            })
            .collect();
        assert_eq!(synced, vec![2, 4, 5]);
    }

    #[test]
    fn an_ec_primary_moved_to_another_position_rebuilds_its_shard_from_another_member() {
        let w = writes(5);
        let reports: Vec<MemberReport> = (1..=6).map(|o| log_n(o, 0, &w)).collect();
        let mut s = start(reports[0].clone(), &[1, 2, 3, 4, 5, 6], &[1, 2, 3, 4, 5, 6]);
        s.min_agree = 4;
        s.min_size = 4;
        s.ec_positions = (1..=6).map(|o| (o, (o - 1) as u32)).collect();
        s.primary_ec_shard = Some(2);
        s.can_request_pg_temp = false; // never for erasure-coded pools
        let mut f = Fake::new(&reports[1..]);
        f.ec_shards = [(3, 0)].into();
        let (_, lagging) = active(f.run(s));
        // Never from itself: its copy is locked while it syncs.
        let source = f.done.iter().find_map(|a| match a {
            Action::SyncPrimary(sync) => Some(sync.source),
            _ => None,
        });
        assert_eq!(source, Some(2));
        assert_eq!(
            lagging.iter().map(|l| (l.osd, l.donor)).collect::<Vec<_>>(),
            vec![(3, true)]
        );
    }

    #[test]
    fn members_in_sync_activate_with_everyone_in_the_write_set() {
        let w = writes(5);
        let (a, b, c) = (log_n(1, 0, &w), log_n(2, 0, &w), log_n(3, 0, &w));
        let mut f = Fake::new(&[b, c]);
        let (recovered, lagging) = active(f.run(start(a, &[1, 2, 3], &[1, 2, 3])));
        assert_eq!((recovered, lagging.len()), (0, 0));
        let rec = f.recorded().expect("the write set is recorded");
        assert_eq!(rec.record.members, vec![1, 2, 3]);
        assert_eq!(rec.record.last_update, (1, 5));
        assert_eq!(rec.heard.len(), 3);
    }

    #[test]
    fn a_member_that_missed_writes_is_left_behind_for_log_recovery() {
        let w = writes(5);
        let a = log_n(1, 0, &w);
        let b = log_n(2, 0, &w);
        let c = log_n(3, 0, &w[..3]);
        let mut f = Fake::new(&[b, c]);
        let (recovered, lagging) = active(f.run(start(a, &[1, 2, 3], &[1, 2, 3])));
        assert_eq!(
            recovered, 0,
            "min_size is met without it: nothing synced first"
        );
        assert_eq!(lagging.len(), 1);
        assert_eq!(lagging[0].osd, 3);
        assert!(lagging[0].in_acting);
        match &lagging[0].job {
            Job::Recover {
                keep_through,
                objects,
                base,
                ..
            } => {
                assert_eq!(*keep_through, 3);
                assert_eq!(
                    objects,
                    &vec![(String::new(), "o4".into()), (String::new(), "o5".into())]
                );
                assert_eq!(*base, (1, 5));
            }
            j => panic!("expected log recovery, got {j:?}"),
        }
        // The write set the monitors record leaves it out.
        assert_eq!(f.recorded().unwrap().record.members, vec![1, 2]);
    }

    #[test]
    fn an_acting_member_down_mid_peering_fails_the_attempt_before_anything_is_recorded() {
        let w = writes(3);
        let a = log_n(1, 0, &w);
        let c = log_n(3, 0, &w);
        let mut f = Fake::new(&[c]); // osd.2 does not answer
        match f.run(start(a, &[1, 2, 3], &[1, 2, 3])) {
            Outcome::Failed(e) => {
                assert_eq!(e.peer(), Some(2));
                assert!(e.retryable(), "a member that may come back: retry");
            }
            o => panic!("expected a failed attempt, got {o:?}"),
        }
        assert!(f.recorded().is_none());
        // Its answer, arriving late, changes nothing.
        let (mut m, _) = PeeringMachine::new(start(log_n(1, 0, &w), &[1, 2], &[1, 2]));
        m.handle(Event::Queried {
            osd: 2,
            result: Err(OsdError::PeerUnreachable {
                osd: 2,
                reason: "down".into(),
            }),
        });
        assert!(matches!(m.outcome(), Some(Outcome::Failed(_))));
        let more = m.handle(Event::Queried {
            osd: 2,
            result: Ok(reply(&log_n(2, 0, &w))),
        });
        assert!(more.is_empty());
        assert!(matches!(m.outcome(), Some(Outcome::Failed(_))));
    }

    #[test]
    fn a_backfill_target_that_does_not_answer_never_holds_the_pg_up() {
        let w = writes(3);
        let a = log_n(1, 0, &w);
        let b = log_n(2, 0, &w);
        let mut f = Fake::new(&[b]); // osd.4 (up, not acting) is silent
        let (_, lagging) = active(f.run(start(a, &[1, 2], &[1, 2, 4])));
        assert_eq!(
            lagging,
            vec![Lagging {
                osd: 4,
                job: Job::Backfill,
                in_acting: false,
                donor: false,
            }]
        );
    }

    #[test]
    fn logs_that_do_not_overlap_mean_backfill() {
        let w = writes(10);
        let a = log_n(1, 6, &w[6..]); // trimmed through 6
        let b = log_n(2, 6, &w[6..]);
        let c = log_n(3, 0, &w[..2]); // stopped at 2
        let mut f = Fake::new(&[b, c]);
        let (_, lagging) = active(f.run(start(a, &[1, 2, 3], &[1, 2, 3])));
        assert_eq!(lagging.len(), 1);
        assert_eq!(lagging[0].osd, 3);
        assert_eq!(lagging[0].job, Job::Backfill);
    }

    #[test]
    fn below_min_size_in_sync_members_are_synced_before_serving() {
        let w = writes(5);
        let a = log_n(1, 0, &w);
        let b = log_n(2, 0, &w[..2]);
        let c = log_n(3, 0, &w[..1]);
        let mut f = Fake::new(&[b, c]);
        let (recovered, lagging) = active(f.run(start(a, &[1, 2, 3], &[1, 2, 3])));
        assert_eq!(recovered, 2);
        assert!(lagging.is_empty());
        let synced: Vec<i32> = f
            .done
            .iter()
            .filter_map(|a| match a {
                Action::SyncMember { osd, .. } => Some(*osd),
                _ => None,
            })
            .collect();
        assert_eq!(synced, vec![2, 3]);
        // Synced before the record, which then names everyone.
        assert_eq!(f.recorded().unwrap().record.members, vec![1, 2, 3]);
    }

    #[test]
    fn norecover_leaves_members_behind_but_never_below_min_size() {
        let w = writes(5);
        let mut s = start(log_n(1, 0, &w), &[1, 2, 3], &[1, 2, 3]);
        s.flags.norecover = true;
        // min_size met by the primary and osd.2: osd.3 is left behind, paused.
        let mut f = Fake::new(&[log_n(2, 0, &w), log_n(3, 0, &w[..3])]);
        let (_, lagging) = active(f.run(s.clone()));
        let (run, paused) = split_paused(lagging, s.flags);
        assert!(run.is_empty());
        assert_eq!(paused.iter().map(|l| l.osd).collect::<Vec<_>>(), vec![3]);
        // Only the primary in sync: the paused members may not be synced, so the PG waits.
        let mut f = Fake::new(&[log_n(2, 0, &w[..3]), log_n(3, 0, &w[..3])]);
        match f.run(s.clone()) {
            Outcome::Failed(OsdError::BelowMinSize {
                in_sync, min_size, ..
            }) => assert_eq!((in_sync, min_size), (1, 2)),
            o => panic!("expected to wait below min_size, got {o:?}"),
        }
        assert!(f.recorded().is_none());
        // nobackfill does not pause log recovery: the members are synced first.
        s.flags = RecoveryFlags {
            norecover: false,
            nobackfill: true,
        };
        let (recovered, _) = active(f.run(s));
        assert_eq!(recovered, 2);
    }

    #[test]
    fn a_newer_map_supersedes_the_attempt() {
        let w = writes(2);
        let (mut m, first) = PeeringMachine::new(start(log_n(1, 0, &w), &[1, 2], &[1, 2]));
        assert_eq!(
            first,
            vec![Action::Query {
                osd: 2,
                have: (1, 2)
            }]
        );
        assert!(m.handle(Event::NewMap { epoch: 10 }).is_empty());
        assert!(m.outcome().is_none(), "the same epoch changes nothing");
        m.handle(Event::NewMap { epoch: 11 });
        assert!(matches!(m.outcome(), Some(Outcome::Superseded)));
        let more = m.handle(Event::Queried {
            osd: 2,
            result: Ok(reply(&log_n(2, 0, &w))),
        });
        assert!(more.is_empty());
        assert!(matches!(m.outcome(), Some(Outcome::Superseded)));
    }

    #[test]
    fn a_primary_a_little_behind_catches_up_from_the_authoritative_member_first() {
        let w = writes(5);
        let a = log_n(1, 0, &w[..3]);
        let b = log_n(2, 0, &w);
        let mut f = Fake::new(&[b]);
        let (recovered, lagging) = active(f.run(start(a, &[1, 2], &[1, 2])));
        assert_eq!(recovered, 1);
        assert!(lagging.is_empty());
        let sync = f
            .done
            .iter()
            .find_map(|a| match a {
                Action::SyncPrimary(s) => Some(s.clone()),
                _ => None,
            })
            .expect("the primary syncs itself");
        assert_eq!(sync.source, 2);
        assert_eq!(sync.objects.len(), 2);
        assert_eq!(sync.log.unwrap().keep_through, Some(3));
        assert_eq!(f.recorded().unwrap().record.last_update, (1, 5));
    }

    #[test]
    fn a_primary_far_behind_asks_for_a_pg_temp_instead() {
        let w = writes(PRIMARY_SYNC_MAX_OBJECTS as u64 + 10);
        let a = log_n(1, 0, &w[..5]);
        let b = log_n(2, 0, &w);
        let c = log_n(3, 0, &w);
        let mut f = Fake::new(&[b.clone(), c.clone()]);
        assert!(matches!(
            f.run(start(a.clone(), &[1, 2, 3], &[1, 2, 3])),
            Outcome::AwaitingPgTemp
        ));
        let temp = f.done.iter().find_map(|a| match a {
            Action::RequestPgTemp { osds, .. } => Some(osds.clone()),
            _ => None,
        });
        assert_eq!(temp, Some(vec![2, 3]));
        assert!(f.recorded().is_none());
        // Without monitors to ask, it copies everything itself.
        let mut s = start(a, &[1, 2, 3], &[1, 2, 3]);
        s.can_request_pg_temp = false;
        let mut f = Fake::new(&[b, c]);
        let (recovered, _) = active(f.run(s));
        assert_eq!(recovered, 1);
    }

    #[test]
    fn a_primary_without_overlap_backfills_itself_from_a_listing() {
        let w = writes(10);
        let mut s = start(log_n(1, 0, &w[..2]), &[1, 2], &[1, 2]);
        s.can_request_pg_temp = false;
        let mut f = Fake::new(&[log_n(2, 6, &w[6..])]);
        active(f.run(s));
        assert!(f.done.contains(&Action::List { osd: 2 }));
        let sync = f
            .done
            .iter()
            .find_map(|a| match a {
                Action::SyncPrimary(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(sync.keep_only, Some(f.listing.clone()));
        assert_eq!(sync.log.unwrap().keep_through, None);
    }

    #[test]
    fn unfound_objects_on_the_primary_hand_the_pg_to_the_authoritative_member() {
        let w = writes(5);
        let a = log_n(1, 0, &w[..3]);
        let b = log_n(2, 0, &w);
        let c = log_n(3, 0, &w);
        let mut f = Fake::new(&[b.clone(), c.clone()]);
        f.primary_unfound = vec![(String::new(), "o5".into())];
        assert!(matches!(
            f.run(start(a.clone(), &[1, 2, 3], &[1, 2, 3])),
            Outcome::AwaitingPgTemp
        ));
        // No monitors: the attempt fails with the unfound objects named.
        let mut s = start(a, &[1, 2, 3], &[1, 2, 3]);
        s.can_request_pg_temp = false;
        let mut f = Fake::new(&[b, c]);
        f.primary_unfound = vec![(String::new(), "o5".into())];
        match f.run(s) {
            Outcome::Failed(OsdError::Unfound { objects }) => assert_eq!(objects.len(), 1),
            o => panic!("expected unfound, got {o:?}"),
        }
    }

    #[test]
    fn a_replica_ahead_of_the_primary_holds_the_authoritative_log() {
        // The primary missed writes 4..5 (it was down); osd.3 has them.
        let w = writes(5);
        let a = log_n(1, 0, &w[..3]);
        let b = log_n(2, 0, &w[..3]);
        let c = log_n(3, 0, &w);
        let mut f = Fake::new(&[b, c]);
        let (recovered, lagging) = active(f.run(start(a, &[1, 2, 3], &[1, 2, 3])));
        assert_eq!(recovered, 1, "the primary synced itself from osd.3");
        assert_eq!(lagging.iter().map(|l| l.osd).collect::<Vec<_>>(), vec![2]);
        let rec = f.recorded().unwrap();
        assert_eq!(rec.record.last_update, (1, 5));
        assert_eq!(rec.record.members, vec![1, 3]);
    }

    fn blocked_run(up_osds: &[i32], strays: &[i32], record: &[i32]) -> Outcome {
        let w = writes(2);
        let mut s = start(log_n(1, 0, &w), &[1, 2], &[1, 2]);
        s.up_osds = up_osds.iter().copied().collect();
        s.strays = strays.to_vec();
        let mut f = Fake::new(&[log_n(2, 0, &w)]);
        f.verdict = ActivationVerdict::Blocked {
            current: PgRecord {
                epoch: 5,
                members: record.to_vec(),
                last_update: (1, 9),
            },
        };
        f.run(s)
    }

    #[test]
    fn the_monitors_verdict_blocks_down_or_incomplete_or_asks_to_probe() {
        // The record's members are all down: down.
        match blocked_run(&[1, 2], &[], &[7, 8]) {
            Outcome::Blocked { probe, blocked, .. } => {
                assert!(probe.is_empty());
                assert_eq!(blocked, Some(PeeringBlocked::Down));
            }
            o => panic!("{o:?}"),
        }
        // One is up and not yet asked: probe it.
        match blocked_run(&[1, 2, 7], &[], &[7, 8]) {
            Outcome::Blocked { probe, blocked, .. } => {
                assert_eq!(probe, vec![7]);
                assert_eq!(blocked, None);
            }
            o => panic!("{o:?}"),
        }
        // It was asked (a stray) and had nothing: incomplete.
        match blocked_run(&[1, 2, 7], &[7], &[7, 8]) {
            Outcome::Blocked { probe, blocked, .. } => {
                assert!(probe.is_empty());
                assert_eq!(blocked, Some(PeeringBlocked::Incomplete));
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn stale_and_missing_pg_verdicts_fail_the_attempt() {
        let w = writes(1);
        let mut f = Fake::new(&[log_n(2, 0, &w)]);
        f.verdict = ActivationVerdict::Stale {
            current: PgRecord {
                epoch: 12,
                members: vec![1],
                last_update: (1, 1),
            },
        };
        match f.run(start(log_n(1, 0, &w), &[1, 2], &[1, 2])) {
            Outcome::Failed(OsdError::StaleEpoch { epoch, current, .. }) => {
                assert_eq!((epoch, current), (10, 12))
            }
            o => panic!("{o:?}"),
        }
        f.verdict = ActivationVerdict::NoSuchPg;
        match f.run(start(log_n(1, 0, &w), &[1, 2], &[1, 2])) {
            Outcome::Failed(e @ OsdError::NoSuchPg { .. }) => assert!(e.is_fatal()),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn a_pg_below_min_size_goes_peered_without_a_record() {
        let w = writes(2);
        let mut f = Fake::new(&[]);
        let (recovered, lagging) = active(f.run(start(log_n(1, 0, &w), &[1], &[1])));
        assert_eq!((recovered, lagging.len()), (0, 0));
        assert!(f.recorded().is_none());
    }

    #[test]
    fn a_stray_lends_its_history_but_gets_nothing() {
        // osd.7 (outside the sets, named by the monitors' record) has the newest writes.
        let w = writes(5);
        let mut s = start(log_n(1, 0, &w[..3]), &[1, 2], &[1, 2]);
        s.strays = vec![7];
        s.up_osds.insert(7);
        s.min_size = 1;
        let mut f = Fake::new(&[log_n(2, 0, &w[..3]), log_n(7, 0, &w)]);
        let (recovered, lagging) = active(f.run(s));
        assert_eq!(recovered, 1, "the primary caught up from the stray");
        assert_eq!(lagging.iter().map(|l| l.osd).collect::<Vec<_>>(), vec![2]);
        let rec = f.recorded().unwrap();
        assert_eq!(rec.record.members, vec![1]);
        assert!(rec.heard.iter().any(|(o, _)| *o == 7));
    }

    #[test]
    fn a_stray_that_is_down_is_not_asked() {
        let w = writes(2);
        let mut s = start(log_n(1, 0, &w), &[1, 2], &[1, 2]);
        s.strays = vec![7];
        let (_, first) = PeeringMachine::new(s);
        assert_eq!(
            first,
            vec![Action::Query {
                osd: 2,
                have: (1, 2)
            }]
        );
    }
}

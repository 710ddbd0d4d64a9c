//! Property: peering converges. Fed the same member reports in any order, the peering state
//! machine reaches the same verdict and asks for the same work (the same pg_temp, syncs and
//! write set), whatever the members' histories, reachability, flags and `min_size`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;

use kelp_osd::LogEntry;
use kelp_osd::OsdError;
use kelp_osd::peering::MemberReport;
use kelp_osd::peering_machine::{
    Action, Event, Outcome, PeeringMachine, PeeringStart, RecoveryFlags,
};
use kelp_proto::{ActivationVerdict, ObjectLocator, PgQueryReply};
use kelp_types::PgId;
use proptest::prelude::*;

/// One member: how much of the history it has, how much of its log it kept, whether it
/// answers.
#[derive(Debug, Clone)]
struct Member {
    has: usize,
    kept: usize,
    answers: bool,
}

fn history(n: usize) -> Vec<LogEntry> {
    (1..=n as u64)
        .map(|v| LogEntry {
            epoch: 1 + (v / 7) as u32,
            version: v,
            object: ObjectLocator {
                pool: 1,
                namespace: String::new(),
                key: None,
                name: format!("o{}", v % 40),
            },
            reqid: ("c".into(), v),
            deleted: false,
        })
        .collect()
}

fn report(osd: i32, h: &[LogEntry], m: &Member) -> MemberReport {
    let has = m.has.min(h.len());
    let kept = m.kept.min(has);
    let entries = h[has - kept..has].to_vec();
    MemberReport {
        osd,
        last_update: h[..has].last().map_or((0, 0), |e| (e.epoch, e.version)),
        log_tail: (has - kept) as u64,
        entries,
    }
}

fn member() -> impl Strategy<Value = Member> {
    (0usize..80, 1usize..60, prop::bool::weighted(0.8)).prop_map(|(has, kept, answers)| Member {
        has,
        kept,
        answers,
    })
}

/// What the attempt ended in and what it asked for besides queries (order-independent).
fn verdict(outcome: &Outcome, work: &[Action]) -> String {
    let o = match outcome {
        Outcome::Failed(e) => format!("failed: {}", kind(e)),
        other => format!("{other:?}"),
    };
    format!("{o} after {work:?}")
}

fn kind(e: &OsdError) -> &'static str {
    match e {
        OsdError::PeerUnreachable { .. } => "unreachable",
        OsdError::BelowMinSize { .. } => "below min_size",
        OsdError::Unfound { .. } => "unfound",
        _ => "other",
    }
}

fn answer(a: &Action, reports: &[(MemberReport, bool)]) -> Event {
    match a {
        Action::Query { osd, .. } => {
            let (r, answers) = reports.iter().find(|(r, _)| r.osd == *osd).unwrap();
            Event::Queried {
                osd: *osd,
                result: if *answers {
                    Ok(PgQueryReply {
                        error: None,
                        last_update: r.last_update,
                        log_tail: r.log_tail,
                        entries: r.entries.iter().cloned().map(Into::into).collect(),
                        objects: None,
                        ec_shard: None,
                    })
                } else {
                    Err(OsdError::PeerUnreachable {
                        osd: *osd,
                        reason: "down".into(),
                    })
                },
            }
        }
        Action::List { osd } => Event::Listed {
            osd: *osd,
            result: Ok(vec![(String::new(), "o1".into())]),
        },
        Action::RequestPgTemp { .. } => Event::PgTempRequested(Ok(())),
        Action::SyncPrimary(_) => Event::PrimarySynced(Ok(Vec::new())),
        Action::SyncMember { osd, .. } => Event::MemberSynced {
            osd: *osd,
            result: Ok(()),
        },
        Action::RecordActivation(_) => Event::Verdict(Ok(ActivationVerdict::Recorded)),
    }
}

/// Runs the attempt, answering the first round of queries in `order` (a permutation).
fn run(start: PeeringStart, reports: &[(MemberReport, bool)], order: &[usize]) -> String {
    let (mut m, first) = PeeringMachine::new(start);
    let (queries, mut rest): (Vec<Action>, Vec<Action>) = first
        .into_iter()
        .partition(|a| matches!(a, Action::Query { .. }));
    let mut work = Vec::new();
    for &i in order {
        if let Some(q) = queries.get(i) {
            rest.extend(m.handle(answer(q, reports)));
        }
    }
    let mut queue: std::collections::VecDeque<Action> = rest.into();
    while let Some(a) = queue.pop_front() {
        if m.outcome().is_some() {
            break;
        }
        work.push(a.clone());
        queue.extend(m.handle(answer(&a, reports)));
    }
    let outcome = m.into_outcome().expect("every query answered: an outcome");
    verdict(&outcome, &work)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_same_reports_in_any_order_give_the_same_verdict(
        primary in member(),
        others in proptest::collection::vec(member(), 1..4),
        backfill_target in proptest::option::of(member()),
        min_size in 1usize..4,
        norecover in any::<bool>(),
        nobackfill in any::<bool>(),
        mon in any::<bool>(),
        order in Just((0..8).collect::<Vec<usize>>()).prop_shuffle(),
    ) {
        let h = history(80);
        let me = 0;
        let acting: Vec<i32> = (0..=others.len() as i32).collect();
        let mut up = acting.clone();
        let mut reports = vec![(report(me, &h, &primary), true)];
        for (i, m) in others.iter().enumerate() {
            reports.push((report(i as i32 + 1, &h, m), m.answers));
        }
        if let Some(t) = &backfill_target {
            up.push(9);
            reports.push((report(9, &h, t), t.answers));
        }
        let start = PeeringStart {
            pg: PgId::new(1, 0),
            epoch: 20,
            me,
            acting: acting.clone(),
            up,
            strays: Vec::new(),
            authority: None,
            min_agree: 1,
            min_size,
            flags: RecoveryFlags { norecover, nobackfill },
            up_osds: (0..10).collect::<BTreeSet<i32>>(),
            can_request_pg_temp: mon,
            parallel: 4,
            primary: reports[0].0.clone(),
            ec_positions: Default::default(),
            primary_ec_shard: None,
        };
        let in_order: Vec<usize> = (0..8).collect();
        let a = run(start.clone(), &reports, &in_order);
        let b = run(start, &reports, &order);
        prop_assert_eq!(a, b);
    }
}

//! Pure decisions on the client-op path: whether an op may be served (admission), and what a
//! primary does when replicas fail a write (failure classification). No I/O, no locks: the
//! service gathers the facts (map, PG state, store usage) and acts on the answer.
//!
//! Admission, in order: the cluster or this OSD is full (writes only); the pool exists; the
//! object belongs to the pool and to the PG the client named; this OSD is the acting primary
//! at its epoch; the acting set has at least `min_size` members; the PG is open here, peered
//! for exactly that acting set, and (writes) no replica that missed a write is still acting.
//! A refusal is typed ([`Refusal`]) and carries the protocol code the client acts on
//! (`Misdirected`: refresh the map and resend; `Inactive`: retry; `Full`, `NoSuchPool`,
//! `Invalid`: give up).

use kelp_proto::ErrorCode;
use kelp_types::PgId;

/// Why a client op is not served now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{why}")]
    Full { why: String },
    #[error("pool {pool} does not exist")]
    NoSuchPool { pool: kelp_types::PoolId },
    #[error("the object's pool differs from the PG's")]
    WrongPool,
    #[error("object '{object}' belongs to PG {expected}, not {pg}")]
    WrongPg {
        object: String,
        expected: PgId,
        pg: PgId,
    },
    #[error("{reason}")]
    BadMapping { reason: String },
    #[error("osd.{osd} is not the primary of PG {pg} at epoch {epoch} (osd.{primary} is)")]
    NotPrimary {
        osd: i32,
        pg: PgId,
        epoch: u32,
        primary: i32,
    },
    #[error("PG {pg} has {acting} of {size} replicas up, fewer than min_size {min_size}")]
    BelowMinSize {
        pg: PgId,
        acting: usize,
        size: u32,
        min_size: u32,
    },
    #[error("PG {pg} is not open here yet")]
    NotOpen { pg: PgId },
    #[error("PG {pg} is peering")]
    Peering { pg: PgId },
    #[error(
        "PG {pg} is degraded: replicas {failed:?} missed a write and are still acting; waiting \
         for them to be marked down or recovered"
    )]
    Degraded { pg: PgId, failed: Vec<i32> },
}

impl Refusal {
    /// The protocol code the client gets.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Full { .. } => ErrorCode::Full,
            Refusal::NoSuchPool { .. } => ErrorCode::NoSuchPool,
            Refusal::WrongPool | Refusal::WrongPg { .. } | Refusal::BadMapping { .. } => {
                ErrorCode::Invalid
            }
            Refusal::NotPrimary { .. } | Refusal::NotOpen { .. } => ErrorCode::Misdirected,
            Refusal::BelowMinSize { .. } | Refusal::Peering { .. } | Refusal::Degraded { .. } => {
                ErrorCode::Inactive
            }
        }
    }

    /// Whether the client should retry (after refreshing its map for `Misdirected`).
    pub fn retryable(&self) -> bool {
        matches!(self.code(), ErrorCode::Misdirected | ErrorCode::Inactive)
    }
}

/// What admission needs to know about the op's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolFacts {
    pub id: u32,
    pub size: u32,
    pub min_size: u32,
}

/// What admission needs to know about an op and the map it meets.
#[derive(Debug, Clone)]
pub struct OpFacts<'a> {
    pub me: i32,
    pub epoch: u32,
    /// The PG the client sent the op to.
    pub pg: PgId,
    /// `None` if the pool does not exist.
    pub pool: Option<PoolFacts>,
    pub object_pool: u32,
    pub object_name: &'a str,
    /// The PG the object maps to in the op's pool.
    pub object_pg: Option<PgId>,
    /// The PG's acting primary and acting set, or why they could not be computed.
    pub mapping: Mapping<'a>,
}

/// The PG's mapping as admission sees it.
#[derive(Debug, Clone)]
pub enum Mapping<'a> {
    Mapped {
        primary: i32,
        acting: &'a [i32],
    },
    /// The map cannot place the PG (its reason).
    Unmappable(String),
}

/// Whether the map lets this OSD serve the op (as the PG's acting primary, with `min_size`
/// members acting).
pub fn admit_placement(f: &OpFacts<'_>) -> Result<(), Refusal> {
    let Some(pool) = f.pool else {
        return Err(Refusal::NoSuchPool { pool: f.pg.pool });
    };
    if f.object_pool != pool.id {
        return Err(Refusal::WrongPool);
    }
    if let Some(expected) = f.object_pg
        && expected != f.pg
    {
        return Err(Refusal::WrongPg {
            object: f.object_name.to_string(),
            expected,
            pg: f.pg,
        });
    }
    let (primary, acting) = match &f.mapping {
        Mapping::Mapped { primary, acting } => (*primary, *acting),
        Mapping::Unmappable(reason) => {
            return Err(Refusal::BadMapping {
                reason: reason.clone(),
            });
        }
    };
    if primary != f.me {
        return Err(Refusal::NotPrimary {
            osd: f.me,
            pg: f.pg,
            epoch: f.epoch,
            primary,
        });
    }
    if (acting.len() as u32) < pool.min_size {
        return Err(Refusal::BelowMinSize {
            pg: f.pg,
            acting: acting.len(),
            size: pool.size,
            min_size: pool.min_size,
        });
    }
    Ok(())
}

/// Whether the PG's state lets it serve an op now: peered for exactly `acting`, and for a
/// write, no replica that missed a write still acting (`failed_replicas`, already narrowed
/// to the acting set).
pub fn admit_to_pg(
    pg: PgId,
    acting: &[i32],
    active: Option<&[i32]>,
    is_write: bool,
    failed_replicas: &[i32],
) -> Result<(), Refusal> {
    if active != Some(acting) {
        return Err(Refusal::Peering { pg });
    }
    if is_write && !failed_replicas.is_empty() {
        return Err(Refusal::Degraded {
            pg,
            failed: failed_replicas.to_vec(),
        });
    }
    Ok(())
}

/// The failsafe ratio (Ceph's `osd_failsafe_full_ratio`), millionths: even a write flagged
/// `FullTry` is refused on a store this full (or past the full ratio, if that is higher).
pub const FAILSAFE_FULL_RATIO_PPM: u32 = 970_000;

/// The full-ratio failsafe: why a write must be refused, if it must. `writes` is false for ops
/// that only read or remove (they always pass); `full_try`: the op may write past the full
/// flag and the full ratio, up to the failsafe ratio (`OpKind::FullTry`); `used_ppm` is this
/// OSD's store usage, if known.
pub fn refuse_full(
    osd: i32,
    writes: bool,
    map_full: bool,
    full_try: bool,
    used_ppm: Option<u32>,
    full_ratio_ppm: u32,
) -> Option<Refusal> {
    if !writes {
        return None;
    }
    if full_try {
        let failsafe = FAILSAFE_FULL_RATIO_PPM.max(full_ratio_ppm);
        let used = used_ppm?;
        return (used >= failsafe).then(|| Refusal::Full {
            why: format!(
                "osd.{osd} is {:.1}% used, at or past the failsafe ratio {:.1}%",
                f64::from(used) / 10_000.0,
                f64::from(failsafe) / 10_000.0
            ),
        });
    }
    if map_full {
        return Some(Refusal::Full {
            why: "an OSD is at or past mon_osd_full_ratio (the OSD map's full flag is set); \
                  writes resume once space is freed"
                .to_string(),
        });
    }
    let used = used_ppm?;
    (used >= full_ratio_ppm).then(|| Refusal::Full {
        why: format!(
            "osd.{osd} is {:.1}% used, at or past the full ratio {:.1}%",
            f64::from(used) / 10_000.0,
            f64::from(full_ratio_ppm) / 10_000.0
        ),
    })
}

/// How replicas failed a write the primary applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaFailures {
    /// Every failing replica refused the write for lack of space (and applied nothing): the
    /// op fails with `Full`, and the PG rolls the write back on every member by peering with
    /// `authority`'s history (a refusing replica) as the authoritative one. Treating them as
    /// failed replicas would block the PG until a map change.
    AllFull { authority: i32 },
    /// These replicas missed the write: they leave the write set and the PG refuses writes
    /// while any of them is still acting (an ack would claim a write is on every replica).
    Missed { osds: Vec<i32> },
}

/// Classifies the failures `(osd, the code it answered with, if it answered)` of one write
/// (at least one).
pub fn classify_replica_failures(failures: &[(i32, Option<ErrorCode>)]) -> ReplicaFailures {
    let full: Vec<i32> = failures
        .iter()
        .filter(|(_, code)| *code == Some(ErrorCode::Full))
        .map(|(osd, _)| *osd)
        .collect();
    if !full.is_empty() && full.len() == failures.len() {
        return ReplicaFailures::AllFull { authority: full[0] };
    }
    let mut osds = Vec::new();
    for (osd, _) in failures {
        if !osds.contains(osd) {
            osds.push(*osd);
        }
    }
    ReplicaFailures::Missed { osds }
}

/// Whether a primary whose replicas `failed` a write at `epoch` should peer again now rather
/// than refuse writes until the next map: the current map (at `current_epoch`, in which this
/// OSD is `primary`-or-not of `acting`/`up`) still has one of them in the PG, and the PG is
/// active for this interval. Peering brings it back to the authoritative history, or waits
/// for the map to drop it.
pub fn repeer_after_failures(
    me: i32,
    epoch: u32,
    current_epoch: u32,
    current: Option<(i32, &[i32], &[i32])>,
    failed: &[i32],
    active: bool,
) -> bool {
    let still = current.is_some_and(|(primary, acting, up)| {
        primary == me && failed.iter().any(|o| acting.contains(o) || up.contains(o))
    });
    still && active && current_epoch == epoch
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(acting: &'a [i32], primary: i32) -> OpFacts<'a> {
        OpFacts {
            me: 1,
            epoch: 7,
            pg: PgId::new(2, 5),
            pool: Some(PoolFacts {
                id: 2,
                size: 3,
                min_size: 2,
            }),
            object_pool: 2,
            object_name: "obj",
            object_pg: Some(PgId::new(2, 5)),
            mapping: Mapping::Mapped { primary, acting },
        }
    }

    #[test]
    fn admission_refuses_with_the_code_the_client_acts_on() {
        assert_eq!(admit_placement(&facts(&[1, 2, 3], 1)), Ok(()));
        let e = admit_placement(&facts(&[2, 1, 3], 2)).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Misdirected);
        assert!(e.retryable());
        assert_eq!(
            e.to_string(),
            "osd.1 is not the primary of PG 2.5 at epoch 7 (osd.2 is)"
        );
        let e = admit_placement(&facts(&[1], 1)).unwrap_err();
        assert!(matches!(e, Refusal::BelowMinSize { acting: 1, .. }));
        assert_eq!(e.code(), ErrorCode::Inactive);
        let mut f = facts(&[1, 2], 1);
        f.pool = None;
        assert_eq!(
            admit_placement(&f).unwrap_err().code(),
            ErrorCode::NoSuchPool
        );
        let mut f = facts(&[1, 2], 1);
        f.object_pg = Some(PgId::new(2, 6));
        let e = admit_placement(&f).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Invalid);
        assert!(!e.retryable());
        let mut f = facts(&[1, 2], 1);
        f.mapping = Mapping::Unmappable("no such PG".into());
        assert_eq!(admit_placement(&f).unwrap_err().code(), ErrorCode::Invalid);
    }

    #[test]
    fn a_pg_serves_only_when_peered_for_the_acting_set_and_writes_only_without_failed_replicas() {
        let pg = PgId::new(1, 0);
        assert_eq!(admit_to_pg(pg, &[1, 2], Some(&[1, 2]), true, &[]), Ok(()));
        assert_eq!(
            admit_to_pg(pg, &[1, 2], None, false, &[]),
            Err(Refusal::Peering { pg })
        );
        assert_eq!(
            admit_to_pg(pg, &[1, 2], Some(&[1, 2, 3]), false, &[]),
            Err(Refusal::Peering { pg })
        );
        // Reads are served from the primary even while a replica missed a write.
        assert_eq!(admit_to_pg(pg, &[1, 2], Some(&[1, 2]), false, &[2]), Ok(()));
        assert_eq!(
            admit_to_pg(pg, &[1, 2], Some(&[1, 2]), true, &[2])
                .unwrap_err()
                .code(),
            ErrorCode::Inactive
        );
    }

    /// A `FullTry` write passes the full flag and the full ratio, not the failsafe ratio.
    #[test]
    fn full_try_writes_up_to_the_failsafe() {
        assert_eq!(
            refuse_full(1, true, true, true, Some(500_000), 50_000),
            None
        );
        assert_eq!(
            refuse_full(1, true, false, true, Some(960_000), 950_000),
            None
        );
        let r = refuse_full(2, true, true, true, Some(970_000), 950_000).unwrap();
        assert_eq!(r.code(), ErrorCode::Full);
        assert!(r.to_string().contains("failsafe"), "{r}");
        // a full ratio set above the failsafe raises it
        assert_eq!(
            refuse_full(1, true, true, true, Some(975_000), 980_000),
            None
        );
    }

    #[test]
    fn full_refuses_writes_only() {
        assert_eq!(
            refuse_full(1, false, true, false, Some(990_000), 950_000),
            None
        );
        assert!(matches!(
            refuse_full(1, true, true, false, None, 950_000),
            Some(Refusal::Full { .. })
        ));
        assert_eq!(
            refuse_full(1, true, false, false, Some(940_000), 950_000),
            None
        );
        assert_eq!(refuse_full(1, true, false, false, None, 950_000), None);
        let r = refuse_full(3, true, false, false, Some(950_000), 950_000).unwrap();
        assert_eq!(r.code(), ErrorCode::Full);
        assert_eq!(
            r.to_string(),
            "osd.3 is 95.0% used, at or past the full ratio 95.0%"
        );
    }

    #[test]
    fn replica_failures_are_a_rollback_when_all_full_else_members_that_missed_the_write() {
        assert_eq!(
            classify_replica_failures(&[(3, Some(ErrorCode::Full)), (2, Some(ErrorCode::Full))]),
            ReplicaFailures::AllFull { authority: 3 }
        );
        assert_eq!(
            classify_replica_failures(&[(3, Some(ErrorCode::Full)), (2, None)]),
            ReplicaFailures::Missed { osds: vec![3, 2] }
        );
        assert_eq!(
            classify_replica_failures(&[(2, Some(ErrorCode::Io))]),
            ReplicaFailures::Missed { osds: vec![2] }
        );
        // Peer again only while the failed replica is still in the PG, at the same epoch.
        let (acting, up) = ([1, 2, 3], [1, 2, 3]);
        assert!(repeer_after_failures(
            1,
            5,
            5,
            Some((1, &acting, &up)),
            &[2],
            true
        ));
        assert!(!repeer_after_failures(
            1,
            5,
            6,
            Some((1, &acting, &up)),
            &[2],
            true
        ));
        assert!(!repeer_after_failures(
            1,
            5,
            5,
            Some((1, &acting, &up)),
            &[4],
            true
        ));
        assert!(!repeer_after_failures(
            1,
            5,
            5,
            Some((2, &acting, &up)),
            &[2],
            true
        ));
        assert!(!repeer_after_failures(
            1,
            5,
            5,
            Some((1, &acting, &up)),
            &[2],
            false
        ));
        assert!(!repeer_after_failures(1, 5, 5, None, &[2], true));
    }
}

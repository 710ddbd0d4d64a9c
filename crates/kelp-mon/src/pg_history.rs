//! PG activation records: which OSDs held every acknowledged write of each PG when it last
//! went active, so that no later peering can go active without them.
//!
//! Why: a PG's primary acknowledges a write only once every member of its write set has
//! committed it, so any one of those members has the PG's whole history. A new primary that
//! peers only with the OSDs CRUSH gives it now may find none of them: they went down one
//! after another while the PG kept serving with fewer members (`min_size` allows it). Going
//! active with what is left would silently roll the PG back to an older state. Ceph works this
//! out from the OSD map history (past intervals); Kelp's monitors keep the answer instead: the
//! primary records its write set here before the PG serves, and a new record is accepted only
//! from a peering that heard from a member of the current one with at least its
//! `last_update`. Refused, the primary either asks the members it did not hear from (they
//! may be up but no longer mapped to the PG), or reports the PG `down` (none of them is up)
//! or `incomplete` (the ones that answered lost their copy).
//!
//! Erasure-coded PGs: one member holds only one shard, and `k` shards are needed to read any
//! object, so a new record there needs `k` members of the current one heard at its
//! `last_update` (`vouchers`), not one.
//!
//! Invariants: records only move forward in map epochs; a member is removed from records only
//! by the operator (`kelp osd lost`, `kelp osd purge`); a record with no members left accepts
//! any peering.

use kelp_proto::{ActivationVerdict, PgActivation, PgRecord};

/// Whether `a` may replace `current` (see the module doc): `vouchers` members of `current`
/// (1 for a replicated PG, `k` for an erasure-coded one; fewer if the record has fewer) must
/// have been heard with at least its `last_update`.
pub fn check(current: Option<&PgRecord>, a: &PgActivation, vouchers: usize) -> ActivationVerdict {
    let Some(cur) = current else {
        return ActivationVerdict::Recorded;
    };
    if a.record.epoch < cur.epoch {
        return ActivationVerdict::Stale {
            current: cur.clone(),
        };
    }
    let heard = a
        .heard
        .iter()
        .filter(|(osd, lu)| cur.members.contains(osd) && *lu >= cur.last_update)
        .count();
    // A write set grown in the same interval (a member recovered and joined) keeps every
    // member of the current one: nothing it vouched for is lost.
    let grown = a.record.epoch == cur.epoch
        && cur.members.iter().all(|m| a.record.members.contains(m))
        && a.record.last_update >= cur.last_update;
    let vouched =
        cur.members.is_empty() || grown || heard >= vouchers.clamp(1, cur.members.len().max(1));
    if vouched {
        ActivationVerdict::Recorded
    } else {
        ActivationVerdict::Blocked {
            current: cur.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_types::PgId;

    fn rec(epoch: u32, members: &[i32], lu: (u32, u64)) -> PgRecord {
        PgRecord {
            epoch,
            members: members.to_vec(),
            last_update: lu,
        }
    }

    fn act(epoch: u32, members: &[i32], heard: &[(i32, (u32, u64))]) -> PgActivation {
        PgActivation {
            pg: PgId::new(1, 0),
            primary: members[0],
            record: rec(epoch, members, (epoch, 9)),
            heard: heard.to_vec(),
        }
    }

    #[test]
    fn a_new_pg_is_recorded() {
        assert_eq!(
            check(None, &act(3, &[0, 1], &[(0, (0, 0))]), 1),
            ActivationVerdict::Recorded
        );
    }

    #[test]
    fn hearing_from_one_current_member_is_enough() {
        let cur = rec(5, &[0, 1, 2], (5, 40));
        let a = act(7, &[2, 3, 4], &[(3, (0, 0)), (2, (5, 41)), (4, (0, 0))]);
        assert_eq!(check(Some(&cur), &a, 1), ActivationVerdict::Recorded);
    }

    #[test]
    fn none_of_the_current_members_heard_blocks() {
        // osd.1 served the PG alone after osd.0 went down, then went down itself; osd.0 is
        // back and must not go active with its older copy.
        let cur = rec(9, &[1], (9, 120));
        let a = act(11, &[0], &[(0, (5, 100))]);
        assert_eq!(
            check(Some(&cur), &a, 1),
            ActivationVerdict::Blocked {
                current: cur.clone()
            }
        );
    }

    #[test]
    fn a_current_member_behind_the_record_does_not_count() {
        // osd.1 is a member but answered with less than the record: its store was recreated.
        let cur = rec(9, &[1, 2], (9, 120));
        let a = act(11, &[1, 3], &[(1, (0, 0)), (3, (0, 0))]);
        assert!(matches!(
            check(Some(&cur), &a, 1),
            ActivationVerdict::Blocked { .. }
        ));
        // the same member with the record's history vouches
        let a = act(11, &[1, 3], &[(1, (9, 120)), (3, (0, 0))]);
        assert_eq!(check(Some(&cur), &a, 1), ActivationVerdict::Recorded);
    }

    #[test]
    fn an_older_peering_is_stale() {
        let cur = rec(9, &[1, 2], (9, 120));
        let a = act(8, &[1, 2], &[(1, (9, 120))]);
        assert!(matches!(
            check(Some(&cur), &a, 1),
            ActivationVerdict::Stale { .. }
        ));
    }

    #[test]
    fn a_record_whose_members_were_all_lost_accepts_anything() {
        let cur = rec(9, &[], (9, 120));
        let a = act(12, &[0], &[(0, (5, 100))]);
        assert_eq!(check(Some(&cur), &a, 1), ActivationVerdict::Recorded);
    }

    #[test]
    fn an_erasure_coded_pg_needs_k_members_of_the_record() {
        let cur = rec(5, &[0, 1, 2, 3, 4, 5], (5, 9));
        let three = act(
            6,
            &[0, 1, 2, 6, 7, 8],
            &[(0, (5, 9)), (1, (5, 9)), (2, (5, 9))],
        );
        assert!(matches!(
            check(Some(&cur), &three, 4),
            ActivationVerdict::Blocked { .. }
        ));
        assert_eq!(check(Some(&cur), &three, 1), ActivationVerdict::Recorded);
        let four = act(
            6,
            &[0, 1, 2, 3, 7, 8],
            &[
                (0, (5, 9)),
                (1, (5, 9)),
                (2, (5, 9)),
                (3, (5, 9)),
                (7, (0, 0)),
            ],
        );
        assert_eq!(check(Some(&cur), &four, 4), ActivationVerdict::Recorded);
        // A member heard behind the record does not vouch.
        let behind = act(
            6,
            &[0, 1, 2, 3],
            &[(0, (5, 9)), (1, (5, 9)), (2, (5, 9)), (3, (5, 8))],
        );
        assert!(matches!(
            check(Some(&cur), &behind, 4),
            ActivationVerdict::Blocked { .. }
        ));
        // The same interval's write set, grown by a recovered member: accepted on the
        // primary's word alone.
        let grown = PgActivation {
            pg: PgId::new(1, 0),
            primary: 0,
            record: rec(5, &[0, 1, 2, 3, 4, 5, 6], (5, 12)),
            heard: vec![(0, (5, 12))],
        };
        assert_eq!(check(Some(&cur), &grown, 4), ActivationVerdict::Recorded);
    }
}

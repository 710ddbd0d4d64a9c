//! Capabilities: which client may cache what, as a pure state machine (no I/O, time passed
//! in as milliseconds), so every conflict rule is unit-tested without a daemon.
//!
//! A capability is a lease on one inode held by one client:
//! - [`CAP_SHARED`]: cache the inode's attributes, and (for a directory) its entries;
//!   many clients at once;
//! - [`CAP_READ`]: keep the file's pages cached across opens; many clients at once;
//! - [`CAP_EXCL`]: buffer writes / exclusive use; one client, and no other client may hold
//!   any capability on the inode meanwhile. Its holder keeps the file's size and mtime
//!   dirty (write-back) and flushes them before it acknowledges the revoke, so the MDS
//!   answers nobody else about the inode while an exclusive holding is unsettled
//!   ([`CapTable::revoke_excl`]).
//!
//! Invariants kept:
//! - no two conflicting capabilities coexist on an inode, counting a capability being
//!   revoked as still held until its holder acknowledges the revoke or its lease runs out
//!   (a client that died or lost its session keeps nothing past its lease);
//! - a revoke is always issued before a conflicting grant (a grant that conflicts with what
//!   others hold revokes it and is refused until the revokes settle);
//! - every grant expires `lease_ms` after it was made; the holder trusts it for less (it
//!   counts from the moment it sent the request), so the MDS never waits for a holder that
//!   may still believe in a lease the MDS has dropped.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::types::{CAP_EXCL, CAP_READ, CAP_SHARED, CapRevoke, Ino};

/// Every capability bit.
pub const CAP_ALL: u8 = CAP_SHARED | CAP_READ | CAP_EXCL;

/// Whether `a` held by one client conflicts with `b` held by another.
pub fn conflicts(a: u8, b: u8) -> bool {
    a != 0 && b != 0 && (a & CAP_EXCL != 0 || b & CAP_EXCL != 0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    caps: u8,
    expires: u64,
}

/// A revoke sent (or to be sent) to a client and not yet settled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    client: u64,
    ino: Ino,
    caps: u8,
    /// The revoked grant's expiry: the revoke settles by then even without an ack.
    expires: u64,
}

/// The outcome of [`CapTable::grant`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GrantOutcome {
    /// What the client holds now (of what it asked for).
    pub granted: u8,
    /// Revokes issued to others because they held something that conflicts; what was
    /// refused may be asked for again once they settle.
    pub revokes: Vec<u64>,
}

/// Every grant and every unsettled revoke, per inode and client.
#[derive(Debug)]
pub struct CapTable {
    lease_ms: u64,
    grants: HashMap<Ino, HashMap<u64, Grant>>,
    pending: BTreeMap<u64, Pending>,
    /// Revokes not yet handed to their client (per client, in order).
    outbox: HashMap<u64, Vec<CapRevoke>>,
    /// When each inode with grants was last granted (the budget revokes the oldest first).
    last_use: HashMap<Ino, u64>,
    next_id: u64,
}

impl CapTable {
    pub fn new(lease_ms: u64) -> CapTable {
        CapTable {
            lease_ms,
            grants: HashMap::new(),
            pending: BTreeMap::new(),
            outbox: HashMap::new(),
            last_use: HashMap::new(),
            next_id: 1,
        }
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// What `client` holds on `ino` now (grants only; not what is being revoked).
    pub fn held(&self, client: u64, ino: Ino, now: u64) -> u8 {
        self.grants
            .get(&ino)
            .and_then(|m| m.get(&client))
            .filter(|g| g.expires > now)
            .map_or(0, |g| g.caps)
    }

    /// What `client` holds or is still being revoked from it on `ino` (what it may still
    /// be caching).
    fn holding(&self, client: u64, ino: Ino, now: u64) -> u8 {
        let mut caps = self.held(client, ino, now);
        for p in self.pending.values() {
            if p.client == client && p.ino == ino && p.expires > now {
                caps |= p.caps;
            }
        }
        caps
    }

    /// Every client that may cache something of `ino`, with what.
    fn holders(&self, ino: Ino, now: u64) -> HashMap<u64, u8> {
        let mut out: HashMap<u64, u8> = HashMap::new();
        if let Some(m) = self.grants.get(&ino) {
            for (c, g) in m {
                if g.expires > now {
                    *out.entry(*c).or_default() |= g.caps;
                }
            }
        }
        for p in self.pending.values() {
            if p.ino == ino && p.expires > now {
                *out.entry(p.client).or_default() |= p.caps;
            }
        }
        out
    }

    /// Grants `want` on `ino` to `client` (a fresh lease from `now`). Whatever conflicts
    /// with other clients' capabilities is revoked from them and not granted now.
    pub fn grant(&mut self, client: u64, ino: Ino, want: u8, now: u64) -> GrantOutcome {
        let want = want & CAP_ALL;
        if want == 0 {
            return GrantOutcome::default();
        }
        let mut revokes = Vec::new();
        let mut blocked = false;
        for (other, caps) in self.holders(ino, now) {
            if other == client || !conflicts(want, caps) {
                continue;
            }
            blocked = true;
            // what the other holds and `want` conflicts with: everything, if either is EXCL
            revokes.extend(self.revoke_client(other, ino, caps, &[], now));
        }
        let granted = if blocked {
            // the non-exclusive part may still be shared, unless another holds EXCL
            let others_excl = self
                .holders(ino, now)
                .iter()
                .any(|(c, caps)| *c != client && caps & CAP_EXCL != 0);
            if others_excl { 0 } else { want & !CAP_EXCL }
        } else {
            want
        };
        if granted != 0 {
            let g = self
                .grants
                .entry(ino)
                .or_default()
                .entry(client)
                .or_insert(Grant {
                    caps: 0,
                    expires: 0,
                });
            if g.expires <= now {
                g.caps = 0;
            }
            g.caps |= granted;
            g.expires = now + self.lease_ms;
            self.last_use.insert(ino, now);
        }
        GrantOutcome { granted, revokes }
    }

    /// Takes `caps` of `ino` away from `client` (if it holds any of them); returns the
    /// revoke's id when one was issued.
    fn revoke_client(
        &mut self,
        client: u64,
        ino: Ino,
        caps: u8,
        names: &[String],
        now: u64,
    ) -> Option<u64> {
        let mut expires = 0;
        let mut taken = 0;
        if let Some(m) = self.grants.get_mut(&ino) {
            if let Some(g) = m.get_mut(&client)
                && g.expires > now
            {
                taken = g.caps & caps;
                expires = g.expires;
                g.caps &= !caps;
                if g.caps == 0 {
                    m.remove(&client);
                }
            }
            if m.is_empty() {
                self.grants.remove(&ino);
                self.last_use.remove(&ino);
            }
        }
        if taken == 0 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(
            id,
            Pending {
                client,
                ino,
                caps: taken,
                expires,
            },
        );
        self.outbox.entry(client).or_default().push(CapRevoke {
            id,
            ino,
            caps: taken,
            names: names.to_vec(),
        });
        Some(id)
    }

    /// `client` changed `ino`: every other client's capabilities in `caps` on it are
    /// revoked (`names`: the directory entries that changed, for a directory). Returns the
    /// revokes to wait for before the change is acknowledged: the ones issued now and the
    /// unsettled ones already taking some of `caps` from another client (issued by a grant
    /// that did not wait for them). `client` 0 revokes from all.
    pub fn revoke_for_change(
        &mut self,
        client: u64,
        ino: Ino,
        caps: u8,
        names: &[String],
        now: u64,
    ) -> Vec<u64> {
        let in_flight: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                p.client != client && p.ino == ino && p.caps & caps != 0 && p.expires > now
            })
            .map(|(id, _)| *id)
            .collect();
        let others: Vec<u64> = self
            .grants
            .get(&ino)
            .map(|m| m.keys().copied().filter(|c| *c != client).collect())
            .unwrap_or_default();
        let mut ids: Vec<u64> = others
            .into_iter()
            .filter_map(|c| self.revoke_client(c, ino, caps, names, now))
            .collect();
        ids.extend(in_flight);
        ids
    }

    /// Another client than `client` wants to see or change `ino`: every other client's
    /// exclusive capability on it is revoked (it may hold a size the MDS has not seen).
    /// Returns the revokes to wait for: the ones issued now and those of an exclusive
    /// capability on `ino` still unsettled (empty: nobody else may hold it).
    pub fn revoke_excl(&mut self, client: u64, ino: Ino, now: u64) -> Vec<u64> {
        let excl_holders: Vec<u64> = self
            .grants
            .get(&ino)
            .map(|m| {
                m.iter()
                    .filter(|(c, g)| **c != client && g.caps & CAP_EXCL != 0 && g.expires > now)
                    .map(|(c, _)| *c)
                    .collect()
            })
            .unwrap_or_default();
        for c in excl_holders {
            self.revoke_client(c, ino, CAP_EXCL, &[], now);
        }
        self.pending
            .iter()
            .filter(|(_, p)| {
                p.client != client && p.ino == ino && p.caps & CAP_EXCL != 0 && p.expires > now
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Revokes every exclusive capability on every inode (a quota changed: the sizes its
    /// holders defer must be checked against it). Returns the revokes to wait for.
    pub fn revoke_all_excl(&mut self, now: u64) -> Vec<u64> {
        let inos: Vec<Ino> = self
            .grants
            .iter()
            .filter(|(_, m)| m.values().any(|g| g.caps & CAP_EXCL != 0))
            .map(|(i, _)| *i)
            .collect();
        let mut ids = Vec::new();
        for ino in inos {
            ids.extend(self.revoke_excl(0, ino, now));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The client dropped what the revokes asked (its kernel caches are invalidated).
    pub fn ack(&mut self, client: u64, ids: &[u64]) {
        for id in ids {
            if self.pending.get(id).is_some_and(|p| p.client == client) {
                self.pending.remove(id);
            }
        }
    }

    /// Revokes not yet handed to `client` (handed now).
    pub fn take_outbox(&mut self, client: u64) -> Vec<CapRevoke> {
        self.outbox.remove(&client).unwrap_or_default()
    }

    pub fn has_outbox(&self, client: u64) -> bool {
        self.outbox.get(&client).is_some_and(|v| !v.is_empty())
    }

    /// Whether every one of `ids` is acknowledged or expired.
    pub fn settled(&self, ids: &[u64], now: u64) -> bool {
        ids.iter()
            .all(|id| self.pending.get(id).is_none_or(|p| p.expires <= now))
    }

    /// The clients still owing an acknowledgement for some of `ids`.
    pub fn unsettled_clients(&self, ids: &[u64], now: u64) -> HashSet<u64> {
        ids.iter()
            .filter_map(|id| self.pending.get(id))
            .filter(|p| p.expires > now)
            .map(|p| p.client)
            .collect()
    }

    /// When the last of `ids` expires at the latest (the bound of a wait for them).
    pub fn deadline(&self, ids: &[u64]) -> Option<u64> {
        ids.iter()
            .filter_map(|id| self.pending.get(id))
            .map(|p| p.expires)
            .max()
    }

    /// The client's session is gone: it holds nothing any more, and owes nothing.
    pub fn drop_client(&mut self, client: u64) {
        self.grants.retain(|_, m| {
            m.remove(&client);
            !m.is_empty()
        });
        let grants = &self.grants;
        self.last_use.retain(|i, _| grants.contains_key(i));
        self.pending.retain(|_, p| p.client != client);
        self.outbox.remove(&client);
    }

    /// Forgets expired grants and revokes (memory only: they bind nobody any more).
    pub fn expire(&mut self, now: u64) {
        self.grants.retain(|_, m| {
            m.retain(|_, g| g.expires > now);
            !m.is_empty()
        });
        let grants = &self.grants;
        self.last_use.retain(|i, _| grants.contains_key(i));
        self.pending.retain(|_, p| p.expires > now);
    }

    /// Inodes on which some client holds a capability.
    pub fn inodes_with_grants(&self) -> usize {
        self.grants.len()
    }

    /// Whether some client may cache something of `ino`.
    pub fn is_held(&self, ino: Ino, now: u64) -> bool {
        !self.holders(ino, now).is_empty()
    }

    /// The memory budget: while more than `budget` inodes carry grants, the least recently
    /// granted ones are revoked from every client. Returns the revokes issued.
    pub fn enforce_budget(&mut self, budget: usize, now: u64) -> Vec<u64> {
        self.expire(now);
        if self.grants.len() <= budget {
            return Vec::new();
        }
        let mut by_age: Vec<(u64, Ino)> = self.last_use.iter().map(|(i, t)| (*t, *i)).collect();
        by_age.sort_unstable();
        let excess = self.grants.len() - budget;
        let mut out = Vec::new();
        for (_, ino) in by_age.into_iter().take(excess) {
            out.extend(self.revoke_for_change(0, ino, CAP_ALL, &[], now));
        }
        out
    }

    /// For tests and checks: whether what clients hold on `ino` (grants and unsettled
    /// revokes) is free of conflicts.
    pub fn consistent(&self, ino: Ino, now: u64) -> bool {
        let h: Vec<u8> = self.holders(ino, now).into_values().collect();
        for (i, a) in h.iter().enumerate() {
            for b in &h[i + 1..] {
                if conflicts(*a, *b) {
                    return false;
                }
            }
        }
        true
    }

    /// What `client` may still be caching of `ino` (for tests).
    pub fn may_cache(&self, client: u64, ino: Ino, now: u64) -> u8 {
        self.holding(client, ino, now)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    const LEASE: u64 = 30_000;

    #[test]
    fn shared_and_read_are_shared() {
        let mut t = CapTable::new(LEASE);
        assert_eq!(t.grant(1, 10, CAP_SHARED | CAP_READ, 0).granted, 3);
        let g = t.grant(2, 10, CAP_SHARED | CAP_READ, 0);
        assert_eq!(g.granted, 3);
        assert!(g.revokes.is_empty());
        assert!(t.consistent(10, 0));
    }

    #[test]
    fn exclusive_revokes_others_first_and_waits_for_them() {
        let mut t = CapTable::new(LEASE);
        t.grant(1, 10, CAP_SHARED | CAP_READ, 0);
        let g = t.grant(2, 10, CAP_EXCL, 5);
        assert_eq!(g.granted, 0, "not granted while client 1 may still cache");
        assert_eq!(g.revokes.len(), 1);
        let sent = t.take_outbox(1);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].caps, CAP_SHARED | CAP_READ);
        assert!(!t.settled(&g.revokes, 6));
        t.ack(1, &g.revokes);
        assert!(t.settled(&g.revokes, 6));
        assert_eq!(t.grant(2, 10, CAP_EXCL, 7).granted, CAP_EXCL);
        // and now client 1's shared grant conflicts with 2's exclusive one
        let g1 = t.grant(1, 10, CAP_SHARED, 8);
        assert_eq!(g1.granted, 0);
        assert_eq!(t.take_outbox(2)[0].caps, CAP_EXCL);
        assert!(t.consistent(10, 8));
    }

    #[test]
    fn a_change_revokes_every_other_client_but_not_the_changer() {
        let mut t = CapTable::new(LEASE);
        t.grant(1, 10, CAP_SHARED, 0);
        t.grant(2, 10, CAP_SHARED | CAP_READ, 0);
        t.grant(3, 10, CAP_SHARED, 0);
        let ids = t.revoke_for_change(1, 10, CAP_ALL, &["x".into()], 1);
        assert_eq!(ids.len(), 2);
        assert!(t.take_outbox(1).is_empty());
        let r2 = t.take_outbox(2);
        assert_eq!(r2[0].names, vec!["x".to_string()]);
        assert_eq!(t.held(1, 10, 1), CAP_SHARED);
        assert_eq!(t.held(2, 10, 1), 0);
        assert_eq!(t.unsettled_clients(&ids, 1).len(), 2);
    }

    #[test]
    fn a_change_waits_for_revokes_a_grant_issued_before() {
        let mut t = CapTable::new(LEASE);
        t.grant(2, 10, CAP_SHARED | CAP_READ, 0);
        // client 1 asks for the exclusive cap: 2's caps are revoked, nothing waits for them
        let g = t.grant(1, 10, CAP_ALL, 1);
        assert_eq!(g.revokes.len(), 1);
        // 1's change must still wait until 2 has dropped its caches
        let ids = t.revoke_for_change(1, 10, CAP_ALL, &[], 2);
        assert_eq!(ids, g.revokes);
        t.ack(2, &ids);
        assert!(t.revoke_for_change(1, 10, CAP_ALL, &[], 3).is_empty());
    }

    #[test]
    fn attribute_changes_keep_the_read_cache() {
        let mut t = CapTable::new(LEASE);
        t.grant(2, 10, CAP_SHARED | CAP_READ, 0);
        t.revoke_for_change(1, 10, CAP_SHARED | CAP_EXCL, &[], 1);
        assert_eq!(t.held(2, 10, 1), CAP_READ);
    }

    #[test]
    fn a_dead_client_is_waited_for_only_until_its_lease_ends() {
        let mut t = CapTable::new(LEASE);
        t.grant(2, 10, CAP_SHARED, 1000);
        let ids = t.revoke_for_change(1, 10, CAP_ALL, &[], 2000);
        assert!(!t.settled(&ids, 2000));
        assert_eq!(t.deadline(&ids), Some(1000 + LEASE));
        assert!(!t.settled(&ids, 1000 + LEASE - 1));
        assert!(t.settled(&ids, 1000 + LEASE));
    }

    #[test]
    fn a_dropped_session_loses_everything() {
        let mut t = CapTable::new(LEASE);
        t.grant(2, 10, CAP_SHARED, 0);
        t.grant(2, 11, CAP_READ, 0);
        let ids = t.revoke_for_change(1, 10, CAP_ALL, &[], 1);
        t.drop_client(2);
        assert!(t.settled(&ids, 1));
        assert_eq!(t.held(2, 11, 1), 0);
        assert_eq!(t.inodes_with_grants(), 0);
    }

    #[test]
    fn expired_grants_are_not_revoked() {
        let mut t = CapTable::new(LEASE);
        t.grant(2, 10, CAP_SHARED, 0);
        assert!(t.revoke_for_change(1, 10, CAP_ALL, &[], LEASE).is_empty());
    }

    #[test]
    fn the_budget_revokes_the_least_recently_used() {
        let mut t = CapTable::new(LEASE);
        for ino in 0..10u64 {
            t.grant(7, 100 + ino, CAP_SHARED, ino);
        }
        let ids = t.enforce_budget(4, 20);
        assert_eq!(ids.len(), 6);
        assert_eq!(t.inodes_with_grants(), 4);
        let revoked: Vec<Ino> = t.take_outbox(7).iter().map(|r| r.ino).collect();
        let mut sorted = revoked.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (100..106).collect::<Vec<_>>());
        assert!(t.enforce_budget(4, 21).is_empty());
    }

    #[test]
    fn an_exclusive_holding_is_revoked_before_another_client_is_answered() {
        let mut t = CapTable::new(LEASE);
        assert_eq!(t.grant(1, 10, CAP_ALL, 0).granted, CAP_ALL);
        // the holder itself is never waited for
        assert!(t.revoke_excl(1, 10, 1).is_empty());
        let ids = t.revoke_excl(2, 10, 1);
        assert_eq!(ids.len(), 1);
        assert_eq!(
            t.held(1, 10, 1),
            CAP_SHARED | CAP_READ,
            "only the exclusive cap goes"
        );
        let r = t.take_outbox(1);
        assert_eq!(r[0].caps, CAP_EXCL);
        // asked again before the holder acknowledged: the same revoke is waited for
        assert_eq!(t.revoke_excl(3, 10, 2), ids);
        t.ack(1, &ids);
        assert!(t.revoke_excl(2, 10, 3).is_empty());
        // and now shared caches may coexist
        assert_eq!(t.grant(2, 10, CAP_SHARED, 4).granted, CAP_SHARED);
        assert!(t.consistent(10, 4));
    }

    #[test]
    fn a_quota_change_revokes_every_exclusive_holding() {
        let mut t = CapTable::new(LEASE);
        t.grant(1, 10, CAP_ALL, 0);
        t.grant(2, 11, CAP_ALL, 0);
        t.grant(3, 12, CAP_SHARED, 0);
        let ids = t.revoke_all_excl(1);
        assert_eq!(ids.len(), 2);
        assert_eq!(t.held(3, 12, 1), CAP_SHARED);
        assert_eq!(t.held(1, 10, 1) & CAP_EXCL, 0);
        assert_eq!(t.held(2, 11, 1) & CAP_EXCL, 0);
    }

    #[derive(Debug, Clone)]
    enum Ev {
        Grant(u64, Ino, u8),
        Change(u64, Ino, u8),
        Ack(u64),
        Drop(u64),
        Tick(u64),
        Budget(usize),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        let client = 1u64..5;
        let ino = 1u64..4;
        prop_oneof![
            (client.clone(), ino.clone(), 1u8..8).prop_map(|(c, i, w)| Ev::Grant(c, i, w)),
            (0u64..5, ino, 1u8..8).prop_map(|(c, i, w)| Ev::Change(c, i, w)),
            client.clone().prop_map(Ev::Ack),
            client.prop_map(Ev::Drop),
            (0u64..20_000).prop_map(Ev::Tick),
            (0usize..4).prop_map(Ev::Budget),
        ]
    }

    proptest! {
        /// Any sequence of grants, changes, acks, session drops, time and budget passes:
        /// no two conflicting capabilities ever coexist (counting unsettled revokes), and a
        /// grant that conflicts with another client's holding is never made before that
        /// holding was revoked.
        #[test]
        fn no_conflicting_grants_ever_coexist(evs in proptest::collection::vec(ev(), 1..200)) {
            let mut t = CapTable::new(LEASE);
            let mut now = 0u64;
            for e in evs {
                match e {
                    Ev::Grant(c, ino, want) => {
                        let before = t.holders(ino, now);
                        let g = t.grant(c, ino, want, now);
                        for (other, caps) in before {
                            if other != c && conflicts(caps, g.granted) {
                                prop_assert!(false, "granted {} to {c} over {caps} of {other}", g.granted);
                            }
                            if other != c && conflicts(caps, want) {
                                // the conflicting holding was revoked before (now pending)
                                prop_assert_eq!(t.held(other, ino, now) & caps, 0);
                            }
                        }
                    }
                    Ev::Change(c, ino, caps) => {
                        t.revoke_for_change(c, ino, caps, &[], now);
                        for other in 1..5 {
                            if other != c {
                                prop_assert_eq!(t.held(other, ino, now) & caps, 0);
                            }
                        }
                    }
                    Ev::Ack(c) => {
                        let ids: Vec<u64> = t.take_outbox(c).iter().map(|r| r.id).collect();
                        t.ack(c, &ids);
                    }
                    Ev::Drop(c) => t.drop_client(c),
                    Ev::Tick(d) => {
                        now += d;
                        t.expire(now);
                    }
                    Ev::Budget(b) => {
                        t.enforce_budget(b, now);
                        prop_assert!(t.inodes_with_grants() <= b);
                    }
                }
                for ino in 1..4 {
                    prop_assert!(t.consistent(ino, now));
                }
            }
        }
    }
}

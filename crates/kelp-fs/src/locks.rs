//! Advisory byte-range locks (POSIX `fcntl` and `flock`), held by the MDS so that they hold
//! across clients. Pure: the MDS asks, the table decides.
//!
//! A lock belongs to an owner: (client id, the kernel's lock owner). Two locks conflict when
//! their owners differ, their ranges overlap and one of them is a write lock. Setting a lock
//! replaces the owner's own locks in that range (splitting them at its edges), as POSIX says;
//! unlocking removes that range from the owner's locks.
//!
//! Locks survive an MDS restart or failover: every change of an inode's locks is journaled
//! ([`crate::types::Update::Locks`], the inode's whole list after the change) and the checkpoint
//! writes the whole table ([`StoredLocks`]), so the MDS that replays the journal holds exactly
//! the locks that were granted, from its first request on: no grace period during which a
//! conflicting lock could slip in before the holders re-assert theirs, and nothing for the
//! clients to remember. (Ceph instead has clients re-assert their locks in a reconnect phase;
//! that keeps lock changes off the journal, at the price of a reclaim window after every
//! failover.) The locks of a client that does not come back (it stops talking to the MDS
//! for [`LOCK_SESSION_GRACE`], counted from the takeover for a new MDS) are released.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::types::Ino;

/// `F_RDLCK`, `F_WRLCK`, `F_UNLCK` (Linux's values).
pub const F_RDLCK: i32 = 0;
pub const F_WRLCK: i32 = 1;
pub const F_UNLCK: i32 = 2;

/// One lock, or a lock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// The kernel's lock owner (per process for fcntl, per open file for flock).
    pub owner: u64,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`u64::MAX`: to the end of the file, however long).
    pub end: u64,
    /// [`F_RDLCK`], [`F_WRLCK`] or (requests only) [`F_UNLCK`].
    pub typ: i32,
    pub pid: u32,
}

/// How long a client holding locks may go without any request (a live client always has a
/// capability poll outstanding, renewed every few seconds) before its locks are released.
pub const LOCK_SESSION_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    client: u64,
    lock: Lock,
}

/// The locks of every inode.
#[derive(Debug, Default)]
pub struct LockTable {
    held: HashMap<Ino, Vec<Held>>,
}

/// The lock table as the checkpoint stores it (`mds.locks`): per inode, (client, lock).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLocks {
    pub v: u8,
    pub locks: BTreeMap<Ino, Vec<(u64, Lock)>>,
}

fn overlap(a: &Lock, b: &Lock) -> bool {
    a.start <= b.end && b.start <= a.end
}

impl LockTable {
    /// The first lock that would block `req` of `client` (`F_GETLK`).
    pub fn test(&self, ino: Ino, client: u64, req: &Lock) -> Option<Lock> {
        self.held.get(&ino)?.iter().find_map(|h| {
            let same_owner = h.client == client && h.lock.owner == req.owner;
            let conflict = !same_owner
                && overlap(&h.lock, req)
                && (h.lock.typ == F_WRLCK || req.typ == F_WRLCK);
            conflict.then_some(h.lock)
        })
    }

    /// Sets or clears a lock (`F_SETLK`); `false` when another owner's lock blocks it.
    pub fn set(&mut self, ino: Ino, client: u64, req: &Lock) -> bool {
        if req.typ != F_UNLCK && self.test(ino, client, req).is_some() {
            return false;
        }
        let list = self.held.entry(ino).or_default();
        let mut kept = Vec::with_capacity(list.len() + 2);
        for h in list.drain(..) {
            if h.client != client || h.lock.owner != req.owner || !overlap(&h.lock, req) {
                kept.push(h);
                continue;
            }
            // cut the request's range out of the owner's lock
            if h.lock.start < req.start {
                kept.push(Held {
                    lock: Lock {
                        end: req.start - 1,
                        ..h.lock
                    },
                    ..h
                });
            }
            if h.lock.end > req.end {
                kept.push(Held {
                    lock: Lock {
                        start: req.end + 1,
                        ..h.lock
                    },
                    ..h
                });
            }
        }
        if req.typ != F_UNLCK {
            kept.push(Held { client, lock: *req });
        }
        if kept.is_empty() {
            self.held.remove(&ino);
        } else {
            *list = kept;
        }
        true
    }

    /// Releases every lock of `owner` of `client` on `ino` (the file was closed).
    pub fn release_owner(&mut self, ino: Ino, client: u64, owner: u64) {
        if let Some(list) = self.held.get_mut(&ino) {
            list.retain(|h| h.client != client || h.lock.owner != owner);
            if list.is_empty() {
                self.held.remove(&ino);
            }
        }
    }

    /// Releases every lock of a client (it went away).
    pub fn drop_client(&mut self, client: u64) {
        self.held.retain(|_, list| {
            list.retain(|h| h.client != client);
            !list.is_empty()
        });
    }

    /// The locks held on `ino`: (client, lock), in the order they were taken.
    pub fn held_on(&self, ino: Ino) -> Vec<(u64, Lock)> {
        self.held
            .get(&ino)
            .map(|l| l.iter().map(|h| (h.client, h.lock)).collect())
            .unwrap_or_default()
    }

    /// Sets the locks held on `ino` (a journaled change, replayed).
    pub fn restore(&mut self, ino: Ino, held: &[(u64, Lock)]) {
        if held.is_empty() {
            self.held.remove(&ino);
        } else {
            self.held.insert(
                ino,
                held.iter()
                    .map(|(client, lock)| Held {
                        client: *client,
                        lock: *lock,
                    })
                    .collect(),
            );
        }
    }

    /// The clients holding some lock.
    pub fn holders(&self) -> BTreeSet<u64> {
        self.held
            .values()
            .flat_map(|l| l.iter().map(|h| h.client))
            .collect()
    }

    /// The inodes on which `client` holds some lock.
    pub fn inodes_of(&self, client: u64) -> Vec<Ino> {
        let mut out: Vec<Ino> = self
            .held
            .iter()
            .filter(|(_, l)| l.iter().any(|h| h.client == client))
            .map(|(i, _)| *i)
            .collect();
        out.sort_unstable();
        out
    }

    /// The whole table, as the checkpoint stores it.
    pub fn snapshot(&self) -> StoredLocks {
        StoredLocks {
            v: crate::types::RECORD_VERSION,
            locks: self.held.keys().map(|i| (*i, self.held_on(*i))).collect(),
        }
    }

    /// The table a checkpoint stored.
    pub fn from_stored(stored: &StoredLocks) -> LockTable {
        let mut t = LockTable::default();
        for (ino, held) in &stored.locks {
            t.restore(*ino, held);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(owner: u64, start: u64, end: u64, typ: i32) -> Lock {
        Lock {
            owner,
            start,
            end,
            typ,
            pid: 1,
        }
    }

    #[test]
    fn readers_share_writers_exclude_across_clients() {
        let mut t = LockTable::default();
        assert!(t.set(5, 1, &lk(10, 0, 99, F_RDLCK)));
        assert!(t.set(5, 2, &lk(20, 50, 150, F_RDLCK)));
        assert!(
            !t.set(5, 2, &lk(20, 90, 95, F_WRLCK)),
            "client 1 reads there"
        );
        assert!(
            t.set(5, 2, &lk(20, 100, 150, F_WRLCK)),
            "upgrade outside the other's range"
        );
        assert_eq!(
            t.test(5, 1, &lk(10, 120, 120, F_RDLCK)).map(|l| l.owner),
            Some(20)
        );
        // client 2 still reads 50..99
        assert!(!t.set(5, 1, &lk(10, 0, 99, F_WRLCK)));
        t.drop_client(2);
        assert!(t.set(5, 1, &lk(10, 0, u64::MAX, F_WRLCK)));
        assert!(!t.set(5, 3, &lk(30, 7, 7, F_RDLCK)));
    }

    /// What the checkpoint stores and the journal replays rebuilds the same table.
    #[test]
    fn the_table_round_trips_through_its_stored_form() {
        let mut t = LockTable::default();
        assert!(t.set(5, 1, &lk(10, 0, u64::MAX, F_WRLCK)));
        assert!(t.set(6, 2, &lk(20, 0, 9, F_RDLCK)));
        assert!(t.set(6, 3, &lk(30, 0, 9, F_RDLCK)));
        let stored: StoredLocks =
            serde_json::from_slice(&serde_json::to_vec(&t.snapshot()).unwrap()).unwrap();
        let mut back = LockTable::from_stored(&stored);
        assert_eq!(back.holders(), [1, 2, 3].into());
        assert_eq!(back.inodes_of(2), vec![6]);
        assert!(
            !back.set(5, 2, &lk(20, 3, 3, F_RDLCK)),
            "client 1 still holds 5"
        );
        assert!(
            !back.set(6, 1, &lk(10, 0, 0, F_WRLCK)),
            "2 and 3 still read 6"
        );
        back.restore(6, &[]);
        assert!(back.set(6, 1, &lk(10, 0, 0, F_WRLCK)));
        assert_eq!(back.inodes_of(3), Vec::<Ino>::new());
    }

    #[test]
    fn unlocking_splits_ranges() {
        let mut t = LockTable::default();
        assert!(t.set(1, 1, &lk(1, 0, 99, F_WRLCK)));
        assert!(t.set(1, 1, &lk(1, 40, 59, F_UNLCK)));
        assert!(t.test(1, 2, &lk(2, 40, 59, F_WRLCK)).is_none());
        assert!(t.test(1, 2, &lk(2, 39, 39, F_RDLCK)).is_some());
        assert!(t.test(1, 2, &lk(2, 60, 60, F_RDLCK)).is_some());
        t.release_owner(1, 1, 1);
        assert!(t.test(1, 2, &lk(2, 0, u64::MAX, F_WRLCK)).is_none());
    }
}

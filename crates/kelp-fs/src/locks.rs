//! Advisory byte-range locks (POSIX `fcntl` and `flock`), held by the MDS so that they hold
//! across clients. Pure: the MDS asks, the table decides.
//!
//! A lock belongs to an owner: (client id, the kernel's lock owner). Two locks conflict when
//! their owners differ, their ranges overlap and one of them is a write lock. Setting a lock
//! replaces the owner's own locks in that range (splitting them at its edges), as POSIX says;
//! unlocking removes that range from the owner's locks. Locks live in the MDS's memory only:
//! they are lost (released) when the MDS restarts.

use std::collections::HashMap;

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

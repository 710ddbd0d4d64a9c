//! Creates without a round trip: inode numbers delegated to clients.
//!
//! A client that made a directory (and so holds it exclusively, with every name in it known)
//! answers creates in it itself, giving each file a number from a range the MDS delegated to
//! it ([`Op::TakeInos`]), and sends the creates behind ([`Envelope::delegated`]). The MDS
//! gives such a create exactly the number the client chose, or refuses it (ESTALE): the
//! kernel already knows the file by that number.
//!
//! A range is taken from the next inode number (so nothing else is ever given from it) and
//! stored before the client hears of it. An MDS that takes over reads the stored ranges:
//! their numbers are given only to delegated creates, each after a probe that no inode has
//! it (a create the old MDS made and the client sends again is answered from the
//! completed-request table instead). The MDS that made a range knows which of its numbers it
//! has given and needs no probe.

use serde::{Deserialize, Serialize};

use super::*;

/// How many inode numbers one delegation holds.
pub const DELEGATION_SIZE: u64 = 4096;
/// Delegations kept per client: the one in use and the next.
pub const DELEGATIONS_PER_CLIENT: usize = 2;
/// Delegations kept in all (the oldest go first): a create from a dropped one is refused.
pub const DELEGATIONS_KEPT: usize = 256;

/// A range of inode numbers `[start, end)` delegated to `client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    pub client: u64,
    pub start: Ino,
    pub end: Ino,
}

/// Which numbers of a range made by this MDS it has given (one bit each).
pub(super) type Given = Box<[u64]>;

impl Namespace {
    /// The ranges an MDS that served before stored (at activation): none of them is fresh,
    /// and nothing is allocated below their ends.
    pub fn set_delegations(&mut self, ranges: Vec<Delegation>) {
        if let Some(end) = ranges.iter().map(|d| d.end).max() {
            self.next_ino = self.next_ino.max(end);
        }
        self.delegations = ranges;
        self.fresh.clear();
    }

    /// The delegated ranges, as they are stored.
    pub fn delegations(&self) -> &[Delegation] {
        &self.delegations
    }

    /// Delegates the next [`DELEGATION_SIZE`] inode numbers to `client` (dropping its oldest
    /// range past [`DELEGATIONS_PER_CLIENT`], and the oldest of all past
    /// [`DELEGATIONS_KEPT`]). The caller stores [`Namespace::delegations`] before answering.
    pub fn delegate(&mut self, client: u64) -> Delegation {
        let d = Delegation {
            client,
            start: self.next_ino,
            end: self.next_ino + DELEGATION_SIZE,
        };
        self.next_ino = d.end;
        self.delegations.push(d);
        let mine = self
            .delegations
            .iter()
            .filter(|d| d.client == client)
            .count();
        if mine > DELEGATIONS_PER_CLIENT
            && let Some(at) = self.delegations.iter().position(|d| d.client == client)
        {
            self.fresh.remove(&self.delegations.remove(at).start);
        }
        while self.delegations.len() > DELEGATIONS_KEPT {
            self.fresh.remove(&self.delegations.remove(0).start);
        }
        let words = DELEGATION_SIZE.div_ceil(64) as usize;
        self.fresh
            .insert(d.start, vec![0u64; words].into_boxed_slice());
        d
    }

    /// The delegated range holding `h`.
    pub(super) fn delegation_of(&self, h: Ino) -> Option<Delegation> {
        self.delegations
            .iter()
            .find(|d| (d.start..d.end).contains(&h))
            .copied()
    }

    /// For a number of a range this MDS made: whether it has given it (`None`: not such a
    /// number).
    pub(super) fn fresh_given(&self, h: Ino) -> Option<bool> {
        let d = self.delegation_of(h)?;
        let bits = self.fresh.get(&d.start)?;
        let at = h - d.start;
        Some(bits[(at / 64) as usize] & (1 << (at % 64)) != 0)
    }

    /// Notes that the number `h` of a range this MDS made is given.
    pub(super) fn mark_given(&mut self, h: Ino) {
        if let Some(d) = self.delegation_of(h)
            && let Some(bits) = self.fresh.get_mut(&d.start)
        {
            let at = h - d.start;
            bits[(at / 64) as usize] |= 1 << (at % 64);
        }
    }
}

impl Namespace {
    /// Whether the client that made `dir` may create files in it by itself: nothing on the
    /// way up to the root that a create must be checked against or takes from there (no
    /// quota, no layout: the client gives its files the default layout), and the file
    /// system's default object size.
    pub fn creates_delegable(&self, dir: Ino) -> bool {
        let Ok(chain) = self.ancestors(dir) else {
            return false;
        };
        let plain = |d: &Ino| {
            self.inodes
                .get(d)
                .is_some_and(|i| i.dirstat.max_bytes == 0 && i.dirstat.max_files == 0)
        };
        chain.iter().all(plain)
            && self.inherited_layout(&chain) == Layout::default()
            && self
                .inodes
                .get(&dir)
                .is_some_and(|i| i.object_size == self.default_object_size)
    }
}

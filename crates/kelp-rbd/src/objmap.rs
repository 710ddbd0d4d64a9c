//! Which of an image head's data objects are known to be absent, as learned by the holder of
//! the exclusive lock (the role of Ceph's `object-map` feature for reads, learned lazily).
//!
//! A read of an object that does not exist costs a round trip to its OSD (an ENOENT) before the
//! clone's parent is read (or zeros are returned). Every later read of that object would pay it
//! again, although nothing has changed: in a clone most objects stay absent until written.
//!
//! Only the holder of the exclusive lock changes an image's objects, so while this client holds
//! it an object it saw absent stays absent until this client itself writes it. The map keeps:
//!
//! - **known absent**: an object a read found missing, learned only if the lock was held from
//!   before the read was sent until its answer was recorded (an *epoch* changes whenever the
//!   lock is taken or lost; a lookup carries the epoch it started in);
//! - **may exist**: an object this client is about to change (marked before the change is
//!   sent), which a read in flight can then no longer record as absent.
//!
//! Losing the lock (handing it over, a lost watch) forgets everything; taking it again starts
//! from an empty map after the writes still in flight are done (the caller drains them), so no
//! absence learned under another holder's turn is ever used. Nothing is persisted: a new
//! holder learns again, one ENOENT per object. Snapshot views are immutable and keep their
//! own cache without any lock.

use std::collections::HashMap;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct ExistenceMap {
    /// Whether this client holds the exclusive lock (so that the knowledge holds).
    valid: bool,
    /// Changes whenever `valid` does.
    epoch: u64,
    /// `false`: known absent; `true`: may exist (this client changed it).
    objects: HashMap<u64, bool>,
}

/// A lookup begun while the lock was held: the epoch it started in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

impl ExistenceMap {
    /// Whether `object` is known not to exist (its read can skip the OSD).
    pub(crate) fn known_absent(&self, object: u64) -> bool {
        self.valid && self.objects.get(&object) == Some(&false)
    }

    /// To be taken before a read is sent: `None` unless the lock is held.
    pub(crate) fn ticket(&self) -> Option<Ticket> {
        self.valid.then_some(Ticket(self.epoch))
    }

    /// A read that began with `ticket` found `object` missing.
    pub(crate) fn learn_absent(&mut self, object: u64, ticket: Option<Ticket>) {
        if ticket == Some(Ticket(self.epoch)) && self.valid {
            self.objects.entry(object).or_insert(false);
        }
    }

    /// `object` is about to be changed by this client (call before sending the change).
    pub(crate) fn will_change(&mut self, object: u64) {
        self.objects.insert(object, true);
    }

    /// The lock is held now, and no change from before it was taken is still in flight.
    pub(crate) fn lock_taken(&mut self) {
        if !self.valid {
            self.valid = true;
            self.epoch += 1;
        }
    }

    /// The lock is no longer held (or may not be): forget everything learned.
    pub(crate) fn lock_lost(&mut self) {
        self.valid = false;
        self.epoch += 1;
        self.objects.clear();
    }

    /// Objects known absent (for tests and diagnostics).
    pub(crate) fn absent_count(&self) -> usize {
        self.objects.values().filter(|e| !**e).count()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn nothing_is_learned_without_the_lock() {
        let mut m = ExistenceMap::default();
        assert_eq!(m.ticket(), None);
        m.learn_absent(1, m.ticket());
        assert!(!m.known_absent(1));
        m.lock_taken();
        m.learn_absent(1, m.ticket());
        assert!(m.known_absent(1));
    }

    #[test]
    fn a_lookup_across_a_lock_change_learns_nothing() {
        let mut m = ExistenceMap::default();
        m.lock_taken();
        let t = m.ticket();
        m.lock_lost();
        m.lock_taken();
        // The answer may predate another holder's write: not recorded.
        m.learn_absent(7, t);
        assert!(!m.known_absent(7));
        // A lookup begun now does count.
        m.learn_absent(7, m.ticket());
        assert!(m.known_absent(7));
    }

    #[test]
    fn losing_the_lock_forgets_and_stops_answers() {
        let mut m = ExistenceMap::default();
        m.lock_taken();
        m.learn_absent(3, m.ticket());
        m.lock_lost();
        assert!(!m.known_absent(3));
        m.lock_taken();
        assert!(!m.known_absent(3), "knowledge survived a lock hand-over");
        assert_eq!(m.absent_count(), 0);
    }

    #[test]
    fn a_change_wins_over_a_read_in_flight() {
        let mut m = ExistenceMap::default();
        m.lock_taken();
        let t = m.ticket();
        // The read was sent, then a write of the same object; the read's ENOENT comes last.
        m.will_change(5);
        m.learn_absent(5, t);
        assert!(!m.known_absent(5));
        // A known-absent object that is written stops being known absent.
        m.learn_absent(6, m.ticket());
        assert!(m.known_absent(6));
        m.will_change(6);
        assert!(!m.known_absent(6));
        m.learn_absent(6, m.ticket());
        assert!(
            !m.known_absent(6),
            "a written object was learned absent again"
        );
    }

    #[test]
    fn changes_made_before_the_lock_is_confirmed_are_kept() {
        let mut m = ExistenceMap::default();
        // A write may start as soon as the lock is held, before the map is told.
        m.will_change(9);
        m.lock_taken();
        m.learn_absent(9, m.ticket());
        assert!(!m.known_absent(9));
        // Taking the lock twice does not change the epoch (lookups in flight stay valid).
        let t = m.ticket();
        m.lock_taken();
        m.learn_absent(10, t);
        assert!(m.known_absent(10));
    }
}

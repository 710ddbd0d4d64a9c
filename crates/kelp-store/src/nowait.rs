//! Non-blocking attempts: store calls that can be served without waiting for the device's
//! data I/O or for another thread run on the caller's (async) thread.
//!
//! An OSD serves small reads and small writes on its async workers when it can: the hand-off
//! to a blocking thread and back (two wake-ups and context switches) costs more than a 4 KiB
//! op itself when the data is in memory or the write is deferred. But an op that does need
//! the device must never run there: under I/O contention one slow `pread` of data would stall
//! every connection the worker serves (measured: reads fell 3-6x). So the caller wraps the
//! call in [`attempt`]; inside it the store
//!
//! * reads data only from memory: pending deferred units and the page cache, read with
//!   `preadv2(RWF_NOWAIT)` (a miss, a read over 64 KiB, a checksum mismatch: refused);
//! * accepts only transactions that need no device I/O at submission (deferred writes and
//!   metadata; a write to new extents is refused) and only if the throttle, the apply lock
//!   and the reuse lock are free right now;
//! * does look metadata up in its database: fjall answers point lookups from its memtables,
//!   bloom filters and block cache, and reads its table files through the page cache, so a
//!   lookup reaches the device only for cold metadata (range scans are refused).
//!
//! Everything refused returns [`StoreError::WouldBlock`] before anything is applied;
//! `attempt` then returns `None` and the caller runs the same call on a blocking thread.
//!
//! A read in this mode never answers from data that fails its checksum either: a mismatch is
//! reported as "would block" so that the authoritative path (a direct read of the device)
//! decides, and a stale page-cache page can never be mistaken for corruption or returned.

use std::cell::Cell;

use crate::error::StoreError;

/// The largest data read the store may serve inside [`attempt`]: a read of more bytes is
/// always refused (it goes to the device, or through the page cache only on a thread that may
/// wait). A caller that knows its read is larger skips the attempt and goes straight to a
/// blocking thread (the attempt would only look the object up to be refused).
pub const READ_MAX: u64 = 64 << 10;

/// Whether a read of `len` bytes may be served inside [`attempt`] (see [`READ_MAX`]).
pub fn may_read(len: u64) -> bool {
    len <= READ_MAX
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    On,
    /// On, and something inside the attempt needed to block.
    Blocked,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Off) };
}

/// Runs `f` with the store in non-blocking mode on this thread: `Some(result)` if it never
/// needed to block, `None` if any store call inside it did (the result is discarded: run `f`
/// again on a thread that may block). Reads, and `submit` of transactions that need no device
/// I/O: a submit that would block refuses before applying anything, and one that starts
/// after something else in `f` blocked refuses too, so a discarded result never hides an
/// applied transaction (`f` must make no other changes).
pub fn attempt<T>(f: impl FnOnce() -> T) -> Option<T> {
    struct Restore(Mode);
    impl Drop for Restore {
        fn drop(&mut self) {
            // An enclosing attempt also needs to block if this one did.
            let blocked = MODE.get() == Mode::Blocked && self.0 != Mode::Off;
            MODE.set(if blocked { Mode::Blocked } else { self.0 });
        }
    }
    let _restore = Restore(MODE.replace(Mode::On));
    let out = f();
    (MODE.get() == Mode::On).then_some(out)
}

/// Whether the current thread is inside [`attempt`].
pub(crate) fn active() -> bool {
    MODE.get() != Mode::Off
}

/// Whether something in the current attempt already needed to block (its result is going to
/// be discarded: nothing with effects may start then).
pub(crate) fn has_blocked() -> bool {
    MODE.get() == Mode::Blocked
}

/// Marks the current attempt as needing to block; the error to return from the store call.
pub(crate) fn blocked() -> StoreError {
    MODE.set(Mode::Blocked);
    StoreError::WouldBlock
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_reports_blocking_and_restores_the_mode() {
        assert!(!active());
        assert_eq!(attempt(|| 7), Some(7));
        assert_eq!(
            attempt(|| {
                assert!(active());
                let _ = blocked();
                7
            }),
            None
        );
        assert!(!active());
        // Nested: the inner attempt's block is the outer one's too.
        let outer = attempt(|| {
            let inner = attempt(|| {
                let _ = blocked();
            });
            assert!(inner.is_none());
        });
        assert!(outer.is_none());
        assert!(!active());
    }

    #[test]
    fn only_small_reads_are_worth_an_attempt() {
        assert!(may_read(0));
        assert!(may_read(4096));
        assert!(may_read(READ_MAX));
        assert!(!may_read(READ_MAX + 1));
        assert!(!may_read(1 << 20));
    }
}

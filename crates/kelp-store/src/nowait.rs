//! Non-blocking attempts: reads that can be answered from memory, without waiting for the
//! device or the metadata database, run on the caller's (async) thread.
//!
//! An OSD serves small reads on its async workers when it can: the hand-off to a blocking
//! thread and back (two wake-ups and context switches) and an `O_DIRECT` read of a 4 KiB
//! block cost more than the read itself when the data is in memory. But a read that does
//! need the device must never run there: under I/O contention one slow `pread` would stall
//! every connection the worker serves. So the caller wraps the read in [`attempt`]; inside it
//! the store serves only from memory (the onode cache, pending deferred units, and the page
//! cache, read with `RWF_NOWAIT`) and refuses everything else with
//! [`StoreError::WouldBlock`], reads longer than 64 KiB included (those bypass the page
//! cache; the blocking path lends them out without a copy). `attempt` then returns `None`
//! and the caller runs the same read on a blocking thread, where it takes the ordinary path.
//!
//! A read in this mode never answers from data that fails its checksum either: a mismatch is
//! reported as "would block" so that the authoritative path (a direct read of the device)
//! decides, and a stale page-cache page can never be mistaken for corruption or returned.

use std::cell::Cell;

use crate::error::StoreError;

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
/// again on a thread that may block). Only for reads: a transaction submitted inside `f` is
/// not affected by the mode, but a discarded result would hide its outcome.
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
}

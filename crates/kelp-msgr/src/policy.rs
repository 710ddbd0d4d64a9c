//! The fault-injection seam: every connection a [`crate::Messenger`] opens or accepts, and every
//! frame it writes or reads, is checked against its [`NetworkPolicy`] (if it has one).
//!
//! Share one policy between all the messengers of a test cluster and drive failures by entity
//! name:
//!
//! - [`NetworkPolicy::partition`]`("osd.1", "osd.2")`: frames between the two are silently
//!   dropped in both directions (calls time out, as over a real partition) and new connections
//!   between them are refused at dial time with a retryable `ConnectFailed`;
//! - [`NetworkPolicy::isolate`]`("osd.1")`: the same against everyone;
//! - [`NetworkPolicy::set_delay`]: every frame written between the two waits that long first
//!   (frames on a connection stay in order, so delays add up under load);
//! - [`NetworkPolicy::drop_connections`]`("osd.1")`: kills live connections of an entity now
//!   (pending calls fail with `ConnectionLost`; the next call redials);
//! - [`NetworkPolicy::heal`]: removes all partitions, isolations and delays.
//!
//! Invariant: with no rules set, the per-frame check is one relaxed atomic load; daemons
//! without a policy skip it entirely.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::session::Session;

/// What to do with a frame between two entities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Deliver,
    Drop,
    Delay(Duration),
}

/// Shared, clonable fault-injection rules (see the module docs).
///
/// ```
/// let policy = kelp_msgr::NetworkPolicy::new();
/// policy.partition("osd.1", "osd.2");
/// assert!(policy.is_partitioned("osd.2", "osd.1"));
/// policy.heal();
/// assert!(!policy.is_partitioned("osd.1", "osd.2"));
/// ```
#[derive(Clone, Default)]
pub struct NetworkPolicy {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// True when any partition, isolation or delay is set.
    active: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    partitions: HashSet<(String, String)>,
    isolated: HashSet<String>,
    delays: HashMap<(String, String), Duration>,
    addrs: HashMap<SocketAddr, String>,
    sessions: Vec<Weak<Session>>,
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl State {
    fn refresh(&self, active: &AtomicBool) {
        let on =
            !(self.partitions.is_empty() && self.isolated.is_empty() && self.delays.is_empty());
        active.store(on, Ordering::Relaxed);
    }
    fn blocked(&self, a: &str, b: &str) -> bool {
        self.isolated.contains(a)
            || self.isolated.contains(b)
            || self.partitions.contains(&pair(a, b))
    }
}

impl std::fmt::Debug for NetworkPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("NetworkPolicy")
            .field("partitions", &s.partitions)
            .field("isolated", &s.isolated)
            .field("delays", &s.delays)
            .finish()
    }
}

impl NetworkPolicy {
    /// A policy with no rules.
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the sets inconsistent (each update is a
        // single insert/remove), so a poisoned lock is still usable.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Cuts traffic between `a` and `b` (both directions) until [`heal`](Self::heal).
    pub fn partition(&self, a: &str, b: &str) {
        let mut s = self.state();
        s.partitions.insert(pair(a, b));
        s.refresh(&self.inner.active);
        tracing::info!(a, b, "network policy: partition");
    }

    /// Cuts traffic between `entity` and everyone until [`heal`](Self::heal).
    pub fn isolate(&self, entity: &str) {
        let mut s = self.state();
        s.isolated.insert(entity.to_string());
        s.refresh(&self.inner.active);
        tracing::info!(entity, "network policy: isolate");
    }

    /// Delays every frame written between `a` and `b` by `delay` (zero removes the rule).
    pub fn set_delay(&self, a: &str, b: &str, delay: Duration) {
        let mut s = self.state();
        if delay.is_zero() {
            s.delays.remove(&pair(a, b));
        } else {
            s.delays.insert(pair(a, b), delay);
        }
        s.refresh(&self.inner.active);
    }

    /// Removes every partition, isolation and delay.
    pub fn heal(&self) {
        let mut s = self.state();
        s.partitions.clear();
        s.isolated.clear();
        s.delays.clear();
        s.refresh(&self.inner.active);
        tracing::info!("network policy: heal");
    }

    /// True if traffic between `a` and `b` is currently cut.
    pub fn is_partitioned(&self, a: &str, b: &str) -> bool {
        self.state().blocked(a, b)
    }

    /// Closes every live connection that has `entity` at either end, as if the TCP connection
    /// had been reset. Returns how many connection ends were closed (a connection between two
    /// messengers sharing this policy counts twice).
    pub fn drop_connections(&self, entity: &str) -> usize {
        let victims: Vec<Arc<Session>> = {
            let mut s = self.state();
            s.sessions
                .retain(|w| w.upgrade().is_some_and(|s| !s.is_closed()));
            s.sessions
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|s| s.local_entity() == entity || s.peer_entity() == entity)
                .collect()
        };
        for s in &victims {
            crate::session::close_arc(s, "dropped by network policy".to_string());
        }
        victims.len()
    }

    pub(crate) fn register_addr(&self, addr: SocketAddr, entity: &str) {
        self.state().addrs.insert(addr, entity.to_string());
    }

    pub(crate) fn entity_at(&self, addr: SocketAddr) -> Option<String> {
        self.state().addrs.get(&addr).cloned()
    }

    pub(crate) fn register_session(&self, session: &Arc<Session>) {
        let mut s = self.state();
        s.sessions
            .retain(|w| w.upgrade().is_some_and(|s| !s.is_closed()));
        s.sessions.push(Arc::downgrade(session));
    }

    pub(crate) fn verdict(&self, local: &str, peer: &str) -> Verdict {
        if !self.inner.active.load(Ordering::Relaxed) {
            return Verdict::Deliver;
        }
        let s = self.state();
        if s.blocked(local, peer) {
            return Verdict::Drop;
        }
        match s.delays.get(&pair(local, peer)) {
            Some(d) => Verdict::Delay(*d),
            None => Verdict::Deliver,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let p = NetworkPolicy::new();
        assert_eq!(p.verdict("osd.1", "osd.2"), Verdict::Deliver);
        p.partition("osd.1", "osd.2");
        assert_eq!(p.verdict("osd.2", "osd.1"), Verdict::Drop);
        assert_eq!(p.verdict("osd.1", "osd.3"), Verdict::Deliver);
        p.isolate("osd.3");
        assert_eq!(p.verdict("mon.a", "osd.3"), Verdict::Drop);
        p.heal();
        assert_eq!(p.verdict("osd.1", "osd.2"), Verdict::Deliver);
        p.set_delay("a.1", "b.1", Duration::from_millis(5));
        assert_eq!(
            p.verdict("b.1", "a.1"),
            Verdict::Delay(Duration::from_millis(5))
        );
        p.set_delay("a.1", "b.1", Duration::ZERO);
        assert_eq!(p.verdict("b.1", "a.1"), Verdict::Deliver);
        assert!(!p.inner.active.load(Ordering::Relaxed));
    }
}

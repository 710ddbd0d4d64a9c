//! A PG as this OSD holds it: its log, whether and for whom it is active, its write set and
//! members left behind, the writes in flight, and what holds writes back (a scrub chunk, a
//! recovery hand-over). Shared by the client-op path (`service`), peering and recovery
//! (`recovery`), scrub (`scrub`), the statistics (`stats`) and the seam between them (`host`);
//! it depends on none of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use kelp_proto::ObjectLocator;
use tokio::sync::{Notify, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::pglog::PgMeta;

/// What the stats report about a PG's background recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryProgress {
    /// Backfill (a full walk) rather than log recovery.
    pub backfill: bool,
    /// Waiting for an `osd_max_backfills` slot.
    pub waiting: bool,
    /// Objects left to copy for the member being recovered now, plus every object of the acting
    /// members still waiting their turn (degraded copies).
    pub degraded: u64,
}

/// A PG as this OSD holds it.
#[derive(Debug)]
pub(crate) struct PgState {
    pub(crate) meta: PgMeta,
    /// The acting set this OSD has peered the PG for as its primary; client ops are served
    /// only while the current acting set is this one.
    pub(crate) active: Option<Vec<i32>>,
    /// Replicas that failed to commit a write this OSD applied as primary. While any of them is
    /// still in the acting set the PG refuses writes (an ack would claim a write is on every
    /// replica when it is not); a map that takes them out unblocks it, and recovery brings
    /// them back.
    pub(crate) failed_replicas: Vec<i32>,
    /// The up set the PG was peered with: its members outside the acting set (`pg_temp`) are
    /// backfill targets.
    pub(crate) peered_up: Vec<i32>,
    /// The members besides this primary that get the PG's writes: the acting members that are
    /// in sync, and backfill targets once they have caught up.
    pub(crate) write_to: Vec<i32>,
    /// Members (acting or backfill targets) not yet in sync: they get no writes until
    /// background recovery has brought them up to date, or, while `norecover`/`nobackfill`
    /// pauses their recovery, until the PG peers again (the PG is degraded meanwhile).
    pub(crate) left_behind: Vec<i32>,
    /// Erasure-coded pools: members left behind whose objects are whole shards of another
    /// position (CRUSH moved them): reads use them for the shard each object says it is, until
    /// their backfill rewrites it.
    pub(crate) donors: Vec<i32>,
    /// `(norecover, nobackfill)` when the PG was activated: when they change and members were
    /// left behind, the PG peers again.
    pub(crate) recovery_flags: crate::peering_machine::RecoveryFlags,
    /// Bumped whenever the PG is activated or deactivated: background recovery started for one
    /// peering stops once it sees another.
    pub(crate) interval: u64,
    /// Set by background recovery while it hands a member the PG's last writes: client writes
    /// wait (briefly) so the member joins the write set at an exact version.
    pub(crate) recovery_block: bool,
    /// Background recovery's progress (for the stats), while it runs or waits.
    pub(crate) recovery: Option<RecoveryProgress>,
    /// Writes submitted to the store here (readable) whose outcome is not settled yet: not yet
    /// durable here or, on the primary, not yet answered by every replica. Version → object.
    pub(crate) in_flight: BTreeMap<u64, ObjectLocator>,
    /// Woken whenever a write settles or the log advances.
    pub(crate) changed: Arc<Notify>,
    /// Set while the primary scrubs a chunk: client writes to objects in it wait.
    pub(crate) scrub_block: Option<crate::scrub_map::ScrubBlock>,
    /// Why peering cannot go active (`down`, `incomplete`), while it waits.
    pub(crate) blocked: Option<crate::peering_machine::PeeringBlocked>,
    /// Objects background recovery could not copy because every in-sync copy is unreadable
    /// (`(namespace, name)`); reported as unfound until a recovery round copies them.
    pub(crate) unfound: std::collections::BTreeSet<(String, String)>,
    /// The map epoch of the activation record the monitors hold for this PG's current
    /// interval (members joining the write set are recorded under it).
    pub(crate) record_epoch: u32,
}

impl PgState {
    /// A PG just opened from (or created in) the store: not active, nothing in flight.
    pub(crate) fn new(meta: PgMeta) -> Self {
        PgState {
            meta,
            active: None,
            failed_replicas: Vec::new(),
            peered_up: Vec::new(),
            write_to: Vec::new(),
            left_behind: Vec::new(),
            donors: Vec::new(),
            recovery_flags: Default::default(),
            interval: 0,
            recovery_block: false,
            recovery: None,
            in_flight: BTreeMap::new(),
            changed: Arc::new(Notify::new()),
            scrub_block: None,
            blocked: None,
            unfound: Default::default(),
            record_epoch: 0,
        }
    }

    pub(crate) fn in_flight_on(&self, object: &ObjectLocator) -> bool {
        self.in_flight.values().any(|o| o == object)
    }

    /// Whether a write to the object named `namespace`/`name` is in flight.
    pub(crate) fn in_flight_named(&self, namespace: &str, name: &str) -> bool {
        self.in_flight
            .values()
            .any(|o| o.name == name && o.namespace == namespace)
    }

    /// Stops serving the PG (until it is peered again) and ends its background recovery.
    pub(crate) fn deactivate(&mut self) {
        self.active = None;
        self.blocked = None;
        self.donors.clear();
        self.unfound.clear();
        self.interval += 1;
        self.recovery = None;
        if std::mem::take(&mut self.recovery_block) {
            self.changed.notify_waiters();
        }
    }
}

pub(crate) type PgHandle = Arc<RwLock<PgState>>;

/// The PG's write lock, once no write of the PG is in flight (peering and recovery work on
/// settled histories only).
pub(crate) async fn settled_write(pg: &PgHandle) -> RwLockWriteGuard<'_, PgState> {
    loop {
        let state = pg.write().await;
        if state.in_flight.is_empty() {
            return state;
        }
        let changed = state.changed.clone();
        let settled = changed.notified();
        drop(state);
        settled.await;
    }
}

/// The PG's read lock, once no write of the PG is in flight.
pub(crate) async fn settled_read(pg: &PgHandle) -> RwLockReadGuard<'_, PgState> {
    loop {
        let state = pg.read().await;
        if state.in_flight.is_empty() {
            return state;
        }
        let changed = state.changed.clone();
        let settled = changed.notified();
        drop(state);
        settled.await;
    }
}

/// Marks a write of a PG as in flight until `settle`; if the handler is dropped before that
/// (a panic, a cancelled task), the entry is still removed, so no reader or peering waits on
/// it forever.
pub(crate) struct InFlight {
    pg: Option<PgHandle>,
    version: u64,
}

impl InFlight {
    pub(crate) fn new(pg: PgHandle, version: u64) -> Self {
        InFlight {
            pg: Some(pg),
            version,
        }
    }

    /// Removes the entry (the caller holds the PG's write lock) and wakes the waiters.
    pub(crate) fn settle(mut self, state: &mut PgState) {
        self.pg = None;
        state.in_flight.remove(&self.version);
        state.changed.notify_waiters();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(pg) = self.pg.take() else { return };
        let version = self.version;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut state = pg.write().await;
                state.in_flight.remove(&version);
                state.changed.notify_waiters();
            });
        }
    }
}

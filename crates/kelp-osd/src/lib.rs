//! The OSD: serves the placement groups it holds from its local object store.
//!
//! Layers inside the crate, pure first:
//! * `exec` turns a client's compound op into one store transaction (or a read), guards
//!   checked first, so that the op applies completely or not at all;
//! * `pglog` keeps each PG's log (`(epoch, version)` per write) in the same transaction as the
//!   data, which is what peering and recovery compare later;
//! * `peering` plans how every member reaches the authoritative history, and
//!   `peering_machine` makes the rest of peering's decisions as a state machine without I/O
//!   (`recovery` performs its actions);
//! * `admission` decides whether a client op is served, and what a replica's failure means;
//! * `service` handles client ops, replica writes and map changes, with the network behind the
//!   `Peers` trait; it owns the OSD's state and implements the narrow interfaces (`host`) through
//!   which `recovery` and `scrub` reach it, so they never depend on it;
//! * `error` is the crate's error type (`OsdError`), which says whether a failure is worth
//!   retrying;
//! * `scrub_map` builds and compares scrub maps (pure comparison, blocking store reads), and
//!   `scrub` runs scrubs and repairs as the PG's primary;
//! * `watch` keeps the watchers of the primary's objects and the notifies in progress (a pure
//!   table plus the glue that pushes events), and says which clients are fenced;
//! * `snapset` holds the self-managed snapshot decisions (pure), `snaps` the primary's
//!   snapshot I/O around them, and `snap_trim` the worker that trims removed snapshots;
//! * `pg_removal` holds the queue of deleted pools' PGs and the steps that delete their
//!   collections, and `pg_remover` the throttled background worker that runs them, so that
//!   `pool rm` frees the space.

pub mod admission;
pub mod daemon;
pub mod device_class;
pub mod ec;
pub mod ec_io;
pub mod error;
pub mod exec;
pub mod heartbeat;
pub mod host;
pub mod metrics;
pub mod net;
pub mod object_state;
pub mod peering;
pub mod peering_machine;
pub(crate) mod pg;
pub mod pg_removal;
pub mod pg_remover;
pub mod pglog;
pub mod recovery;
pub mod recovery_throttle;
pub mod scrub;
pub mod scrub_map;
pub mod service;
pub mod snap_trim;
pub mod snaps;
pub mod snapset;
pub mod stats;
pub mod watch;

pub use error::OsdError;
pub use exec::{ExecError, Executed, Limits, Stamp, StatDelta, execute, object_id};
pub use host::Peers;
pub use pglog::{LogEntry, PgInfo, PgMeta};
pub use scrub::ScrubConfig;
pub use service::{ActivationRequest, OsdConfig, OsdService};

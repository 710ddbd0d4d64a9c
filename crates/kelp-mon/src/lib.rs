//! Kelp monitors: the authoritative cluster state (OSD map with incrementals, central config,
//! auth keys, monitor map) replicated in an `openraft` log, served over kelp-msgr.
//!
//! Why it is built this way:
//! - the Raft log holds requests ([`MonEntry`]) and every monitor applies them with the same
//!   deterministic function ([`MonState::apply`], which calls the pure `kelp-maps` decisions),
//!   so all monitors compute identical maps and there is no proposer race;
//! - the vote, log, committed index and snapshots are durable in one redb database per monitor
//!   ([`store`]); a vote or a log append is fsynced before openraft is told it is done;
//! - the daemon ([`Monitor`]) is I/O around that core: Raft traffic, commands, subscriptions
//!   with pushed incrementals, and the leader's OSD session watch.
//!
//! [`client::MonClient`] is the client side (it depends only on kelp-msgr, kelp-proto and
//! kelp-maps so it can move to kelp-client). The design is written down in `docs/MONITOR.md`.

pub mod central_config;
pub mod client;
pub mod cluster_log;
mod error;
pub mod liveness;
pub mod mds_liveness;
pub mod metrics;
pub mod mgrmap;
pub mod monitor;
pub mod network;
pub mod pg_history;
pub mod pgmap;
pub mod state;
pub mod store;

pub use client::{MapSubscription, MonClient, MonClientError};
pub use error::MonError;
pub use monitor::{MkfsOptions, MonConfig, Monitor, mkfs};
pub use state::{InitSpec, MonEntry, MonInfo, MonState};

/// Raft node ids: a monitor's 1-based position in the name-sorted monitor map (fixed at mkfs).
pub type NodeId = u64;

use std::io::Cursor;

openraft::declare_raft_types!(
    /// openraft's type configuration for the monitors: entries are [`MonEntry`], results are
    /// the [`kelp_proto::MonReply`] the proposer gets back.
    pub TypeConfig:
        D = MonEntry,
        R = kelp_proto::MonReply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
);

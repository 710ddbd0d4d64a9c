//! Watch/notify between clients and a PG's primary (librados `watch2`/`notify2`).
//!
//! A client watches an object by registering a cookie with the object's primary
//! (`WatchOp::Watch`); the primary keeps its watchers in memory and pushes every notify on the
//! object to each of them (`WatchEvent` on `OSD_WATCH_EVENT`, over the connection the watch was
//! last registered or pinged on). Watchers acknowledge with `NotifyAck` (with a reply payload);
//! the notifier's `Notify` request is answered once every watcher acknowledged, or at its
//! timeout with the ones that did not. Payloads ride in the frame's data segment.

use kelp_types::PgId;
use serde::{Deserialize, Serialize};

use crate::osd::{ErrorCode, ObjectLocator};

/// Client → primary OSD (`OSD_WATCH`): one watch operation on one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchRequest {
    pub reqid: u64,
    /// The client's OSD map epoch (as in `OsdOp`).
    pub epoch: u32,
    pub pg: PgId,
    pub object: ObjectLocator,
    /// The client instance (blocklisted instances are refused, as for `OsdOp`).
    pub instance: String,
    pub op: WatchOp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchOp {
    /// Registers the watch `cookie` of this instance (again: after a failover or reconnect
    /// the client re-registers, which also moves pushes to the connection it came on and
    /// resends the notifies it has not acknowledged). The object must exist.
    Watch { cookie: u64 },
    /// Keeps the watch alive; answered `NotWatching` if this OSD does not have it.
    Ping { cookie: u64 },
    /// Ends the watch.
    Unwatch { cookie: u64 },
    /// Notifies every watcher of the object with the data segment as payload and waits for
    /// their acknowledgements, at most `timeout_ms`. The object must exist.
    Notify { timeout_ms: u64 },
    /// Acknowledges notification `notify_id` for watch `cookie`; the data segment is the
    /// reply payload given to the notifier.
    NotifyAck { notify_id: u64, cookie: u64 },
    /// The object's current watchers.
    ListWatchers,
}

/// One watch: the client instance and its cookie.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WatcherId {
    pub instance: String,
    pub cookie: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchReply {
    /// `None` on success.
    pub error: Option<(ErrorCode, String)>,
    /// The OSD's map epoch.
    pub epoch: u32,
    pub result: WatchResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchResult {
    None,
    /// `Watch`, `Ping`: registered; the OSD drops a watch not pinged for `timeout_ms`
    /// (`osd_client_watch_timeout`).
    Watching {
        timeout_ms: u64,
    },
    /// `Ping`: this OSD has no such watch (it timed out, or this OSD became the primary
    /// after the watch was registered).
    NotWatching,
    /// `Notify`: the watchers that acknowledged, each with the length of its reply (the
    /// replies are the reply's data segment, in order), and those that did not in time.
    Notified {
        acks: Vec<(WatcherId, u64)>,
        timed_out: Vec<WatcherId>,
    },
    /// `ListWatchers`.
    Watchers(Vec<WatcherId>),
}

/// Primary OSD → watching client (`OSD_WATCH_EVENT`, one-way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub cookie: u64,
    pub object: ObjectLocator,
    pub kind: WatchEventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WatchEventKind {
    /// A notification; its payload is the data segment.
    Notify { notify_id: u64, notifier: String },
    /// The OSD dropped the watch (not pinged within the watch timeout, or the instance was
    /// blocklisted).
    Error { code: ErrorCode, message: String },
}

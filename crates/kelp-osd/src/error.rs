//! The OSD's one error type for its internal work: talking to other OSDs (the `Peers` seam),
//! peering, recovery, scrub and repair.
//!
//! Client ops keep their own `ExecError` (a protocol `ErrorCode` plus a message), because that
//! is what goes back on the wire; `OsdError` is what the OSD's own machinery acts on. The one
//! decision most callers need is [`OsdError::retryable`]: a retryable error (a peer that did
//! not answer, a PG that was busy or re-peered, a map that moved on) is tried again on the
//! next round; a fatal one (a peer that speaks another protocol, a store that refuses a
//! transaction as malformed) is reported and not retried by the same path.

use std::net::SocketAddr;

use kelp_msgr::MsgrError;
use kelp_proto::ErrorCode;
use kelp_store::StoreError;
use kelp_types::PgId;

/// Why an OSD-internal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OsdError {
    /// The messenger failed to deliver a request to another OSD or to get its reply.
    #[error("osd.{osd} at {addr}: {source}")]
    Msgr {
        osd: i32,
        addr: SocketAddr,
        #[source]
        source: MsgrError,
    },
    /// Another OSD cannot be reached at all: no address in the map, a lost connection, or it
    /// left the PG's sets while a request to it was outstanding.
    #[error("osd.{osd} is not reachable: {reason}")]
    PeerUnreachable { osd: i32, reason: String },
    /// Another OSD's reply did not decode.
    #[error("osd.{osd}: {source}")]
    Decode {
        osd: i32,
        #[source]
        source: kelp_proto::ProtoError,
    },
    /// Another OSD answered with an error.
    #[error("osd.{osd}: {message}")]
    Remote {
        osd: i32,
        code: ErrorCode,
        message: String,
    },
    /// This OSD is not (or no longer) the acting primary of the PG.
    #[error("osd.{osd} is not the primary of PG {pg} at epoch {epoch}")]
    NotPrimary { pg: PgId, epoch: u32, osd: i32 },
    /// The work was started for an older map or interval than the one in force now.
    #[error("PG {pg}: {what} (epoch {epoch}, now {current})")]
    StaleEpoch {
        pg: PgId,
        epoch: u32,
        current: u32,
        what: &'static str,
    },
    /// The PG is not open on this OSD.
    #[error("PG {pg} is not open on this OSD")]
    PgNotOpen { pg: PgId },
    /// The PG cannot serve right now (peering, not active, re-peered during the work).
    #[error("PG {pg}: {reason}")]
    PgBusy { pg: PgId, reason: String },
    /// Fewer than `min_size` members would be in sync: the PG waits.
    #[error(
        "recovery paused (norecover/nobackfill) and only {in_sync} of {acting} members are up \
         to date, fewer than min_size {min_size}; waiting"
    )]
    BelowMinSize {
        pg: PgId,
        in_sync: usize,
        acting: usize,
        min_size: usize,
    },
    /// Objects that no member in sync can deliver readable.
    #[error(
        "{} object(s) unfound (every in-sync copy unreadable), e.g. '{}'",
        objects.len(),
        objects.first().map_or("", |o| o.1.as_str())
    )]
    Unfound { objects: Vec<(String, String)> },
    /// No member in sync could deliver a readable copy of one object.
    #[error("no replica has a good copy ({})", tried.join("; "))]
    NoGoodCopy { object: String, tried: Vec<String> },
    /// The local object store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The link to the monitors is gone (the daemon is stopping).
    #[error("the monitor link is closed")]
    MonLinkClosed,
    /// The monitors refused or could not record something.
    #[error("monitors: {reason}")]
    Monitor { reason: String },
    /// The PG no longer exists in the map.
    #[error("PG {pg} no longer exists")]
    NoSuchPg { pg: PgId },
    /// A background task (blocking store work) panicked or was cancelled.
    #[error("{what} task failed: {reason}")]
    Task { what: &'static str, reason: String },
    /// Something this build cannot do or a request that makes no sense (not retried).
    #[error("{reason}")]
    Unsupported { reason: String },
    /// A persistent record did not encode or decode.
    #[error("encoding {what}: {reason}")]
    Encoding { what: &'static str, reason: String },
}

impl OsdError {
    /// Whether trying the same thing again later may succeed (a peer may come back, a PG may
    /// settle, a newer map may arrive); `false` means retrying the same request is pointless.
    pub fn retryable(&self) -> bool {
        match self {
            OsdError::Msgr { source, .. } => source.is_retryable(),
            OsdError::PeerUnreachable { .. }
            | OsdError::StaleEpoch { .. }
            | OsdError::PgNotOpen { .. }
            | OsdError::PgBusy { .. }
            | OsdError::BelowMinSize { .. }
            | OsdError::Unfound { .. }
            | OsdError::NoGoodCopy { .. }
            | OsdError::Monitor { .. }
            | OsdError::NotPrimary { .. }
            | OsdError::Task { .. } => true,
            OsdError::Remote { code, .. } => !matches!(code, ErrorCode::Invalid),
            OsdError::Store(e) => !matches!(
                e,
                StoreError::InvalidArgument { .. }
                    | StoreError::BadSuperblock { .. }
                    | StoreError::UnsupportedVersion { .. }
            ),
            OsdError::Decode { .. }
            | OsdError::MonLinkClosed
            | OsdError::NoSuchPg { .. }
            | OsdError::Unsupported { .. }
            | OsdError::Encoding { .. } => false,
        }
    }

    /// The opposite of [`OsdError::retryable`].
    pub fn is_fatal(&self) -> bool {
        !self.retryable()
    }

    /// The protocol code this error is reported with when it has to cross the wire (a
    /// member's `PgSyncReply`, a scrub map reply).
    pub fn code(&self) -> ErrorCode {
        match self {
            OsdError::Remote { code, .. } => *code,
            OsdError::NotPrimary { .. } | OsdError::PgNotOpen { .. } => ErrorCode::Misdirected,
            OsdError::PgBusy { .. } | OsdError::BelowMinSize { .. } => ErrorCode::Inactive,
            OsdError::Unfound { .. } | OsdError::NoGoodCopy { .. } => ErrorCode::Corrupt,
            OsdError::Store(StoreError::ChecksumMismatch { .. }) => ErrorCode::Corrupt,
            OsdError::Store(StoreError::NoSpace { .. }) => ErrorCode::Full,
            OsdError::NoSuchPg { .. } => ErrorCode::NoSuchPool,
            OsdError::Unsupported { .. } => ErrorCode::Invalid,
            _ => ErrorCode::Io,
        }
    }

    /// The OSD this error is about, when it is about another OSD.
    pub fn peer(&self) -> Option<i32> {
        match self {
            OsdError::Msgr { osd, .. }
            | OsdError::PeerUnreachable { osd, .. }
            | OsdError::Decode { osd, .. }
            | OsdError::Remote { osd, .. } => Some(*osd),
            _ => None,
        }
    }

    /// An error reply (`code`, `message`) from `osd` turned into an error.
    pub fn remote(osd: i32, (code, message): (ErrorCode, String)) -> Self {
        OsdError::Remote { osd, code, message }
    }

    /// A failed `spawn_blocking` (panic or cancellation).
    pub(crate) fn task(what: &'static str, e: tokio::task::JoinError) -> Self {
        OsdError::Task {
            what,
            reason: e.to_string(),
        }
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = OsdError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_and_fatal_are_told_apart_in_the_type() {
        let gone = OsdError::PeerUnreachable {
            osd: 3,
            reason: "no address".into(),
        };
        assert!(gone.retryable() && !gone.is_fatal());
        assert_eq!(gone.peer(), Some(3));
        let timeout = OsdError::Msgr {
            osd: 1,
            addr: "127.0.0.1:1".parse().unwrap(),
            source: MsgrError::Timeout {
                peer: "osd.1".into(),
                msg_type: 1,
                after: std::time::Duration::from_secs(1),
            },
        };
        assert!(timeout.retryable());
        let version = OsdError::Msgr {
            osd: 1,
            addr: "127.0.0.1:1".parse().unwrap(),
            source: MsgrError::VersionMismatch {
                peer: "osd.1".into(),
                ours: 1,
                theirs: 2,
            },
        };
        assert!(version.is_fatal());
        assert!(OsdError::MonLinkClosed.is_fatal());
        let bad = OsdError::Store(StoreError::InvalidArgument { reason: "x".into() });
        assert!(bad.is_fatal());
        assert_eq!(
            OsdError::Unfound {
                objects: vec![(String::new(), "a".into())]
            }
            .code(),
            ErrorCode::Corrupt
        );
    }
}

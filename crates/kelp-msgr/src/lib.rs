//! The Kelp messenger: the one transport every Kelp daemon and client speaks.
//!
//! Why it exists: monitors, OSDs, clients and the monitors' Raft traffic all need the same
//! things from the network — framed messages with integrity checks, mutual authentication,
//! many concurrent requests over one connection, server push, and failures that are reported
//! promptly and typed so callers can retry. This crate provides exactly that and nothing about
//! what the messages mean: it moves typed frames (`msg_type`, `tid`, a `meta` segment that the
//! protocol layer encodes, and a bulk `data` segment carried as [`bytes::Bytes`] without
//! copies). Message semantics live in `kelp-proto`.
//!
//! Layers, bottom up:
//!
//! - [`frame`]: the fixed 28-byte header, crc32c, size limits, zero-copy segment reads;
//! - [`handshake`]: version check and mutual HMAC-SHA256 challenge-response ([`auth`] holds
//!   entities, secrets and keyrings);
//! - `session`: one authenticated connection, symmetric: both ends call, answer and push;
//!   calls are multiplexed by tid; closing fails every pending call at once;
//! - [`Messenger`]: listening, dialling, one cached [`Connection`] per peer address, redial with
//!   backoff;
//! - [`NetworkPolicy`]: the seam through which tests delay, drop and partition traffic.
//!
//! The wire format, handshake, versioning rules and failure semantics are specified in
//! `docs/MESSENGER.md`.
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use kelp_msgr::*;
//!
//! struct Echo;
//! #[async_trait::async_trait]
//! impl Dispatcher for Echo {
//!     async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
//!         Ok(Response::new(req.msg_type, req.meta, req.data))
//!     }
//! }
//!
//! # async fn f() -> Result<(), MsgrError> {
//! let key = generate_secret();
//! let mut keyring = Keyring::new();
//! keyring.insert("client.admin", key.clone())?;
//!
//! let server = Messenger::builder("mon.a")
//!     .keys(Arc::new(keyring))
//!     .dispatcher(Arc::new(Echo))
//!     .build()?;
//! let addr = server.bind("127.0.0.1:0".parse().unwrap()).await?;
//!
//! let client = Messenger::builder("client.admin").secret(key).build()?;
//! let conn = client.connect(addr).await?;
//! let resp = conn.call(1, &b"hello"[..], bytes::Bytes::new(), Duration::from_secs(5)).await?;
//! assert_eq!(&resp.meta[..], b"hello");
//! # Ok(()) }
//! ```

pub mod auth;
mod config;
mod error;
pub mod frame;
pub mod handshake;
mod messenger;
mod policy;
mod segpool;
mod session;

pub use auth::{KeyLookup, Keyring, ReloadingKeyring, Secret, generate_secret, validate_entity};
pub use config::MsgrConfig;
pub use error::{AuthFailure, FrameError, MsgrError, RemoteError, Result};
pub use messenger::{
    ChannelDispatcher, Connection, Messenger, MessengerBuilder, MsgrStats, PEER_TYPES, PeerStats,
    peer_type,
};
pub use policy::NetworkPolicy;
pub use session::{Direction, Dispatcher, Message, Peer, Request, Response};

/// Error codes reserved by the messenger in error replies (`RemoteError::code`). The protocol
/// layer owns every code below [`code::RESERVED_BASE`].
pub mod code {
    /// Codes at or above this are the messenger's.
    pub const RESERVED_BASE: u32 = 0xFFFF_0000;
    /// The endpoint has no dispatcher, or its dispatcher does not handle requests.
    pub const NO_HANDLER: u32 = 0xFFFF_0001;
    /// The request handler panicked.
    pub const HANDLER_PANICKED: u32 = 0xFFFF_0002;
    /// The handler's response exceeded the configured segment limits.
    pub const RESPONSE_TOO_LARGE: u32 = 0xFFFF_0003;
    /// The peer sent an error reply too short to hold a code.
    pub const MALFORMED_ERROR: u32 = 0xFFFF_0004;
}

/// The counters of `msgrs` summed, as the metrics tables take them (`kelp_msgr_*` on every
/// daemon's `/metrics`): a daemon exports its own messenger's and its RADOS client's.
pub fn metrics_counts(msgrs: &[Messenger]) -> kelp_metrics::MsgrCounts {
    let mut s = MsgrStats::default();
    let mut peers = 0;
    for m in msgrs {
        s.add(&m.stats());
        peers += m.peers().len() as u64;
    }
    kelp_metrics::MsgrCounts {
        peers,
        connections_accepted: s.connections_accepted,
        connections_dialed: s.connections_dialed,
        handshake_failures: s.handshake_failures,
        auth_failures: s.auth_failures,
        frame_errors: s.frame_errors,
        frames_sent: s.frames_sent,
        flushes: s.flushes,
        connect_failures: s.connect_failures,
        by_peer: PEER_TYPES
            .iter()
            .zip(&s.by_peer)
            .map(|(peer, p)| kelp_metrics::MsgrPeerCounts {
                peer,
                bytes_sent: p.bytes_sent,
                bytes_received: p.bytes_received,
                messages_sent: p.messages_sent,
                messages_received: p.messages_received,
                connections_open: p.connections_open,
                connections_closed: p.connections_closed,
                connection_errors: p.connection_errors,
                reconnects: p.reconnects,
            })
            .collect(),
    }
}

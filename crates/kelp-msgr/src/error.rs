//! The messenger's one error type.
//!
//! Callers mostly need one decision from an error: *try again* (the peer or the path to it may
//! come back: [`MsgrError::is_retryable`]) or *give up and report* (authentication, version,
//! protocol or local misuse). Variants carry the peer and the message type so that a log line is
//! enough to find the failing exchange.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Why a frame read from the wire was refused. Any of these closes the connection it came on.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The first two bytes were not the frame magic `KL`.
    #[error("bad frame magic {found:02x?} (expected \"KL\")")]
    BadMagic { found: [u8; 2] },
    /// A frame format this build does not speak.
    #[error("unsupported frame version {found} (this build speaks {supported})")]
    UnsupportedVersion { found: u8, supported: u8 },
    /// The flags byte is not one of the defined combinations.
    #[error("invalid frame flags {flags:#04x}")]
    BadFlags { flags: u8 },
    /// The reserved header field was not zero.
    #[error("reserved frame header field is {value:#06x}, must be 0")]
    Reserved { value: u16 },
    /// The meta segment is larger than `max_meta_len`.
    #[error("meta segment of {len} bytes exceeds the limit of {max}")]
    MetaTooLarge { len: u32, max: u32 },
    /// The data segment is larger than `max_data_len`.
    #[error("data segment of {len} bytes exceeds the limit of {max}")]
    DataTooLarge { len: u32, max: u32 },
    /// The stream ended inside a frame.
    #[error("connection closed inside a frame ({what}: got {got} of {expected} bytes)")]
    Truncated {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// The body of a frame did not arrive within `frame_body_timeout`.
    #[error("frame body not received within {after:?}")]
    BodyTimeout { after: Duration },
    /// The checksum over header, meta and data does not match.
    #[error("frame crc32c mismatch: header says {expected:#010x}, computed {computed:#010x}")]
    BadCrc { expected: u32, computed: u32 },
    /// The socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Why authentication failed. Never says more than the peer is entitled to know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    /// The server has no key for the entity the client claims to be.
    #[error("unknown entity")]
    UnknownEntity,
    /// The client's proof did not verify (wrong key, or a replayed answer).
    #[error("client proof did not verify (wrong key or replay)")]
    BadClientProof,
    /// The server's proof did not verify: it does not hold our key.
    #[error("server proof did not verify (server does not hold our key)")]
    BadServerProof,
    /// The peer refused us; its reason as it sent it.
    #[error("rejected by peer: {reason}")]
    Rejected { reason: String },
}

/// An error reply produced by the remote handler (or by the remote messenger on its behalf).
///
/// `code` is owned by the protocol layer above (kelp-proto) except for the reserved range in
/// [`crate::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("remote error {code}: {message}")]
pub struct RemoteError {
    pub code: u32,
    pub message: String,
}

impl RemoteError {
    /// An error reply with an application code and a human-readable message.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Everything that can go wrong in the messenger.
#[derive(Debug, thiserror::Error)]
pub enum MsgrError {
    /// Could not open a connection (refused, unreachable, partitioned by policy, handshake I/O).
    #[error("cannot connect to {addr}: {reason}")]
    ConnectFailed { addr: SocketAddr, reason: String },
    /// The connection died; every call pending on it fails with this.
    #[error("connection to {peer} lost: {reason}")]
    ConnectionLost { peer: String, reason: String },
    /// No reply within the caller's deadline.
    #[error("call to {peer} (msg_type {msg_type}) timed out after {after:?}")]
    Timeout {
        peer: String,
        msg_type: u16,
        after: Duration,
    },
    /// Authentication failed (unknown entity, wrong key, replay). Not retryable.
    #[error("authentication with {peer} failed: {failure}")]
    AuthFailed { peer: String, failure: AuthFailure },
    /// The two sides speak different handshake protocol versions.
    #[error("protocol version mismatch with {peer}: we speak {ours}, peer speaks {theirs}")]
    VersionMismatch {
        peer: String,
        ours: u16,
        theirs: u16,
    },
    /// The peer violated the handshake protocol (garbage, wrong message, timeout).
    #[error("handshake with {peer} failed: {reason}")]
    Handshake { peer: String, reason: String },
    /// A malformed frame from the peer; the connection was closed.
    #[error("bad frame from {peer}: {source}")]
    Frame {
        peer: String,
        #[source]
        source: FrameError,
    },
    /// A frame we were asked to send exceeds the configured limits.
    #[error("outgoing {segment} segment of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        segment: &'static str,
        len: usize,
        max: u32,
    },
    /// The remote handler answered with an error.
    #[error("{peer} answered msg_type {msg_type} with {error}")]
    Remote {
        peer: String,
        msg_type: u16,
        error: RemoteError,
    },
    /// An entity name is not of the form `type.id`.
    #[error("invalid entity name {name:?}: {reason}")]
    InvalidEntity { name: String, reason: &'static str },
    /// A keyring file could not be read, parsed or written.
    #[error("keyring {path}: {reason}")]
    Keyring { path: PathBuf, reason: String },
    /// Could not listen on an address.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The messenger is misconfigured for the requested operation.
    #[error("messenger misconfigured: {0}")]
    Config(&'static str),
    /// The messenger was shut down.
    #[error("messenger is shut down")]
    Shutdown,
}

impl MsgrError {
    /// True when the same operation may succeed if tried again later (possibly on a new
    /// connection): connect failures, lost connections and timeouts. Authentication, version,
    /// protocol, size and remote-handler errors are not retryable at this layer (a remote
    /// handler's error may be retryable by the protocol's own rules; see its code).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            MsgrError::ConnectFailed { .. }
                | MsgrError::ConnectionLost { .. }
                | MsgrError::Timeout { .. }
        )
    }
}

/// Shorthand for results in this crate.
pub type Result<T, E = MsgrError> = std::result::Result<T, E>;

//! What the server exports: the device and export-catalogue traits the protocol code calls.
//!
//! The server validates every request (bounds, lengths, flags, read-only) *before* it reaches a
//! device, so an implementation sees only requests that lie inside `[0, info().size)`, have a
//! non-zero length and, for reads and writes, a length of at most the advertised maximum block
//! size. It may still refuse anything with a [`DeviceError`]; the server maps that to an NBD
//! error number for the one request and keeps the connection.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

/// What a client is told about an export during the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size: u64,
    /// Advertise `NBD_FLAG_READ_ONLY`; writes, trims and write-zeroes get `EPERM`.
    pub read_only: bool,
    /// Advertise `NBD_FLAG_SEND_TRIM`.
    pub can_trim: bool,
    /// Offer the `base:allocation` metadata context (`NBD_CMD_BLOCK_STATUS`).
    pub block_status: bool,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN`: only if a flush (and a FUA write) on one
    /// connection covers writes completed on every connection to the same device.
    pub multi_conn: bool,
    /// `NBD_INFO_BLOCK_SIZE` minimum (a power of two, 1..=65536).
    pub min_block: u32,
    /// `NBD_INFO_BLOCK_SIZE` preferred (a power of two, at least `min_block`).
    pub preferred_block: u32,
    /// `NBD_INFO_BLOCK_SIZE` maximum: also the largest read or write the server accepts (the
    /// payload limit). The server may lower it to its own limit
    /// ([`ServerConfig::max_request_bytes`](crate::ServerConfig::max_request_bytes)).
    pub max_block: u32,
    /// Free text shown to clients (`NBD_INFO_DESCRIPTION`, `NBD_OPT_LIST`).
    pub description: String,
}

/// One run of bytes with the same allocation state, as `base:allocation` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Length in bytes (non-zero).
    pub len: u64,
    /// Not allocated in the backing store (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Known to read as zeros (`NBD_STATE_ZERO`).
    pub zero: bool,
}

/// Why a device refused one request. Mapped to an NBD error number at the protocol edge
/// ([`DeviceError::errno`]).
#[derive(thiserror::Error, Debug)]
pub enum DeviceError {
    /// The backing store failed (`EIO`).
    #[error("I/O error: {0}")]
    Io(String),
    /// No space left (`ENOSPC`).
    #[error("no space left on the device")]
    NoSpace,
    /// The device refuses writes (`EPERM`).
    #[error("the device is read-only")]
    ReadOnly,
    /// The request is not acceptable to the device (`EINVAL`).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The request is too large for the device (`EOVERFLOW`).
    #[error("request too large")]
    TooBig,
    /// The device is going away (`ESHUTDOWN`): the client should disconnect.
    #[error("shutting down: {0}")]
    Shutdown(String),
}

impl DeviceError {
    /// The NBD error number sent to the client.
    pub fn errno(&self) -> u32 {
        use crate::wire::errno;
        match self {
            DeviceError::Io(_) => errno::EIO,
            DeviceError::NoSpace => errno::ENOSPC,
            DeviceError::ReadOnly => errno::EPERM,
            DeviceError::Invalid(_) => errno::EINVAL,
            DeviceError::TooBig => errno::EOVERFLOW,
            DeviceError::Shutdown(_) => errno::ESHUTDOWN,
        }
    }
}

/// A block device the server exports. One instance may serve many connections at once
/// (`Exports::open` may return the same `Arc` each time), and requests of one connection run
/// concurrently.
///
/// Durability contract: a successful [`flush`](BlockDevice::flush) must make durable every
/// write, trim and write-zeroes this device has *completed* (returned from) before the flush
/// was called — on any connection, not just the caller's. A write with `fua = true` must be
/// durable when it returns. A device that cannot keep that promise across connections must
/// report `multi_conn: false`.
#[async_trait]
pub trait BlockDevice: Send + Sync + 'static {
    /// The export's description; read once per handshake.
    fn info(&self) -> ExportInfo;
    /// Reads exactly `len` bytes at `offset` (holes read as zeros).
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DeviceError>;
    /// Writes `data` at `offset`; with `fua`, durably before returning.
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), DeviceError>;
    /// Makes every completed write durable (see the trait's contract).
    async fn flush(&self) -> Result<(), DeviceError>;
    /// Discards `[offset, offset+len)`; afterwards the range may read as anything until
    /// rewritten (Kelp's devices read zeros).
    async fn trim(&self, offset: u64, len: u32) -> Result<(), DeviceError>;
    /// Makes `[offset, offset+len)` read as zeros; with `no_hole` the range must stay
    /// allocated, otherwise the device may punch a hole.
    async fn write_zeroes(&self, offset: u64, len: u32, no_hole: bool) -> Result<(), DeviceError>;
    /// Extents from `offset` covering at least a prefix of [offset, offset+len).
    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, DeviceError>;
}

/// Why an export could not be opened or listed.
#[derive(thiserror::Error, Debug)]
pub enum OpenError {
    /// No export of that name (`NBD_REP_ERR_UNKNOWN`).
    #[error("no export named {0:?}")]
    NotFound(String),
    /// It exists but cannot be opened now (`NBD_REP_ERR_POLICY`, with this text).
    #[error("export unavailable: {0}")]
    Unavailable(String),
    /// The name or request is malformed (`NBD_REP_ERR_INVALID`).
    #[error("invalid export request: {0}")]
    Invalid(String),
}

/// The catalogue of exports a server offers.
#[async_trait]
pub trait Exports: Send + Sync + 'static {
    /// Opens an export by name ("" = the default export, may be NotFound).
    async fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, OpenError>;
    /// The exports to list to clients: (name, description).
    async fn list(&self) -> Result<Vec<(String, String)>, OpenError>;
}

//! Kelp's NBD server: exports block devices over the Network Block Device protocol so that
//! ordinary clients (QEMU, libnbd's tools, the Linux kernel's `nbd-client`, fio) use them as
//! disks.
//!
//! The protocol code is generic over two traits: [`Exports`] (the catalogue, opening a device
//! by name) and [`BlockDevice`] (read, write, flush, trim, write-zeroes, block status). The
//! pieces, as in nbdkit's server, are kept apart:
//! - [`wire`]: pure encoding and decoding of headers and option payloads;
//! - [`validate`]: pure checking of every request before a device sees it;
//! - `handshake`: fixed-newstyle option haggling;
//! - `transmission`: per-connection reader, concurrent request tasks, one reply writer;
//! - `server`: listeners, connection limit, handshake timeout, orderly stop;
//! - [`mem`]: a sparse in-memory device and catalogue for tests.
//!
//! What is supported, the limits and the error mapping: `docs/NBD.md`.

mod device;
mod handshake;
pub mod mem;
pub mod metrics;
pub mod rbd;
mod server;
mod transmission;
pub mod validate;
pub mod wire;

pub use device::{BlockDevice, DeviceError, ExportInfo, Exports, Extent, OpenError};
pub use handshake::{
    BASE_ALLOCATION_ID, BlockSizes, MAX_OPTION_DATA, block_sizes, transmission_flags,
};
pub use mem::{MemDevice, MemExports, MemStats};
pub use metrics::NbdMetrics;
pub use rbd::{RbdDevice, RbdExports};
pub use server::{NbdServer, ServerConfig};
pub use transmission::{MAX_EXTENTS_PER_REPLY, descriptors, error_reply, read_reply};

/// Why a connection ended early. Internal to a connection (logged, never returned to the
/// embedding program): the server itself keeps running.
#[derive(thiserror::Error, Debug)]
pub enum ConnError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Header(#[from] wire::HeaderError),
    #[error("client flags {0:#x} are not supported")]
    ClientFlags(u32),
    #[error("option {option} carries {len} bytes, more than the server reads")]
    OptionTooLong { option: u32, len: u32 },
    #[error("NBD_OPT_EXPORT_NAME with a bad name: {0}")]
    BadExportName(wire::OptParseError),
    #[error("export {0:?} refused: {1}")]
    ExportRefused(String, OpenError),
    #[error("write of {0} bytes refused: too large to discard, closing")]
    OversizedWrite(u32),
}

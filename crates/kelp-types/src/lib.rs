//! Foundation types shared by every Kelp layer.
//!
//! This crate sits at the bottom of the dependency table in `docs/ARCHITECTURE.md`: it holds the
//! identifiers that every other layer passes around (OSD, pool and placement-group ids, map
//! epochs), small value types such as byte sizes, and the CRC-32C every layer checksums with. It has no I/O, no async and no knowledge of
//! any protocol, so that the pure algorithm crates can use it freely.

mod crc;
mod ids;
mod size;

pub use crc::{crc32c, crc32c_append};

pub use ids::{Epoch, OsdId, ParseIdError, PgId, PoolId};
pub use size::{ByteSize, ParseSizeError};

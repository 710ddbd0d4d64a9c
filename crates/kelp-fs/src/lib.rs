//! Kelp's file system: a metadata server (MDS) that keeps a POSIX namespace in a RADOS
//! metadata pool, and a FUSE client that reads and writes file data straight to a data pool.
//!
//! - [`types`]: the data model (inodes, dentries) and the versioned client <-> MDS protocol;
//! - [`core`]: the namespace as a pure state machine (operations in, replies and journal
//!   updates out; it asks for objects it has not loaded);
//! - [`journal`]: the metadata journal's encoding and object names;
//! - [`caps`]: capabilities (which client may cache what) as a pure state machine;
//! - [`locks`]: advisory locks (fcntl, flock) held by the MDS across clients;
//! - [`mds`]: the daemon around the core: RADOS I/O, the journal, checkpoints, the messenger;
//! - [`metrics`]: the MDS's Prometheus metrics (requests by operation, journal, capabilities);
//! - [`client`]: the MDS session and the file data path (striping over data objects);
//! - [`behind`]: the client's data writes in flight (write-behind under the exclusive
//!   capability);
//! - [`fuse`]: the thin FUSE adapter on `fuser`.
//!
//! See `docs/FILESYSTEM.md` for the metadata layout, the journal and what is POSIX.

pub mod behind;
pub mod caps;
pub mod client;
pub mod core;
mod error;
pub mod fuse;
pub mod journal;
pub mod locks;
pub mod mds;
pub mod metrics;
pub mod types;

pub use error::{FsError, Result};

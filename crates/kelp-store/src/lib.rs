//! `kelp-store`: the OSD-local object store.
//!
//! An OSD keeps its share of every placement group in a local object store. This crate defines
//! the interface ([`ObjectStore`]: collections, objects, atomic transactions with a durability
//! future, reads) and two implementations:
//!
//! - [`KelpStore`], the durable store: data in one large file with an extent allocator,
//!   metadata in an embedded LSM database, crc32c on every block, group commit and deferred
//!   small writes (design and crash-consistency argument in `docs/STORE.md`);
//! - [`MemStore`], an in-memory store with the same semantics, for fast tests.
//!
//! It depends on nothing network-related, so everything here is testable on one machine.
//!
//! Tests: `cargo test -p kelp-store` runs unit tests, the conformance suite (against both
//! stores), the crash test (30 SIGKILLs) and the failure tests in about 40 s, debug or release,
//! on the 2-vCPU development VM (the crash test is most of it); `KELP_CRASH_KILLS=200` runs the
//! long crash variant (about 2.5 min in release).

mod alloc;
pub mod bench;
mod codec;
mod config;
mod error;
mod fsck;
mod grow;
mod hotread;
mod kelpstore;
mod keys;
mod memstore;
pub mod nowait;
mod store;
mod superblock;
mod types;
mod wal;
pub mod workload;

pub use config::{MkfsOptions, StoreConfig};
pub use error::{Result, StoreError};
pub use fsck::{FsckProblem, FsckReport, fsck_dir};
pub use kelpstore::{KelpStore, mkfs};
pub use memstore::MemStore;
pub use store::{ObjectStore, StoreSpace, StoreStats};
pub use superblock::{FORMAT_VERSION, Superblock};
pub use types::{
    CollectionId, Commit, ListPage, ObjectId, ObjectStat, OmapPage, Op, SNAP_HEAD, Transaction,
};
pub use wal::tail_new_extents as wal_tail_new_extents;

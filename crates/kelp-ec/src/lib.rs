//! Erasure coding for Kelp: what an erasure-coded pool's objects look like on their shards.
//!
//! Pure code (no I/O, no async), used by the OSD's EC backend and by the monitors (profile
//! validation):
//!
//! - [`Profile`]: an erasure-code profile (`k`, `m`, `stripe_unit`, failure domain, device
//!   class) parsed from and printed as Ceph's `key=value` pairs.
//! - [`Layout`]: how one object's logical bytes map onto its `k` data shards (stripes of `k`
//!   chunks, each shard storing its chunk of every stripe contiguously) and how much each shard
//!   stores. The chunk size is chosen per object, so a small object costs about its own size
//!   times `(k+m)/k`, not a stripe unit per shard.
//! - [`Codec`]: Reed-Solomon encode, reconstruction from any `k` of `k+m` shards, and the parity
//!   delta of a partial-stripe write, on the SIMD `reed-solomon-simd` library (GF(2^16)).
//!
//! Every buffer handed to the codec is a whole number of [`ALIGN`]-byte blocks: the library
//! pairs bytes within 64-byte blocks, so encoding the concatenation of aligned pieces equals
//! concatenating their encodings. That is what lets a shard's run of chunks over many stripes be
//! encoded in one call, and a parity delta be computed over just the blocks a write touches.

mod codec;
mod error;
mod layout;
mod profile;

pub use codec::{Codec, xor_into};
pub use error::EcError;
pub use layout::{ALIGN, Extent, Layout, ShardWrite, StripePlan};
pub use profile::{DEFAULT_STRIPE_UNIT, MAX_SHARDS, Profile, Technique};

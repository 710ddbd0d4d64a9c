//! Ceph-compatible placement, bit for bit: the CRUSH algorithm (straw2 buckets, `firstn` and
//! `indep` rules, device classes, reweights), Ceph's text map format, and the object → PG →
//! OSDs pipeline.
//!
//! Pure code: no I/O, no async, no global state. A map is parsed or built, `finalize`d, and
//! then mapped any number of times from any number of threads (`&CrushMap` is `Sync`).
//! Correctness is checked against vectors produced by Ceph's own `crushtool` and `osdmaptool`
//! (`shared/vectors/crush`, see `tests/vectors.rs`).

mod div;
mod error;
mod hash;
mod ln;
mod ln_table;
mod map;
mod mapper;
mod placement;
mod text;

pub use error::{CrushError, Result};
pub use hash::{crush_hash32_2, crush_hash32_3, str_hash_rjenkins};
pub use map::{
    Bucket, CrushMap, DEFAULT_TYPES, Device, ITEM_NONE, ItemId, RULE_TYPE_ERASURE,
    RULE_TYPE_REPLICATED, Rule, Step, Tunables, WEIGHT_ONE, format_weight, weight_from_f32,
};
pub use mapper::{MAX_NUM_REP, Scratch};
pub use placement::{PoolPlacement, object_hash, pg_num_mask, stable_mod};
pub use text::parse_text;

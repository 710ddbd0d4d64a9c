//! The monitor client lives in its own crate, `kelp-monc`, so that OSDs, the client library and
//! the tools can use it without depending on the monitor; re-exported here for the monitor's
//! own tests and callers.

pub use kelp_monc::*;

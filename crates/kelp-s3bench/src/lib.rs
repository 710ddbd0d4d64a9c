//! `kelp s3 bench`: an S3 load generator in the spirit of warp and COSBench.
//!
//! It speaks plain S3 (path-style addressing, SigV4 with a signed payload hash, as boto3 does
//! over HTTP) and nothing Kelp-specific, so the same tool measures Kelp's gateway and Ceph's RGW
//! and the numbers compare. The `kelp` binary mounts [`BenchArgs`] as a subcommand and calls
//! [`run`]; the [`Report`] it returns prints as text ([`Report::write_summary`]) or JSON
//! ([`Report::to_json`]). See `docs/S3BENCH.md` for usage and for what the figures mean.
//!
//! This crate depends on no other Kelp crate but `kelp-types` (for byte sizes).

mod args;
mod bench;
mod client;
mod error;
mod report;
mod sigv4;

pub use args::{BenchArgs, Format, Mode, ParseDurationError, parse_duration};
pub use bench::run;
pub use error::BenchError;
pub use report::{LatencyMs, OpReport, Report, percentile};

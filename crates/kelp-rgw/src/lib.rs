//! Kelp's S3 gateway (`kelp rgw`): a stateless S3 service on RADOS, the radosgw equivalent.
//!
//! Every gateway is a plain client of the cluster: users, buckets, the bucket index and the
//! object data all live in RADOS pools (see [`layout`]), so any number of gateways can serve
//! the same buckets and any of them can answer any request.

pub mod acl;
pub mod cors;
pub mod data;
pub mod error;
pub mod form;
pub mod front;
pub mod gc;
pub mod index;
pub mod layout;
pub mod lifecycle;
pub mod md5batch;
pub mod meta;
pub mod metrics;
pub mod pending;
pub mod reshard;
pub mod rgw;

pub use error::{Result, RgwError};
pub use layout::{AccessKey, BucketRecord, UserRecord};
pub use rgw::{Rgw, RgwConfig};
pub mod s3;
pub mod server;
pub mod unsupported;
pub mod usage;

//! The Kelp client library, the equivalent of Ceph's librados: connect to a cluster, open a
//! pool, and run object operations. The client keeps the cluster's OSD map (subscribed from
//! the monitors), computes each object's placement itself, and talks straight to the primary
//! OSD of the object's placement group: no broker sits in the data path.
//!
//! Every operation on an object is atomic. Operations are retried transparently when they race
//! a map change (the OSD says the client's map is stale or that it is not the primary), when a
//! PG is briefly inactive, or when a connection drops; a retried write carries the same request
//! id, so the OSD never applies it twice. Each operation has an overall timeout
//! (`ClientConfig::op_timeout`, default 30 s) after which it fails with `ClientError::Timeout`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kelp_client::ClientError> {
//! use kelp_client::{ClientConfig, Rados};
//!
//! let cfg = ClientConfig::from_conf_file("kelp-data/kelp.conf".as_ref(), "client.admin")?;
//! let rados = Rados::connect(cfg).await?;
//! let io = rados.ioctx("data").await?;
//! io.write_full("greeting", &b"hello"[..]).await?;
//! assert_eq!(&io.read("greeting", 0, 0).await?[..], b"hello");
//! let st = io.stat("greeting").await?;
//! assert_eq!(st.size, 5);
//! io.remove("greeting").await?;
//! # Ok(()) }
//! ```

mod config;
mod error;
mod fsmap;
mod ioctx;
mod ops;
mod rados;
mod scrub;
mod watch;

pub use config::ClientConfig;
pub use error::ClientError;
pub use ioctx::{CloneInfo, IoCtx, ObjectStat, SnapSet};
/// The `kelp.conf` schema, from `kelp-config` (kept here so clients need one import).
pub use kelp_config::{ClusterConf, ConfFileError, GlobalSection, OsdSection};
/// Pool parameters for [`Rados::create_pool`].
pub use kelp_maps::PoolSpec;
/// The file-system map and MDS beacon types ([`Rados::fs_map`], [`Rados::mds_beacon`]).
pub use kelp_maps::{FsInfo, FsMap, MdsAssignment, MdsBeacon, MdsInfo, MdsState};
/// A daemon in the service map ([`Rados::service_map`]).
pub use kelp_proto::ServiceEntry;
pub use ops::{ReadOp, ReadResult, WriteOp};
pub use rados::Rados;
pub use watch::{
    BlocklistEntry, Notification, NotifyAck, NotifyResult, Watch, WatchEvent, WatcherInfo,
};

//! Block images on RADOS (the librbd equivalent): thin-provisioned images cut into data objects
//! of `2^order` bytes (optionally striped), snapshots and copy-on-write clones, exported to
//! block clients by `kelp nbd`.
//!
//! Objects of an image with id `ID` in pool `P`:
//! - `rbd_directory` (in `P`): omap `name_<name>` → id and `id_<id>` → name;
//! - `rbd_header.ID` (in `P`): omap key `header` → the [`ImageHeader`] (JSON, with a format
//!   version), changed only by compare-and-swap;
//! - `rbd_data.ID.<object number, 16 hex digits>` (in the data pool, `P` unless the image was
//!   created with a data pool): the data. An object that does not exist reads as zeros (or as
//!   the parent's bytes, for a clone).
//!
//! ```no_run
//! # async fn demo(rados: kelp_client::Rados) -> Result<(), kelp_rbd::RbdError> {
//! use kelp_rbd::{CreateOptions, Rbd};
//! let rbd = Rbd::new(rados);
//! rbd.create("rbd", "disk", &CreateOptions::with_size(10 << 30)).await?;
//! let img = rbd.open("rbd", "disk").await?;
//! img.write(4096, bytes::Bytes::from_static(b"hello")).await?;
//! assert_eq!(&img.read(4096, 5).await?[..], b"hello");
//! # Ok(()) }
//! ```

mod error;
mod header;
mod image;
mod layout;
mod lock;
mod objmap;
mod snap;

pub use error::RbdError;
pub use header::{ChildRef, FORMAT, ImageHeader, MAX_SNAPSHOTS, ParentSpec, SnapInfo};
pub use image::{CreateOptions, Extent, Image, ImageInfo, Rbd, Usage};
pub use layout::{DEFAULT_ORDER, Layout, MAX_ORDER, MIN_ORDER, ObjectExtent};
pub use lock::LockOwner;

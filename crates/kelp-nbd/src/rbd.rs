//! Kelp's block images as NBD exports: export `POOL/IMAGE` (read-write) or
//! `POOL/IMAGE@SNAP` (read-only); a name without a pool is looked up in the server's default
//! pool.
//!
//! Every connection to one export shares one open image, so the image's state (its header,
//! snapshot context and exclusive lock) is one per server. Writes are acknowledged only once
//! RADOS has committed them on every copy (or shard), so FLUSH has nothing left to do and
//! multi-conn is safe: a flush on any connection covers every write completed on all of them.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use kelp_rbd::{Image, Rbd, RbdError};

use crate::{BlockDevice, DeviceError, ExportInfo, Exports, Extent, OpenError};

/// Largest request the server accepts for an image (reads and writes).
const MAX_IO: u32 = 32 << 20;
/// One BLOCK_STATUS answer looks at up to this many objects (the client asks again for more).
const STATUS_OBJECTS: u64 = 64;

/// The catalogue of images a server exports.
pub struct RbdExports {
    rbd: Rbd,
    default_pool: String,
    open: tokio::sync::Mutex<HashMap<String, Weak<RbdDevice>>>,
}

impl RbdExports {
    pub fn new(rbd: Rbd, default_pool: &str) -> RbdExports {
        RbdExports {
            rbd,
            default_pool: default_pool.to_string(),
            open: tokio::sync::Mutex::new(HashMap::new()),
        }
    }
}

/// `[POOL/]IMAGE[@SNAP]` → (pool, image, snap).
fn parse_export(
    name: &str,
    default_pool: &str,
) -> Result<(String, String, Option<String>), OpenError> {
    let (pool, rest) = match name.split_once('/') {
        Some((p, r)) => (p, r),
        None => (default_pool, name),
    };
    let (image, snap) = match rest.split_once('@') {
        Some((i, s)) => (i, Some(s.to_string())),
        None => (rest, None),
    };
    if name.is_empty() {
        return Err(OpenError::NotFound(
            "no default export: name an image, POOL/IMAGE or POOL/IMAGE@SNAP".into(),
        ));
    }
    if pool.is_empty() || image.is_empty() || image.contains('/') || snap.as_deref() == Some("") {
        return Err(OpenError::Invalid(format!(
            "export {name:?}: expected POOL/IMAGE or POOL/IMAGE@SNAP"
        )));
    }
    Ok((pool.to_string(), image.to_string(), snap))
}

fn open_error(name: &str, e: RbdError) -> OpenError {
    match e {
        RbdError::NoSuchImage(_) | RbdError::NoSuchSnap(_) => {
            OpenError::NotFound(format!("{name}: {e}"))
        }
        RbdError::Rados(kelp_client::ClientError::NoSuchPool(_)) => {
            OpenError::NotFound(format!("{name}: {e}"))
        }
        RbdError::Invalid(_) => OpenError::Invalid(format!("{name}: {e}")),
        e => OpenError::Unavailable(format!("{name}: {e}")),
    }
}

#[async_trait]
impl Exports for RbdExports {
    async fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, OpenError> {
        let (pool, image, snap) = parse_export(name, &self.default_pool)?;
        let key = match &snap {
            Some(s) => format!("{pool}/{image}@{s}"),
            None => format!("{pool}/{image}"),
        };
        let mut open = self.open.lock().await;
        if let Some(dev) = open.get(&key).and_then(Weak::upgrade) {
            return Ok(dev);
        }
        let img = match &snap {
            Some(s) => self.rbd.open_snap(&pool, &image, s).await,
            None => self.rbd.open(&pool, &image).await,
        }
        .map_err(|e| open_error(name, e))?;
        if !img.is_read_only() && img.header().parent.is_some() {
            // The lock holder reads the objects a clone lacks from its parent directly after
            // the first lookup; without the lock every such read asks the clone's OSD first.
            // Best effort, in the background (a holder may take a while to hand it over, and
            // other exports must not wait): the first write takes the lock anyway.
            let (img, key) = (img.clone(), key.clone());
            tokio::spawn(async move {
                if let Err(e) = img.acquire_lock().await {
                    tracing::warn!(export = %key, "taking the exclusive lock at open: {e}");
                }
            });
        }
        let dev = Arc::new(RbdDevice {
            description: format!("Kelp image {key}"),
            image: img,
        });
        open.retain(|_, w| w.strong_count() > 0);
        open.insert(key, Arc::downgrade(&dev));
        Ok(dev)
    }

    async fn list(&self) -> Result<Vec<(String, String)>, OpenError> {
        let names = self
            .rbd
            .list(&self.default_pool)
            .await
            .map_err(|e| OpenError::Unavailable(e.to_string()))?;
        Ok(names
            .into_iter()
            .map(|n| {
                let export = format!("{}/{n}", self.default_pool);
                (export.clone(), format!("Kelp image {export}"))
            })
            .collect())
    }
}

/// One open image (or snapshot view) as a block device.
pub struct RbdDevice {
    image: Image,
    description: String,
}

impl RbdDevice {
    pub fn image(&self) -> &Image {
        &self.image
    }
}

fn device_error(e: RbdError) -> DeviceError {
    match e {
        RbdError::OutOfRange { .. } | RbdError::Invalid(_) => DeviceError::Invalid(e.to_string()),
        RbdError::ReadOnly(_) => DeviceError::ReadOnly,
        RbdError::Rados(kelp_client::ClientError::Full(_)) => DeviceError::NoSpace,
        RbdError::LockLost(_) | RbdError::Rados(kelp_client::ClientError::Blocklisted(_)) => {
            DeviceError::Shutdown(e.to_string())
        }
        e => DeviceError::Io(e.to_string()),
    }
}

#[async_trait]
impl BlockDevice for RbdDevice {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: self.image.size(),
            read_only: self.image.is_read_only(),
            can_trim: true,
            block_status: true,
            multi_conn: true,
            min_block: 1,
            preferred_block: 4096,
            max_block: MAX_IO,
            description: self.description.clone(),
        }
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, DeviceError> {
        self.image
            .read(offset, len as u64)
            .await
            .map_err(device_error)
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), DeviceError> {
        // Every acknowledged write is durable on all copies: FUA holds by construction.
        self.image.write(offset, data).await.map_err(device_error)
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        self.image.flush().await.map_err(device_error)
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), DeviceError> {
        self.image
            .discard(offset, len as u64)
            .await
            .map_err(device_error)
    }

    async fn write_zeroes(&self, offset: u64, len: u32, no_hole: bool) -> Result<(), DeviceError> {
        self.image
            .write_zeroes(offset, len as u64, !no_hole)
            .await
            .map_err(device_error)
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, DeviceError> {
        let cap = self.image.layout().object_size() * STATUS_OBJECTS;
        let len = (len as u64).min(cap);
        let extents = self
            .image
            .extents(offset, len)
            .await
            .map_err(device_error)?;
        Ok(extents
            .into_iter()
            .map(|e| Extent {
                len: e.len,
                hole: !e.data,
                zero: !e.data,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn export_names() {
        assert_eq!(
            parse_export("rbd/disk", "x").unwrap(),
            ("rbd".into(), "disk".into(), None)
        );
        assert_eq!(
            parse_export("disk@s1", "rbd").unwrap(),
            ("rbd".into(), "disk".into(), Some("s1".into()))
        );
        assert!(matches!(
            parse_export("", "rbd"),
            Err(OpenError::NotFound(_))
        ));
        for bad in ["/disk", "rbd/", "a/b/c", "rbd/disk@"] {
            assert!(parse_export(bad, "rbd").is_err(), "{bad:?}");
        }
    }
}

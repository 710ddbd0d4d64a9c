//! Image snapshots on RADOS self-managed snapshots.
//!
//! Taking a snapshot allocates a snapshot id in the data pool (one monitor command) and adds it
//! to the header (one compare-and-swap): O(1) whatever the image's size. From then on every
//! write carries the new snapshot context, and each OSD keeps an object's old bytes as a clone
//! on the object's first write after the snapshot. A snapshot view reads each object at the
//! snapshot id. Removing a snapshot releases its id; the OSDs trim the clones in the background.

use futures::{StreamExt, TryStreamExt};
use kelp_client::ClientError;

use crate::RbdError;
use crate::header::{self, MAX_SNAPSHOTS, SnapInfo};
use crate::image::{Image, PARALLEL};

impl Image {
    fn head_only(&self, what: &str) -> Result<(), RbdError> {
        match self.snapshot() {
            Some(s) => Err(RbdError::ReadOnly(format!(
                "{what} works on the image, not on snapshot view @{}",
                s.name
            ))),
            None => Ok(()),
        }
    }

    /// Takes a snapshot named `name`.
    pub async fn snap_create(&self, name: &str) -> Result<SnapInfo, RbdError> {
        self.head_only("snap create")?;
        header::check_snap_name(name)?;
        // Under the exclusive lock: a writer elsewhere hands it over (after its writes in
        // flight) and reads the new snapshot context when it takes it back, so no write of
        // its lands in the snapshot after it was taken.
        let _guard = self.write_guard().await?;
        self.refresh().await?;
        let h = self.header();
        if h.snap(name).is_some() {
            return Err(RbdError::SnapExists(format!("{}@{name}", self.name())));
        }
        let rados = self.rbd().rados().clone();
        let id = rados.selfmanaged_snap_create(&h.data_pool).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let image_name = self.name().to_string();
        let updated = self
            .update_header(|h| {
                if h.snap(name).is_some() {
                    return Err(RbdError::SnapExists(format!("{image_name}@{name}")));
                }
                if h.snaps.len() >= MAX_SNAPSHOTS {
                    return Err(RbdError::Busy(format!(
                        "image '{image_name}' has {MAX_SNAPSHOTS} snapshots, the most it may have"
                    )));
                }
                h.snaps.push(SnapInfo {
                    id,
                    name: name.to_string(),
                    size: h.size,
                    protected: false,
                    created_ns: now,
                    parent_overlap: h.parent.as_ref().map(|p| p.overlap.min(h.size)),
                });
                h.snap_seq = h.snap_seq.max(id);
                Ok(())
            })
            .await;
        match updated {
            Ok(h) => {
                self.header_changed().await;
                h.snap(name)
                    .cloned()
                    .ok_or_else(|| RbdError::Corrupt("snapshot vanished".into()))
            }
            Err(e) => {
                let _ = rados.selfmanaged_snap_remove(&h.data_pool, id).await;
                Err(e)
            }
        }
    }

    /// The image's snapshots, oldest first.
    pub fn snap_list(&self) -> Vec<SnapInfo> {
        self.header().snaps.clone()
    }

    fn snap_named(&self, name: &str) -> Result<SnapInfo, RbdError> {
        self.header()
            .snap(name)
            .cloned()
            .ok_or_else(|| RbdError::NoSuchSnap(format!("{}@{name}", self.name())))
    }

    /// Removes snapshot `name` (refused while it is protected); its clones are trimmed by the
    /// OSDs in the background.
    pub async fn snap_remove(&self, name: &str) -> Result<(), RbdError> {
        self.head_only("snap rm")?;
        self.refresh().await?;
        let image_name = self.name().to_string();
        let mut removed = None;
        self.update_header(|h| {
            let Some(pos) = h.snaps.iter().position(|s| s.name == name) else {
                return Err(RbdError::NoSuchSnap(format!("{image_name}@{name}")));
            };
            let s = &h.snaps[pos];
            if s.protected {
                return Err(RbdError::Busy(format!(
                    "snapshot {image_name}@{name} is protected; unprotect it first"
                )));
            }
            if h.children.iter().any(|c| c.snap_id == s.id) {
                return Err(RbdError::Busy(format!(
                    "snapshot {image_name}@{name} has clones"
                )));
            }
            removed = Some(h.snaps.remove(pos));
            Ok(())
        })
        .await?;
        self.header_changed().await;
        if let Some(parent) = self.header().parent.clone() {
            // A flattened clone whose last snapshot reading the parent is gone.
            self.detach_if_unused(&parent).await?;
        }
        if let Some(s) = removed {
            let pool = self.header().data_pool.clone();
            self.rbd()
                .rados()
                .selfmanaged_snap_remove(&pool, s.id)
                .await?;
        }
        Ok(())
    }

    /// Removes every unprotected snapshot.
    pub async fn snap_purge(&self) -> Result<usize, RbdError> {
        let mut n = 0;
        for s in self.snap_list() {
            if !s.protected {
                self.snap_remove(&s.name).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Protects (or unprotects) a snapshot: a protected snapshot can be cloned and cannot be
    /// removed; unprotecting is refused while clones of it exist.
    pub async fn snap_set_protected(&self, name: &str, protected: bool) -> Result<(), RbdError> {
        self.head_only("snap protect")?;
        let image_name = self.name().to_string();
        self.update_header(|h| {
            let in_use = {
                let s = h
                    .snap(name)
                    .ok_or_else(|| RbdError::NoSuchSnap(format!("{image_name}@{name}")))?;
                h.children.iter().any(|c| c.snap_id == s.id)
            };
            if !protected && in_use {
                return Err(RbdError::Busy(format!(
                    "snapshot {image_name}@{name} has clones; flatten or remove them first"
                )));
            }
            for s in &mut h.snaps {
                if s.name == name {
                    s.protected = protected;
                }
            }
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// Rolls the image back to snapshot `name`: every object becomes what it was then, and the
    /// size too. `progress(done, total)` is called as objects are done.
    pub async fn snap_rollback(
        &self,
        name: &str,
        progress: impl Fn(u64, u64) + Send + Sync,
    ) -> Result<(), RbdError> {
        self.head_only("snap rollback")?;
        let _guard = self.write_guard().await?;
        self.refresh().await?;
        let s = self.snap_named(name)?;
        let h = self.header();
        let count = h.layout.object_count(h.size.max(s.size));
        let io = self.data_io();
        let done = std::sync::atomic::AtomicU64::new(0);
        futures::stream::iter((0..count).map(|object| {
            let io = io.clone();
            let name = self.object_name(object);
            let (done, progress) = (&done, &progress);
            async move {
                self.will_change(object);
                match io.rollback(&name, s.id).await {
                    Ok(()) => {}
                    Err(ClientError::NotFound { .. }) => {}
                    Err(e) => return Err(RbdError::from(e)),
                }
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, count);
                Ok(())
            }
        }))
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
        self.update_header(|h| {
            h.size = s.size;
            if let (Some(p), Some(o)) = (&mut h.parent, s.parent_overlap) {
                p.overlap = o;
            }
            Ok(())
        })
        .await?;
        self.header_changed().await;
        Ok(())
    }
}

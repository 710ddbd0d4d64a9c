//! Images: the pool-level directory (`Rbd`) and an open image's I/O (`Image`).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use kelp_client::{ClientError, IoCtx, Rados, ReadOp, ReadResult, WriteOp};

use crate::RbdError;
use crate::header::{self, ChildRef, FORMAT, ImageHeader, ParentSpec, SnapInfo};
use crate::layout::{Layout, ObjectExtent};
use crate::objmap::{ExistenceMap, Ticket};

const DIRECTORY: &str = "rbd_directory";
const HEADER_KEY: &str = "header";
/// Compare-and-swap attempts on a header before giving up with `Conflict`.
const HEADER_RETRIES: usize = 64;
/// Object operations an image keeps in flight for one large request (import, flatten, rm).
pub(crate) const PARALLEL: usize = 16;

pub(crate) fn header_object(id: &str) -> String {
    format!("rbd_header.{id}")
}

fn data_prefix(id: &str) -> String {
    format!("rbd_data.{id}.")
}

fn data_object(id: &str, object: u64) -> String {
    format!("rbd_data.{id}.{object:016x}")
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn is_not_found(e: &ClientError) -> bool {
    matches!(e, ClientError::NotFound { .. })
}

/// How to create an image.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub size: u64,
    /// log2 of the object size (default 22: 4 MiB).
    pub order: Option<u8>,
    pub stripe_unit: Option<u64>,
    pub stripe_count: Option<u64>,
    /// Pool for the data objects (e.g. an erasure-coded pool); the header stays in the image's
    /// pool, which must be replicated (it keeps omap).
    pub data_pool: Option<String>,
}

impl CreateOptions {
    pub fn with_size(size: u64) -> CreateOptions {
        CreateOptions {
            size,
            ..CreateOptions::default()
        }
    }
}

/// A pool's images.
#[derive(Clone)]
pub struct Rbd {
    rados: Rados,
}

impl Rbd {
    pub fn new(rados: Rados) -> Rbd {
        Rbd { rados }
    }

    pub fn rados(&self) -> &Rados {
        &self.rados
    }

    async fn ioctx(&self, pool: &str) -> Result<IoCtx, RbdError> {
        Ok(self.rados.ioctx(pool).await?)
    }

    /// Creates an empty (thin) image; returns its id.
    pub async fn create(
        &self,
        pool: &str,
        name: &str,
        opts: &CreateOptions,
    ) -> Result<String, RbdError> {
        let layout = Layout::new(
            opts.order.unwrap_or(crate::DEFAULT_ORDER),
            opts.stripe_unit,
            opts.stripe_count,
        )?;
        let data_pool = opts.data_pool.clone().unwrap_or_else(|| pool.to_string());
        self.ioctx(&data_pool).await?;
        let header = ImageHeader {
            format: FORMAT,
            id: new_id(),
            size: opts.size,
            layout,
            data_pool,
            created_ns: now_ns(),
            snap_seq: 0,
            snaps: Vec::new(),
            parent: None,
            children: Vec::new(),
        };
        self.create_with_header(pool, name, header).await
    }

    async fn create_with_header(
        &self,
        pool: &str,
        name: &str,
        header: ImageHeader,
    ) -> Result<String, RbdError> {
        header::check_image_name(name)?;
        let io = self.ioctx(pool).await?;
        let id = header.id.clone();
        io.operate(
            WriteOp::new()
                .create(true)
                .omap_set(&[(HEADER_KEY, header.encode())]),
            &header_object(&id),
        )
        .await
        .map_err(|e| match e {
            ClientError::NotSupported(why) => RbdError::Unsupported(format!(
                "pool '{pool}' cannot hold image headers ({why}); create the image in a replicated \
                 pool and put its data in this one with --data-pool"
            )),
            e => e.into(),
        })?;
        let name_key = format!("name_{name}");
        let added = io
            .operate(
                WriteOp::new().cmp_omap(&name_key, None).omap_set(&[
                    (name_key.as_str(), id.as_str()),
                    (&format!("id_{id}"), name),
                ]),
                DIRECTORY,
            )
            .await;
        match added {
            Ok(_) => Ok(id),
            Err(e) => {
                let _ = io.remove(&header_object(&id)).await;
                match e {
                    ClientError::Canceled { .. } => Err(RbdError::ImageExists(name.to_string())),
                    e => Err(e.into()),
                }
            }
        }
    }

    /// The images of a pool, by name.
    pub async fn list(&self, pool: &str) -> Result<Vec<String>, RbdError> {
        let io = self.ioctx(pool).await?;
        let mut names = Vec::new();
        let mut after = String::new();
        loop {
            let (page, more) = match io.omap_get_vals(DIRECTORY, &after, "name_", 1000).await {
                Ok(p) => p,
                Err(e) if is_not_found(&e) => return Ok(names),
                Err(e) => return Err(e.into()),
            };
            if let Some((k, _)) = page.last() {
                after = k.clone();
            }
            names.extend(
                page.into_iter()
                    .filter_map(|(k, _)| k.strip_prefix("name_").map(str::to_string)),
            );
            if !more {
                return Ok(names);
            }
        }
    }

    /// The id of image `name` in `pool`.
    pub async fn image_id(&self, pool: &str, name: &str) -> Result<String, RbdError> {
        let io = self.ioctx(pool).await?;
        let key = format!("name_{name}");
        let res = io
            .operate_read(ReadOp::new().omap_get_vals_by_keys(&[&key]), DIRECTORY)
            .await;
        match res {
            Ok(mut r) => match r.pop() {
                Some(ReadResult::Pairs { entries, .. }) => entries
                    .into_iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                    .ok_or_else(|| RbdError::NoSuchImage(name.to_string())),
                _ => Err(RbdError::Corrupt(format!("{DIRECTORY}: unexpected reply"))),
            },
            Err(e) if is_not_found(&e) => Err(RbdError::NoSuchImage(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    async fn image_name(&self, pool: &str, id: &str) -> Result<String, RbdError> {
        let io = self.ioctx(pool).await?;
        let key = format!("id_{id}");
        match io
            .operate_read(ReadOp::new().omap_get_vals_by_keys(&[&key]), DIRECTORY)
            .await
        {
            Ok(mut r) => match r.pop() {
                Some(ReadResult::Pairs { entries, .. }) => Ok(entries
                    .into_iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
                    .unwrap_or_else(|| id.to_string())),
                _ => Ok(id.to_string()),
            },
            Err(e) if is_not_found(&e) => Ok(id.to_string()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens image `name` for reading and writing.
    pub async fn open(&self, pool: &str, name: &str) -> Result<Image, RbdError> {
        let id = self.image_id(pool, name).await?;
        self.open_by_id(pool, &id, name, None).await
    }

    /// Opens a read-only view of image `name` at snapshot `snap`.
    pub async fn open_snap(&self, pool: &str, name: &str, snap: &str) -> Result<Image, RbdError> {
        let id = self.image_id(pool, name).await?;
        let io = self.ioctx(pool).await?;
        let (h, _) = read_header(&io, &id).await?;
        let s = h
            .snap(snap)
            .ok_or_else(|| RbdError::NoSuchSnap(format!("{name}@{snap}")))?;
        self.open_by_id(pool, &id, name, Some(s.id)).await
    }

    /// Opens an image by id, at a snapshot (read-only) or its head.
    pub(crate) fn open_by_id<'a>(
        &'a self,
        pool: &'a str,
        id: &'a str,
        name: &'a str,
        snap: Option<u64>,
    ) -> futures::future::BoxFuture<'a, Result<Image, RbdError>> {
        Box::pin(async move {
            let meta = self.ioctx(pool).await?;
            let (h, _) = read_header(&meta, id).await?;
            let snap_info = match snap {
                Some(sid) => Some(
                    h.snap_by_id(sid)
                        .cloned()
                        .ok_or_else(|| RbdError::NoSuchSnap(format!("{name}@{sid}")))?,
                ),
                None => None,
            };
            let parent = match &h.parent {
                Some(p) => {
                    let pname = self.image_name(&p.pool, &p.image_id).await?;
                    Some(
                        self.open_by_id(&p.pool, &p.image_id, &pname, Some(p.snap_id))
                            .await?,
                    )
                }
                None => None,
            };
            let data = self.ioctx(&h.data_pool).await?;
            let image = Image {
                inner: Arc::new(Inner {
                    rbd: self.clone(),
                    pool: pool.to_string(),
                    name: name.to_string(),
                    id: id.to_string(),
                    meta,
                    data: RwLock::new(data),
                    header: RwLock::new(Arc::new(h)),
                    snap: snap_info,
                    parent,
                    known: std::sync::Mutex::default(),
                    head_map: std::sync::Mutex::default(),
                    lock: tokio::sync::Mutex::default(),
                    acquiring: tokio::sync::Mutex::default(),
                    io_gate: Arc::default(),
                    watch_task: std::sync::Mutex::default(),
                }),
            };
            image.apply_snap_context()?;
            if snap.is_none() {
                image.start_watch().await?;
            }
            Ok(image)
        })
    }

    /// Removes an image and all its data. Refused while it has snapshots.
    pub async fn remove(&self, pool: &str, name: &str) -> Result<(), RbdError> {
        let id = self.image_id(pool, name).await?;
        let meta = self.ioctx(pool).await?;
        let h = match read_header(&meta, &id).await {
            Ok((h, _)) => Some(h),
            // A half-created or half-removed image: finish removing its directory entries.
            Err(RbdError::NoSuchImage(_)) => None,
            Err(e) => return Err(e),
        };
        if let Some(h) = &h {
            let watchers = match meta.watchers(&header_object(&id)).await {
                Ok(w) => w,
                Err(e) if is_not_found(&e) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            if !watchers.is_empty() {
                return Err(RbdError::Busy(format!(
                    "image '{name}' is open by {} client(s) ({}); close it first",
                    watchers.len(),
                    watchers
                        .iter()
                        .map(|w| w.instance.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            if !h.snaps.is_empty() {
                return Err(RbdError::Busy(format!(
                    "image '{name}' has {} snapshot(s); remove them first (kelp rbd snap purge)",
                    h.snaps.len()
                )));
            }
            let data = self.ioctx(&h.data_pool).await?;
            remove_data_objects(&data, &id).await?;
            if let Some(p) = &h.parent {
                let pio = self.ioctx(&p.pool).await?;
                let unlinked = update_header(&pio, &p.image_id, |ph| {
                    ph.children
                        .retain(|c| !(c.image_id == id && c.pool == pool));
                    Ok(())
                })
                .await;
                match unlinked {
                    // A parent already gone has no child list to leave.
                    Ok(_) | Err(RbdError::NoSuchImage(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            match meta.remove(&header_object(&id)).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        meta.operate(
            WriteOp::new().omap_rm_keys(&[format!("name_{name}"), format!("id_{id}")]),
            DIRECTORY,
        )
        .await?;
        Ok(())
    }

    /// Renames an image within its pool.
    pub async fn rename(&self, pool: &str, from: &str, to: &str) -> Result<(), RbdError> {
        header::check_image_name(to)?;
        let id = self.image_id(pool, from).await?;
        let io = self.ioctx(pool).await?;
        let (from_key, to_key, id_key) = (
            format!("name_{from}"),
            format!("name_{to}"),
            format!("id_{id}"),
        );
        let op = WriteOp::new()
            .cmp_omap(&from_key, Some(id.as_bytes()))
            .cmp_omap(&to_key, None)
            .omap_set(&[(to_key.as_str(), id.as_str()), (id_key.as_str(), to)])
            .omap_rm_keys(&[&from_key]);
        match io.operate(op, DIRECTORY).await {
            Ok(_) => Ok(()),
            Err(ClientError::Canceled { .. }) => {
                if self.image_id(pool, to).await.is_ok() {
                    Err(RbdError::ImageExists(to.to_string()))
                } else {
                    Err(RbdError::NoSuchImage(from.to_string()))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Clones protected snapshot `parent@snap` into a new image `child` (in `child_pool`), which
    /// reads through to the snapshot until its objects are written (copy-on-write).
    pub async fn clone_image(
        &self,
        parent_pool: &str,
        parent: &str,
        snap: &str,
        child_pool: &str,
        child: &str,
        data_pool: Option<String>,
    ) -> Result<(), RbdError> {
        header::check_image_name(child)?;
        let parent_id = self.image_id(parent_pool, parent).await?;
        let pio = self.ioctx(parent_pool).await?;
        let child_id = new_id();
        // Record the child in the parent first: from then on the snapshot cannot be
        // unprotected or removed, so the clone never loses its parent.
        let ph = update_header(&pio, &parent_id, |h| {
            let s = h
                .snap(snap)
                .ok_or_else(|| RbdError::NoSuchSnap(format!("{parent}@{snap}")))?;
            if !s.protected {
                return Err(RbdError::Busy(format!(
                    "snapshot {parent}@{snap} is not protected; protect it first (kelp rbd snap protect)"
                )));
            }
            let snap_id = s.id;
            h.children.push(ChildRef {
                snap_id,
                pool: child_pool.to_string(),
                image_id: child_id.clone(),
            });
            Ok(())
        })
        .await?;
        let s = ph
            .snap(snap)
            .cloned()
            .ok_or_else(|| RbdError::NoSuchSnap(format!("{parent}@{snap}")))?;
        let data_pool = data_pool.unwrap_or_else(|| child_pool.to_string());
        let header = ImageHeader {
            format: FORMAT,
            id: child_id.clone(),
            size: s.size,
            layout: ph.layout,
            data_pool,
            created_ns: now_ns(),
            snap_seq: 0,
            snaps: Vec::new(),
            parent: Some(ParentSpec {
                pool: parent_pool.to_string(),
                image_id: parent_id.clone(),
                snap_id: s.id,
                overlap: s.size,
            }),
            children: Vec::new(),
        };
        if let Err(e) = async {
            self.ioctx(&header.data_pool).await?;
            self.create_with_header(child_pool, child, header).await
        }
        .await
        {
            let _ = update_header(&pio, &parent_id, |h| {
                h.children.retain(|c| c.image_id != child_id);
                Ok(())
            })
            .await;
            return Err(e);
        }
        Ok(())
    }
}

fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Reads an image header and its raw bytes (for a later compare-and-swap).
pub(crate) async fn read_header(io: &IoCtx, id: &str) -> Result<(ImageHeader, Bytes), RbdError> {
    let res = io
        .operate_read(
            ReadOp::new().omap_get_vals_by_keys(&[HEADER_KEY]),
            &header_object(id),
        )
        .await;
    let entries = match res {
        Ok(mut r) => match r.pop() {
            Some(ReadResult::Pairs { entries, .. }) => entries,
            _ => {
                return Err(RbdError::Corrupt(format!(
                    "{}: no header",
                    header_object(id)
                )));
            }
        },
        Err(e) if is_not_found(&e) => return Err(RbdError::NoSuchImage(id.to_string())),
        Err(e) => return Err(e.into()),
    };
    let raw = entries
        .into_iter()
        .find(|(k, _)| k == HEADER_KEY)
        .map(|(_, v)| v)
        .ok_or_else(|| RbdError::Corrupt(format!("{} has no header", header_object(id))))?;
    Ok((ImageHeader::decode(&raw)?, raw))
}

/// Changes an image header by compare-and-swap: reads it, applies `f`, writes it only if it is
/// still what was read; retries on a race.
pub(crate) async fn update_header<F>(
    io: &IoCtx,
    id: &str,
    mut f: F,
) -> Result<ImageHeader, RbdError>
where
    F: FnMut(&mut ImageHeader) -> Result<(), RbdError>,
{
    for _ in 0..HEADER_RETRIES {
        let (mut h, raw) = read_header(io, id).await?;
        f(&mut h)?;
        let op = WriteOp::new()
            .cmp_omap(HEADER_KEY, Some(&raw))
            .omap_set(&[(HEADER_KEY, h.encode())]);
        match io.operate(op, &header_object(id)).await {
            Ok(_) => return Ok(h),
            Err(ClientError::Canceled { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(RbdError::Conflict(header_object(id)))
}

/// The data objects of image `id` in its data pool.
async fn data_objects(data: &IoCtx, id: &str) -> Result<Vec<String>, RbdError> {
    let prefix = data_prefix(id);
    Ok(data
        .list_objects()
        .await?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect())
}

async fn remove_data_objects(data: &IoCtx, id: &str) -> Result<u64, RbdError> {
    let names = data_objects(data, id).await?;
    let n = names.len() as u64;
    futures::stream::iter(names)
        .map(|name| async move {
            match data.remove(&name).await {
                Ok(()) => Ok(()),
                Err(e) if is_not_found(&e) => Ok(()),
                Err(e) => Err(RbdError::from(e)),
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(n)
}

/// A summary of an image (`kelp rbd info`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ImageInfo {
    pub name: String,
    pub id: String,
    pub pool: String,
    pub size: u64,
    pub object_size: u64,
    pub order: u8,
    pub stripe_unit: u64,
    pub stripe_count: u64,
    pub objects: u64,
    pub data_pool: String,
    pub format: u32,
    pub snapshot_count: usize,
    pub parent: Option<String>,
    pub overlap: Option<u64>,
    pub snapshot: Option<String>,
    pub created_ns: u64,
}

/// Space an image takes: `provisioned` is its size, `used` the bytes its objects hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub provisioned: u64,
    pub used: u64,
}

/// A run of an image's bytes: `data` (stored, or read through from a parent) or a hole that
/// reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub data: bool,
}

/// An open image (cheap to clone: clones share the handle).
#[derive(Clone)]
pub struct Image {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) rbd: Rbd,
    pool: String,
    pub(crate) name: String,
    pub(crate) id: String,
    /// The pool holding the header.
    pub(crate) meta: IoCtx,
    /// The data pool, with the image's snapshot context (or read snapshot for a snapshot view).
    data: RwLock<IoCtx>,
    header: RwLock<Arc<ImageHeader>>,
    /// Set for a read-only view at a snapshot.
    snap: Option<SnapInfo>,
    /// The parent's snapshot view, for a clone.
    parent: Option<Image>,
    /// A snapshot view never changes: which of its objects exist, once looked up (reads of a
    /// deep clone chain then go straight to the level that holds the data).
    known: std::sync::Mutex<std::collections::HashMap<u64, bool>>,
    /// The head's objects known absent while this client holds the exclusive lock
    /// (`crate::objmap`).
    pub(crate) head_map: std::sync::Mutex<ExistenceMap>,
    /// The exclusive lock (`crate::lock`): whether this client holds it.
    pub(crate) lock: tokio::sync::Mutex<crate::lock::LockState>,
    /// Held by the one acquisition of the lock under way.
    pub(crate) acquiring: tokio::sync::Mutex<()>,
    /// Changes hold it shared; handing the lock over holds it exclusively (waits for them).
    pub(crate) io_gate: Arc<tokio::sync::RwLock<()>>,
    /// The header watch's task (lock requests, header updates) and the way to stop it (it
    /// then unwatches).
    pub(crate) watch_task: std::sync::Mutex<
        Option<(
            tokio::task::JoinHandle<()>,
            tokio::sync::oneshot::Sender<()>,
        )>,
    >,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let stop = self
            .watch_task
            .get_mut()
            .expect("task lock is never poisoned")
            .take();
        let state = self.lock.get_mut();
        let me = state.held.then(|| crate::lock::LockOwner {
            instance: self.rbd.rados().instance(),
            cookie: state.cookie,
        });
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return; // dropping `stop` ends the watch task
        };
        let (meta, id) = (self.meta.clone(), self.id.clone());
        rt.spawn(async move {
            // Give the lock back first, then stop watching: a client that saw the holder
            // gone before its record would fence it.
            if let Some(me) = me {
                let _ = crate::lock::release_record(&meta, &id, &me).await;
            }
            if let Some((task, stop)) = stop {
                let _ = stop.send(());
                let _ = task.await;
            }
        });
    }
}

/// A change to one object extent.
#[derive(Clone)]
enum Mutation {
    Write(Bytes),
    Zero,
    /// Zero from the extent's offset to the object's end by cutting the object there.
    Truncate,
}

impl Image {
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Image {
        Image { inner }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub fn pool(&self) -> &str {
        &self.inner.pool
    }

    pub fn rbd(&self) -> &Rbd {
        &self.inner.rbd
    }

    /// The header as last read.
    pub fn header(&self) -> Arc<ImageHeader> {
        self.inner
            .header
            .read()
            .expect("header lock is never poisoned")
            .clone()
    }

    /// The snapshot this view shows, if it is one.
    pub fn snapshot(&self) -> Option<&SnapInfo> {
        self.inner.snap.as_ref()
    }

    pub fn is_read_only(&self) -> bool {
        self.inner.snap.is_some()
    }

    /// The image's size (the snapshot's, for a snapshot view).
    pub fn size(&self) -> u64 {
        match &self.inner.snap {
            Some(s) => s.size,
            None => self.header().size,
        }
    }

    pub fn layout(&self) -> Layout {
        self.header().layout
    }

    pub(crate) fn data_io(&self) -> IoCtx {
        self.inner
            .data
            .read()
            .expect("data lock is never poisoned")
            .clone()
    }

    fn set_header(&self, h: ImageHeader) -> Result<(), RbdError> {
        *self
            .inner
            .header
            .write()
            .expect("header lock is never poisoned") = Arc::new(h);
        self.apply_snap_context()
    }

    /// Points the data I/O context at the header's snapshot context (head) or at the view's
    /// snapshot.
    fn apply_snap_context(&self) -> Result<(), RbdError> {
        let mut data = self
            .inner
            .data
            .write()
            .expect("data lock is never poisoned");
        match &self.inner.snap {
            Some(s) => data.set_read_snap(Some(s.id)),
            None => {
                let (seq, snaps) = self.header().snap_context();
                data.set_snap_context(seq, snaps)?;
            }
        }
        Ok(())
    }

    /// Reads the header again (another client may have resized the image or taken a snapshot).
    pub async fn refresh(&self) -> Result<(), RbdError> {
        let (h, _) = read_header(&self.inner.meta, &self.inner.id).await?;
        self.set_header(h)
    }

    pub(crate) async fn update_header<F>(&self, f: F) -> Result<ImageHeader, RbdError>
    where
        F: FnMut(&mut ImageHeader) -> Result<(), RbdError>,
    {
        let h = update_header(&self.inner.meta, &self.inner.id, f).await?;
        self.set_header(h.clone())?;
        Ok(h)
    }

    pub fn info(&self) -> ImageInfo {
        let h = self.header();
        ImageInfo {
            name: self.inner.name.clone(),
            id: self.inner.id.clone(),
            pool: self.inner.pool.clone(),
            size: self.size(),
            object_size: h.layout.object_size(),
            order: h.layout.order,
            stripe_unit: h.layout.stripe_unit,
            stripe_count: h.layout.stripe_count,
            objects: h.layout.object_count(self.size()),
            data_pool: h.data_pool.clone(),
            format: h.format,
            snapshot_count: h.snaps.len(),
            parent: h
                .parent
                .as_ref()
                .zip(self.inner.parent.as_ref())
                .map(|(p, img)| {
                    let snap = img
                        .snapshot()
                        .map(|s| s.name.clone())
                        .unwrap_or_else(|| p.snap_id.to_string());
                    format!("{}/{}@{}", p.pool, img.name(), snap)
                }),
            overlap: h.parent.as_ref().map(|_| self.overlap()),
            snapshot: self.inner.snap.as_ref().map(|s| s.name.clone()),
            created_ns: h.created_ns,
        }
    }

    /// Bytes of the parent this image (view) reads through.
    fn overlap(&self) -> u64 {
        self.header()
            .overlap_at(self.inner.snap.as_ref().map(|s| s.id))
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(RbdError::OutOfRange { offset, len, size });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), RbdError> {
        match &self.inner.snap {
            Some(s) => Err(RbdError::ReadOnly(format!(
                "{}@{} is a snapshot",
                self.inner.name, s.name
            ))),
            None => Ok(()),
        }
    }

    pub(crate) fn object_name(&self, object: u64) -> String {
        data_object(&self.inner.id, object)
    }

    /// Whether part of `object` reads through to the parent.
    fn reads_parent(&self, layout: &Layout, object: u64, overlap: u64) -> bool {
        self.inner.parent.is_some() && overlap > 0 && layout.image_offset(object, 0) < overlap
    }

    /// Reads `len` bytes at `offset`; holes read as zeros.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, RbdError> {
        self.check_range(offset, len)?;
        let layout = self.layout();
        let extents = layout.map(offset, len);
        if extents.len() == 1 {
            return self.read_extent(extents[0]).await;
        }
        let parts =
            futures::future::try_join_all(extents.iter().map(|e| self.read_extent(*e))).await?;
        let mut out = BytesMut::with_capacity(len as usize);
        for p in parts {
            out.extend_from_slice(&p);
        }
        Ok(out.freeze())
    }

    async fn read_extent(&self, e: ObjectExtent) -> Result<Bytes, RbdError> {
        // Down the levels known to lack the object, to the first that may have it, without
        // asking any OSD. A clone has its parent's layout, so the extent is the same object
        // range at every level; only the overlap cuts it shorter.
        let mut level = self;
        let mut len = e.len;
        let ticket = loop {
            let (absent, ticket) = level.absent_here(e.object);
            if !absent {
                break ticket;
            }
            let overlap = level.overlap();
            match &level.inner.parent {
                Some(parent) if e.image_offset < overlap && parent.layout() == level.layout() => {
                    len = len.min(overlap - e.image_offset);
                    level = parent;
                }
                Some(_) if e.image_offset < overlap => {
                    let b = level.read_parent(e.image_offset, len).await?;
                    return Ok(pad_to(b, e.len));
                }
                _ => return Ok(Bytes::from(vec![0u8; e.len as usize])),
            }
        };
        let here = ObjectExtent { len, ..e };
        let b = level.read_object_extent(here, ticket).await?;
        Ok(pad_to(b, e.len))
    }

    /// Whether this level is known to lack `object`, and (for the head) the ticket under which
    /// a lookup may learn that it does.
    fn absent_here(&self, object: u64) -> (bool, Option<Ticket>) {
        if self.inner.snap.is_some() {
            (self.known(object) == Some(false), None)
        } else {
            let map = self.head_map();
            (map.known_absent(object), map.ticket())
        }
    }

    /// Reads the extent from this level's object, or from the parent if it does not exist.
    async fn read_object_extent(
        &self,
        e: ObjectExtent,
        ticket: Option<Ticket>,
    ) -> Result<Bytes, RbdError> {
        let io = self.data_io();
        match io.read(&self.object_name(e.object), e.offset, e.len).await {
            Ok(b) => {
                self.learn(e.object, true);
                Ok(pad_to(b, e.len))
            }
            Err(err) if is_not_found(&err) => {
                self.learn(e.object, false);
                if ticket.is_some() {
                    self.head_map().learn_absent(e.object, ticket);
                }
                self.read_parent(e.image_offset, e.len).await
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Whether `object` exists, if this is a snapshot view that has looked it up before.
    fn known(&self, object: u64) -> Option<bool> {
        self.inner.snap.as_ref()?;
        self.inner
            .known
            .lock()
            .expect("cache lock is never poisoned")
            .get(&object)
            .copied()
    }

    pub(crate) fn head_map(&self) -> std::sync::MutexGuard<'_, ExistenceMap> {
        self.inner
            .head_map
            .lock()
            .expect("map lock is never poisoned")
    }

    /// `object` of the head is about to be changed: it may exist from now on.
    pub(crate) fn will_change(&self, object: u64) {
        self.head_map().will_change(object);
    }

    /// How many of the head's objects this client knows to be absent (it holds the lock).
    pub fn known_absent_objects(&self) -> usize {
        self.head_map().absent_count()
    }

    fn learn(&self, object: u64, exists: bool) {
        if self.inner.snap.is_some() {
            self.inner
                .known
                .lock()
                .expect("cache lock is never poisoned")
                .insert(object, exists);
        }
    }

    /// The parent's bytes at image range `offset..offset+len`, zeros past the overlap.
    fn read_parent(
        &self,
        offset: u64,
        len: u64,
    ) -> futures::future::BoxFuture<'_, Result<Bytes, RbdError>> {
        Box::pin(async move {
            let overlap = self.overlap();
            match &self.inner.parent {
                Some(parent) if offset < overlap => {
                    let n = len.min(overlap - offset);
                    let b = parent.read(offset, n).await?;
                    Ok(pad(b, len))
                }
                _ => Ok(Bytes::from(vec![0u8; len as usize])),
            }
        })
    }

    /// Writes `data` at `offset`. Returns once every copy (or shard) of the data is durable.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), RbdError> {
        let _guard = self.write_guard().await?;
        self.check_range(offset, data.len() as u64)?;
        let layout = self.layout();
        let extents = layout.map(offset, data.len() as u64);
        let muts = extents.iter().map(|e| {
            let start = (e.image_offset - offset) as usize;
            let piece = data.slice(start..start + e.len as usize);
            self.mutate(layout, *e, Mutation::Write(piece))
        });
        futures::future::try_join_all(muts).await?;
        Ok(())
    }

    /// Applies one mutation to one object extent, copying the parent's object up first when
    /// the object does not exist yet but reads through to the parent.
    async fn mutate(&self, layout: Layout, e: ObjectExtent, m: Mutation) -> Result<(), RbdError> {
        self.will_change(e.object);
        let io = self.data_io();
        let name = self.object_name(e.object);
        let overlap = self.overlap();
        let build = |op: WriteOp| match &m {
            Mutation::Write(d) => op.write(e.offset, d),
            Mutation::Zero => op.zero(e.offset, e.len),
            Mutation::Truncate => op.truncate(e.offset),
        };
        if !self.reads_parent(&layout, e.object, overlap) {
            if matches!(m, Mutation::Truncate) {
                // Cutting a missing object must not create it.
                return match io
                    .operate(build(WriteOp::new().assert_exists()), &name)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(err) if is_not_found(&err) => Ok(()),
                    Err(err) => Err(err.into()),
                };
            }
            io.operate(build(WriteOp::new()), &name).await?;
            return Ok(());
        }
        match io
            .operate(build(WriteOp::new().assert_exists()), &name)
            .await
        {
            Ok(_) => return Ok(()),
            Err(err) if is_not_found(&err) => {}
            Err(err) => return Err(err.into()),
        }
        // Copy-up: the object as the parent has it, then this change, in one atomic op.
        let content = self.parent_object(layout, e.object, overlap).await?;
        let op = build(WriteOp::new().create(true).write_full(&content));
        match io.operate(op, &name).await {
            Ok(_) => Ok(()),
            Err(ClientError::Exists { .. }) => {
                io.operate(build(WriteOp::new()), &name).await?;
                Ok(())
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Object `object`'s bytes as the parent has them (within the overlap), trailing zeros cut.
    async fn parent_object(
        &self,
        layout: Layout,
        object: u64,
        overlap: u64,
    ) -> Result<Vec<u8>, RbdError> {
        let Some(parent) = &self.inner.parent else {
            return Ok(Vec::new());
        };
        let su = layout.stripe_unit;
        let mut pieces = Vec::new();
        let mut off = 0;
        while off < layout.object_size() {
            let img = layout.image_offset(object, off);
            if img >= overlap {
                break;
            }
            pieces.push((off, img, su.min(overlap - img)));
            off += su;
        }
        let reads = pieces.iter().map(|&(_, img, n)| parent.read(img, n));
        let parts = futures::future::try_join_all(reads).await?;
        let mut buf = Vec::new();
        for ((off, _, _), part) in pieces.iter().zip(parts) {
            let off = *off as usize;
            if buf.len() < off + part.len() {
                buf.resize(off + part.len(), 0);
            }
            buf[off..off + part.len()].copy_from_slice(&part);
        }
        let used = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        buf.truncate(used);
        Ok(buf)
    }

    /// Discards `len` bytes at `offset`: they read as zeros and their space is freed (whole
    /// objects are removed; parts of objects are punched out).
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        let _guard = self.write_guard().await?;
        self.check_range(offset, len)?;
        self.discard_locked(offset, len).await
    }

    async fn discard_locked(&self, offset: u64, len: u64) -> Result<(), RbdError> {
        let layout = self.layout();
        let overlap = self.overlap();
        let mut by_object: BTreeMap<u64, Vec<ObjectExtent>> = BTreeMap::new();
        for e in layout.map(offset, len) {
            by_object.entry(e.object).or_default().push(e);
        }
        let size = self.size();
        let jobs = by_object.into_iter().map(|(object, extents)| {
            // Bytes of the object inside the image: covering them all discards the object.
            let in_image = layout.object_len(object, size);
            let whole = extents.iter().map(|e| e.len).sum::<u64>() >= in_image;
            async move {
                if whole {
                    self.discard_object(layout, object, overlap).await
                } else {
                    for e in extents {
                        let m = if e.offset + e.len >= in_image {
                            Mutation::Truncate
                        } else {
                            Mutation::Zero
                        };
                        self.mutate(layout, e, m).await?;
                    }
                    Ok(())
                }
            }
        });
        futures::stream::iter(jobs)
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    async fn discard_object(
        &self,
        layout: Layout,
        object: u64,
        overlap: u64,
    ) -> Result<(), RbdError> {
        self.will_change(object);
        let io = self.data_io();
        let name = self.object_name(object);
        if self.reads_parent(&layout, object, overlap) {
            // An empty object hides the parent's bytes.
            io.operate(WriteOp::new().create(false).truncate(0), &name)
                .await?;
            return Ok(());
        }
        match io.remove(&name).await {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes `len` bytes at `offset` read as zeros. With `may_free` the space is freed (as
    /// [`Image::discard`]); without it zeros are written, so the range stays allocated.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        may_free: bool,
    ) -> Result<(), RbdError> {
        if may_free {
            return self.discard(offset, len).await;
        }
        let _guard = self.write_guard().await?;
        self.check_range(offset, len)?;
        let layout = self.layout();
        let extents = layout.map(offset, len);
        let jobs = extents.into_iter().map(|e| {
            let zeros = Bytes::from(vec![0u8; e.len as usize]);
            self.mutate(layout, e, Mutation::Write(zeros))
        });
        futures::stream::iter(jobs)
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Every acknowledged write is already durable on all of its copies: nothing to do. (The
    /// library keeps no write-back cache.)
    pub async fn flush(&self) -> Result<(), RbdError> {
        Ok(())
    }

    /// Which parts of `offset..offset+len` hold data and which are holes, in order (adjacent
    /// runs of one kind merged).
    pub fn extents(
        &self,
        offset: u64,
        len: u64,
    ) -> futures::future::BoxFuture<'_, Result<Vec<Extent>, RbdError>> {
        Box::pin(async move {
            self.check_range(offset, len)?;
            let layout = self.layout();
            let overlap = self.overlap();
            let extents = layout.map(offset, len);
            let io = self.data_io();
            let names: Vec<String> = extents.iter().map(|e| self.object_name(e.object)).collect();
            let stats = futures::stream::iter(names.into_iter().map(move |name| {
                let io = io.clone();
                async move {
                    match io.stat(&name).await {
                        Ok(st) => Ok(Some(st.size)),
                        Err(err) if is_not_found(&err) => Ok(None),
                        Err(err) => Err(RbdError::from(err)),
                    }
                }
            }))
            .buffered(PARALLEL)
            .try_collect::<Vec<_>>()
            .await?;
            let mut out: Vec<Extent> = Vec::new();
            let mut push = |offset: u64, len: u64, data: bool| {
                if len == 0 {
                    return;
                }
                match out.last_mut() {
                    Some(last) if last.data == data && last.offset + last.len == offset => {
                        last.len += len
                    }
                    _ => out.push(Extent { offset, len, data }),
                }
            };
            for (e, size) in extents.iter().zip(stats) {
                match size {
                    Some(size) => {
                        let data_len = size.saturating_sub(e.offset).min(e.len);
                        push(e.image_offset, data_len, true);
                        push(e.image_offset + data_len, e.len - data_len, false);
                    }
                    None => match &self.inner.parent {
                        Some(parent) if e.image_offset < overlap => {
                            let n = e.len.min(overlap - e.image_offset);
                            for x in parent.extents(e.image_offset, n).await? {
                                push(x.offset, x.len, x.data);
                            }
                            push(e.image_offset + n, e.len - n, false);
                        }
                        _ => push(e.image_offset, e.len, false),
                    },
                }
            }
            Ok(out)
        })
    }

    /// Grows or shrinks the image. Shrinking discards the bytes past the new end.
    pub async fn resize(&self, size: u64) -> Result<(), RbdError> {
        let guard = self.write_guard().await?;
        self.refresh().await?;
        let old = self.size();
        if size < old {
            // The parent shows through no further than the new end: bytes past it are
            // dropped, not copied up.
            self.update_header(|h| {
                if let Some(p) = &mut h.parent {
                    p.overlap = p.overlap.min(size);
                }
                Ok(())
            })
            .await?;
            self.discard_locked(size, old - size).await?;
        }
        self.update_header(|h| {
            h.size = size;
            if let Some(p) = &mut h.parent {
                p.overlap = p.overlap.min(size);
            }
            Ok(())
        })
        .await?;
        drop(guard);
        self.header_changed().await;
        Ok(())
    }

    /// Provisioned size and bytes stored by the image's objects.
    pub async fn usage(&self) -> Result<Usage, RbdError> {
        let io = self.data_io();
        let names = data_objects(&io, &self.inner.id).await?;
        let with_snaps = !self.header().snaps.is_empty();
        let sizes = futures::stream::iter(names.into_iter().map(|n| {
            let io = io.clone();
            async move {
                if with_snaps {
                    // The head and the clones kept for snapshots.
                    return match io.list_snaps(&n).await {
                        Ok(ss) => Ok(ss.head_size.unwrap_or(0)
                            + ss.clones.iter().map(|c| c.size).sum::<u64>()),
                        Err(e) if is_not_found(&e) => Ok(0),
                        Err(e) => Err(RbdError::from(e)),
                    };
                }
                match io.stat(&n).await {
                    Ok(st) => Ok(st.size),
                    Err(e) if is_not_found(&e) => Ok(0),
                    Err(e) => Err(RbdError::from(e)),
                }
            }
        }))
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<u64>>()
        .await?;
        Ok(Usage {
            provisioned: self.size(),
            used: sizes.iter().sum(),
        })
    }

    /// Copies every object the parent still provides into this clone and detaches it.
    pub async fn flatten(&self, progress: impl Fn(u64, u64) + Send + Sync) -> Result<(), RbdError> {
        let _guard = self.write_guard().await?;
        let h = self.header();
        let Some(parent) = h.parent.clone().filter(|p| p.overlap > 0) else {
            return Err(RbdError::Invalid(format!(
                "image '{}' is not a clone (or is flattened already)",
                self.inner.name
            )));
        };
        let layout = h.layout;
        let overlap = self.overlap();
        let count = layout.object_count(overlap);
        let done = std::sync::atomic::AtomicU64::new(0);
        let io = self.data_io();
        futures::stream::iter((0..count).map(|object| {
            let io = io.clone();
            let done = &done;
            let progress = &progress;
            async move {
                let name = self.object_name(object);
                let content = self.parent_object(layout, object, overlap).await?;
                if !content.is_empty() {
                    self.will_change(object);
                    match io
                        .operate(WriteOp::new().create(true).write_full(&content), &name)
                        .await
                    {
                        Ok(_) | Err(ClientError::Exists { .. }) => {}
                        Err(e) => return Err(RbdError::from(e)),
                    }
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
            if let Some(p) = &mut h.parent {
                // The head reads nothing from the parent any more; snapshots taken before
                // still do (they keep the link until they are removed).
                p.overlap = 0;
            }
            Ok(())
        })
        .await?;
        self.detach_if_unused(&parent).await
    }

    /// Drops the link to the parent once neither the head nor any snapshot reads from it, and
    /// tells the parent (its snapshot may then be unprotected).
    pub(crate) async fn detach_if_unused(&self, parent: &ParentSpec) -> Result<(), RbdError> {
        let mut detached = false;
        self.update_header(|h| {
            let used = h.parent.as_ref().is_some_and(|p| p.overlap > 0)
                || h.snaps.iter().any(|s| s.parent_overlap.unwrap_or(0) > 0);
            detached = !used && h.parent.is_some();
            if detached {
                h.parent = None;
                for s in &mut h.snaps {
                    s.parent_overlap = None;
                }
            }
            Ok(())
        })
        .await?;
        if !detached {
            return Ok(());
        }
        let pio = self.inner.rbd.ioctx(&parent.pool).await?;
        let (pool, id) = (self.inner.pool.clone(), self.inner.id.clone());
        update_header(&pio, &parent.image_id, |ph| {
            ph.children
                .retain(|c| !(c.image_id == id && c.pool == pool));
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// The client instances that have the image open (they watch its header).
    pub async fn watchers(&self) -> Result<Vec<String>, RbdError> {
        Ok(self
            .inner
            .meta
            .watchers(&header_object(&self.inner.id))
            .await?
            .into_iter()
            .map(|w| w.instance)
            .collect())
    }

    /// The clones made from this image's snapshots: (pool, image name, snapshot name).
    pub async fn children(&self) -> Result<Vec<(String, String, String)>, RbdError> {
        if self.inner.snap.is_none() {
            self.refresh().await?;
        }
        let h = self.header();
        let mut out = Vec::new();
        for c in &h.children {
            let name = self.inner.rbd.image_name(&c.pool, &c.image_id).await?;
            let snap = h
                .snap_by_id(c.snap_id)
                .map(|s| s.name.clone())
                .unwrap_or_else(|| c.snap_id.to_string());
            out.push((c.pool.clone(), name, snap));
        }
        Ok(out)
    }
}

/// `b` itself if it has `len` bytes, else cut or padded with zeros to `len`.
fn pad_to(b: Bytes, len: u64) -> Bytes {
    if b.len() as u64 == len {
        b
    } else {
        pad(b, len)
    }
}

fn pad(b: Bytes, len: u64) -> Bytes {
    let mut v = BytesMut::with_capacity(len as usize);
    v.extend_from_slice(&b[..b.len().min(len as usize)]);
    v.resize(len as usize, 0);
    v.freeze()
}

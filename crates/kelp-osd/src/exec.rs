//! Executes one compound `OsdOp` against the store.
//!
//! A write op becomes exactly one store transaction (data, attributes, the object's new version
//! and mtime); the PG layer adds the PG-log entry to the same transaction, so data and log
//! commit together. Guards (`AssertExists`, `AssertVersion`, `CmpXattr`, `CmpOmap`) are evaluated before
//! anything is queued, so a failed guard leaves no trace. Replicas run the same function with
//! the primary's version and mtime: with identical prior state they produce the identical
//! transaction (appends resolve to the same offset), which is what keeps replicas equal.
//!
//! Reserved attribute names: user xattrs are stored as `_NAME`; Kelp's own per-object metadata
//! uses `@v` (version, u64 LE) and `@m` (mtime in ns, u64 LE), which users cannot reach.

use std::collections::BTreeMap;

use bytes::Bytes;
use kelp_proto::{CmpOp, ErrorCode, ObjectLocator, OpKind, OpResult};
use kelp_store::Op;
use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError, Transaction};

const VERSION_ATTR: &str = "@v";
const MTIME_ATTR: &str = "@m";
const USER_PREFIX: &str = "_";

/// Size limits enforced on every op (Ceph's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `osd_max_object_size`: no byte of an object may lie beyond this.
    pub max_object_size: u64,
    /// `osd_max_write_size`: data carried by one op.
    pub max_write_size: u64,
    /// Largest xattr value.
    pub max_xattr_size: u64,
    /// Most omap entries returned by one listing.
    pub max_omap_entries: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_object_size: 128 << 20,
            max_write_size: 90 << 20,
            max_xattr_size: 64 << 10,
            max_omap_entries: 10_000,
        }
    }
}

/// Why an op was refused: a stable code plus a message for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ExecError {
    pub code: ErrorCode,
    pub message: String,
}

fn err<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, ExecError> {
    Err(ExecError {
        code,
        message: message.into(),
    })
}

impl From<StoreError> for ExecError {
    fn from(e: StoreError) -> Self {
        let code = match &e {
            StoreError::ChecksumMismatch { .. } => ErrorCode::Corrupt,
            StoreError::NoSpace { .. } => ErrorCode::Full,
            StoreError::ObjectNotFound { .. } => ErrorCode::NotFound,
            StoreError::InvalidArgument { .. } => ErrorCode::Invalid,
            _ => ErrorCode::Io,
        };
        ExecError {
            code,
            message: e.to_string(),
        }
    }
}

/// The store's object id for a locator: ordered by the placement hash, as backfill and scrub
/// walk a PG.
/// A snapshot clone (`crate::snapset`) is placed by its head's hash, so it lives in the head's
/// PG and sorts next to it.
pub fn object_id(loc: &ObjectLocator) -> ObjectId {
    let hash = match crate::snapset::parse_clone(&loc.namespace, &loc.name) {
        Some((ns, name, _)) => kelp_crush::object_hash(name, loc.key.as_deref(), ns),
        None => kelp_crush::object_hash(&loc.name, loc.key.as_deref(), &loc.namespace),
    };
    ObjectId::new(loc.pool, &loc.namespace, &loc.name, hash)
}

/// What a write stamps on the object: its new version (the PG-log version) and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub version: u64,
    pub mtime_ns: u64,
}

/// The read payloads of an op, in op order. A single data read keeps the store's buffer as it
/// came (a large one is the store's own read buffer, sent without a copy); anything more is
/// gathered into one buffer.
#[derive(Debug, Default)]
pub struct OutData {
    whole: Option<Bytes>,
    gathered: Vec<u8>,
}

impl OutData {
    fn push(&mut self, b: Bytes) {
        if self.whole.is_none() && self.gathered.is_empty() {
            self.whole = Some(b);
        } else {
            self.extend_from_slice(&b);
        }
    }

    fn extend_from_slice(&mut self, d: &[u8]) {
        if let Some(w) = self.whole.take() {
            self.gathered.extend_from_slice(&w);
        }
        self.gathered.extend_from_slice(d);
    }

    pub fn len(&self) -> usize {
        self.whole.as_ref().map_or(0, Bytes::len) + self.gathered.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn into_bytes(self) -> Bytes {
        match self.whole {
            Some(w) => w,
            None => Bytes::from(self.gathered),
        }
    }
}

/// The outcome of an op.
#[derive(Debug, Default)]
pub struct Executed {
    /// Store transaction for a write (empty for reads).
    pub txn: Transaction,
    /// Whether the op modified the object (it then gets a PG-log entry).
    pub is_write: bool,
    /// Whether the object exists after the op.
    pub exists_after: bool,
    /// Whether the op left a whiteout head (removed, its snapshot clones kept): stored, but
    /// absent for clients.
    pub whiteout_after: bool,
    pub outs: Vec<OpResult>,
    /// Read payloads, in op order.
    pub out_data: OutData,
    /// The object's version after the op (0 if it does not exist).
    pub version: u64,
    /// How a write changed its PG's object and byte counts.
    pub stat_delta: StatDelta,
}

/// A write's change to its PG's statistics: objects created (+1) or removed (-1), and the
/// change of the object's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatDelta {
    pub objects: i64,
    pub bytes: i64,
}

/// Runs `ops` on object `loc` in collection `coll`. Writes get `stamp` on the object. `data` holds the ops' payloads in order.
pub fn execute(
    store: &dyn ObjectStore,
    coll: CollectionId,
    loc: &ObjectLocator,
    ops: &[OpKind],
    data: &Bytes,
    stamp: Stamp,
    limits: &Limits,
) -> Result<Executed, ExecError> {
    let Stamp {
        version: new_version,
        mtime_ns,
    } = stamp;
    if ops.is_empty() {
        return err(ErrorCode::Invalid, "an op needs at least one operation");
    }
    if (loc.namespace.starts_with('\u{1f}') && !crate::snapset::is_clone_namespace(&loc.namespace))
        || loc.name.is_empty()
    {
        return err(
            ErrorCode::Invalid,
            "object names must not be empty and namespaces must not start with \\x1f",
        );
    }
    let writes = ops.iter().filter(|o| o.is_write()).count();
    let reads = ops.iter().filter(|o| !o.is_write() && !is_guard(o)).count();
    if writes > 0 && reads > 0 {
        return err(
            ErrorCode::Invalid,
            "an op either reads or writes; split reads and writes into separate ops",
        );
    }
    let total: u64 = ops.iter().map(OpKind::data_len).sum();
    if total != data.len() as u64 {
        return err(
            ErrorCode::Invalid,
            format!("ops describe {total} bytes of data but {} came", data.len()),
        );
    }
    if total > limits.max_write_size {
        return err(
            ErrorCode::TooBig,
            format!(
                "op carries {total} bytes; osd_max_write_size is {}",
                limits.max_write_size
            ),
        );
    }
    let oid = object_id(loc);
    // Every store call here is a metadata lookup, the bulk of a small op's cost. Reads learn
    // existence and version from one lookup (the attributes) and fetch the size only when an
    // op needs it; writes need existence and size, and the old version only for a guard (the
    // reply carries the new version).
    let read_only = writes == 0;
    let missing = |e: StoreError| -> Result<(), ExecError> {
        match e {
            StoreError::ObjectNotFound { .. } => Ok(()),
            StoreError::CollectionNotFound { .. } => err(
                ErrorCode::Misdirected,
                format!("this OSD does not hold PG {}", coll.0),
            ),
            e => Err(e.into()),
        }
    };
    let mut attrs = None;
    let (mut exists, mut size, mut size_known) = (false, 0, true);
    if read_only {
        match store.xattrs(coll, &oid) {
            Ok(a) => {
                (exists, size_known) = (true, false);
                attrs = Some(a);
            }
            Err(e) => missing(e)?,
        }
    } else {
        match store.stat(coll, &oid) {
            Ok(st) => (exists, size) = (true, st.size),
            Err(e) => missing(e)?,
        }
    }
    // Snapshot bookkeeping (`crate::snapset`): only ops a primary planned for a pool with
    // snapshots carry it, so other writes never pay for the whiteout lookup.
    let snap_mode = ops.iter().any(OpKind::is_internal);
    let mut whiteout_before = false;
    if snap_mode && exists && !read_only {
        whiteout_before = store
            .xattr(coll, &oid, crate::snapset::WHITEOUT_ATTR)?
            .is_some();
        if whiteout_before {
            (exists, size) = (false, 0);
        }
    }
    let (existed, size_before) = (exists, size);
    let mut final_snapset: Option<crate::snapset::SnapSet> = None;
    let mut clone_delta = StatDelta::default();
    let version = match &attrs {
        Some(a) => u64_attr(a.get(VERSION_ATTR), VERSION_ATTR)?,
        None if exists
            && ops
                .iter()
                .any(|o| matches!(o, OpKind::AssertVersion { .. })) =>
        {
            read_u64_attr(store, coll, &oid, VERSION_ATTR)?
        }
        None => 0,
    };

    let mut out = Executed {
        version,
        ..Executed::default()
    };
    let mut cursor = 0usize;
    // Payloads are slices of the op's data segment: written data reaches the store uncopied.
    let mut take = |len: u64| -> Bytes {
        let start = cursor;
        cursor += len as usize;
        data.slice(start..cursor)
    };
    // xattrs set earlier in this op, for guards that follow them
    let mut pending_xattrs: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
    let txn = &mut out.txn;
    let check_extent = |offset: u64, len: u64| -> Result<(), ExecError> {
        match offset.checked_add(len) {
            Some(end) if end <= limits.max_object_size => Ok(()),
            _ => err(
                ErrorCode::TooBig,
                format!(
                    "a write to [{offset}, +{len}) would pass osd_max_object_size ({})",
                    limits.max_object_size
                ),
            ),
        }
    };
    let not_found = || {
        err::<()>(
            ErrorCode::NotFound,
            format!("object '{}' does not exist", loc.name),
        )
    };

    for op in ops {
        let outs_before = out.outs.len();
        match op {
            OpKind::AssertExists => {
                if !exists {
                    not_found()?;
                }
            }
            OpKind::AssertVersion { version: want } => {
                if version != *want {
                    return err(
                        ErrorCode::Canceled,
                        format!("object version is {version}, not {want}"),
                    );
                }
            }
            OpKind::CmpXattr { name, op, len } => {
                let value = take(*len);
                let current = match pending_xattrs.get(name) {
                    Some(v) => v.clone(),
                    None if exists => store.xattr(coll, &oid, &user_attr(name))?,
                    None => None,
                };
                let equal = current.as_deref() == Some(&value[..]);
                let holds = match op {
                    CmpOp::Eq => equal,
                    CmpOp::Ne => !equal,
                };
                if !holds {
                    return err(
                        ErrorCode::Canceled,
                        format!("xattr '{name}' comparison failed"),
                    );
                }
            }
            OpKind::CmpOmap { key, op, len } => {
                let want = len.map(&mut take);
                let current = if exists {
                    store
                        .omap_get(coll, &oid, &[key.as_bytes().to_vec()])?
                        .into_iter()
                        .next()
                        .map(|(_, v)| v)
                } else {
                    None
                };
                let equal = current.as_deref() == want.as_deref();
                let holds = match op {
                    CmpOp::Eq => equal,
                    CmpOp::Ne => !equal,
                };
                if !holds {
                    return err(
                        ErrorCode::Canceled,
                        format!("omap key '{key}' comparison failed"),
                    );
                }
            }
            OpKind::Create { exclusive } => {
                if exists && *exclusive {
                    return err(
                        ErrorCode::Exists,
                        format!("object '{}' already exists", loc.name),
                    );
                }
                txn.touch(coll, &oid);
                exists = true;
            }
            OpKind::WriteFull { len } => {
                check_extent(0, *len)?;
                let bytes = take(*len);
                txn.truncate(coll, &oid, 0);
                if !bytes.is_empty() {
                    txn.write(coll, &oid, 0, bytes);
                }
                exists = true;
                size = *len;
            }
            OpKind::Write { offset, len } => {
                check_extent(*offset, *len)?;
                let bytes = take(*len);
                if bytes.is_empty() {
                    txn.touch(coll, &oid);
                } else {
                    txn.write(coll, &oid, *offset, bytes);
                }
                exists = true;
                size = size.max(offset + len);
            }
            OpKind::Append { len } => {
                check_extent(size, *len)?;
                let bytes = take(*len);
                if bytes.is_empty() {
                    txn.touch(coll, &oid);
                } else {
                    txn.write(coll, &oid, size, bytes);
                }
                exists = true;
                size += len;
            }
            OpKind::Truncate { size: new } => {
                check_extent(0, *new)?;
                txn.truncate(coll, &oid, *new);
                exists = true;
                size = *new;
            }
            OpKind::Zero { offset, len } => {
                // Zeroing a missing object, or past its end, changes nothing (as in Ceph).
                if exists && *offset < size {
                    let end = offset.saturating_add(*len).min(size);
                    txn.zero(coll, &oid, *offset, end - offset);
                }
            }
            OpKind::Remove => {
                if !exists {
                    not_found()?;
                }
                txn.remove(coll, &oid);
                exists = false;
                size = 0;
                pending_xattrs.clear();
            }
            OpKind::SetXattr { name, len } => {
                check_attr_name(name)?;
                if *len > limits.max_xattr_size {
                    return err(
                        ErrorCode::TooBig,
                        format!("xattr '{name}' value is {len} bytes"),
                    );
                }
                let value = take(*len).to_vec();
                txn.touch(coll, &oid);
                exists = true;
                txn.push(Op::SetXattrs {
                    coll,
                    oid: oid.clone(),
                    attrs: BTreeMap::from([(user_attr(name), value.clone())]),
                });
                pending_xattrs.insert(name.clone(), Some(value));
            }
            OpKind::RmXattr { name } => {
                check_attr_name(name)?;
                if !exists {
                    not_found()?;
                }
                txn.rm_xattr(coll, &oid, &user_attr(name));
                pending_xattrs.insert(name.clone(), None);
            }
            OpKind::OmapSet { entries } => {
                txn.touch(coll, &oid);
                exists = true;
                let mut map = BTreeMap::new();
                for (key, len) in entries {
                    map.insert(key.as_bytes().to_vec(), take(*len).to_vec());
                }
                txn.omap_set(coll, &oid, map);
            }
            OpKind::OmapRm { keys } => {
                if !exists {
                    not_found()?;
                }
                txn.omap_remove(
                    coll,
                    &oid,
                    keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
                );
            }
            OpKind::OmapClear => {
                if !exists {
                    not_found()?;
                }
                txn.omap_clear(coll, &oid);
            }
            OpKind::OmapSetHeader { len } => {
                txn.touch(coll, &oid);
                exists = true;
                txn.omap_set_header(coll, &oid, take(*len).to_vec());
            }
            // ---- snapshots (internal ops a primary planned; `crate::snapset`)
            OpKind::SnapClone { clone } => {
                if !exists {
                    not_found()?;
                }
                let clone_oid = object_id(&crate::snapset::clone_locator(loc, *clone));
                txn.clone_object(coll, &oid, &clone_oid);
                txn.rm_xattr(coll, &clone_oid, crate::snapset::SNAPSET_ATTR);
                clone_delta.objects += 1;
                clone_delta.bytes += size as i64;
            }
            OpKind::SnapRestore { clone } => {
                let clone_oid = object_id(&crate::snapset::clone_locator(loc, *clone));
                let clone_size = match store.stat(coll, &clone_oid) {
                    Ok(st) => st.size,
                    Err(StoreError::ObjectNotFound { .. }) => {
                        return err(
                            ErrorCode::NotFound,
                            format!("clone {clone} of '{}' is missing", loc.name),
                        );
                    }
                    Err(e) => return Err(e.into()),
                };
                txn.clone_object(coll, &clone_oid, &oid);
                exists = true;
                size = clone_size;
                pending_xattrs.clear();
            }
            OpKind::SnapSetHead { snapset } => {
                let Some(ss) = crate::snapset::SnapSet::decode(snapset) else {
                    return err(ErrorCode::Invalid, "undecodable snapset");
                };
                final_snapset = Some(ss);
            }
            // an op flag, taken out by the primary (harmless if it were left)
            OpKind::FullTry => {}
            OpKind::SnapContext { .. }
            | OpKind::ReadAtSnap { .. }
            | OpKind::ListSnaps
            | OpKind::Rollback { .. }
            | OpKind::SnapTrim => {
                return err(
                    ErrorCode::Invalid,
                    "snapshot operations are resolved by the PG's primary",
                );
            }
            // ---- reads
            OpKind::Read { offset, len } => {
                if !exists {
                    not_found()?;
                }
                let want = match (*len, size_known) {
                    (0, true) => size.saturating_sub(*offset),
                    // The store clips reads at the object's end: one byte more than allowed
                    // tells a too-large object without asking for its size first.
                    (0, false) => limits.max_write_size + 1,
                    (len, _) => len,
                };
                if want > limits.max_write_size && (*len != 0 || size_known) {
                    return err(
                        ErrorCode::TooBig,
                        format!("read of {want} bytes is too large"),
                    );
                }
                let bytes = store.read_bytes(coll, &oid, *offset, want)?;
                if bytes.len() as u64 > limits.max_write_size {
                    return err(
                        ErrorCode::TooBig,
                        format!("read of more than {} bytes", limits.max_write_size),
                    );
                }
                out.outs.push(OpResult::Data {
                    len: bytes.len() as u64,
                });
                out.out_data.push(bytes);
            }
            OpKind::Stat => {
                if !exists {
                    not_found()?;
                }
                let mtime_ns = match &attrs {
                    Some(a) => u64_attr(a.get(MTIME_ATTR), MTIME_ATTR)?,
                    None => read_u64_attr(store, coll, &oid, MTIME_ATTR)?,
                };
                if !size_known {
                    size = store.stat(coll, &oid)?.size;
                    size_known = true;
                }
                out.outs.push(OpResult::Stat {
                    size,
                    mtime_ns,
                    version,
                });
            }
            OpKind::GetXattr { name } => {
                if !exists {
                    not_found()?;
                }
                match store.xattr(coll, &oid, &user_attr(name))? {
                    Some(v) => {
                        out.outs.push(OpResult::Data {
                            len: v.len() as u64,
                        });
                        out.out_data.extend_from_slice(&v);
                    }
                    None => return err(ErrorCode::NoData, format!("no xattr '{name}'")),
                }
            }
            OpKind::GetXattrs => {
                if !exists {
                    not_found()?;
                }
                let mut entries = Vec::new();
                for (k, v) in store.xattrs(coll, &oid)? {
                    if let Some(name) = k.strip_prefix(USER_PREFIX) {
                        entries.push((name.to_string(), v.len() as u64));
                        out.out_data.extend_from_slice(&v);
                    }
                }
                out.outs.push(OpResult::Xattrs { entries });
            }
            OpKind::OmapGetVals {
                start_after,
                prefix,
                max,
            } => {
                if !exists {
                    not_found()?;
                }
                let max = (*max).min(limits.max_omap_entries) as usize;
                let mut entries = Vec::new();
                let mut after: Option<Vec<u8>> =
                    (!start_after.is_empty()).then(|| start_after.as_bytes().to_vec());
                let mut more = false;
                'pages: loop {
                    let page = store.omap_iter(coll, &oid, after.as_deref(), max.max(1))?;
                    for (k, v) in &page.entries {
                        if !k.starts_with(prefix.as_bytes()) {
                            if k.as_slice() > prefix.as_bytes() {
                                break 'pages;
                            }
                            continue;
                        }
                        if entries.len() == max {
                            more = true;
                            break 'pages;
                        }
                        let key = String::from_utf8_lossy(k).into_owned();
                        entries.push((key, v.len() as u64));
                        out.out_data.extend_from_slice(v);
                    }
                    match page.entries.last() {
                        Some((k, _)) if page.more => after = Some(k.clone()),
                        _ => break,
                    }
                }
                out.outs.push(OpResult::Omap { entries, more });
            }
            OpKind::OmapGetValsByKeys { keys } => {
                if !exists {
                    not_found()?;
                }
                let raw: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
                let found = store.omap_get(coll, &oid, &raw)?;
                let mut entries = Vec::new();
                for (k, v) in found {
                    entries.push((String::from_utf8_lossy(&k).into_owned(), v.len() as u64));
                    out.out_data.extend_from_slice(&v);
                }
                out.outs.push(OpResult::Omap {
                    entries,
                    more: false,
                });
            }
            OpKind::OmapGetHeader => {
                if !exists {
                    not_found()?;
                }
                let h = store.omap_header(coll, &oid)?.unwrap_or_default();
                out.outs.push(OpResult::Data {
                    len: h.len() as u64,
                });
                out.out_data.extend_from_slice(&h);
            }
        }
        if out.outs.len() == outs_before {
            out.outs.push(OpResult::None);
        }
    }
    out.is_write = writes > 0;
    out.exists_after = exists;
    let mut whiteout_after = false;
    if let Some(ss) = &final_snapset {
        let attr = |txn: &mut Transaction, name: &str, value: Vec<u8>| {
            txn.push(Op::SetXattrs {
                coll,
                oid: oid.clone(),
                attrs: BTreeMap::from([(name.to_string(), value)]),
            });
        };
        if exists {
            attr(&mut out.txn, crate::snapset::SNAPSET_ATTR, ss.encode());
            if whiteout_before {
                out.txn.rm_xattr(coll, &oid, crate::snapset::WHITEOUT_ATTR);
            }
        } else if crate::snapset::keeps_whiteout(ss) {
            // Removed (now or before) with clones left: a whiteout carries the snapset.
            out.txn.touch(coll, &oid);
            attr(&mut out.txn, crate::snapset::SNAPSET_ATTR, ss.encode());
            attr(&mut out.txn, crate::snapset::WHITEOUT_ATTR, Vec::new());
            whiteout_after = true;
        } else if whiteout_before {
            // The last clone is gone: so is the whiteout.
            out.txn.remove(coll, &oid);
        }
    }
    out.whiteout_after = whiteout_after;
    if out.is_write {
        let bytes = |there: bool, size: u64| if there { size as i64 } else { 0 };
        // Objects count as stored (a whiteout is one, of no bytes); clones count too.
        let stored = |there: bool, whiteout: bool| i64::from(there || whiteout);
        out.stat_delta = StatDelta {
            objects: stored(exists, whiteout_after) - stored(existed, whiteout_before)
                + clone_delta.objects,
            bytes: bytes(exists, size) - bytes(existed, size_before) + clone_delta.bytes,
        };
        if exists || whiteout_after {
            out.txn.push(Op::SetXattrs {
                coll,
                oid: oid.clone(),
                attrs: BTreeMap::from([
                    (VERSION_ATTR.to_string(), new_version.to_le_bytes().to_vec()),
                    (MTIME_ATTR.to_string(), mtime_ns.to_le_bytes().to_vec()),
                ]),
            });
            out.version = new_version;
        } else {
            out.version = 0;
        }
    }
    Ok(out)
}

fn is_guard(op: &OpKind) -> bool {
    matches!(
        op,
        OpKind::AssertExists
            | OpKind::AssertVersion { .. }
            | OpKind::CmpXattr { .. }
            | OpKind::CmpOmap { .. }
    )
}

fn user_attr(name: &str) -> String {
    format!("{USER_PREFIX}{name}")
}

fn check_attr_name(name: &str) -> Result<(), ExecError> {
    if name.is_empty() || name.len() > 255 {
        return err(ErrorCode::Invalid, "xattr names are 1 to 255 bytes");
    }
    Ok(())
}

fn read_u64_attr(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
    name: &str,
) -> Result<u64, ExecError> {
    u64_attr(store.xattr(coll, oid, name)?.as_ref(), name)
}

fn u64_attr(value: Option<&Vec<u8>>, name: &str) -> Result<u64, ExecError> {
    match value {
        None => Ok(0),
        Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => Ok(u64::from_le_bytes(b)),
            Err(_) => err(
                ErrorCode::Corrupt,
                format!("object attribute {name} is {} bytes, not 8", v.len()),
            ),
        },
    }
}

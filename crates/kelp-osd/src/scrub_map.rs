//! Scrub's comparison and maps, without the worker: what a member reports about a range of a
//! PG (`build_map`, blocking store reads, checksums verified by the store on a deep read),
//! how the primary compares the members' maps (`compare_chunk`) and picks the authoritative
//! copy (`choose_authoritative`), and the range a chunk's scrub holds writes back for
//! (`ScrubBlock`). No network, no locks: `scrub` runs these for the PG's primary and members.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kelp_proto::{InconsistentObject, ListCursor, ScrubObject, ShardError, ShardReport};
use kelp_store::{CollectionId, ObjectId, ObjectStore, StoreError};
use kelp_types::PgId;

use crate::pglog::INTERNAL_NAMESPACE;

/// Data read per store call in a deep scrub.
const DEEP_READ: u64 = 4 << 20;

// ---------------------------------------------------------------------------------------------
// The pure part: comparing scrub maps and choosing the authoritative copy.

/// What the PG log says about an object: the version of its newest entry and whether that
/// entry deleted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHint {
    pub version: u64,
    pub deleted: bool,
}

/// The copy a repair installs everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// This member's copy.
    Copy(i32),
    /// The object must not exist (the PG log's newest entry deleted it).
    Absent,
    /// No member has a usable copy.
    Unusable,
}

/// What two copies must share to be identical: size, version, attrs, omap and data digests.
type Fingerprint = (u64, u64, u32, u32, Option<u32>);

pub(crate) fn fingerprint(o: &ScrubObject) -> Fingerprint {
    (
        o.size,
        o.version,
        o.attrs_digest,
        o.omap_digest,
        o.data_digest,
    )
}

/// Picks the authoritative copy among `copies` (member → its copy, `None` if it has none):
/// copies with a read error are never chosen; if the log's newest entry deleted the object (and
/// no copy is newer) the object should be absent; otherwise the copies at the version the log
/// names (or, if the log no longer mentions the object, the newest version); among those the
/// largest group of identical copies; ties go to the group holding the primary, then to the
/// lowest OSD id. Within the chosen group the primary's copy is preferred.
pub fn choose_authoritative(
    copies: &BTreeMap<i32, Option<&ScrubObject>>,
    primary: i32,
    log: Option<LogHint>,
) -> Authority {
    let usable: Vec<(i32, &ScrubObject)> = copies
        .iter()
        .filter_map(|(&osd, c)| c.filter(|o| o.read_error.is_none()).map(|o| (osd, o)))
        .collect();
    let newest = usable.iter().map(|(_, o)| o.version).max();
    if let Some(h) = log
        && h.deleted
        && newest.is_none_or(|v| v <= h.version)
    {
        return Authority::Absent;
    }
    let Some(newest) = newest else {
        return Authority::Unusable;
    };
    let want_version = match log {
        Some(h) if !h.deleted && usable.iter().any(|(_, o)| o.version == h.version) => h.version,
        _ => newest,
    };
    let mut groups: BTreeMap<Fingerprint, Vec<i32>> = BTreeMap::new();
    for (osd, o) in usable.iter().filter(|(_, o)| o.version == want_version) {
        groups.entry(fingerprint(o)).or_default().push(*osd);
    }
    let best = groups
        .values()
        .max_by(|a, b| {
            a.len()
                .cmp(&b.len())
                .then_with(|| a.contains(&primary).cmp(&b.contains(&primary)))
                .then_with(|| b.iter().min().cmp(&a.iter().min()))
        })
        .expect("at least one usable copy at the chosen version");
    if best.contains(&primary) {
        Authority::Copy(primary)
    } else {
        Authority::Copy(*best.iter().min().expect("groups are not empty"))
    }
}

/// What is wrong with `copy` measured against the authoritative one.
pub(crate) fn shard_errors(
    copy: Option<&ScrubObject>,
    auth: Option<&ScrubObject>,
) -> Vec<ShardError> {
    let mut e = Vec::new();
    match (copy, auth) {
        (None, Some(_)) => e.push(ShardError::Missing),
        (None, None) => {}
        (Some(_), None) => e.push(ShardError::Stale),
        (Some(c), Some(a)) => {
            if c.read_error.is_some() {
                e.push(ShardError::ReadError);
                return e;
            }
            if c.size != a.size {
                e.push(ShardError::SizeMismatch);
            }
            if c.version != a.version {
                e.push(ShardError::VersionMismatch);
            }
            if c.attrs_digest != a.attrs_digest {
                e.push(ShardError::AttrMismatch);
            }
            if c.omap_digest != a.omap_digest {
                e.push(ShardError::OmapDigestMismatch);
            }
            if let (Some(x), Some(y)) = (c.data_digest, a.data_digest)
                && x != y
            {
                e.push(ShardError::DataDigestMismatch);
            }
        }
    }
    e
}

/// Compares the members' scrub maps of one chunk (member → its objects) and returns the
/// objects whose copies disagree, in placement order. `log` gives the PG log's newest entry
/// per (namespace, name).
pub fn compare_chunk(
    maps: &BTreeMap<i32, Vec<ScrubObject>>,
    primary: i32,
    log: &HashMap<(String, String), LogHint>,
) -> Vec<InconsistentObject> {
    let mut by_object: BTreeMap<(u32, String, String), BTreeMap<i32, &ScrubObject>> =
        BTreeMap::new();
    for (&osd, objects) in maps {
        for o in objects {
            by_object
                .entry((o.hash, o.namespace.clone(), o.name.clone()))
                .or_default()
                .insert(osd, o);
        }
    }
    let mut out = Vec::new();
    for ((_, ns, name), have) in by_object {
        let copies: BTreeMap<i32, Option<&ScrubObject>> = maps
            .keys()
            .map(|&osd| (osd, have.get(&osd).copied()))
            .collect();
        let hint = log.get(&(ns.clone(), name.clone())).copied();
        let auth = choose_authoritative(&copies, primary, hint);
        let auth_copy = match auth {
            Authority::Copy(osd) => have.get(&osd).copied(),
            _ => None,
        };
        let mut shards = Vec::new();
        let mut union = BTreeSet::new();
        for (&osd, copy) in &copies {
            let errors = match auth {
                Authority::Unusable => {
                    // No good copy: every copy is bad (unreadable), every absence "missing".
                    match copy {
                        Some(_) => vec![ShardError::ReadError],
                        None => vec![ShardError::Missing],
                    }
                }
                _ => shard_errors(*copy, auth_copy),
            };
            union.extend(errors.iter().copied());
            shards.push(ShardReport {
                osd,
                primary: osd == primary,
                errors,
                object: copy.cloned(),
            });
        }
        if union.is_empty() {
            continue;
        }
        out.push(InconsistentObject {
            namespace: ns,
            name,
            auth_osd: match auth {
                Authority::Copy(osd) => Some(osd),
                _ => None,
            },
            version: auth_copy.map_or_else(|| hint.map_or(0, |h| h.version), |a| a.version),
            errors: union.into_iter().collect(),
            shards,
        });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Scrub maps (blocking store reads).

pub(crate) fn digest_attrs(attrs: &BTreeMap<String, Vec<u8>>) -> (u64, u32) {
    let mut crc = 0u32;
    let mut version = 0;
    for (k, v) in attrs {
        if k == "@v" {
            if let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) {
                version = u64::from_le_bytes(b);
            }
            continue;
        }
        crc = kelp_types::crc32c_append(crc, &(k.len() as u32).to_le_bytes());
        crc = kelp_types::crc32c_append(crc, k.as_bytes());
        crc = kelp_types::crc32c_append(crc, &(v.len() as u32).to_le_bytes());
        crc = kelp_types::crc32c_append(crc, v);
    }
    (version, crc)
}

pub(crate) fn digest_omap(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
) -> Result<u32, StoreError> {
    let mut crc = 0u32;
    if let Some(h) = store.omap_header(coll, oid)? {
        crc = kelp_types::crc32c_append(crc, &[1]);
        crc = kelp_types::crc32c_append(crc, &(h.len() as u32).to_le_bytes());
        crc = kelp_types::crc32c_append(crc, &h);
    }
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = store.omap_iter(coll, oid, after.as_deref(), 1024)?;
        for (k, v) in &page.entries {
            crc = kelp_types::crc32c_append(crc, &(k.len() as u32).to_le_bytes());
            crc = kelp_types::crc32c_append(crc, k);
            crc = kelp_types::crc32c_append(crc, &(v.len() as u32).to_le_bytes());
            crc = kelp_types::crc32c_append(crc, v);
        }
        match page.entries.last() {
            Some((k, _)) if page.more => after = Some(k.clone()),
            _ => return Ok(crc),
        }
    }
}

/// Describes one object; `None` if it vanished meanwhile.
///
/// `ec`: the object is a shard of an erasure-coded object. Shards hold different bytes, so
/// the data digest is left out of the comparison (a deep scrub still reads every byte, and the
/// store's checksums catch a damaged shard as a read error), and the shard metadata enters the
/// attribute digest without the shard's own position.
pub(crate) fn scrub_object(
    store: &dyn ObjectStore,
    coll: CollectionId,
    oid: &ObjectId,
    deep: bool,
    ec: bool,
) -> Option<ScrubObject> {
    let mut o = ScrubObject {
        hash: oid.hash,
        namespace: oid.namespace.clone(),
        name: oid.name.clone(),
        ..ScrubObject::default()
    };
    let shallow = (|| -> Result<(), StoreError> {
        o.size = store.stat(coll, oid)?.size;
        let mut xattrs = store.xattrs(coll, oid)?;
        if ec && let Some(meta) = xattrs.get_mut(crate::ec::EC_ATTR) {
            // Bytes 1..5 are the shard's position (`ec::EcMeta`).
            if meta.len() > 5 {
                meta[1..5].fill(0);
            }
        }
        let (version, attrs) = digest_attrs(&xattrs);
        o.version = version;
        o.attrs_digest = attrs;
        o.omap_digest = digest_omap(store, coll, oid)?;
        Ok(())
    })();
    match shallow {
        Ok(()) => {}
        Err(StoreError::ObjectNotFound { .. }) => return None,
        Err(e) => {
            o.read_error = Some(e.to_string());
            return Some(o);
        }
    }
    if deep {
        let mut crc = 0u32;
        let mut off = 0;
        while off < o.size {
            let len = DEEP_READ.min(o.size - off);
            match store.read_from_device(coll, oid, off, len) {
                Ok(d) if d.len() as u64 == len => crc = kelp_types::crc32c_append(crc, &d),
                Ok(d) => {
                    o.read_error = Some(format!(
                        "short read at offset {off}: {} of {len} bytes",
                        d.len()
                    ));
                    return Some(o);
                }
                Err(e) => {
                    o.read_error = Some(e.to_string());
                    return Some(o);
                }
            }
            off += len;
        }
        o.data_digest = (!ec).then_some(crc);
    }
    Some(o)
}

pub(crate) fn cursor_oid(pg: PgId, c: &ListCursor) -> ObjectId {
    ObjectId::new(pg.pool.0, &c.namespace, &c.name, c.hash)
}

pub(crate) fn oid_cursor(o: &ObjectId) -> ListCursor {
    ListCursor {
        hash: o.hash,
        namespace: o.namespace.clone(),
        name: o.name.clone(),
    }
}

/// The scrub map of `[start, end)` of a PG's collection (blocking).
pub(crate) fn build_map(
    store: &dyn ObjectStore,
    coll: CollectionId,
    start: Option<&ObjectId>,
    end: Option<&ObjectId>,
    deep: bool,
    ec: bool,
) -> Result<Vec<ScrubObject>, StoreError> {
    let mut out = Vec::new();
    let mut from = start.cloned();
    loop {
        let page = store.list_objects(coll, from.as_ref(), 256)?;
        for oid in &page.objects {
            if end.is_some_and(|e| oid >= e) {
                return Ok(out);
            }
            if oid.namespace == INTERNAL_NAMESPACE || oid.snap != kelp_store::SNAP_HEAD {
                continue;
            }
            if let Some(o) = scrub_object(store, coll, oid, deep, ec) {
                out.push(o);
            }
        }
        match page.next {
            Some(n) => from = Some(n),
            None => return Ok(out),
        }
    }
}

/// Whether `oid` lies in `[start, end)`.
pub(crate) fn in_range(oid: &ObjectId, start: Option<&ObjectId>, end: Option<&ObjectId>) -> bool {
    start.is_none_or(|s| oid >= s) && end.is_none_or(|e| oid < e)
}

// ---------------------------------------------------------------------------------------------
// The range a chunk's scrub holds writes back for.

/// Writes to objects in this range wait while the primary scrubs it.
#[derive(Debug, Clone)]
pub(crate) struct ScrubBlock {
    pub(crate) start: Option<ObjectId>,
    pub(crate) end: Option<ObjectId>,
}

impl ScrubBlock {
    pub(crate) fn blocks(&self, oid: &ObjectId) -> bool {
        in_range(oid, self.start.as_ref(), self.end.as_ref())
    }
}

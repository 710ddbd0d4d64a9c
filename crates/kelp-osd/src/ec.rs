//! The erasure-coded backend: how a PG of an erasure-coded pool turns client ops into shard
//! ops, and gathers shards back into the object's bytes.
//!
//! Each member of an EC PG holds one *shard* of every object: the member at position `i` of
//! the acting set holds shard `i` (positions stay put through `indep` CRUSH mappings; an empty
//! position is a hole). A shard is stored as an ordinary object under the object's own name,
//! so the PG log, peering, listing and the store need nothing EC-specific: only its bytes
//! differ, and its `@ec` attribute ([`EcMeta`]) says which shard it is, the object's logical
//! size and its chunk size. User xattrs, the version (`@v`) and mtime (`@m`) are identical on
//! every shard. Omap is refused (`NotSupported`), as in Ceph: omap values are not striped, and
//! keeping `k+m` full copies would defeat the point of the pool.
//!
//! Writes ([`plan_write`]): the primary walks the client's ops in order, keeping the object's
//! logical size, and turns each data op into per-shard writes with `kelp_ec::Layout`: stripes a
//! write covers (or that lie past the old end) are encoded fresh; a stripe it changes in part is
//! updated by a parity delta from the old bytes of just the 64-byte blocks it changes, read
//! from the shards that hold them. Guards and xattr ops go to every shard unchanged. Each
//! member then applies its shard's ops with the same `exec::execute` as a replicated write, as
//! the same PG-log entry, so the write path (ordering, acknowledgement when every member has
//! committed, retries) is the replicated one.
//!
//! Reads ([`read_extents`]): the data shards holding the asked-for range are read directly; a
//! shard that is missing, unreachable, unreadable or at another version is rebuilt on the fly
//! from `k` others (the stripes concerned only). Fewer than `k` usable shards is an error,
//! never invented data.
//!
//! I/O goes through [`ShardIo`], so every decision here is unit-tested without a cluster.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use kelp_ec::{Codec, Extent, Layout, Profile, ShardWrite};
use kelp_proto::{ErrorCode, OpKind, OpResult};

use crate::exec::{ExecError, Limits, StatDelta};

/// The shard `osd` holds of `pg` if its pool is erasure-coded (its position in the acting
/// set, else in the up set).
pub fn shard_of(map: &kelp_maps::OsdMap, pg: kelp_types::PgId, osd: i32) -> Option<u32> {
    shard_positions(map, pg).get(&osd).copied()
}

/// The shard position each member of `pg` is to hold if its pool is erasure-coded — its place
/// in the acting set, or in the up set for a backfill target outside it. Empty for replicated
/// pools.
pub fn shard_positions(
    map: &kelp_maps::OsdMap,
    pg: kelp_types::PgId,
) -> std::collections::BTreeMap<i32, u32> {
    let mut out = std::collections::BTreeMap::new();
    let ec = map.pools.get(&pg.pool.0).and_then(|p| p.ec()).is_some();
    let Some(m) = map.pg_mapping(pg).ok().filter(|_| ec) else {
        return out;
    };
    for shards in [m.acting_shards(), m.up_shards()] {
        for (i, &osd) in shards.iter().enumerate() {
            if osd >= 0 && osd != kelp_maps::ITEM_NONE {
                out.entry(osd).or_insert(i as u32);
            }
        }
    }
    out
}

/// The store attribute holding an EC shard's [`EcMeta`].
pub const EC_ATTR: &str = "@ec";

/// The shard position a write's internal attributes are for (`None`: not an EC shard write,
/// or one that sets no shard metadata, as a removal).
pub fn held_shard(internal_xattrs: &[(String, Vec<u8>)]) -> Option<u32> {
    internal_xattrs
        .iter()
        .find(|(k, _)| k == EC_ATTR)
        .and_then(|(_, v)| EcMeta::decode(v).ok())
        .map(|m| m.shard)
}

/// What every shard of an erasure-coded object records about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EcMeta {
    /// Which shard this is (its position in the acting set).
    pub shard: u32,
    /// The object's logical size.
    pub size: u64,
    /// The object's chunk size (0 while it has no data yet).
    pub chunk: u32,
}

const META_FORMAT: u8 = 1;
const META_LEN: usize = 1 + 4 + 8 + 4;

impl EcMeta {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(META_LEN);
        out.push(META_FORMAT);
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.chunk.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<EcMeta, ExecError> {
        if b.len() != META_LEN || b[0] != META_FORMAT {
            return Err(ExecError {
                code: ErrorCode::Corrupt,
                message: format!(
                    "shard metadata ({EC_ATTR}) of {} bytes, format {:?}: not understood",
                    b.len(),
                    b.first()
                ),
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(EcMeta {
            shard: u32_at(1),
            size: u64::from_le_bytes(b[5..13].try_into().expect("8 bytes")),
            chunk: u32_at(13),
        })
    }

    /// The object's layout under `profile`, if it has data.
    pub fn layout(&self, profile: &Profile) -> Option<Layout> {
        (self.chunk > 0).then_some(Layout {
            k: profile.k,
            m: profile.m,
            chunk: self.chunk,
        })
    }
}

fn err<T>(code: ErrorCode, message: impl Into<String>) -> Result<T, ExecError> {
    Err(ExecError {
        code,
        message: message.into(),
    })
}

fn omap_refused<T>() -> Result<T, ExecError> {
    err(
        ErrorCode::NotSupported,
        "omap is not supported on erasure-coded pools (keep omap in a replicated pool)",
    )
}

/// One shard's bytes as a member read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardBytes {
    /// The object's version on that shard (0: the shard does not have the object).
    pub version: u64,
    /// The shard these bytes are: the one asked for, unless the member still holds the shard
    /// of another position (a member whose position changed, before its backfill rewrote the
    /// object): those bytes are that shard's, usable to rebuild, never as the one asked for.
    pub held: usize,
    /// One buffer per asked-for range, each padded with zeros to the range's length (views
    /// of the buffer the shard's bytes arrived in: no copy).
    pub ranges: Vec<Bytes>,
}

/// How the EC backend reaches the shards of one object.
#[async_trait::async_trait]
pub trait ShardIo: Send + Sync {
    /// Shards that may be read (members in sync; `false` for holes and members left behind).
    fn readable(&self) -> Vec<bool>;
    /// Reads `ranges` (offset, length) of shard `shard`.
    async fn read_shard(
        &self,
        shard: usize,
        ranges: &[(u64, u64)],
    ) -> Result<ShardBytes, ExecError>;
}

/// Reads `extents` of an object's shards as of `version`, rebuilding what a shard cannot
/// deliver (missing, failed, or at another version) from `k` others. Results are in
/// `extents` order, each exactly as long as its extent.
pub async fn read_extents(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    extents: &[Extent],
) -> Result<Vec<Bytes>, ExecError> {
    let n = layout.shards();
    let mut usable = io.readable();
    usable.resize(n, false);
    let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, e) in extents.iter().enumerate() {
        by_shard.entry(e.shard).or_default().push(i);
    }
    let mut out: Vec<Option<Bytes>> = vec![None; extents.len()];
    // Direct reads, all shards at once.
    let direct: Vec<_> = by_shard
        .iter()
        .filter(|(s, _)| usable[**s])
        .map(|(&shard, idx)| {
            let ranges: Vec<(u64, u64)> = idx
                .iter()
                .map(|&i| (extents[i].offset, extents[i].len))
                .collect();
            async move { (shard, io.read_shard(shard, &ranges).await) }
        })
        .collect();
    for (shard, got) in futures::future::join_all(direct).await {
        match got {
            Ok(b)
                if b.held == shard
                    && b.version == version
                    && b.ranges.len() == by_shard[&shard].len() =>
            {
                for (&i, bytes) in by_shard[&shard].iter().zip(b.ranges) {
                    out[i] = Some(bytes);
                }
            }
            // Another shard's bytes: the rebuild below may use that member for its shard.
            Ok(b) if b.held != shard => {}
            Ok(b) => {
                tracing::warn!(
                    shard,
                    have = b.version,
                    want = version,
                    "stale EC shard: rebuilding"
                );
                usable[shard] = false;
            }
            Err(e) => {
                tracing::warn!(shard, "EC shard read failed, rebuilding: {}", e.message);
                usable[shard] = false;
            }
        }
    }
    let missing: Vec<usize> = (0..extents.len()).filter(|&i| out[i].is_none()).collect();
    if missing.is_empty() {
        return Ok(out.into_iter().map(Option::unwrap_or_default).collect());
    }
    // Rebuild: the whole chunks (stripes) around each missing extent, from k usable shards.
    let chunk = u64::from(layout.chunk);
    let mut spans: Vec<Range<u64>> = missing
        .iter()
        .map(|&i| {
            let e = &extents[i];
            e.offset / chunk * chunk..(e.offset + e.len).div_ceil(chunk) * chunk
        })
        .collect();
    spans.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::new();
    for r in spans {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    let rebuilt = rebuild(io, layout, version, &mut usable, &merged).await?;
    for i in missing {
        let e = &extents[i];
        let (span, shards) = rebuilt
            .iter()
            .find(|(span, _)| span.start <= e.offset && e.offset + e.len <= span.end)
            .expect("every missing extent lies in a rebuilt span");
        let from = (e.offset - span.start) as usize;
        out[i] = Some(Bytes::copy_from_slice(
            &shards[e.shard][from..from + e.len as usize],
        ));
    }
    Ok(out.into_iter().map(Option::unwrap_or_default).collect())
}

/// Rebuilds every shard over each span from `k` usable shards (data shards first, then
/// parity); a shard that fails or disagrees on the version is dropped and another tried.
async fn rebuild(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    usable: &mut [bool],
    spans: &[Range<u64>],
) -> Result<Vec<(Range<u64>, Vec<Vec<u8>>)>, ExecError> {
    let codec = Codec::new(layout.k, layout.m).map_err(ec_err)?;
    let k = layout.k as usize;
    let n = layout.shards();
    let ranges: Vec<(u64, u64)> = spans.iter().map(|r| (r.start, r.end - r.start)).collect();
    // Shard → its bytes; members are asked by position, and answer with the shard they hold.
    let mut got: HashMap<usize, Vec<Bytes>> = HashMap::new();
    let mut asked = vec![false; n];
    loop {
        let have = got.len();
        let candidates: Vec<usize> = (0..n)
            .filter(|p| usable[*p] && !asked[*p] && !got.contains_key(p))
            .take(k - have)
            .collect();
        let left = (0..n)
            .filter(|p| usable[*p] && !asked[*p] && !got.contains_key(p))
            .count();
        if candidates.is_empty() || have + left < k {
            return err(
                ErrorCode::Io,
                format!(
                    "only {} of the {k} shards needed to rebuild the data are readable",
                    have + left
                ),
            );
        }
        let reads = candidates.iter().map(|&s| {
            let ranges = ranges.clone();
            async move { (s, io.read_shard(s, &ranges).await) }
        });
        for (s, r) in futures::future::join_all(reads).await {
            asked[s] = true;
            match r {
                Ok(b) if b.version == version && b.ranges.len() == ranges.len() => {
                    if b.held < n {
                        got.entry(b.held).or_insert(b.ranges);
                    }
                    if b.held != s {
                        usable[s] = false;
                    }
                }
                Ok(b) => {
                    tracing::warn!(
                        shard = s,
                        have = b.version,
                        want = version,
                        "stale EC shard"
                    );
                    usable[s] = false;
                }
                Err(e) => {
                    tracing::warn!(shard = s, "EC shard read failed: {}", e.message);
                    usable[s] = false;
                }
            }
        }
        if got.len() >= k {
            break;
        }
    }
    let mut out = Vec::with_capacity(spans.len());
    for (j, span) in spans.iter().enumerate() {
        let shards: Vec<Option<Vec<u8>>> =
            (0..n).map(|s| got.get(&s).map(|r| r[j].to_vec())).collect();
        let all = codec.reconstruct(shards).map_err(ec_err)?;
        out.push((span.clone(), all));
    }
    Ok(out)
}

fn ec_err(e: kelp_ec::EcError) -> ExecError {
    let code = match e {
        kelp_ec::EcError::NotEnoughShards { .. } => ErrorCode::Io,
        _ => ErrorCode::Invalid,
    };
    ExecError {
        code,
        message: e.to_string(),
    }
}

/// What a deep scrub's parity check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParityCheck {
    /// Parity agrees with the data.
    Consistent,
    /// One shard disagrees with all the others: this position.
    BadShard(usize),
    /// The shards disagree and no single one is to blame.
    Unlocated,
    /// Not every shard could be read at the object's version (the metadata comparison reports
    /// that).
    Skipped,
}

/// Deep scrub of an erasure-coded object: reads every shard whole and checks that parity
/// agrees with the data; if not, finds the one shard whose rebuild from the others makes
/// everything agree.
pub async fn check_parity(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    size: u64,
) -> Result<ParityCheck, ExecError> {
    let len = layout.shard_size(size);
    if len == 0 {
        return Ok(ParityCheck::Consistent);
    }
    let n = layout.shards();
    let k = layout.k as usize;
    let reads = (0..n).map(|s| async move { io.read_shard(s, &[(0, len)]).await });
    let mut shards = Vec::with_capacity(n);
    for r in futures::future::join_all(reads).await {
        match r {
            Ok(mut b) if b.held == shards.len() && b.version == version && b.ranges.len() == 1 => {
                shards.push(b.ranges.pop().map(Vec::from).unwrap_or_default());
            }
            _ => return Ok(ParityCheck::Skipped),
        }
    }
    let codec = Codec::new(layout.k, layout.m).map_err(ec_err)?;
    if codec.encode(&shards[..k]).map_err(ec_err)? == shards[k..] {
        return Ok(ParityCheck::Consistent);
    }
    for suspect in 0..n {
        let without: Vec<Option<Vec<u8>>> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| (i != suspect).then(|| s.clone()))
            .collect();
        let rebuilt = codec.reconstruct(without).map_err(ec_err)?;
        let parity_ok = codec.encode(&rebuilt[..k]).map_err(ec_err)? == rebuilt[k..];
        let others_agree = (0..n).all(|i| i == suspect || rebuilt[i] == shards[i]);
        if parity_ok && others_agree {
            return Ok(ParityCheck::BadShard(suspect));
        }
    }
    Ok(ParityCheck::Unlocated)
}

/// An object as the primary's own shard shows it before a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EcBefore {
    pub exists: bool,
    pub version: u64,
    /// `None` for an object without shard metadata (new).
    pub meta: Option<EcMeta>,
}

/// One shard's part of a write: ops for `exec::execute` and their data.
#[derive(Debug, Default)]
pub struct ShardOps {
    pub ops: Vec<OpKind>,
    pub data: BytesMut,
}

/// A client write turned into shard writes.
#[derive(Debug)]
pub struct EcWrite {
    /// Indexed by shard.
    pub shards: Vec<ShardOps>,
    /// The object's logical size and chunk afterwards, if it exists then.
    pub after: Option<(u64, u32)>,
    /// The change of the PG's logical object and byte counts.
    pub stat_delta: StatDelta,
}

impl EcWrite {
    /// Shard `shard`'s `@ec` attribute after the write (none if the object is gone).
    pub fn internal_xattrs(&self, shard: usize) -> Vec<(String, Vec<u8>)> {
        match self.after {
            Some((size, chunk)) => vec![(
                EC_ATTR.to_string(),
                EcMeta {
                    shard: shard as u32,
                    size,
                    chunk,
                }
                .encode(),
            )],
            None => Vec::new(),
        }
    }
}

/// Writes to shards made earlier in the same client op, laid over bytes read from the store
/// so that a later op of the same request sees them.
enum Overlay {
    /// The object was removed or replaced whole: older bytes are gone.
    Reset,
    Write(ShardWrite),
    /// Every shard cut to this length.
    Truncate(u64),
}

struct Planner<'a> {
    profile: &'a Profile,
    codec: Codec,
    io: &'a dyn ShardIo,
    before_version: u64,
    exists: bool,
    size: u64,
    layout: Option<Layout>,
    shards: Vec<ShardOps>,
    overlay: Vec<Overlay>,
}

impl Planner<'_> {
    fn all(&mut self, op: &OpKind, data: &[u8]) {
        for s in &mut self.shards {
            s.ops.push(op.clone());
            s.data.extend_from_slice(data);
        }
    }

    fn layout_for(&mut self, size_hint: u64) -> Layout {
        match self.layout {
            Some(l) if self.size > 0 => l,
            _ => {
                let l = Layout::for_object(self.profile, size_hint);
                self.layout = Some(l);
                l
            }
        }
    }

    /// Old bytes of `extents` as this request has left them so far.
    async fn old_bytes(
        &self,
        layout: &Layout,
        extents: &[Extent],
    ) -> Result<Vec<Vec<u8>>, ExecError> {
        let reset_at = self
            .overlay
            .iter()
            .rposition(|o| matches!(o, Overlay::Reset));
        let mut bytes: Vec<Vec<u8>> = match reset_at {
            Some(_) => extents.iter().map(|e| vec![0u8; e.len as usize]).collect(),
            None => read_extents(self.io, layout, self.before_version, extents)
                .await?
                .into_iter()
                .map(Vec::from)
                .collect(),
        };
        let from = reset_at.map_or(0, |i| i + 1);
        for o in &self.overlay[from..] {
            for (e, b) in extents.iter().zip(bytes.iter_mut()) {
                match o {
                    Overlay::Reset => {}
                    Overlay::Write(w) if w.shard == e.shard => {
                        let w_range = w.offset..w.offset + w.data.len() as u64;
                        let lo = w_range.start.max(e.offset);
                        let hi = w_range.end.min(e.offset + e.len);
                        if lo < hi {
                            b[(lo - e.offset) as usize..(hi - e.offset) as usize].copy_from_slice(
                                &w.data[(lo - w.offset) as usize..(hi - w.offset) as usize],
                            );
                        }
                    }
                    Overlay::Write(_) => {}
                    Overlay::Truncate(len) => {
                        if *len < e.offset + e.len {
                            let cut = len.saturating_sub(e.offset) as usize;
                            b[cut..].fill(0);
                        }
                    }
                }
            }
        }
        Ok(bytes)
    }

    fn push_writes(&mut self, writes: Vec<ShardWrite>) {
        for w in writes {
            let s = &mut self.shards[w.shard];
            s.ops.push(OpKind::Write {
                offset: w.offset,
                len: w.data.len() as u64,
            });
            s.data.extend_from_slice(&w.data);
            self.overlay.push(Overlay::Write(w));
        }
    }

    async fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let layout = self.layout_for(offset + bytes.len() as u64);
        let plan = layout.plan_write(self.size, offset, bytes.len() as u64);
        let old = if plan.needs_reads() {
            self.old_bytes(&layout, &plan.reads()).await?
        } else {
            Vec::new()
        };
        let writes = plan.writes(&self.codec, bytes, &old).map_err(ec_err)?;
        self.push_writes(writes);
        self.size = plan.new_size();
        self.exists = true;
        Ok(())
    }

    fn truncate_shards(&mut self, layout: &Layout, size: u64) {
        let len = layout.shard_size(size);
        self.all(&OpKind::Truncate { size: len }, &[]);
        self.overlay.push(Overlay::Truncate(len));
    }
}

/// Turns a client's write ops on an object of an erasure-coded pool into shard ops (see the
/// module docs). `before` is the object as the primary's own shard shows it.
pub async fn plan_write(
    profile: &Profile,
    before: EcBefore,
    ops: &[OpKind],
    data: &Bytes,
    limits: &Limits,
    io: &dyn ShardIo,
) -> Result<EcWrite, ExecError> {
    let total: u64 = ops.iter().map(OpKind::data_len).sum();
    if total != data.len() as u64 {
        return err(
            ErrorCode::Invalid,
            format!("ops describe {total} bytes of data but {} came", data.len()),
        );
    }
    let size_before = if before.exists {
        before.meta.map_or(0, |m| m.size)
    } else {
        0
    };
    let mut p = Planner {
        profile,
        codec: Codec::new(profile.k, profile.m).map_err(ec_err)?,
        io,
        before_version: before.version,
        exists: before.exists,
        size: size_before,
        layout: before.meta.and_then(|m| m.layout(profile)),
        shards: (0..profile.size()).map(|_| ShardOps::default()).collect(),
        overlay: Vec::new(),
    };
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
    let mut cursor = 0usize;
    let mut take = |len: u64| -> Bytes {
        let start = cursor;
        cursor += len as usize;
        data.slice(start..cursor)
    };
    for op in ops {
        match op {
            OpKind::AssertExists | OpKind::AssertVersion { .. } | OpKind::RmXattr { .. } => {
                p.all(op, &[]);
            }
            OpKind::CmpXattr { len, .. } => {
                let v = take(*len);
                p.all(op, &v);
            }
            OpKind::SetXattr { len, .. } => {
                let v = take(*len);
                p.all(op, &v);
                p.exists = true;
            }
            OpKind::Create { .. } => {
                p.all(op, &[]);
                p.exists = true;
            }
            OpKind::Remove => {
                p.all(op, &[]);
                p.overlay.push(Overlay::Reset);
                (p.exists, p.size, p.layout) = (false, 0, None);
            }
            OpKind::WriteFull { len } => {
                check_extent(0, *len)?;
                let bytes = take(*len);
                p.all(&OpKind::Truncate { size: 0 }, &[]);
                p.overlay.push(Overlay::Reset);
                (p.size, p.layout, p.exists) = (0, None, true);
                if !bytes.is_empty() {
                    p.write(0, &bytes).await?;
                }
            }
            OpKind::Write { offset, len } => {
                check_extent(*offset, *len)?;
                let bytes = take(*len);
                if bytes.is_empty() {
                    p.all(&OpKind::Create { exclusive: false }, &[]);
                    p.exists = true;
                } else {
                    p.write(*offset, &bytes).await?;
                }
            }
            OpKind::Append { len } => {
                check_extent(p.size, *len)?;
                let bytes = take(*len);
                if bytes.is_empty() {
                    p.all(&OpKind::Create { exclusive: false }, &[]);
                    p.exists = true;
                } else {
                    let at = p.size;
                    p.write(at, &bytes).await?;
                }
            }
            OpKind::Truncate { size } => {
                check_extent(0, *size)?;
                let new = *size;
                let layout = p.layout_for(new);
                if let Some(plan) = layout.plan_truncate(p.size, new) {
                    let old = p.old_bytes(&layout, &plan.reads()).await?;
                    let zeros = vec![0u8; (plan.range().end - plan.range().start) as usize];
                    let writes = plan.writes(&p.codec, &zeros, &old).map_err(ec_err)?;
                    p.push_writes(writes);
                }
                p.truncate_shards(&layout, new);
                p.size = new;
                p.exists = true;
            }
            OpKind::Zero { offset, len } => {
                // Zeroing a missing object, or past its end, changes nothing (as in Ceph).
                if p.exists && *offset < p.size {
                    let end = offset.saturating_add(*len).min(p.size);
                    let zeros = vec![0u8; (end - offset) as usize];
                    p.write(*offset, &zeros).await?;
                }
            }
            OpKind::CmpOmap { .. }
            | OpKind::OmapSet { .. }
            | OpKind::OmapRm { .. }
            | OpKind::OmapClear
            | OpKind::OmapSetHeader { .. }
            | OpKind::OmapGetVals { .. }
            | OpKind::OmapGetValsByKeys { .. }
            | OpKind::OmapGetHeader => return omap_refused(),
            OpKind::Read { .. } | OpKind::Stat | OpKind::GetXattr { .. } | OpKind::GetXattrs => {
                return err(
                    ErrorCode::Invalid,
                    "an op either reads or writes; split reads and writes into separate ops",
                );
            }
            // an op flag, taken out by the primary (harmless if it were left)
            OpKind::FullTry => {}
            OpKind::SnapContext { .. }
            | OpKind::ReadAtSnap { .. }
            | OpKind::ListSnaps
            | OpKind::Rollback { .. }
            | OpKind::SnapClone { .. }
            | OpKind::SnapRestore { .. }
            | OpKind::SnapSetHead { .. }
            | OpKind::SnapTrim => {
                return err(
                    ErrorCode::Invalid,
                    "snapshot operations are resolved by the PG's primary",
                );
            }
        }
    }
    let existed = before.exists;
    let bytes = |there: bool, size: u64| if there { size as i64 } else { 0 };
    let stat_delta = StatDelta {
        objects: i64::from(p.exists) - i64::from(existed),
        bytes: bytes(p.exists, p.size) - bytes(existed, size_before),
    };
    let after = p.exists.then(|| {
        (
            p.size,
            p.layout.map_or(0, |l| if p.size > 0 { l.chunk } else { 0 }),
        )
    });
    for s in &mut p.shards {
        if s.ops.is_empty() {
            // Every op of the request turned out to change nothing (zeroing a missing
            // object): a no-op that still makes the same log entry on every shard.
            s.ops.push(OpKind::Zero { offset: 0, len: 0 });
        }
    }
    Ok(EcWrite {
        shards: p.shards,
        after,
        stat_delta,
    })
}

/// An object as the primary's own shard shows it, for a read.
#[derive(Debug, Clone, Default)]
pub struct EcObjectAttrs {
    pub exists: bool,
    pub version: u64,
    pub mtime_ns: u64,
    pub meta: Option<EcMeta>,
    /// User xattrs (without the store's `_` prefix).
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

/// The result of a read on an erasure-coded object.
#[derive(Debug, Default)]
pub struct EcRead {
    pub outs: Vec<OpResult>,
    pub data: Vec<u8>,
    pub version: u64,
}

/// Serves a client's read ops on an object of an erasure-coded pool: attributes from the
/// primary's shard, data gathered from the data shards (rebuilt where needed), or with
/// `fast_read` from the first `k` shards to answer.
#[allow(clippy::too_many_arguments)]
pub async fn read(
    profile: &Profile,
    fast_read: bool,
    obj: &EcObjectAttrs,
    name: &str,
    ops: &[OpKind],
    data: &Bytes,
    limits: &Limits,
    io: &dyn ShardIo,
) -> Result<EcRead, ExecError> {
    let mut out = EcRead {
        version: obj.version,
        ..EcRead::default()
    };
    let not_found = || {
        err::<()>(
            ErrorCode::NotFound,
            format!("object '{name}' does not exist"),
        )
    };
    let size = obj.meta.map_or(0, |m| m.size);
    let mut cursor = 0usize;
    for op in ops {
        let before = out.outs.len();
        match op {
            OpKind::AssertExists => {
                if !obj.exists {
                    not_found()?;
                }
            }
            OpKind::AssertVersion { version } => {
                if obj.version != *version {
                    return err(
                        ErrorCode::Canceled,
                        format!("object version is {}, not {version}", obj.version),
                    );
                }
            }
            OpKind::CmpXattr {
                name: attr,
                op,
                len,
            } => {
                let end = cursor + *len as usize;
                let value = data.get(cursor..end).ok_or_else(|| ExecError {
                    code: ErrorCode::Invalid,
                    message: "op data shorter than its ops describe".into(),
                })?;
                cursor = end;
                let equal = obj.xattrs.get(attr).map(Vec::as_slice) == Some(value);
                let holds = match op {
                    kelp_proto::CmpOp::Eq => equal,
                    kelp_proto::CmpOp::Ne => !equal,
                };
                if !holds {
                    return err(
                        ErrorCode::Canceled,
                        format!("xattr '{attr}' comparison failed"),
                    );
                }
            }
            OpKind::Stat => {
                if !obj.exists {
                    not_found()?;
                }
                out.outs.push(OpResult::Stat {
                    size,
                    mtime_ns: obj.mtime_ns,
                    version: obj.version,
                });
            }
            OpKind::GetXattr { name: attr } => {
                if !obj.exists {
                    not_found()?;
                }
                match obj.xattrs.get(attr) {
                    Some(v) => {
                        out.outs.push(OpResult::Data {
                            len: v.len() as u64,
                        });
                        out.data.extend_from_slice(v);
                    }
                    None => return err(ErrorCode::NoData, format!("no xattr '{attr}'")),
                }
            }
            OpKind::GetXattrs => {
                if !obj.exists {
                    not_found()?;
                }
                let mut entries = Vec::new();
                for (k, v) in &obj.xattrs {
                    entries.push((k.clone(), v.len() as u64));
                    out.data.extend_from_slice(v);
                }
                out.outs.push(OpResult::Xattrs { entries });
            }
            OpKind::Read { offset, len } => {
                if !obj.exists {
                    not_found()?;
                }
                let want = if *len == 0 {
                    size.saturating_sub(*offset)
                } else {
                    *len
                };
                if want > limits.max_write_size {
                    return err(
                        ErrorCode::TooBig,
                        format!("read of {want} bytes is too large"),
                    );
                }
                let range = *offset..offset.saturating_add(want);
                let bytes = match obj.meta.and_then(|m| m.layout(profile)) {
                    Some(layout) if *offset < size && fast_read => {
                        read_range_fast(io, &layout, obj.version, range, size).await?
                    }
                    Some(layout) if *offset < size => {
                        read_range(io, &layout, obj.version, range, size).await?
                    }
                    _ => Vec::new(),
                };
                out.outs.push(OpResult::Data {
                    len: bytes.len() as u64,
                });
                if out.data.is_empty() {
                    out.data = bytes; // the usual single read: no copy
                } else {
                    out.data.extend_from_slice(&bytes);
                }
            }
            OpKind::CmpOmap { .. }
            | OpKind::OmapGetVals { .. }
            | OpKind::OmapGetValsByKeys { .. }
            | OpKind::OmapGetHeader => return omap_refused(),
            _ => {
                return err(
                    ErrorCode::Invalid,
                    "an op either reads or writes; split reads and writes into separate ops",
                );
            }
        }
        if out.outs.len() == before {
            out.outs.push(OpResult::None);
        }
    }
    Ok(out)
}

/// `fast_read`: logical `range` (clipped to `size`) from whichever `k` shards answer first —
/// every readable shard is asked for the stripes concerned, the slowest `m` are not waited
/// for, and the data is decoded when it is not all among the first answers (Ceph's
/// `fast_read`: lower tail latency for more reads).
pub async fn read_range_fast(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    range: Range<u64>,
    size: u64,
) -> Result<Vec<u8>, ExecError> {
    use futures::StreamExt;
    let range = range.start.min(size)..range.end.min(size);
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let stripes = layout.stripes_of(range.clone());
    let span = layout.shard_range(stripes.clone());
    let ranges = [(span.start, span.end - span.start)];
    let k = layout.k as usize;
    let readable = io.readable();
    let mut pending: futures::stream::FuturesUnordered<_> = readable
        .iter()
        .enumerate()
        .filter(|(_, r)| **r)
        .map(|(s, _)| async move { (s, io.read_shard(s, &ranges).await) })
        .collect();
    let mut got: Vec<Option<Bytes>> = vec![None; layout.shards()];
    let mut have = 0;
    while let Some((s, r)) = pending.next().await {
        match r {
            Ok(mut b) if b.version == version && b.ranges.len() == 1 => {
                // Keyed by the shard the member holds (another position's, after a remap).
                if b.held < got.len() && got[b.held].is_none() {
                    got[b.held] = b.ranges.pop();
                    have += 1;
                    if have == k {
                        break;
                    }
                }
            }
            Ok(b) => tracing::warn!(
                shard = s,
                have = b.version,
                want = version,
                "stale EC shard"
            ),
            Err(e) => tracing::warn!(shard = s, "EC shard read failed: {}", e.message),
        }
    }
    drop(pending);
    if have < k {
        return err(
            ErrorCode::Io,
            format!("only {have} of the {k} shards needed to read the data answered"),
        );
    }
    // The data shards among the first answers are joined as they are; only a missing one
    // costs a decode.
    let logical = match got[..k].iter().cloned().collect::<Option<Vec<Bytes>>>() {
        Some(data) => layout.join(&data),
        None => {
            let codec = Codec::new(layout.k, layout.m).map_err(ec_err)?;
            let shards = got.into_iter().map(|b| b.map(Vec::from)).collect();
            let all = codec.reconstruct(shards).map_err(ec_err)?;
            layout.join(&all[..k])
        }
    };
    let base = stripes.start * layout.width();
    Ok(logical[(range.start - base) as usize..(range.end - base) as usize].to_vec())
}

/// Logical `range` (clipped to `size`) of an object.
pub async fn read_range(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    range: Range<u64>,
    size: u64,
) -> Result<Vec<u8>, ExecError> {
    let spans = layout.read_spans(range.clone(), size);
    let extents: Vec<Extent> = spans
        .iter()
        .enumerate()
        .filter_map(|(shard, s)| {
            s.as_ref().map(|r| Extent {
                shard,
                offset: r.start,
                len: r.end - r.start,
            })
        })
        .collect();
    let got = read_extents(io, layout, version, &extents).await?;
    let mut bufs: Vec<Option<(Range<u64>, &[u8])>> = vec![None; layout.k as usize];
    for (e, b) in extents.iter().zip(&got) {
        bufs[e.shard] = Some((e.offset..e.offset + e.len, &b[..]));
    }
    Ok(layout.assemble(range, size, &bufs))
}

/// Rebuilds all of shard `shard` of an object of `size` bytes (recovery of a member that
/// misses it): every other shard's bytes of the object, decoded.
pub async fn rebuild_shard(
    io: &dyn ShardIo,
    layout: &Layout,
    version: u64,
    size: u64,
    shard: usize,
) -> Result<Vec<u8>, ExecError> {
    let len = layout.shard_size(size);
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut got = read_extents(
        io,
        layout,
        version,
        &[Extent {
            shard,
            offset: 0,
            len,
        }],
    )
    .await?;
    Ok(got.pop().map(Vec::from).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Shards in memory, applied through `exec`-like shard ops.
    struct MemShards {
        shards: Mutex<Vec<Vec<u8>>>,
        version: Mutex<Vec<u64>>,
        readable: Mutex<Vec<bool>>,
        /// Per position, the shard its member holds (a member CRUSH moved holds another's).
        held: Mutex<Vec<usize>>,
    }

    impl MemShards {
        fn new(n: usize) -> MemShards {
            MemShards {
                shards: Mutex::new(vec![Vec::new(); n]),
                version: Mutex::new(vec![0; n]),
                readable: Mutex::new(vec![true; n]),
                held: Mutex::new((0..n).collect()),
            }
        }

        fn apply(&self, w: &EcWrite, version: u64) {
            let mut shards = self.shards.lock().unwrap();
            for (i, s) in w.shards.iter().enumerate() {
                let mut at = 0usize;
                for op in &s.ops {
                    let b = &mut shards[i];
                    match op {
                        OpKind::Write { offset, len } => {
                            let end = (*offset + *len) as usize;
                            if b.len() < end {
                                b.resize(end, 0);
                            }
                            b[*offset as usize..end]
                                .copy_from_slice(&s.data[at..at + *len as usize]);
                            at += *len as usize;
                        }
                        OpKind::Truncate { size } => b.resize(*size as usize, 0),
                        OpKind::Remove => b.clear(),
                        op => at += op.data_len() as usize,
                    }
                }
            }
            for v in self.version.lock().unwrap().iter_mut() {
                *v = version;
            }
        }
    }

    #[async_trait::async_trait]
    impl ShardIo for MemShards {
        fn readable(&self) -> Vec<bool> {
            self.readable.lock().unwrap().clone()
        }
        async fn read_shard(
            &self,
            shard: usize,
            ranges: &[(u64, u64)],
        ) -> Result<ShardBytes, ExecError> {
            let held = self.held.lock().unwrap()[shard];
            let s = self.shards.lock().unwrap();
            let b = &s[held];
            Ok(ShardBytes {
                version: self.version.lock().unwrap()[held],
                held,
                ranges: ranges
                    .iter()
                    .map(|&(o, l)| {
                        let mut v = vec![0u8; l as usize];
                        let from = (o as usize).min(b.len());
                        let to = ((o + l) as usize).min(b.len());
                        v[..to - from].copy_from_slice(&b[from..to]);
                        Bytes::from(v)
                    })
                    .collect(),
            })
        }
    }

    fn profile() -> Profile {
        Profile::from_words(&["k=4", "m=2", "crush-failure-domain=osd"]).unwrap()
    }

    async fn write(
        mem: &MemShards,
        before: &mut EcBefore,
        ops: &[OpKind],
        data: &[u8],
    ) -> Result<EcWrite, ExecError> {
        let w = plan_write(
            &profile(),
            *before,
            ops,
            &Bytes::copy_from_slice(data),
            &Limits::default(),
            mem,
        )
        .await?;
        let version = before.version + 1;
        mem.apply(&w, version);
        *before = EcBefore {
            exists: w.after.is_some(),
            version,
            meta: w.after.map(|(size, chunk)| EcMeta {
                shard: 0,
                size,
                chunk,
            }),
        };
        Ok(w)
    }

    async fn read_all(mem: &MemShards, before: &EcBefore) -> Vec<u8> {
        let meta = before.meta.unwrap();
        let layout = meta.layout(&profile()).unwrap();
        read_range(mem, &layout, before.version, 0..meta.size, meta.size)
            .await
            .unwrap()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn meta_round_trips_and_refuses_garbage() {
        let m = EcMeta {
            shard: 5,
            size: 1 << 40,
            chunk: 4096,
        };
        assert_eq!(EcMeta::decode(&m.encode()).unwrap(), m);
        assert_eq!(
            EcMeta::decode(&[2; META_LEN]).unwrap_err().code,
            ErrorCode::Corrupt
        );
        assert_eq!(
            EcMeta::decode(&[1, 2]).unwrap_err().code,
            ErrorCode::Corrupt
        );
    }

    #[test]
    fn small_object_is_one_small_stripe() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            let data = vec![7u8; 4096];
            let w = write(&mem, &mut b, &[OpKind::WriteFull { len: 4096 }], &data)
                .await
                .unwrap();
            assert_eq!(w.after, Some((4096, 1024)));
            let stored: usize = mem.shards.lock().unwrap().iter().map(Vec::len).sum();
            assert_eq!(stored, 6 * 1024);
            assert_eq!(
                w.stat_delta,
                StatDelta {
                    objects: 1,
                    bytes: 4096
                }
            );
            assert_eq!(read_all(&mem, &b).await, data);
        });
    }

    #[test]
    fn overwrites_appends_truncates_match_a_model() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            let mut model = vec![0u8; 0];
            let mut rng = 12345u64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let first: Vec<u8> = (0..200_000).map(|i| (i % 251) as u8).collect();
            write(
                &mem,
                &mut b,
                &[OpKind::WriteFull {
                    len: first.len() as u64,
                }],
                &first,
            )
            .await
            .unwrap();
            model.extend_from_slice(&first);
            for round in 0..60 {
                match next() % 4 {
                    0 | 1 => {
                        let off = next() % 260_000;
                        let len = 1 + next() % 9000;
                        let d: Vec<u8> = (0..len).map(|i| (i as u8) ^ (round as u8)).collect();
                        write(&mem, &mut b, &[OpKind::Write { offset: off, len }], &d)
                            .await
                            .unwrap();
                        let end = (off + len) as usize;
                        if model.len() < end {
                            model.resize(end, 0);
                        }
                        model[off as usize..end].copy_from_slice(&d);
                    }
                    2 => {
                        let size = next() % 280_000;
                        write(&mem, &mut b, &[OpKind::Truncate { size }], &[])
                            .await
                            .unwrap();
                        model.resize(size as usize, 0);
                    }
                    _ => {
                        let len = 1 + next() % 5000;
                        let d = vec![round as u8; len as usize];
                        write(&mem, &mut b, &[OpKind::Append { len }], &d)
                            .await
                            .unwrap();
                        model.extend_from_slice(&d);
                    }
                }
                assert_eq!(b.meta.unwrap().size, model.len() as u64, "round {round}");
                assert_eq!(read_all(&mem, &b).await, model, "round {round}");
            }
            // fast_read decodes from the first k answers: the same bytes.
            let meta = b.meta.unwrap();
            let layout = meta.layout(&profile()).unwrap();
            for (a, z) in [
                (0, meta.size),
                (12_345, 54_321),
                (meta.size / 2, meta.size + 9),
            ] {
                let fast = read_range_fast(&mem, &layout, b.version, a..z, meta.size)
                    .await
                    .unwrap();
                let z = z.min(meta.size).max(a.min(meta.size));
                assert_eq!(fast, model[a.min(meta.size) as usize..z as usize]);
            }
            // Any two shards lost: reads rebuild, and a write still works.
            *mem.readable.lock().unwrap() = vec![false, true, true, false, true, true];
            assert_eq!(read_all(&mem, &b).await, model);
            let d = vec![9u8; 3000];
            write(
                &mem,
                &mut b,
                &[OpKind::Write {
                    offset: 100,
                    len: 3000,
                }],
                &d,
            )
            .await
            .unwrap();
            model[100..3100].copy_from_slice(&d);
            *mem.readable.lock().unwrap() = vec![true; 6];
            assert_eq!(read_all(&mem, &b).await, model);
        });
    }

    #[test]
    fn compound_ops_see_their_own_earlier_writes() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            let mut data = vec![1u8; 10_000];
            data.extend_from_slice(&[2u8; 100]);
            write(
                &mem,
                &mut b,
                &[
                    OpKind::Write {
                        offset: 0,
                        len: 10_000,
                    },
                    OpKind::Write {
                        offset: 50,
                        len: 100,
                    },
                    OpKind::Truncate { size: 120 },
                ],
                &data,
            )
            .await
            .unwrap();
            let mut want = vec![1u8; 120];
            want[50..120].fill(2);
            assert_eq!(read_all(&mem, &b).await, want);
        });
    }

    #[test]
    fn too_many_lost_shards_is_an_error_not_invented_data() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            write(
                &mem,
                &mut b,
                &[OpKind::WriteFull { len: 8192 }],
                &[3u8; 8192],
            )
            .await
            .unwrap();
            *mem.readable.lock().unwrap() = vec![false, false, false, true, true, true];
            let meta = b.meta.unwrap();
            let layout = meta.layout(&profile()).unwrap();
            let e = read_range(&mem, &layout, b.version, 0..8192, 8192)
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::Io);
            // A shard at another version counts as lost too.
            *mem.readable.lock().unwrap() = vec![true; 6];
            mem.version.lock().unwrap()[0] = 99;
            mem.version.lock().unwrap()[1] = 99;
            mem.version.lock().unwrap()[2] = 99;
            assert!(
                read_range(&mem, &layout, b.version, 0..8192, 8192)
                    .await
                    .is_err()
            );
        });
    }

    #[test]
    fn members_holding_another_positions_shard_still_serve_it() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
            write(&mem, &mut b, &[OpKind::WriteFull { len: 100_000 }], &data)
                .await
                .unwrap();
            let meta = b.meta.unwrap();
            let layout = meta.layout(&profile()).unwrap();
            let shard5 = mem.shards.lock().unwrap()[5].clone();
            // A remap swapped the members of positions 1 and 3, and position 5 is lost.
            *mem.held.lock().unwrap() = vec![0, 3, 2, 1, 4, 5];
            mem.readable.lock().unwrap()[5] = false;
            let got = read_range(&mem, &layout, b.version, 0..100_000, 100_000)
                .await
                .unwrap();
            assert_eq!(got, data);
            let fast = read_range_fast(&mem, &layout, b.version, 0..100_000, 100_000)
                .await
                .unwrap();
            assert_eq!(fast, data);
            let len = layout.shard_size(meta.size) as usize;
            let rebuilt = rebuild_shard(&mem, &layout, b.version, meta.size, 5)
                .await
                .unwrap();
            assert_eq!(rebuilt, shard5[..len]);
            // Deep scrub does not judge parity from misplaced shards.
            *mem.readable.lock().unwrap() = vec![true; 6];
            assert_eq!(
                check_parity(&mem, &layout, b.version, meta.size)
                    .await
                    .unwrap(),
                ParityCheck::Skipped
            );
            // Exactly k distinct shards left (0 and 5 lost): still readable.
            *mem.readable.lock().unwrap() = vec![false, true, true, true, true, false];
            let got = read_range(&mem, &layout, b.version, 0..100_000, 100_000)
                .await
                .unwrap();
            assert_eq!(got, data);
            // Two members holding the same shard count once: 3 distinct shards are too few.
            *mem.held.lock().unwrap() = vec![0, 3, 2, 3, 4, 5];
            let e = read_range(&mem, &layout, b.version, 0..100_000, 100_000)
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::Io);
        });
    }

    #[test]
    fn deep_scrub_parity_check_finds_the_one_bad_shard() {
        block_on(async {
            let mem = MemShards::new(6);
            let mut b = EcBefore::default();
            let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
            write(&mem, &mut b, &[OpKind::WriteFull { len: 50_000 }], &data)
                .await
                .unwrap();
            let meta = b.meta.unwrap();
            let layout = meta.layout(&profile()).unwrap();
            let check = || check_parity(&mem, &layout, b.version, meta.size);
            assert_eq!(check().await.unwrap(), ParityCheck::Consistent);
            for bad in [1usize, 4] {
                let saved = mem.shards.lock().unwrap()[bad].clone();
                mem.shards.lock().unwrap()[bad][77] ^= 0x5a;
                assert_eq!(check().await.unwrap(), ParityCheck::BadShard(bad));
                mem.shards.lock().unwrap()[bad] = saved;
            }
            // Two shards bad: beyond what one parity equation can place.
            mem.shards.lock().unwrap()[0][5] ^= 1;
            mem.shards.lock().unwrap()[2][9] ^= 1;
            assert_eq!(check().await.unwrap(), ParityCheck::Unlocated);
        });
    }

    #[test]
    fn omap_is_refused() {
        block_on(async {
            let mem = MemShards::new(6);
            let e = plan_write(
                &profile(),
                EcBefore::default(),
                &[OpKind::OmapClear],
                &Bytes::new(),
                &Limits::default(),
                &mem,
            )
            .await
            .unwrap_err();
            assert_eq!(e.code, ErrorCode::NotSupported);
        });
    }
}

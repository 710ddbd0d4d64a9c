//! Object bodies in the data pool: writing an instance stripe by stripe while the request body
//! streams in, reading any byte range back as a stream, and deleting instances.
//!
//! This is the only module that touches the data pool, and it uses writes, reads, removals,
//! existence checks and xattrs (the object meta, compare-and-swapped with `CmpXattr`), never
//! omap: the data pool may be erasure-coded, and erasure-coded pools refuse omap. Whatever
//! must be listed or changed atomically (pending uploads, garbage, multipart parts) lives in
//! the bucket index.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use kelp_client::{ClientError, IoCtx, ReadOp, ReadResult, WriteOp};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::error::{Result, RgwError};
use crate::layout::{
    META_XATTR, ObjectMeta, PartRef, STRIPE, decode, encode, stripe_count, stripe_obj,
};
use crate::md5batch::Md5Stream;
use crate::rgw::Rgw;

/// Most stripes of one upload written at the same time, by any gateway version. The garbage
/// collector deletes an abandoned instance of unknown size by probing stripes until this many
/// in a row are absent.
pub const MAX_INFLIGHT_STRIPES: usize = 4;

/// Stripes one upload writes at the same time. With the stripe being filled, an upload holds at
/// most this many + 1 stripes of memory (16 uploads of 32 MiB objects peaked at 480 MiB of
/// gateway memory with 4 in flight and the head stripe held to the end).
const WRITE_WINDOW: usize = 2;
const _: () = assert!(WRITE_WINDOW <= MAX_INFLIGHT_STRIPES);

/// Reads of a body are at most this long, [`READ_AHEAD`] at a time: a GET holds about
/// `READ_AHEAD + 2` pieces of memory (in flight, queued, being sent).
const READ_PIECE: u64 = 2 << 20;
const READ_AHEAD: usize = 2;

/// Writes one instance. A one-stripe object (the common small one) is written at
/// [`InstanceWriter::finish`] in one operation with its meta; a larger one has every stripe
/// written as soon as it is full, a few at a time, and gets its meta at the end.
pub struct InstanceWriter {
    data: IoCtx,
    inst: String,
    /// The head stripe, until a second stripe shows that the object is larger.
    head: Option<Bytes>,
    cur: BytesMut,
    next_stripe: u64,
    size: u64,
    /// The body's MD5 (the ETag), hashed with other uploads' ([`crate::md5batch`]).
    md5: Md5Stream,
    tails: JoinSet<Result<(), ClientError>>,
}

/// What was written.
pub struct Written {
    pub size: u64,
    pub md5: [u8; 16],
}

impl InstanceWriter {
    pub fn new(rgw: &Rgw, inst: &str) -> InstanceWriter {
        InstanceWriter {
            data: rgw.inner.data.clone(),
            inst: inst.to_string(),
            head: None,
            cur: BytesMut::new(),
            next_stripe: 0,
            size: 0,
            md5: Md5Stream::new(&rgw.inner.md5),
            tails: JoinSet::new(),
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Adds the next bytes of the body.
    pub async fn push(&mut self, mut chunk: Bytes) -> Result<()> {
        self.size += chunk.len() as u64;
        while !chunk.is_empty() {
            let room = STRIPE as usize - self.cur.len();
            if self.cur.is_empty() && chunk.len() >= room {
                // a whole stripe without copying
                let stripe = chunk.split_to(room);
                self.emit(stripe).await?;
                continue;
            }
            let take = room.min(chunk.len());
            self.cur.extend_from_slice(&chunk.split_to(take));
            if self.cur.len() == STRIPE as usize {
                let stripe = std::mem::take(&mut self.cur).freeze();
                self.emit(stripe).await?;
            }
        }
        Ok(())
    }

    async fn emit(&mut self, stripe: Bytes) -> Result<()> {
        // Stripes are emitted in body order. Hashing slices of the stripe (not the request's
        // own chunks, which were copied into it) keeps no extra buffers alive.
        self.md5.push(stripe.clone()).await.map_err(hash_failed)?;
        let n = self.next_stripe;
        self.next_stripe += 1;
        if n == 0 {
            self.head = Some(stripe);
            return Ok(());
        }
        if let Some(head) = self.head.take() {
            // More than one stripe: the head's data goes now too (unreferenced until the
            // index commit, so nobody reads it early), its meta at `finish`.
            self.spawn_write(0, head).await?;
        }
        self.spawn_write(n, stripe).await
    }

    async fn spawn_write(&mut self, n: u64, stripe: Bytes) -> Result<()> {
        while self.tails.len() >= WRITE_WINDOW {
            self.join_one().await?;
        }
        let data = self.data.clone();
        let name = stripe_obj(&self.inst, n);
        self.tails
            .spawn(async move { data.write_full(&name, stripe).await.map(drop) });
        Ok(())
    }

    async fn join_one(&mut self) -> Result<()> {
        match self.tails.join_next().await {
            Some(Ok(r)) => r.map_err(RgwError::from),
            Some(Err(e)) => Err(RgwError::Body(format!("stripe writer failed: {e}"))),
            None => Ok(()),
        }
    }

    /// Waits for every tail stripe; writes the head stripe with `meta` (if given) as its
    /// xattr. The instance is then complete on disk (but not yet referenced).
    pub async fn finish(
        mut self,
        meta: impl FnOnce(&Written) -> Option<ObjectMeta>,
    ) -> Result<Written> {
        if !self.cur.is_empty() || self.next_stripe == 0 {
            let rest = std::mem::take(&mut self.cur).freeze();
            self.emit(rest).await?;
        }
        while !self.tails.is_empty() {
            self.join_one().await?;
        }
        let written = Written {
            size: self.size,
            md5: self.md5.finish().await.map_err(hash_failed)?,
        };
        let op = match (self.head.take(), meta(&written)) {
            (Some(head), m) => {
                let op = WriteOp::new().create(true).write_full(head);
                match m {
                    Some(m) => op.set_xattr(META_XATTR, encode(&m)),
                    None => op,
                }
            }
            // the head's data went with the other stripes
            (None, Some(m)) => WriteOp::new()
                .assert_exists()
                .set_xattr(META_XATTR, encode(&m)),
            (None, None) => return Ok(written),
        };
        self.data.operate(op, &self.inst).await?;
        Ok(written)
    }
}

fn hash_failed(_: crate::md5batch::HashFailed) -> RgwError {
    RgwError::Internal("the MD5 hashing thread failed".into())
}

/// One piece of a read: `len` bytes at `offset` in RADOS object `obj`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    obj: String,
    offset: u64,
    len: u64,
}

/// The RADOS reads that make up bytes `[start, end)` of an object laid out as `parts` (or,
/// for a simple object, its own stripes).
fn segments(inst: &str, meta: &ObjectMeta, start: u64, end: u64) -> Vec<Segment> {
    let simple;
    let parts: &[PartRef] = if meta.parts.is_empty() {
        simple = [PartRef {
            inst: inst.to_string(),
            size: meta.size,
        }];
        &simple
    } else {
        &meta.parts
    };
    let mut out = Vec::new();
    let mut base = 0u64;
    for p in parts {
        let (pstart, pend) = (base, base + p.size);
        base = pend;
        if pend <= start || pstart >= end {
            continue;
        }
        let mut pos = start.max(pstart) - pstart;
        let stop = end.min(pend) - pstart;
        while pos < stop {
            let n = pos / STRIPE;
            let within = pos % STRIPE;
            let len = (STRIPE - within).min(stop - pos);
            out.push(Segment {
                obj: stripe_obj(&p.inst, n),
                offset: within,
                len,
            });
            pos += len;
        }
    }
    out
}

/// `segs` cut into reads of at most [`READ_PIECE`] bytes.
fn pieces(segs: Vec<Segment>) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        let mut at = 0;
        while at < s.len {
            let len = READ_PIECE.min(s.len - at);
            out.push(Segment {
                obj: s.obj.clone(),
                offset: s.offset + at,
                len,
            });
            at += len;
        }
    }
    out
}

/// A body being streamed out of RADOS (a reader task feeds it, a few pieces ahead).
pub struct BodyStream {
    rx: mpsc::Receiver<Result<Bytes, RgwError>>,
}

impl Stream for BodyStream {
    type Item = Result<Bytes, RgwError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Rgw {
    /// Reads an object's meta (from its head's xattr).
    pub async fn read_meta(&self, inst: &str) -> Result<ObjectMeta> {
        let raw = self.inner.data.get_xattr(inst, META_XATTR).await?;
        decode(inst, &raw)
    }

    /// Applies `change` to an instance's meta with compare-and-swap on the stored value.
    pub async fn update_meta(
        &self,
        inst: &str,
        mut change: impl FnMut(&mut ObjectMeta),
    ) -> Result<ObjectMeta> {
        for _ in 0..16 {
            let raw = self.inner.data.get_xattr(inst, META_XATTR).await?;
            let mut meta: ObjectMeta = decode(inst, &raw)?;
            change(&mut meta);
            match self
                .inner
                .data
                .operate(
                    WriteOp::new()
                        .cmp_xattr(META_XATTR, &raw)
                        .set_xattr(META_XATTR, encode(&meta)),
                    inst,
                )
                .await
            {
                Ok(_) => return Ok(meta),
                Err(ClientError::Canceled { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(RgwError::Busy(inst.to_string()))
    }

    /// Reads an object's meta and, in the same round trip, `len` (at least 1) bytes of the
    /// head stripe at `offset` (fewer if the head holds fewer: a multipart head holds none).
    pub async fn read_head(
        &self,
        inst: &str,
        offset: u64,
        len: u64,
    ) -> Result<(ObjectMeta, Bytes)> {
        let len = len.max(1);
        let res = self
            .inner
            .data
            .operate_read(ReadOp::new().get_xattr(META_XATTR).read(offset, len), inst)
            .await?;
        match (res.first(), res.get(1)) {
            (Some(ReadResult::Data(m)), Some(ReadResult::Data(d))) => {
                let meta: ObjectMeta = decode(inst, m)?;
                let mut d = d.clone();
                d.truncate(len as usize);
                Ok((meta, d))
            }
            _ => Err(RgwError::Corrupt {
                object: inst.to_string(),
                message: "unexpected head read result".into(),
            }),
        }
    }

    /// Streams bytes `[start, end)` of an object; `first` are bytes already read from the
    /// start of that range (see [`Rgw::read_head`]).
    pub fn read_body(
        &self,
        inst: &str,
        meta: &ObjectMeta,
        start: u64,
        end: u64,
        first: Bytes,
    ) -> BodyStream {
        let (tx, rx) = mpsc::channel(1);
        let data = self.inner.data.clone();
        let mut segs = segments(inst, meta, start, end);
        let mut skip = first.len() as u64;
        tokio::spawn(async move {
            if !first.is_empty() && tx.send(Ok(first)).await.is_err() {
                return;
            }
            // drop what `first` already covered
            segs.retain_mut(|s| {
                if skip == 0 {
                    return true;
                }
                let cut = skip.min(s.len);
                s.offset += cut;
                s.len -= cut;
                skip -= cut;
                s.len > 0
            });
            let mut reads = futures::stream::iter(pieces(segs).into_iter().map(|s| {
                let data = data.clone();
                async move {
                    let got = data.read(&s.obj, s.offset, s.len).await?;
                    if (got.len() as u64) < s.len {
                        return Err(RgwError::Corrupt {
                            object: s.obj.clone(),
                            message: format!(
                                "stripe holds {} bytes at {}, {} expected",
                                got.len(),
                                s.offset,
                                s.len
                            ),
                        });
                    }
                    Ok(got)
                }
            }))
            .buffered(READ_AHEAD);
            use futures::StreamExt;
            while let Some(r) = reads.next().await {
                let failed = r.is_err();
                if tx.send(r).await.is_err() || failed {
                    return;
                }
            }
        });
        BodyStream { rx }
    }

    /// Deletes an instance's RADOS objects: parts (for a multipart object), tails, then the
    /// head, so an interrupted delete can be repeated. `size: None` means unknown (an
    /// abandoned upload): stripes are probed until several in a row are missing.
    /// Deletes an instance that was never committed (an abandoned upload, found by its
    /// pending entry). If it is the head of a multipart completion, the parts its manifest
    /// names are not its own: they still belong to the upload (which stays and can be
    /// completed again), or to the completion that won, or went to the collector with an
    /// abort; following the manifest, as [`Rgw::delete_instance`] does for a committed
    /// object, would delete their data under the upload's entries.
    pub async fn delete_uncommitted(&self, inst: &str) -> Result<()> {
        self.delete_data(inst, None, false).await
    }

    /// Deletes a committed instance: its objects and, for a multipart object, its parts.
    pub async fn delete_instance(&self, inst: &str, size: Option<u64>) -> Result<()> {
        self.delete_data(inst, size, true).await
    }

    async fn delete_data(&self, inst: &str, size: Option<u64>, with_parts: bool) -> Result<()> {
        let data = &self.inner.data;
        let meta = match data.get_xattr(inst, META_XATTR).await {
            Ok(raw) => decode::<ObjectMeta>(inst, &raw).ok(),
            Err(ClientError::NotFound { .. } | ClientError::NoData { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(m) = meta.as_ref().filter(|_| with_parts) {
            for p in &m.parts {
                Box::pin(self.delete_instance(&p.inst, Some(p.size))).await?;
            }
        }
        let size = size.or(meta.as_ref().filter(|m| m.parts.is_empty()).map(|m| m.size));
        match size {
            Some(size) => {
                let count = if meta.as_ref().is_some_and(|m| !m.parts.is_empty()) {
                    1
                } else {
                    stripe_count(size)
                };
                let mut rms = futures::stream::iter((1..count).map(|n| {
                    let name = stripe_obj(inst, n);
                    async move { ignore_missing(data.remove(&name).await) }
                }))
                .buffer_unordered(8);
                use futures::StreamExt;
                while let Some(r) = rms.next().await {
                    r?;
                }
            }
            None => {
                let mut misses = 0usize;
                let mut n = 1u64;
                while misses < MAX_INFLIGHT_STRIPES * 2 {
                    match data.remove(&stripe_obj(inst, n)).await {
                        Ok(()) => misses = 0,
                        Err(ClientError::NotFound { .. }) => misses += 1,
                        Err(e) => return Err(e.into()),
                    }
                    n += 1;
                }
            }
        }
        ignore_missing(data.remove(inst).await)
    }
}

fn ignore_missing(r: std::result::Result<(), ClientError>) -> Result<()> {
    match r {
        Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(size: u64, parts: &[(&str, u64)]) -> ObjectMeta {
        ObjectMeta {
            size,
            parts: parts
                .iter()
                .map(|(i, s)| PartRef {
                    inst: i.to_string(),
                    size: *s,
                })
                .collect(),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn reads_are_cut_into_pieces() {
        let seg = |obj: &str, offset, len| Segment {
            obj: obj.to_string(),
            offset,
            len,
        };
        let p = pieces(vec![seg("a", 10, READ_PIECE * 2 + 5), seg("b", 0, 3)]);
        assert_eq!(
            p,
            vec![
                seg("a", 10, READ_PIECE),
                seg("a", 10 + READ_PIECE, READ_PIECE),
                seg("a", 10 + 2 * READ_PIECE, 5),
                seg("b", 0, 3),
            ]
        );
        assert!(pieces(vec![seg("c", 0, 0)]).is_empty());
    }

    #[test]
    fn simple_object_segments() {
        let m = meta(STRIPE * 2 + 10, &[]);
        let s = segments("b.i", &m, 0, m.size);
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[2],
            Segment {
                obj: "b.i.2".into(),
                offset: 0,
                len: 10
            }
        );
        let s = segments("b.i", &m, STRIPE - 1, STRIPE + 1);
        assert_eq!(
            s,
            vec![
                Segment {
                    obj: "b.i".into(),
                    offset: STRIPE - 1,
                    len: 1
                },
                Segment {
                    obj: "b.i.1".into(),
                    offset: 0,
                    len: 1
                },
            ]
        );
        assert!(segments("b.i", &meta(0, &[]), 0, 0).is_empty());
    }

    #[test]
    fn multipart_segments_cross_parts() {
        let m = meta(15, &[("p1", 5), ("p2", 10)]);
        let s = segments("head", &m, 3, 8);
        assert_eq!(
            s,
            vec![
                Segment {
                    obj: "p1".into(),
                    offset: 3,
                    len: 2
                },
                Segment {
                    obj: "p2".into(),
                    offset: 0,
                    len: 3
                },
            ]
        );
        let total: u64 = segments("head", &m, 0, 15).iter().map(|s| s.len).sum();
        assert_eq!(total, 15);
    }
}

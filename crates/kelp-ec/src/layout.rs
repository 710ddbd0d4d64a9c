//! Stripe and shard arithmetic: where an object's logical bytes live on its shards, and what a
//! write must read and rewrite.
//!
//! An object is cut into *stripes* of `k` chunks of `chunk` bytes (`width = k * chunk`); chunk
//! `i` of every stripe lives on data shard `i`, the `m` parity chunks of a stripe on shards
//! `k..k+m`. Each shard stores its chunks of stripes `0, 1, 2...` back to back, so stripe `s`
//! is at `s * chunk` on every shard, and a run of stripes is one contiguous range per shard.
//! Every shard of an object of logical size `S` holds exactly `stripe_count(S) * chunk` bytes;
//! the bytes of the last stripe past `S` are zeros (truncation keeps it so), which lets a write
//! into that stripe treat them as known.
//!
//! The chunk size is chosen per object when it is created ([`Layout::for_object`]): the
//! profile's `stripe_unit`, or less for an object whose first write is smaller than a stripe,
//! so a 4 KiB object in a 4+2 pool stores six 1 KiB shards rather than six 4 KiB ones.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::codec::{Codec, xor_into};
use crate::error::EcError;
use crate::profile::Profile;

/// Alignment of every coded buffer (see the crate docs), and the smallest chunk.
pub const ALIGN: usize = 64;

/// How one object is striped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub k: u32,
    pub m: u32,
    /// Bytes of each stripe on each shard (a multiple of [`ALIGN`]).
    pub chunk: u32,
}

/// A piece of a shard: `len` bytes at `offset` of shard `shard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extent {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
}

fn align_down(x: u64) -> u64 {
    x / ALIGN as u64 * ALIGN as u64
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN as u64) * ALIGN as u64
}

fn overlap(a: Range<u64>, b: Range<u64>) -> Option<Range<u64>> {
    let r = a.start.max(b.start)..a.end.min(b.end);
    (r.start < r.end).then_some(r)
}

impl Layout {
    pub fn new(k: u32, m: u32, chunk: u32) -> Result<Layout, EcError> {
        if k == 0 || m == 0 || chunk == 0 || !(chunk as usize).is_multiple_of(ALIGN) {
            return Err(EcError::InvalidProfile(format!(
                "layout k={k} m={m} chunk={chunk}: chunk must be a non-zero multiple of {ALIGN}"
            )));
        }
        Ok(Layout { k, m, chunk })
    }

    /// The layout of a new object whose first write ends at `size_hint`: chunks of the
    /// profile's stripe unit, or smaller for an object that fits one stripe, so that it
    /// costs about `size_hint * (k+m)/k` rather than a stripe unit per shard.
    pub fn for_object(profile: &Profile, size_hint: u64) -> Layout {
        let want = align_up(size_hint.div_ceil(u64::from(profile.k)).max(1));
        let chunk = want.min(u64::from(profile.stripe_unit)) as u32;
        Layout {
            k: profile.k,
            m: profile.m,
            chunk,
        }
    }

    pub fn shards(&self) -> usize {
        (self.k + self.m) as usize
    }

    /// Logical bytes per stripe.
    pub fn width(&self) -> u64 {
        u64::from(self.k) * u64::from(self.chunk)
    }

    /// Stripes an object of `size` bytes has.
    pub fn stripe_count(&self, size: u64) -> u64 {
        size.div_ceil(self.width())
    }

    /// Bytes every shard (data and parity) of an object of `size` bytes stores.
    pub fn shard_size(&self, size: u64) -> u64 {
        self.stripe_count(size) * u64::from(self.chunk)
    }

    /// The shard range holding stripes `stripes`.
    pub fn shard_range(&self, stripes: Range<u64>) -> Range<u64> {
        stripes.start * u64::from(self.chunk)..stripes.end * u64::from(self.chunk)
    }

    /// Stripes that the logical range `range` touches.
    pub fn stripes_of(&self, range: Range<u64>) -> Range<u64> {
        if range.start >= range.end {
            return 0..0;
        }
        range.start / self.width()..range.end.div_ceil(self.width())
    }

    /// Where logical byte `offset` lives: (data shard, offset in that shard).
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let chunk = u64::from(self.chunk);
        let stripe = offset / self.width();
        let within = offset % self.width();
        ((within / chunk) as usize, stripe * chunk + within % chunk)
    }

    /// Cuts the logical bytes of whole stripes (a multiple of `width` bytes) into the `k`
    /// data-shard buffers of those stripes.
    pub fn split(&self, logical: &[u8]) -> Vec<Vec<u8>> {
        let chunk = self.chunk as usize;
        let stripes = logical.len() / self.width() as usize;
        debug_assert_eq!(logical.len(), stripes * self.width() as usize);
        let mut out: Vec<Vec<u8>> = (0..self.k)
            .map(|_| Vec::with_capacity(stripes * chunk))
            .collect();
        for stripe in logical.chunks_exact(self.width() as usize) {
            for (shard, piece) in out.iter_mut().zip(stripe.chunks_exact(chunk)) {
                shard.extend_from_slice(piece);
            }
        }
        out
    }

    /// The inverse of [`Layout::split`]: `k` equal data-shard buffers of whole stripes back to
    /// logical bytes.
    pub fn join<B: AsRef<[u8]>>(&self, data: &[B]) -> Vec<u8> {
        let chunk = self.chunk as usize;
        let per_shard = data.first().map_or(0, |d| d.as_ref().len());
        let stripes = per_shard / chunk;
        let mut out = Vec::with_capacity(stripes * self.width() as usize);
        for s in 0..stripes {
            for d in data.iter().take(self.k as usize) {
                out.extend_from_slice(&d.as_ref()[s * chunk..(s + 1) * chunk]);
            }
        }
        out
    }

    /// For reading logical `range` of an object of `size` bytes: the span of each data shard
    /// to read (`None`: the shard holds nothing of it). The range is clipped to `size`.
    pub fn read_spans(&self, range: Range<u64>, size: u64) -> Vec<Option<Range<u64>>> {
        let range = range.start.min(size)..range.end.min(size);
        let mut spans: Vec<Option<Range<u64>>> = vec![None; self.k as usize];
        for (shard, piece) in self.pieces(range) {
            let span = &mut spans[shard];
            *span = Some(match span.take() {
                None => piece.shard.clone(),
                Some(s) => s.start.min(piece.shard.start)..s.end.max(piece.shard.end),
            });
        }
        spans
    }

    /// Assembles logical `range` (clipped to `size`) from the data-shard spans that
    /// [`Layout::read_spans`] asked for (`spans[i]`: the bytes read at that span of shard `i`;
    /// a short read stands for zeros).
    pub fn assemble(
        &self,
        range: Range<u64>,
        size: u64,
        spans: &[Option<(Range<u64>, &[u8])>],
    ) -> Vec<u8> {
        let range = range.start.min(size)..range.end.min(size);
        let total = (range.end - range.start) as usize;
        // Filled piece by piece in logical order (no zero-fill first: a 4 MiB read would pay
        // for it twice); zeros only where a span is missing or short.
        let mut out = Vec::with_capacity(total);
        for (shard, piece) in self.pieces(range.clone()) {
            let end = (piece.logical.end - range.start) as usize;
            if let Some(Some((span, bytes))) = spans.get(shard) {
                let from = (piece.shard.start - span.start) as usize;
                let to = (piece.shard.end - span.start) as usize;
                let avail = bytes.len().min(to);
                if from < avail {
                    out.extend_from_slice(&bytes[from..avail]);
                }
            }
            out.resize(end, 0);
        }
        out.resize(total, 0);
        out
    }

    /// The pieces of logical `range`, one per chunk it touches: (data shard, where).
    fn pieces(&self, range: Range<u64>) -> impl Iterator<Item = (usize, Piece)> + '_ {
        let chunk = u64::from(self.chunk);
        let mut at = range.start;
        std::iter::from_fn(move || {
            if at >= range.end {
                return None;
            }
            let (shard, shard_off) = self.locate(at);
            let left_in_chunk = chunk - shard_off % chunk;
            let len = left_in_chunk.min(range.end - at);
            let piece = Piece {
                logical: at..at + len,
                shard: shard_off..shard_off + len,
            };
            at += len;
            Some((shard, piece))
        })
    }

    /// Plans a truncation from `old_size` to `new_size`: the write of zeros over the part of
    /// the new last stripe past `new_size` that held data (so the zeros-past-the-end invariant
    /// holds), if any; afterwards every shard is cut or extended to `shard_size(new_size)`.
    pub fn plan_truncate(&self, old_size: u64, new_size: u64) -> Option<StripePlan> {
        if new_size >= old_size || new_size.is_multiple_of(self.width()) {
            return None;
        }
        let stripe_end = self.stripe_count(new_size) * self.width();
        let end = stripe_end.min(old_size);
        Some(self.plan_write(old_size, new_size, end - new_size))
    }

    /// Plans a write of `len` bytes at logical `offset` into an object of `old_size` bytes
    /// (0 for a new one) with this layout.
    pub fn plan_write(&self, old_size: u64, offset: u64, len: u64) -> StripePlan {
        let write = offset..offset + len;
        let old_stripes = self.stripe_count(old_size);
        let width = self.width();
        let chunk = u64::from(self.chunk);
        let mut fresh: Vec<Range<u64>> = Vec::new();
        let mut delta = Vec::new();
        for s in self.stripes_of(write.clone()) {
            let stripe = s * width..(s + 1) * width;
            let covered = write.start <= stripe.start && write.end >= stripe.end;
            if covered || s >= old_stripes {
                // Every byte of the new stripe is known: the write's, or zeros past the old end.
                match fresh.last_mut() {
                    Some(run) if run.end == s => run.end = s + 1,
                    _ => fresh.push(s..s + 1),
                }
                continue;
            }
            let mut chunks = Vec::new();
            for c in 0..u64::from(self.k) {
                let at = stripe.start + c * chunk;
                if let Some(o) = overlap(write.clone(), at..at + chunk) {
                    let (lo, hi) = (o.start - at, o.end - at);
                    chunks.push(DeltaChunk {
                        shard: c as usize,
                        written: lo..hi,
                        aligned: align_down(lo)..align_up(hi).min(chunk),
                    });
                }
            }
            let parity = chunks.iter().map(|c| c.aligned.start).min().unwrap_or(0)
                ..chunks.iter().map(|c| c.aligned.end).max().unwrap_or(0);
            delta.push(DeltaStripe {
                stripe: s,
                chunks,
                parity,
            });
        }
        StripePlan {
            layout: *self,
            write,
            old_size,
            fresh,
            delta,
        }
    }
}

struct Piece {
    logical: Range<u64>,
    shard: Range<u64>,
}

/// What a write does to an object's shards: stripes it rewrites whole ("fresh": every byte of
/// them is known without reading), and stripes it changes in part, whose parity it updates
/// from the old bytes of just the blocks it changes (a parity delta).
#[derive(Debug, Clone)]
pub struct StripePlan {
    layout: Layout,
    write: Range<u64>,
    old_size: u64,
    fresh: Vec<Range<u64>>,
    delta: Vec<DeltaStripe>,
}

#[derive(Debug, Clone)]
struct DeltaStripe {
    stripe: u64,
    chunks: Vec<DeltaChunk>,
    /// In-chunk range of the parity to update: the union of the chunks' aligned ranges.
    parity: Range<u64>,
}

#[derive(Debug, Clone)]
struct DeltaChunk {
    shard: usize,
    /// In-chunk bytes the write covers.
    written: Range<u64>,
    /// The same, widened to whole `ALIGN` blocks.
    aligned: Range<u64>,
}

/// Bytes to write at `offset` of shard `shard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardWrite {
    pub shard: usize,
    pub offset: u64,
    pub data: Vec<u8>,
}

impl StripePlan {
    /// The object's logical size after the write.
    pub fn new_size(&self) -> u64 {
        self.old_size.max(self.write.end)
    }

    /// The logical range written.
    pub fn range(&self) -> Range<u64> {
        self.write.clone()
    }

    /// Whether the write needs old bytes (it changes part of an existing stripe).
    pub fn needs_reads(&self) -> bool {
        !self.delta.is_empty()
    }

    /// The old shard bytes the write needs, in the order [`StripePlan::writes`] expects them:
    /// for each partly changed stripe, the changed blocks of each data shard it touches, then
    /// the same blocks of each parity shard.
    pub fn reads(&self) -> Vec<Extent> {
        let chunk = u64::from(self.layout.chunk);
        let mut out = Vec::new();
        for d in &self.delta {
            let base = d.stripe * chunk;
            for c in &d.chunks {
                out.push(Extent {
                    shard: c.shard,
                    offset: base + c.aligned.start,
                    len: c.aligned.end - c.aligned.start,
                });
            }
            for p in 0..self.layout.m as usize {
                out.push(Extent {
                    shard: self.layout.k as usize + p,
                    offset: base + d.parity.start,
                    len: d.parity.end - d.parity.start,
                });
            }
        }
        out
    }

    /// The shard writes, given the write's bytes (`data`, as long as the write) and the old
    /// bytes of [`StripePlan::reads`] (same order; a short read stands for zeros).
    pub fn writes(
        &self,
        codec: &Codec,
        data: &[u8],
        old: &[Vec<u8>],
    ) -> Result<Vec<ShardWrite>, EcError> {
        let l = &self.layout;
        let (k, chunk, width) = (l.k as usize, u64::from(l.chunk), l.width());
        let mut out = Vec::new();
        for run in &self.fresh {
            let logical = run.start * width..run.end * width;
            let mut buf = vec![0u8; (logical.end - logical.start) as usize];
            if let Some(o) = overlap(self.write.clone(), logical.clone()) {
                let src =
                    (o.start - self.write.start) as usize..(o.end - self.write.start) as usize;
                let dst = (o.start - logical.start) as usize;
                buf[dst..dst + src.len()].copy_from_slice(&data[src]);
            }
            let shards = l.split(&buf);
            let parity = codec.encode(&shards)?;
            let at = run.start * chunk;
            for (shard, bytes) in shards.into_iter().chain(parity).enumerate() {
                out.push(ShardWrite {
                    shard,
                    offset: at,
                    data: bytes,
                });
            }
        }
        let mut old = old.iter();
        let mut next_old = |len: u64| -> Vec<u8> {
            let mut b = old.next().cloned().unwrap_or_default();
            b.resize(len as usize, 0);
            b
        };
        for d in &self.delta {
            let base = d.stripe * chunk;
            let plen = d.parity.end - d.parity.start;
            let mut deltas: Vec<Option<Vec<u8>>> = vec![None; k];
            for c in &d.chunks {
                let alen = c.aligned.end - c.aligned.start;
                let old_bytes = next_old(alen);
                let mut new_bytes = old_bytes.clone();
                let logical_at = d.stripe * l.width() + c.shard as u64 * chunk;
                let src_start = (logical_at + c.written.start - self.write.start) as usize;
                let n = (c.written.end - c.written.start) as usize;
                let dst = (c.written.start - c.aligned.start) as usize;
                new_bytes[dst..dst + n].copy_from_slice(&data[src_start..src_start + n]);
                let mut delta = vec![0u8; plen as usize];
                let at = (c.aligned.start - d.parity.start) as usize;
                delta[at..at + alen as usize].copy_from_slice(&old_bytes);
                xor_into(&mut delta[at..at + alen as usize], &new_bytes);
                deltas[c.shard] = Some(delta);
                out.push(ShardWrite {
                    shard: c.shard,
                    offset: base + c.written.start,
                    data: new_bytes[dst..dst + n].to_vec(),
                });
            }
            let refs: Vec<Option<&[u8]>> = deltas.iter().map(|d| d.as_deref()).collect();
            let pd = codec.parity_delta(&refs)?;
            for (p, pdelta) in pd.iter().enumerate() {
                let mut parity = next_old(plen);
                xor_into(&mut parity, pdelta);
                out.push(ShardWrite {
                    shard: k + p,
                    offset: base + d.parity.start,
                    data: parity,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_objects_get_small_chunks() {
        let p = Profile::from_words(&["k=4", "m=2"]).unwrap();
        let l = Layout::for_object(&p, 4096);
        assert_eq!(l.chunk, 1024);
        assert_eq!(l.shard_size(4096) * 6, 6144);
        let big = Layout::for_object(&p, 4 << 20);
        assert_eq!(big.chunk, 4096);
        assert_eq!(big.shard_size(4 << 20), 1 << 20);
        assert_eq!(Layout::for_object(&p, 1).chunk, 64);
        assert_eq!(Layout::for_object(&p, 0).chunk, 64);
    }

    #[test]
    fn assemble_reads_short_and_missing_spans_as_zeros() {
        let l = Layout::new(2, 1, 64).unwrap();
        // Logical 0..256 is shard 0 [0,64) shard 1 [0,64) shard 0 [64,128) shard 1 [64,128).
        let s0: Vec<u8> = (0..100).map(|i| i as u8 + 1).collect(); // short: 28 bytes missing
        let spans = [Some((0..128, &s0[..])), None];
        let out = l.assemble(10..256, 1000, &spans);
        assert_eq!(out.len(), 246);
        assert_eq!(&out[..54], &s0[10..64]);
        assert!(
            out[54..118].iter().all(|&b| b == 0),
            "a missing shard reads as zeros"
        );
        assert_eq!(&out[118..154], &s0[64..100]);
        assert!(
            out[154..].iter().all(|&b| b == 0),
            "past a short span: zeros"
        );
        // Clipped to the object's size.
        assert_eq!(l.assemble(10..256, 40, &spans), s0[10..40].to_vec());
    }

    #[test]
    fn locate_and_spans() {
        let l = Layout::new(3, 2, 64).unwrap();
        assert_eq!(l.locate(0), (0, 0));
        assert_eq!(l.locate(64), (1, 0));
        assert_eq!(l.locate(192 + 70), (1, 64 + 6));
        let spans = l.read_spans(60..200, 1000);
        assert_eq!(spans[0], Some(60..64 + 8));
        assert_eq!(spans[1], Some(0..64));
        assert_eq!(spans[2], Some(0..64));
    }

    #[test]
    fn overwrite_inside_one_chunk_touches_one_data_shard_and_parity() {
        let l = Layout::new(4, 2, 4096).unwrap();
        let plan = l.plan_write(4 << 20, 8192, 4096);
        let reads = plan.reads();
        let shards: Vec<usize> = reads.iter().map(|e| e.shard).collect();
        assert_eq!(shards, vec![2, 4, 5]);
        assert!(reads.iter().all(|e| e.offset == 0 && e.len == 4096));
    }

    #[test]
    fn appends_and_full_stripes_need_no_reads() {
        let l = Layout::new(4, 2, 1024).unwrap();
        assert!(!l.plan_write(0, 0, 4096).needs_reads());
        assert!(!l.plan_write(4096, 4096, 100).needs_reads());
        assert!(!l.plan_write(4096, 0, 8192).needs_reads());
        assert!(l.plan_write(4096, 100, 10).needs_reads());
        // Appending into the old last stripe changes part of it.
        assert!(l.plan_write(1000, 1000, 10).needs_reads());
    }
}

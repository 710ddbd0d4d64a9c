#![allow(clippy::unwrap_used)]
//! Properties of the erasure code and the write planner, against a plain byte-vector model.

use kelp_ec::{Codec, Layout, ShardWrite};
use proptest::prelude::*;

/// An object's shards held in memory, written only through plans.
struct Shards {
    layout: Layout,
    size: u64,
    shards: Vec<Vec<u8>>,
}

impl Shards {
    fn new(layout: Layout) -> Shards {
        Shards {
            layout,
            size: 0,
            shards: vec![Vec::new(); layout.shards()],
        }
    }

    fn read_extent(&self, shard: usize, offset: u64, len: u64) -> Vec<u8> {
        let s = &self.shards[shard];
        let from = (offset as usize).min(s.len());
        let to = ((offset + len) as usize).min(s.len());
        s[from..to].to_vec()
    }

    fn apply(&mut self, writes: Vec<ShardWrite>) {
        for w in writes {
            let s = &mut self.shards[w.shard];
            let end = w.offset as usize + w.data.len();
            if s.len() < end {
                s.resize(end, 0);
            }
            s[w.offset as usize..end].copy_from_slice(&w.data);
        }
    }

    fn write(&mut self, codec: &Codec, offset: u64, data: &[u8]) {
        let plan = self.layout.plan_write(self.size, offset, data.len() as u64);
        let old: Vec<Vec<u8>> = plan
            .reads()
            .iter()
            .map(|e| self.read_extent(e.shard, e.offset, e.len))
            .collect();
        let writes = plan.writes(codec, data, &old).unwrap();
        self.apply(writes);
        self.size = plan.new_size();
    }

    fn truncate(&mut self, codec: &Codec, new_size: u64) {
        if let Some(plan) = self.layout.plan_truncate(self.size, new_size) {
            let old: Vec<Vec<u8>> = plan
                .reads()
                .iter()
                .map(|e| self.read_extent(e.shard, e.offset, e.len))
                .collect();
            let zeros = vec![0u8; (plan.range().end - plan.range().start) as usize];
            let writes = plan.writes(codec, &zeros, &old).unwrap();
            self.apply(writes);
        }
        let len = self.layout.shard_size(new_size) as usize;
        for s in &mut self.shards {
            s.resize(len, 0);
        }
        self.size = new_size;
    }

    fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        let spans = self.layout.read_spans(offset..offset + len, self.size);
        let bufs: Vec<Option<(std::ops::Range<u64>, Vec<u8>)>> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.clone()
                    .map(|r| (r.clone(), self.read_extent(i, r.start, r.end - r.start)))
            })
            .collect();
        let refs: Vec<Option<(std::ops::Range<u64>, &[u8])>> = bufs
            .iter()
            .map(|b| b.as_ref().map(|(r, v)| (r.clone(), v.as_slice())))
            .collect();
        self.layout.assemble(offset..offset + len, self.size, &refs)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    Truncate { size: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..20_000, proptest::collection::vec(any::<u8>(), 1..6000))
            .prop_map(|(offset, data)| Op::Write { offset, data }),
        1 => (0u64..24_000).prop_map(|size| Op::Truncate { size }),
    ]
}

fn layout() -> impl Strategy<Value = Layout> {
    (1u32..7, 1u32..4, 1u32..20).prop_map(|(k, m, c)| Layout::new(k, m, c * 64).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any sequence of writes and truncations, planned stripe by stripe with parity deltas,
    /// leaves shards that read back as the model, whose parity equals a full re-encode, and
    /// from which any `m` lost shards are rebuilt.
    #[test]
    fn writes_match_model_and_parity_matches_reencode(
        layout in layout(),
        ops in proptest::collection::vec(op(), 1..12),
        lost_seed in any::<u64>(),
    ) {
        let codec = Codec::new(layout.k, layout.m).unwrap();
        let mut model: Vec<u8> = Vec::new();
        let mut shards = Shards::new(layout);
        for op in &ops {
            match op {
                Op::Write { offset, data } => {
                    let end = *offset as usize + data.len();
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[*offset as usize..end].copy_from_slice(data);
                    shards.write(&codec, *offset, data);
                }
                Op::Truncate { size } => {
                    model.resize(*size as usize, 0);
                    shards.truncate(&codec, *size);
                }
            }
            prop_assert_eq!(shards.size, model.len() as u64);
            let want_len = layout.shard_size(shards.size) as usize;
            for s in &shards.shards {
                prop_assert_eq!(s.len(), want_len);
            }
        }
        prop_assert_eq!(shards.read(0, model.len() as u64), model.clone());
        // Reads of arbitrary ranges.
        let size = model.len() as u64;
        for (a, b) in [(0, 1), (size / 3, size / 2 + 7), (size.saturating_sub(5), size + 100)] {
            let a = a.min(size);
            let b = b.max(a);
            let got = shards.read(a, b - a);
            let want = &model[a as usize..(b.min(size)) as usize];
            prop_assert_eq!(&got[..], want);
        }
        if size == 0 {
            return Ok(());
        }
        // Parity equals a re-encode of the data shards.
        let k = layout.k as usize;
        let parity = codec.encode(&shards.shards[..k]).unwrap();
        prop_assert_eq!(&parity[..], &shards.shards[k..]);
        // Lose any m shards: rebuilt exactly.
        let n = layout.shards();
        let mut lost: Vec<usize> = (0..n).collect();
        let mut seed = lost_seed;
        for i in (1..n).rev() {
            let j = (seed % (i as u64 + 1)) as usize;
            seed = seed.rotate_left(7) ^ 0x9e37_79b9_7f4a_7c15;
            lost.swap(i, j);
        }
        lost.truncate(layout.m as usize);
        let damaged: Vec<Option<Vec<u8>>> = (0..n)
            .map(|i| (!lost.contains(&i)).then(|| shards.shards[i].clone()))
            .collect();
        let back = codec.reconstruct(damaged).unwrap();
        prop_assert_eq!(&back, &shards.shards);
        // The joined data shards are the model plus zero padding.
        let mut joined = layout.join(&back[..k]);
        prop_assert!(joined[model.len()..].iter().all(|&b| b == 0));
        joined.truncate(model.len());
        prop_assert_eq!(joined, model);
    }

    /// A parity delta equals re-encoding: encode(a) ^ encode(a ^ d) == encode(d).
    #[test]
    fn parity_delta_is_linear(
        k in 1usize..8, m in 1usize..4, blocks in 1usize..4,
        seed in any::<u8>(), touched in any::<u8>(),
    ) {
        let codec = Codec::new(k as u32, m as u32).unwrap();
        let len = blocks * 64;
        let a: Vec<Vec<u8>> = (0..k)
            .map(|i| (0..len).map(|j| (j as u8).wrapping_mul(7) ^ (i as u8) ^ seed).collect())
            .collect();
        let deltas: Vec<Option<Vec<u8>>> = (0..k)
            .map(|i| (touched >> (i % 8) & 1 == 1)
                .then(|| (0..len).map(|j| (j as u8).wrapping_add(i as u8).wrapping_mul(13)).collect()))
            .collect();
        let b: Vec<Vec<u8>> = a
            .iter()
            .zip(&deltas)
            .map(|(a, d)| match d {
                Some(d) => a.iter().zip(d).map(|(x, y)| x ^ y).collect(),
                None => a.clone(),
            })
            .collect();
        let pa = codec.encode(&a).unwrap();
        let pb = codec.encode(&b).unwrap();
        if deltas.iter().all(Option::is_none) {
            prop_assert_eq!(pa, pb);
            return Ok(());
        }
        let refs: Vec<Option<&[u8]>> = deltas.iter().map(|d| d.as_deref()).collect();
        let pd = codec.parity_delta(&refs).unwrap();
        for ((pa, pb), pd) in pa.iter().zip(&pb).zip(&pd) {
            let x: Vec<u8> = pa.iter().zip(pd).map(|(a, d)| a ^ d).collect();
            prop_assert_eq!(&x, pb);
        }
    }
}

//! Reed-Solomon coding of aligned shard buffers, on `reed-solomon-simd`.
//!
//! Hot path: every erasure-coded write encodes here, every degraded read decodes here. Encoders
//! and decoders keep work buffers; one of each is cached per thread and reset for the next call
//! instead of being rebuilt.

use std::cell::RefCell;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use crate::error::EcError;
use crate::layout::ALIGN;

/// A `k + m` Reed-Solomon code. Shards `0..k` are the data itself (the code is systematic),
/// shards `k..k+m` are parity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    k: usize,
    m: usize,
}

thread_local! {
    static ENCODER: RefCell<Option<ReedSolomonEncoder>> = const { RefCell::new(None) };
    static DECODER: RefCell<Option<ReedSolomonDecoder>> = const { RefCell::new(None) };
}

fn codec_err(e: reed_solomon_simd::Error) -> EcError {
    EcError::Codec(e.to_string())
}

impl Codec {
    pub fn new(k: u32, m: u32) -> Result<Codec, EcError> {
        let (k, m) = (k as usize, m as usize);
        if k == 0 || m == 0 || !ReedSolomonEncoder::supports(k, m) {
            return Err(EcError::InvalidProfile(format!(
                "k={k} m={m} is not a supported code"
            )));
        }
        Ok(Codec { k, m })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// Parity of `k` equal, aligned data buffers: `m` buffers of the same length.
    pub fn encode<B: AsRef<[u8]>>(&self, data: &[B]) -> Result<Vec<Vec<u8>>, EcError> {
        if data.len() != self.k {
            return Err(EcError::BadShardSize {
                align: ALIGN,
                detail: format!(
                    "{} data buffers given, the code has k={}",
                    data.len(),
                    self.k
                ),
            });
        }
        let len = common_len(data.iter().map(|d| d.as_ref().len()))?;
        ENCODER.with(|cell| {
            let mut cached = cell.borrow_mut();
            let enc = match cached.as_mut() {
                Some(enc) => {
                    enc.reset(self.k, self.m, len).map_err(codec_err)?;
                    enc
                }
                None => {
                    cached.insert(ReedSolomonEncoder::new(self.k, self.m, len).map_err(codec_err)?)
                }
            };
            for d in data {
                enc.add_original_shard(d.as_ref()).map_err(codec_err)?;
            }
            let out = enc.encode().map_err(codec_err)?;
            Ok(out.recovery_iter().map(<[u8]>::to_vec).collect())
        })
    }

    /// The parity change caused by changing data: `deltas[i]` is old XOR new of data shard `i`
    /// over one range (`None`: that shard did not change there). XOR the result into the old
    /// parity of the same range to get the new parity; the code is linear, so this equals
    /// re-encoding the whole stripe.
    pub fn parity_delta(&self, deltas: &[Option<&[u8]>]) -> Result<Vec<Vec<u8>>, EcError> {
        if deltas.len() != self.k {
            return Err(EcError::BadShardSize {
                align: ALIGN,
                detail: format!(
                    "{} delta buffers given, the code has k={}",
                    deltas.len(),
                    self.k
                ),
            });
        }
        let len = common_len(deltas.iter().flatten().map(|d| d.len()))?;
        let zeros = vec![0u8; len];
        let full: Vec<&[u8]> = deltas.iter().map(|d| d.unwrap_or(&zeros)).collect();
        self.encode(&full)
    }

    /// Rebuilds every missing shard from any `k` present ones: `shards` has `k + m` entries
    /// (data then parity), present ones of equal aligned length. Returns all `k + m` shards.
    /// Fewer than `k` present is `NotEnoughShards`: nothing is invented.
    pub fn reconstruct(&self, shards: Vec<Option<Vec<u8>>>) -> Result<Vec<Vec<u8>>, EcError> {
        if shards.len() != self.k + self.m {
            return Err(EcError::BadShardSize {
                align: ALIGN,
                detail: format!(
                    "{} shards given, the code has {}",
                    shards.len(),
                    self.k + self.m
                ),
            });
        }
        let have = shards.iter().filter(|s| s.is_some()).count();
        if have < self.k {
            return Err(EcError::NotEnoughShards { have, need: self.k });
        }
        let len = common_len(shards.iter().flatten().map(Vec::len))?;
        let data_missing = shards[..self.k].iter().any(Option::is_none);
        let mut shards = shards;
        if data_missing {
            let restored: Vec<(usize, Vec<u8>)> = DECODER.with(|cell| {
                let mut cached = cell.borrow_mut();
                let dec = match cached.as_mut() {
                    Some(dec) => {
                        dec.reset(self.k, self.m, len).map_err(codec_err)?;
                        dec
                    }
                    None => cached
                        .insert(ReedSolomonDecoder::new(self.k, self.m, len).map_err(codec_err)?),
                };
                for (i, s) in shards.iter().enumerate() {
                    let Some(s) = s else { continue };
                    if i < self.k {
                        dec.add_original_shard(i, s).map_err(codec_err)?;
                    } else {
                        dec.add_recovery_shard(i - self.k, s).map_err(codec_err)?;
                    }
                }
                let out = dec.decode().map_err(codec_err)?;
                Ok::<_, EcError>(
                    out.restored_original_iter()
                        .map(|(i, s)| (i, s.to_vec()))
                        .collect(),
                )
            })?;
            for (i, s) in restored {
                shards[i] = Some(s);
            }
        }
        let mut data = Vec::with_capacity(self.k);
        for (i, s) in shards[..self.k].iter_mut().enumerate() {
            data.push(
                s.take()
                    .ok_or(EcError::Codec(format!("data shard {i} was not restored")))?,
            );
        }
        let parity_missing = shards[self.k..].iter().any(Option::is_none);
        let parity = if parity_missing {
            self.encode(&data)?
        } else {
            shards[self.k..].iter_mut().flat_map(Option::take).collect()
        };
        data.extend(parity);
        Ok(data)
    }
}

fn common_len(mut lens: impl Iterator<Item = usize>) -> Result<usize, EcError> {
    let Some(first) = lens.next() else {
        return Err(EcError::BadShardSize {
            align: ALIGN,
            detail: "no buffers".into(),
        });
    };
    if first == 0 || !first.is_multiple_of(ALIGN) {
        return Err(EcError::BadShardSize {
            align: ALIGN,
            detail: format!("a buffer of {first} bytes"),
        });
    }
    if let Some(other) = lens.find(|&l| l != first) {
        return Err(EcError::BadShardSize {
            align: ALIGN,
            detail: format!("buffers of {first} and {other} bytes"),
        });
    }
    Ok(first)
}

/// `dst ^= src` (equal lengths).
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "xor of unequal buffers");
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let x = u64::from_ne_bytes(d.try_into().expect("8-byte chunk"))
            ^ u64::from_ne_bytes(s.try_into().expect("8-byte chunk"));
        d.copy_from_slice(&x.to_ne_bytes());
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d ^= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn encode_then_lose_m() {
        let c = Codec::new(4, 2).unwrap();
        let data: Vec<Vec<u8>> = (0..4).map(|i| bytes(i, 256)).collect();
        let parity = c.encode(&data).unwrap();
        assert_eq!(parity.len(), 2);
        let mut all: Vec<Option<Vec<u8>>> = data.iter().chain(&parity).cloned().map(Some).collect();
        all[1] = None;
        all[4] = None;
        let back = c.reconstruct(all).unwrap();
        assert_eq!(&back[..4], &data[..]);
        assert_eq!(&back[4..], &parity[..]);
    }

    #[test]
    fn too_few_shards_is_an_error() {
        let c = Codec::new(2, 1).unwrap();
        let err = c
            .reconstruct(vec![Some(vec![0; 64]), None, None])
            .unwrap_err();
        assert_eq!(err, EcError::NotEnoughShards { have: 1, need: 2 });
    }

    #[test]
    fn unaligned_buffers_are_refused() {
        let c = Codec::new(2, 1).unwrap();
        assert!(matches!(
            c.encode(&[vec![0; 10], vec![0; 10]]),
            Err(EcError::BadShardSize { .. })
        ));
        assert!(matches!(
            c.encode(&[vec![0; 64], vec![0; 128]]),
            Err(EcError::BadShardSize { .. })
        ));
    }

    #[test]
    fn xor() {
        let mut a = bytes(1, 21);
        let b = bytes(2, 21);
        let orig = a.clone();
        xor_into(&mut a, &b);
        xor_into(&mut a, &b);
        assert_eq!(a, orig);
    }
}

//! The hash functions Ceph's placement is defined by: Bob Jenkins' 1996 `lookup2` mix, used both
//! by CRUSH (`crush_hash32_2`, `crush_hash32_3`, "rjenkins1") and for object names
//! (`ceph_str_hash_rjenkins`). Every value must match Ceph's bit for bit, so these functions are
//! written over explicit wrapping `u32` arithmetic.
//!
//! Hot path: called once per candidate item per CRUSH descent step.

/// CRUSH's only hash algorithm in modern maps (`hash 0` in the text map).
pub const CRUSH_HASH_RJENKINS1: u8 = 0;

/// Seed XOR-ed into every CRUSH hash.
const CRUSH_HASH_SEED: u32 = 1_315_423_911;

/// The reversible 96-bit mix of lookup2: three rounds of subtract/xor-shift over (a, b, c).
#[inline(always)]
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    // Each line is one of the nine mixing steps: x -= y; x -= z; x ^= z shifted.
    macro_rules! step {
        ($x:ident, $y:ident, $z:ident, $shift:tt $n:literal) => {
            *$x = $x.wrapping_sub(*$y).wrapping_sub(*$z) ^ (*$z $shift $n);
        };
    }
    step!(a, b, c, >> 13);
    step!(b, c, a, << 8);
    step!(c, a, b, >> 13);
    step!(a, b, c, >> 12);
    step!(b, c, a, << 16);
    step!(c, a, b, >> 5);
    step!(a, b, c, >> 3);
    step!(b, c, a, << 10);
    step!(c, a, b, >> 15);
}

/// `crush_hash32_2(RJENKINS1, a, b)`: hashes two words (used for the reweight coin flip and for
/// the `hashpspool` placement seed).
#[inline]
pub fn crush_hash32_2(a: u32, b: u32) -> u32 {
    let (mut a, mut b) = (a, b);
    let mut hash = CRUSH_HASH_SEED ^ a ^ b;
    let (mut x, mut y) = (231_232u32, 1_232u32);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut x, &mut a, &mut hash);
    mix(&mut b, &mut y, &mut hash);
    hash
}

/// `crush_hash32_3(RJENKINS1, a, b, c)`: the straw2 draw hash of (x, item id, replica rank r).
#[inline]
pub fn crush_hash32_3(a: u32, b: u32, c: u32) -> u32 {
    let (mut a, mut b, mut c) = (a, b, c);
    let mut hash = CRUSH_HASH_SEED ^ a ^ b ^ c;
    let (mut x, mut y) = (231_232u32, 1_232u32);
    mix(&mut a, &mut b, &mut hash);
    mix(&mut c, &mut x, &mut hash);
    mix(&mut y, &mut a, &mut hash);
    mix(&mut b, &mut x, &mut hash);
    mix(&mut y, &mut c, &mut hash);
    hash
}

/// `ceph_str_hash_rjenkins`: lookup2 over a byte string, the hash of object names (or locator
/// keys) that picks an object's placement group.
pub fn str_hash_rjenkins(bytes: &[u8]) -> u32 {
    let word = |k: &[u8]| u32::from_le_bytes([k[0], k[1], k[2], k[3]]);
    let mut a: u32 = 0x9e37_79b9;
    let mut b: u32 = a;
    let mut c: u32 = 0;
    let mut chunks = bytes.chunks_exact(12);
    for k in &mut chunks {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        mix(&mut a, &mut b, &mut c);
    }
    // The tail: up to 11 bytes spread over a, b and c; c's lowest byte carries the length.
    let tail = chunks.remainder();
    c = c.wrapping_add(bytes.len() as u32);
    for (i, &byte) in tail.iter().enumerate() {
        let v = byte as u32;
        match i {
            0..=3 => a = a.wrapping_add(v << (8 * i)),
            4..=7 => b = b.wrapping_add(v << (8 * (i - 4))),
            _ => c = c.wrapping_add(v << (8 * (i - 7))),
        }
    }
    mix(&mut a, &mut b, &mut c);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_string_hash_is_stable() {
        // lookup2 of the empty string with the golden-ratio start is a fixed, well-known value;
        // the object vectors in shared/vectors check every tail length against Ceph itself.
        assert_eq!(str_hash_rjenkins(b""), str_hash_rjenkins(b""));
        assert_ne!(str_hash_rjenkins(b"a"), str_hash_rjenkins(b"b"));
    }
}

/// Number of items hashed together by `crush_hash32_3_lanes`.
pub(crate) const LANES: usize = 8;

/// `crush_hash32_3(a, b[i], c)` for `LANES` values of `b` at once. Written lane-wise over
/// fixed-size arrays so the compiler turns it into SIMD; must equal the scalar function.
#[inline]
pub(crate) fn crush_hash32_3_lanes(a: u32, b: &[u32; LANES], c: u32) -> [u32; LANES] {
    let mut va = [a; LANES];
    let mut vb = *b;
    let mut vc = [c; LANES];
    let mut hash = [0u32; LANES];
    for i in 0..LANES {
        hash[i] = CRUSH_HASH_SEED ^ a ^ b[i] ^ c;
    }
    let mut vx = [231_232u32; LANES];
    let mut vy = [1_232u32; LANES];
    mix_lanes(&mut va, &mut vb, &mut hash);
    mix_lanes(&mut vc, &mut vx, &mut hash);
    mix_lanes(&mut vy, &mut va, &mut hash);
    mix_lanes(&mut vb, &mut vx, &mut hash);
    mix_lanes(&mut vy, &mut vc, &mut hash);
    hash
}

#[inline(always)]
fn mix_lanes(a: &mut [u32; LANES], b: &mut [u32; LANES], c: &mut [u32; LANES]) {
    for i in 0..LANES {
        let (mut x, mut y, mut z) = (a[i], b[i], c[i]);
        mix(&mut x, &mut y, &mut z);
        a[i] = x;
        b[i] = y;
        c[i] = z;
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;

    #[test]
    fn lanes_equal_scalar() {
        let mut b = [0u32; LANES];
        for round in 0..2000u32 {
            for (i, v) in b.iter_mut().enumerate() {
                *v = crush_hash32_2(round, i as u32).wrapping_mul(0x9e37_79b9);
            }
            let a = round.wrapping_mul(7919);
            let c = round % 17;
            let got = crush_hash32_3_lanes(a, &b, c);
            for i in 0..LANES {
                assert_eq!(got[i], crush_hash32_3(a, b[i], c));
            }
        }
    }
}

//! Exact division of straw2's log draw by an item weight, without a hardware divide.
//!
//! straw2 computes `ln / weight` (ln in `[-2^48, 0]`, truncated toward zero) for every item of
//! every bucket it descends through; the 64-bit `idiv` was the largest single cost. Weights are
//! fixed per bucket item, so each gets a precomputed multiplier (Granlund–Montgomery): for
//! `0 <= n < 2^49` and `d >= 1`, with `l = ceil(log2 d)`, `s = 49 + l` and
//! `m = floor(2^s / d) + 1`, `floor(n / d) = (n * m) >> s` exactly, because
//! `2^s <= m * d <= 2^s + 2^l`. `m < 2^51`, so `n * m` fits in 128 bits.

/// Numerator bound in bits: `|ln| <= 2^48 < 2^49`.
const N_BITS: u32 = 49;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    magic: u64,
    shift: u32,
}

impl Divisor {
    /// Divisor for weight `d`. A zero weight never divides (straw2 skips it); it gets a
    /// harmless placeholder.
    pub(crate) fn new(d: u32) -> Self {
        if d == 0 {
            return Divisor { magic: 0, shift: 0 };
        }
        let l = 32 - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d = 1
        let shift = N_BITS + l;
        let magic = ((1u128 << shift) / d as u128 + 1) as u64;
        Divisor { magic, shift }
    }

    /// `ln / d` truncated toward zero, for `-2^49 < ln <= 0`, as C's signed division gives.
    #[inline(always)]
    pub(crate) fn div_neg(self, ln: i64) -> i64 {
        debug_assert!(ln <= 0 && ln > -(1i64 << N_BITS));
        let n = ln.unsigned_abs() as u128;
        -(((n * self.magic as u128) >> self.shift) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(d: u32, n: i64) {
        assert_eq!(Divisor::new(d).div_neg(n), n / d as i64, "{n} / {d}");
    }

    #[test]
    fn matches_hardware_division() {
        let ds = [
            1u32,
            2,
            3,
            7,
            655,
            19_660,
            65_535,
            65_536,
            65_537,
            119_209,
            268_501,
            1 << 20,
            0x7fff_ffff,
            u32::MAX,
            u32::MAX - 1,
        ];
        let mut seed = 0x1234_5678_9abc_def0u64;
        for &d in &ds {
            for n in [
                0i64,
                -1,
                -2,
                -(1 << 48),
                -(1 << 48) + 1,
                -(d as i64),
                -(d as i64) + 1,
                -(d as i64) - 1,
            ] {
                check(d, n);
            }
        }
        for _ in 0..2_000_000 {
            // xorshift: random divisors (all sizes) and numerators in the straw2 range
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let d = ((seed >> 32) as u32) >> (seed % 32);
            let n = -((seed & ((1 << 48) - 1)) as i64);
            if d != 0 {
                check(d, n);
            }
        }
    }
}

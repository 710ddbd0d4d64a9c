//! `crush_ln`: the fixed-point `2^44 * log2(x + 1)` that straw2 turns a 16-bit hash into an
//! exponentially distributed draw with. Integer-only so that every platform draws the same
//! values; the tables are Ceph's exact constants (see `scripts/gen-crush-ln-table.py`).
//!
//! Hot path: evaluated once per candidate item in every straw2 choice.

use crate::ln_table::{LL, RH_LH};

/// `2^44 * log2(xin + 1)` for `xin` in `0..=0xffff`, as Ceph computes it.
#[inline]
pub(crate) fn crush_ln(xin: u32) -> u64 {
    let mut x = xin + 1;
    // Normalise x into [2^15, 2^16] and remember the exponent.
    let mut iexpon: u64 = 15;
    if x & 0x18000 == 0 {
        let bits = (x & 0x1ffff).leading_zeros() - 16;
        x <<= bits;
        iexpon = 15 - bits as u64;
    }
    // Top bits of the mantissa select the coarse reciprocal RH and log LH …
    let index1 = ((x >> 8) << 1) as usize;
    let rh = RH_LH[index1 - 256] as u64;
    let lh = RH_LH[index1 + 1 - 256] as u64;
    // … x * RH ~ 2^48 * (1 + small), whose low byte indexes the fine log table LL.
    let xl64 = ((x as i64 as u64).wrapping_mul(rh)) >> 48;
    let index2 = (xl64 & 0xff) as usize;
    let ll = LL[index2] as u64;
    (iexpon << 44) + ((lh + ll) >> 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        // Ceph's table ends with LH = 0xffff_0000_0000 rather than 2^48, so the top value is
        // 2^28 short of 16 * 2^44; placement depends on reproducing that exactly.
        assert_eq!(crush_ln(0xffff), (1 << 48) - (1 << 28));
        assert_eq!(crush_ln(0), 0, "log2(1) = 0");
    }

    #[test]
    fn close_to_real_log2() {
        // Within 2^-8 (in log2 units) of the real logarithm everywhere.
        for u in 1..=0xffffu32 {
            let exact = ((u + 1) as f64).log2() * (1u64 << 44) as f64;
            let got = crush_ln(u) as f64;
            assert!(
                (exact - got).abs() < (1u64 << 36) as f64,
                "u={u} exact={exact} got={got}"
            );
        }
    }

    #[test]
    fn table_structure_matches_its_definition() {
        // RH is ceil(2^55 / (128 + k)); LH is within a hair of 2^48 * log2(1 + k/128).
        for k in 0..=128usize {
            let rh = RH_LH[2 * k] as u128;
            let want = (1u128 << 55).div_ceil(128 + k as u128);
            assert_eq!(rh, want, "RH[{k}]");
            let lh = RH_LH[2 * k + 1] as f64;
            let exact = (1.0 + k as f64 / 128.0).log2() * (1u64 << 48) as f64;
            assert!((lh - exact).abs() < 2f64.powi(33), "LH[{k}]");
        }
    }
}

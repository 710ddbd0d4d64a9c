//! The metadata journal: every namespace mutation is appended to a journal object in the
//! metadata pool. The MDS appends the entries of many changes at once (one RADOS append per
//! batch: whatever accumulated while the previous append was in flight); a change's client
//! gets an early, "unsafe" reply before its entry is in RADOS, and keeps the request until it
//! is (see `mds.rs`).
//!
//! Layout: segments `mds.journal.<seg 16 hex>` hold entries, each a little-endian u32 length
//! and a JSON [`Entry`]; `mds.journal.head` names the first segment not yet checkpointed.
//! RADOS appends are atomic, so a segment never holds a torn entry; a malformed one is still
//! reported (never a panic). Entries are lists of idempotent [`Update`]s, so replaying a
//! segment that was already partly checkpointed gives the same state.
//!
//! Entry versions: 1, the namespace updates; 2, also [`Update::Request`], the record of the
//! client request the entry completes (the completed-request table); 3 (this build), also
//! directory fragments ([`Update::Fragment`], the fragment bits of entry updates) and the
//! advisory locks ([`Update::Locks`]). All are replayed (an older entry's entry updates are
//! of a one-fragment directory); an older build refuses version 3 rather than misread it.

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
pub const JOURNAL_VERSION: u8 = 3;
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

/// Decodes a segment's entries in order.
pub fn decode_segment(mut data: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let bad = |detail: String| FsError::Malformed {
            what: "journal entry".into(),
            detail,
        };
        let Some((len, rest)) = data.split_first_chunk::<4>() else {
            return Err(bad("truncated length".into()));
        };
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(bad(format!("{len} bytes announced, {} left", rest.len())));
        }
        let entry: Entry = serde_json::from_slice(&rest[..len]).map_err(|e| bad(e.to_string()))?;
        if !(OLDEST_JOURNAL_VERSION..=JOURNAL_VERSION).contains(&entry.v) {
            return Err(bad(format!("version {}", entry.v)));
        }
        out.push(entry);
        data = &rest[len..];
    }
    Ok(out)
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

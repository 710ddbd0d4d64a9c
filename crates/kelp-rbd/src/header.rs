//! The image header: everything about an image except its data, kept as one JSON value in the
//! omap of `rbd_header.<id>` and changed only by compare-and-swap (so two clients changing an
//! image at once never lose an update). It carries a format version; a client refuses a header
//! newer than it understands.

use serde::{Deserialize, Serialize};

use crate::RbdError;
use crate::layout::Layout;

/// The header format this library writes and reads.
pub const FORMAT: u32 = 1;
/// Most snapshots an image may have (the header stays small: every writer carries the list).
pub const MAX_SNAPSHOTS: usize = 512;

/// Where a clone's data comes from until it is copied up: an image's snapshot, and how many
/// bytes of it the clone sees (`overlap`: shrinking the clone lowers it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentSpec {
    pub pool: String,
    pub image_id: String,
    pub snap_id: u64,
    pub overlap: u64,
}

/// A clone made from one of this image's snapshots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRef {
    pub snap_id: u64,
    pub pool: String,
    pub image_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapInfo {
    pub id: u64,
    pub name: String,
    /// The image's size when the snapshot was taken.
    pub size: u64,
    pub protected: bool,
    pub created_ns: u64,
    /// The parent overlap at the time of the snapshot (clones only).
    #[serde(default)]
    pub parent_overlap: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHeader {
    pub format: u32,
    pub id: String,
    pub size: u64,
    pub layout: Layout,
    /// Pool of the data objects (the image's own pool unless `--data-pool`).
    pub data_pool: String,
    pub created_ns: u64,
    /// Newest snapshot id this image has used (its writes' snapshot context `seq`).
    pub snap_seq: u64,
    /// Oldest first.
    pub snaps: Vec<SnapInfo>,
    pub parent: Option<ParentSpec>,
    pub children: Vec<ChildRef>,
}

impl ImageHeader {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a header always serialises")
    }

    pub fn decode(bytes: &[u8]) -> Result<ImageHeader, RbdError> {
        #[derive(Deserialize)]
        struct Probe {
            format: u32,
        }
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|e| RbdError::Corrupt(format!("image header: {e}")))?;
        if probe.format > FORMAT {
            return Err(RbdError::Unsupported(format!(
                "image header format {} is newer than this client understands ({FORMAT})",
                probe.format
            )));
        }
        serde_json::from_slice(bytes).map_err(|e| RbdError::Corrupt(format!("image header: {e}")))
    }

    pub fn snap(&self, name: &str) -> Option<&SnapInfo> {
        self.snaps.iter().find(|s| s.name == name)
    }

    pub fn snap_by_id(&self, id: u64) -> Option<&SnapInfo> {
        self.snaps.iter().find(|s| s.id == id)
    }

    /// The snapshot context of writes: the newest id and every live snapshot id, newest first.
    pub fn snap_context(&self) -> (u64, Vec<u64>) {
        let mut ids: Vec<u64> = self.snaps.iter().map(|s| s.id).collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        (self.snap_seq, ids)
    }

    /// How many bytes of the parent this image (at `snap`, or the head) reads through.
    pub fn overlap_at(&self, snap: Option<u64>) -> u64 {
        let Some(parent) = &self.parent else { return 0 };
        match snap.and_then(|id| self.snap_by_id(id)) {
            Some(s) => s.parent_overlap.unwrap_or(0).min(s.size),
            None => parent.overlap.min(self.size),
        }
    }
}

/// Image names: what a user can type and an NBD export name can carry.
pub fn check_image_name(name: &str) -> Result<(), RbdError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.contains(['/', '@', '\0'])
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(RbdError::Invalid(format!(
            "image name {name:?}: 1-200 characters, none of '/', '@' or control characters"
        )))
    }
}

pub fn check_snap_name(name: &str) -> Result<(), RbdError> {
    check_image_name(name).map_err(|_| {
        RbdError::Invalid(format!(
            "snapshot name {name:?}: 1-200 characters, none of '/', '@' or control characters"
        ))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn header() -> ImageHeader {
        ImageHeader {
            format: FORMAT,
            id: "abc".into(),
            size: 1 << 30,
            layout: Layout::plain(22).unwrap(),
            data_pool: "rbd".into(),
            created_ns: 1,
            snap_seq: 7,
            snaps: vec![
                SnapInfo {
                    id: 3,
                    name: "a".into(),
                    size: 1 << 20,
                    protected: false,
                    created_ns: 2,
                    parent_overlap: None,
                },
                SnapInfo {
                    id: 7,
                    name: "b".into(),
                    size: 1 << 30,
                    protected: true,
                    created_ns: 3,
                    parent_overlap: None,
                },
            ],
            parent: None,
            children: vec![],
        }
    }

    #[test]
    fn header_round_trips_and_newer_formats_are_refused() {
        let h = header();
        assert_eq!(ImageHeader::decode(&h.encode()).unwrap(), h);
        let mut newer = serde_json::to_value(&h).unwrap();
        newer["format"] = serde_json::json!(FORMAT + 1);
        let err = ImageHeader::decode(&serde_json::to_vec(&newer).unwrap()).unwrap_err();
        assert!(matches!(err, RbdError::Unsupported(_)), "{err}");
        assert!(matches!(
            ImageHeader::decode(b"{").unwrap_err(),
            RbdError::Corrupt(_)
        ));
    }

    #[test]
    fn snap_context_is_newest_first() {
        assert_eq!(header().snap_context(), (7, vec![7, 3]));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_image_name("vm-disk_1.img").is_ok());
        for bad in ["", "a/b", "a@b", "a\nb"] {
            assert!(check_image_name(bad).is_err(), "{bad:?}");
        }
    }
}

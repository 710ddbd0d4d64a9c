//! Directory fragments: a directory's entries are spread over `2^bits` omap objects in the
//! metadata pool by a stable 32-bit hash of the name (fragment = the hash's top `bits` bits),
//! so that no one object grows without bound. `bits` lives in the directory's inode
//! ([`Inode::frag_bits`]); 0 is one object, [`dir_object`], the layout of older builds, so
//! their directories load unchanged.
//!
//! The fragment tree is uniform (one `bits` per directory, not a tree per fragment as Ceph's
//! `fragtree_t`): when one fragment passes `split_size` entries the whole directory goes to
//! `bits + split_bits`, and when the directory holds fewer than `merge_size` entries per
//! fragment of the level below it goes back down one level. With a good hash the fragments of
//! a level fill evenly, so they would all split at about the same time anyway; a uniform
//! layout keeps the object of a name computable from the inode alone.
//!
//! A change of layout is journaled ([`Update::Fragment`]) with the entry that caused it; the
//! daemon moves the stored entries into the new objects at the next checkpoint (or replay),
//! new objects written before old ones are removed, so a crash at any point replays to the
//! same result.

use std::collections::BTreeMap;

use crate::types::{Dentry, Ino, Inode, dir_object};

/// Most bits a directory is split into (16 million fragments).
pub const MAX_FRAG_BITS: u8 = 24;

/// When directories split and merge (Ceph's `mds_bal_split_size`, `mds_bal_split_bits`,
/// `mds_bal_merge_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragConfig {
    /// A fragment with more entries than this splits the directory.
    pub split_size: usize,
    /// Bits added by a split (each fragment becomes `2^split_bits`).
    pub split_bits: u8,
    /// A directory goes back down one level when it holds fewer than this many entries per
    /// fragment of that level (capped below a split's threshold, so that a directory never
    /// flaps between two levels).
    pub merge_size: usize,
}

impl Default for FragConfig {
    fn default() -> FragConfig {
        FragConfig {
            split_size: 10_000,
            split_bits: 3,
            merge_size: 50,
        }
    }
}

impl FragConfig {
    /// The split bits actually used (1 ..= [`MAX_FRAG_BITS`]).
    fn step(&self) -> u8 {
        self.split_bits.clamp(1, MAX_FRAG_BITS)
    }

    /// The merge threshold per fragment actually used: at most a quarter of what a fragment
    /// of the level below holds on average right after a split.
    fn merge_per_frag(&self) -> usize {
        let after_split = self.split_size >> self.step();
        self.merge_size.min(after_split / 4)
    }

    /// The layout `dir` should have with `entries` (`None`: keep `bits`). `biggest` is the
    /// size of the largest fragment (only looked at when the directory could split).
    pub fn relayout(
        &self,
        bits: u8,
        entries: usize,
        biggest: impl FnOnce() -> usize,
    ) -> Option<u8> {
        let step = self.step();
        if entries > self.split_size.max(1) && bits < MAX_FRAG_BITS && biggest() > self.split_size {
            return Some((bits + step).min(MAX_FRAG_BITS));
        }
        if bits > 0 {
            let down = bits.saturating_sub(step);
            if entries < self.merge_per_frag() << down {
                return Some(down);
            }
        }
        None
    }
}

/// The stable hash of a directory entry's name (FNV-1a, then a 32-bit finalizer so that the
/// top bits, which pick the fragment, depend on every byte). Stored layouts depend on it: it
/// must never change.
pub fn name_hash(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The fragment (of `2^bits`) that holds `name`.
pub fn frag_of(name: &str, bits: u8) -> u32 {
    if bits == 0 {
        0
    } else {
        name_hash(name) >> (32 - u32::from(bits.min(32)))
    }
}

/// The metadata-pool object of fragment `frag` of `2^bits` of directory `ino` (bits 0: the
/// directory's one object of older builds).
pub fn frag_object(ino: Ino, bits: u8, frag: u32) -> String {
    if bits == 0 {
        dir_object(ino)
    } else {
        format!("{ino:x}.dir.{bits}.{frag:x}")
    }
}

/// Every object of a directory laid out in `2^bits` fragments.
pub fn frag_objects(ino: Ino, bits: u8) -> impl Iterator<Item = String> {
    (0..1u32 << bits.min(MAX_FRAG_BITS)).map(move |f| frag_object(ino, bits, f))
}

/// Sizes of the fragments of `entries` under `2^bits`.
pub fn frag_sizes(entries: &BTreeMap<String, Dentry>, bits: u8) -> Vec<u32> {
    let mut sizes = vec![0u32; 1usize << bits.min(MAX_FRAG_BITS)];
    for name in entries.keys() {
        sizes[frag_of(name, bits) as usize] += 1;
    }
    sizes
}

/// A directory inode's fragment bits (0 for anything else).
pub fn bits_of(inode: &Inode) -> u8 {
    if inode.is_dir() { inode.frag_bits } else { 0 }
}

/// What a run of journaled updates does to one directory's stored objects (the checkpoint and
/// the replay execute it: first [`DirPlan::old_objects`] are moved into the final layout, one
/// object at a time, each copied before it is removed; then the entries are written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirPlan {
    /// The layout the directory ends with.
    pub bits: u8,
    /// Every layout the run mentions (the final one included).
    pub layouts: std::collections::BTreeSet<u8>,
    /// The layout changed in the run: the objects of the other layouts are moved.
    pub refragmented: bool,
    /// The directory was removed: every object of every layout named goes.
    pub removed: bool,
    /// The last change per name (`None`: removed).
    pub entries: BTreeMap<String, Option<Dentry>>,
}

impl DirPlan {
    /// The objects whose entries move into the final layout (those of the other layouts).
    pub fn old_objects(&self, dir: Ino) -> Vec<String> {
        if !(self.refragmented || self.layouts.len() > 1) || self.removed {
            return Vec::new();
        }
        self.layouts
            .iter()
            .filter(|b| **b != self.bits)
            .flat_map(|b| frag_objects(dir, *b))
            .collect()
    }

    /// Every object the directory may have (what goes when it is removed).
    pub fn all_objects(&self, dir: Ino) -> Vec<String> {
        let mut layouts = self.layouts.clone();
        layouts.insert(0);
        layouts.iter().flat_map(|b| frag_objects(dir, *b)).collect()
    }

    /// The entry changes grouped by object of the final layout.
    pub fn writes(&self, dir: Ino) -> Vec<FragWrite<'_>> {
        type Changes<'a> = (Vec<(&'a str, Dentry)>, Vec<&'a str>);
        let mut by_frag: BTreeMap<u32, Changes<'_>> = BTreeMap::new();
        for (name, d) in &self.entries {
            let e = by_frag.entry(frag_of(name, self.bits)).or_default();
            match d {
                Some(d) => e.0.push((name.as_str(), *d)),
                None => e.1.push(name.as_str()),
            }
        }
        by_frag
            .into_iter()
            .map(|(f, (puts, dels))| FragWrite {
                object: frag_object(dir, self.bits, f),
                puts,
                dels,
            })
            .collect()
    }
}

/// The entry changes of one fragment object ([`DirPlan::writes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragWrite<'a> {
    pub object: String,
    pub puts: Vec<(&'a str, Dentry)>,
    /// Names removed.
    pub dels: Vec<&'a str>,
}

/// The per-directory plans of a run of updates, in journal order (the last change of a name,
/// and the last layout, win).
pub fn plan_dirs(updates: &[crate::types::Update]) -> BTreeMap<Ino, DirPlan> {
    use crate::types::Update;
    let mut plans: BTreeMap<Ino, DirPlan> = BTreeMap::new();
    for u in updates {
        match u {
            Update::PutDentry {
                dir,
                name,
                dentry,
                bits,
            } => {
                let p = plans.entry(*dir).or_default();
                p.note(*bits);
                p.entries.insert(name.clone(), Some(*dentry));
            }
            Update::DelDentry { dir, name, bits } => {
                let p = plans.entry(*dir).or_default();
                p.note(*bits);
                p.entries.insert(name.clone(), None);
            }
            Update::Fragment { dir, from, to } => {
                let p = plans.entry(*dir).or_default();
                p.note(*from);
                p.note(*to);
                p.refragmented = true;
            }
            Update::DelDir(dir) => {
                let p = plans.entry(*dir).or_default();
                p.removed = true;
                p.entries.clear();
            }
            _ => {}
        }
    }
    plans
}

impl DirPlan {
    fn note(&mut self, bits: u8) {
        self.layouts.insert(bits);
        self.bits = bits;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{S_IFREG, Update};

    /// The metadata pool's omap objects, as the daemon's checkpoint writes them.
    #[derive(Default)]
    struct Objects(BTreeMap<String, BTreeMap<String, Dentry>>);

    impl Objects {
        /// Executes the plans of `updates`; `crash_after`: stop after moving that many old
        /// objects (a kill -9 mid-checkpoint).
        fn checkpoint(&mut self, updates: &[Update], crash_after: Option<usize>) {
            let mut moved = 0;
            for (dir, plan) in plan_dirs(updates) {
                for old in plan.old_objects(dir) {
                    if crash_after == Some(moved) {
                        return;
                    }
                    moved += 1;
                    let entries = self.0.get(&old).cloned().unwrap_or_default();
                    for (k, v) in entries {
                        let to = frag_object(dir, plan.bits, frag_of(&k, plan.bits));
                        self.0.entry(to).or_default().insert(k, v);
                    }
                    self.0.remove(&old);
                }
            }
            for (dir, plan) in plan_dirs(updates) {
                if plan.removed {
                    for o in plan.all_objects(dir) {
                        self.0.remove(&o);
                    }
                    continue;
                }
                for w in plan.writes(dir) {
                    let o = self.0.entry(w.object).or_default();
                    for (n, d) in w.puts {
                        o.insert(n.to_string(), d);
                    }
                    for n in w.dels {
                        o.remove(n);
                    }
                }
            }
        }

        fn load(&self, dir: Ino, bits: u8) -> BTreeMap<String, Dentry> {
            frag_objects(dir, bits)
                .filter_map(|o| self.0.get(&o))
                .flat_map(|m| m.iter().map(|(k, v)| (k.clone(), *v)))
                .collect()
        }
    }

    fn put(dir: Ino, name: &str, ino: Ino, bits: u8) -> Update {
        Update::PutDentry {
            dir,
            name: name.into(),
            dentry: Dentry { ino, kind: S_IFREG },
            bits,
        }
    }

    #[test]
    fn hash_is_stable_and_spreads_names() {
        // stored layouts depend on these values: they must never change
        assert_eq!(name_hash(""), name_hash(""));
        assert_eq!(frag_of("anything", 0), 0);
        assert_ne!(name_hash("f1"), name_hash("f2"));
        let mut sizes = [0u32; 8];
        for i in 0..8000 {
            sizes[frag_of(&format!("file{i}"), 3) as usize] += 1;
        }
        assert!(sizes.iter().all(|n| (800..1200).contains(n)), "{sizes:?}");
        assert_eq!(frag_object(0x100, 0, 0), "100.dir");
        assert_eq!(frag_object(0x100, 3, 5), "100.dir.3.5");
        assert_eq!(frag_objects(0x100, 2).count(), 4);
    }

    #[test]
    fn relayout_splits_big_fragments_and_merges_small_directories() {
        let cfg = FragConfig {
            split_size: 100,
            split_bits: 2,
            merge_size: 50,
        };
        assert_eq!(cfg.relayout(0, 100, || 100), None);
        assert_eq!(cfg.relayout(0, 101, || 101), Some(2));
        assert_eq!(cfg.relayout(2, 300, || 90), None, "no fragment too big");
        assert_eq!(cfg.relayout(2, 400, || 101), Some(4));
        // merge: under a quarter of a fresh split's fragment per fragment below
        assert_eq!(cfg.relayout(2, 7, || 0), None);
        assert_eq!(cfg.relayout(2, 5, || 0), Some(0));
        assert_eq!(cfg.relayout(4, 24, || 0), None);
        assert_eq!(cfg.relayout(4, 23, || 0), Some(2));
        assert_eq!(cfg.relayout(MAX_FRAG_BITS, 1 << 30, || 1 << 30), None);
    }

    /// A directory written by an older build (one `<ino>.dir` object, an inode record
    /// without `frag_bits`) loads, and its first split moves every entry into fragments, also
    /// when the checkpoint is cut short and replayed.
    #[test]
    fn old_single_object_directories_load_and_split_through_a_crash() {
        let old_inode = r#"{"ino":512,"mode":16877,"uid":0,"gid":0,"size":0,"nlink":2,
            "atime":{"secs":1,"nanos":0},"mtime":{"secs":1,"nanos":0},
            "ctime":{"secs":1,"nanos":0},"rdev":0,"parent":1,"object_size":4194304}"#;
        let inode: Inode = serde_json::from_str(old_inode).unwrap();
        assert_eq!(bits_of(&inode), 0);
        let dir = inode.ino;
        let mut objs = Objects::default();
        let mut first: Vec<Update> = (0..40)
            .map(|i| put(dir, &format!("f{i}"), 1000 + i, 0))
            .collect();
        first.push(Update::DelDentry {
            dir,
            name: "f3".into(),
            bits: 0,
        });
        objs.checkpoint(&first, None);
        assert_eq!(objs.0.keys().collect::<Vec<_>>(), vec!["200.dir"]);
        assert_eq!(objs.load(dir, 0).len(), 39);
        // a split to 8 fragments with more entries before and after it
        let mut batch = vec![
            put(dir, "g0", 2000, 0),
            Update::Fragment {
                dir,
                from: 0,
                to: 3,
            },
        ];
        batch.push(put(dir, "g1", 2001, 3));
        batch.push(Update::DelDentry {
            dir,
            name: "f4".into(),
            bits: 3,
        });
        for crash in [Some(0), Some(1), None] {
            objs.checkpoint(&batch, crash);
        }
        assert!(!objs.0.contains_key("200.dir"), "the old object is gone");
        let loaded = objs.load(dir, 3);
        assert_eq!(loaded.len(), 39 + 2 - 1);
        assert!(loaded.contains_key("g0") && loaded.contains_key("g1"));
        assert!(!loaded.contains_key("f3") && !loaded.contains_key("f4"));
        for (obj, entries) in &objs.0 {
            for name in entries.keys() {
                assert_eq!(*obj, frag_object(dir, 3, frag_of(name, 3)), "{name}");
            }
        }
        // replaying the whole batch again (a crash before the journal was trimmed)
        objs.checkpoint(&batch, None);
        assert_eq!(objs.load(dir, 3), loaded);
        // removing the directory removes every fragment
        objs.checkpoint(
            &[
                Update::Fragment {
                    dir,
                    from: 3,
                    to: 0,
                },
                Update::DelDir(dir),
            ],
            None,
        );
        assert!(objs.0.is_empty(), "{:?}", objs.0.keys());
    }
}

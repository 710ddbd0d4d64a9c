//! Self-managed snapshots, the pure part: an object's `SnapSet` (which clones it has and which
//! snapshot ids each serves), and the decisions made from it — whether a write clones the head
//! first, which object a read at a snapshot sees, what a rollback restores, what the trimmer
//! drops — without I/O, so unit tests drive every case directly.
//!
//! Model (Ceph's): snapshot ids come from the pool (`Pool::snap_seq`, allocated by the
//! monitors). A writer sends its snapshot context (`seq`, the newest id it knows, and the
//! existing ids, newest first). The head records in its `SnapSet` the newest `seq` it was
//! written under; a write whose context is newer than that, to a head that exists, first keeps
//! the head as a *clone* named by the context's `seq`, serving the context's snapshots newer
//! than the head's old `seq`. A head removed while clones remain stays as a *whiteout* (no
//! data, reads find nothing) that carries the `SnapSet`.
//!
//! Where clones live: in the head's PG, as ordinary objects of the namespace
//! `CLONE_NS_PREFIX + head namespace`, named `head name + "\x1f" + clone id (16 hex digits)`,
//! placed by the head's hash (`object_id` and `object_state::oid_for` know this), so that
//! recovery, backfill and scrub move and compare them as any other object, and client
//! listings (which skip `\x1f` namespaces) never show them.
//!
//! Invariants: `SnapSet::clones` is ordered by id, oldest first; each clone's `snaps` are
//! descending, non-empty, and all `<=` its id; a clone's id is `<=` the set's `seq`.

use std::collections::BTreeSet;

use kelp_proto::{ObjectLocator, OpKind, SnapSetInfo};
use serde::{Deserialize, Serialize};

/// The head's attribute holding its encoded [`SnapSet`].
pub const SNAPSET_ATTR: &str = "@ss";
/// Present on a whiteout head (removed, but its clones remain).
pub const WHITEOUT_ATTR: &str = "@wo";
/// Namespace prefix of clone objects (`\x1f`: never a client's namespace).
pub const CLONE_NS_PREFIX: &str = "\u{1f}snap:";
/// Separates the head's name from the clone id in a clone's name.
const CLONE_NAME_SEP: char = '\u{1f}';
/// Version byte of the encoded [`SnapSet`].
const SNAPSET_FORMAT: u8 = 1;

/// One clone of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneInfo {
    /// The clone's id: the snapshot context `seq` of the write that made it.
    pub id: u64,
    /// Snapshot ids it serves, newest first.
    pub snaps: Vec<u64>,
    /// Its (logical) size.
    pub size: u64,
}

/// An object's snapshot state, kept on its head (`SNAPSET_ATTR`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapSet {
    /// The newest snapshot context `seq` the head was written under.
    pub seq: u64,
    /// Clones, oldest first.
    pub clones: Vec<CloneInfo>,
}

impl SnapSet {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![SNAPSET_FORMAT];
        out.extend(postcard::to_stdvec(self).expect("a snapset always encodes"));
        out
    }

    /// `None` when the bytes are not a snapset this version reads.
    pub fn decode(bytes: &[u8]) -> Option<SnapSet> {
        match bytes.split_first() {
            Some((&SNAPSET_FORMAT, body)) => postcard::from_bytes(body).ok(),
            _ => None,
        }
    }

    pub fn info(&self, head_size: Option<u64>) -> SnapSetInfo {
        SnapSetInfo {
            seq: self.seq,
            head_size,
            clones: self
                .clones
                .iter()
                .map(|c| (c.id, c.snaps.clone(), c.size))
                .collect(),
        }
    }
}

/// A writer's snapshot context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapContext {
    pub seq: u64,
    /// Existing snapshot ids, newest first.
    pub snaps: Vec<u64>,
}

impl SnapContext {
    /// Snapshot ids strictly descending, none above `seq`.
    pub fn is_valid(&self) -> bool {
        self.snaps.windows(2).all(|w| w[0] > w[1])
            && self.snaps.first().is_none_or(|&s| s <= self.seq)
    }
}

/// The head as a write or read finds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeadFacts {
    /// The head exists for clients (not absent, not a whiteout).
    pub exists: bool,
    /// A whiteout head is stored.
    pub whiteout: bool,
    /// The head's logical size (0 if it does not exist).
    pub size: u64,
    pub snapset: SnapSet,
}

/// The clone locator of `head`'s clone `clone`.
pub fn clone_locator(head: &ObjectLocator, clone: u64) -> ObjectLocator {
    ObjectLocator {
        pool: head.pool,
        namespace: format!("{CLONE_NS_PREFIX}{}", head.namespace),
        key: head.key.clone(),
        name: format!("{}{CLONE_NAME_SEP}{clone:016x}", head.name),
    }
}

pub fn is_clone_namespace(namespace: &str) -> bool {
    namespace.starts_with(CLONE_NS_PREFIX)
}

/// For a clone object's (namespace, name): the head's namespace, the head's name and the
/// clone id. `None` for anything else.
pub fn parse_clone<'a>(namespace: &'a str, name: &'a str) -> Option<(&'a str, &'a str, u64)> {
    let head_ns = namespace.strip_prefix(CLONE_NS_PREFIX)?;
    let (head, id) = name.rsplit_once(CLONE_NAME_SEP)?;
    let id = u64::from_str_radix(id, 16).ok()?;
    Some((head_ns, head, id))
}

/// The head's locator of a clone locator (the same locator for a head).
pub fn head_locator(loc: &ObjectLocator) -> ObjectLocator {
    match parse_clone(&loc.namespace, &loc.name) {
        Some((ns, name, _)) => ObjectLocator {
            pool: loc.pool,
            namespace: ns.to_string(),
            key: loc.key.clone(),
            name: name.to_string(),
        },
        None => loc.clone(),
    }
}

/// The clone objects (namespace, name) a head's stored attributes (`SNAPSET_ATTR`) list;
/// none for a clone or an object without snapshots.
pub fn listed_clones(
    namespace: &str,
    name: &str,
    xattrs: &[(String, Vec<u8>)],
) -> Vec<(String, String)> {
    if namespace.starts_with('\u{1f}') {
        return Vec::new();
    }
    let Some(ss) = xattrs
        .iter()
        .find(|(k, _)| k == SNAPSET_ATTR)
        .and_then(|(_, v)| SnapSet::decode(v))
    else {
        return Vec::new();
    };
    let head = ObjectLocator {
        pool: 0,
        namespace: namespace.to_string(),
        key: None,
        name: name.to_string(),
    };
    ss.clones
        .iter()
        .map(|c| {
            let l = clone_locator(&head, c.id);
            (l.namespace, l.name)
        })
        .collect()
}

/// Whether a write under `snapc` keeps the head as a clone first, and that clone: the head
/// exists and the context knows snapshots the head was not yet written under. The clone
/// serves the context's snapshots newer than the head's `seq` (none: no clone is needed).
pub fn clone_on_write(head: &HeadFacts, snapc: &SnapContext) -> Option<CloneInfo> {
    if !head.exists || snapc.seq <= head.snapset.seq {
        return None;
    }
    let snaps: Vec<u64> = snapc
        .snaps
        .iter()
        .copied()
        .filter(|&s| s > head.snapset.seq)
        .collect();
    if snaps.is_empty() {
        return None;
    }
    Some(CloneInfo {
        id: snapc.seq,
        snaps,
        size: head.size,
    })
}

/// Which object a read at a snapshot sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapTarget {
    Head,
    Clone(u64),
    /// The object did not exist at that snapshot (or the snapshot was removed).
    Absent,
}

/// The object serving snapshot `snap`: a removed snapshot shows nothing; a snapshot newer than
/// the head's `seq` sees the head (if it exists); otherwise the oldest clone with an id at
/// least `snap` serves it if its oldest snapshot is at most `snap`, else the object did not
/// exist then.
pub fn resolve_read(head: &HeadFacts, snap: u64, removed: &BTreeSet<u64>) -> SnapTarget {
    if removed.contains(&snap) {
        return SnapTarget::Absent;
    }
    if snap > head.snapset.seq {
        return if head.exists {
            SnapTarget::Head
        } else {
            SnapTarget::Absent
        };
    }
    match head.snapset.clones.iter().find(|c| c.id >= snap) {
        Some(c) if c.snaps.last().is_some_and(|&oldest| oldest <= snap) => SnapTarget::Clone(c.id),
        _ => SnapTarget::Absent,
    }
}

/// How the primary turns a client's write into what every member executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePlan {
    /// Before the client's ops: the clone, if the write makes one.
    pub pre: Vec<OpKind>,
    /// The client's ops, a rollback resolved (`SnapRestore`, `Remove`, or nothing).
    pub body: Vec<OpKind>,
    /// After them: the head's new snapset (`SnapSetHead`).
    pub post: Vec<OpKind>,
    pub clone: Option<CloneInfo>,
    pub snapset: SnapSet,
    /// `body` restores a clone (the erasure-coded planner is bypassed: each member copies its
    /// own shard of the clone).
    pub restores: Option<u64>,
}

impl WritePlan {
    pub fn ops(&self) -> Vec<OpKind> {
        let mut v = self.pre.clone();
        v.extend(self.body.iter().cloned());
        v.extend(self.post.iter().cloned());
        v
    }
}

/// Plans a client write on a head in a pool with snapshots: the clone (if the context is
/// newer than the head), a rollback resolved to what it restores, and the new snapset last.
/// A remove needs no change here: a head removed with clones left becomes a whiteout when
/// the members execute `SnapSetHead`.
pub fn plan_write(
    head: &HeadFacts,
    snapc: &SnapContext,
    ops: &[OpKind],
    removed: &BTreeSet<u64>,
) -> WritePlan {
    let clone = clone_on_write(head, snapc);
    let mut snapset = head.snapset.clone();
    snapset.seq = snapset.seq.max(snapc.seq);
    let mut pre = Vec::new();
    if let Some(c) = &clone {
        pre.push(OpKind::SnapClone { clone: c.id });
        snapset.clones.push(c.clone());
    }
    let mut body = Vec::new();
    let mut restores = None;
    for op in ops {
        match op {
            OpKind::Rollback { snap } => match resolve_read(head, *snap, removed) {
                SnapTarget::Head => {}
                SnapTarget::Clone(id) => {
                    body.push(OpKind::SnapRestore { clone: id });
                    restores = Some(id);
                }
                SnapTarget::Absent => {
                    if head.exists {
                        body.push(OpKind::Remove);
                    }
                }
            },
            other => body.push(other.clone()),
        }
    }
    let post = vec![OpKind::SnapSetHead {
        snapset: snapset.encode(),
    }];
    WritePlan {
        pre,
        body,
        post,
        clone,
        snapset,
        restores,
    }
}

/// What the trimmer does to one object: its new snapset and the clones to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrimPlan {
    pub snapset: SnapSet,
    /// Clones whose every snapshot was removed.
    pub delete: Vec<u64>,
}

/// Drops removed snapshots from every clone: a clone left with none is deleted, the others
/// keep the rest. `None`: nothing to trim.
pub fn plan_trim(snapset: &SnapSet, removed: &BTreeSet<u64>) -> Option<TrimPlan> {
    if !snapset
        .clones
        .iter()
        .any(|c| c.snaps.iter().any(|s| removed.contains(s)))
    {
        return None;
    }
    let mut out = SnapSet {
        seq: snapset.seq,
        clones: Vec::new(),
    };
    let mut delete = Vec::new();
    for c in &snapset.clones {
        let snaps: Vec<u64> = c
            .snaps
            .iter()
            .copied()
            .filter(|s| !removed.contains(s))
            .collect();
        if snaps.is_empty() {
            delete.push(c.id);
        } else {
            out.clones.push(CloneInfo {
                id: c.id,
                snaps,
                size: c.size,
            });
        }
    }
    Some(TrimPlan {
        snapset: out,
        delete,
    })
}

/// What becomes of a head that does not exist after a write: a whiteout if clones remain,
/// else nothing is stored.
pub fn keeps_whiteout(snapset: &SnapSet) -> bool {
    !snapset.clones.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(exists: bool, size: u64, seq: u64, clones: &[(u64, &[u64], u64)]) -> HeadFacts {
        HeadFacts {
            exists,
            whiteout: !exists && !clones.is_empty(),
            size,
            snapset: SnapSet {
                seq,
                clones: clones
                    .iter()
                    .map(|&(id, snaps, size)| CloneInfo {
                        id,
                        snaps: snaps.to_vec(),
                        size,
                    })
                    .collect(),
            },
        }
    }

    fn snapc(seq: u64, snaps: &[u64]) -> SnapContext {
        SnapContext {
            seq,
            snaps: snaps.to_vec(),
        }
    }

    #[test]
    fn contexts_are_validated() {
        assert!(snapc(0, &[]).is_valid());
        assert!(snapc(5, &[5, 3, 1]).is_valid());
        assert!(!snapc(5, &[3, 5]).is_valid());
        assert!(!snapc(5, &[3, 3]).is_valid());
        assert!(!snapc(2, &[3]).is_valid());
    }

    #[test]
    fn the_first_write_after_a_snapshot_clones_and_later_ones_do_not() {
        let h = head(true, 100, 0, &[]);
        let c = clone_on_write(&h, &snapc(2, &[2, 1])).unwrap();
        assert_eq!(
            c,
            CloneInfo {
                id: 2,
                snaps: vec![2, 1],
                size: 100
            }
        );
        // already written under seq 2: no clone
        let h2 = head(true, 50, 2, &[(2, &[2, 1], 100)]);
        assert_eq!(clone_on_write(&h2, &snapc(2, &[2, 1])), None);
        // an older context never clones
        assert_eq!(clone_on_write(&h2, &snapc(1, &[1])), None);
        // a newer one clones with only the snapshots taken since
        let c3 = clone_on_write(&h2, &snapc(4, &[4, 3, 2, 1])).unwrap();
        assert_eq!(c3.snaps, vec![4, 3]);
        // no head, nothing to keep
        assert_eq!(
            clone_on_write(&head(false, 0, 0, &[]), &snapc(3, &[3])),
            None
        );
        // a newer seq without new snapshot ids (they were all removed) needs no clone
        assert_eq!(clone_on_write(&h2, &snapc(5, &[2, 1])), None);
    }

    #[test]
    fn plan_write_orders_clone_body_and_snapset() {
        let h = head(true, 10, 1, &[]);
        let p = plan_write(
            &h,
            &snapc(3, &[3, 2]),
            &[OpKind::WriteFull { len: 4 }],
            &BTreeSet::new(),
        );
        assert_eq!(p.pre, vec![OpKind::SnapClone { clone: 3 }]);
        assert_eq!(p.body, vec![OpKind::WriteFull { len: 4 }]);
        assert_eq!(p.snapset.seq, 3);
        assert_eq!(p.snapset.clones.len(), 1);
        assert!(
            matches!(&p.post[..], [OpKind::SnapSetHead { snapset }] if SnapSet::decode(snapset) == Some(p.snapset.clone()))
        );
        assert_eq!(p.ops().len(), 3);
        // an older context leaves seq alone
        let h = head(true, 10, 5, &[]);
        let p = plan_write(&h, &snapc(3, &[3]), &[OpKind::Remove], &BTreeSet::new());
        assert!(p.pre.is_empty());
        assert_eq!(p.snapset.seq, 5);
    }

    #[test]
    fn reads_at_a_snapshot_find_the_clone_the_head_or_nothing() {
        let none = BTreeSet::new();
        // created under seq 0; snap 1; overwritten under seq 1 (clone 1); snap 2, 3; removed
        // under seq 3 (clone 3 serving 3 and 2): a whiteout
        let h = head(false, 0, 3, &[(1, &[1], 10), (3, &[3, 2], 20)]);
        assert_eq!(resolve_read(&h, 1, &none), SnapTarget::Clone(1));
        assert_eq!(resolve_read(&h, 2, &none), SnapTarget::Clone(3));
        assert_eq!(resolve_read(&h, 3, &none), SnapTarget::Clone(3));
        assert_eq!(resolve_read(&h, 4, &none), SnapTarget::Absent, "whiteout");
        // a removed snapshot shows nothing
        assert_eq!(
            resolve_read(&h, 2, &BTreeSet::from([2])),
            SnapTarget::Absent
        );
        // head unchanged since the snapshot
        let h = head(true, 5, 2, &[(2, &[2], 4)]);
        assert_eq!(resolve_read(&h, 7, &none), SnapTarget::Head);
        assert_eq!(resolve_read(&h, 2, &none), SnapTarget::Clone(2));
        // created after snapshot 1 (written first under seq 1): absent at 1
        let h = head(true, 5, 1, &[]);
        assert_eq!(resolve_read(&h, 1, &none), SnapTarget::Absent);
        // created under seq 1, snapshot 2 taken, overwritten under seq 2: clone 2 serves 2
        // only; snapshot 1 is before the object existed
        let h = head(true, 5, 2, &[(2, &[2], 4)]);
        assert_eq!(resolve_read(&h, 1, &none), SnapTarget::Absent);
    }

    #[test]
    fn rollback_resolves_to_restore_remove_or_nothing() {
        let none = BTreeSet::new();
        let h = head(true, 5, 2, &[(2, &[2], 4)]);
        let p = plan_write(&h, &snapc(2, &[2]), &[OpKind::Rollback { snap: 2 }], &none);
        assert_eq!(p.body, vec![OpKind::SnapRestore { clone: 2 }]);
        assert_eq!(p.restores, Some(2));
        // rollback to a snapshot before the object existed removes it (clones kept: whiteout)
        let p = plan_write(&h, &snapc(2, &[2]), &[OpKind::Rollback { snap: 1 }], &none);
        assert_eq!(p.body, vec![OpKind::Remove]);
        assert!(keeps_whiteout(&p.snapset));
        // unchanged since: nothing but the snapset; a newer context clones first
        let p = plan_write(
            &h,
            &snapc(3, &[3, 2]),
            &[OpKind::Rollback { snap: 3 }],
            &none,
        );
        assert!(p.body.is_empty());
        assert_eq!(p.pre, vec![OpKind::SnapClone { clone: 3 }]);
    }

    #[test]
    fn trimming_drops_removed_snapshots_and_deletes_empty_clones() {
        let ss = head(
            false,
            0,
            4,
            &[(1, &[1], 10), (3, &[3, 2], 20), (4, &[4], 30)],
        )
        .snapset;
        assert_eq!(plan_trim(&ss, &BTreeSet::from([9])), None);
        let t = plan_trim(&ss, &BTreeSet::from([1, 2])).unwrap();
        assert_eq!(t.delete, vec![1]);
        assert_eq!(
            t.snapset.clones,
            vec![
                CloneInfo {
                    id: 3,
                    snaps: vec![3],
                    size: 20
                },
                CloneInfo {
                    id: 4,
                    snaps: vec![4],
                    size: 30
                }
            ]
        );
        assert_eq!(t.snapset.seq, 4, "seq never goes back");
        // everything removed: no clones left, a whiteout head goes too
        let t = plan_trim(&ss, &BTreeSet::from([1, 2, 3, 4])).unwrap();
        assert_eq!(t.delete, vec![1, 3, 4]);
        assert!(!keeps_whiteout(&t.snapset));
        // trimming is idempotent: the trimmed set has nothing more to trim
        assert_eq!(plan_trim(&t.snapset, &BTreeSet::from([1, 2, 3, 4])), None);
    }

    #[test]
    fn clone_names_round_trip_and_keep_the_head() {
        let head = ObjectLocator {
            pool: 3,
            namespace: "ns".into(),
            key: None,
            name: "a\u{1f}b".into(),
        };
        let c = clone_locator(&head, 0x2a);
        assert!(is_clone_namespace(&c.namespace));
        assert_eq!(
            parse_clone(&c.namespace, &c.name),
            Some(("ns", "a\u{1f}b", 0x2a))
        );
        assert_eq!(head_locator(&c), head);
        assert_eq!(head_locator(&head), head);
        assert_eq!(parse_clone("ns", "x"), None);
        let ss = SnapSet {
            seq: 7,
            clones: vec![CloneInfo {
                id: 7,
                snaps: vec![7, 6],
                size: 1,
            }],
        };
        assert_eq!(SnapSet::decode(&ss.encode()), Some(ss));
        assert_eq!(SnapSet::decode(&[9, 0]), None);
    }
}

//! What members execute for self-managed snapshots, against the in-memory store: the primary's
//! plan (`snapset::plan_write`) run through `execute` keeps clones, whiteouts and snapsets as
//! the model says, and the head's stored snapshot state (`snaps`-style reads of `@ss`/`@wo`)
//! follows.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;

use bytes::Bytes;
use kelp_osd::snapset::{self, HeadFacts, SnapContext, SnapSet};
use kelp_osd::{Limits, PgMeta, Stamp, execute, object_id};
use kelp_proto::{ObjectLocator, OpKind};
use kelp_store::{CollectionId, MemStore, ObjectStore, Transaction};

fn setup() -> (MemStore, CollectionId) {
    let store = MemStore::new();
    let coll = CollectionId::new(1, 0);
    let mut txn = Transaction::new();
    PgMeta::create(&mut txn, coll, 100);
    store.submit(txn).unwrap().wait().unwrap();
    (store, coll)
}

fn head() -> ObjectLocator {
    ObjectLocator {
        pool: 1,
        namespace: String::new(),
        key: None,
        name: "obj".into(),
    }
}

/// The head's facts as the primary reads them.
fn facts(store: &MemStore, coll: CollectionId) -> HeadFacts {
    let oid = object_id(&head());
    let Ok(attrs) = store.xattrs(coll, &oid) else {
        return HeadFacts::default();
    };
    let whiteout = attrs.contains_key(snapset::WHITEOUT_ATTR);
    HeadFacts {
        exists: !whiteout,
        whiteout,
        size: if whiteout {
            0
        } else {
            store.stat(coll, &oid).unwrap().size
        },
        snapset: attrs
            .get(snapset::SNAPSET_ATTR)
            .map(|b| SnapSet::decode(b).unwrap())
            .unwrap_or_default(),
    }
}

/// Plans a client write as the primary does and executes it as every member does.
fn write(
    store: &MemStore,
    coll: CollectionId,
    snapc: (u64, &[u64]),
    ops: &[OpKind],
    data: &[u8],
    v: u64,
) -> kelp_osd::Executed {
    let plan = snapset::plan_write(
        &facts(store, coll),
        &SnapContext {
            seq: snapc.0,
            snaps: snapc.1.to_vec(),
        },
        ops,
        &BTreeSet::new(),
    );
    let mut done = execute(
        store,
        coll,
        &head(),
        &plan.ops(),
        &Bytes::copy_from_slice(data),
        Stamp {
            version: v,
            mtime_ns: v,
        },
        &Limits::default(),
    )
    .unwrap();
    store
        .submit(std::mem::take(&mut done.txn))
        .unwrap()
        .wait()
        .unwrap();
    done
}

fn read(store: &MemStore, coll: CollectionId, loc: &ObjectLocator) -> Option<Vec<u8>> {
    let oid = object_id(loc);
    let st = store.stat(coll, &oid).ok()?;
    Some(store.read(coll, &oid, 0, st.size).unwrap().to_vec())
}

#[test]
fn clone_whiteout_recreate_and_trim_in_the_store() {
    let (store, coll) = setup();
    let wf = |len: usize| OpKind::WriteFull { len: len as u64 };
    let done = write(&store, coll, (0, &[]), &[wf(3)], b"one", 1);
    assert_eq!(done.stat_delta.objects, 1);
    // snapshot 1 taken: the next write keeps "one" as clone 1, in the head's PG
    let done = write(&store, coll, (1, &[1]), &[wf(3)], b"two", 2);
    assert_eq!((done.stat_delta.objects, done.stat_delta.bytes), (1, 3));
    let c1 = snapset::clone_locator(&head(), 1);
    assert_eq!(object_id(&c1).hash, object_id(&head()).hash);
    assert_eq!(read(&store, coll, &c1).unwrap(), b"one");
    assert_eq!(read(&store, coll, &head()).unwrap(), b"two");
    let f = facts(&store, coll);
    assert_eq!(f.snapset.seq, 1);
    assert_eq!(f.snapset.clones.len(), 1);
    // a second write under the same context makes no clone
    write(&store, coll, (1, &[1]), &[wf(5)], b"three", 3);
    assert_eq!(facts(&store, coll).snapset.clones.len(), 1);
    // removed under snapshot 2: clone 2 keeps "three", the head is a whiteout
    let done = write(&store, coll, (2, &[2, 1]), &[OpKind::Remove], b"", 4);
    assert!(!done.exists_after && done.whiteout_after);
    assert_eq!(
        done.stat_delta.objects, 1,
        "clone 2 in, head stays as a whiteout"
    );
    let f = facts(&store, coll);
    assert!(f.whiteout && !f.exists);
    assert_eq!(
        read(&store, coll, &snapset::clone_locator(&head(), 2)).unwrap(),
        b"three"
    );
    // written again: re-created over the whiteout, no clone (nothing existed to keep)
    let done = write(
        &store,
        coll,
        (2, &[2, 1]),
        &[OpKind::Create { exclusive: true }],
        b"",
        5,
    );
    assert!(done.exists_after);
    let f = facts(&store, coll);
    assert!(f.exists && !f.whiteout);
    assert_eq!(f.snapset.clones.len(), 2);
    // rollback to snapshot 1 restores "one"
    write(
        &store,
        coll,
        (2, &[2, 1]),
        &[OpKind::Rollback { snap: 1 }],
        b"",
        6,
    );
    assert_eq!(read(&store, coll, &head()).unwrap(), b"one");
    assert_eq!(facts(&store, coll).snapset.clones.len(), 2);
    // removed again with clones left: whiteout; trimming every snapshot drops the clones
    // from the snapset, and the whiteout with them
    write(&store, coll, (2, &[2, 1]), &[OpKind::Remove], b"", 7);
    let trim = snapset::plan_trim(&facts(&store, coll).snapset, &BTreeSet::from([1, 2])).unwrap();
    assert_eq!(trim.delete, vec![1, 2]);
    let mut done = execute(
        &store,
        coll,
        &head(),
        &[OpKind::SnapSetHead {
            snapset: trim.snapset.encode(),
        }],
        &Bytes::new(),
        Stamp {
            version: 8,
            mtime_ns: 8,
        },
        &Limits::default(),
    )
    .unwrap();
    assert!(!done.exists_after && !done.whiteout_after);
    store
        .submit(std::mem::take(&mut done.txn))
        .unwrap()
        .wait()
        .unwrap();
    assert!(
        store.stat(coll, &object_id(&head())).is_err(),
        "whiteout gone"
    );
}

#[test]
fn a_clone_is_an_ordinary_object_and_snapshot_modifiers_never_reach_members() {
    let (store, coll) = setup();
    // a clone locator is a valid object for the members (the trimmer removes clones)
    let c = snapset::clone_locator(&head(), 3);
    let r = execute(
        &store,
        coll,
        &c,
        &[OpKind::Remove],
        &Bytes::new(),
        Stamp {
            version: 1,
            mtime_ns: 1,
        },
        &Limits::default(),
    );
    assert_eq!(r.unwrap_err().code, kelp_proto::ErrorCode::NotFound);
    // snapshot modifiers never reach a member
    let r = execute(
        &store,
        coll,
        &head(),
        &[OpKind::Rollback { snap: 1 }],
        &Bytes::new(),
        Stamp {
            version: 1,
            mtime_ns: 1,
        },
        &Limits::default(),
    );
    assert_eq!(r.unwrap_err().code, kelp_proto::ErrorCode::Invalid);
}

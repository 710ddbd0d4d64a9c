//! One conformance suite, run against both implementations of `ObjectStore`: every `check_*`
//! function is generic over the store and is instantiated for `MemStore` and for `KelpStore`
//! (twice: default configuration, and with small whole-unit writes not deferred, so both write
//! paths are covered) by the `conformance!` macro at the bottom. Runs in a few seconds in debug
//! builds.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;

use bytes::Bytes;
use kelp_store::workload::{self, Rng, test_hash};
use kelp_store::{
    CollectionId, KelpStore, MemStore, MkfsOptions, ObjectId, ObjectStore, StoreConfig, StoreError,
    Transaction,
};

const C: CollectionId = workload::CRASH_COLLS[0];
const D: CollectionId = workload::CRASH_COLLS[1];

fn oid(name: &str) -> ObjectId {
    ObjectId::new(1, "", name, test_hash(name))
}

fn run(s: &dyn ObjectStore, t: &mut Transaction) -> Result<(), StoreError> {
    let txn = std::mem::take(t);
    s.submit(txn)?.wait()
}

fn with_coll(s: &dyn ObjectStore, c: CollectionId) {
    run(s, Transaction::new().create_collection(c)).unwrap();
}

fn check_collections(s: &dyn ObjectStore) {
    assert!(s.list_collections().unwrap().is_empty());
    with_coll(s, D);
    with_coll(s, C);
    assert_eq!(s.list_collections().unwrap(), vec![C, D]);
    assert!(matches!(
        run(s, Transaction::new().create_collection(C)),
        Err(StoreError::CollectionExists { .. })
    ));
    run(s, Transaction::new().touch(C, &oid("x"))).unwrap();
    assert!(matches!(
        run(s, Transaction::new().remove_collection(C)),
        Err(StoreError::CollectionNotEmpty { .. })
    ));
    run(
        s,
        Transaction::new().remove(C, &oid("x")).remove_collection(C),
    )
    .unwrap();
    assert_eq!(s.list_collections().unwrap(), vec![D]);
    assert!(!s.collection_exists(C).unwrap());
    assert!(matches!(
        s.stat(C, &oid("x")),
        Err(StoreError::CollectionNotFound { .. })
    ));
    assert!(matches!(
        run(s, Transaction::new().touch(C, &oid("x"))),
        Err(StoreError::CollectionNotFound { .. })
    ));
}

/// Random writes/zeros/truncates against a byte-vector model, checking every read.
fn check_data_ops(s: &dyn ObjectStore) {
    with_coll(s, C);
    let o = oid("data");
    run(s, Transaction::new().touch(C, &o)).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut r = Rng::new(7);
    for step in 0..300 {
        let mut t = Transaction::new();
        match r.below(5) {
            0 | 1 => {
                let off = r.below(70_000);
                let len = match r.below(3) {
                    0 => 1 + r.below(50),
                    1 => 4096 * (1 + r.below(4)),
                    _ => 1 + r.below(20_000),
                };
                let data = r.bytes(len as usize);
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
                t.write(C, &o, off, data);
            }
            2 => {
                let off = r.below(70_000);
                let len = r.below(20_000);
                let end = (off + len) as usize;
                if len > 0 {
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].fill(0);
                }
                t.zero(C, &o, off, len);
            }
            3 => {
                let size = r.below(80_000);
                model.resize(size as usize, 0);
                t.truncate(C, &o, size);
            }
            _ => {
                let off = r.below(90_000);
                let len = r.below(30_000);
                let got = s.read(C, &o, off, len).unwrap();
                let a = (off as usize).min(model.len());
                let b = ((off + len) as usize).min(model.len());
                assert_eq!(got, model[a..b], "step {step}: read {off}+{len}");
                continue;
            }
        }
        run(s, &mut t).unwrap();
        assert_eq!(
            s.stat(C, &o).unwrap().size,
            model.len() as u64,
            "step {step}"
        );
    }
    assert_eq!(s.read(C, &o, 0, u64::MAX).unwrap(), model);
    assert!(
        s.read(C, &o, model.len() as u64 + 10, 10)
            .unwrap()
            .is_empty()
    );
}

/// `read_bytes` returns what `read` does, for large reads inside one extent (which the durable
/// store lends out of its read buffers), across extents and holes, and past the end; a lent
/// buffer stays intact while later reads and writes reuse the store's buffers.
fn check_read_bytes(s: &dyn ObjectStore) {
    with_coll(s, C);
    let o = oid("big");
    let mut r = Rng::new(11);
    let mut model = r.bytes(1 << 20);
    run(s, Transaction::new().write(C, &o, 0, model.clone())).unwrap();
    let ranges: [(u64, u64); 7] = [
        (0, 1 << 20),
        (0, u64::MAX),
        (4096, 65536),
        (1000, 200_000),
        ((1 << 20) - 70_000, 100_000),
        (5, 10),
        ((1 << 20) + 5, 10),
    ];
    let check = |s: &dyn ObjectStore, model: &[u8], what: &str| {
        for (off, len) in ranges {
            let a = (off as usize).min(model.len());
            let b = (off.saturating_add(len) as usize).min(model.len());
            let got = s.read_bytes(C, &o, off, len).unwrap();
            assert_eq!(&got[..], &model[a..b], "{what}: read_bytes {off}+{len}");
            assert_eq!(
                s.read(C, &o, off, len).unwrap(),
                &model[a..b],
                "{what}: read"
            );
        }
    };
    check(s, &model, "one extent");
    // Lend more buffers than the pool keeps, then read and write meanwhile.
    let lent: Vec<_> = (0..10u64)
        .map(|i| s.read_bytes(C, &o, i * 65536, 128 << 10).unwrap())
        .collect();
    let patch = r.bytes(8192);
    model[300_000..308_192].copy_from_slice(&patch);
    run(s, Transaction::new().write(C, &o, 300_000, patch)).unwrap();
    check(s, &model, "after a patch");
    run(s, Transaction::new().zero(C, &o, 600_000, 100_000)).unwrap();
    model[600_000..700_000].fill(0);
    check(s, &model, "after a zero");
    let first = Rng::new(11).bytes(1 << 20);
    for (i, b) in lent.iter().enumerate() {
        let at = i * 65536;
        assert_eq!(
            &b[..],
            &first[at..at + (128 << 10)],
            "lent buffer {i} changed"
        );
    }
}

/// `len` bytes of `data` in a buffer whose start is 4 KiB-aligned (plus `skew` bytes), as
/// the messenger hands large payloads to the OSD.
fn aligned_payload(data: &[u8], skew: usize) -> Bytes {
    let mut v = vec![0u8; data.len() + 8192 + skew];
    let at = v.as_ptr().align_offset(4096) + skew;
    v[at..at + data.len()].copy_from_slice(data);
    Bytes::from(v).slice(at..at + data.len())
}

/// Large writes from aligned buffers are written straight from them (no bounce copy); from
/// misaligned ones, through a copy. Both must store exactly the payload, leave the caller's
/// buffer untouched, and mix with partial-unit and deferred writes.
fn check_aligned_payloads(s: &dyn ObjectStore) {
    with_coll(s, C);
    let mut r = Rng::new(23);
    let mut objects: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let cases: [(&str, u64, usize, usize); 6] = [
        ("whole", 0, 1 << 20, 0),
        ("tail", 0, (256 << 10) + 1000, 0),
        ("at-offset", 8192, 64 << 10, 0),
        ("skewed", 0, 512 << 10, 100),
        ("unit-offset-unaligned-len", 4096, 300_000, 0),
        ("small", 0, 4096, 0),
    ];
    let mut t = Transaction::new();
    let mut payloads = Vec::new();
    for (name, off, len, skew) in cases {
        let data = r.bytes(len);
        let p = aligned_payload(&data, skew);
        assert_eq!(p.as_ptr().align_offset(4096), (4096 - skew) % 4096);
        t.write(C, &oid(name), off, p.clone());
        let mut m = vec![0u8; off as usize];
        m.extend_from_slice(&data);
        objects.insert(name.to_string(), m);
        payloads.push((p, data));
    }
    run(s, &mut t).unwrap();
    // Overwrite the middle of the whole object from an aligned buffer, in place of old units.
    let patch = r.bytes(128 << 10);
    run(
        s,
        Transaction::new().write(C, &oid("whole"), 64 << 10, aligned_payload(&patch, 0)),
    )
    .unwrap();
    objects.get_mut("whole").unwrap()[64 << 10..192 << 10].copy_from_slice(&patch);
    for (p, data) in &payloads {
        assert_eq!(&p[..], &data[..], "the caller's buffer changed");
    }
    for (name, m) in &objects {
        assert_eq!(
            s.stat(C, &oid(name)).unwrap().size,
            m.len() as u64,
            "{name}"
        );
        assert_eq!(&s.read(C, &oid(name), 0, u64::MAX).unwrap(), m, "{name}");
    }
}

fn check_ordering_and_listing(s: &dyn ObjectStore) {
    with_coll(s, C);
    let mut all: Vec<ObjectId> = (0..50)
        .map(|i| {
            let mut o = oid(&format!("o{i}"));
            if i % 5 == 0 {
                o.namespace = "ns".into();
            }
            if i % 7 == 0 {
                o = o.with_snap(3);
            }
            o
        })
        .collect();
    let mut t = Transaction::new();
    for o in &all {
        t.touch(C, o);
    }
    run(s, &mut t).unwrap();
    all.sort();
    // Ordered by placement hash first.
    assert!(all.windows(2).all(|w| w[0].hash <= w[1].hash));
    let page = s.list_objects(C, None, 1000).unwrap();
    assert_eq!(page.objects, all);
    assert_eq!(page.next, None);
    // Paging from a position.
    let mut got = Vec::new();
    let mut pos = None;
    loop {
        let p = s.list_objects(C, pos.as_ref(), 7).unwrap();
        assert!(p.objects.len() <= 7);
        got.extend(p.objects);
        match p.next {
            Some(n) => pos = Some(n),
            None => break,
        }
    }
    assert_eq!(got, all);
    // Start at an arbitrary position (inclusive), and at a hash boundary.
    let p = s.list_objects(C, Some(&all[20]), 5).unwrap();
    assert_eq!(p.objects, all[20..25].to_vec());
    assert_eq!(p.next.as_ref(), Some(&all[25]));
    let mid = ObjectId::hash_start(all[30].hash);
    let p = s.list_objects(C, Some(&mid), 1).unwrap();
    assert_eq!(p.objects[0].hash, all[30].hash);
    assert!(s.list_objects(C, None, 0).unwrap().objects.is_empty());
}

fn check_atomicity(s: &dyn ObjectStore) {
    with_coll(s, C);
    run(
        s,
        Transaction::new().write(C, &oid("a"), 0, vec![1; 10_000]),
    )
    .unwrap();
    let before = workload::dump(s).unwrap();
    // Every op valid except the last: nothing may be applied.
    let mut t = Transaction::new();
    t.write(C, &oid("a"), 100, vec![2; 9000])
        .truncate(C, &oid("a"), 5)
        .write(C, &oid("b"), 0, vec![3; 100_000])
        .set_xattr(C, &oid("b"), "x", b"y".to_vec())
        .omap_set(
            C,
            &oid("b"),
            BTreeMap::from([(b"k".to_vec(), b"v".to_vec())]),
        )
        .create_collection(D)
        .remove(C, &oid("missing"));
    assert!(matches!(
        run(s, &mut t),
        Err(StoreError::ObjectNotFound { .. })
    ));
    assert_eq!(workload::dump(s).unwrap(), before);
    assert!(!s.collection_exists(D).unwrap());
    // Ops on a missing object that require it.
    assert!(matches!(
        run(
            s,
            Transaction::new().set_xattr(C, &oid("nope"), "x", vec![])
        ),
        Err(StoreError::ObjectNotFound { .. })
    ));
    assert_eq!(workload::dump(s).unwrap(), before);
}

fn check_submission_order(s: &dyn ObjectStore) {
    with_coll(s, C);
    let o = oid("ord");
    // Many transactions in flight: applied in submission order, all commit.
    let mut commits = Vec::new();
    for i in 0..200u32 {
        let mut t = Transaction::new();
        t.write(C, &o, 0, i.to_le_bytes().to_vec())
            .set_xattr(C, &o, "i", i.to_le_bytes().to_vec());
        if i % 10 == 0 {
            t.truncate(C, &o, 4);
        }
        commits.push(s.submit(t).unwrap());
        // Readable as soon as submitted.
        assert_eq!(s.read(C, &o, 0, 4).unwrap(), i.to_le_bytes());
    }
    for c in commits {
        c.wait().unwrap();
    }
    s.flush().unwrap();
    assert_eq!(s.read(C, &o, 0, 4).unwrap(), 199u32.to_le_bytes());
    assert_eq!(s.xattr(C, &o, "i").unwrap().unwrap(), 199u32.to_le_bytes());
}

fn check_xattrs_and_omap(s: &dyn ObjectStore) {
    with_coll(s, C);
    let o = oid("om");
    run(s, Transaction::new().touch(C, &o)).unwrap();
    assert!(s.xattrs(C, &o).unwrap().is_empty());
    assert_eq!(s.omap_header(C, &o).unwrap(), None);
    run(
        s,
        Transaction::new()
            .set_xattr(C, &o, "a", b"1".to_vec())
            .set_xattr(C, &o, "b", b"2".to_vec())
            .rm_xattr(C, &o, "a")
            .rm_xattr(C, &o, "never"),
    )
    .unwrap();
    assert_eq!(
        s.xattrs(C, &o).unwrap(),
        BTreeMap::from([("b".to_string(), b"2".to_vec())])
    );
    // Keys chosen so that byte order differs from insertion order, including prefixes.
    let keys: Vec<Vec<u8>> = vec![
        b"b".to_vec(),
        b"a".to_vec(),
        b"ab".to_vec(),
        vec![0],
        vec![0xff, 1],
        b"a\0".to_vec(),
        Vec::new(),
    ];
    let mut m = BTreeMap::new();
    for (i, k) in keys.iter().enumerate() {
        m.insert(k.clone(), vec![i as u8; i]);
    }
    for i in 0..40u8 {
        m.insert(format!("key{i:02}").into_bytes(), vec![i]);
    }
    run(
        s,
        Transaction::new()
            .omap_set(C, &o, m.clone())
            .omap_set_header(C, &o, b"hdr".to_vec()),
    )
    .unwrap();
    assert_eq!(s.omap_header(C, &o).unwrap(), Some(b"hdr".to_vec()));
    let want: Vec<(Vec<u8>, Vec<u8>)> = m.clone().into_iter().collect();
    let all = s.omap_iter(C, &o, None, 1000).unwrap();
    assert_eq!(all.entries, want);
    assert!(!all.more);
    // Paging, each page strictly after the previous last key.
    for page_size in [1, 3, 10] {
        let mut got = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let p = s.omap_iter(C, &o, after.as_deref(), page_size).unwrap();
            assert!(p.entries.len() <= page_size);
            after = p.entries.last().map(|e| e.0.clone());
            got.extend(p.entries);
            if !p.more {
                break;
            }
        }
        assert_eq!(got, want, "page size {page_size}");
    }
    let empty_page = s.omap_iter(C, &o, None, 0).unwrap();
    assert!(empty_page.entries.is_empty() && empty_page.more);
    // "after" a key that does not exist.
    let p = s.omap_iter(C, &o, Some(b"aa"), 2).unwrap();
    assert_eq!(p.entries[0].0, b"ab".to_vec());
    let got = s
        .omap_get(C, &o, &[b"a".to_vec(), b"zz".to_vec(), Vec::new()])
        .unwrap();
    assert_eq!(got.len(), 2);
    run(
        s,
        Transaction::new().omap_remove(C, &o, vec![b"a".to_vec(), b"nope".to_vec()]),
    )
    .unwrap();
    assert_eq!(
        s.omap_iter(C, &o, None, 1000).unwrap().entries.len(),
        want.len() - 1
    );
    run(s, Transaction::new().omap_clear(C, &o)).unwrap();
    assert!(s.omap_iter(C, &o, None, 1000).unwrap().entries.is_empty());
    assert_eq!(s.omap_header(C, &o).unwrap(), None);
    // Remove with omap, recreate: nothing resurfaces.
    run(s, Transaction::new().omap_set(C, &o, m)).unwrap();
    run(s, Transaction::new().remove(C, &o).touch(C, &o)).unwrap();
    assert!(s.omap_iter(C, &o, None, 1000).unwrap().entries.is_empty());
    assert!(s.xattrs(C, &o).unwrap().is_empty());
}

fn check_clone(s: &dyn ObjectStore) {
    with_coll(s, C);
    let (a, b) = (oid("src"), oid("dst").with_snap(4));
    let mut r = Rng::new(3);
    let data = r.bytes(50_000);
    run(
        s,
        Transaction::new()
            .write(C, &a, 0, data.clone())
            .zero(C, &a, 8192, 8192)
            .set_xattr(C, &a, "x", b"1".to_vec())
            .omap_set(C, &a, BTreeMap::from([(b"k".to_vec(), b"v".to_vec())]))
            .omap_set_header(C, &a, b"h".to_vec())
            .write(C, &b, 0, vec![9; 100_000])
            .clone_object(C, &a, &b),
    )
    .unwrap();
    let mut expect = data.clone();
    expect[8192..16384].fill(0);
    assert_eq!(s.read(C, &b, 0, u64::MAX).unwrap(), expect);
    assert_eq!(s.xattrs(C, &b).unwrap(), s.xattrs(C, &a).unwrap());
    assert_eq!(s.omap_header(C, &b).unwrap(), Some(b"h".to_vec()));
    // Independent afterwards.
    run(
        s,
        Transaction::new()
            .write(C, &a, 0, vec![7; 5000])
            .omap_clear(C, &a)
            .truncate(C, &b, 100),
    )
    .unwrap();
    assert_eq!(s.read(C, &b, 0, u64::MAX).unwrap(), expect[..100].to_vec());
    assert_eq!(
        s.omap_iter(C, &b, None, 10).unwrap().entries,
        vec![(b"k".to_vec(), b"v".to_vec())]
    );
    assert_eq!(s.read(C, &a, 0, 5000).unwrap(), vec![7; 5000]);
}

/// Objects around the inline-data threshold of `KelpStore` (2 KiB by default): every step is
/// applied to a plain byte vector too and the object is read back whole and in pieces.
/// Covers writes at offsets, overwrites, zeroing, growing past the threshold (into extents)
/// and truncating back under it, clones both ways between small and large objects, and
/// removal and re-creation.
fn check_small_objects(s: &dyn ObjectStore) {
    with_coll(s, C);
    let (a, b) = (oid("small-a"), oid("small-b"));
    let mut r = Rng::new(27);
    let mut ma: Vec<u8> = Vec::new();
    let check = |o: &ObjectId, m: &[u8], step: &str| {
        assert_eq!(s.stat(C, o).unwrap().size, m.len() as u64, "{step}: size");
        assert_eq!(s.read(C, o, 0, u64::MAX).unwrap(), m, "{step}: data");
        for (off, len) in [(0, 1), (1, 700), (1000, 2000), (2047, 2), (4000, 200)] {
            let want = m
                .get(off.min(m.len())..(off + len).min(m.len()))
                .unwrap_or(&[]);
            assert_eq!(
                s.read(C, o, off as u64, len as u64).unwrap(),
                want,
                "{step}: {off}+{len}"
            );
            assert_eq!(
                &s.read_bytes(C, o, off as u64, len as u64).unwrap()[..],
                want,
                "{step}: read_bytes {off}+{len}"
            );
        }
    };
    let write = |m: &mut Vec<u8>, off: usize, d: &[u8]| {
        if m.len() < off + d.len() {
            m.resize(off + d.len(), 0);
        }
        m[off..off + d.len()].copy_from_slice(d);
    };
    // Steps: (what, offset, length) for writes, zeroing and truncation.
    enum Step {
        Write(usize, usize),
        Zero(usize, usize),
        Truncate(usize),
    }
    use Step::*;
    let steps = [
        Write(0, 1000),
        Write(300, 100),
        Write(1500, 500), // a hole between 1000 and 1500
        Zero(200, 50),
        Zero(1900, 300), // zeroing extends the object
        Truncate(2048),
        Write(2047, 1), // exactly at the threshold
        Truncate(3000), // past it: into extents
        Truncate(1200), // back under it
        Write(100, 20),
        Write(1000, 3000), // grows past the threshold by a write
        Write(4096, 4096),
        Truncate(10), // back again, from two units
        Truncate(0),
        Write(5000, 100), // a new small-offset write beyond the threshold: a hole then data
        Truncate(64),
        Write(0, 2048),
        Truncate(2049),
        Zero(0, 5000),
        Truncate(30),
    ];
    for (i, step) in steps.iter().enumerate() {
        let mut t = Transaction::new();
        match *step {
            Write(off, len) => {
                let d = r.bytes(len);
                write(&mut ma, off, &d);
                t.write(C, &a, off as u64, d);
            }
            Zero(off, len) => {
                let end = off + len;
                let zero_end = end.min(ma.len());
                if off < zero_end {
                    ma[off..zero_end].fill(0);
                }
                ma.resize(ma.len().max(end), 0);
                t.zero(C, &a, off as u64, len as u64);
            }
            Truncate(n) => {
                ma.resize(n, 0);
                t.truncate(C, &a, n as u64);
            }
        }
        run(s, &mut t).unwrap();
        check(&a, &ma, &format!("step {i}"));
    }
    // Clones: small onto large, then large onto small; independent afterwards.
    run(s, Transaction::new().write(C, &b, 0, vec![5; 20_000])).unwrap();
    run(s, Transaction::new().clone_object(C, &a, &b)).unwrap();
    let mut mb = ma.clone();
    check(&b, &mb, "clone small onto large");
    run(s, Transaction::new().write(C, &b, 3, b"xyz".to_vec())).unwrap();
    write(&mut mb, 3, b"xyz");
    check(&b, &mb, "clone written");
    check(&a, &ma, "source untouched");
    let big = r.bytes(9000);
    run(s, Transaction::new().write(C, &b, 0, big.clone())).unwrap();
    run(s, Transaction::new().clone_object(C, &b, &a)).unwrap();
    check(&a, &big, "clone large onto small");
    run(s, Transaction::new().truncate(C, &a, 700)).unwrap();
    check(&a, &big[..700], "clone truncated under the threshold");
    check(&b, &big, "clone source untouched");
    // Many small objects in one transaction, with xattrs; removal and re-creation.
    let mut t = Transaction::new();
    let mut want = Vec::new();
    for i in 0..40u64 {
        let o = oid(&format!("tiny{i}"));
        let d = r.bytes(1 + (i as usize * 53) % 2100);
        t.write(C, &o, 0, d.clone())
            .set_xattr(C, &o, "v", i.to_le_bytes().to_vec());
        want.push((o, d));
    }
    run(s, &mut t).unwrap();
    for (o, d) in &want {
        check(o, d, "tiny");
    }
    let mut t = Transaction::new();
    for (o, _) in want.iter().step_by(2) {
        t.remove(C, o);
    }
    run(s, &mut t).unwrap();
    for (i, (o, d)) in want.iter().enumerate() {
        assert_eq!(s.exists(C, o).unwrap(), i % 2 == 1);
        if i % 2 == 1 {
            check(o, d, "tiny after removals");
        }
    }
    run(
        s,
        Transaction::new().write(C, &want[0].0, 10, b"again".to_vec()),
    )
    .unwrap();
    let mut again = vec![0u8; 10];
    again.extend_from_slice(b"again");
    check(&want[0].0, &again, "re-created");
}

fn check_split(s: &dyn ObjectStore) {
    with_coll(s, C);
    with_coll(s, D);
    let objs: Vec<ObjectId> = (0..64).map(|i| oid(&format!("s{i}"))).collect();
    let mut t = Transaction::new();
    for (i, o) in objs.iter().enumerate() {
        t.write(C, o, 0, vec![i as u8; 100]).omap_set(
            C,
            o,
            BTreeMap::from([(b"i".to_vec(), vec![i as u8])]),
        );
    }
    run(s, &mut t).unwrap();
    // pg_num 1 -> 2: objects with hash bit 0 set move to D (seed 1).
    run(s, Transaction::new().split_collection(C, D, 1, 1)).unwrap();
    let left = s.list_objects(C, None, 1000).unwrap().objects;
    let right = s.list_objects(D, None, 1000).unwrap().objects;
    assert_eq!(left.len() + right.len(), 64);
    assert!(!left.is_empty() && !right.is_empty());
    assert!(left.iter().all(|o| o.hash & 1 == 0));
    assert!(right.iter().all(|o| o.hash & 1 == 1));
    for (i, o) in objs.iter().enumerate() {
        let c = if o.hash & 1 == 1 { D } else { C };
        assert_eq!(s.read(c, o, 0, 100).unwrap(), vec![i as u8; 100]);
        assert_eq!(
            s.omap_get(c, o, &[b"i".to_vec()]).unwrap()[&b"i".to_vec()],
            vec![i as u8]
        );
    }
    assert!(matches!(
        run(s, Transaction::new().split_collection(C, C, 1, 1)),
        Err(StoreError::InvalidArgument { .. })
    ));
}

/// The crash workload applied to the store and to a MemStore model must agree.
fn check_against_model(s: &dyn ObjectStore) {
    let model = MemStore::new();
    run(s, &mut workload::crash_setup()).unwrap();
    run(&model, &mut workload::crash_setup()).unwrap();
    let mut commits = Vec::new();
    for id in 1..=300 {
        commits.push(s.submit(workload::crash_txn(11, id)).unwrap());
        model
            .submit(workload::crash_txn(11, id))
            .unwrap()
            .wait()
            .unwrap();
        if id % 50 == 0 {
            assert_eq!(
                workload::dump(s).unwrap(),
                workload::dump(&model).unwrap(),
                "after {id}"
            );
        }
    }
    for c in commits {
        c.wait().unwrap();
    }
    assert_eq!(workload::crash_applied_id(s).unwrap(), 300);
}

fn check_async_commit(s: &dyn ObjectStore) {
    with_coll(s, C);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let c1 = s
            .submit(
                Transaction::new()
                    .write(C, &oid("z"), 0, vec![1; 10])
                    .clone(),
            )
            .unwrap();
        let c2 = s
            .submit(
                Transaction::new()
                    .write(C, &oid("z"), 5, vec![2; 10])
                    .clone(),
            )
            .unwrap();
        c2.await.unwrap();
        c1.await.unwrap();
    });
    let mut want = vec![1u8; 5];
    want.extend([2u8; 10]);
    assert_eq!(s.read(C, &oid("z"), 0, 100).unwrap(), want);
}

/// Usage follows the data written and removed (freed space returns once the removal is
/// durable, so poll briefly).
fn check_space(s: &dyn ObjectStore) {
    with_coll(s, C);
    let empty = s.space().unwrap();
    assert!(empty.total > 0);
    assert_eq!(empty.used + empty.available, empty.total);
    run(
        s,
        Transaction::new().write(C, &oid("big"), 0, vec![7u8; 1 << 20]),
    )
    .unwrap();
    let full = s.space().unwrap();
    assert!(full.used >= empty.used + (1 << 20), "{empty:?} -> {full:?}");
    assert_eq!(full.used + full.available, full.total);
    run(s, Transaction::new().remove(C, &oid("big"))).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.space().unwrap().used > empty.used && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(s.space().unwrap().used, empty.used);
}

/// A store filled until it refuses data still commits deletes (metadata-only transactions)
/// and then takes data again.
fn check_full_then_delete(s: &dyn ObjectStore) {
    with_coll(s, C);
    let mut written = Vec::new();
    let refused = loop {
        let name = format!("fill{}", written.len());
        match run(
            s,
            Transaction::new().write(C, &oid(&name), 0, vec![1u8; 1 << 20]),
        ) {
            Ok(()) => written.push(name),
            Err(e) => break e,
        }
        assert!(written.len() < 1000, "the store never filled");
    };
    assert!(matches!(refused, StoreError::NoSpace { .. }), "{refused:?}");
    assert!(s.space().unwrap().available < 1 << 20);
    // Everything written reads back.
    for n in &written {
        assert_eq!(s.read(C, &oid(n), 0, 1 << 20).unwrap(), vec![1u8; 1 << 20]);
    }
    for n in written.iter().take(3) {
        run(
            s,
            Transaction::new()
                .remove(C, &oid(n))
                .touch(C, &oid("log"))
                .set_xattr(C, &oid("log"), "x", b"deleted".to_vec()),
        )
        .unwrap_or_else(|e| panic!("delete of {n} refused on a full store: {e}"));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.space().unwrap().available < 2 << 20 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    run(
        s,
        Transaction::new().write(C, &oid("again"), 0, vec![2u8; 1 << 20]),
    )
    .unwrap();
}

#[test]
fn mem_full_then_delete() {
    check_full_then_delete(&MemStore::with_capacity(16 << 20));
}

#[test]
fn durable_full_then_delete() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MkfsOptions {
        size: kelp_types::ByteSize(16 << 20),
        ..MkfsOptions::default()
    };
    kelp_store::mkfs(dir.path(), &opts).unwrap();
    let store = KelpStore::mount(dir.path(), StoreConfig::default()).unwrap();
    check_full_then_delete(&store);
    store.close().unwrap();
}

struct Durable {
    _dir: tempfile::TempDir,
    store: Option<KelpStore>,
}

impl Durable {
    /// Data file only reserved (fallocate): commits flush the data file, then the log.
    fn new() -> Self {
        Self::with_config(StoreConfig::default(), false)
    }

    /// Every whole-unit write goes to new extents written before the commit (no deferral of
    /// small whole-unit writes), so the copy-on-write path is covered by the same suite; on a
    /// prewritten data file, so with one flush per commit.
    fn cow() -> Self {
        Self::with_config(
            StoreConfig {
                prefer_deferred_size: kelp_types::ByteSize(0),
                ..StoreConfig::default()
            },
            true,
        )
    }

    fn with_config(cfg: StoreConfig, prewrite: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let opts = MkfsOptions {
            size: kelp_types::ByteSize(256 << 20),
            prewrite,
            ..MkfsOptions::default()
        };
        kelp_store::mkfs(dir.path(), &opts).unwrap();
        let store = KelpStore::mount(dir.path(), cfg).unwrap();
        Durable {
            _dir: dir,
            store: Some(store),
        }
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        // Every conformance run must leave a consistent store, before and after remount.
        if let Some(s) = self.store.take() {
            if std::thread::panicking() {
                return;
            }
            let before = workload::dump(&s).unwrap();
            let rep = s.fsck(true).unwrap();
            assert!(rep.is_clean(), "{:?}", rep.problems);
            s.close().unwrap();
            let s = KelpStore::mount(self._dir.path(), StoreConfig::default()).unwrap();
            assert_eq!(
                workload::dump(&s).unwrap(),
                before,
                "state changed across remount"
            );
            let rep = s.fsck(true).unwrap();
            assert!(rep.is_clean(), "{:?}", rep.problems);
        }
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod mem {
            $(#[test] fn $name() { super::$name(&kelp_store::MemStore::new()); })*
        }
        mod durable {
            $(#[test] fn $name() {
                let d = super::Durable::new();
                super::$name(d.store.as_ref().unwrap());
            })*
        }
        mod durable_cow {
            $(#[test] fn $name() {
                let d = super::Durable::cow();
                super::$name(d.store.as_ref().unwrap());
            })*
        }
    };
}

conformance!(
    check_collections,
    check_data_ops,
    check_read_bytes,
    check_aligned_payloads,
    check_ordering_and_listing,
    check_atomicity,
    check_submission_order,
    check_xattrs_and_omap,
    check_clone,
    check_small_objects,
    check_split,
    check_against_model,
    check_async_commit,
    check_space,
);

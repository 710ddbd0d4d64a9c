//! Block images on a real three-OSD cluster: `kelp rbd` as an operator uses it (create, ls,
//! info, resize, rm, mv, du, import/export), and the image library under a random workload
//! checked byte for byte against a model (plain and striped layouts, writes, discards,
//! write-zeroes, resizes, reads across object boundaries), with the space freed by discards.

#![allow(clippy::unwrap_used)]

mod heal_support;

use std::process::Output;

use bytes::Bytes;
use heal_support::{Cluster, kelp};
use kelp_rbd::{CreateOptions, Rbd};

fn run(c: &Cluster, args: &[&str]) -> Output {
    let conf = c.conf();
    let mut all = args.to_vec();
    all.extend(["-c", &conf]);
    kelp(&all)
}

fn refused(c: &Cluster, args: &[&str], needle: &str) {
    let out = run(c, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kelp {args:?} was accepted");
    assert!(
        err.contains(needle),
        "kelp {args:?}: {needle:?} not in: {err}"
    );
}

fn du_used(c: &Cluster, image: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&c.cli(&["rbd", "du", image, "--format", "json"])).unwrap();
    v["images"][0]["used_size"].as_u64().unwrap()
}

#[test]
fn rbd_cli_manages_images() {
    let c = Cluster::up(3, 16);
    c.cli(&["rbd", "create", "disk", "--size", "64M"]);
    c.cli(&[
        "rbd",
        "create",
        "rbd/striped",
        "--size",
        "10M",
        "--object-size",
        "1M",
        "--stripe-unit",
        "64K",
        "--stripe-count",
        "4",
    ]);
    let ls = c.cli(&["rbd", "ls"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), ["disk", "striped"]);
    let info: serde_json::Value =
        serde_json::from_str(&c.cli(&["rbd", "info", "striped", "--format", "json"])).unwrap();
    assert_eq!(info["size"], 10 << 20);
    assert_eq!(info["object_size"], 1 << 20);
    assert_eq!(info["stripe_unit"], 65536);
    assert_eq!(info["stripe_count"], 4);
    assert_eq!(info["format"], 1);

    // refusals
    refused(
        &c,
        &["rbd", "create", "disk", "--size", "1M"],
        "already exists",
    );
    refused(&c, &["rbd", "info", "nope"], "does not exist");
    refused(
        &c,
        &["rbd", "create", "x", "--size", "1M", "--object-size", "3M"],
        "power of two",
    );
    refused(
        &c,
        &["rbd", "resize", "disk", "--size", "1M"],
        "--allow-shrink",
    );
    refused(&c, &["rbd", "create", "a/b/c", "--size", "1M"], "");

    // import / export, sparse: a file with a hole in the middle
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("in.raw");
    let mut data = heal_support::content(7, 9 << 20).to_vec();
    data[3 << 20..8 << 20].fill(0); // object 1 (4-8 MiB) entirely zero
    std::fs::write(&src, &data).unwrap();
    c.cli(&["rbd", "import", src.to_str().unwrap(), "imported"]);
    let used = du_used(&c, "imported");
    assert!(
        used <= (5 << 20) + 4096,
        "the zero middle must not be stored: used {used}"
    );
    let out = tmp.path().join("out.raw");
    c.cli(&["rbd", "export", "imported", out.to_str().unwrap()]);
    assert!(
        std::fs::read(&out).unwrap() == data,
        "export differs from import"
    );
    // through stdout too
    let piped = run(&c, &["rbd", "export", "imported", "-"]);
    assert!(piped.status.success());
    assert!(piped.stdout == data, "export to stdout differs");

    // discard frees space: export → zero a range through the library is tested below; here
    // resize down and up loses the tail
    c.cli(&[
        "rbd",
        "resize",
        "imported",
        "--size",
        "1M",
        "--allow-shrink",
    ]);
    assert!(du_used(&c, "imported") <= 1 << 20);
    c.cli(&["rbd", "resize", "imported", "--size", "9M"]);
    c.cli(&["rbd", "export", "imported", out.to_str().unwrap()]);
    let back = std::fs::read(&out).unwrap();
    assert_eq!(back.len(), 9 << 20);
    assert!(back[..1 << 20] == data[..1 << 20]);
    assert!(
        back[1 << 20..].iter().all(|&b| b == 0),
        "the shrunk tail came back"
    );

    // rename and remove
    c.cli(&["rbd", "mv", "imported", "renamed"]);
    refused(&c, &["rbd", "info", "imported"], "does not exist");
    refused(&c, &["rbd", "mv", "renamed", "disk"], "already exists");
    c.cli(&["rbd", "rm", "renamed"]);
    let ls = c.cli(&["rbd", "ls"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), ["disk", "striped"]);
    // no data object of the removed image is left
    let objs = c.cli(&["rados", "-p", "rbd", "ls"]);
    let ids: Vec<&str> = objs
        .lines()
        .filter(|l| l.starts_with("rbd_data."))
        .collect();
    assert!(ids.is_empty(), "data objects left: {ids:?}");

    // data on an erasure-coded pool, header in the replicated one
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "ec21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    c.cli(&["pool", "create", "ecdata", "--erasure", "ec21"]);
    refused(
        &c,
        &["rbd", "create", "ecdata/img", "--size", "1M"],
        "--data-pool",
    );
    c.cli(&[
        "rbd",
        "import",
        src.to_str().unwrap(),
        "ecimg",
        "--data-pool",
        "ecdata",
    ]);
    let info: serde_json::Value =
        serde_json::from_str(&c.cli(&["rbd", "info", "ecimg", "--format", "json"])).unwrap();
    assert_eq!(info["data_pool"], "ecdata");
    c.cli(&["rbd", "snap", "create", "ecimg@one"]);
    c.cli(&["rbd", "resize", "ecimg", "--size", "2M", "--allow-shrink"]);
    c.cli(&["rbd", "export", "ecimg@one", out.to_str().unwrap()]);
    assert!(
        std::fs::read(&out).unwrap() == data,
        "EC-backed snapshot differs"
    );
    c.cli(&["rbd", "snap", "purge", "ecimg"]);
    c.cli(&["rbd", "rm", "ecimg"]);

    // bench writes, then reads
    let b = c.cli(&[
        "rbd",
        "bench",
        "disk",
        "--io-type",
        "write",
        "--io-size",
        "64K",
        "--io-total",
        "4M",
        "--io-pattern",
        "rand",
    ]);
    assert!(b.contains("ops: 64"), "{b}");
}

/// A random workload on an image, checked against an in-memory model after every step.
/// Snapshot `snap` of `rbd/parent` (open as `img`), protected, and a clone `rbd/child` of it.
async fn clone_at(rbd: &Rbd, img: &kelp_rbd::Image, parent: &str, snap: &str, child: &str) {
    img.snap_create(snap).await.unwrap();
    img.snap_set_protected(snap, true).await.unwrap();
    rbd.clone_image("rbd", parent, snap, "rbd", child, None)
        .await
        .unwrap();
}

/// Image `rbd/base`: 8 MiB in objects of 1 MiB, written in full; with what it holds.
async fn written_base(rbd: &Rbd) -> (kelp_rbd::Image, Bytes) {
    let mb = 1u64 << 20;
    rbd.create(
        "rbd",
        "base",
        &CreateOptions {
            size: 8 * mb,
            order: Some(20),
            ..CreateOptions::default()
        },
    )
    .await
    .unwrap();
    let base = rbd.open("rbd", "base").await.unwrap();
    let v1 = heal_support::content(1, 8 * mb as usize);
    base.write(0, v1.clone()).await.unwrap();
    (base, v1)
}

async fn workload(rbd: &Rbd, name: &str, opts: CreateOptions, seed: u64) {
    rbd.create("rbd", name, &opts).await.unwrap();
    let img = rbd.open("rbd", name).await.unwrap();
    let mut model = vec![0u8; opts.size as usize];
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..120 {
        let size = model.len() as u64;
        let off = next() % size;
        let len = (next() % (size - off).min(3 << 20)).max(1);
        match next() % 10 {
            0..=4 => {
                let data = heal_support::content(next(), len as usize);
                img.write(off, data.clone()).await.unwrap();
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            5 | 6 => {
                img.discard(off, len).await.unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            7 => {
                img.write_zeroes(off, len, next() % 2 == 0).await.unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            8 if step % 4 == 0 => {
                let new = (next() % (opts.size * 2)).max(4096);
                img.resize(new).await.unwrap();
                model.resize(new as usize, 0);
            }
            _ => {
                let got = img.read(off, len).await.unwrap();
                assert!(
                    got[..] == model[off as usize..(off + len) as usize],
                    "{name} step {step}: read {off}+{len} differs"
                );
            }
        }
    }
    let all = img.read(0, model.len() as u64).await.unwrap();
    assert!(all[..] == model[..], "{name}: final image differs");
    // extents: every data byte of the model lies in a data extent
    let extents = img.extents(0, model.len() as u64).await.unwrap();
    let mut pos = 0;
    for e in &extents {
        assert_eq!(e.offset, pos);
        if !e.data {
            assert!(
                model[e.offset as usize..(e.offset + e.len) as usize]
                    .iter()
                    .all(|&b| b == 0),
                "{name}: a hole at {}+{} holds data",
                e.offset,
                e.len
            );
        }
        pos += e.len;
    }
    assert_eq!(pos, model.len() as u64);
    // out of range refused
    assert!(img.read(model.len() as u64, 1).await.is_err());
    assert!(
        img.write(model.len() as u64 - 1, Bytes::from_static(b"ab"))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_match_a_model_under_random_io() {
    let c = Cluster::up(3, 16);
    let rados = c.connect().await;
    let rbd = Rbd::new(rados);
    workload(
        &rbd,
        "plain",
        CreateOptions {
            size: 12 << 20,
            order: Some(20),
            ..CreateOptions::default()
        },
        11,
    )
    .await;
    workload(
        &rbd,
        "striped",
        CreateOptions {
            size: 10 << 20,
            order: Some(20),
            stripe_unit: Some(64 << 10),
            stripe_count: Some(3),
            ..CreateOptions::default()
        },
        23,
    )
    .await;

    // discard frees space: a fully written image, then discarded
    rbd.create("rbd", "space", &CreateOptions::with_size(16 << 20))
        .await
        .unwrap();
    let img = rbd.open("rbd", "space").await.unwrap();
    img.write(0, heal_support::content(3, 16 << 20))
        .await
        .unwrap();
    assert_eq!(img.usage().await.unwrap().used, 16 << 20);
    img.discard(0, 12 << 20).await.unwrap();
    img.discard((12 << 20) + 4096, 8192).await.unwrap();
    let used = img.usage().await.unwrap().used;
    assert!(used <= 4 << 20, "discarded space still counted: {used}");
    let ext = img.extents(0, 16 << 20).await.unwrap();
    assert_eq!(
        (ext[0].offset, ext[0].len, ext[0].data),
        (0, 12 << 20, false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clone_chains() {
    let c = Cluster::up(3, 16);
    let rados = c.connect().await;
    let rbd = Rbd::new(rados);
    let mb = 1u64 << 20;
    let (base, v1) = written_base(&rbd).await;
    base.snap_create("s1").await.unwrap();
    assert!(matches!(
        base.snap_create("s1").await,
        Err(kelp_rbd::RbdError::SnapExists(_))
    ));
    // overwrite part, discard part: the snapshot keeps the old bytes
    let v2 = heal_support::content(2, 3 * mb as usize);
    base.write(mb, v2.clone()).await.unwrap();
    base.discard(5 * mb, 2 * mb).await.unwrap();
    let mut head = v1.to_vec();
    head[mb as usize..4 * mb as usize].copy_from_slice(&v2);
    head[5 * mb as usize..7 * mb as usize].fill(0);
    assert!(base.read(0, 8 * mb).await.unwrap()[..] == head[..]);
    let s1 = rbd.open_snap("rbd", "base", "s1").await.unwrap();
    assert!(s1.is_read_only());
    assert!(s1.read(0, 8 * mb).await.unwrap() == v1, "snapshot changed");
    assert!(s1.write(0, Bytes::from_static(b"x")).await.is_err());

    // rollback brings s1 back; a second snapshot taken before keeps the changed state
    base.snap_create("s2").await.unwrap();
    base.snap_rollback("s1", |_, _| {}).await.unwrap();
    assert!(
        base.read(0, 8 * mb).await.unwrap() == v1,
        "rollback incomplete"
    );
    let s2 = rbd.open_snap("rbd", "base", "s2").await.unwrap();
    assert!(s2.read(0, 8 * mb).await.unwrap()[..] == head[..]);

    // a chain of 10 clones, each of the previous one's protected snapshot
    base.snap_set_protected("s1", true).await.unwrap();
    assert!(
        base.snap_remove("s1").await.is_err(),
        "a protected snapshot was removed"
    );
    let mut parent = ("base".to_string(), "s1".to_string());
    let mut expect = v1.to_vec();
    for i in 1..=10 {
        let name = format!("c{i}");
        rbd.clone_image("rbd", &parent.0, &parent.1, "rbd", &name, None)
            .await
            .unwrap();
        let img = rbd.open("rbd", &name).await.unwrap();
        // each clone changes 64 KiB of its own
        let off = i * 512 * 1024;
        let patch = heal_support::content(100 + i, 65536);
        img.write(off, patch.clone()).await.unwrap();
        expect[off as usize..off as usize + 65536].copy_from_slice(&patch);
        assert!(
            img.read(0, 8 * mb).await.unwrap()[..] == expect[..],
            "clone {name} reads wrong"
        );
        img.snap_create("p").await.unwrap();
        img.snap_set_protected("p", true).await.unwrap();
        img.close().await.unwrap();
        parent = (name, "p".to_string());
    }
    // the deepest clone reads through all ten levels
    let c10 = rbd.open("rbd", "c10").await.unwrap();
    assert!(c10.read(0, 8 * mb).await.unwrap()[..] == expect[..]);
    // writing a clone never changes its parent
    let c5 = rbd.open("rbd", "c5").await.unwrap();
    let before = rbd
        .open_snap("rbd", "c4", "p")
        .await
        .unwrap()
        .read(0, 8 * mb)
        .await
        .unwrap();
    c5.write(0, heal_support::content(55, 2 * mb as usize))
        .await
        .unwrap();
    c5.discard(6 * mb, mb).await.unwrap();
    let c4 = rbd.open("rbd", "c4").await.unwrap();
    assert!(
        c4.read(0, 8 * mb).await.unwrap() == before,
        "a clone's write reached its parent"
    );
    assert!(base.read(0, 8 * mb).await.unwrap() == v1);
    // c10 still reads c9@p (made before c5 changed), so it is unchanged too
    assert!(c10.read(0, 8 * mb).await.unwrap()[..] == expect[..]);

    // protected snapshots with clones cannot be unprotected; flatten detaches a clone's head
    assert!(base.snap_set_protected("s1", false).await.is_err());
    let c1 = rbd.open("rbd", "c1").await.unwrap();
    let c1_data = c1.read(0, 8 * mb).await.unwrap();
    c1.flatten(|_, _| {}).await.unwrap();
    assert!(
        c1.read(0, 8 * mb).await.unwrap() == c1_data,
        "flatten changed the data"
    );
    assert_eq!(c1.info().overlap, Some(0));
    assert!(c1.flatten(|_, _| {}).await.is_err(), "flattened twice");
    // c1's snapshot (the parent of c2..c10) still reads through base@s1
    assert!(c10.read(0, 8 * mb).await.unwrap()[..] == expect[..]);
    assert!(base.snap_set_protected("s1", false).await.is_err());
    // a clone with no snapshots detaches completely when flattened
    rbd.clone_image("rbd", "base", "s1", "rbd", "solo", None)
        .await
        .unwrap();
    let solo = rbd.open("rbd", "solo").await.unwrap();
    assert_eq!(base.children().await.unwrap().len(), 2);
    solo.flatten(|_, _| {}).await.unwrap();
    assert!(solo.header().parent.is_none());
    assert!(solo.read(0, 8 * mb).await.unwrap() == v1);
    base.refresh().await.unwrap();
    assert_eq!(base.children().await.unwrap().len(), 1);
}

/// The lock holder's knowledge of which objects a clone lacks: used while it holds the lock,
/// never after another client has written in between (a clone of a clone, two clients taking
/// turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_objects_are_forgotten_when_the_lock_moves() {
    let c = Cluster::up(3, 16);
    let mb = 1u64 << 20;
    let rbd_a = Rbd::new(c.connect().await);
    let rbd_b = Rbd::new(c.connect().await);
    let (base, v1) = written_base(&rbd_a).await;
    clone_at(&rbd_a, &base, "base", "s", "mid").await;
    let mid = rbd_a.open("rbd", "mid").await.unwrap();
    clone_at(&rbd_a, &mid, "mid", "p", "leaf").await;

    let a = rbd_a.open("rbd", "leaf").await.unwrap();
    let b = rbd_b.open("rbd", "leaf").await.unwrap();
    // Without the lock nothing is learned.
    assert!(a.read(0, 8 * mb).await.unwrap() == v1);
    assert_eq!(a.known_absent_objects(), 0);
    // The holder learns that the clone has none of its 8 objects.
    a.acquire_lock().await.unwrap();
    assert!(a.holds_lock().await);
    assert!(a.read(0, 8 * mb).await.unwrap() == v1);
    assert_eq!(a.known_absent_objects(), 8);
    // Its own write of a known-absent object is read back (copy-up, then the change).
    let mut expect = v1.to_vec();
    let patch = heal_support::content(2, 4096);
    a.write(mb + 100, patch.clone()).await.unwrap();
    expect[mb as usize + 100..mb as usize + 100 + 4096].copy_from_slice(&patch);
    assert!(a.read(0, 8 * mb).await.unwrap()[..] == expect[..]);
    assert_eq!(a.known_absent_objects(), 7);

    // The other client writes objects `a` knew absent (it asks for the lock; `a` hands it
    // over), discards one, writes zeros into another.
    let other = heal_support::content(3, 2 * mb as usize);
    b.write(3 * mb, other.clone()).await.unwrap();
    b.discard(6 * mb, mb).await.unwrap();
    b.write_zeroes(7 * mb + 512, 4096, false).await.unwrap();
    assert!(b.holds_lock().await);
    assert!(!a.holds_lock().await, "the lock was not handed over");
    assert_eq!(
        a.known_absent_objects(),
        0,
        "knowledge kept without the lock"
    );
    expect[3 * mb as usize..5 * mb as usize].copy_from_slice(&other);
    expect[6 * mb as usize..7 * mb as usize].fill(0);
    expect[7 * mb as usize + 512..7 * mb as usize + 512 + 4096].fill(0);
    assert!(b.read(0, 8 * mb).await.unwrap()[..] == expect[..]);
    assert!(
        a.read(0, 8 * mb).await.unwrap()[..] == expect[..],
        "a reader without the lock missed the other client's writes"
    );
    // `a` takes the lock back: nothing from its earlier turn is used.
    a.acquire_lock().await.unwrap();
    assert!(!b.holds_lock().await);
    assert!(
        a.read(0, 8 * mb).await.unwrap()[..] == expect[..],
        "stale absence used after the lock came back"
    );
    // Objects 0, 2 and 5 are still only in the parents.
    assert_eq!(a.known_absent_objects(), 3);
    assert!(a.read(0, 8 * mb).await.unwrap()[..] == expect[..]);

    // Once more with the turns the other way round, `b` having learned before.
    b.acquire_lock().await.unwrap();
    assert!(b.read(0, 8 * mb).await.unwrap()[..] == expect[..]);
    assert_eq!(b.known_absent_objects(), 3);
    let last = heal_support::content(4, 4096);
    a.write(5 * mb, last.clone()).await.unwrap();
    expect[5 * mb as usize..5 * mb as usize + 4096].copy_from_slice(&last);
    assert_eq!(b.known_absent_objects(), 0);
    b.acquire_lock().await.unwrap();
    assert!(
        b.read(0, 8 * mb).await.unwrap()[..] == expect[..],
        "stale absence used by the second client"
    );
    // The parents never changed.
    let mid_p = rbd_b.open_snap("rbd", "mid", "p").await.unwrap();
    assert!(mid_p.read(0, 8 * mb).await.unwrap() == v1);
    a.close().await.unwrap();
    b.close().await.unwrap();
}

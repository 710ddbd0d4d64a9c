//! Self-managed snapshots against real clusters (`kelp up`, 3 OSDs): the client library's
//! snapshot API and the CLI (`kelp pool selfmanaged-snap`, `kelp rados listsnaps`,
//! `--snap-id`, `--snap-context`, `rollback`) on a replicated pool and on an erasure-coded
//! 2+1 pool: writes after a snapshot keep clones, reads at a snapshot see them, removals keep
//! whiteouts, rollback restores, listings hide clones, removed snapshots are trimmed (the
//! clone objects leave the OSDs' stores and the pool's stored bytes go down), and an OSD that
//! was down while clones were made gets them through recovery (deep scrub clean, and its own
//! store, opened with the cluster stopped, holds them byte for byte).
#![allow(clippy::unwrap_used)]

mod heal_support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use heal_support::{Cluster, all_active_clean, content, kelp, osd_state, wait_until};
use kelp_client::{ClientError, IoCtx, Rados};

async fn read(io: &IoCtx, name: &str) -> Result<Bytes, ClientError> {
    io.read(name, 0, 0).await
}

fn at(io: &IoCtx, snap: u64) -> IoCtx {
    let mut s = io.clone();
    s.set_read_snap(Some(snap));
    s
}

fn not_found<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) {
    assert!(
        matches!(r, Err(ClientError::NotFound { .. })),
        "{what}: {r:?}"
    );
}

/// Pool `pool`'s STORED bytes in `kelp df --format json`.
fn stored(c: &Cluster, pool: &str) -> u64 {
    let out = kelp(&["df", "--format", "json", "-c", &c.conf()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["pools"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == pool))
        .and_then(|p| p["stats"]["stored"].as_u64())
        .unwrap_or(u64::MAX)
}

/// Deep-scrubs every PG of `pool` and asserts none is inconsistent.
fn deep_scrub_clean(c: &Cluster, rados: &Rados, pool: &str) {
    let map = rados.osd_map();
    let id = map.pool_by_name(pool).unwrap().id;
    for pg in map.pool_pgs(id).unwrap() {
        let pgid = pg.to_string();
        c.cli(&["pg", "deep-scrub", &pgid, "--wait"]);
        let report: serde_json::Value =
            serde_json::from_str(&c.cli(&["pg", "list-inconsistent", &pgid, "--format", "json"]))
                .unwrap();
        assert_eq!(
            report["inconsistents"].as_array().map_or(0, Vec::len),
            0,
            "PG {pgid}: {report:#}"
        );
    }
}

/// The snapshot semantics every pool kind must have; `big` is the size of the objects whose
/// clones the trim must free.
async fn snapshot_semantics(c: &Cluster, rados: &Rados, pool: &str, omap: bool) {
    let mut io = rados.ioctx(pool).await.unwrap();
    let big = 1 << 20;
    io.write_full("a", &b"a-one"[..]).await.unwrap();
    io.set_xattr("a", "k", "x1").await.unwrap();
    io.write_full("b", &b"b-one"[..]).await.unwrap();
    for i in 0..8u64 {
        io.write_full(&format!("big-{i}"), content(i, big))
            .await
            .unwrap();
    }
    if omap {
        io.omap_set("a", &[("key", "o1")]).await.unwrap();
    }

    // snapshot 1, then overwrite: the old state is a clone
    let s1 = rados.selfmanaged_snap_create(pool).await.unwrap();
    io.set_snap_context(s1, vec![s1]).unwrap();
    assert_eq!(io.snap_context(), (s1, vec![s1]));
    assert!(io.set_snap_context(s1, vec![s1 + 1]).is_err());
    assert!(io.set_snap_context(5, vec![1, 2]).is_err());
    io.write("a", 0, &b"A-TWO"[..]).await.unwrap();
    io.set_xattr("a", "k", "x2").await.unwrap();
    if omap {
        io.omap_set("a", &[("key", "o2")]).await.unwrap();
    }
    for i in 0..8u64 {
        io.write(&format!("big-{i}"), 4096, content(100 + i, 8192))
            .await
            .unwrap();
    }
    io.write_full("c", &b"c-made-after-s1"[..]).await.unwrap();
    assert_eq!(&read(&io, "a").await.unwrap()[..], b"A-TWO");
    let io1 = at(&io, s1);
    assert_eq!(&read(&io1, "a").await.unwrap()[..], b"a-one");
    assert_eq!(&io1.get_xattr("a", "k").await.unwrap()[..], b"x1");
    assert_eq!(io1.stat("a").await.unwrap().size, 5);
    if omap {
        let (vals, _) = io1.omap_get_vals("a", "", "", 10).await.unwrap();
        assert_eq!(&vals[0].1[..], b"o1");
    }
    assert_eq!(
        read(&io1, "big-3").await.unwrap(),
        content(3, big),
        "a partial overwrite after the snapshot leaves the snapshot whole"
    );
    not_found(read(&io1, "c").await, "c did not exist at s1");
    // a snapshot is read-only
    assert!(matches!(
        io1.write_full("a", &b"no"[..]).await,
        Err(ClientError::Invalid(_))
    ));
    let ss = io.list_snaps("a").await.unwrap();
    assert_eq!(ss.seq, s1);
    assert_eq!(ss.head_size, Some(5));
    assert_eq!(ss.clones.len(), 1);
    assert_eq!(
        (ss.clones[0].id, &ss.clones[0].snaps, ss.clones[0].size),
        (s1, &vec![s1], 5)
    );

    // snapshot 2; b removed under it: a whiteout, its snapshots still readable
    let s2 = rados.selfmanaged_snap_create(pool).await.unwrap();
    assert!(s2 > s1);
    io.set_snap_context(s2, vec![s2, s1]).unwrap();
    io.remove("b").await.unwrap();
    not_found(read(&io, "b").await, "b removed");
    not_found(io.stat("b").await, "stat of removed b");
    not_found(io.remove("b").await, "removing a whiteout again");
    assert_eq!(&read(&io1, "b").await.unwrap()[..], b"b-one");
    assert_eq!(&read(&at(&io, s2), "b").await.unwrap()[..], b"b-one");
    let ssb = io.list_snaps("b").await.unwrap();
    assert_eq!(ssb.head_size, None);
    assert_eq!(ssb.clones.len(), 1);
    assert_eq!(ssb.clones[0].snaps, vec![s2, s1]);
    // listings show heads only: no clones, no whiteouts
    let mut names = io.list_objects().await.unwrap();
    names.sort();
    let mut want: Vec<String> = ["a", "c"].iter().map(|s| s.to_string()).collect();
    want.extend((0..8).map(|i| format!("big-{i}")));
    want.sort();
    assert_eq!(names, want);
    let ls = c.cli(&["rados", "-p", pool, "ls"]);
    let mut ls: Vec<&str> = ls.lines().collect();
    ls.sort();
    assert_eq!(ls, want.iter().map(String::as_str).collect::<Vec<_>>());

    // a third state of a: the snapshots keep theirs
    io.write_full("a", &b"a-three"[..]).await.unwrap();
    assert_eq!(&read(&io1, "a").await.unwrap()[..], b"a-one");
    assert_eq!(&read(&at(&io, s2), "a").await.unwrap()[..], b"A-TWO");
    assert_eq!(&read(&io, "a").await.unwrap()[..], b"a-three");
    // b written again: re-created over the whiteout
    io.write_full("b", &b"b-two"[..]).await.unwrap();
    assert_eq!(&read(&io, "b").await.unwrap()[..], b"b-two");
    assert_eq!(&read(&io1, "b").await.unwrap()[..], b"b-one");

    // the CLI: listsnaps, a read at a snapshot, rollback
    let json: serde_json::Value =
        serde_json::from_str(&c.cli(&["rados", "-p", pool, "listsnaps", "a", "--format", "json"]))
            .unwrap();
    assert_eq!(json["clones"].as_array().unwrap().len(), 2, "{json}");
    let plain = c.cli(&["rados", "-p", pool, "listsnaps", "a"]);
    assert!(
        plain.contains("cloneid") && plain.contains("head"),
        "{plain}"
    );
    let file = c.dir.join("a-at-s1");
    let s1s = s1.to_string();
    c.cli(&[
        "rados",
        "-p",
        pool,
        "--snap-id",
        &s1s,
        "get",
        "a",
        &file.display().to_string(),
    ]);
    assert_eq!(std::fs::read(&file).unwrap(), b"a-one");

    // rollback: a to s1 (data and xattr), c to s1 (it did not exist then: removed, and its
    // state at s2 kept as a clone since it was written before s2)
    io.rollback("a", s1).await.unwrap();
    assert_eq!(&read(&io, "a").await.unwrap()[..], b"a-one");
    assert_eq!(&io.get_xattr("a", "k").await.unwrap()[..], b"x1");
    if omap {
        let (vals, _) = io.omap_get_vals("a", "", "", 10).await.unwrap();
        assert_eq!(&vals[0].1[..], b"o1");
    }
    assert_eq!(&read(&at(&io, s2), "a").await.unwrap()[..], b"A-TWO");
    let s2s = s2.to_string();
    let ctx = format!("{s2}:{s2},{s1}");
    c.cli(&[
        "rados",
        "-p",
        pool,
        "--snap-context",
        &ctx,
        "rollback",
        "c",
        &s1s,
    ]);
    not_found(read(&io, "c").await, "c rolled back to before it existed");
    assert_eq!(
        &read(&at(&io, s2), "c").await.unwrap()[..],
        b"c-made-after-s1"
    );
    // the CLI allocates ids too
    let s3: u64 = c
        .cli(&["pool", "selfmanaged-snap", "create", pool])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(s3, s2 + 1);

    // remove s1 and s2 (s3 holds nothing: no write happened under it): reads at them find
    // nothing at once, the clones are trimmed, and the space is given back
    // the statistics count clones: 8 big heads and their 8 clones
    wait_until(
        "the pool's stored bytes to count the clones",
        Duration::from_secs(60),
        || {
            let st = stored(c, pool);
            st != u64::MAX && st >= 16 * big as u64
        },
    )
    .await;
    let before = stored(c, pool);
    rados.selfmanaged_snap_remove(pool, s1).await.unwrap();
    c.cli(&["pool", "selfmanaged-snap", "rm", pool, &s2s]);
    not_found(read(&io1, "a").await, "read at a removed snapshot");
    let mut trimmed = false;
    for _ in 0..600 {
        let mut all = true;
        for name in ["a", "b", "big-0", "big-7"] {
            let ss = io.list_snaps(name).await.unwrap();
            all &= ss.clones.is_empty();
        }
        // c was only a whiteout with clones: it is gone for good
        all &= matches!(io.list_snaps("c").await, Err(ClientError::NotFound { .. }));
        if all {
            trimmed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(trimmed, "the clones of removed snapshots were not trimmed");
    assert_eq!(&read(&io, "a").await.unwrap()[..], b"a-one");
    assert_eq!(&read(&io, "b").await.unwrap()[..], b"b-two");
    let took = wait_until(
        "the pool's stored bytes to go down after the trim",
        Duration::from_secs(60),
        || stored(c, pool) < 9 * big as u64,
    )
    .await;
    eprintln!(
        "{pool}: stored {before} -> {} bytes after the trim ({took:?})",
        stored(c, pool)
    );
}

/// Counts the snapshot clone objects in every OSD's store (the cluster must be stopped).
fn clones_in_stores(c: &Cluster, osds: i32) -> BTreeMap<i32, usize> {
    use kelp_store::ObjectStore;
    let mut out = BTreeMap::new();
    for osd in 0..osds {
        let store = kelp_store::KelpStore::mount(
            &c.dir.join(format!("osd.{osd}")),
            kelp_store::StoreConfig::default(),
        )
        .unwrap();
        let mut n = 0;
        for coll in store.list_collections().unwrap() {
            let mut from = None;
            loop {
                let page = store.list_objects(coll, from.as_ref(), 1024).unwrap();
                n += page
                    .objects
                    .iter()
                    .filter(|o| kelp_osd::snapset::is_clone_namespace(&o.namespace))
                    .count();
                match page.next {
                    Some(next) => from = Some(next),
                    None => break,
                }
            }
        }
        store.close().unwrap();
        out.insert(osd, n);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_on_a_replicated_pool_with_recovery_and_trim() {
    let c = Cluster::up(3, 8);
    let d = c.dir.display().to_string();
    let rados = c.connect().await;
    snapshot_semantics(&c, &rados, "data", true).await;

    // Recovery: osd.2 is down while the first writes after a snapshot make clones.
    let mut io = rados.ioctx("data").await.unwrap();
    let mut old: BTreeMap<String, Bytes> = BTreeMap::new();
    for i in 0..24u64 {
        let name = format!("r-{i}");
        let data = content(1000 + i, 3000 + i as usize * 101);
        io.write_full(&name, data.clone()).await.unwrap();
        old.insert(name, data);
    }
    c.cli(&["daemon", "stop", "osd.2", "--dir", &d]);
    wait_until("osd.2 down", Duration::from_secs(30), || {
        !osd_state(&rados, 2).0
    })
    .await;
    let s = rados.selfmanaged_snap_create("data").await.unwrap();
    io.set_snap_context(s, vec![s]).unwrap();
    for (i, name) in old.keys().enumerate() {
        io.write_full(name, content(5000 + i as u64, 777))
            .await
            .unwrap();
    }
    c.start("osd.2");
    wait_until("osd.2 up", Duration::from_secs(60), || {
        osd_state(&rados, 2).0
    })
    .await;
    wait_until("every PG active+clean", Duration::from_secs(120), || {
        all_active_clean(&c)
    })
    .await;
    let snap_io = at(&io, s);
    for (name, data) in &old {
        assert_eq!(&read(&snap_io, name).await.unwrap(), data, "{name} at {s}");
    }
    // every member has every clone, the same: deep scrub compares them
    deep_scrub_clean(&c, &rados, "data");

    // osd.2's own store, with the cluster stopped: a clone of every r-* it holds, byte for byte
    let map = rados.osd_map();
    let pool = map.pool_by_name("data").unwrap().clone();
    drop((io, snap_io));
    drop(rados);
    c.cli(&["down", "--dir", &d]);
    {
        use kelp_store::ObjectStore;
        let store =
            kelp_store::KelpStore::mount(&c.dir.join("osd.2"), kelp_store::StoreConfig::default())
                .unwrap();
        let mut checked = 0;
        for (name, data) in &old {
            let pg = pool.placement().object_pg(name, None, "");
            if !map.pg_mapping(pg).unwrap().acting.contains(&2) {
                continue;
            }
            let head = kelp_proto::ObjectLocator {
                pool: pool.id,
                namespace: String::new(),
                key: None,
                name: name.clone(),
            };
            let oid = kelp_osd::object_id(&kelp_osd::snapset::clone_locator(&head, s));
            let coll = kelp_store::CollectionId(pg);
            let st = store
                .stat(coll, &oid)
                .unwrap_or_else(|e| panic!("osd.2 lacks the clone of {name}: {e}"));
            assert_eq!(&store.read(coll, &oid, 0, st.size).unwrap()[..], &data[..]);
            checked += 1;
        }
        store.close().unwrap();
        assert!(checked > 0);
        eprintln!("osd.2 holds the {checked} clones made while it was down");
    }
    // the trimmed clones of the first part are gone from every store; only the last
    // snapshot's 24 clones remain, on each of the three OSDs
    let left = clones_in_stores(&c, 3);
    assert_eq!(left.values().sum::<usize>(), 24 * 3, "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_on_an_erasure_coded_pool() {
    let c = Cluster::up(3, 8);
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "snap21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ]);
    c.cli(&["pool", "create", "ecsnap", "8", "erasure", "snap21"]);
    wait_until("every PG active+clean", Duration::from_secs(120), || {
        all_active_clean(&c)
    })
    .await;
    let rados = c.connect().await;
    snapshot_semantics(&c, &rados, "ecsnap", false).await;

    // one more clone per object that is kept, then every member compared
    let mut io = rados.ioctx("ecsnap").await.unwrap();
    let s = rados.selfmanaged_snap_create("ecsnap").await.unwrap();
    io.set_snap_context(s, vec![s]).unwrap();
    io.write("a", 2, &b"zz"[..]).await.unwrap();
    io.remove("b").await.unwrap();
    assert_eq!(&read(&at(&io, s), "a").await.unwrap()[..], b"a-one");
    assert_eq!(&read(&at(&io, s), "b").await.unwrap()[..], b"b-two");
    assert_eq!(&read(&io, "a").await.unwrap()[..], b"a-zze");
    deep_scrub_clean(&c, &rados, "ecsnap");

    // Recovery: osd.2 (one shard of every PG) is down while clones are made; when it is back
    // its shards of the clones are rebuilt, so reads at the snapshot work with osd.0 down.
    let d = c.dir.display().to_string();
    let mut old: BTreeMap<String, Bytes> = BTreeMap::new();
    for i in 0..12u64 {
        let name = format!("r-{i}");
        let data = content(2000 + i, 20_000 + i as usize * 777);
        io.write_full(&name, data.clone()).await.unwrap();
        old.insert(name, data);
    }
    c.cli(&["daemon", "stop", "osd.2", "--dir", &d]);
    wait_until("osd.2 down", Duration::from_secs(30), || {
        !osd_state(&rados, 2).0
    })
    .await;
    let s = rados.selfmanaged_snap_create("ecsnap").await.unwrap();
    io.set_snap_context(s, vec![s]).unwrap();
    for (i, name) in old.keys().enumerate() {
        io.write(name, 100, content(7000 + i as u64, 5000))
            .await
            .unwrap();
    }
    c.start("osd.2");
    wait_until("osd.2 up", Duration::from_secs(60), || {
        osd_state(&rados, 2).0
    })
    .await;
    wait_until("every PG active+clean", Duration::from_secs(120), || {
        all_active_clean(&c)
    })
    .await;
    deep_scrub_clean(&c, &rados, "ecsnap");
    // with osd.0 gone, every read at the snapshot needs osd.2's shards of the clones
    c.cli(&["osd", "set", "noout"]);
    c.cli(&["daemon", "stop", "osd.0", "--dir", &d]);
    wait_until("osd.0 down", Duration::from_secs(30), || {
        !osd_state(&rados, 0).0
    })
    .await;
    let snap_io = at(&io, s);
    for (name, data) in &old {
        assert_eq!(&read(&snap_io, name).await.unwrap(), data, "{name} at {s}");
    }
}

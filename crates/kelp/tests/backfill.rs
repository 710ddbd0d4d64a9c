//! Issue 6, test 2: an OSD stays down while more writes land than the PG log keeps
//! (`osd_max_pg_log_entries` set to 10), so when it returns its log no longer overlaps the
//! authoritative one and log-based recovery is impossible: it must be brought back by backfill.
//! `norecover` is set while it returns (log recovery paused, backfill not), so every PG becoming
//! `active+clean` shows the backfill path did the work. Finally the cluster is stopped and the
//! returned OSD's store is opened directly: it holds exactly the acknowledged content of every
//! object of its PGs, and none of the deleted ones.

mod heal_support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use heal_support::{Cluster, all_active_clean, content, kelp, osd_state, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_down_past_the_pg_log_is_brought_back_by_backfill() {
    let c = Cluster::up(3, 8);
    let conf = c.conf();
    let d = c.dir.display().to_string();
    let ok = |out: std::process::Output, what: &str| {
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(
        kelp(&[
            "config",
            "set",
            "osd",
            "osd_max_pg_log_entries",
            "10",
            "-c",
            &conf,
        ]),
        "config set",
    );
    // the OSDs read it when they start
    for o in 0..3 {
        ok(
            kelp(&["daemon", "restart", &format!("osd.{o}"), "--dir", &d]),
            "restart",
        );
    }
    let rados = c.connect().await;
    wait_until("every OSD up", Duration::from_secs(60), || {
        (0..3).all(|o| osd_state(&rados, o).0)
    })
    .await;
    let io = rados.ioctx("data").await.unwrap();
    let mut acked: BTreeMap<String, Option<Bytes>> = BTreeMap::new();
    for i in 0..40u64 {
        let name = format!("pre-{i}");
        let data = content(i, 1000 + i as usize * 37);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, Some(data));
    }

    // osd.2 goes away; far more writes than any PG log keeps land meanwhile
    ok(
        kelp(&["daemon", "stop", "osd.2", "--dir", &d]),
        "stop osd.2",
    );
    wait_until("osd.2 down", Duration::from_secs(30), || {
        !osd_state(&rados, 2).0
    })
    .await;
    for i in 0..600u64 {
        let name = format!("while-down-{i}");
        let data = content(1000 + i, 200 + (i as usize * 13) % 5000);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, Some(data));
    }
    for i in 0..20u64 {
        let name = format!("pre-{i}");
        let data = content(5000 + i, 777);
        io.write_full(&name, data.clone()).await.unwrap();
        acked.insert(name, Some(data));
    }
    for i in 20..30u64 {
        let name = format!("pre-{i}");
        io.remove(&name).await.unwrap();
        acked.insert(name, None);
    }

    // back, with log recovery paused: only backfill can make the PGs clean again
    ok(
        kelp(&["osd", "set", "norecover", "-c", &conf]),
        "set norecover",
    );
    ok(
        kelp(&["daemon", "start", "osd.2", "--dir", &d]),
        "start osd.2",
    );
    wait_until("osd.2 up", Duration::from_secs(60), || {
        osd_state(&rados, 2).0
    })
    .await;
    let took = wait_until("every PG active+clean", Duration::from_secs(120), || {
        all_active_clean(&c)
    })
    .await;
    eprintln!("every PG active+clean {took:?} after osd.2 came back (norecover set)");
    ok(
        kelp(&["osd", "unset", "norecover", "-c", &conf]),
        "unset norecover",
    );
    for (name, want) in &acked {
        match want {
            Some(data) => assert_eq!(&io.read(name, 0, 0).await.unwrap()[..], &data[..], "{name}"),
            None => assert!(io.stat(name).await.is_err(), "{name} was deleted"),
        }
    }

    // osd.2's own copies, read from its store with the cluster stopped
    let map = rados.osd_map();
    drop(io);
    drop(rados);
    ok(kelp(&["down", "--dir", &d]), "kelp down");
    let pool = map.pool_by_name("data").unwrap().clone();
    let store =
        kelp_store::KelpStore::mount(&c.dir.join("osd.2"), kelp_store::StoreConfig::default())
            .unwrap();
    use kelp_store::ObjectStore;
    let mut checked = 0;
    for (name, want) in &acked {
        let pg = pool.placement().object_pg(name, None, "");
        if !map.pg_mapping(pg).unwrap().acting.contains(&2) {
            continue;
        }
        let loc = kelp_proto::ObjectLocator {
            pool: pool.id,
            namespace: String::new(),
            key: None,
            name: name.clone(),
        };
        let oid = kelp_osd::object_id(&loc);
        let coll = kelp_store::CollectionId(pg);
        match (want, store.stat(coll, &oid)) {
            (Some(data), Ok(st)) => {
                let got = store.read(coll, &oid, 0, st.size).unwrap();
                assert_eq!(&got[..], &data[..], "osd.2's copy of {name}");
            }
            (Some(_), Err(e)) => panic!("osd.2 lacks {name} (PG {pg}): {e}"),
            (None, Ok(_)) => panic!("osd.2 still has deleted {name} (PG {pg})"),
            (None, Err(_)) => {}
        }
        checked += 1;
    }
    store.close().unwrap();
    assert!(checked > 300, "only {checked} of osd.2's objects checked");
    eprintln!("osd.2 holds exactly the acknowledged state of its {checked} objects");
}

//! Monitors over the real messenger on 127.0.0.1: one monitor serving commands, boots,
//! subscriptions and session-loss down marking; three monitors electing, forwarding and
//! replicating; restarts recovering everything.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_maps::PoolSpec;
use kelp_mon::{MkfsOptions, MonClient, MonClientError, MonConfig, MonInfo, Monitor, mkfs};
use kelp_msgr::{Keyring, Messenger, Secret, generate_secret};
use kelp_proto::{MapUpdate, MonCommand, MonReply, OsdBoot, Subscribe, msg_type};

const FSID: &str = "0d7a1c0e-5b1e-4c2a-9f0a-000000000042";

/// Free ports for monitors that must know each other's addresses before they start.
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let ls: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    ls.iter().map(|l| l.local_addr().unwrap()).collect()
}

fn keyring(names: &[&str]) -> Keyring {
    let mut kr = Keyring::new();
    for n in names {
        kr.insert(&format!("mon.{n}"), generate_secret()).unwrap();
    }
    kr.insert("client.admin", generate_secret()).unwrap();
    kr
}

fn mkfs_all(root: &Path, names: &[&str], addrs: &[SocketAddr], kr: &Keyring) {
    let monmap: Vec<MonInfo> = names
        .iter()
        .zip(addrs)
        .map(|(n, a)| MonInfo {
            name: n.to_string(),
            addr: *a,
        })
        .collect();
    for n in names {
        mkfs(&MkfsOptions {
            name: n.to_string(),
            data: root.join(n),
            fsid: FSID.into(),
            monmap: monmap.clone(),
            keyring: kr.clone(),
            failure_domain: "osd".into(),
        })
        .unwrap();
    }
}

fn admin(kr: &Keyring, mons: Vec<SocketAddr>) -> Arc<MonClient> {
    use kelp_msgr::KeyLookup;
    let secret = kr.secret_for("client.admin").unwrap();
    Arc::new(
        MonClient::new("client.admin", secret, mons)
            .unwrap()
            .with_timeout(Duration::from_secs(10)),
    )
}

async fn wait_for<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status(c: &MonClient) -> kelp_proto::ClusterStatus {
    wait_for("status", 15, async || {
        match c.command(&MonCommand::Status).await {
            Ok(MonReply::Status(s)) => Some(s),
            _ => None,
        }
    })
    .await
}

async fn run(c: &MonClient, cmd: MonCommand) -> MonReply {
    c.command(&cmd)
        .await
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_monitor_serves_commands_boots_subscriptions_and_marks_lost_osds_down() {
    let dir = tempfile::tempdir().unwrap();
    let kr = keyring(&["a"]);
    let addr = free_addrs(1)[0];
    mkfs_all(dir.path(), &["a"], &[addr], &kr);
    // mkfs refuses to run twice.
    assert!(
        mkfs(&MkfsOptions {
            name: "a".into(),
            data: dir.path().join("a"),
            fsid: FSID.into(),
            monmap: vec![MonInfo {
                name: "a".into(),
                addr
            }],
            keyring: kr.clone(),
            failure_domain: "osd".into(),
        })
        .is_err()
    );

    let mon = Monitor::start(&dir.path().join("a"), MonConfig::default())
        .await
        .unwrap();
    let c = admin(&kr, vec![mon.addr()]);
    let st = status(&c).await;
    assert_eq!(st.fsid, FSID);
    assert_eq!(st.leader.as_deref(), Some("a"));
    assert_eq!(st.monitors, vec![("a".to_string(), true)]);

    // A subscriber from the start sees every epoch in order.
    let sub_client = admin(&kr, vec![mon.addr()]);
    let mut sub = sub_client.subscribe(None).unwrap();
    let first = sub.next().await.unwrap();

    for i in 0..3 {
        let r = run(
            &c,
            MonCommand::OsdCreate {
                id: None,
                uuid: format!("uuid-{i}"),
                host: format!("h{i}"),
                crush_weight: 0x10000,
            },
        )
        .await;
        assert!(matches!(r, MonReply::OsdId { id, .. } if id == i), "{r:?}");
    }
    let MonReply::PoolId { id: pool, .. } = run(
        &c,
        MonCommand::PoolCreate(PoolSpec {
            name: "data".into(),
            size: Some(2),
            ..Default::default()
        }),
    )
    .await
    else {
        panic!("no pool id")
    };
    assert_eq!(pool, 1);
    run(
        &c,
        MonCommand::ConfigSet {
            who: "osd".into(),
            key: "osd_max_backfills".into(),
            value: "2".into(),
        },
    )
    .await;
    match c
        .command(&MonCommand::ConfigSet {
            who: "osd".into(),
            key: "osd_max_backfils".into(),
            value: "2".into(),
        })
        .await
    {
        Err(MonClientError::Refused { message }) => {
            assert!(message.contains("unknown config key"), "{message}")
        }
        other => panic!("unknown key accepted: {other:?}"),
    }
    let MonReply::Config(cfg) = run(&c, MonCommand::ConfigDump).await else {
        panic!()
    };
    assert!(
        cfg.iter()
            .any(|e| e.who == "osd" && e.key == "osd_max_backfills" && e.value == "2")
    );

    // A new key takes effect at once: osd.0 authenticates with it and boots.
    let MonReply::Key { secret, .. } = run(
        &c,
        MonCommand::AuthGetOrCreate {
            entity: "osd.0".into(),
        },
    )
    .await
    else {
        panic!()
    };
    let osd0 = MonClient::new(
        "osd.0",
        Secret::from_base64(&secret).unwrap(),
        vec![mon.addr()],
    )
    .unwrap();
    let osd_addr: SocketAddr = "127.0.0.1:6800".parse().unwrap();
    // Boot of another OSD's id is refused.
    assert!(matches!(
        osd0.osd_boot(&OsdBoot {
            id: 1,
            uuid: "uuid-1".into(),
            addr: osd_addr
        })
        .await,
        Err(MonClientError::Refused { .. })
    ));
    let up_epoch = osd0
        .osd_boot(&OsdBoot {
            id: 0,
            uuid: "uuid-0".into(),
            addr: osd_addr,
        })
        .await
        .unwrap();

    let st = status(&c).await;
    assert_eq!(
        (
            st.num_osds,
            st.num_up_osds,
            st.num_in_osds,
            st.num_pools,
            st.num_pgs
        ),
        (3, 1, 3, 1, 32)
    );

    // The subscriber got every epoch, in order, up to the boot.
    let mut epochs = vec![first.epoch];
    while *epochs.last().unwrap() < up_epoch {
        epochs.push(
            tokio::time::timeout(Duration::from_secs(5), sub.next())
                .await
                .unwrap()
                .unwrap()
                .epoch,
        );
    }
    let want: Vec<u32> = (first.epoch..=up_epoch).collect();
    assert_eq!(epochs, want);

    // A wrong key is refused.
    let bad = MonClient::new("client.admin", generate_secret(), vec![mon.addr()]).unwrap();
    assert!(matches!(
        bad.command(&MonCommand::Status).await,
        Err(MonClientError::Msgr(_))
    ));

    // Far behind: with 2 incrementals kept, a subscriber at epoch 1 gets the full map; one
    // epoch behind gets one incremental.
    run(
        &c,
        MonCommand::ConfigSet {
            who: "mon".into(),
            key: "mon_max_incrementals".into(),
            value: "2".into(),
        },
    )
    .await;
    run(
        &c,
        MonCommand::SetFlag {
            flag: "noscrub".into(),
            on: true,
        },
    )
    .await;
    let raw = Messenger::builder("client.admin")
        .secret(kelp_msgr::KeyLookup::secret_for(&kr, "client.admin").unwrap())
        .build()
        .unwrap();
    let conn = raw.connect(mon.addr()).await.unwrap();
    let ask = async |have: u32| -> MapUpdate {
        let r = conn
            .call(
                msg_type::MON_SUBSCRIBE,
                kelp_proto::encode(&Subscribe { have_epoch: have }),
                Bytes::new(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        kelp_proto::decode(&r.meta, "MapUpdate").unwrap()
    };
    let now = mon.osdmap().unwrap().epoch;
    let far = ask(1).await;
    assert!(far.full.is_some() && far.incrementals.is_empty());
    let near = ask(now - 1).await;
    assert!(near.full.is_none() && near.incrementals.len() == 1);

    // Session loss: osd.0's connection closes; after the grace (1 s here) it is marked down.
    run(
        &c,
        MonCommand::ConfigSet {
            who: "mon".into(),
            key: "mon_osd_session_grace".into(),
            value: "1".into(),
        },
    )
    .await;
    osd0.shutdown();
    let closed_at = Instant::now();
    wait_for("osd.0 marked down", 10, async || {
        (!mon.osdmap().unwrap().osds[&0].up).then_some(())
    })
    .await;
    assert!(
        closed_at.elapsed() >= Duration::from_millis(900),
        "marked down before the grace"
    );

    // Restart: the monitor recovers everything it had.
    let before = mon.state_bytes();
    sub_client.shutdown();
    c.shutdown();
    raw.shutdown();
    mon.shutdown().await;
    let mon = Monitor::start(&dir.path().join("a"), MonConfig::default())
        .await
        .unwrap();
    assert_eq!(mon.state_bytes(), before);
    let c = admin(&kr, vec![mon.addr()]);
    let st = status(&c).await;
    assert_eq!((st.num_osds, st.num_up_osds, st.num_pools), (3, 0, 1));
    c.shutdown();
    mon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_monitors_elect_replicate_forward_and_recover() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["a", "b", "c"];
    let kr = keyring(&names);
    let addrs = free_addrs(3);
    mkfs_all(dir.path(), &names, &addrs, &kr);
    let mut mons = Vec::new();
    for n in names {
        mons.push(Some(
            Monitor::start(&dir.path().join(n), MonConfig::default())
                .await
                .unwrap(),
        ));
    }
    let leader = wait_for("a leader", 20, async || {
        let ls: Vec<_> = mons.iter().map(|m| m.as_ref().unwrap().leader()).collect();
        (ls[0].is_some() && ls.iter().all(|l| *l == ls[0])).then(|| ls[0].clone().unwrap())
    })
    .await;
    let li = names.iter().position(|n| *n == leader).unwrap();
    let fi = (li + 1) % 3;

    // Commands sent only to a follower take effect (it forwards them to the leader).
    let c = admin(&kr, vec![addrs[fi]]);
    let st = status(&c).await;
    assert_eq!(st.leader.as_deref(), Some(leader.as_str()));
    assert_eq!(st.monitors.len(), 3);
    for i in 0..2 {
        run(
            &c,
            MonCommand::OsdCreate {
                id: None,
                uuid: format!("u{i}"),
                host: format!("h{i}"),
                crush_weight: 0x10000,
            },
        )
        .await;
    }
    run(
        &c,
        MonCommand::PoolCreate(PoolSpec {
            name: "p".into(),
            size: Some(2),
            ..Default::default()
        }),
    )
    .await;
    run(
        &c,
        MonCommand::ConfigSet {
            who: "global".into(),
            key: "osd_recovery_sleep".into(),
            value: "0.5".into(),
        },
    )
    .await;
    assert_eq!(
        c.current_monitor(),
        addrs[fi],
        "commands went through the follower"
    );

    let same = async |mons: &Vec<Option<Monitor>>| {
        wait_for("identical state on every monitor", 15, async || {
            let s: Vec<_> = mons.iter().flatten().map(|m| m.state_bytes()).collect();
            s.iter().all(|x| *x == s[0]).then_some(())
        })
        .await
    };
    same(&mons).await;
    let map = mons[0].as_ref().unwrap().osdmap().unwrap();
    assert_eq!(map.osds.len(), 2);
    assert!(map.pool_by_name("p").is_some());

    // A follower restarts with everything it had, misses a change, then catches up.
    let ri = (li + 2) % 3;
    let before = mons[ri].as_ref().unwrap().state_bytes();
    mons[ri].take().unwrap().shutdown().await;
    run(
        &c,
        MonCommand::SetFlag {
            flag: "noout".into(),
            on: true,
        },
    )
    .await;
    let m = Monitor::start(&dir.path().join(names[ri]), MonConfig::default())
        .await
        .unwrap();
    assert_eq!(m.state_bytes(), before, "restarted monitor lost state");
    mons[ri] = Some(m);
    same(&mons).await;
    assert!(
        mons[ri]
            .as_ref()
            .unwrap()
            .osdmap()
            .unwrap()
            .has_flag(kelp_maps::ClusterFlag::NoOut)
    );

    c.shutdown();
    for m in mons.into_iter().flatten() {
        m.shutdown().await;
    }
}

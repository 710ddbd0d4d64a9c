//! Three OSD services in one process, wired by an in-memory `Peers`: replication, ordering,
//! `min_size`, misdirected ops and replica failures.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use kelp_maps::{OsdMap, PoolSpec};
use kelp_osd::{Limits, OsdConfig, OsdError, OsdService, Peers, Stamp, execute};
use kelp_proto::{
    ErrorCode, ObjectLocator, OpKind, OsdOp, OsdOpReply, PgCommand, PgCommandKind, PgPull,
    PgPullReply, PgPush, PgPushReply, PgQuery, PgQueryReply, PgSync, PgSyncReply, RepOp,
    RepOpReply, ScrubMapReply, ScrubMapRequest, ShardError,
};
use kelp_store::{CollectionId, MemStore, ObjectStore, Transaction};

#[derive(Default)]
struct LocalPeers {
    osds: OnceLock<HashMap<i32, Arc<OsdService>>>,
    dead: Mutex<HashSet<i32>>,
    /// When set, replica writes with odd versions are delivered late (after their successor).
    reorder: AtomicBool,
    /// When set, every replica write waits for a permit of this semaphore first.
    hold: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// When set, scrub-map requests to members are delivered 5 ms late.
    slow_scrub: AtomicBool,
}

impl LocalPeers {
    fn get(&self, osd: i32) -> Result<Arc<OsdService>, OsdError> {
        if self.dead.lock().unwrap().contains(&osd) {
            return Err(OsdError::PeerUnreachable {
                osd,
                reason: "connection lost".into(),
            });
        }
        self.osds
            .get()
            .and_then(|m| m.get(&osd).cloned())
            .ok_or_else(|| OsdError::PeerUnreachable {
                osd,
                reason: "not reachable yet".into(),
            })
    }
}

#[async_trait::async_trait]
impl Peers for LocalPeers {
    async fn repop(
        &self,
        osd: i32,
        _addr: SocketAddr,
        op: RepOp,
        data: Bytes,
    ) -> Result<RepOpReply, OsdError> {
        let target = self.get(osd)?;
        let hold = self.hold.lock().unwrap().clone();
        if let Some(hold) = hold {
            let _permit = hold
                .acquire()
                .await
                .map_err(|e| OsdError::PeerUnreachable {
                    osd,
                    reason: e.to_string(),
                })?;
        }
        if self.reorder.load(Ordering::Relaxed) && op.log_version % 2 == 1 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        Ok(target.repop(op, data).await)
    }
    async fn query(
        &self,
        osd: i32,
        _addr: SocketAddr,
        q: PgQuery,
    ) -> Result<PgQueryReply, OsdError> {
        Ok(self.get(osd)?.pg_query(q).await)
    }
    async fn pull(
        &self,
        osd: i32,
        _addr: SocketAddr,
        p: PgPull,
    ) -> Result<(PgPullReply, Bytes), OsdError> {
        Ok(self.get(osd)?.pg_pull(p).await)
    }
    async fn sync(&self, osd: i32, _addr: SocketAddr, s: PgSync) -> Result<PgSyncReply, OsdError> {
        Ok(self.get(osd)?.pg_sync(s).await)
    }
    async fn scrub_map(
        &self,
        osd: i32,
        _addr: SocketAddr,
        r: ScrubMapRequest,
    ) -> Result<ScrubMapReply, OsdError> {
        if self.slow_scrub.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(self.get(osd)?.scrub_map(r).await)
    }
    async fn push(
        &self,
        osd: i32,
        _addr: SocketAddr,
        p: PgPush,
        data: Bytes,
    ) -> Result<PgPushReply, OsdError> {
        Ok(self.get(osd)?.pg_push(p, data).await)
    }
    async fn ec_read(
        &self,
        osd: i32,
        _addr: SocketAddr,
        r: kelp_proto::EcRead,
    ) -> Result<(kelp_proto::EcReadReply, Bytes), OsdError> {
        Ok(self.get(osd)?.ec_read(r).await)
    }
}

struct Cluster {
    map: OsdMap,
    osds: HashMap<i32, Arc<OsdService>>,
    stores: HashMap<i32, Arc<MemStore>>,
    peers: Arc<LocalPeers>,
    pool: u32,
    reqid: u64,
}

impl Cluster {
    async fn new() -> Cluster {
        Cluster::with_capacity(|_| None).await
    }

    /// A cluster whose OSD `i` has a store of `capacity(i)` bytes of data (`None`: unbounded).
    async fn with_capacity(capacity: impl Fn(i32) -> Option<u64>) -> Cluster {
        let mut map = OsdMap::new("fsid", "osd").unwrap();
        for i in 0..3 {
            let (id, inc) = map
                .propose_osd_create(&format!("u{i}"), "localhost", 0x10000)
                .unwrap();
            map.apply(&inc.unwrap()).unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{}", 7000 + i).parse().unwrap();
            map.apply(&map.propose_osd_boot(id, addr).unwrap().unwrap())
                .unwrap();
        }
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "data".into(),
                pg_num: Some(8),
                size: Some(3),
                ..PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        let peers = Arc::new(LocalPeers::default());
        let mut osds = HashMap::new();
        let mut stores = HashMap::new();
        for id in 0..3 {
            let store = Arc::new(match capacity(id) {
                Some(bytes) => MemStore::with_capacity(bytes),
                None => MemStore::new(),
            });
            let mut cfg = OsdConfig::new(id);
            cfg.map_wait = Duration::from_millis(200);
            let svc = OsdService::new(cfg, store.clone(), peers.clone(), map.clone());
            svc.set_map(map.clone()).await.unwrap();
            osds.insert(id, svc);
            stores.insert(id, store);
        }
        peers.osds.set(osds.clone()).ok().unwrap();
        let c = Cluster {
            map,
            osds,
            stores,
            peers,
            pool,
            reqid: 0,
        };
        c.wait_active().await;
        c
    }

    async fn publish(&mut self, inc: kelp_maps::Incremental) {
        self.map.apply(&inc).unwrap();
        for svc in self.osds.values() {
            svc.set_map(self.map.clone()).await.unwrap();
        }
        self.wait_active().await;
    }

    /// Waits until every PG with enough replicas has been peered by its primary and its
    /// background recovery is done.
    async fn wait_active(&self) {
        let pool = &self.map.pools[&self.pool];
        for _ in 0..1000 {
            let mut all = true;
            for seed in 0..pool.pg_num {
                let pg = kelp_types::PgId::new(self.pool, seed);
                let m = self.map.pg_mapping(pg).unwrap();
                if m.acting_primary < 0 || (m.acting.len() as u32) < pool.min_size {
                    continue;
                }
                if !self.osds[&m.acting_primary]
                    .is_active_in_sync(pg, &m.acting)
                    .await
                {
                    all = false;
                }
            }
            if all {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("PGs did not become active");
    }

    fn loc(&self, name: &str) -> ObjectLocator {
        ObjectLocator {
            pool: self.pool,
            namespace: String::new(),
            key: None,
            name: name.into(),
        }
    }

    fn op(&mut self, name: &str, ops: Vec<OpKind>) -> OsdOp {
        self.reqid += 1;
        OsdOp {
            reqid: self.reqid,
            epoch: self.map.epoch,
            pg: self.map.object_pg(self.pool, name, None, "").unwrap(),
            object: self.loc(name),
            ops,
            instance: "client.test.1".into(),
        }
    }

    fn primary(&self, op: &OsdOp) -> Arc<OsdService> {
        let m = self.map.pg_mapping(op.pg).unwrap();
        self.osds[&m.acting_primary].clone()
    }

    async fn send(&self, op: OsdOp, data: &[u8]) -> (OsdOpReply, Bytes) {
        self.primary(&op)
            .client_op("client.test", op, Bytes::copy_from_slice(data))
            .await
    }

    /// Reads an object straight from one OSD's store.
    fn stored(&self, osd: i32, name: &str) -> Option<Vec<u8>> {
        let loc = self.loc(name);
        let pg = self.map.object_pg(self.pool, name, None, "").unwrap();
        execute(
            &*self.stores[&osd],
            CollectionId(pg),
            &loc,
            &[OpKind::Read { offset: 0, len: 0 }],
            &Bytes::new(),
            Stamp {
                version: 0,
                mtime_ns: 0,
            },
            &Limits::default(),
        )
        .ok()
        .map(|d| d.out_data.into_bytes().to_vec())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_every_replica_before_the_ack() {
    let mut c = Cluster::new().await;
    for i in 0..60u32 {
        let name = format!("obj{i}");
        let body = vec![(i % 251) as u8; (i as usize * 97) % 5000];
        let op = c.op(
            &name,
            vec![OpKind::WriteFull {
                len: body.len() as u64,
            }],
        );
        let (reply, _) = c.send(op, &body).await;
        assert_eq!(reply.error, None, "{name}");
        for osd in 0..3 {
            assert_eq!(
                c.stored(osd, &name).as_deref(),
                Some(&body[..]),
                "{name} on osd.{osd}"
            );
        }
        let op = c.op(&name, vec![OpKind::Read { offset: 0, len: 0 }]);
        let (reply, data) = c.send(op, &[]).await;
        assert_eq!(reply.error, None);
        assert_eq!(&data[..], &body[..]);
    }
}

/// Two processes authenticated as one entity (as every daemon and tool using `client.admin`)
/// number their ops independently: the same request id from another client instance is a new
/// write and must be applied; a resend from the same instance is still answered without being
/// applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_reqid_from_another_instance_of_one_entity_is_a_new_write() {
    let mut c = Cluster::new().await;
    let mut first = c.op("shared", vec![OpKind::Append { len: 3 }]);
    first.reqid = 777;
    first.instance = "client.test.aaaa".into();
    assert_eq!(c.send(first.clone(), b"one").await.0.error, None);
    let mut second = first.clone();
    second.instance = "client.test.bbbb".into();
    assert_eq!(c.send(second.clone(), b"two").await.0.error, None);
    for osd in 0..3 {
        assert_eq!(
            c.stored(osd, "shared").as_deref(),
            Some(&b"onetwo"[..]),
            "osd.{osd}: the second instance's write was taken for a resend"
        );
    }
    // resends (same instance, same reqid) are answered, not applied again
    assert_eq!(c.send(first, b"one").await.0.error, None);
    assert_eq!(c.send(second, b"two").await.0.error, None);
    for osd in 0..3 {
        assert_eq!(c.stored(osd, "shared").as_deref(), Some(&b"onetwo"[..]));
    }
    assert_eq!(
        kelp_osd::service::reqid_owner("client.test", "client.test.aaaa"),
        "client.test.aaaa"
    );
    assert_eq!(kelp_osd::service::reqid_owner("osd.1", ""), "osd.1");
    // an instance claiming another entity's name stays apart from that entity's own
    assert_eq!(
        kelp_osd::service::reqid_owner("client.evil", "client.admin.aaaa"),
        "client.evil/client.admin.aaaa"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_osd_unknown_pool_and_bad_pg_are_refused() {
    let mut c = Cluster::new().await;
    let op = c.op("x", vec![OpKind::WriteFull { len: 1 }]);
    let primary = c.map.pg_mapping(op.pg).unwrap().acting_primary;
    let other = (0..3).find(|&o| o != primary).unwrap();
    let (reply, _) = c.osds[&other]
        .client_op("client.test", op.clone(), Bytes::from_static(b"x"))
        .await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::Misdirected);
    let mut bad = op.clone();
    bad.pg.seed = (bad.pg.seed + 1) % 8;
    let (reply, _) = c.osds[&primary]
        .client_op("client.test", bad, Bytes::from_static(b"x"))
        .await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::Invalid);
    let mut nopool = op.clone();
    nopool.pg.pool = kelp_types::PoolId(99);
    let (reply, _) = c.osds[&primary]
        .client_op("client.test", nopool, Bytes::from_static(b"x"))
        .await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::NoSuchPool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_than_min_size_replicas_stops_io() {
    let mut c = Cluster::new().await;
    let op = c.op("m", vec![OpKind::WriteFull { len: 1 }]);
    let m = c.map.pg_mapping(op.pg).unwrap();
    // take the two non-primaries down: 1 of 3 left, min_size 2
    for &osd in &m.acting[1..] {
        let inc = c.map.propose_osd_down(osd).unwrap().unwrap();
        c.publish(inc).await;
    }
    let op = c.op("m", vec![OpKind::WriteFull { len: 1 }]);
    let (reply, _) = c.send(op, b"1").await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::Inactive);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_replica_blocks_the_pg_until_the_map_drops_it() {
    let mut c = Cluster::new().await;
    let op = c.op("f", vec![OpKind::WriteFull { len: 4 }]);
    let m = c.map.pg_mapping(op.pg).unwrap();
    let victim = m.acting[2];
    c.peers.dead.lock().unwrap().insert(victim);
    let (reply, _) = c.send(op.clone(), b"data").await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::Io, "not acknowledged");
    // the retry is refused while the failed replica is still acting
    let (reply, _) = c.send(op.clone(), b"data").await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::Inactive);
    // the monitors mark it down: the retry is answered (the write is on both remaining members)
    let inc = c.map.propose_osd_down(victim).unwrap().unwrap();
    c.publish(inc).await;
    let mut retry = op.clone();
    retry.epoch = c.map.epoch;
    let (reply, _) = c.send(retry, b"data").await;
    assert_eq!(reply.error, None);
    for &osd in &m.acting[..2] {
        assert_eq!(c.stored(osd, "f").as_deref(), Some(&b"data"[..]));
    }
    assert_eq!(c.stored(victim, "f"), None);
    // and new writes go on with two replicas (min_size 2)
    let op = c.op("f", vec![OpKind::Append { len: 1 }]);
    assert_eq!(c.send(op, b"!").await.0.error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_that_missed_writes_is_recovered() {
    let mut c = Cluster::new().await;
    let names: Vec<String> = (0..40).map(|i| format!("r{i}")).collect();
    for n in &names {
        let op = c.op(n, vec![OpKind::WriteFull { len: 5 }]);
        assert_eq!(c.send(op, b"first").await.0.error, None);
    }
    // osd.0 goes down; writes go on with two replicas: overwrite half, delete a few, add new
    let inc = c.map.propose_osd_down(0).unwrap().unwrap();
    c.publish(inc).await;
    for (i, n) in names.iter().enumerate() {
        let op = match i % 4 {
            0 | 1 => c.op(n, vec![OpKind::WriteFull { len: 6 }]),
            2 => c.op(n, vec![OpKind::Remove]),
            _ => continue,
        };
        let data: &[u8] = if i % 4 == 2 { b"" } else { b"second" };
        assert_eq!(c.send(op, data).await.0.error, None, "{n}");
    }
    for i in 0..10 {
        let n = format!("new{i}");
        let op = c.op(&n, vec![OpKind::WriteFull { len: 3 }]);
        assert_eq!(c.send(op, b"new").await.0.error, None);
    }
    // osd.0 comes back: every PG it holds is peered and recovered (a primary before it
    // serves, a replica in the background)
    let addr = c.map.osds[&0].addr.unwrap();
    let inc = c.map.propose_osd_boot(0, addr).unwrap().unwrap();
    c.publish(inc).await;
    for (i, n) in names.iter().enumerate() {
        let want: Option<&[u8]> = match i % 4 {
            0 | 1 => Some(b"second"),
            2 => None,
            _ => Some(b"first"),
        };
        for osd in 0..3 {
            assert_eq!(c.stored(osd, n).as_deref(), want, "{n} on osd.{osd}");
        }
        let op = c.op(n, vec![OpKind::Read { offset: 0, len: 0 }]);
        let (reply, data) = c.send(op, b"").await;
        match want {
            Some(w) => assert_eq!(&data[..], w),
            None => assert_eq!(reply.error.unwrap().0, ErrorCode::NotFound),
        }
    }
    for i in 0..10 {
        for osd in 0..3 {
            assert_eq!(
                c.stored(osd, &format!("new{i}")).as_deref(),
                Some(&b"new"[..])
            );
        }
    }
    // and writes continue on all three
    let op = c.op("r3", vec![OpKind::Append { len: 1 }]);
    assert_eq!(c.send(op, b"!").await.0.error, None);
    for osd in 0..3 {
        assert_eq!(c.stored(osd, "r3").as_deref(), Some(&b"first!"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_to_one_object_apply_in_one_order_everywhere() {
    let mut c = Cluster::new().await;
    let ops: Vec<OsdOp> = (0..100)
        .map(|_| c.op("log", vec![OpKind::Append { len: 4 }]))
        .collect();
    let c = Arc::new(c);
    let mut tasks = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let (reply, _) = c.send(op, &(i as u32).to_le_bytes()).await;
            assert_eq!(reply.error, None);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let on0 = c.stored(0, "log").unwrap();
    assert_eq!(on0.len(), 400);
    assert_eq!(c.stored(1, "log").unwrap(), on0);
    assert_eq!(c.stored(2, "log").unwrap(), on0);
    let mut seen: Vec<u32> = on0
        .chunks(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..100).collect::<Vec<_>>(),
        "every append exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_writes_survive_replica_writes_arriving_out_of_order() {
    let mut c = Cluster::new().await;
    c.peers.reorder.store(true, Ordering::Relaxed);
    let ops: Vec<OsdOp> = (0..40)
        .map(|_| c.op("log", vec![OpKind::Append { len: 4 }]))
        .collect();
    let c = Arc::new(c);
    let mut tasks = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let (reply, _) = c.send(op, &(i as u32).to_le_bytes()).await;
            assert_eq!(reply.error, None);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let on0 = c.stored(0, "log").unwrap();
    assert_eq!(on0.len(), 160);
    assert_eq!(c.stored(1, "log").unwrap(), on0);
    assert_eq!(c.stored(2, "log").unwrap(), on0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_waits_for_a_write_that_is_not_yet_on_every_replica() {
    let mut c = Cluster::new().await;
    let op = c.op("obj", vec![OpKind::WriteFull { len: 3 }]);
    assert_eq!(c.send(op, b"old").await.0.error, None);

    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *c.peers.hold.lock().unwrap() = Some(gate.clone());
    let write = c.op("obj", vec![OpKind::WriteFull { len: 3 }]);
    let read = c.op("obj", vec![OpKind::Read { offset: 0, len: 0 }]);
    let c = Arc::new(c);
    let writer = {
        let c = c.clone();
        tokio::spawn(async move { c.send(write, b"new").await })
    };
    // The primary has applied the write locally; its replicas are held back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reader = {
        let c = c.clone();
        tokio::spawn(async move { c.send(read, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !writer.is_finished(),
        "acked before the replicas applied it"
    );
    assert!(
        !reader.is_finished(),
        "a read returned data that is only on the primary"
    );
    gate.add_permits(2);
    let (reply, _) = writer.await.unwrap();
    assert_eq!(reply.error, None);
    let (reply, data) = reader.await.unwrap();
    assert_eq!(reply.error, None);
    assert_eq!(&data[..], b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_replica_fails_the_write_with_full_and_the_pg_keeps_serving() {
    // osd.2 can hold 64 KiB of data; the others are unbounded.
    let mut c = Cluster::with_capacity(|id| (id == 2).then_some(64 << 10)).await;
    for svc in c.osds.values() {
        // Only the replica's real lack of space is under test, not the failsafe ratio.
        svc.stats().set_full_ratio_ppm(1_000_000);
    }
    let name = (0..100)
        .map(|i| format!("obj{i}"))
        .find(|n| {
            let pg = c.map.object_pg(c.pool, n, None, "").unwrap();
            c.map.pg_mapping(pg).unwrap().acting_primary != 2
        })
        .unwrap();
    let keep = vec![7u8; 10 << 10];
    let op = c.op(
        &name,
        vec![OpKind::WriteFull {
            len: keep.len() as u64,
        }],
    );
    assert_eq!(c.send(op, &keep).await.0.error, None);

    let big = vec![9u8; 100 << 10];
    let op = c.op(
        &name,
        vec![OpKind::Append {
            len: big.len() as u64,
        }],
    );
    let started = std::time::Instant::now();
    let (reply, _) = c.send(op, &big).await;
    let (code, msg) = reply.error.expect("refused");
    assert_eq!(code, ErrorCode::Full, "{msg}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The refused write is rolled back everywhere and the PG serves again.
    c.wait_active().await;
    for osd in 0..3 {
        assert_eq!(
            c.stored(osd, &name).as_deref(),
            Some(&keep[..]),
            "osd.{osd}"
        );
    }
    let op = c.op(&name, vec![OpKind::Read { offset: 0, len: 0 }]);
    let (reply, data) = c.send(op, &[]).await;
    assert_eq!(reply.error, None);
    assert_eq!(&data[..], &keep[..]);
    let op = c.op(&name, vec![OpKind::Append { len: 3 }]);
    assert_eq!(
        c.send(op, b"abc").await.0.error,
        None,
        "small writes still fit"
    );
    let op = c.op(&name, vec![OpKind::Remove]);
    assert_eq!(c.send(op, &[]).await.0.error, None);
    for osd in 0..3 {
        assert_eq!(c.stored(osd, &name), None, "osd.{osd}");
    }
}

/// Per inconsistent object: its errors, the bad members, the authoritative member.
type Finding = (Vec<ShardError>, Vec<i32>, Option<i32>);

/// Waits for a scrub request queued on `osd` for `pg` to complete; returns the inconsistencies.
async fn scrub_and_wait(
    osd: &Arc<OsdService>,
    pg: kelp_types::PgId,
    epoch: u32,
    kind: PgCommandKind,
) -> Vec<kelp_proto::InconsistentObject> {
    let seq = osd
        .pg_command(PgCommand { pg, epoch, kind })
        .await
        .queued_seq;
    for _ in 0..500 {
        let r = osd
            .pg_command(PgCommand {
                pg,
                epoch,
                kind: PgCommandKind::ListInconsistent,
            })
            .await;
        assert_eq!(r.error, None);
        if r.summary.completed_seq >= seq && !r.summary.scrubbing {
            assert_eq!(r.summary.last_error, None);
            return r.inconsistent;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the {kind:?} of {pg} did not complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_finds_missing_mismatched_and_stale_copies_and_repair_fixes_them() {
    let mut c = Cluster::new().await;
    let _scrubbers: Vec<_> = c.osds.values().map(|s| s.start_scrubber()).collect();
    // Five objects in one PG, plus one written and then deleted.
    let pg = c.map.object_pg(c.pool, "o0", None, "").unwrap();
    let names: Vec<String> = (0..200)
        .map(|i| format!("o{i}"))
        .filter(|n| c.map.object_pg(c.pool, n, None, "").unwrap() == pg)
        .take(6)
        .collect();
    assert_eq!(names.len(), 6);
    for (i, n) in names.iter().enumerate() {
        let body = vec![i as u8 + 1; 3000 + i * 100];
        let op = c.op(
            n,
            vec![
                OpKind::WriteFull {
                    len: body.len() as u64,
                },
                OpKind::OmapSet {
                    entries: vec![("k".into(), 1)],
                },
            ],
        );
        let mut data = body.clone();
        data.push(b'v');
        assert_eq!(c.send(op, &data).await.0.error, None);
    }
    let op = c.op(&names[5], vec![OpKind::Remove]);
    assert_eq!(c.send(op, &[]).await.0.error, None);
    let m = c.map.pg_mapping(pg).unwrap();
    let (primary, r1, r2) = (m.acting[0], m.acting[1], m.acting[2]);
    let coll = CollectionId(pg);
    let oid = |n: &str| kelp_osd::object_id(&c.loc(n));
    // Damage: missing on r1, other bytes on r2, omap on the primary, truncated on r2, and the
    // deleted object back on r1.
    let damage = |osd: i32, f: &dyn Fn(&mut Transaction)| {
        let mut t = Transaction::new();
        f(&mut t);
        c.stores[&osd].submit(t).unwrap().wait().unwrap();
    };
    damage(r1, &|t| {
        t.remove(coll, &oid(&names[0]));
    });
    damage(r2, &|t| {
        t.write(coll, &oid(&names[1]), 10, vec![0xee; 4]);
    });
    damage(primary, &|t| {
        t.omap_set(
            coll,
            &oid(&names[2]),
            [(b"k".to_vec(), b"x".to_vec())].into_iter().collect(),
        );
    });
    damage(r2, &|t| {
        t.truncate(coll, &oid(&names[3]), 100);
    });
    damage(r1, &|t| {
        t.touch(coll, &oid(&names[5]));
    });
    let epoch = c.map.epoch;
    let osd = c.osds[&primary].clone();

    let by_name = |bad: &[kelp_proto::InconsistentObject]| -> HashMap<String, Finding> {
        bad.iter()
            .map(|o| (o.name.clone(), (o.errors.clone(), o.bad_osds(), o.auth_osd)))
            .collect()
    };
    // Shallow: everything but the same-size data change.
    let bad = by_name(&scrub_and_wait(&osd, pg, epoch, PgCommandKind::Scrub { deep: false }).await);
    assert_eq!(bad.len(), 4, "{bad:?}");
    assert_eq!(
        bad[&names[0]],
        (vec![ShardError::Missing], vec![r1], Some(primary))
    );
    assert_eq!(
        bad[&names[2]],
        (
            vec![ShardError::OmapDigestMismatch],
            vec![primary],
            Some(r1.min(r2))
        )
    );
    assert_eq!(
        bad[&names[3]],
        (vec![ShardError::SizeMismatch], vec![r2], Some(primary))
    );
    assert_eq!(bad[&names[5]], (vec![ShardError::Stale], vec![r1], None));
    // Deep: the data change too.
    let bad = by_name(&scrub_and_wait(&osd, pg, epoch, PgCommandKind::Scrub { deep: true }).await);
    assert_eq!(bad.len(), 5, "{bad:?}");
    assert_eq!(
        bad[&names[1]],
        (
            vec![ShardError::DataDigestMismatch],
            vec![r2],
            Some(primary)
        )
    );
    // Repair, then every copy is the written one and a deep scrub is clean.
    let left = scrub_and_wait(&osd, pg, epoch, PgCommandKind::Repair).await;
    assert!(left.is_empty(), "{left:?}");
    for (i, n) in names.iter().enumerate().take(5) {
        for o in 0..3 {
            assert_eq!(
                c.stored(o, n),
                Some(vec![i as u8 + 1; 3000 + i * 100]),
                "{n} on osd.{o}"
            );
        }
    }
    assert_eq!(c.stored(r1, &names[5]), None);
    let left = scrub_and_wait(&osd, pg, epoch, PgCommandKind::Scrub { deep: true }).await;
    assert!(left.is_empty(), "{left:?}");
    let summary = osd
        .pg_command(PgCommand {
            pg,
            epoch,
            kind: PgCommandKind::Status,
        })
        .await
        .summary;
    assert_eq!(summary.num_scrub_errors, 0);
    assert_eq!(summary.objects_scrubbed, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrubs_under_concurrent_writes_report_no_false_inconsistencies() {
    let c = Cluster::new().await;
    let _scrubbers: Vec<_> = c.osds.values().map(|s| s.start_scrubber()).collect();
    for s in c.osds.values() {
        s.set_scrub_config(kelp_osd::ScrubConfig {
            chunk_max: 2,
            ..kelp_osd::ScrubConfig::default()
        });
    }
    // The members' scrub maps are taken 5 ms after the primary's: without the chunk's write
    // block, writes landing in between would show as version and size mismatches.
    c.peers.slow_scrub.store(true, Ordering::Relaxed);
    let pg = c.map.object_pg(c.pool, "o0", None, "").unwrap();
    let names: Vec<String> = (0..400)
        .map(|i| format!("o{i}"))
        .filter(|n| c.map.object_pg(c.pool, n, None, "").unwrap() == pg)
        .take(8)
        .collect();
    let primary = c.osds[&c.map.pg_mapping(pg).unwrap().acting_primary].clone();
    let epoch = c.map.epoch;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let stop = stop.clone();
            let primary = primary.clone();
            let pool = c.pool;
            let names = names.clone();
            tokio::spawn(async move {
                let mut n = w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let name = &names[n as usize % names.len()];
                    let body = vec![n as u8; 1000 + (n as usize % 5) * 300];
                    let op = OsdOp {
                        reqid: 10_000_000 + n,
                        epoch,
                        pg,
                        object: ObjectLocator {
                            pool,
                            namespace: String::new(),
                            key: None,
                            name: name.clone(),
                        },
                        ops: vec![OpKind::WriteFull {
                            len: body.len() as u64,
                        }],
                        instance: "client.test.1".into(),
                    };
                    let (reply, _) = primary
                        .client_op("client.writer", op, Bytes::from(body))
                        .await;
                    assert_eq!(reply.error, None);
                    n += 1;
                }
                n - w * 1_000_000
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for round in 0..6 {
        let left = scrub_and_wait(&primary, pg, epoch, PgCommandKind::Scrub { deep: true }).await;
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let mut writes = 0;
    for w in writers {
        writes += w.await.unwrap();
    }
    assert!(writes > 20, "only {writes} writes during the scrubs");
}

/// Deleting a pool: every OSD stops serving its PGs with the map that removes it (client ops
/// refused as for an unknown pool), and each OSD's remover (`pg_remover`) deletes every
/// collection of the pool, objects with omap included, leaving another pool's untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pools_pgs_stop_serving_and_are_removed() {
    let mut c = Cluster::new().await;
    let (keep, inc) = c
        .map
        .propose_pool_create(&PoolSpec {
            name: "keep".into(),
            pg_num: Some(4),
            size: Some(3),
            ..PoolSpec::default()
        })
        .unwrap();
    c.publish(inc).await;
    for i in 0..40u32 {
        let name = format!("obj{i}");
        let body = vec![i as u8; 3000];
        let op = c.op(&name, vec![OpKind::WriteFull { len: 3000 }]);
        assert_eq!(c.send(op, &body).await.0.error, None);
        let op = c.op(
            &name,
            vec![OpKind::OmapSet {
                entries: vec![("k".to_string(), 1)],
            }],
        );
        assert_eq!(c.send(op, b"v").await.0.error, None, "omap of {name}");
    }
    let read = c.op("obj1", vec![OpKind::Read { offset: 0, len: 0 }]);
    let primary = c.primary(&read);
    let pool = c.pool;
    let colls_of = |store: &MemStore, p: u32| {
        store
            .list_collections()
            .unwrap()
            .into_iter()
            .filter(|coll| coll.0.pool.0 == p)
            .count()
    };
    for store in c.stores.values() {
        assert_eq!(colls_of(store, pool), 8);
        assert_eq!(colls_of(store, keep), 4);
    }

    let inc = c.map.propose_pool_delete("data").unwrap();
    c.map.apply(&inc).unwrap();
    for svc in c.osds.values() {
        svc.set_map(c.map.clone()).await.unwrap();
    }
    let mut read = read;
    read.epoch = c.map.epoch;
    let (reply, _) = primary.client_op("client.test", read, Bytes::new()).await;
    assert_eq!(reply.error.unwrap().0, ErrorCode::NoSuchPool);

    let removers: Vec<_> = c.osds.values().map(kelp_osd::pg_remover::start).collect();
    let mut waited = 0;
    while c.stores.values().any(|s| colls_of(s, pool) > 0) {
        waited += 1;
        assert!(
            waited < 1000,
            "the deleted pool's collections are still there"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for (osd, store) in &c.stores {
        assert_eq!(colls_of(store, keep), 4, "osd.{osd} kept the other pool");
        let work = c.osds[osd].stats().work();
        assert_eq!(
            (work.deleting_pgs_left, work.deleting_objects_left),
            (0, 0),
            "osd.{osd}: nothing left to remove"
        );
    }
    for r in removers {
        r.abort();
    }
}

//! The seams between the OSD service and the workers around it: how an OSD reaches its peers
//! (`Peers`, the network) and what every worker needs from the OSD it runs in (`PgHost`).
//!
//! `recovery` and `scrub` are written against `PgHost` (and each against its own extension of
//! it, `recovery::RecoveryHost` and `scrub::ScrubHost`), never against `OsdService`: the service
//! implements these traits and calls the workers, and no worker module refers back to the
//! service. This module depends only on the leaf modules (`error`, `pg`), so the module graph
//! stays one-way: `service` → {`recovery`, `scrub`, `stats`} → `host`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use kelp_maps::OsdMap;
use kelp_proto::{
    EcRead, EcReadReply, PgPull, PgPullReply, PgPush, PgPushReply, PgQuery, PgQueryReply, PgSync,
    PgSyncReply, RepOp, RepOpReply, ScrubMapReply, ScrubMapRequest,
};
use kelp_store::{ObjectStore, Transaction};
use kelp_types::PgId;

use crate::error::OsdError;
use crate::pg::PgHandle;

/// How an OSD reaches its peers (replica writes, peering, recovery).
///
/// An `Err` means the request or its reply did not make it (`OsdError::Msgr`,
/// `OsdError::PeerUnreachable`, `OsdError::Decode`); an error the peer *answered* with travels
/// in the reply's own `error` field.
#[async_trait::async_trait]
pub trait Peers: Send + Sync {
    async fn repop(
        &self,
        osd: i32,
        addr: SocketAddr,
        op: RepOp,
        data: Bytes,
    ) -> Result<RepOpReply, OsdError>;
    async fn query(&self, osd: i32, addr: SocketAddr, q: PgQuery)
    -> Result<PgQueryReply, OsdError>;
    async fn pull(
        &self,
        osd: i32,
        addr: SocketAddr,
        p: PgPull,
    ) -> Result<(PgPullReply, Bytes), OsdError>;
    async fn sync(&self, osd: i32, addr: SocketAddr, s: PgSync) -> Result<PgSyncReply, OsdError>;
    /// Scrub: a member's scrub map of a range of a PG.
    async fn scrub_map(
        &self,
        osd: i32,
        addr: SocketAddr,
        req: ScrubMapRequest,
    ) -> Result<ScrubMapReply, OsdError>;
    /// Repair: install the authoritative copy of one object on a member.
    async fn push(
        &self,
        osd: i32,
        addr: SocketAddr,
        p: PgPush,
        data: Bytes,
    ) -> Result<PgPushReply, OsdError>;
    /// Erasure-coded pools: byte ranges of a member's shard of an object.
    async fn ec_read(
        &self,
        osd: i32,
        addr: SocketAddr,
        r: EcRead,
    ) -> Result<(EcReadReply, Bytes), OsdError>;
}

/// What a worker (peering and recovery, scrub and repair) needs from the OSD it runs in: who it
/// is, its map, its PGs, its store and its peers. Nothing about client ops.
pub(crate) trait PgHost: Send + Sync + 'static {
    /// This OSD's id.
    fn id(&self) -> i32;

    /// The OSD map in force.
    fn map(&self) -> Arc<OsdMap>;

    /// The map once it is at least `epoch` (waiting a bounded time for it; after that, the
    /// map in force, which may be older).
    fn map_at_least(&self, epoch: u32) -> impl Future<Output = Arc<OsdMap>> + Send;

    /// A PG this OSD has open.
    fn pg_handle(&self, pg: PgId) -> Option<PgHandle>;

    /// The OSD's object store.
    fn store(&self) -> Arc<dyn ObjectStore>;

    /// How this OSD reaches the others.
    fn peers(&self) -> Arc<dyn Peers>;

    /// Submits a transaction to the store and waits until it is durable.
    fn commit(&self, txn: Transaction) -> impl Future<Output = Result<(), OsdError>> + Send {
        let store = self.store();
        async move { Ok(store.submit(txn)?.await?) }
    }
}

/// A stand-in OSD for unit tests of the workers: a map, a `MemStore`, the PGs opened in it and
/// peers that never answer; `extra` holds what a worker's own trait needs (the `Scrubber`, the
/// recovery state), whose impl lives next to that worker's tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use kelp_maps::PoolSpec;
    use kelp_store::{CollectionId, MemStore};
    use tokio::sync::RwLock;

    use super::*;
    use crate::pg::PgState;
    use crate::pglog::PgMeta;

    /// `osds` OSDs, up, and one pool (id returned) of `pg_num` PGs of size 3.
    pub(crate) fn map(osds: i32, pg_num: u32) -> (OsdMap, u32) {
        let mut map = OsdMap::new("fsid", "osd").expect("map");
        for i in 0..osds {
            let (id, inc) = map
                .propose_osd_create(&format!("u{i}"), "localhost", 0x10000)
                .expect("create");
            map.apply(&inc.expect("new osd")).expect("apply");
            let addr: SocketAddr = format!("127.0.0.1:{}", 7000 + i).parse().expect("addr");
            let boot = map.propose_osd_boot(id, addr).expect("boot");
            map.apply(&boot.expect("boot inc")).expect("apply");
        }
        let (pool, inc) = map
            .propose_pool_create(&PoolSpec {
                name: "data".into(),
                pg_num: Some(pg_num),
                size: Some(3),
                ..PoolSpec::default()
            })
            .expect("pool");
        map.apply(&inc).expect("apply");
        (map, pool)
    }

    pub(crate) struct FakeOsd<X> {
        pub(crate) id: i32,
        pub(crate) map: Arc<OsdMap>,
        pub(crate) store: Arc<MemStore>,
        pgs: Mutex<HashMap<PgId, PgHandle>>,
        pub(crate) extra: X,
    }

    impl<X> FakeOsd<X> {
        pub(crate) fn new(id: i32, map: OsdMap, extra: X) -> Self {
            FakeOsd {
                id,
                map: Arc::new(map),
                store: Arc::new(MemStore::new()),
                pgs: Mutex::new(HashMap::new()),
                extra,
            }
        }

        /// Creates an empty PG in the store and opens it.
        pub(crate) fn open(&self, pg: PgId) -> PgHandle {
            let mut txn = Transaction::new();
            let meta = PgMeta::create(&mut txn, CollectionId(pg), 100);
            self.store
                .submit(txn)
                .expect("submit")
                .wait()
                .expect("commit");
            let handle = Arc::new(RwLock::new(PgState::new(meta)));
            self.pgs.lock().expect("pgs").insert(pg, handle.clone());
            handle
        }
    }

    impl<X: Send + Sync + 'static> PgHost for FakeOsd<X> {
        fn id(&self) -> i32 {
            self.id
        }

        fn map(&self) -> Arc<OsdMap> {
            self.map.clone()
        }

        async fn map_at_least(&self, _epoch: u32) -> Arc<OsdMap> {
            self.map.clone()
        }

        fn pg_handle(&self, pg: PgId) -> Option<PgHandle> {
            self.pgs.lock().expect("pgs").get(&pg).cloned()
        }

        fn store(&self) -> Arc<dyn ObjectStore> {
            self.store.clone()
        }

        fn peers(&self) -> Arc<dyn Peers> {
            Arc::new(Unreachable)
        }
    }

    /// Peers that never answer.
    struct Unreachable;

    fn unreachable<T>(osd: i32) -> Result<T, OsdError> {
        Err(OsdError::PeerUnreachable {
            osd,
            reason: "unit test without peers".into(),
        })
    }

    #[async_trait::async_trait]
    impl Peers for Unreachable {
        async fn repop(
            &self,
            osd: i32,
            _: SocketAddr,
            _: RepOp,
            _: Bytes,
        ) -> Result<RepOpReply, OsdError> {
            unreachable(osd)
        }
        async fn query(
            &self,
            osd: i32,
            _: SocketAddr,
            _: PgQuery,
        ) -> Result<PgQueryReply, OsdError> {
            unreachable(osd)
        }
        async fn pull(
            &self,
            osd: i32,
            _: SocketAddr,
            _: PgPull,
        ) -> Result<(PgPullReply, Bytes), OsdError> {
            unreachable(osd)
        }
        async fn sync(&self, osd: i32, _: SocketAddr, _: PgSync) -> Result<PgSyncReply, OsdError> {
            unreachable(osd)
        }
        async fn scrub_map(
            &self,
            osd: i32,
            _: SocketAddr,
            _: ScrubMapRequest,
        ) -> Result<ScrubMapReply, OsdError> {
            unreachable(osd)
        }
        async fn push(
            &self,
            osd: i32,
            _: SocketAddr,
            _: PgPush,
            _: Bytes,
        ) -> Result<PgPushReply, OsdError> {
            unreachable(osd)
        }
        async fn ec_read(
            &self,
            osd: i32,
            _: SocketAddr,
            _: EcRead,
        ) -> Result<(EcReadReply, Bytes), OsdError> {
            unreachable(osd)
        }
    }
}

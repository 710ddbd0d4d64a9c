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
    PgPull, PgPullReply, PgPush, PgPushReply, PgQuery, PgQueryReply, PgSync, PgSyncReply, RepOp,
    RepOpReply, ScrubMapReply, ScrubMapRequest,
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

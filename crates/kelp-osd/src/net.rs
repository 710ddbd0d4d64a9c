//! The OSD on the network: a messenger dispatcher that decodes requests and hands them to the
//! `OsdService`, and `Peers` implemented over the messenger for primary → replica writes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kelp_msgr::{Dispatcher, Messenger, RemoteError, Request, Response};
use kelp_proto::{
    EcRead, EcReadReply, OsdPing, OsdPingReply, OsdScrubCommand, PgCommand, PgList, PgPull,
    PgPullReply, PgPush, PgPushReply, PgQuery, PgQueryReply, PgSync, PgSyncReply, RepOp,
    RepOpReply, ScrubMapReply, ScrubMapRequest, decode, encode, msg_type,
};

use crate::error::OsdError;
use crate::host::Peers;
use crate::service::OsdService;

/// Application error code for a request the OSD could not decode.
pub const BAD_REQUEST: u32 = 1;

/// Routes OSD requests arriving on the messenger.
pub struct OsdDispatcher {
    pub service: Arc<OsdService>,
}

#[async_trait::async_trait]
impl Dispatcher for OsdDispatcher {
    async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
        let bad = |e: kelp_proto::ProtoError| RemoteError::new(BAD_REQUEST, e.to_string());
        match req.msg_type {
            msg_type::OSD_OP => {
                let op = decode(&req.meta, "OsdOp").map_err(bad)?;
                let client = req.peer.entity().to_string();
                let (reply, data) = self.service.client_op(&client, op, req.data).await;
                Ok(Response::new(msg_type::OSD_OP, encode(&reply), data))
            }
            msg_type::OSD_REPOP => {
                let op: RepOp = decode(&req.meta, "RepOp").map_err(bad)?;
                if !req.peer.entity().starts_with("osd.") {
                    return Err(RemoteError::new(
                        BAD_REQUEST,
                        format!("{} may not send replica writes", req.peer.entity()),
                    ));
                }
                let reply = self.service.repop(op, req.data).await;
                Ok(Response::new(
                    msg_type::OSD_REPOP,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_PG_QUERY
            | msg_type::OSD_EC_READ
            | msg_type::OSD_PG_PULL
            | msg_type::OSD_PG_SYNC
            | msg_type::OSD_SCRUB_MAP
            | msg_type::OSD_PG_PUSH
                if !req.peer.entity().starts_with("osd.") =>
            {
                Err(RemoteError::new(
                    BAD_REQUEST,
                    format!("{} may not take part in peering", req.peer.entity()),
                ))
            }
            msg_type::OSD_PG_QUERY => {
                let q: PgQuery = decode(&req.meta, "PgQuery").map_err(bad)?;
                let reply = self.service.pg_query(q).await;
                Ok(Response::new(
                    msg_type::OSD_PG_QUERY,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_EC_READ => {
                let r: EcRead = decode(&req.meta, "EcRead").map_err(bad)?;
                let (reply, data) = self.service.ec_read(r).await;
                Ok(Response::new(msg_type::OSD_EC_READ, encode(&reply), data))
            }
            msg_type::OSD_PG_PULL => {
                let p: PgPull = decode(&req.meta, "PgPull").map_err(bad)?;
                let (reply, data) = self.service.pg_pull(p).await;
                Ok(Response::new(msg_type::OSD_PG_PULL, encode(&reply), data))
            }
            msg_type::OSD_PG_SYNC => {
                let s: PgSync = decode(&req.meta, "PgSync").map_err(bad)?;
                let reply = self.service.pg_sync(s).await;
                Ok(Response::new(
                    msg_type::OSD_PG_SYNC,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_SCRUB_MAP => {
                let r: ScrubMapRequest = decode(&req.meta, "ScrubMapRequest").map_err(bad)?;
                let reply = self.service.scrub_map(r).await;
                Ok(Response::new(
                    msg_type::OSD_SCRUB_MAP,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_PG_PUSH => {
                let p: PgPush = decode(&req.meta, "PgPush").map_err(bad)?;
                let reply = self.service.pg_push(p, req.data).await;
                Ok(Response::new(
                    msg_type::OSD_PG_PUSH,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_PG_COMMAND => {
                let c: PgCommand = decode(&req.meta, "PgCommand").map_err(bad)?;
                let reply = self.service.pg_command(c).await;
                Ok(Response::new(
                    msg_type::OSD_PG_COMMAND,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_SCRUB_COMMAND => {
                let c: OsdScrubCommand = decode(&req.meta, "OsdScrubCommand").map_err(bad)?;
                let reply = self.service.osd_scrub_command(c).await;
                Ok(Response::new(
                    msg_type::OSD_SCRUB_COMMAND,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_PING => {
                // Heartbeats: answered at once, without touching any PG.
                let _ping: OsdPing = decode(&req.meta, "OsdPing").map_err(bad)?;
                let reply = OsdPingReply {
                    osd: self.service.id(),
                    epoch: self.service.map().epoch,
                };
                Ok(Response::new(
                    msg_type::OSD_PING,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            msg_type::OSD_WATCH => {
                let w: kelp_proto::WatchRequest = decode(&req.meta, "WatchRequest").map_err(bad)?;
                let (reply, data) = self.service.watch_op(req.peer, w, req.data).await;
                Ok(Response::new(msg_type::OSD_WATCH, encode(&reply), data))
            }
            msg_type::OSD_PGLS => {
                let list: PgList = decode(&req.meta, "PgList").map_err(bad)?;
                let reply = self.service.pg_list(list).await;
                Ok(Response::new(
                    msg_type::OSD_PGLS,
                    encode(&reply),
                    Bytes::new(),
                ))
            }
            other => Err(RemoteError::new(
                BAD_REQUEST,
                format!("an OSD does not handle msg_type {other:#06x}"),
            )),
        }
    }
}

/// Replica writes over the messenger.
pub struct MsgrPeers {
    pub msgr: Messenger,
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl Peers for MsgrPeers {
    async fn repop(
        &self,
        osd: i32,
        addr: SocketAddr,
        op: RepOp,
        data: Bytes,
    ) -> Result<RepOpReply, OsdError> {
        let conn = self.msgr.connection(addr);
        let resp = conn
            .call(msg_type::OSD_REPOP, encode(&op), data, self.timeout)
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        decode(&resp.meta, "RepOpReply").map_err(|source| OsdError::Decode { osd, source })
    }

    async fn query(
        &self,
        osd: i32,
        addr: SocketAddr,
        q: PgQuery,
    ) -> Result<PgQueryReply, OsdError> {
        let resp = self
            .msgr
            .connection(addr)
            .call(
                msg_type::OSD_PG_QUERY,
                encode(&q),
                Bytes::new(),
                self.timeout,
            )
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        decode(&resp.meta, "PgQueryReply").map_err(|source| OsdError::Decode { osd, source })
    }

    async fn pull(
        &self,
        osd: i32,
        addr: SocketAddr,
        p: PgPull,
    ) -> Result<(PgPullReply, Bytes), OsdError> {
        let resp = self
            .msgr
            .connection(addr)
            .call(
                msg_type::OSD_PG_PULL,
                encode(&p),
                Bytes::new(),
                self.timeout,
            )
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        let reply =
            decode(&resp.meta, "PgPullReply").map_err(|source| OsdError::Decode { osd, source })?;
        Ok((reply, resp.data))
    }

    async fn sync(&self, osd: i32, addr: SocketAddr, s: PgSync) -> Result<PgSyncReply, OsdError> {
        // A sync copies objects: allow it much longer than a single op.
        let resp = self
            .msgr
            .connection(addr)
            .call(
                msg_type::OSD_PG_SYNC,
                encode(&s),
                Bytes::new(),
                self.timeout * 20,
            )
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        decode(&resp.meta, "PgSyncReply").map_err(|source| OsdError::Decode { osd, source })
    }

    async fn scrub_map(
        &self,
        osd: i32,
        addr: SocketAddr,
        req: ScrubMapRequest,
    ) -> Result<ScrubMapReply, OsdError> {
        // A deep scrub map reads every byte of a chunk: allow it longer than one op.
        let resp = self
            .msgr
            .connection(addr)
            .call(
                msg_type::OSD_SCRUB_MAP,
                encode(&req),
                Bytes::new(),
                self.timeout * 4,
            )
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        decode(&resp.meta, "ScrubMapReply").map_err(|source| OsdError::Decode { osd, source })
    }

    async fn push(
        &self,
        osd: i32,
        addr: SocketAddr,
        p: PgPush,
        data: Bytes,
    ) -> Result<PgPushReply, OsdError> {
        let resp = self
            .msgr
            .connection(addr)
            .call(msg_type::OSD_PG_PUSH, encode(&p), data, self.timeout)
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        decode(&resp.meta, "PgPushReply").map_err(|source| OsdError::Decode { osd, source })
    }

    async fn ec_read(
        &self,
        osd: i32,
        addr: SocketAddr,
        r: EcRead,
    ) -> Result<(EcReadReply, Bytes), OsdError> {
        let resp = self
            .msgr
            .connection(addr)
            .call(
                msg_type::OSD_EC_READ,
                encode(&r),
                Bytes::new(),
                self.timeout,
            )
            .await
            .map_err(|source| OsdError::Msgr { osd, addr, source })?;
        let reply =
            decode(&resp.meta, "EcReadReply").map_err(|source| OsdError::Decode { osd, source })?;
        Ok((reply, resp.data))
    }
}

//! Raft traffic between monitors over kelp-msgr (`msg_type::MON_RAFT`).
//!
//! Why over the messenger: monitors already authenticate each other with their `mon.<name>`
//! keys there, and the messenger's connection caching, redial backoff and fault-injection seam
//! come for free. The meta of a `MON_RAFT` request is `[RAFT_WIRE_FORMAT][postcard(RaftRpc)]`,
//! the reply `[RAFT_WIRE_FORMAT][postcard(RaftRpcReply)]` carrying openraft's own result type,
//! so the remote's Raft errors (e.g. a snapshot chunk mismatch) reach the local Raft intact.
//! Only `mon.*` entities may send Raft traffic (checked by the receiving daemon).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use kelp_msgr::{Connection, Messenger, MsgrError};
use kelp_proto::msg_type;
use openraft::BasicNode;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::error::MonError;
use crate::{NodeId, TypeConfig};

/// Format byte of `MON_RAFT` payloads.
pub const RAFT_WIRE_FORMAT: u8 = 1;

/// A Raft request from one monitor to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer, with openraft's result type.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpcReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Bytes {
    let mut out = vec![RAFT_WIRE_FORMAT];
    out.extend(postcard::to_stdvec(v).expect("encoding into a Vec cannot fail"));
    Bytes::from(out)
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, MonError> {
    match b.split_first() {
        Some((&RAFT_WIRE_FORMAT, body)) => {
            postcard::from_bytes(body).map_err(|e| MonError::Corrupt {
                what: "raft message",
                reason: e.to_string(),
            })
        }
        Some((&v, _)) => Err(MonError::UnsupportedFormat {
            what: "raft message",
            got: v,
            max: RAFT_WIRE_FORMAT,
        }),
        None => Err(MonError::Corrupt {
            what: "raft message",
            reason: "empty".into(),
        }),
    }
}

/// Creates one [`MonPeer`] per remote monitor; shares the monitor's messenger.
pub struct MsgrNetwork {
    pub(crate) msgr: Messenger,
}

impl RaftNetworkFactory<TypeConfig> for MsgrNetwork {
    type Network = MonPeer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> MonPeer {
        let conn = node
            .addr
            .parse::<SocketAddr>()
            .map(|a| self.msgr.connection(a))
            .map_err(|source| BadAddr {
                addr: node.addr.clone(),
                source,
            });
        MonPeer {
            target,
            node: node.clone(),
            conn,
        }
    }
}

/// The Raft client side towards one monitor.
pub struct MonPeer {
    target: NodeId,
    node: BasicNode,
    conn: Result<Connection, BadAddr>,
}

/// A peer's address in the Raft membership does not parse: it stays unreachable.
#[derive(Debug, thiserror::Error)]
#[error("bad monitor address '{addr}': {source}")]
struct BadAddr {
    addr: String,
    source: std::net::AddrParseError,
}

/// A peer answered a Raft RPC with a reply of another kind.
#[derive(Debug, thiserror::Error)]
#[error("monitor {target} answered with the wrong reply type")]
struct WrongReply {
    target: NodeId,
}

impl MonPeer {
    async fn call<E: std::error::Error>(
        &self,
        rpc: RaftRpc,
        ttl: Duration,
    ) -> Result<RaftRpcReply, RPCError<NodeId, BasicNode, E>> {
        let conn = self
            .conn
            .as_ref()
            .map_err(|e| RPCError::Unreachable(Unreachable::new(e)))?;
        let resp = conn
            .call(msg_type::MON_RAFT, encode(&rpc), Bytes::new(), ttl)
            .await
            .map_err(|e| match e {
                MsgrError::ConnectFailed { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                other => RPCError::Network(NetworkError::new(&other)),
            })?;
        decode(&resp.meta).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Network(NetworkError::new(&WrongReply {
            target: self.target,
        }))
    }

    fn remote<E: std::error::Error>(
        &self,
        e: RaftError<NodeId, E>,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::RemoteError(RemoteError::new_with_node(
            self.target,
            self.node.clone(),
            e,
        ))
    }
}

impl RaftNetwork<TypeConfig> for MonPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .call(RaftRpc::AppendEntries(rpc), option.hard_ttl())
            .await?
        {
            RaftRpcReply::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(RaftRpc::InstallSnapshot(rpc), option.hard_ttl())
            .await?
        {
            RaftRpcReply::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(RaftRpc::Vote(rpc), option.hard_ttl()).await? {
            RaftRpcReply::Vote(r) => r.map_err(|e| self.remote(e)),
            _ => Err(self.unexpected()),
        }
    }
}

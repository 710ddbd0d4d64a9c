//! Three OSD services on real messengers over 127.0.0.1: client ops, replication and PG
//! listing through the wire protocol, with authentication.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::needless_range_loop)] // ids index parallel vectors of secrets, addresses and services

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kelp_maps::{OsdMap, PoolSpec};
use kelp_msgr::{Keyring, Messenger, generate_secret};
use kelp_osd::net::{MsgrPeers, OsdDispatcher};
use kelp_osd::{OsdConfig, OsdService};
use kelp_proto::{
    ErrorCode, ObjectLocator, OpKind, OsdOp, OsdOpReply, PgList, PgListReply, decode, encode,
    msg_type,
};
use kelp_store::MemStore;
use kelp_types::PgId;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_replicate_and_list_over_the_wire() {
    let mut keyring = Keyring::new();
    let mut secrets = Vec::new();
    for id in 0..3 {
        let s = generate_secret();
        keyring.insert(&format!("osd.{id}"), s.clone()).unwrap();
        secrets.push(s);
    }
    let client_secret = generate_secret();
    keyring
        .insert("client.admin", client_secret.clone())
        .unwrap();
    let keyring = Arc::new(keyring);

    // bind three messengers first, to know the addresses for the map
    let mut msgrs = Vec::new();
    let mut addrs = Vec::new();
    let services: Arc<std::sync::Mutex<Vec<Arc<OsdService>>>> = Arc::default();
    for id in 0..3 {
        let slot = services.clone();
        let dispatcher = Arc::new(LateDispatcher { slot, id });
        let m = Messenger::builder(format!("osd.{id}"))
            .secret(secrets[id].clone())
            .keys(keyring.clone())
            .dispatcher(dispatcher)
            .build()
            .unwrap();
        addrs.push(m.bind("127.0.0.1:0".parse().unwrap()).await.unwrap());
        msgrs.push(m);
    }
    let mut map = OsdMap::new("fsid", "osd").unwrap();
    for id in 0..3 {
        let (osd, inc) = map
            .propose_osd_create(&format!("u{id}"), "localhost", 0x10000)
            .unwrap();
        map.apply(&inc.unwrap()).unwrap();
        map.apply(&map.propose_osd_boot(osd, addrs[id]).unwrap().unwrap())
            .unwrap();
    }
    let (pool, inc) = map
        .propose_pool_create(&PoolSpec {
            name: "p".into(),
            pg_num: Some(4),
            ..PoolSpec::default()
        })
        .unwrap();
    map.apply(&inc).unwrap();
    for id in 0..3 {
        let peers = Arc::new(MsgrPeers {
            msgr: msgrs[id].clone(),
            timeout: T,
        });
        let svc = OsdService::new(
            OsdConfig::new(id as i32),
            Arc::new(MemStore::new()),
            peers,
            map.clone(),
        );
        svc.set_map(map.clone()).await.unwrap();
        services.lock().unwrap().push(svc);
    }
    // wait for the primaries to peer their PGs
    for _ in 0..500 {
        let svcs = services.lock().unwrap().clone();
        let mut all = true;
        for seed in 0..4 {
            let pg = PgId::new(pool, seed);
            let m = map.pg_mapping(pg).unwrap();
            if !svcs[m.acting_primary as usize]
                .is_active(pg, &m.acting)
                .await
            {
                all = false;
            }
        }
        if all {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let client = Messenger::builder("client.admin")
        .secret(client_secret)
        .build()
        .unwrap();
    let mut names = BTreeSet::new();
    for i in 0..40 {
        let name = format!("object-{i}");
        let pg = map.object_pg(pool, &name, None, "").unwrap();
        let primary = map.pg_mapping(pg).unwrap().acting_primary as usize;
        let body = Bytes::from(vec![i as u8; 1000 + i * 10]);
        let op = OsdOp {
            reqid: i as u64,
            epoch: map.epoch,
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
            instance: "client.admin.1".into(),
        };
        let resp = client
            .connection(addrs[primary])
            .call(msg_type::OSD_OP, encode(&op), body.clone(), T)
            .await
            .unwrap();
        let reply: OsdOpReply = decode(&resp.meta, "reply").unwrap();
        assert_eq!(reply.error, None);
        let read = OsdOp {
            reqid: 1000 + i as u64,
            ops: vec![OpKind::Read { offset: 0, len: 0 }],
            ..op
        };
        let resp = client
            .connection(addrs[primary])
            .call(msg_type::OSD_OP, encode(&read), Bytes::new(), T)
            .await
            .unwrap();
        assert_eq!(resp.data, body);
        names.insert(name);
    }
    // list every PG in pages of 3, from its primary
    let mut listed = BTreeSet::new();
    for seed in 0..4 {
        let pg = PgId::new(pool, seed);
        let primary = map.pg_mapping(pg).unwrap().acting_primary as usize;
        let mut cursor = None;
        loop {
            let req = PgList {
                pg,
                epoch: map.epoch,
                cursor,
                max: 3,
            };
            let resp = client
                .connection(addrs[primary])
                .call(msg_type::OSD_PGLS, encode(&req), Bytes::new(), T)
                .await
                .unwrap();
            let reply: PgListReply = decode(&resp.meta, "list").unwrap();
            assert_eq!(reply.error, None);
            for (_, name) in reply.objects {
                assert!(listed.insert(name), "listed twice");
            }
            match reply.next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        // a non-primary refuses to list
        let other = (primary + 1) % 3;
        let req = PgList {
            pg,
            epoch: map.epoch,
            cursor: None,
            max: 3,
        };
        let resp = client
            .connection(addrs[other])
            .call(msg_type::OSD_PGLS, encode(&req), Bytes::new(), T)
            .await
            .unwrap();
        let reply: PgListReply = decode(&resp.meta, "list").unwrap();
        assert_eq!(reply.error.unwrap().0, ErrorCode::Misdirected);
    }
    assert_eq!(listed, names);

    // a client with an unknown key cannot talk to an OSD at all
    let stranger = Messenger::builder("client.admin")
        .secret(generate_secret())
        .build()
        .unwrap();
    assert!(
        stranger
            .connection(addrs[0])
            .call(msg_type::OSD_OP, Bytes::new(), Bytes::new(), T)
            .await
            .is_err()
    );
    // nor may a client send replica writes
    let bogus = client
        .connection(addrs[0])
        .call(msg_type::OSD_REPOP, Bytes::new(), Bytes::new(), T)
        .await;
    assert!(bogus.is_err());
}

/// Dispatcher installed before the services exist (they need the bound addresses).
struct LateDispatcher {
    slot: Arc<std::sync::Mutex<Vec<Arc<OsdService>>>>,
    id: usize,
}

#[async_trait::async_trait]
impl kelp_msgr::Dispatcher for LateDispatcher {
    async fn handle_request(
        &self,
        req: kelp_msgr::Request,
    ) -> Result<kelp_msgr::Response, kelp_msgr::RemoteError> {
        let svc = self.slot.lock().unwrap().get(self.id).cloned();
        match svc {
            Some(service) => OsdDispatcher { service }.handle_request(req).await,
            None => Err(kelp_msgr::RemoteError::new(1, "not ready")),
        }
    }
}

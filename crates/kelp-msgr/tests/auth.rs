//! Authentication and versioning over real sockets: wrong key, unknown entity, replay,
//! version mismatch on either side.

mod common;

use std::time::Duration;

use common::*;
use kelp_msgr::handshake::{self, HsMessage, HsRead, PROTOCOL_VERSION, RejectCode, Transcript};
use kelp_msgr::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_refused_on_both_sides() {
    let c = cluster(MsgrConfig::default()).await;
    let client = Messenger::builder("client.a")
        .secret(generate_secret())
        .build()
        .unwrap();
    match client.connect(c.addr).await {
        Err(MsgrError::AuthFailed { failure, .. }) => {
            assert_eq!(failure, AuthFailure::BadServerProof)
        }
        other => panic!("{other:?}"),
    }
    wait_for("server-side auth failure", || {
        c.server.stats().auth_failures == 1
    })
    .await;
    assert_eq!(c.server.stats().connections_accepted, 0);
    assert!(c.server.peers().is_empty());
    c.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_entity_refused() {
    let c = cluster(MsgrConfig::default()).await;
    let client = Messenger::builder("client.stranger")
        .secret(generate_secret())
        .build()
        .unwrap();
    let e = client.connect(c.addr).await.unwrap_err();
    match &e {
        MsgrError::AuthFailed {
            failure: AuthFailure::Rejected { reason },
            ..
        } => assert_eq!(reason, "unknown entity"),
        other => panic!("{other:?}"),
    }
    assert!(!e.is_retryable());
    wait_for("server-side auth failure", || {
        c.server.stats().auth_failures == 1
    })
    .await;
}

/// Speaks the handshake by hand: a successful exchange is recorded, then its client proof is
/// replayed on a new connection with the same client nonce. The server's fresh nonce makes the
/// old proof worthless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_handshake_answer_refused() {
    let c = cluster(MsgrConfig::default()).await;
    let key = c.keyring.secret_for("client.a").unwrap();
    let client_nonce = [7u8; 32];
    let hello = HsMessage::Hello {
        entity: "client.a".into(),
        nonce: client_nonce,
    };

    // A genuine exchange, captured.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    s.write_all(&hello.encode(PROTOCOL_VERSION)).await.unwrap();
    let HsRead::Message(HsMessage::Challenge {
        entity,
        nonce: server_nonce,
        ..
    }) = handshake::read_message(&mut s, "srv").await.unwrap()
    else {
        panic!("no challenge");
    };
    let captured = handshake::client_proof(
        &key,
        &Transcript {
            version: PROTOCOL_VERSION,
            client_entity: "client.a",
            server_entity: &entity,
            client_nonce: &client_nonce,
            server_nonce: &server_nonce,
        },
    );
    let proof = HsMessage::Proof { proof: captured };
    s.write_all(&proof.encode(PROTOCOL_VERSION)).await.unwrap();
    assert!(matches!(
        handshake::read_message(&mut s, "srv").await.unwrap(),
        HsRead::Message(HsMessage::Accept)
    ));
    drop(s);

    // The replay: same hello, same answer.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    s.write_all(&hello.encode(PROTOCOL_VERSION)).await.unwrap();
    let HsRead::Message(HsMessage::Challenge { nonce: fresh, .. }) =
        handshake::read_message(&mut s, "srv").await.unwrap()
    else {
        panic!("no challenge");
    };
    assert_ne!(fresh, server_nonce, "server nonce repeated");
    s.write_all(&proof.encode(PROTOCOL_VERSION)).await.unwrap();
    match handshake::read_message(&mut s, "srv").await.unwrap() {
        HsRead::Message(HsMessage::Reject { code, .. }) => assert_eq!(code, RejectCode::AuthFailed),
        other => panic!("replay accepted: {other:?}"),
    }
    wait_for("server-side auth failure", || {
        c.server.stats().auth_failures == 1
    })
    .await;
    c.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_mismatch_is_clear_on_both_sides() {
    let c = cluster(MsgrConfig::default()).await;

    // A future (v2) client talking to this server: rejected with a version-mismatch reason.
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    let hello = HsMessage::Hello {
        entity: "client.a".into(),
        nonce: [1; 32],
    };
    s.write_all(&hello.encode(2)).await.unwrap();
    match handshake::read_message(&mut s, "srv").await.unwrap() {
        HsRead::Message(HsMessage::Reject { code, reason }) => {
            assert_eq!(code, RejectCode::VersionMismatch);
            assert!(reason.contains("version 1"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    // This client talking to a (fake) v2 server.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let _ = handshake::read_message(&mut s, "cli").await;
        let reply = HsMessage::Reject {
            code: RejectCode::VersionMismatch,
            reason: "v2 only".into(),
        };
        s.write_all(&reply.encode(2)).await.unwrap();
    });
    let client = c.client("client.a");
    match client.connect(addr).await {
        Err(MsgrError::VersionMismatch { ours, theirs, .. }) => assert_eq!((ours, theirs), (1, 2)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyring_file_drives_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keyring");
    let mut kr = Keyring::new();
    kr.insert("client.admin", generate_secret()).unwrap();
    kr.save(&path).unwrap();
    let loaded = Keyring::load(&path).unwrap();

    let server = Messenger::builder("mon.a")
        .keys(std::sync::Arc::new(loaded.clone()))
        .dispatcher(std::sync::Arc::new(TestHandler::default()))
        .build()
        .unwrap();
    let addr = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let client = Messenger::builder("client.admin")
        .secret(loaded.secret_for("client.admin").unwrap())
        .build()
        .unwrap();
    let conn = client.connect(addr).await.unwrap();
    let peer = conn.peer().unwrap();
    assert_eq!(peer.entity(), "mon.a");
    // The server registers the session just after sending Accept: wait for it.
    wait_for("server-side session", || server.peers().len() == 1).await;
    assert_eq!(server.peers()[0].entity(), "client.admin");
}

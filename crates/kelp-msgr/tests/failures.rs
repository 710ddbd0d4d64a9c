//! Failure semantics: lost connections, reconnects, timeouts, partitions, delays, backoff.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use kelp_msgr::*;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_fails_pending_calls_then_reconnects() {
    let c = cluster(MsgrConfig::default()).await;
    // Only the server sees the policy here, so the client learns of the kill the real way: the
    // server closes its socket and the client reads EOF.
    let client = Messenger::builder("client.a")
        .secret(c.keyring.secret_for("client.a").unwrap())
        .build()
        .unwrap();
    let conn = client.connect(c.addr).await.unwrap();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();

    let mut hung = Vec::new();
    for _ in 0..10 {
        let conn = conn.clone();
        hung.push(tokio::spawn(async move {
            let start = Instant::now();
            let r = conn
                .call(HANG, Bytes::new(), Bytes::new(), Duration::from_secs(30))
                .await;
            (r, start.elapsed())
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(c.policy.drop_connections("osd.1"), 1);
    for h in hung {
        let (r, took) = h.await.unwrap();
        match r {
            Err(e @ MsgrError::ConnectionLost { .. }) => {
                assert!(e.is_retryable());
                assert!(e.to_string().contains("osd.1"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            took < Duration::from_secs(2),
            "pending call failed only after {took:?}"
        );
    }
    // The next call redials transparently.
    let r = conn
        .call(ECHO, &b"again"[..], Bytes::new(), T)
        .await
        .unwrap();
    assert!(r.meta.starts_with(b"again"));
    assert_eq!(client.stats().connections_dialed, 2);
    assert_eq!(c.server.stats().connections_accepted, 2);
    // Counted by the kind of peer: the client redialled an OSD once.
    let osd = client.stats().by_peer[peer_type("osd.1")];
    assert_eq!(osd.reconnects, 1);
    assert_eq!(osd.connections_open, 1);
    assert_eq!(osd.connections_closed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_is_survived() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    c.server.shutdown();
    // Pending or new: every call fails retryably while the server is gone.
    let e = conn
        .call(ECHO, Bytes::new(), Bytes::new(), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "{e}");
    // A new server on the same port: the same Connection handle reaches it.
    let server2 = Messenger::builder("osd.1")
        .keys(std::sync::Arc::new(c.keyring.clone()))
        .dispatcher(c.handler.clone())
        .build()
        .unwrap();
    // The old listener is dropped by its task; retry briefly until the port is free.
    let deadline = Instant::now() + T;
    while let Err(e) = server2.bind(c.addr).await {
        assert!(Instant::now() < deadline, "{e}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + T;
    loop {
        match conn
            .call(ECHO, Bytes::new(), Bytes::new(), Duration::from_secs(2))
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(Instant::now() < deadline, "never reconnected: {e}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_names_peer_and_type() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    let start = Instant::now();
    let e = conn
        .call(HANG, Bytes::new(), Bytes::new(), Duration::from_millis(200))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "{took:?}"
    );
    match &e {
        MsgrError::Timeout { peer, msg_type, .. } => {
            assert!(peer.starts_with("osd.1@"), "{peer}");
            assert_eq!(*msg_type, HANG);
        }
        other => panic!("{other:?}"),
    }
    assert!(e.is_retryable());
    // The connection is still good after a timeout, and the late reply (if any) is ignored.
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_blocks_traffic_and_heal_restores_it() {
    let c = cluster(MsgrConfig::default()).await;
    let osd2 = c.client("osd.2");
    let osd3 = c.client("osd.3");
    let to1_from2 = osd2.connect(c.addr).await.unwrap();
    let to1_from3 = osd3.connect(c.addr).await.unwrap();
    let short = Duration::from_millis(300);

    c.policy.partition("osd.1", "osd.2");
    // Existing connection: frames vanish, the call times out (as over a real partition).
    let e = to1_from2
        .call(ECHO, Bytes::new(), Bytes::new(), short)
        .await
        .unwrap_err();
    assert!(matches!(e, MsgrError::Timeout { .. }), "{e}");
    // One-way messages vanish too (no error: delivery is never confirmed).
    to1_from2
        .send(ECHO, Bytes::new(), Bytes::new())
        .await
        .unwrap();
    // New connections are refused at dial time.
    let osd2_again = c.client("osd.2");
    let e = osd2_again.connect(c.addr).await.unwrap_err();
    assert!(
        matches!(e, MsgrError::ConnectFailed { .. }) && e.is_retryable(),
        "{e}"
    );
    assert!(e.to_string().contains("partitioned"), "{e}");
    // Others are unaffected.
    to1_from3
        .call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();

    c.policy.heal();
    to1_from2
        .call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    osd2_again.connect(c.addr).await.unwrap();

    c.policy.isolate("osd.1");
    let e = to1_from3
        .call(ECHO, Bytes::new(), Bytes::new(), short)
        .await
        .unwrap_err();
    assert!(matches!(e, MsgrError::Timeout { .. }), "{e}");
    c.policy.heal();
    to1_from3
        .call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_delay_slows_calls() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    c.policy
        .set_delay("client.a", "osd.1", Duration::from_millis(100));
    let start = Instant::now();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    // Request and response are each delayed.
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
    c.policy.heal();
    let start = Instant::now();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(200),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_peer_backs_off() {
    // A port with nobody listening.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cfg = MsgrConfig {
        reconnect_backoff_min_ms: 100,
        reconnect_backoff_max_ms: 200,
        ..MsgrConfig::default()
    };
    let client = Messenger::builder("client.a")
        .secret(generate_secret())
        .config(cfg)
        .build()
        .unwrap();
    let e = client.connect(addr).await.unwrap_err();
    assert!(
        matches!(e, MsgrError::ConnectFailed { .. }) && e.is_retryable(),
        "{e}"
    );
    let conn = client.connection(addr);
    // Each failed dial doubles the wait before the next one, capped at 200 ms.
    let start = Instant::now();
    for _ in 0..3 {
        let e = conn
            .call(ECHO, Bytes::new(), Bytes::new(), T)
            .await
            .unwrap_err();
        assert!(matches!(e, MsgrError::ConnectFailed { .. }), "{e}");
    }
    let took = start.elapsed();
    // 100 + 200 + 200 ms of backoff.
    assert!(
        took >= Duration::from_millis(480) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_forgets_and_closes() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    let hung = {
        let conn = conn.clone();
        tokio::spawn(async move { conn.call(HANG, Bytes::new(), Bytes::new(), T).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.disconnect(c.addr);
    assert!(matches!(
        hung.await.unwrap(),
        Err(MsgrError::ConnectionLost { .. })
    ));
    assert!(client.peers().is_empty());
    // A fresh connect dials again.
    client.connect(c.addr).await.unwrap();
    assert_eq!(client.stats().connections_dialed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_closes_a_silent_connection() {
    let cfg = MsgrConfig {
        keepalive_interval_ms: 50,
        keepalive_timeout_ms: 300,
        ..MsgrConfig::default()
    };
    // The server gives up much later, so it is the client's own keepalive check that acts
    // (the policy drops frames, not the FIN a closing server would send).
    let c = cluster(MsgrConfig {
        keepalive_timeout_ms: 10_000,
        ..cfg.clone()
    })
    .await;
    let client = c.client_with("client.a", cfg, None);
    let conn = client.connect(c.addr).await.unwrap();
    // Idle but healthy: keepalives keep it open well past the timeout.
    tokio::time::sleep(Duration::from_millis(700)).await;
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    assert_eq!(client.stats().connections_dialed, 1);

    // A silent path (everything dropped, nothing closed): the pending call fails with
    // ConnectionLost once the keepalive timeout passes, long before its own 30 s deadline.
    let hung = {
        let conn = conn.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let r = conn
                .call(HANG, Bytes::new(), Bytes::new(), Duration::from_secs(30))
                .await;
            (r, start.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.policy.partition("client.a", "osd.1");
    let (r, took) = hung.await.unwrap();
    match r {
        Err(MsgrError::ConnectionLost { reason, .. }) => {
            assert!(reason.contains("keepalive"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(3), "{took:?}");
    c.policy.heal();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    assert_eq!(client.stats().connections_dialed, 2);
}

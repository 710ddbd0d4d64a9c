//! Calls, multiplexing, errors and server push over real loopback sockets.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use kelp_msgr::*;

const T: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_64mib_round_trips_with_crc() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();

    // Empty and small frames.
    for (meta, data) in [
        (Bytes::new(), Bytes::new()),
        (Bytes::from_static(b"m"), Bytes::new()),
        (Bytes::from_static(b"meta"), pattern(4096, 7)),
    ] {
        let r = conn
            .call(ECHO, meta.clone(), data.clone(), T)
            .await
            .unwrap();
        assert_eq!(r.msg_type, ECHO);
        assert_eq!(&r.meta[..meta.len()], &meta[..]);
        assert_eq!(
            r.meta[meta.len()..],
            kelp_types::crc32c(&data).to_le_bytes()
        );
        assert_eq!(r.data, data);
    }

    // 64 MiB there and back: the server reports the crc it saw, we check what came back.
    let big = pattern(64 << 20, 99);
    let want = kelp_types::crc32c(&big);
    let start = Instant::now();
    let r = conn.call(ECHO, Bytes::new(), big.clone(), T).await.unwrap();
    assert_eq!(r.meta[..], want.to_le_bytes());
    assert_eq!(r.data.len(), big.len());
    assert_eq!(kelp_types::crc32c(&r.data), want);
    assert!(r.data == big);
    eprintln!("64 MiB round trip in {:?}", start.elapsed());

    // The connection is cached: one dial for all of the above.
    assert_eq!(client.stats().connections_dialed, 1);
    assert_eq!(c.server.stats().connections_accepted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_calls_out_of_order() {
    let cfg = MsgrConfig {
        max_in_flight_requests: 1024,
        ..MsgrConfig::default()
    };
    let c = cluster(cfg).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..1000u32 {
        let conn = conn.clone();
        let finished = finished.clone();
        tasks.push(tokio::spawn(async move {
            // Early requests sleep longest, so responses come back out of order.
            let ms = u64::from(19 - (i % 20));
            let data = Bytes::from(i.to_le_bytes().repeat(16));
            let r = conn
                .call(SLEEP_ECHO, sleep_meta(ms, i), data.clone(), T)
                .await
                .unwrap();
            assert_eq!(
                &r.meta[8..12],
                &i.to_le_bytes(),
                "response matched to the wrong call"
            );
            assert_eq!(r.data, data);
            (i, finished.fetch_add(1, Ordering::SeqCst))
        }));
    }
    let mut order = Vec::new();
    for t in tasks {
        order.push(t.await.unwrap());
    }
    order.sort_by_key(|(_, done)| *done);
    let completion: Vec<u32> = order.iter().map(|(i, _)| *i).collect();
    assert!(
        completion.windows(2).any(|w| w[0] > w[1]),
        "responses arrived strictly in order"
    );
    // All over one TCP connection.
    assert_eq!(client.stats().connections_dialed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_errors_and_panics_are_replies() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    match conn.call(FAIL, Bytes::new(), Bytes::new(), T).await {
        Err(MsgrError::Remote {
            error, msg_type, ..
        }) => {
            assert_eq!((error.code, msg_type), (FAIL_CODE, FAIL));
            assert_eq!(error.message, "asked to fail");
        }
        other => panic!("{other:?}"),
    }
    match conn.call(PANIC, Bytes::new(), Bytes::new(), T).await {
        Err(MsgrError::Remote { error, .. }) => assert_eq!(error.code, code::HANDLER_PANICKED),
        other => panic!("{other:?}"),
    }
    // The connection survives both.
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    let e = conn
        .call(FAIL, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap_err();
    assert!(!e.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_outgoing_frames_refused_locally() {
    let cfg = MsgrConfig {
        max_meta_len: 16,
        max_data_len: 1024,
        ..MsgrConfig::default()
    };
    let c = cluster(cfg.clone()).await;
    let client = c.client_with("client.a", cfg, None);
    let conn = client.connect(c.addr).await.unwrap();
    let e = conn
        .call(ECHO, vec![0u8; 17], Bytes::new(), T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            MsgrError::TooLarge {
                segment: "meta",
                ..
            }
        ),
        "{e}"
    );
    let e = conn
        .call(ECHO, Bytes::new(), vec![0u8; 1025], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            MsgrError::TooLarge {
                segment: "data",
                ..
            }
        ),
        "{e}"
    );
    // The echo reply adds 4 bytes of crc to meta: 13 + 4 > 16, so the server refuses to send it
    // and says so, instead of sending a frame we would refuse.
    match conn.call(ECHO, vec![0u8; 13], Bytes::new(), T).await {
        Err(MsgrError::Remote { error, .. }) => assert_eq!(error.code, code::RESPONSE_TOO_LARGE),
        other => panic!("{other:?}"),
    }
    conn.call(ECHO, vec![0u8; 12], vec![1u8; 1024], T)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_push_delivered_in_order() {
    let c = cluster(MsgrConfig::default()).await;
    let (dispatcher, mut pushes) = ChannelDispatcher::new(16);
    let client = c.client_with("client.a", MsgrConfig::default(), Some(dispatcher));
    let conn = client.connect(c.addr).await.unwrap();
    conn.call(SUBSCRIBE, 200u32.to_le_bytes().to_vec(), Bytes::new(), T)
        .await
        .unwrap();
    for seq in 0..200u32 {
        let m = tokio::time::timeout(T, pushes.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.msg_type, PUSHED);
        assert_eq!(m.meta[..], seq.to_le_bytes());
        assert_eq!(m.peer.entity(), "osd.1");
    }

    // The server can also push to whoever is connected, without a request in hand.
    let peers = c.server.peers();
    let sub = peers.iter().find(|p| p.entity() == "client.a").unwrap();
    assert_eq!(sub.direction(), Direction::Inbound);
    sub.send(PUSHED, &b"direct"[..], &b"payload"[..])
        .await
        .unwrap();
    let m = tokio::time::timeout(T, pushes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (&m.meta[..], &m.data[..]),
        (&b"direct"[..], &b"payload"[..])
    );

    // A client without a handler refuses server-initiated calls cleanly.
    match sub.call(ECHO, Bytes::new(), Bytes::new(), T).await {
        Err(MsgrError::Remote { error, .. }) => assert_eq!(error.code, code::NO_HANDLER),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_can_call_back_a_client_with_a_dispatcher() {
    let c = cluster(MsgrConfig::default()).await;
    let client_handler = Arc::new(TestHandler::default());
    let client = c.client_with("osd.2", MsgrConfig::default(), Some(client_handler));
    let conn = client.connect(c.addr).await.unwrap();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    let peer = c
        .server
        .peers()
        .into_iter()
        .find(|p| p.entity() == "osd.2")
        .unwrap();
    let r = peer.call(ECHO, &b"back"[..], &b"x"[..], T).await.unwrap();
    assert!(r.meta.starts_with(b"back"));
    // Both directions share one TCP connection.
    assert_eq!(c.server.stats().connections_accepted, 1);
    assert_eq!(c.server.stats().connections_dialed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_requests_are_capped() {
    let cfg = MsgrConfig {
        max_in_flight_requests: 4,
        ..MsgrConfig::default()
    };
    let c = cluster(cfg).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let conn = conn.clone();
        tasks.push(tokio::spawn(async move {
            conn.call(COUNT, Bytes::new(), Bytes::new(), T)
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(c.handler.max_active.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_closed_callback_and_shutdown() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    conn.call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap();
    client.shutdown();
    let e = conn
        .call(ECHO, Bytes::new(), Bytes::new(), T)
        .await
        .unwrap_err();
    assert!(matches!(e, MsgrError::Shutdown), "{e}");
    // The server notices the close and tells its dispatcher.
    let deadline = Instant::now() + T;
    while c.handler.closed.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "server never saw the close");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(c.server.peers().is_empty());
}

/// Replies of requests served at the same time leave in shared flushes (the writer lets ready
/// handlers queue theirs first). The lone-call half only checks the counters (one flush per
/// reply); that a lone call does not wait for a scheduler pass is a latency property, measured
/// by `examples/msgr_bench.rs` (echo at concurrency 1), not asserted here.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn concurrent_replies_share_flushes() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();

    // One call at a time: every reply is its own flush.
    let before = c.server.stats();
    for i in 0..50u64 {
        let data = pattern(64, i);
        let r = conn
            .call(ECHO, Bytes::new(), data.clone(), T)
            .await
            .unwrap();
        assert_eq!(r.data, data);
    }
    let after = c.server.stats();
    let (frames, flushes) = (
        after.frames_sent - before.frames_sent,
        after.flushes - before.flushes,
    );
    assert!(frames >= 50, "{frames} frames for 50 replies");
    assert_eq!(frames, flushes, "one flush per lone reply");

    // 64 callers at once, ten rounds: replies share flushes.
    let before = c.server.stats();
    for round in 0..10u64 {
        let mut calls = Vec::new();
        for i in 0..64u64 {
            let conn = conn.clone();
            calls.push(tokio::spawn(async move {
                let data = pattern(256, round * 64 + i);
                let r = conn
                    .call(ECHO, Bytes::new(), data.clone(), T)
                    .await
                    .unwrap();
                assert_eq!(r.data, data);
            }));
        }
        for t in calls {
            t.await.unwrap();
        }
    }
    let after = c.server.stats();
    let (frames, flushes) = (
        after.frames_sent - before.frames_sent,
        after.flushes - before.flushes,
    );
    assert!(frames >= 640, "{frames} frames for 640 replies");
    assert!(
        flushes * 2 <= frames,
        "{flushes} flushes for {frames} frames: concurrent replies should share sends"
    );
}

/// Bytes and messages are counted on both ends by the kind of peer (headers included,
/// keepalives not counted as messages), and open connections go back to zero on close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_is_counted_by_peer_type() {
    let c = cluster(MsgrConfig::default()).await;
    let client = c.client("client.a");
    let conn = client.connect(c.addr).await.unwrap();
    for i in 0..10u64 {
        conn.call(ECHO, Bytes::new(), pattern(1000, i), T)
            .await
            .unwrap();
    }
    let (osd, cl) = (peer_type("osd.1"), peer_type("client.a"));
    assert_eq!(PEER_TYPES[osd], "osd");
    assert_eq!(PEER_TYPES[cl], "client");
    assert_eq!(PEER_TYPES[peer_type("rgw")], "other");
    let mine = client.stats().by_peer[osd];
    assert_eq!(mine.messages_sent, 10);
    assert_eq!(mine.messages_received, 10);
    assert!(mine.bytes_sent >= 10 * 1000, "{mine:?}");
    assert!(mine.bytes_received >= 10 * 1000, "{mine:?}");
    assert_eq!(mine.connections_open, 1);
    let theirs = c.server.stats().by_peer[cl];
    assert_eq!(theirs.messages_received, 10);
    assert_eq!(theirs.bytes_received, mine.bytes_sent);
    assert_eq!(theirs.connections_open, 1);
    client.shutdown();
    let deadline = Instant::now() + T;
    while c.server.stats().by_peer[cl].connections_open != 0 {
        assert!(Instant::now() < deadline, "the server never saw the close");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = client.stats().by_peer[osd];
    assert_eq!((s.connections_open, s.connections_closed), (0, 1));
}

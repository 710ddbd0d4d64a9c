//! Hostile peers: garbage, truncated frames, huge lengths, stalls and a fuzz loop, before and
//! after authentication. The server must close the offending connection promptly, never crash
//! or hang, and keep serving everyone else.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use kelp_msgr::frame::{FrameKind, HEADER_LEN, encode_header};
use kelp_msgr::handshake::{HsMessage, PROTOCOL_VERSION};
use kelp_msgr::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn hostile_config() -> MsgrConfig {
    MsgrConfig {
        handshake_timeout_ms: 300,
        frame_body_timeout_ms: 300,
        max_meta_len: 64 << 10,
        max_data_len: 4 << 20,
        ..MsgrConfig::default()
    }
}

async fn authed_stream(c: &Cluster) -> TcpStream {
    let mut s = TcpStream::connect(c.addr).await.unwrap();
    let key = c.keyring.secret_for("client.a").unwrap();
    kelp_msgr::handshake::client(&mut s, "client.a", &key, Duration::from_secs(5), "srv")
        .await
        .unwrap();
    s
}

/// Sends `input`, optionally half-closes, and asserts the server closes the connection within
/// `within` (EOF or reset both count). Returns how long it took.
async fn assert_server_closes(
    mut s: TcpStream,
    input: &[u8],
    half_close: bool,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    // The server may close before reading everything; a failed write is fine.
    let _ = s.write_all(input).await;
    if half_close {
        let _ = s.shutdown().await;
    }
    let mut sink = Vec::new();
    match tokio::time::timeout(within, s.read_to_end(&mut sink)).await {
        Ok(_) => start.elapsed(),
        Err(_) => panic!(
            "server kept the connection open for {within:?} after {} bytes {:02x?}",
            input.len(),
            &input[..input.len().min(32)]
        ),
    }
}

fn frame(kind: FrameKind, meta: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = encode_header(kind, 1, 1, meta, data).to_vec();
    v.extend_from_slice(meta);
    v.extend_from_slice(data);
    v
}

/// A background client that calls the server in a loop and counts failures.
fn keep_calling(
    c: &Cluster,
) -> (
    Arc<AtomicBool>,
    Arc<AtomicU64>,
    tokio::task::JoinHandle<u64>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let client = c.client("client.b");
    let addr = c.addr;
    let (stop2, failures2) = (stop.clone(), failures.clone());
    let task = tokio::spawn(async move {
        let conn = client.connect(addr).await.unwrap();
        let mut ok = 0;
        while !stop2.load(Ordering::Relaxed) {
            match conn
                .call(ECHO, &b"x"[..], Bytes::new(), Duration::from_secs(5))
                .await
            {
                Ok(_) => ok += 1,
                Err(e) => {
                    eprintln!("good client failed: {e}");
                    failures2.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        ok
    });
    (stop, failures, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_before_the_handshake() {
    let c = cluster(hostile_config()).await;
    let (stop, failures, good) = keep_calling(&c);
    let within = Duration::from_secs(3);
    let mut huge_body = b"KLHS".to_vec();
    huge_body.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    huge_body.push(1);
    huge_body.extend_from_slice(&u16::MAX.to_le_bytes());
    let hello = HsMessage::Hello {
        entity: "client.a".into(),
        nonce: [0; 32],
    }
    .encode(PROTOCOL_VERSION);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "frame instead of handshake",
            frame(FrameKind::Request, b"", b""),
        ),
        ("huge handshake body", huge_body),
        ("truncated hello", hello[..hello.len() - 5].to_vec()),
        ("bad entity", {
            HsMessage::Hello {
                entity: "no dots here".into(),
                nonce: [0; 32],
            }
            .encode(PROTOCOL_VERSION)
        }),
    ];
    for (name, input) in cases {
        for half_close in [true, false] {
            let s = TcpStream::connect(c.addr).await.unwrap();
            let took = assert_server_closes(s, &input, half_close, within).await;
            eprintln!("{name} (half_close={half_close}): closed after {took:?}");
        }
    }
    // A silent peer is cut off by the handshake timeout.
    let s = TcpStream::connect(c.addr).await.unwrap();
    let took = assert_server_closes(s, b"", false, within).await;
    assert!(took >= Duration::from_millis(250), "{took:?}");

    stop.store(true, Ordering::Relaxed);
    assert!(good.await.unwrap() > 0);
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert!(c.server.stats().handshake_failures >= 10);
    c.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_after_the_handshake() {
    let c = cluster(hostile_config()).await;
    let (stop, failures, good) = keep_calling(&c);
    let within = Duration::from_secs(3);
    let valid = frame(FrameKind::Request, b"meta", b"data");
    let with = |offset: usize, bytes: &[u8]| {
        let mut v = valid.clone();
        v[offset..offset + bytes.len()].copy_from_slice(bytes);
        v
    };
    let mut bad_crc = valid.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0x40;
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("bad magic", with(0, b"XX"), false),
        ("future frame version", with(2, &[2]), false),
        ("bad flags", with(3, &[0x03]), false),
        ("reserved bits", with(6, &[1, 0]), false),
        ("huge data length", with(20, &u32::MAX.to_le_bytes()), false),
        (
            "data over the limit",
            with(20, &((4 << 20) + 1u32).to_le_bytes()),
            false,
        ),
        ("huge meta length", with(16, &u32::MAX.to_le_bytes()), false),
        ("bad crc", bad_crc, false),
        ("truncated header", valid[..HEADER_LEN - 3].to_vec(), true),
        ("truncated body", valid[..valid.len() - 2].to_vec(), true),
        // Announces 1 MiB, sends 2 bytes, then stalls: the body timeout ends it.
        (
            "stalled body",
            {
                let mut h =
                    encode_header(FrameKind::Request, 1, 1, b"", &vec![0u8; 1 << 20]).to_vec();
                h.extend_from_slice(b"ab");
                h
            },
            false,
        ),
    ];
    let n = cases.len() as u64;
    for (name, input, half_close) in cases {
        let s = authed_stream(&c).await;
        let took = assert_server_closes(s, &input, half_close, within).await;
        eprintln!("{name}: closed after {took:?}");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(good.await.unwrap() > 0);
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert_eq!(c.server.stats().frame_errors, n);
    c.assert_serving().await;
}

/// Thousands of random inputs: pure noise, noise behind a valid handshake prefix, and mutated
/// valid frames after a real handshake. Eight at a time, against one server that must keep
/// answering a well-behaved client throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzz_loop_never_crashes_or_hangs_the_server() {
    let c = Arc::new(cluster(hostile_config()).await);
    let (stop, failures, good) = keep_calling(&c);
    let start = Instant::now();
    const INPUTS: u64 = 3000;
    let mut set = tokio::task::JoinSet::new();
    for worker in 0..8u64 {
        let c = c.clone();
        set.spawn(async move {
            let mut rng = Rng(0x5eed_0000 + worker * 7919);
            for i in (worker..INPUTS).step_by(8) {
                let kind = i % 3;
                let len = rng.below(96) as usize;
                let (stream, input) = match kind {
                    // Pure noise at the handshake.
                    0 => (TcpStream::connect(c.addr).await.unwrap(), rng.bytes(len)),
                    // A plausible handshake header followed by noise.
                    1 => {
                        let mut v = b"KLHS".to_vec();
                        v.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
                        v.push(rng.below(7) as u8);
                        v.extend_from_slice(&(rng.below(600) as u16).to_le_bytes());
                        v.extend_from_slice(&rng.bytes(len));
                        (TcpStream::connect(c.addr).await.unwrap(), v)
                    }
                    // A real session, then a valid frame with a few random byte changes, or
                    // noise.
                    _ => {
                        let s = authed_stream(&c).await;
                        let mut v =
                            frame(FrameKind::Request, &rng.bytes(len % 16), &rng.bytes(len));
                        if rng.below(4) == 0 {
                            v = rng.bytes(len);
                        } else {
                            for _ in 0..=rng.below(3) {
                                let at = rng.below(v.len() as u64) as usize;
                                v[at] = rng.next() as u8;
                            }
                        }
                        (s, v)
                    }
                };
                assert_server_closes(stream, &input, true, Duration::from_secs(5)).await;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let ok = good.await.unwrap();
    eprintln!(
        "{INPUTS} fuzz inputs in {:?}; good client made {ok} calls meanwhile",
        start.elapsed()
    );
    assert!(ok > 0);
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    let st = c.server.stats();
    eprintln!("server stats: {st:?}");
    assert!(st.handshake_failures > 1000);
    assert!(st.frame_errors > 100);
    c.assert_serving().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flood_is_capped() {
    let c = cluster(MsgrConfig {
        max_pending_handshakes: 2,
        handshake_timeout_ms: 1_000,
        ..hostile_config()
    })
    .await;
    // Two silent connections hold both handshake slots.
    let _silent1 = TcpStream::connect(c.addr).await.unwrap();
    let _silent2 = TcpStream::connect(c.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A third is closed at once, long before the handshake timeout.
    let s = TcpStream::connect(c.addr).await.unwrap();
    let took = assert_server_closes(s, b"", false, Duration::from_secs(3)).await;
    assert!(took < Duration::from_millis(500), "{took:?}");
    // Once the silent ones time out, the server accepts again.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    c.assert_serving().await;
}

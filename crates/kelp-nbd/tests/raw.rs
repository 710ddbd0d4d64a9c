//! Protocol-level tests with a raw client: option replies, error replies that keep the
//! connection, pipelining, limits (handshake timeout, connection count), an orderly stop, and
//! a fuzz-ish run of many connections sending random and malformed handshakes, options and
//! requests, after which a good client must still be served.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Raw, TestServer};
use kelp_nbd::{ExportInfo, MemDevice, MemExports, ServerConfig};
use rand::{Rng, RngCore, SeedableRng};

const KIB: u32 = 1024;
const SIZE: u64 = 4 << 20;

const ERR_UNSUP: u32 = 0x8000_0001;
const ERR_POLICY: u32 = 0x8000_0002;
const ERR_INVALID: u32 = 0x8000_0003;
const ERR_UNKNOWN: u32 = 0x8000_0006;
const ERR_SHUTDOWN: u32 = 0x8000_0007;

const READ: u16 = 0;
const WRITE: u16 = 1;
const DISC: u16 = 2;
const FLUSH: u16 = 3;
const BLOCK_STATUS: u16 = 7;

fn disk() -> Arc<MemDevice> {
    Arc::new(MemDevice::with_info(ExportInfo {
        size: SIZE,
        read_only: false,
        can_trim: true,
        block_status: true,
        multi_conn: true,
        min_block: 1,
        preferred_block: 4096,
        max_block: 256 * KIB,
        description: "raw test disk".into(),
    }))
}

fn name_data(name: &str) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d
}

#[test]
fn options_are_answered_as_the_protocol_says() {
    let srv = TestServer::start(MemExports::new().with("disk", disk()));
    let mut c = Raw::connect(srv.addr);
    c.send(&1u32.to_be_bytes());
    let one = |c: &mut Raw, opt: u32, data: &[u8]| {
        c.option(opt, data);
        c.opt_replies()
    };
    assert_eq!(one(&mut c, 42, b"whatever")[0].typ, ERR_UNSUP);
    assert_eq!(one(&mut c, 4, &[])[0].typ, ERR_UNSUP); // PEEK_EXPORT, withdrawn
    assert_eq!(one(&mut c, 5, &[])[0].typ, ERR_POLICY); // STARTTLS
    assert_eq!(one(&mut c, 3, b"x")[0].typ, ERR_INVALID); // LIST with data
    assert_eq!(one(&mut c, 8, b"x")[0].typ, ERR_INVALID); // STRUCTURED_REPLY with data
    assert_eq!(one(&mut c, 7, &[0, 0, 0, 9, b'd'])[0].typ, ERR_INVALID); // truncated GO
    assert_eq!(
        one(&mut c, 6, &[0, 0, 0, 1, 0xff, 0, 0])[0].typ,
        ERR_INVALID
    ); // bad UTF-8
    let mut nope = name_data("nope");
    nope.extend_from_slice(&0u16.to_be_bytes());
    let r = one(&mut c, 6, &nope);
    assert_eq!(r[0].typ, ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&r[0].data).contains("nope"));
    // Meta contexts need structured replies first.
    let mut meta = name_data("disk");
    meta.extend_from_slice(&0u32.to_be_bytes());
    assert_eq!(one(&mut c, 9, &meta)[0].typ, ERR_INVALID);

    // INFO with NAME, DESCRIPTION and BLOCK_SIZE requested.
    let mut info = name_data("disk");
    info.extend_from_slice(&3u16.to_be_bytes());
    for t in [1u16, 2, 3] {
        info.extend_from_slice(&t.to_be_bytes());
    }
    let r = one(&mut c, 6, &info);
    assert_eq!(
        r.iter().map(|r| r.typ).collect::<Vec<_>>(),
        vec![3, 3, 3, 3, 1]
    );
    assert_eq!(&r[0].data[0..2], &[0, 0]);
    assert_eq!(
        u64::from_be_bytes(r[0].data[2..10].try_into().unwrap()),
        SIZE
    );
    let flags = u16::from_be_bytes(r[0].data[10..12].try_into().unwrap());
    assert_eq!(flags & 0x0001, 1, "HAS_FLAGS");
    assert_eq!(flags & 0x0080, 0, "no DF before structured replies");
    assert_ne!(flags & 0x0100, 0, "CAN_MULTI_CONN");
    assert_eq!(r[1].data, [&[0u8, 1][..], b"disk"].concat());
    assert_eq!(r[2].data, [&[0u8, 2][..], b"raw test disk"].concat());
    assert_eq!(r[3].data, [0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0, 4, 0, 0]);

    assert_eq!(one(&mut c, 8, &[])[0].typ, 1);
    // LIST_META_CONTEXT with no query lists everything: base:allocation (id 0).
    let r = one(&mut c, 9, &meta);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].typ, 4);
    assert_eq!(
        r[0].data,
        [&[0u8, 0, 0, 0][..], b"base:allocation"].concat()
    );
    // A query without a namespace is invalid; another namespace selects nothing.
    let mut bad = name_data("disk");
    bad.extend_from_slice(&1u32.to_be_bytes());
    bad.extend_from_slice(&name_data("nonsense"));
    assert_eq!(one(&mut c, 10, &bad)[0].typ, ERR_INVALID);
    let mut other = name_data("disk");
    other.extend_from_slice(&1u32.to_be_bytes());
    other.extend_from_slice(&name_data("qemu:dirty-bitmap:x"));
    let r = one(&mut c, 10, &other);
    assert_eq!(r.iter().map(|r| r.typ).collect::<Vec<_>>(), vec![1]);
    // LIST names the export.
    let r = one(&mut c, 3, &[]);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].typ, 2);
    assert_eq!(
        r[0].data,
        [&name_data("disk")[..], b"raw test disk"].concat()
    );
    // ABORT is acknowledged, then the server closes.
    assert_eq!(one(&mut c, 2, &[])[0].typ, 1);
    assert!(c.closed());
}

#[test]
fn export_name_honours_no_zeroes_and_refuses_by_closing() {
    let srv = TestServer::start(MemExports::new().with("disk", disk()));
    for (client_flags, reply_len) in [(1u32, 8 + 2 + 124), (3, 8 + 2)] {
        let mut c = Raw::connect(srv.addr);
        c.send(&client_flags.to_be_bytes());
        c.option(1, b"disk");
        let r = c.exact(reply_len);
        assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), SIZE);
        assert!(r[10..].iter().all(|b| *b == 0));
        // Simple replies: a read answers with the data right after the header.
        c.request(WRITE, 0, 1, 100, 3, b"abc");
        assert_eq!(c.reply(0).error, 0);
        c.request(READ, 0, 2, 99, 5, &[]);
        let rep = c.reply(5);
        assert_eq!(
            (rep.handle, rep.error, rep.data),
            (2, 0, b"\0abc\0".to_vec())
        );
        // A simple error reply carries no data; the connection goes on.
        c.request(READ, 0, 3, SIZE, 5, &[]);
        let rep = c.reply(5);
        assert_eq!((rep.handle, rep.error, rep.data.len()), (3, 22, 0));
        c.request(READ, 0, 4, 100, 1, &[]);
        assert_eq!(c.reply(1).data, b"a");
        c.request(DISC, 0, 5, 0, 0, &[]);
        assert!(c.closed());
    }
    // An unknown export cannot be refused politely with EXPORT_NAME: the connection closes.
    let mut c = Raw::connect(srv.addr);
    c.send(&1u32.to_be_bytes());
    c.option(1, b"missing");
    assert!(c.closed());
    // Unknown client flags close the connection.
    let mut c = Raw::connect(srv.addr);
    c.send(&0x10u32.to_be_bytes());
    assert!(c.closed());
    // So does a bad option magic and an option longer than the server reads.
    let mut c = Raw::connect(srv.addr);
    c.send(&1u32.to_be_bytes());
    c.send(&[0u8; 16]);
    assert!(c.closed());
    let mut c = Raw::connect(srv.addr);
    c.send(&1u32.to_be_bytes());
    let mut h = common::IHAVEOPT.to_be_bytes().to_vec();
    h.extend_from_slice(&3u32.to_be_bytes());
    h.extend_from_slice(&(1u32 << 30).to_be_bytes());
    c.send(&h);
    assert!(c.closed());
}

#[test]
fn errors_keep_the_connection_and_requests_pipeline() {
    let dev = disk();
    let srv = TestServer::start(MemExports::new().with("disk", dev.clone()));
    let mut c = Raw::connect(srv.addr);
    let (size, flags) = c.go("disk", true, true);
    assert_eq!(size, SIZE);
    assert_ne!(flags & 0x0080, 0, "DF offered with structured replies");

    let mut handle = 0u64;
    let mut expect_err =
        |c: &mut Raw, typ: u16, fl: u16, off: u64, len: u32, payload: &[u8], errno: u32| {
            handle += 1;
            c.request(typ, fl, handle, off, len, payload);
            let r = c.reply(0);
            assert_eq!(
                (r.handle, r.error),
                (handle, errno),
                "cmd {typ} flags {fl:#x} {off}+{len}"
            );
            assert_eq!(r.chunk_types, vec![0x8001], "a structured error chunk");
        };
    expect_err(&mut c, READ, 0, SIZE - 1, 2, &[], 22);
    expect_err(&mut c, READ, 0, 0, 0, &[], 22);
    expect_err(&mut c, READ, 0, 0, 256 * KIB + 1, &[], 22);
    expect_err(&mut c, READ, 1 << 9, 0, 1, &[], 22);
    expect_err(&mut c, 99, 0, 0, 1, &[], 22);
    expect_err(&mut c, BLOCK_STATUS, 0, SIZE, 1, &[], 22);
    expect_err(&mut c, FLUSH, 0, 1, 0, &[], 22);
    // Rejected writes: their payloads are read and dropped, the stream stays in step.
    expect_err(&mut c, WRITE, 1 << 2, 0, 100, &[7u8; 100], 22);
    expect_err(&mut c, WRITE, 0, SIZE - 10, 100, &[7u8; 100], 28);
    let big = vec![9u8; 256 * KIB as usize + 1];
    expect_err(&mut c, WRITE, 0, 0, big.len() as u32, &big, 22);
    assert_eq!(
        dev.allocated_bytes(),
        0,
        "no rejected write reached the device"
    );

    // 200 pipelined requests (more than the in-flight limit) all answered.
    let n = 200u64;
    for i in 0..n {
        let data = vec![i as u8; 512];
        c.request(WRITE, 1, 1000 + i, i * 512, 512, &data);
    }
    let mut seen: Vec<u64> = (0..n)
        .map(|_| c.reply(0))
        .inspect(|r| assert_eq!(r.error, 0))
        .map(|r| r.handle)
        .collect();
    seen.sort();
    assert_eq!(seen, (1000..1000 + n).collect::<Vec<_>>());
    for i in 0..n {
        c.request(READ, 0, 5000 + i, i * 512, 512, &[]);
    }
    for _ in 0..n {
        let r = c.reply(512);
        let i = r.handle - 5000;
        assert_eq!(r.data, vec![i as u8; 512], "read {i}");
    }
    // Holes come back as a hole chunk; DF is accepted.
    c.request(READ, 1 << 2, 9000, SIZE - 4096, 4096, &[]);
    let r = c.reply(0);
    assert_eq!(
        (r.error, r.chunk_types.clone(), r.data.len()),
        (0, vec![2], 4096)
    );
    // Block status of the written prefix and the hole after it.
    c.request(BLOCK_STATUS, 0, 9001, 0, 1 << 20, &[]);
    let r = c.reply(0);
    assert_eq!(r.chunk_types, vec![5]);
    let d: Vec<u32> = r
        .data
        .chunks(4)
        .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(d, vec![64 * KIB * 2, 0, (1 << 20) - 128 * KIB, 3]);
    let flushes = dev.stats().flushes;
    c.request(FLUSH, 0, 9002, 0, 0, &[]);
    assert_eq!(c.reply(0).error, 0);
    assert_eq!(dev.stats().flushes, flushes + 1);
    // A write too large even to discard: error reply (here ENOSPC: it is also past the end),
    // then the server closes.
    c.request(WRITE, 0, 9003, 0, u32::MAX, &[]);
    assert_eq!(c.reply(0).error, 28);
    assert!(c.closed());
}

#[test]
fn handshake_timeout_closes_idle_clients() {
    let cfg = ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemExports::new().with("disk", disk()), cfg);
    let start = Instant::now();
    let mut idle = Raw::connect(srv.addr);
    let mut partial = Raw::connect(srv.addr);
    partial.send(&1u32.to_be_bytes());
    partial.send(&common::IHAVEOPT.to_be_bytes());
    assert!(idle.closed());
    assert!(partial.closed());
    assert!(start.elapsed() < Duration::from_secs(5));
    // A client that finished its handshake is not affected by the timeout.
    let mut c = Raw::connect(srv.addr);
    c.go("disk", false, false);
    std::thread::sleep(Duration::from_millis(600));
    c.request(READ, 0, 1, 0, 1, &[]);
    assert_eq!(c.reply(1).error, 0);
}

#[test]
fn connection_limit_turns_away_extra_clients() {
    let cfg = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(MemExports::new().with("disk", disk()), cfg);
    let mut a = Raw::connect(srv.addr);
    a.go("disk", true, false);
    let mut b = Raw::connect(srv.addr);
    b.go("disk", false, false);
    let mut extra = TcpStream::connect(srv.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 8];
    assert!(
        matches!(extra.read(&mut buf), Ok(0) | Err(_)),
        "the third connection gets no greeting"
    );
    drop(a);
    // Once a slot is free, a new client is served.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if s.read(&mut buf).is_ok_and(|n| n > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no slot freed after a client left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    b.request(READ, 0, 1, 0, 1, &[]);
    assert_eq!(b.reply(1).error, 0);
}

#[test]
fn stop_refuses_options_finishes_connections_and_returns() {
    let mut srv = TestServer::start(MemExports::new().with("disk", disk()));
    let mut haggling = Raw::connect(srv.addr);
    haggling.send(&1u32.to_be_bytes());
    let mut working = Raw::connect(srv.addr);
    working.go("disk", true, false);
    working.request(WRITE, 0, 1, 0, 4, b"kelp");
    assert_eq!(working.reply(0).error, 0);

    srv.signal_stop();
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(srv.addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the listener stayed open after the stop"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // A client still haggling gets NBD_REP_ERR_SHUTDOWN and may still abort cleanly.
    haggling.option(3, &[]);
    assert_eq!(haggling.opt_reply().typ, ERR_SHUTDOWN);
    haggling.option(2, &[]);
    assert_eq!(haggling.opt_reply().typ, 1);
    assert!(haggling.closed());
    // A client in transmission is disconnected once idle.
    assert!(working.closed());
    srv.join(Duration::from_secs(10));
}

static SERVER_PANICS: AtomicUsize = AtomicUsize::new(0);

/// One connection's worth of random misbehaviour.
fn misbehave(addr: std::net::SocketAddr, rng: &mut rand::rngs::StdRng) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    s.set_read_timeout(Some(Duration::from_millis(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut sink = vec![0u8; 64 << 10];
    let mut drain = |s: &mut TcpStream| while matches!(s.read(&mut sink), Ok(n) if n > 0) {};
    let random = |rng: &mut rand::rngs::StdRng, max: usize| {
        let mut v = vec![0u8; rng.gen_range(0..=max)];
        rng.fill_bytes(&mut v);
        v
    };
    let option = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
        let opt: u32 = if rng.gen_bool(0.8) {
            rng.gen_range(0..13)
        } else {
            rng.r#gen()
        };
        let mut data = random(rng, 64);
        if rng.gen_bool(0.4) && data.len() >= 4 {
            // A plausible name-length prefix, often lying.
            let n: u32 = if rng.gen_bool(0.5) {
                rng.gen_range(0..8)
            } else {
                rng.r#gen()
            };
            data[0..4].copy_from_slice(&n.to_be_bytes());
        }
        let declared = match rng.gen_range(0..10) {
            0 => rng.r#gen::<u32>(),
            1 => data.len() as u32 + rng.gen_range(1..100),
            _ => data.len() as u32,
        };
        let magic = if rng.gen_bool(0.05) {
            rng.r#gen()
        } else {
            common::IHAVEOPT
        };
        let mut b = magic.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&declared.to_be_bytes());
        b.extend_from_slice(&data);
        b
    };
    let request = |rng: &mut rand::rngs::StdRng| -> Vec<u8> {
        if rng.gen_bool(0.05) {
            return random(rng, 40);
        }
        let typ: u16 = if rng.gen_bool(0.9) {
            rng.gen_range(0..9)
        } else {
            rng.r#gen()
        };
        let flags: u16 = if rng.gen_bool(0.7) {
            rng.gen_range(0..4)
        } else {
            rng.r#gen()
        };
        let offset: u64 = match rng.gen_range(0..4) {
            0 => rng.r#gen(),
            1 => SIZE - rng.gen_range(0..1024),
            _ => rng.gen_range(0..SIZE),
        };
        let len: u32 = match rng.gen_range(0..5) {
            0 => rng.r#gen(),
            1 => 0,
            2 => rng.gen_range(256 * KIB - 2..256 * KIB + 2),
            _ => rng.gen_range(1..8192),
        };
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&typ.to_be_bytes());
        b.extend_from_slice(&rng.r#gen::<u64>().to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        if typ == WRITE {
            // Usually the whole payload, sometimes less (the stream then desynchronises).
            let n = if rng.gen_bool(0.9) {
                len.min(300 * KIB)
            } else {
                len.min(1000) / 2
            };
            let mut p = vec![0u8; n as usize];
            rng.fill_bytes(&mut p);
            b.extend_from_slice(&p);
        }
        b
    };
    let greeting_read = rng.gen_bool(0.9);
    if greeting_read {
        let mut g = [0u8; 18];
        if s.read_exact(&mut g).is_err() {
            return;
        }
    }
    match rng.gen_range(0..6) {
        0 => {
            let _ = s.write_all(&random(rng, 300));
        }
        1 => {
            let flags: u32 = if rng.gen_bool(0.5) {
                rng.r#gen()
            } else {
                rng.gen_range(0..4)
            };
            let _ = s.write_all(&flags.to_be_bytes());
            for _ in 0..rng.gen_range(0..8) {
                let _ = s.write_all(&option(rng));
            }
        }
        _ => {
            // A good handshake, then random requests.
            let _ = s.write_all(&3u32.to_be_bytes());
            let mut hs = Vec::new();
            if rng.gen_bool(0.7) {
                hs.extend_from_slice(&common::IHAVEOPT.to_be_bytes());
                hs.extend_from_slice(&8u32.to_be_bytes());
                hs.extend_from_slice(&0u32.to_be_bytes());
                if rng.gen_bool(0.7) {
                    let mut d = name_data("disk");
                    d.extend_from_slice(&1u32.to_be_bytes());
                    d.extend_from_slice(&name_data("base:allocation"));
                    hs.extend_from_slice(&common::IHAVEOPT.to_be_bytes());
                    hs.extend_from_slice(&10u32.to_be_bytes());
                    hs.extend_from_slice(&(d.len() as u32).to_be_bytes());
                    hs.extend_from_slice(&d);
                }
            }
            let mut go = name_data("disk");
            go.extend_from_slice(&0u16.to_be_bytes());
            hs.extend_from_slice(&common::IHAVEOPT.to_be_bytes());
            hs.extend_from_slice(&7u32.to_be_bytes());
            hs.extend_from_slice(&(go.len() as u32).to_be_bytes());
            hs.extend_from_slice(&go);
            if rng.gen_bool(0.1) {
                hs.truncate(rng.gen_range(0..hs.len()));
            }
            let _ = s.write_all(&hs);
            for _ in 0..rng.gen_range(0..12) {
                if s.write_all(&request(rng)).is_err() {
                    break;
                }
                if rng.gen_bool(0.3) {
                    drain(&mut s);
                }
            }
        }
    }
    if rng.gen_bool(0.5) {
        drain(&mut s);
    }
}

#[test]
fn fuzz_malformed_traffic_never_stops_the_server() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with(common::SERVER_THREAD))
        {
            SERVER_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        default_hook(info);
    }));
    let seed: u64 = std::env::var("KELP_NBD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("fuzz seed {seed} (rerun with KELP_NBD_FUZZ_SEED={seed})");
    let good = disk();
    let cfg = ServerConfig {
        handshake_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let srv = TestServer::start_with(
        MemExports::new()
            .with("disk", disk())
            .with("good", good.clone()),
        cfg,
    );
    let addr = srv.addr;
    let start = Instant::now();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(
                    seed ^ (t.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                );
                for _ in 0..50 {
                    misbehave(addr, &mut rng);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    eprintln!("400 misbehaving connections in {:?}", start.elapsed());
    assert_eq!(
        SERVER_PANICS.load(Ordering::SeqCst),
        0,
        "a server task panicked (seed {seed})"
    );

    // A good client is served, on both exports, with correct data.
    let mut c = Raw::connect(addr);
    assert_eq!(c.go("good", true, true).0, SIZE);
    let data: Vec<u8> = (0..64 * KIB).map(|i| (i % 251) as u8).collect();
    c.request(WRITE, 1, 1, 4096, data.len() as u32, &data);
    assert_eq!(c.reply(0).error, 0);
    c.request(READ, 0, 2, 4096, data.len() as u32, &[]);
    assert_eq!(c.reply(0).data, data);
    assert_eq!(good.read_now(4096, data.len()).unwrap(), data);
    let mut d = Raw::connect(addr);
    d.go("disk", false, false);
    d.request(READ, 0, 3, 0, 512, &[]);
    assert_eq!(d.reply(512).error, 0);
    // Every misbehaving connection is gone (the handshake timeout reaped the idle ones).
    std::thread::sleep(Duration::from_secs(3));
    let mut e = Raw::connect(addr);
    e.go("good", false, false);
}

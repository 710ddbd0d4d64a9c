//! Loopback micro-benchmark of the messenger: one server and one client messenger in this
//! process, talking over 127.0.0.1 through the real TCP stack, handshake and framing.
//!
//! ```text
//! cargo run -p kelp-msgr --release --example msgr_bench -- [seconds_per_case]
//! ```
//!
//! Cases:
//! - `echo 4KiB`: request with 4 KiB of data, response echoes the 4 KiB back; calls/s at
//!   concurrency 1 and 16 (concurrent callers multiplexed on one connection);
//! - `write 4MiB`: request with 4 MiB of data, empty response; payload MiB/s at concurrency 1
//!   and 4 (the data is crc32c-checked on both sides, as always).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kelp_msgr::*;

const ECHO: u16 = 1;
const SINK: u16 = 2;

struct Handler;

#[async_trait::async_trait]
impl Dispatcher for Handler {
    async fn handle_request(&self, req: Request) -> Result<Response, RemoteError> {
        match req.msg_type {
            ECHO => Ok(Response::new(ECHO, Bytes::new(), req.data)),
            _ => Ok(Response::new(SINK, Bytes::new(), Bytes::new())),
        }
    }
}

async fn run_case(
    conn: &Connection,
    msg_type: u16,
    payload: Bytes,
    concurrency: usize,
    secs: f64,
) -> (u64, Duration, Vec<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for _ in 0..concurrency {
        let (conn, payload, stop, calls) =
            (conn.clone(), payload.clone(), stop.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                conn.call(
                    msg_type,
                    Bytes::new(),
                    payload.clone(),
                    Duration::from_secs(30),
                )
                .await
                .expect("benchmark call failed");
                lat.push(t.elapsed());
                calls.fetch_add(1, Ordering::Relaxed);
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("benchmark task panicked"));
    }
    let elapsed = start.elapsed();
    lat.sort();
    (calls.load(Ordering::Relaxed), elapsed, lat)
}

fn pct(lat: &[Duration], p: f64) -> Duration {
    if lat.is_empty() {
        return Duration::ZERO;
    }
    lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), MsgrError> {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let key = generate_secret();
    let mut keyring = Keyring::new();
    keyring.insert("client.bench", key.clone())?;
    let server = Messenger::builder("osd.0")
        .keys(Arc::new(keyring))
        .dispatcher(Arc::new(Handler))
        .build()?;
    let addr = server
        .bind("127.0.0.1:0".parse().expect("literal address"))
        .await?;
    let client = Messenger::builder("client.bench").secret(key).build()?;
    let conn = client.connect(addr).await?;

    // Warm up allocators and the connection.
    run_case(&conn, ECHO, Bytes::from(vec![7u8; 4096]), 4, 0.5).await;

    println!("| case | concurrency | calls/s | MiB/s (payload) | p50 | p99 |");
    println!("|---|---|---|---|---|---|");
    let cases: [(&str, u16, usize, usize); 4] = [
        ("echo 4KiB", ECHO, 4096, 1),
        ("echo 4KiB", ECHO, 4096, 16),
        ("write 4MiB", SINK, 4 << 20, 1),
        ("write 4MiB", SINK, 4 << 20, 4),
    ];
    for (name, ty, size, conc) in cases {
        let payload = Bytes::from(vec![0xa5u8; size]);
        let (calls, elapsed, lat) = run_case(&conn, ty, payload, conc, secs).await;
        let per_s = calls as f64 / elapsed.as_secs_f64();
        // Echo moves the payload both ways; write moves it one way.
        let dirs = if ty == ECHO { 2.0 } else { 1.0 };
        let mib_s = per_s * size as f64 * dirs / (1024.0 * 1024.0);
        println!(
            "| {name} | {conc} | {per_s:.0} | {mib_s:.0} | {:.0?} | {:.0?} |",
            pct(&lat, 0.50),
            pct(&lat, 0.99)
        );
    }
    server.shutdown();
    client.shutdown();
    Ok(())
}

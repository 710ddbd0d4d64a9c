//! The load generator against real S3 servers on 127.0.0.1: `s3s-fs` (an S3 implementation over
//! a directory, with SigV4 authentication) in-process, and a tiny hyper server that fails every
//! PUT, for the error paths.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kelp_s3bench::{BenchArgs, BenchError, Mode, Report};
use tokio::net::TcpListener;

const AK: &str = "kelpbench";
const SK: &str = "kelpbench-secret/key+1";
const BUCKET: &str = "bench";

/// The tests that measure run one at a time: they assert that requests complete inside short
/// windows, which is easier to guarantee on a small shared machine without contention.
static MEASURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An s3s-fs server over a temporary directory, serving until the test's runtime stops.
struct FsServer {
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

async fn start_fs_server() -> FsServer {
    let dir = tempfile::tempdir().unwrap();
    let fs = s3s_fs::FileSystem::new(dir.path()).unwrap();
    let mut builder = s3s::service::S3ServiceBuilder::new(fs);
    builder.set_auth(s3s::auth::SimpleAuth::from_single(AK, SK));
    let service = builder.build();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let service = service.clone();
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    FsServer { addr, dir }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn bench_args(addr: SocketAddr, secret: &str, extra: &[&str]) -> BenchArgs {
    let endpoint = format!("http://{addr}");
    let mut argv = vec![
        "bench",
        "--endpoint",
        &endpoint,
        "--access-key",
        AK,
        "--secret-key",
        secret,
        "--region",
        "us-east-1",
        "--bucket",
        BUCKET,
    ];
    // `--format` is the caller's (kelp's global option), not parsed by BenchArgs
    let mut json = false;
    let mut rest = extra.iter();
    while let Some(&a) = rest.next() {
        if a == "--format" {
            json = rest.next() == Some(&"json");
        } else {
            argv.push(a);
        }
    }
    let mut args = Cli::try_parse_from(argv).unwrap().bench;
    if json {
        args.format = kelp_s3bench::Format::Json;
    }
    args
}

async fn bench(addr: SocketAddr, extra: &[&str]) -> (Result<Report, BenchError>, String) {
    let args = bench_args(addr, SK, extra);
    let mut out = Vec::new();
    let result = kelp_s3bench::run(&args, &mut out).await;
    (result, String::from_utf8(out).unwrap())
}

/// Regular files under `dir` (the objects of a bucket in s3s-fs), recursively.
fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| e.unwrap())
        .map(|e| {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                count_files(&e.path())
            } else {
                usize::from(t.is_file())
            }
        })
        .sum()
}

/// The invariants every successful report keeps.
fn check_report(r: &Report, mode: Mode, size: u64, concurrency: usize) {
    assert_eq!(r.mode, mode);
    assert_eq!(r.size, size);
    assert_eq!(r.concurrency, concurrency);
    assert_eq!(r.errors, 0, "{:?}", r.first_errors);
    assert!(r.ops > 0, "{r:?}");
    assert_eq!(r.bytes, r.ops * size);
    let ops_per_s = r.ops as f64 / r.seconds;
    assert!((r.ops_per_s - ops_per_s).abs() < 1e-6, "{r:?}");
    let mib = r.bytes as f64 / r.seconds / (1u64 << 20) as f64;
    assert!((r.mib_per_s - mib).abs() < 1e-6, "{r:?}");
    let l = r.latency_ms;
    assert!(0.0 < l.p50 && l.p50 <= l.p99 && l.p99 <= l.max, "{l:?}");
    assert!(l.avg > 0.0 && l.avg <= l.max, "{l:?}");
    // The per-kind figures add up to the total.
    assert_eq!(r.by_op.values().map(|o| o.ops).sum::<u64>(), r.ops);
    assert_eq!(r.by_op.values().map(|o| o.bytes).sum::<u64>(), r.bytes);
}

fn check_text(out: &str, summary_kinds: &[&str]) {
    assert!(out.starts_with("kelp s3 bench: "), "{out}");
    assert!(out.contains("lat avg ms"), "no progress header:\n{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("1 ")),
        "no progress line for second 1:\n{out}"
    );
    assert!(out.contains("cleaning up"), "{out}");
    let summary = out.split("Summary: ").nth(1).expect("summary");
    for kind in summary_kinds {
        assert!(summary.contains(&format!("  {kind} ")), "{kind}:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_and_mixed_against_s3s_fs() {
    let _one_at_a_time = MEASURING.lock().await;
    let server = start_fs_server().await;
    let bucket_dir = server.dir.path().join(BUCKET);

    let (r, out) = bench(server.addr, &["-c", "4", "-d", "2s", "put"]).await;
    let r = r.unwrap();
    check_report(&r, Mode::Put, 64 << 10, 4);
    assert_eq!(r.objects, 0);
    assert_eq!(r.seconds, 2.0);
    assert_eq!(r.by_op.keys().collect::<Vec<_>>(), ["put"]);
    check_text(&out, &["total"]);
    assert_eq!(
        count_files(&bucket_dir),
        0,
        "objects left after put:\n{out}"
    );

    let (r, out) = bench(
        server.addr,
        &["-c", "4", "-d", "2s", "--objects", "20", "--verify", "get"],
    )
    .await;
    let r = r.unwrap();
    check_report(&r, Mode::Get, 64 << 10, 4);
    assert_eq!(r.objects, 20);
    assert!(out.contains("preparing 20 objects of 64KiB"), "{out}");
    assert_eq!(r.by_op.keys().collect::<Vec<_>>(), ["get"]);
    assert_eq!(
        count_files(&bucket_dir),
        0,
        "objects left after get:\n{out}"
    );

    let (r, out) = bench(
        server.addr,
        &[
            "-c",
            "4",
            "-d",
            "2s",
            "--warmup",
            "1s",
            "--size",
            "4KiB",
            "--mixed-get-ratio",
            "0.5",
            "--verify",
            "mixed",
        ],
    )
    .await;
    let r = r.unwrap();
    check_report(&r, Mode::Mixed, 4 << 10, 4);
    assert_eq!(r.by_op.keys().collect::<Vec<_>>(), ["get", "put"]);
    for (kind, o) in &r.by_op {
        assert!(o.ops > 0, "{kind}: {o:?}");
    }
    check_text(&out, &["total", "get", "put"]);
    assert!(out.contains("(warm-up)"), "{out}");
    assert_eq!(
        count_files(&bucket_dir),
        0,
        "objects left after mixed:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_json_and_keep() {
    let _one_at_a_time = MEASURING.lock().await;
    let server = start_fs_server().await;
    let bucket_dir = server.dir.path().join(BUCKET);

    // 32 MiB objects, kept: every object the report counts is in the bucket afterwards.
    let (r, out) = bench(
        server.addr,
        &[
            "-c", "2", "-d", "3s", "--size", "32MiB", "--keep", "--prefix", "big/", "--format",
            "json", "put",
        ],
    )
    .await;
    let r = r.unwrap();
    check_report(&r, Mode::Put, 32 << 20, 2);
    // JSON mode prints the report and nothing else.
    assert_eq!(out.trim_end(), r.to_json());
    let printed: Report = serde_json::from_str(&out).unwrap();
    assert_eq!((printed.ops, printed.bytes), (r.ops, r.bytes));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["mode"], "put");
    assert!(v["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    let kept = count_files(&bucket_dir.join("big"));
    assert!(kept as u64 >= r.ops, "{kept} files for {} ops", r.ops);

    // GETs of 32 MiB objects, content checked.
    let (r, out) = bench(
        server.addr,
        &[
            "-c",
            "2",
            "-d",
            "4s",
            "--size",
            "32MiB",
            "--objects",
            "2",
            "--verify",
            "get",
        ],
    )
    .await;
    let r = r.unwrap();
    check_report(&r, Mode::Get, 32 << 20, 2);
    assert!(out.contains("Summary: get of 32MiB objects"), "{out}");
    assert_eq!(
        count_files(&bucket_dir),
        kept,
        "the get run must delete only its own objects"
    );
}

/// `--count` writes exactly that many objects and ends; `--segment` times blocks of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_ingest_with_segments() {
    let _one_at_a_time = MEASURING.lock().await;
    let server = start_fs_server().await;
    let bucket_dir = server.dir.path().join(BUCKET);

    let (r, out) = bench(
        server.addr,
        &[
            "-c",
            "3",
            "--size",
            "1KiB",
            "--count",
            "25",
            "--segment",
            "10",
            "--keep",
            "--prefix",
            "ingest/",
            "put",
        ],
    )
    .await;
    let r = r.unwrap();
    check_report(&r, Mode::Put, 1024, 3);
    assert_eq!(r.ops, 25, "{out}");
    assert_eq!(count_files(&bucket_dir.join("ingest")), 25, "{out}");
    assert!(out.contains("until 25 are written"), "{out}");
    let seg: Vec<(u64, bool)> = r.segments.iter().map(|s| (s.ops, s.partial)).collect();
    assert_eq!(seg, [(10, false), (10, false), (5, true)], "{out}");
    let seconds: f64 = r.segments.iter().map(|s| s.seconds).sum();
    assert!(
        (seconds - r.seconds).abs() < 1e-6,
        "{seconds} vs {}",
        r.seconds
    );
    assert!(r.last_vs_first().is_some());
    assert!(out.contains("segment   2: 10 ops in"), "{out}");
    assert!(out.contains("last complete segment vs first:"), "{out}");
    assert!(out.contains("kept 25 objects under ingest/"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_key_is_refused_clearly() {
    let server = start_fs_server().await;
    let args = bench_args(server.addr, "not-the-secret", &["-d", "1s", "put"]);
    let err = kelp_s3bench::run(&args, std::io::sink()).await.unwrap_err();
    let code = err.s3_code().map(str::to_string);
    assert!(
        matches!(
            code.as_deref(),
            Some("SignatureDoesNotMatch" | "AccessDenied")
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("CreateBucket"), "{msg}");
    assert!(msg.contains("403"), "{msg}");
    assert!(msg.contains("--secret-key"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_is_reported_as_such() {
    // A port that was just free: bind, note it, close.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let args = bench_args(addr, SK, &["-d", "1s", "put"]);
    let err = kelp_s3bench::run(&args, std::io::sink()).await.unwrap_err();
    assert!(matches!(err, BenchError::Connect { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("cannot connect to http://{addr}")),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
}

/// A server that creates any bucket but answers every PUT with 503 SlowDown.
async fn start_failing_server(puts: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let puts = puts.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let puts = puts.clone();
                async move {
                    let signed = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.starts_with("AWS4-HMAC-SHA256 Credential=kelpbench/"));
                    let object = req.uri().path().matches('/').count() > 1;
                    let is_put = req.method() == hyper::Method::PUT;
                    // Read the body, as S3 servers do, so that the connection stays usable.
                    let _ = req.into_body().collect().await;
                    let resp = if !signed {
                        Response::builder()
                            .status(403)
                            .body(Full::new(Bytes::new()))
                    } else if object && is_put {
                        puts.fetch_add(1, Ordering::Relaxed);
                        Response::builder().status(503).body(Full::new(Bytes::from(
                            "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
                        )))
                    } else {
                        Response::builder()
                            .status(200)
                            .body(Full::new(Bytes::new()))
                    };
                    Ok::<_, Infallible>(resp.unwrap())
                }
            });
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_where_every_request_fails_is_an_error() {
    let puts = Arc::new(AtomicU64::new(0));
    let addr = start_failing_server(puts.clone()).await;
    let (result, out) = bench(addr, &["-c", "2", "-d", "1s", "put"]).await;
    let err = result.unwrap_err();
    match &err {
        BenchError::AllFailed { errors, .. } => {
            assert!(*errors >= 2, "{err}");
            // Every failed PUT was counted (deletes of the clean-up are not PUTs).
            assert_eq!(*errors, puts.load(Ordering::Relaxed), "{err}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.s3_code(), Some("SlowDown"));
    assert!(
        err.to_string()
            .contains("503 SlowDown: Please reduce your request rate.")
    );
    // The first few errors were shown as they happened, and no more.
    let shown = out.lines().filter(|l| l.starts_with("error: ")).count();
    assert_eq!(shown, 5, "{out}");
    assert!(!out.contains("Summary"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_objects_work() {
    let _one_at_a_time = MEASURING.lock().await;
    let server = start_fs_server().await;
    for mode in ["put", "get"] {
        let (r, out) = bench(
            server.addr,
            &["-c", "2", "-d", "1s", "--size", "0", "--objects", "4", mode],
        )
        .await;
        let r = r.unwrap_or_else(|e| panic!("{mode}: {e}\n{out}"));
        assert_eq!(r.size, 0);
        assert!(r.ops > 0 && r.bytes == 0 && r.errors == 0, "{r:?}");
    }
}

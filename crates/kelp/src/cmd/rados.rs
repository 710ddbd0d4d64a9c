//! `kelp rados -p POOL …`: object commands and the `bench` load generator (like `rados`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use kelp_client::IoCtx;
use kelp_types::ByteSize;

use crate::cmd::OutputFormat;
use crate::cmd::common::{self, ConfArgs};

#[derive(Args, Debug)]
pub struct RadosArgs {
    /// Pool to operate on.
    #[arg(short = 'p', long = "pool", global = true)]
    pub pool: Option<String>,
    /// Object namespace.
    #[arg(short = 'N', long = "namespace", global = true, default_value = "")]
    pub namespace: String,
    #[command(flatten)]
    pub conf: ConfArgs,
    #[command(subcommand)]
    pub cmd: RadosCommand,
}

#[derive(Subcommand, Debug)]
pub enum RadosCommand {
    /// Store FILE (or stdin with -) as object NAME.
    Put { name: String, file: PathBuf },
    /// Write object NAME to FILE (or stdout with -).
    Get { name: String, file: PathBuf },
    /// List the pool's objects.
    Ls,
    /// Remove objects.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Size, modification time and version of an object.
    Stat {
        name: String,
        #[arg(long, value_enum, default_value = "plain")]
        format: OutputFormat,
    },
    /// Set an extended attribute.
    Setxattr {
        name: String,
        key: String,
        value: String,
    },
    /// Print an extended attribute.
    Getxattr { name: String, key: String },
    /// List extended attributes.
    Listxattr { name: String },
    /// Remove an extended attribute.
    Rmxattr { name: String, key: String },
    /// Set an omap key.
    Setomapval {
        name: String,
        key: String,
        value: String,
    },
    /// Print one omap value.
    Getomapval { name: String, key: String },
    /// List omap keys and values.
    Listomapvals { name: String },
    /// Remove omap keys.
    Rmomapkey {
        name: String,
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Load generator: SECONDS of `write` (then `seq` or `rand` reads of what was written with
    /// --no-cleanup), per-second progress, then a summary.
    Bench(BenchArgs),
    /// Remove objects left by `bench --no-cleanup`.
    Cleanup,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Length of the run in seconds.
    pub seconds: u64,
    /// write, seq (read each written object once, in order) or rand (random reads).
    #[arg(value_enum)]
    pub mode: BenchMode,
    /// Object size for writes.
    #[arg(short = 'b', long = "block-size", default_value = "4MiB")]
    pub block_size: ByteSize,
    /// Operations in flight.
    #[arg(short = 't', long = "concurrent-ios", default_value_t = 16)]
    pub concurrency: usize,
    /// Keep the written objects (so seq/rand can read them).
    #[arg(long)]
    pub no_cleanup: bool,
    #[arg(long, value_enum, default_value = "plain")]
    pub format: OutputFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    Write,
    Seq,
    Rand,
}

const BENCH_PREFIX: &str = "benchmark_data_";
const BENCH_META: &str = "benchmark_last_metadata";

pub fn run(a: RadosArgs) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        let Some(pool) = a.pool.clone() else {
            bail!("which pool? pass -p POOL");
        };
        let rados = a.conf.connect().await?;
        let mut io = rados.ioctx(&pool).await?;
        io.set_namespace(&a.namespace);
        match a.cmd {
            RadosCommand::Put { name, file } => {
                let data = read_input(&file)?;
                io.write_full(&name, data).await?;
            }
            RadosCommand::Get { name, file } => {
                let data = io.read(&name, 0, 0).await?;
                write_output(&file, &data)?;
            }
            RadosCommand::Ls => {
                let mut names = io.list_objects().await?;
                names.sort();
                let mut out = std::io::stdout().lock();
                for n in names {
                    writeln!(out, "{n}")?;
                }
            }
            RadosCommand::Rm { names } => {
                for n in names {
                    io.remove(&n)
                        .await
                        .with_context(|| format!("removing '{n}'"))?;
                }
            }
            RadosCommand::Stat { name, format } => {
                let st = io.stat(&name).await?;
                match format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!({"pool": pool, "name": name, "size": st.size,
                            "mtime_ns": st.mtime_ns, "version": st.version})
                    ),
                    OutputFormat::Plain => println!(
                        "{pool}/{name} mtime {}, size {}, version {}",
                        format_time(st.mtime_ns),
                        st.size,
                        st.version
                    ),
                }
            }
            RadosCommand::Setxattr { name, key, value } => io.set_xattr(&name, &key, value).await?,
            RadosCommand::Getxattr { name, key } => {
                let v = io.get_xattr(&name, &key).await?;
                std::io::stdout().write_all(&v)?;
                println!();
            }
            RadosCommand::Listxattr { name } => {
                for (k, _) in io.get_xattrs(&name).await? {
                    println!("{k}");
                }
            }
            RadosCommand::Rmxattr { name, key } => io.rm_xattr(&name, &key).await?,
            RadosCommand::Setomapval { name, key, value } => {
                io.omap_set(&name, &[(key, value)]).await?
            }
            RadosCommand::Getomapval { name, key } => {
                let found = io
                    .operate_read(
                        kelp_client::ReadOp::new().omap_get_vals_by_keys(&[&key]),
                        &name,
                    )
                    .await?;
                match found.first() {
                    Some(kelp_client::ReadResult::Pairs { entries, .. }) if !entries.is_empty() => {
                        std::io::stdout().write_all(&entries[0].1)?;
                        println!();
                    }
                    _ => bail!("no omap key '{key}' in '{name}'"),
                }
            }
            RadosCommand::Listomapvals { name } => {
                let mut after = String::new();
                loop {
                    let (entries, more) = io.omap_get_vals(&name, &after, "", 1000).await?;
                    for (k, v) in &entries {
                        println!("{k}\n  {}", String::from_utf8_lossy(v));
                    }
                    match entries.last() {
                        Some((k, _)) if more => after = k.clone(),
                        _ => break,
                    }
                }
            }
            RadosCommand::Rmomapkey { name, keys } => io.omap_rm_keys(&name, &keys).await?,
            RadosCommand::Bench(b) => bench(&io, b).await?,
            RadosCommand::Cleanup => {
                let n = cleanup(&io).await?;
                eprintln!("removed {n} benchmark objects");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn read_input(file: &PathBuf) -> Result<Bytes> {
    if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf)?;
        return Ok(Bytes::from(buf));
    }
    Ok(Bytes::from(
        std::fs::read(file).with_context(|| format!("reading {}", file.display()))?,
    ))
}

fn write_output(file: &PathBuf, data: &[u8]) -> Result<()> {
    if file.as_os_str() == "-" {
        std::io::stdout().write_all(data)?;
        return Ok(());
    }
    std::fs::write(file, data).with_context(|| format!("writing {}", file.display()))
}

fn format_time(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    format!("{secs}.{:09}", ns % 1_000_000_000)
}

/// Latency samples and counters shared by bench workers.
struct Stats {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    lat_us: std::sync::Mutex<Vec<u32>>,
}

async fn bench(io: &IoCtx, b: BenchArgs) -> Result<()> {
    if b.concurrency == 0 || b.seconds == 0 {
        bail!("bench needs SECONDS > 0 and -t > 0");
    }
    let json = b.format == OutputFormat::Json;
    let prefix = format!("{BENCH_PREFIX}{}_{}_", hostname(), std::process::id());
    let (size, objects) = match b.mode {
        BenchMode::Write => (b.block_size.0, 0u64),
        BenchMode::Seq | BenchMode::Rand => {
            let meta = io.read(BENCH_META, 0, 0).await.context(
                "no benchmark data to read: run `bench SECONDS write --no-cleanup` first",
            )?;
            let text = String::from_utf8_lossy(&meta).to_string();
            let mut parts = text.split_whitespace();
            let (Some(p), Some(n), Some(sz)) = (parts.next(), parts.next(), parts.next()) else {
                bail!("{BENCH_META} is malformed: '{text}'");
            };
            let n: u64 = n.parse().context("object count in bench metadata")?;
            let sz: u64 = sz.parse().context("object size in bench metadata")?;
            return read_bench(io, &b, p.to_string(), n, sz, json).await;
        }
    };
    if !json {
        println!(
            "Maintaining {} concurrent writes of {size} bytes to objects of size {size} for up to {} seconds",
            b.concurrency, b.seconds
        );
    }
    let stats = Arc::new(Stats {
        ops: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        lat_us: std::sync::Mutex::new(Vec::new()),
    });
    let next = Arc::new(AtomicU64::new(objects));
    let stop = Arc::new(AtomicBool::new(false));
    let payload = Bytes::from(vec![0x5au8; size as usize]);
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..b.concurrency {
        let (io, stats, next, stop, payload, prefix) = (
            io.clone(),
            stats.clone(),
            next.clone(),
            stop.clone(),
            payload.clone(),
            prefix.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match io
                    .write_full(&format!("{prefix}object{n}"), payload.clone())
                    .await
                {
                    Ok(_) => record(&stats, t, payload.len() as u64),
                    Err(e @ kelp_client::ClientError::Full(_)) => {
                        // Retrying cannot help: stop the benchmark (once) with the reason.
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        if !stop.swap(true, Ordering::Relaxed) {
                            eprintln!("write error: {e}; stopping the benchmark");
                        }
                    }
                    Err(e) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("write error: {e}");
                    }
                }
            }
        }));
    }
    progress(&stats, start, b.seconds, json, &stop).await;
    for w in workers {
        let _ = w.await;
    }
    let elapsed = start.elapsed();
    let written = next.load(Ordering::Relaxed);
    summarize(&stats, elapsed, size, "write", json);
    if b.no_cleanup {
        io.write_full(BENCH_META, format!("{prefix} {written} {size}"))
            .await?;
    } else {
        let t = Instant::now();
        let removed = remove_prefix(io, &prefix, written).await?;
        if !json {
            eprintln!(
                "Cleaned up {removed} objects in {:.1}s",
                t.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

async fn read_bench(
    io: &IoCtx,
    b: &BenchArgs,
    prefix: String,
    objects: u64,
    size: u64,
    json: bool,
) -> Result<()> {
    if objects == 0 {
        bail!("the previous write benchmark wrote no objects");
    }
    let stats = Arc::new(Stats {
        ops: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        lat_us: std::sync::Mutex::new(Vec::new()),
    });
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let seq = b.mode == BenchMode::Seq;
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..b.concurrency {
        let (io, stats, next, stop, prefix) = (
            io.clone(),
            stats.clone(),
            next.clone(),
            stop.clone(),
            prefix.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                let n = if seq {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= objects {
                        break;
                    }
                    n
                } else {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % objects
                };
                let t = Instant::now();
                match io.read(&format!("{prefix}object{n}"), 0, 0).await {
                    Ok(d) if d.len() as u64 == size => record(&stats, t, d.len() as u64),
                    Ok(d) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("object{n}: read {} bytes, expected {size}", d.len());
                    }
                    Err(e) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("read error: {e}");
                    }
                }
            }
        }));
    }
    let all_done = {
        let workers_done = futures_all(workers);
        tokio::pin!(workers_done);
        tokio::select! {
            _ = progress(&stats, start, b.seconds, json, &stop) => false,
            _ = &mut workers_done => true,
        }
    };
    stop.store(true, Ordering::Relaxed);
    let _ = all_done;
    // Give in-flight reads a moment to finish so their latencies count.
    tokio::time::sleep(Duration::from_millis(50)).await;
    summarize(
        &stats,
        start.elapsed(),
        size,
        if seq { "seq" } else { "rand" },
        json,
    );
    Ok(())
}

async fn futures_all(workers: Vec<tokio::task::JoinHandle<()>>) {
    for w in workers {
        let _ = w.await;
    }
}

fn record(stats: &Stats, t: Instant, bytes: u64) {
    let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
    stats.ops.fetch_add(1, Ordering::Relaxed);
    stats.bytes.fetch_add(bytes, Ordering::Relaxed);
    if let Ok(mut l) = stats.lat_us.lock() {
        l.push(us);
    }
}

/// Prints one line per second until `seconds` pass, then sets `stop`.
async fn progress(stats: &Stats, start: Instant, seconds: u64, json: bool, stop: &AtomicBool) {
    if !json {
        println!("  sec Cur ops   started  finished  avg MB/s  cur MB/s");
    }
    let mut last_bytes = 0u64;
    for sec in 1..=seconds {
        let target = start + Duration::from_secs(sec);
        tokio::time::sleep_until(target.into()).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let bytes = stats.bytes.load(Ordering::Relaxed);
        let ops = stats.ops.load(Ordering::Relaxed);
        if !json {
            let el = start.elapsed().as_secs_f64();
            println!(
                "{sec:>5} {:>8} {:>9} {:>9} {:>9.2} {:>9.2}",
                "-",
                ops,
                ops,
                bytes as f64 / el / 1048576.0,
                (bytes - last_bytes) as f64 / 1048576.0
            );
        }
        last_bytes = bytes;
    }
    stop.store(true, Ordering::Relaxed);
}

fn summarize(stats: &Stats, elapsed: Duration, size: u64, mode: &str, json: bool) {
    let ops = stats.ops.load(Ordering::Relaxed);
    let bytes = stats.bytes.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    let mut lat = stats.lat_us.lock().map(|l| l.clone()).unwrap_or_default();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 - 1.0) * p).round() as usize;
        lat[i] as f64 / 1000.0
    };
    let avg = if lat.is_empty() {
        0.0
    } else {
        lat.iter().map(|&l| l as f64).sum::<f64>() / lat.len() as f64 / 1000.0
    };
    let bw = bytes as f64 / secs / 1048576.0;
    let iops = ops as f64 / secs;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "mode": mode, "ops": ops, "seconds": secs, "object_size": size,
                "bandwidth_mib_s": bw, "iops": iops, "errors": stats.errors.load(Ordering::Relaxed),
                "latency_ms": {"avg": avg, "p50": pct(0.5), "p99": pct(0.99),
                    "min": lat.first().map_or(0.0, |&l| l as f64 / 1000.0),
                    "max": lat.last().map_or(0.0, |&l| l as f64 / 1000.0)},
            })
        );
        return;
    }
    println!("Total time run:         {secs:.3}");
    println!("Total {mode}s made:      {ops}");
    println!("Object size:            {size}");
    println!("Bandwidth (MB/sec):     {bw:.3}");
    println!("Average IOPS:           {iops:.0}");
    println!("Average Latency(ms):    {avg:.3}");
    println!("p50 Latency(ms):        {:.3}", pct(0.5));
    println!("p99 Latency(ms):        {:.3}", pct(0.99));
    println!(
        "Max latency(ms):        {:.3}",
        lat.last().map_or(0.0, |&l| l as f64 / 1000.0)
    );
    println!(
        "Min latency(ms):        {:.3}",
        lat.first().map_or(0.0, |&l| l as f64 / 1000.0)
    );
    let errors = stats.errors.load(Ordering::Relaxed);
    if errors > 0 {
        println!("Errors:                 {errors}");
    }
}

async fn remove_prefix(io: &IoCtx, prefix: &str, count: u64) -> Result<u64> {
    let removed = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (io, removed, next, prefix) = (
            io.clone(),
            removed.clone(),
            next.clone(),
            prefix.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    break;
                }
                if io.remove(&format!("{prefix}object{n}")).await.is_ok() {
                    removed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    Ok(removed.load(Ordering::Relaxed))
}

async fn cleanup(io: &IoCtx) -> Result<u64> {
    let mut n = 0;
    for name in io.list_objects().await? {
        if name.starts_with(BENCH_PREFIX) || name == BENCH_META {
            io.remove(&name).await?;
            n += 1;
        }
    }
    Ok(n)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

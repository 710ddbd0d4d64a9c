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
use kelp_client::{ClientError, IoCtx};
use kelp_types::ByteSize;

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Args, Debug)]
pub struct RadosArgs {
    /// Pool to operate on.
    #[arg(short = 'p', long = "pool", global = true)]
    pub pool: Option<String>,
    /// Object namespace.
    #[arg(short = 'N', long = "namespace", global = true, default_value = "")]
    pub namespace: String,
    /// Read at this self-managed snapshot id (get, stat, listxattr, getxattr, getomapval,
    /// listomapvals see the object as it was then); writes are refused with it.
    #[arg(
        long = "snap-id",
        visible_alias = "snapid",
        global = true,
        value_name = "N"
    )]
    pub snap_id: Option<u64>,
    /// Write under this snapshot context: `SEQ` or `SEQ:ID,ID,…` (the pool's existing
    /// snapshot ids, newest first, none above SEQ). The first write to an object after a
    /// snapshot keeps its old state as a clone.
    #[arg(long = "snap-context", global = true, value_name = "SEQ[:IDS]")]
    pub snap_context: Option<String>,
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
    Stat { name: String },
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
    /// Load generator: SECONDS of `write` (then `seq`/`rand` reads or `overwrite`s of the objects
    /// written with --no-cleanup), per-second progress, then a summary.
    Bench(BenchArgs),
    /// Remove objects left by `bench --no-cleanup`.
    Cleanup,
    /// Watch object NAME (which must exist): print each notification as it arrives
    /// (`NOTIFY cookie=C notify_id=N from=INSTANCE: MESSAGE`) and acknowledge it, until
    /// SIGINT/SIGTERM (like `rados watch`). The first line names this watcher.
    Watch {
        name: String,
        /// Reply sent with each acknowledgement (the notifier prints it).
        #[arg(long, default_value = "")]
        reply: String,
    },
    /// Notify the watchers of object NAME with MESSAGE and print their acknowledgements
    /// (`reply from INSTANCE cookie=C: REPLY`) and the watchers that did not answer in time
    /// (`timed out: INSTANCE cookie=C`) (like `rados notify`).
    Notify {
        name: String,
        message: String,
        /// Seconds to wait for the watchers' acknowledgements.
        #[arg(long, default_value_t = 10.0)]
        timeout: f64,
    },
    /// List the watchers of object NAME (`watcher=INSTANCE cookie=C`; like
    /// `rados listwatchers`).
    Listwatchers { name: String },
    /// An object's snapshots: its clones, the snapshot ids each serves and their sizes, and
    /// the head (like `rados listsnaps`; `--format json` for a document).
    Listsnaps { name: String },
    /// Make object NAME what it was at self-managed snapshot SNAPID (removed if it did not
    /// exist then), under the --snap-context given (it may keep the current state as a clone).
    Rollback {
        name: String,
        #[arg(value_name = "SNAPID")]
        snap: u64,
    },
}

#[derive(Args, Debug)]
#[command(after_help = "\
Modes:
  write      write_full objects of -b bytes (new objects, named benchmark_data_HOST_PID_objectN);
             with --no-cleanup they stay and the object list is recorded in the pool's
             benchmark_last_metadata object for the modes below
  seq        read each object of the last `write --no-cleanup` once, in order
  rand       read random objects of the last `write --no-cleanup`
  overwrite  write -b bytes (e.g. -b 4KiB) at random offsets aligned to -b inside random objects
             of the last `write --no-cleanup`: the object count stays the same (like fio
             randwrite on an RBD image); -b must not exceed their size

Per-second progress goes to stdout, one line per second, flushed (plain: `sec cur_ops started
finished avg_MB/s cur_MB/s`; with --progress-json: a JSON object per second with `sec`,
`ops` (finished so far), `ops_sec` (finished in that second), `errors`, `bytes`, `in_flight`).
The summary follows (JSON with --format json). SIGINT or SIGTERM ends the run early, with the
summary; ops still in flight 5 s after the end are abandoned.

Example (recovery benchmark load): 
  kelp rados -p data bench 3600 write -b 4MiB --max-objects 768 --no-cleanup
  kelp rados -p data bench 120 overwrite -b 4KiB -t 16 --progress-json --format json")]
pub struct BenchArgs {
    /// Length of the run in seconds.
    pub seconds: u64,
    /// write, seq, rand or overwrite (see below).
    #[arg(value_enum)]
    pub mode: BenchMode,
    /// Object size for writes; write size for overwrite.
    #[arg(short = 'b', long = "block-size", default_value = "4MiB")]
    pub block_size: ByteSize,
    /// Operations in flight.
    #[arg(short = 't', long = "concurrent-ios", default_value_t = 16)]
    pub concurrency: usize,
    /// Keep the written objects (so seq/rand/overwrite can use them).
    #[arg(long)]
    pub no_cleanup: bool,
    /// write: stop after this many objects (0: no limit, only SECONDS).
    #[arg(long, default_value_t = 0)]
    pub max_objects: u64,
    /// Print each second's progress as one JSON line (flushed) instead of the plain table.
    #[arg(long)]
    pub progress_json: bool,
    /// The global --format, for the summary.
    #[arg(skip)]
    pub format: OutputFormat,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchMode {
    Write,
    Seq,
    Rand,
    Overwrite,
}

const BENCH_PREFIX: &str = "benchmark_data_";
const BENCH_META: &str = "benchmark_last_metadata";

pub fn run(a: RadosArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        let Some(pool) = a.pool.clone() else {
            bail!("which pool? pass -p POOL");
        };
        let rados = g.conf.connect().await?;
        let mut io = rados.ioctx(&pool).await?;
        io.set_namespace(&a.namespace);
        io.set_read_snap(a.snap_id);
        if let Some(spec) = &a.snap_context {
            let (seq, snaps) = parse_snap_context(spec)?;
            io.set_snap_context(seq, snaps)?;
        }
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
            RadosCommand::Stat { name } => {
                let st = io.stat(&name).await?;
                match g.format {
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
            RadosCommand::Bench(mut b) => {
                b.format = g.format;
                bench(&io, b).await?
            }
            RadosCommand::Cleanup => {
                let n = cleanup(&io).await?;
                eprintln!("removed {n} benchmark objects");
            }
            RadosCommand::Watch { name, reply } => watch(&io, &name, reply, g.format).await?,
            RadosCommand::Notify {
                name,
                message,
                timeout,
            } => {
                if !(timeout.is_finite() && timeout > 0.0) {
                    bail!("--timeout must be a positive number of seconds");
                }
                let result = io
                    .notify(
                        &name,
                        Bytes::from(message.into_bytes()),
                        Duration::from_secs_f64(timeout),
                    )
                    .await?;
                let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
                match g.format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!({
                            "acks": result.acks.iter().map(|a| serde_json::json!({
                                "instance": a.watcher.instance,
                                "cookie": a.watcher.cookie,
                                "reply": text(&a.reply),
                            })).collect::<Vec<_>>(),
                            "timed_out": result.timed_out.iter().map(|w| serde_json::json!({
                                "instance": w.instance,
                                "cookie": w.cookie,
                            })).collect::<Vec<_>>(),
                        })
                    ),
                    OutputFormat::Plain => {
                        for a in &result.acks {
                            println!(
                                "reply from {} cookie={}: {}",
                                a.watcher.instance,
                                a.watcher.cookie,
                                text(&a.reply)
                            );
                        }
                        for w in &result.timed_out {
                            println!("timed out: {} cookie={}", w.instance, w.cookie);
                        }
                    }
                }
            }
            RadosCommand::Listwatchers { name } => {
                let watchers = io.watchers(&name).await?;
                match g.format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!(
                            watchers
                                .iter()
                                .map(|w| serde_json::json!({
                                    "instance": w.instance,
                                    "cookie": w.cookie,
                                }))
                                .collect::<Vec<_>>()
                        )
                    ),
                    OutputFormat::Plain => {
                        for w in watchers {
                            println!("watcher={} cookie={}", w.instance, w.cookie);
                        }
                    }
                }
            }
            RadosCommand::Listsnaps { name } => {
                let ss = io.list_snaps(&name).await?;
                match g.format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!({"name": name, "seq": ss.seq,
                            "head_size": ss.head_size, "clones": ss.clones})
                    ),
                    OutputFormat::Plain => print!("{}", format_snaps(&name, &ss)),
                }
            }
            RadosCommand::Rollback { name, snap } => {
                io.rollback(&name, snap).await?;
                eprintln!("rolled back '{name}' to snapshot {snap}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `rados watch`: prints notifications and acknowledges them until interrupted.
async fn watch(io: &IoCtx, name: &str, reply: String, format: OutputFormat) -> Result<()> {
    let mut w = io.watch(name).await?;
    let me = io.rados().instance();
    println!("watching {name} as {me} cookie={}", w.cookie());
    std::io::stdout().flush()?;
    let reply = Bytes::from(reply.into_bytes());
    let stop = interrupted();
    tokio::pin!(stop);
    loop {
        let event = tokio::select! {
            () = &mut stop => break,
            e = w.next() => e,
        };
        match event {
            Some(kelp_client::WatchEvent::Notify(n)) => {
                let msg = String::from_utf8_lossy(&n.payload);
                match format {
                    OutputFormat::Json => println!(
                        "{}",
                        serde_json::json!({"cookie": w.cookie(), "notify_id": n.id,
                            "notifier": n.notifier, "payload": msg})
                    ),
                    OutputFormat::Plain => println!(
                        "NOTIFY cookie={} notify_id={} from={}: {msg}",
                        w.cookie(),
                        n.id,
                        n.notifier
                    ),
                }
                std::io::stdout().flush()?;
                if let Err(e) = w.ack(n.id, reply.clone()).await {
                    eprintln!("acknowledging notify {}: {e}", n.id);
                }
            }
            Some(kelp_client::WatchEvent::Error(e)) => bail!("watch on '{name}' ended: {e}"),
            None => break,
        }
    }
    w.unwatch().await?;
    Ok(())
}

/// `SEQ` or `SEQ:ID,ID,…`.
fn parse_snap_context(spec: &str) -> Result<(u64, Vec<u64>)> {
    let (seq, ids) = spec.split_once(':').unwrap_or((spec, ""));
    let seq = seq
        .trim()
        .parse::<u64>()
        .with_context(|| format!("--snap-context: '{seq}' is not a snapshot id"))?;
    let snaps = ids
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .with_context(|| format!("--snap-context: '{s}' is not a snapshot id"))
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok((seq, snaps))
}

/// `rados listsnaps`'s table.
fn format_snaps(name: &str, ss: &kelp_client::SnapSet) -> String {
    let mut out = format!("{name}:\ncloneid\tsnaps\tsize\n");
    for c in &ss.clones {
        let snaps: Vec<String> = c.snaps.iter().map(u64::to_string).collect();
        out.push_str(&format!("{}\t[{}]\t{}\n", c.id, snaps.join(","), c.size));
    }
    if let Some(size) = ss.head_size {
        out.push_str(&format!("head\t-\t{size}\n"));
    }
    out
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
#[derive(Default)]
struct Stats {
    started: AtomicU64,
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    lat_us: std::sync::Mutex<Vec<u32>>,
}

/// The objects a `write --no-cleanup` left, from the pool's metadata object.
struct BenchObjects {
    prefix: String,
    count: u64,
    size: u64,
}

async fn bench_objects(io: &IoCtx) -> Result<BenchObjects> {
    let meta = io
        .read(BENCH_META, 0, 0)
        .await
        .context("no benchmark data: run `bench SECONDS write --no-cleanup` first")?;
    let text = String::from_utf8_lossy(&meta).to_string();
    parse_bench_meta(&text)
}

/// `PREFIX COUNT SIZE`, as a `write --no-cleanup` records it.
fn parse_bench_meta(text: &str) -> Result<BenchObjects> {
    let mut parts = text.split_whitespace();
    let (Some(p), Some(n), Some(sz)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("{BENCH_META} is malformed: '{text}'");
    };
    let count: u64 = n.parse().context("object count in bench metadata")?;
    let size: u64 = sz.parse().context("object size in bench metadata")?;
    if count == 0 {
        bail!("the previous write benchmark wrote no objects");
    }
    Ok(BenchObjects {
        prefix: p.to_string(),
        count,
        size,
    })
}

/// A small xorshift generator per worker (no shared state, reproducible per worker).
struct Rng(u64);

impl Rng {
    fn new(worker: usize) -> Self {
        Rng(0x9e37_79b9_7f4a_7c15u64 ^ (worker as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Where an overwrite goes: a random object and a random offset aligned to `block` such that
/// the write fits in the object (`block <= size`, checked by the caller).
fn overwrite_target(rng: &mut Rng, objects: u64, size: u64, block: u64) -> (u64, u64) {
    let object = rng.next() % objects;
    let slots = (size / block).max(1);
    (object, (rng.next() % slots) * block)
}

async fn bench(io: &IoCtx, b: BenchArgs) -> Result<()> {
    if b.concurrency == 0 || b.seconds == 0 {
        bail!("bench needs SECONDS > 0 and -t > 0");
    }
    match b.mode {
        BenchMode::Write => write_bench(io, &b).await,
        BenchMode::Seq | BenchMode::Rand => read_bench(io, &b, bench_objects(io).await?).await,
        BenchMode::Overwrite => overwrite_bench(io, &b, bench_objects(io).await?).await,
    }
}

async fn write_bench(io: &IoCtx, b: &BenchArgs) -> Result<()> {
    let json = b.format == OutputFormat::Json;
    let prefix = format!("{BENCH_PREFIX}{}_{}_", hostname(), std::process::id());
    let size = b.block_size.0;
    if !json {
        println!(
            "Maintaining {} concurrent writes of {size} bytes to objects of size {size} for up to {} seconds{}",
            b.concurrency,
            b.seconds,
            if b.max_objects > 0 {
                format!(" or {} objects", b.max_objects)
            } else {
                String::new()
            }
        );
    }
    let stats = Arc::new(Stats::default());
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let payload = Bytes::from(vec![0x5au8; size as usize]);
    let max = if b.max_objects == 0 {
        u64::MAX
    } else {
        b.max_objects
    };
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
                if n >= max {
                    break;
                }
                stats.started.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match io
                    .write_full(&format!("{prefix}object{n}"), payload.clone())
                    .await
                {
                    Ok(_) => record(&stats, t, payload.len() as u64),
                    Err(e) => write_error(&stats, &stop, e),
                }
            }
        }));
    }
    let elapsed = run_workers(&stats, start, b, &stop, workers).await;
    let written = next.load(Ordering::Relaxed).min(max);
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

/// Counts a failed write; a full cluster stops the benchmark (retrying cannot help).
fn write_error(stats: &Stats, stop: &AtomicBool, e: kelp_client::ClientError) {
    stats.errors.fetch_add(1, Ordering::Relaxed);
    if matches!(e, kelp_client::ClientError::Full(_)) {
        if !stop.swap(true, Ordering::Relaxed) {
            eprintln!("write error: {e}; stopping the benchmark");
        }
    } else {
        eprintln!("write error: {e}");
    }
}

async fn overwrite_bench(io: &IoCtx, b: &BenchArgs, objs: BenchObjects) -> Result<()> {
    let json = b.format == OutputFormat::Json;
    let block = b.block_size.0;
    if block == 0 || block > objs.size {
        bail!(
            "overwrite: -b {block} must be between 1 and the objects' size ({} bytes)",
            objs.size
        );
    }
    if !json {
        println!(
            "Maintaining {} concurrent writes of {block} bytes at random aligned offsets in {} objects of size {} for up to {} seconds",
            b.concurrency, objs.count, objs.size, b.seconds
        );
    }
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let payload = Bytes::from(vec![0xa5u8; block as usize]);
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..b.concurrency {
        let (io, stats, stop, payload, prefix) = (
            io.clone(),
            stats.clone(),
            stop.clone(),
            payload.clone(),
            objs.prefix.clone(),
        );
        let (count, size) = (objs.count, objs.size);
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(w);
            while !stop.load(Ordering::Relaxed) {
                let (n, off) = overwrite_target(&mut rng, count, size, block);
                stats.started.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                match io
                    .write(&format!("{prefix}object{n}"), off, payload.clone())
                    .await
                {
                    Ok(_) => record(&stats, t, block),
                    Err(e) => write_error(&stats, &stop, e),
                }
            }
        }));
    }
    let elapsed = run_workers(&stats, start, b, &stop, workers).await;
    summarize(&stats, elapsed, block, "overwrite", json);
    Ok(())
}

async fn read_bench(io: &IoCtx, b: &BenchArgs, objs: BenchObjects) -> Result<()> {
    let json = b.format == OutputFormat::Json;
    let stats = Arc::new(Stats::default());
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let seq = b.mode == BenchMode::Seq;
    let (objects, size) = (objs.count, objs.size);
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..b.concurrency {
        let (io, stats, next, stop, prefix) = (
            io.clone(),
            stats.clone(),
            next.clone(),
            stop.clone(),
            objs.prefix.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(w);
            while !stop.load(Ordering::Relaxed) {
                let n = if seq {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= objects {
                        break;
                    }
                    n
                } else {
                    rng.next() % objects
                };
                stats.started.fetch_add(1, Ordering::Relaxed);
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
    let elapsed = run_workers(&stats, start, b, &stop, workers).await;
    summarize(
        &stats,
        elapsed,
        size,
        if seq { "seq" } else { "rand" },
        json,
    );
    Ok(())
}

/// Runs the progress lines until SECONDS pass, the workers finish on their own (seq reads,
/// --max-objects) or a SIGINT/SIGTERM arrives; then stops the workers, lets their ops in flight
/// finish (so their latencies count) and returns the elapsed time.
async fn run_workers(
    stats: &Stats,
    start: Instant,
    b: &BenchArgs,
    stop: &AtomicBool,
    workers: Vec<tokio::task::JoinHandle<()>>,
) -> Duration {
    let style = if b.progress_json {
        ProgressStyle::Json
    } else if b.format == OutputFormat::Json {
        ProgressStyle::None
    } else {
        ProgressStyle::Plain
    };
    let mut handles = workers;
    {
        let workers_done = futures_all(&mut handles);
        tokio::pin!(workers_done);
        tokio::select! {
            _ = progress(stats, start, b.seconds, style, stop) => {}
            _ = &mut workers_done => {}
            _ = interrupted() => eprintln!("interrupted: stopping the benchmark"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    // ops in flight finish (their latencies count), but an op stuck on an unreachable cluster
    // must not hold the summary back for the client's whole op timeout
    let drained = tokio::time::timeout(DRAIN_GRACE, futures_all(&mut handles)).await;
    if drained.is_err() {
        let stuck = stats.started.load(Ordering::Relaxed).saturating_sub(
            stats.ops.load(Ordering::Relaxed) + stats.errors.load(Ordering::Relaxed),
        );
        eprintln!(
            "{stuck} ops still in flight {}s after the end: abandoned",
            DRAIN_GRACE.as_secs()
        );
        for w in &handles {
            w.abort();
        }
    }
    elapsed
}

/// How long the ops in flight at the end of a run may take to finish.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut i), Ok(mut t)) => {
            tokio::select! {
                _ = i.recv() => {}
                _ = t.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// Waits for every worker without consuming the handles (if this is cancelled, the caller
/// awaits those not finished yet).
async fn futures_all(workers: &mut [tokio::task::JoinHandle<()>]) {
    for w in workers.iter_mut() {
        if !w.is_finished() {
            let _ = w.await;
        }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProgressStyle {
    None,
    Plain,
    Json,
}

/// One second's progress (counters are cumulative; `prev_*` are those a second earlier).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Tick {
    sec: u64,
    elapsed: f64,
    started: u64,
    ops: u64,
    prev_ops: u64,
    bytes: u64,
    prev_bytes: u64,
    errors: u64,
}

impl Tick {
    fn plain(&self) -> String {
        format!(
            "{:>5} {:>8} {:>9} {:>9} {:>9.2} {:>9.2}",
            self.sec,
            self.started.saturating_sub(self.ops + self.errors),
            self.started,
            self.ops,
            self.bytes as f64 / self.elapsed.max(1e-9) / 1048576.0,
            (self.bytes - self.prev_bytes) as f64 / 1048576.0
        )
    }

    fn json(&self) -> String {
        serde_json::json!({
            "sec": self.sec, "ops": self.ops, "ops_sec": self.ops - self.prev_ops,
            "errors": self.errors, "bytes": self.bytes,
            "bytes_sec": self.bytes - self.prev_bytes,
            "in_flight": self.started.saturating_sub(self.ops + self.errors),
        })
        .to_string()
    }
}

/// Prints one line per second until `seconds` pass, then sets `stop`. Each line is flushed, so
/// a file the output is redirected to holds every finished second.
async fn progress(
    stats: &Stats,
    start: Instant,
    seconds: u64,
    style: ProgressStyle,
    stop: &AtomicBool,
) {
    if style == ProgressStyle::Plain {
        println!("  sec Cur ops   started  finished  avg MB/s  cur MB/s");
    }
    let (mut prev_ops, mut prev_bytes) = (0u64, 0u64);
    for sec in 1..=seconds {
        let target = start + Duration::from_secs(sec);
        tokio::time::sleep_until(target.into()).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let tick = Tick {
            sec,
            elapsed: start.elapsed().as_secs_f64(),
            started: stats.started.load(Ordering::Relaxed),
            ops: stats.ops.load(Ordering::Relaxed),
            prev_ops,
            bytes: stats.bytes.load(Ordering::Relaxed),
            prev_bytes,
            errors: stats.errors.load(Ordering::Relaxed),
        };
        let line = match style {
            ProgressStyle::None => None,
            ProgressStyle::Plain => Some(tick.plain()),
            ProgressStyle::Json => Some(tick.json()),
        };
        if let Some(line) = line {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        (prev_ops, prev_bytes) = (tick.ops, tick.bytes);
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

/// Removes the benchmark's objects, 16 at a time (one per round trip took minutes for the tens
/// of thousands a small-object run leaves); the metadata object goes last, so an interrupted
/// cleanup can be run again.
async fn cleanup(io: &IoCtx) -> Result<u64> {
    use futures::StreamExt;
    let names: Vec<String> = io
        .list_objects()
        .await?
        .into_iter()
        .filter(|n| n.starts_with(BENCH_PREFIX))
        .collect();
    let mut removals = futures::stream::iter(names.iter())
        .map(|name| async move {
            match io.remove(name).await {
                // removed meanwhile (a concurrent cleanup): that is what we want
                Ok(()) | Err(ClientError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(16);
    while let Some(r) = removals.next().await {
        r?;
    }
    let mut n = names.len() as u64;
    match io.remove(BENCH_META).await {
        Ok(()) => n += 1,
        Err(ClientError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(n)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_metadata_parses_or_explains() {
        let o = parse_bench_meta("benchmark_data_h_12_ 768 4194304").unwrap();
        assert_eq!(
            (o.prefix.as_str(), o.count, o.size),
            ("benchmark_data_h_12_", 768, 4194304)
        );
        assert!(parse_bench_meta("benchmark_data_h_12_ 768").is_err());
        assert!(parse_bench_meta("p x 4096").is_err());
        assert!(parse_bench_meta("p 0 4096").is_err());
    }

    #[test]
    fn overwrites_are_aligned_inside_the_objects_and_spread_over_them() {
        let (objects, size, block) = (768u64, 4u64 << 20, 4096u64);
        let mut rng = Rng::new(3);
        let mut seen = std::collections::HashSet::new();
        let mut offsets = std::collections::HashSet::new();
        for _ in 0..200_000 {
            let (n, off) = overwrite_target(&mut rng, objects, size, block);
            assert!(n < objects);
            assert_eq!(off % block, 0);
            assert!(off + block <= size);
            seen.insert(n);
            offsets.insert(off);
        }
        assert_eq!(seen.len() as u64, objects);
        assert!(offsets.len() > 900, "{}", offsets.len()); // of 1024 slots
        // a block the size of the object always writes at 0
        let (_, off) = overwrite_target(&mut rng, 4, 4096, 4096);
        assert_eq!(off, 0);
        // workers draw different sequences
        assert_ne!(Rng::new(0).next(), Rng::new(1).next());
    }

    #[test]
    fn progress_lines_count_per_second_ops() {
        let t = Tick {
            sec: 7,
            elapsed: 7.0,
            started: 1016,
            ops: 1000,
            prev_ops: 850,
            bytes: 1000 * 4096,
            prev_bytes: 850 * 4096,
            errors: 0,
        };
        let j: serde_json::Value = serde_json::from_str(&t.json()).unwrap();
        assert_eq!(j["sec"], 7);
        assert_eq!(j["ops"], 1000);
        assert_eq!(j["ops_sec"], 150);
        assert_eq!(j["bytes_sec"], 150 * 4096);
        assert_eq!(j["in_flight"], 16);
        let plain = t.plain();
        let cols: Vec<&str> = plain.split_whitespace().collect();
        assert_eq!(cols, ["7", "16", "1016", "1000", "0.56", "0.59"]);
    }
}

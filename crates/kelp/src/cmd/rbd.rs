//! `kelp rbd …`: block images (like Ceph's `rbd`): create, list, inspect, resize, remove,
//! rename, snapshots, clones, import/export and a load generator.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use kelp_rbd::{CreateOptions, Image, Rbd};
use kelp_types::ByteSize;

use crate::cmd::OutputFormat;
use crate::cmd::common;

/// The pool images live in when a spec names none (as Ceph's `rbd`).
pub const DEFAULT_POOL: &str = "rbd";

#[derive(Args, Debug)]
pub struct RbdArgs {
    /// Pool of the images named without one (`[POOL/]IMAGE[@SNAP]`).
    #[arg(short = 'p', long = "pool", global = true, default_value = DEFAULT_POOL)]
    pub pool: String,
    /// Hide progress bars (they are drawn only on a terminal anyway).
    #[arg(long, global = true)]
    pub no_progress: bool,
    #[command(subcommand)]
    pub cmd: RbdCommand,
}

#[derive(Subcommand, Debug)]
pub enum RbdCommand {
    /// Create a thin-provisioned image: no space is used until data is written.
    Create {
        /// `[POOL/]IMAGE`.
        image: String,
        /// Size (e.g. 10G, 512M, 4096).
        #[arg(short = 's', long)]
        size: ByteSize,
        /// Size of the data objects: a power of two from 4K to 32M (default 4M).
        #[arg(long, conflicts_with = "order")]
        object_size: Option<ByteSize>,
        /// log2 of the object size (12-25), as an alternative to --object-size.
        #[arg(long)]
        order: Option<u8>,
        /// Striping: bytes written to one object before moving to the next (divides the
        /// object size; with --stripe-count).
        #[arg(long, requires = "stripe_count")]
        stripe_unit: Option<ByteSize>,
        /// Striping: how many objects consecutive stripe units go round-robin over.
        #[arg(long, requires = "stripe_unit")]
        stripe_count: Option<u64>,
        /// Keep the data objects in this pool (e.g. an erasure-coded one); the header stays in
        /// the image's (replicated) pool.
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// List the images of the pool.
    #[command(alias = "list")]
    Ls {
        /// One line per image with size, parent and format.
        #[arg(short = 'l', long)]
        long: bool,
    },
    /// Show an image's (or a snapshot's) size, layout, parent and snapshot count.
    Info { image: String },
    /// Grow or shrink an image.
    Resize {
        image: String,
        #[arg(short = 's', long)]
        size: ByteSize,
        /// Shrinking discards the data past the new end: say so.
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Remove an image and its data (refused while it has snapshots).
    #[command(alias = "remove")]
    Rm { image: String },
    /// Rename an image (within its pool).
    #[command(alias = "rename")]
    Mv { src: String, dst: String },
    /// Provisioned and used space of one image or of every image in the pool.
    #[command(alias = "disk-usage")]
    Du { image: Option<String> },
    /// Snapshots: create, ls, rm, rollback, protect, unprotect, purge.
    #[command(subcommand)]
    Snap(SnapCommand),
    /// Clone a protected snapshot (`PARENT@SNAP`) into a new image that shares its data until
    /// written (copy-on-write).
    Clone {
        parent: String,
        child: String,
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// Copy the data a clone still reads from its parent, and detach it from the parent.
    Flatten { image: String },
    /// List the clones of a snapshot (`IMAGE@SNAP`) or of every snapshot of an image.
    Children { image: String },
    /// Import a raw file (or stdin with -) as a new image; zero blocks are skipped (sparse).
    Import {
        file: PathBuf,
        image: String,
        #[arg(long)]
        object_size: Option<ByteSize>,
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// Export an image (or `IMAGE@SNAP`) to a raw file (sparse: holes are not written) or
    /// stdout with -.
    Export { image: String, file: PathBuf },
    /// The image's exclusive lock: `lock ls IMAGE` shows who holds it.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Which clients have the image open (watchers of its header).
    Status { image: String },
    /// Load generator like `rbd bench`: per-second progress, then totals with latency
    /// percentiles. It takes the image's exclusive lock first (also for reads), as the image's
    /// one user; another writer gets it back on request.
    Bench(BenchArgs),
}

#[derive(Subcommand, Debug)]
pub enum SnapCommand {
    /// Take a snapshot `IMAGE@SNAP` (O(1): no data is copied; the OSDs keep old data as
    /// writes arrive).
    #[command(alias = "add")]
    Create { snap: String },
    /// List an image's snapshots (id, name, size, protected, time).
    #[command(alias = "list")]
    Ls { image: String },
    /// Remove snapshot `IMAGE@SNAP` (refused while protected); its space is freed in the
    /// background.
    #[command(alias = "remove")]
    Rm { snap: String },
    /// Roll the image back to snapshot `IMAGE@SNAP` (data and size; progress bar).
    #[command(alias = "revert")]
    Rollback { snap: String },
    /// Protect `IMAGE@SNAP`: it can then be cloned, and cannot be removed.
    Protect { snap: String },
    /// Unprotect `IMAGE@SNAP` (refused while clones of it exist).
    Unprotect { snap: String },
    /// Remove every unprotected snapshot of IMAGE.
    Purge { image: String },
}

#[derive(Subcommand, Debug)]
pub enum LockCommand {
    /// Who holds the image's exclusive lock (the writer), if anyone.
    #[command(alias = "list")]
    Ls { image: String },
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    pub image: String,
    #[arg(long, value_enum)]
    pub io_type: IoType,
    /// Bytes per I/O.
    #[arg(long, default_value = "4K")]
    pub io_size: ByteSize,
    /// I/Os in flight.
    #[arg(long, default_value_t = 16)]
    pub io_threads: usize,
    /// Bytes to transfer in total (the run also stops after --seconds).
    #[arg(long, default_value = "1G")]
    pub io_total: ByteSize,
    #[arg(long, value_enum, default_value_t = IoPattern::Seq)]
    pub io_pattern: IoPattern,
    /// Stop after this many seconds even if --io-total is not reached.
    #[arg(long)]
    pub seconds: Option<u64>,
    /// For readwrite: percentage of reads.
    #[arg(long, default_value_t = 50)]
    pub rw_mix_read: u32,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoType {
    Write,
    Read,
    Readwrite,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoPattern {
    Seq,
    Rand,
}

/// `[POOL/]IMAGE[@SNAP]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    pub pool: String,
    pub image: String,
    pub snap: Option<String>,
}

impl ImageSpec {
    pub fn parse(spec: &str, default_pool: &str) -> Result<ImageSpec> {
        let (pool, rest) = match spec.split_once('/') {
            Some((p, r)) => (p.to_string(), r),
            None => (default_pool.to_string(), spec),
        };
        let (image, snap) = match rest.split_once('@') {
            Some((i, s)) => (i.to_string(), Some(s.to_string())),
            None => (rest.to_string(), None),
        };
        if pool.is_empty() || image.is_empty() || snap.as_deref() == Some("") {
            bail!("image spec {spec:?}: expected [POOL/]IMAGE[@SNAP]");
        }
        Ok(ImageSpec { pool, image, snap })
    }

    fn no_snap(self, what: &str) -> Result<ImageSpec> {
        if let Some(s) = &self.snap {
            bail!("{what} works on an image, not a snapshot (@{s})");
        }
        Ok(self)
    }

    async fn open(&self, rbd: &Rbd) -> Result<Image> {
        let img = match &self.snap {
            Some(s) => rbd.open_snap(&self.pool, &self.image, s).await,
            None => rbd.open(&self.pool, &self.image).await,
        };
        img.with_context(|| format!("opening {self}"))
    }
}

impl std::fmt::Display for ImageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pool, self.image)?;
        if let Some(s) = &self.snap {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

fn order_of(object_size: Option<ByteSize>, order: Option<u8>) -> Result<Option<u8>> {
    match (object_size, order) {
        (Some(ByteSize(s)), _) => {
            if !s.is_power_of_two() {
                bail!("--object-size {s} is not a power of two");
            }
            Ok(Some(s.trailing_zeros() as u8))
        }
        (None, o) => Ok(o),
    }
}

fn progress_bar(len: u64, what: &str, hidden: bool) -> indicatif::ProgressBar {
    if hidden {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// A progress bar counting objects (its length set as the work reports it).
fn object_progress(what: &str, hidden: bool) -> indicatif::ProgressBar {
    let pb = progress_bar(0, what, hidden);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} objects")
            .expect("a valid template"),
    );
    pb
}

pub fn run(a: RbdArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        let rados = g.conf.connect().await?;
        let rbd = Rbd::new(rados);
        let spec = |s: &str| ImageSpec::parse(s, &a.pool);
        match a.cmd {
            RbdCommand::Create {
                image,
                size,
                object_size,
                order,
                stripe_unit,
                stripe_count,
                data_pool,
            } => {
                let s = spec(&image)?.no_snap("create")?;
                let opts = CreateOptions {
                    size: size.0,
                    order: order_of(object_size, order)?,
                    stripe_unit: stripe_unit.map(|b| b.0),
                    stripe_count,
                    data_pool,
                };
                rbd.create(&s.pool, &s.image, &opts)
                    .await
                    .with_context(|| format!("creating {s}"))?;
            }
            RbdCommand::Ls { long } => {
                let mut names = rbd.list(&a.pool).await?;
                names.sort();
                if !long {
                    match g.format {
                        OutputFormat::Json => println!("{}", serde_json::json!(names)),
                        OutputFormat::Plain => {
                            for n in names {
                                println!("{n}");
                            }
                        }
                    }
                } else {
                    let mut infos = Vec::new();
                    for n in &names {
                        match rbd.open(&a.pool, n).await {
                            Ok(img) => {
                                infos.push(img.info());
                                img.close().await?;
                            }
                            Err(kelp_rbd::RbdError::NoSuchImage(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    match g.format {
                        OutputFormat::Json => println!("{}", serde_json::to_string(&infos)?),
                        OutputFormat::Plain => {
                            println!("{:<32} {:>12} {:<40} FMT", "NAME", "SIZE", "PARENT");
                            for i in infos {
                                println!(
                                    "{:<32} {:>12} {:<40} {}",
                                    i.name,
                                    ByteSize(i.size).to_string(),
                                    i.parent.unwrap_or_default(),
                                    i.format
                                );
                            }
                        }
                    }
                }
            }
            RbdCommand::Info { image } => {
                let s = spec(&image)?;
                let img = s.open(&rbd).await?;
                let i = img.info();
                img.close().await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&i)?),
                    OutputFormat::Plain => {
                        println!("rbd image '{}':", i.name);
                        println!(
                            "\tsize {} in {} objects",
                            ByteSize(i.size),
                            i.objects
                        );
                        println!(
                            "\torder {} ({} objects)",
                            i.order,
                            ByteSize(i.object_size)
                        );
                        println!("\tid: {}", i.id);
                        println!("\tblock_name_prefix: rbd_data.{}", i.id);
                        println!("\tformat: {}", i.format);
                        println!("\tsnapshot_count: {}", i.snapshot_count);
                        if i.stripe_count > 1 || i.stripe_unit != i.object_size {
                            println!("\tstripe unit: {}", ByteSize(i.stripe_unit));
                            println!("\tstripe count: {}", i.stripe_count);
                        }
                        if i.data_pool != i.pool {
                            println!("\tdata_pool: {}", i.data_pool);
                        }
                        if let Some(p) = &i.parent {
                            println!("\tparent: {p}");
                            println!("\toverlap: {}", ByteSize(i.overlap.unwrap_or(0)));
                        }
                        if let Some(snap) = &i.snapshot {
                            println!("\tsnapshot: {snap} (read-only)");
                        }
                    }
                }
            }
            RbdCommand::Resize {
                image,
                size,
                allow_shrink,
            } => {
                let s = spec(&image)?.no_snap("resize")?;
                let img = s.open(&rbd).await?;
                if size.0 < img.size() && !allow_shrink {
                    bail!(
                        "shrinking {s} from {} to {} discards data past the new end; pass --allow-shrink",
                        ByteSize(img.size()),
                        size
                    );
                }
                img.resize(size.0).await?;
                img.close().await?;
            }
            RbdCommand::Rm { image } => {
                let s = spec(&image)?.no_snap("rm")?;
                rbd.remove(&s.pool, &s.image)
                    .await
                    .with_context(|| format!("removing {s}"))?;
            }
            RbdCommand::Mv { src, dst } => {
                let from = spec(&src)?.no_snap("mv")?;
                let to = spec(&dst)?.no_snap("mv")?;
                if from.pool != to.pool {
                    bail!("images are renamed within one pool ({} vs {})", from.pool, to.pool);
                }
                rbd.rename(&from.pool, &from.image, &to.image).await?;
            }
            RbdCommand::Du { image } => {
                let names = match &image {
                    Some(i) => vec![spec(i)?],
                    None => {
                        let mut v = Vec::new();
                        let mut names = rbd.list(&a.pool).await?;
                        names.sort();
                        for n in names {
                            v.push(ImageSpec {
                                pool: a.pool.clone(),
                                image: n,
                                snap: None,
                            });
                        }
                        v
                    }
                };
                let mut rows = Vec::new();
                for s in names {
                    let img = s.open(&rbd).await?;
                    let u = img.usage().await?;
                    img.close().await?;
                    rows.push((s.image.clone(), u));
                }
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = rows
                            .iter()
                            .map(|(n, u)| {
                                serde_json::json!({"name": n, "provisioned_size": u.provisioned,
                                    "used_size": u.used})
                            })
                            .collect();
                        println!("{}", serde_json::json!({ "images": v }));
                    }
                    OutputFormat::Plain => {
                        println!("{:<32} {:>12} {:>12}", "NAME", "PROVISIONED", "USED");
                        for (n, u) in rows {
                            println!(
                                "{:<32} {:>12} {:>12}",
                                n,
                                ByteSize(u.provisioned).to_string(),
                                ByteSize(u.used).to_string()
                            );
                        }
                    }
                }
            }
            RbdCommand::Snap(cmd) => snap_command(&rbd, &a.pool, cmd, g.format, a.no_progress).await?,
            RbdCommand::Clone {
                parent,
                child,
                data_pool,
            } => {
                let p = spec(&parent)?;
                let Some(snap) = &p.snap else {
                    bail!("clone needs a snapshot: PARENT@SNAP");
                };
                let c = spec(&child)?.no_snap("clone")?;
                rbd.clone_image(&p.pool, &p.image, snap, &c.pool, &c.image, data_pool)
                    .await
                    .with_context(|| format!("cloning {p} into {c}"))?;
            }
            RbdCommand::Flatten { image } => {
                let s = spec(&image)?.no_snap("flatten")?;
                let img = s.open(&rbd).await?;
                let pb = object_progress("flatten", a.no_progress);
                img.flatten(|n, total| {
                    pb.set_length(total);
                    pb.set_position(n);
                })
                .await?;
                img.close().await?;
                pb.finish_and_clear();
            }
            RbdCommand::Children { image } => {
                let s = spec(&image)?;
                let img = rbd.open(&s.pool, &s.image).await?;
                let all = img.children().await;
                img.close().await?;
                let kids: Vec<_> = all?
                    .into_iter()
                    .filter(|(_, _, snap)| s.snap.as_ref().is_none_or(|want| want == snap))
                    .collect();
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = kids
                            .iter()
                            .map(|(p, n, snap)| {
                                serde_json::json!({"pool": p, "image": n, "parent_snap": snap})
                            })
                            .collect();
                        println!("{}", serde_json::json!(v));
                    }
                    OutputFormat::Plain => {
                        for (p, n, _) in kids {
                            println!("{p}/{n}");
                        }
                    }
                }
            }
            RbdCommand::Import {
                file,
                image,
                object_size,
                data_pool,
            } => {
                let s = spec(&image)?.no_snap("import")?;
                import(&rbd, &file, &s, object_size, data_pool, a.no_progress).await?;
            }
            RbdCommand::Export { image, file } => {
                let s = spec(&image)?;
                let img = s.open(&rbd).await?;
                let done = export(&img, &file, a.no_progress).await;
                img.close().await?;
                done?;
            }
            RbdCommand::Lock(LockCommand::Ls { image }) => {
                let s = spec(&image)?.no_snap("lock ls")?;
                let img = s.open(&rbd).await?;
                let owner = img.lock_owner().await?;
                img.close().await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string(&owner)?),
                    OutputFormat::Plain => match owner {
                        Some(o) => {
                            println!("There is 1 exclusive lock on this image.");
                            println!("Locker: {}  cookie: {}", o.instance, o.cookie);
                        }
                        None => println!("There is no lock on this image."),
                    },
                }
            }
            RbdCommand::Status { image } => {
                let s = spec(&image)?.no_snap("status")?;
                let img = s.open(&rbd).await?;
                let me = rbd.rados().instance();
                let watchers: Vec<String> = img
                    .watchers()
                    .await?
                    .into_iter()
                    .filter(|w| *w != me)
                    .collect();
                img.close().await?;
                match g.format {
                    OutputFormat::Json => {
                        println!("{}", serde_json::json!({ "watchers": watchers }))
                    }
                    OutputFormat::Plain => {
                        if watchers.is_empty() {
                            println!("Watchers: none");
                        } else {
                            println!("Watchers:");
                            for w in watchers {
                                println!("\twatcher={w}");
                            }
                        }
                    }
                }
            }
            RbdCommand::Bench(b) => {
                let s = spec(&b.image)?.no_snap("bench")?;
                let img = s.open(&rbd).await?;
                let done = bench(&img, &b).await;
                img.close().await?;
                done?;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `IMAGE@SNAP` → the image spec and the snapshot name.
fn snap_spec(s: &str, pool: &str) -> Result<(ImageSpec, String)> {
    let mut spec = ImageSpec::parse(s, pool)?;
    let Some(snap) = spec.snap.take() else {
        bail!("{s}: name the snapshot, IMAGE@SNAP");
    };
    Ok((spec, snap))
}

async fn snap_command(
    rbd: &Rbd,
    pool: &str,
    cmd: SnapCommand,
    format: OutputFormat,
    no_progress: bool,
) -> Result<()> {
    let (spec, snap) = match &cmd {
        SnapCommand::Create { snap }
        | SnapCommand::Rm { snap }
        | SnapCommand::Rollback { snap }
        | SnapCommand::Protect { snap }
        | SnapCommand::Unprotect { snap } => {
            let (i, s) = snap_spec(snap, pool)?;
            (i, Some(s))
        }
        SnapCommand::Ls { image } | SnapCommand::Purge { image } => {
            (ImageSpec::parse(image, pool)?.no_snap("this")?, None)
        }
    };
    let img = rbd
        .open(&spec.pool, &spec.image)
        .await
        .with_context(|| format!("opening {spec}"))?;
    let snap = snap.unwrap_or_default();
    let done = async {
        match cmd {
            SnapCommand::Create { .. } => {
                img.snap_create(&snap).await?;
            }
            SnapCommand::Ls { .. } => {
                let snaps = img.snap_list();
                match format {
                    OutputFormat::Json => {
                        let v: Vec<_> = snaps
                            .iter()
                            .map(|s| {
                                serde_json::json!({"id": s.id, "name": s.name, "size": s.size,
                                    "protected": s.protected, "timestamp_ns": s.created_ns})
                            })
                            .collect();
                        println!("{}", serde_json::json!(v));
                    }
                    OutputFormat::Plain => {
                        println!("{:>6}  {:<24} {:>12}  PROTECTED", "SNAPID", "NAME", "SIZE");
                        for s in snaps {
                            println!(
                                "{:>6}  {:<24} {:>12}  {}",
                                s.id,
                                s.name,
                                ByteSize(s.size).to_string(),
                                if s.protected { "yes" } else { "no" }
                            );
                        }
                    }
                }
            }
            SnapCommand::Rm { .. } => img.snap_remove(&snap).await?,
            SnapCommand::Rollback { .. } => {
                let pb = object_progress("rollback", no_progress);
                img.snap_rollback(&snap, |n, total| {
                    pb.set_length(total);
                    pb.set_position(n);
                })
                .await?;
                pb.finish_and_clear();
            }
            SnapCommand::Protect { .. } => img.snap_set_protected(&snap, true).await?,
            SnapCommand::Unprotect { .. } => img.snap_set_protected(&snap, false).await?,
            SnapCommand::Purge { .. } => {
                let n = img.snap_purge().await?;
                eprintln!("removed {n} snapshot(s)");
            }
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    img.close().await?;
    done
}

/// Reads up to `buf.len()` bytes (fewer only at the end of the input).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Import skips zero blocks of this size (they stay holes).
const SPARSE_BLOCK: usize = 64 << 10;

/// The runs of `buf` that are not all zeros, in blocks of `block` bytes: (start, len).
fn data_runs(buf: &[u8], block: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, b) in buf.chunks(block).enumerate() {
        if b.iter().all(|&x| x == 0) {
            continue;
        }
        let start = i * block;
        match runs.last_mut() {
            Some((s, l)) if *s + *l == start => *l += b.len(),
            _ => runs.push((start, b.len())),
        }
    }
    runs
}

async fn import(
    rbd: &Rbd,
    file: &PathBuf,
    s: &ImageSpec,
    object_size: Option<ByteSize>,
    data_pool: Option<String>,
    no_progress: bool,
) -> Result<()> {
    let stdin = file.as_os_str() == "-";
    let (mut input, size): (Box<dyn Read + Send>, Option<u64>) = if stdin {
        (Box::new(std::io::stdin()), None)
    } else {
        let f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        let len = f.metadata()?.len();
        (Box::new(f), Some(len))
    };
    let opts = CreateOptions {
        size: size.unwrap_or(0),
        order: order_of(object_size, None)?,
        stripe_unit: None,
        stripe_count: None,
        data_pool,
    };
    rbd.create(&s.pool, &s.image, &opts)
        .await
        .with_context(|| format!("creating {s}"))?;
    let img = rbd.open(&s.pool, &s.image).await?;
    let chunk = img.layout().object_size() as usize;
    let pb = progress_bar(size.unwrap_or(0), "import", no_progress);
    let mut offset = 0u64;
    let mut pending = futures::stream::FuturesUnordered::new();
    loop {
        let mut buf = vec![0u8; chunk];
        let n = read_full(&mut input, &mut buf)?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        if stdin && offset + n as u64 > img.size() {
            img.resize(offset + n as u64).await?;
        }
        let buf = Bytes::from(buf);
        let runs = data_runs(&buf, SPARSE_BLOCK);
        let stored: usize = runs.iter().map(|(_, len)| len).sum();
        pb.inc((n - stored) as u64);
        for (start, len) in runs {
            let img = img.clone();
            let piece = buf.slice(start..start + len);
            let at = offset + start as u64;
            pending.push(async move { img.write(at, piece).await.map(|()| len) });
            if pending.len() >= 8
                && let Some(r) = pending.next().await
            {
                pb.inc(r? as u64);
            }
        }
        offset += n as u64;
        if n < chunk {
            break;
        }
    }
    while let Some(r) = pending.next().await {
        pb.inc(r? as u64);
    }
    pb.finish_and_clear();
    img.close().await?;
    eprintln!("imported {} into {s}", ByteSize(offset));
    Ok(())
}

async fn export(img: &Image, file: &PathBuf, no_progress: bool) -> Result<()> {
    let size = img.size();
    let to_stdout = file.as_os_str() == "-";
    let mut out: Box<dyn WriteSeek> = if to_stdout {
        Box::new(StdoutSink {
            w: std::io::stdout().lock(),
            pos: 0,
        })
    } else {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(file)
            .with_context(|| format!("creating {}", file.display()))?;
        Box::new(FileSink(f))
    };
    let pb = progress_bar(size, "export", no_progress);
    let step = img.layout().object_size().max(4 << 20);
    // Read ahead a few objects at a time; holes are skipped (a seek in a file, zeros on stdout).
    let mut chunks = futures::stream::iter((0..size.div_ceil(step)).map(|i| {
        let img = img.clone();
        async move {
            let at = i * step;
            let len = step.min(size - at);
            let extents = img.extents(at, len).await?;
            let mut parts = Vec::new();
            for e in extents {
                if e.data {
                    parts.push((e.offset, Some(img.read(e.offset, e.len).await?)));
                } else {
                    parts.push((e.offset, None));
                }
            }
            Ok::<_, kelp_rbd::RbdError>((at, len, parts))
        }
    }))
    .buffered(4);
    while let Some(chunk) = chunks.try_next().await? {
        let (at, len, parts) = chunk;
        for (off, data) in parts {
            if let Some(d) = data {
                out.write_at(off, &d)?;
            }
        }
        pb.set_position(at + len);
    }
    out.finish(size)?;
    pb.finish_and_clear();
    Ok(())
}

trait WriteSeek {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()>;
    fn finish(&mut self, size: u64) -> std::io::Result<()>;
}

struct FileSink(std::fs::File);

impl WriteSeek for FileSink {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.0.seek(SeekFrom::Start(offset))?;
        self.0.write_all(data)
    }
    fn finish(&mut self, size: u64) -> std::io::Result<()> {
        // Holes at the end: set the length (a sparse tail).
        self.0.set_len(size)?;
        self.0.sync_all()
    }
}

/// Standard output cannot seek: holes are written as zeros.
struct StdoutSink<W: Write> {
    w: W,
    pos: u64,
}

impl<W: Write> StdoutSink<W> {
    fn pad_to(&mut self, at: u64) -> std::io::Result<()> {
        let zeros = [0u8; 65536];
        while self.pos < at {
            let n = (at - self.pos).min(zeros.len() as u64) as usize;
            self.w.write_all(&zeros[..n])?;
            self.pos += n as u64;
        }
        Ok(())
    }
}

impl<W: Write> WriteSeek for StdoutSink<W> {
    fn write_at(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if offset < self.pos {
            return Err(std::io::Error::other("export to stdout went backwards"));
        }
        self.pad_to(offset)?;
        self.w.write_all(data)?;
        self.pos += data.len() as u64;
        Ok(())
    }
    fn finish(&mut self, size: u64) -> std::io::Result<()> {
        self.pad_to(size)?;
        self.w.flush()
    }
}

async fn bench(img: &Image, b: &BenchArgs) -> Result<()> {
    let size = img.size();
    let io_size = b.io_size.0;
    if io_size == 0 || io_size > size {
        bail!("--io-size must be 1..={size} (the image's size)");
    }
    if b.io_threads == 0 {
        bail!("--io-threads must be at least 1");
    }
    let total_ops = (b.io_total.0 / io_size).max(1);
    let slots = size / io_size;
    let next = Arc::new(AtomicU64::new(0));
    let done_ops = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = b.seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let payload = Bytes::from(
        (0..io_size)
            .map(|i| (i as u8).wrapping_mul(31))
            .collect::<Vec<u8>>(),
    );
    println!(
        "bench  type {:?} io_size {} io_threads {} bytes {} pattern {:?}",
        b.io_type, io_size, b.io_threads, b.io_total.0, b.io_pattern
    );
    println!("  SEC       OPS   OPS/SEC   BYTES/SEC");
    // The lock holder remembers which of a clone's objects are absent and reads those from the
    // parent directly; taking the lock up front makes reads measure that steady state.
    img.acquire_lock().await?;
    let started = Instant::now();
    let reporter = {
        let done_ops = done_ops.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut last = 0;
            let mut sec = 0;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                sec += 1;
                let now = done_ops.load(Ordering::Relaxed);
                let rate = now - last;
                last = now;
                println!(
                    "{sec:5} {now:9} {rate:9} {:>11}/s",
                    ByteSize(rate * io_size).to_string()
                );
            }
        })
    };
    let workers = (0..b.io_threads).map(|w| {
        let img = img.clone();
        let next = next.clone();
        let done_ops = done_ops.clone();
        let stop = stop.clone();
        let payload = payload.clone();
        let (pattern, io_type, mix) = (b.io_pattern, b.io_type, b.rw_mix_read);
        async move {
            let mut lat = Vec::new();
            let mut rng = rand_state(w as u64 + 1);
            loop {
                if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total_ops {
                    break;
                }
                let slot = match pattern {
                    IoPattern::Seq => i % slots,
                    IoPattern::Rand => xorshift(&mut rng) % slots,
                };
                let offset = slot * io_size;
                let read = match io_type {
                    IoType::Read => true,
                    IoType::Write => false,
                    IoType::Readwrite => (xorshift(&mut rng) % 100) < mix as u64,
                };
                let t = Instant::now();
                if read {
                    img.read(offset, io_size).await?;
                } else {
                    img.write(offset, payload.clone()).await?;
                }
                lat.push(t.elapsed());
                done_ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, kelp_rbd::RbdError>(lat)
        }
    });
    let results = futures::future::join_all(workers).await;
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    reporter.abort();
    let mut lat = Vec::new();
    for r in results {
        lat.extend(r?);
    }
    lat.sort();
    let ops = lat.len() as u64;
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return 0.0;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i].as_secs_f64() * 1000.0
    };
    println!(
        "elapsed: {elapsed:.2}  ops: {ops}  ops/sec: {:.2}  bytes/sec: {}/s  p50: {:.3} ms  p99: {:.3} ms",
        ops as f64 / elapsed,
        ByteSize((ops as f64 * io_size as f64 / elapsed) as u64),
        pct(0.50),
        pct(0.99)
    );
    Ok(())
}

fn rand_state(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn import_skips_zero_blocks() {
        let mut buf = vec![0u8; 10];
        buf[0] = 1;
        buf[5] = 1;
        buf[9] = 1;
        assert_eq!(data_runs(&buf, 2), vec![(0, 2), (4, 2), (8, 2)]);
        assert_eq!(data_runs(&buf, 4), vec![(0, 10)]);
        assert!(data_runs(&[0; 7], 2).is_empty());
    }

    #[test]
    fn image_specs_parse_like_ceph() {
        let s = ImageSpec::parse("disk", "rbd").unwrap();
        assert_eq!(
            (s.pool.as_str(), s.image.as_str(), s.snap),
            ("rbd", "disk", None)
        );
        let s = ImageSpec::parse("vms/disk@base", "rbd").unwrap();
        assert_eq!(
            (s.pool.as_str(), s.image.as_str(), s.snap.as_deref()),
            ("vms", "disk", Some("base"))
        );
        for bad in ["", "/x", "p/", "x@", "p/@s"] {
            assert!(ImageSpec::parse(bad, "rbd").is_err(), "{bad:?}");
        }
    }
}

//! `kelp store`: create, check and benchmark an OSD's local object store (`kelp-store`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use kelp_store::bench::{BenchOptions, run_bench};
use kelp_store::{MkfsOptions, StoreConfig};
use kelp_types::ByteSize;

use super::OutputFormat;

/// Manage an OSD-local object store directory.
#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Create a new, empty object store in DIR (data file, metadata database, superblock).
    Mkfs(MkfsArgs),
    /// Check a store: allocator consistency (leaks, double allocations, referenced space marked
    /// free), every metadata record, orphaned omap data; with --deep also read every block and
    /// verify its checksum. Exits 0 when clean, 1 when any problem is found or the store cannot
    /// be opened.
    Fsck(FsckArgs),
    /// Benchmark a new store created in DIR: 4 KiB new-object writes and overwrites (QD 1 and
    /// 16), 4 MiB writes (QD 4), cold 4 KiB random reads (QD 16), a metadata-heavy ingest of
    /// many 4 KiB objects and an S3-index-shaped ingest. Every write counts once durable.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// Directory for the store; created if missing, must not already hold a store.
    pub dir: PathBuf,
    /// Size of the data file (created sparse), e.g. 100GiB.
    #[arg(long, default_value = "16GiB")]
    pub size: ByteSize,
    /// Allocation unit; writes smaller than this are deferred (carried in the metadata commit).
    #[arg(long, default_value = "4KiB")]
    pub min_alloc_size: ByteSize,
    /// Checksum granularity: one crc32c per block of this size, verified on every read.
    #[arg(long, default_value = "4KiB")]
    pub csum_block_size: ByteSize,
    /// Write the whole data file with zeros now instead of only reserving it: slower mkfs (one
    /// sequential write of --size), then one device flush per commit instead of two.
    #[arg(long, conflicts_with = "grow")]
    pub prewrite: bool,
    /// Create the data file sparse and write it with zeros in steps (1/64 of --size, 64-512
    /// MiB) as data arrives, ahead of the allocator: mkfs is instant and takes one step of
    /// disk, commits need one device flush as with --prewrite. Without either flag the file
    /// is only reserved (fallocate): two flushes per commit.
    #[arg(long)]
    pub grow: bool,
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Store directory (must not be mounted by another process).
    pub dir: PathBuf,
    /// Also read every allocated block and verify its crc32c; names each damaged object.
    #[arg(long)]
    pub deep: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory for the benchmark store; must be missing or empty. Removed afterwards unless
    /// --keep.
    pub dir: PathBuf,
    /// Duration of each timed test, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Number of objects created by each ingest test (create_1m_4k_qd16, index_ingest_qd16).
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    /// Size of the data file of each benchmark store: one for the timed tests and one per
    /// ingest test (written with zeros at mkfs unless --no-prewrite, so this much must be free
    /// once per store).
    #[arg(long, default_value = "8GiB")]
    pub size: ByteSize,
    /// Memory budget for the store's caches and in-flight transactions.
    #[arg(long, default_value = "256MiB")]
    pub cache_budget: ByteSize,
    /// Whole-unit writes up to this size are carried in the metadata commit instead of being
    /// flushed to new extents before it (0: never).
    #[arg(long, default_value = "8KiB")]
    pub prefer_deferred_size: ByteSize,
    /// Objects of at most this size keep their data inline in their metadata record instead
    /// of in an allocation unit (0: never; capped at half of min_alloc_size).
    #[arg(long, default_value = "2KiB")]
    pub inline_max: ByteSize,
    /// Only reserve the benchmark stores' data files (fallocate) instead of writing them with
    /// zeros at mkfs: every commit that wrote new extents then flushes the data file and the
    /// log separately (the layout `kelp store mkfs` makes without --prewrite).
    #[arg(long)]
    pub no_prewrite: bool,
    /// Keep the benchmark store instead of deleting it.
    #[arg(long)]
    pub keep: bool,
    /// Run only these tests (comma-separated): write_4k_new_qd1, write_4k_new_qd16,
    /// overwrite_4k_qd1, overwrite_4k_qd16, write_4m_qd4, randread_4k_qd16_cold,
    /// overwrite_4k_in_4m_qd16 (4 KiB writes at random offsets of 4 MiB objects, as a block
    /// image's), create_1m_4k_qd16, index_ingest_qd16 (what an S3 ingest of --objects 1 KiB objects into
    /// one bucket asks of each OSD: index-shard omap updates with their guard reads, the data
    /// object, a PG-log entry per transaction; reports the rate per 100 000). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

pub fn run(cmd: StoreCommand, g: &crate::cmd::common::Global) -> anyhow::Result<ExitCode> {
    match cmd {
        StoreCommand::Mkfs(a) => {
            let opts = MkfsOptions {
                size: a.size,
                min_alloc_size: a.min_alloc_size,
                csum_block_size: a.csum_block_size,
                prewrite: a.prewrite,
                grow: a.grow,
            };
            let sb = kelp_store::mkfs(&a.dir, &opts)
                .with_context(|| format!("mkfs {}", a.dir.display()))?;
            println!(
                "created store {} in {}: {} data, min_alloc_size {}, csum_block_size {}, format v{}",
                sb.store_id,
                a.dir.display(),
                ByteSize(sb.data_size),
                ByteSize(sb.min_alloc_size),
                ByteSize(sb.csum_block_size),
                sb.format_version
            );
            Ok(ExitCode::SUCCESS)
        }
        StoreCommand::Fsck(a) => {
            let rep = kelp_store::fsck_dir(&a.dir, a.deep)
                .with_context(|| format!("fsck {}", a.dir.display()))?;
            match g.format {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rep)?),
                OutputFormat::Plain => {
                    for p in &rep.problems {
                        println!("ERROR {p}");
                    }
                    println!(
                        "{}: {} collections, {} objects, {} omap entries, {} used, {} free, {} inline{}; {} problem(s)",
                        a.dir.display(),
                        rep.collections,
                        rep.objects,
                        rep.omap_entries,
                        ByteSize(rep.used_bytes),
                        ByteSize(rep.free_bytes),
                        ByteSize(rep.inline_bytes),
                        if a.deep {
                            format!(", {} blocks verified", rep.blocks_verified)
                        } else {
                            String::new()
                        },
                        rep.problems.len()
                    );
                }
            }
            Ok(if rep.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        StoreCommand::Bench(a) => {
            if a.dir.exists()
                && std::fs::read_dir(&a.dir)
                    .with_context(|| format!("reading {}", a.dir.display()))?
                    .next()
                    .is_some()
            {
                bail!(
                    "{} is not empty; bench needs a missing or empty directory",
                    a.dir.display()
                );
            }
            if a.seconds.is_nan() || a.seconds <= 0.0 {
                bail!("--seconds must be positive");
            }
            if let Some(bad) = a
                .only
                .iter()
                .find(|n| !kelp_store::bench::TESTS.contains(&n.as_str()))
            {
                bail!(
                    "unknown test {bad:?}; tests are {}",
                    kelp_store::bench::TESTS.join(", ")
                );
            }
            let opts = BenchOptions {
                only: a.only.clone(),
                seconds: a.seconds,
                objects: a.objects,
                mkfs: MkfsOptions {
                    size: a.size,
                    prewrite: !a.no_prewrite,
                    ..MkfsOptions::default()
                },
                config: StoreConfig {
                    cache_budget: a.cache_budget,
                    prefer_deferred_size: a.prefer_deferred_size,
                    inline_max: a.inline_max,
                    ..StoreConfig::default()
                },
            };
            let quiet = g.format == OutputFormat::Json;
            let result = run_bench(&a.dir, &opts, &|line| {
                if quiet {
                    eprintln!("{line}");
                } else {
                    println!("{line}");
                }
            });
            if !a.keep {
                for f in [
                    "ingest/block",
                    "ingest/meta",
                    "ingest/superblock",
                    "ingest/lock",
                    "ingest/wal",
                    "ingest",
                    "block",
                    "meta",
                    "superblock",
                    "lock",
                    "wal",
                ] {
                    let p = a.dir.join(f);
                    let _ = if p.is_dir() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                }
            }
            let rep = result.context("benchmark failed")?;
            match g.format {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rep)?),
                OutputFormat::Plain => {
                    println!(
                        "peak RSS {:.1} MiB (cache budget {:.0} MiB)",
                        rep.peak_rss_mib, rep.cache_budget_mib
                    );
                    if let Some(m) = rep.metadata_bytes_per_object {
                        println!("metadata {m:.1} bytes per object");
                    }
                    if let Some(ing) = &rep.ingest {
                        println!(
                            "ingest of {} objects: first {} {:.0} ops/s, last {:.0} ops/s ({:+.1}%)",
                            ing.objects,
                            ing.block_size,
                            ing.first_block_ops_per_s,
                            ing.last_block_ops_per_s,
                            ing.change_percent
                        );
                        let rates: Vec<String> = ing
                            .ops_per_s_by_block
                            .iter()
                            .map(|r| format!("{r:.0}"))
                            .collect();
                        println!("ingest ops/s per block: {}", rates.join(" "));
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

//! `kelp rgw`: the S3 gateway daemon, and `kelp s3 …`: its administration (users, keys,
//! buckets), the `radosgw-admin` equivalents.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_rgw::{AccessKey, Rgw, RgwConfig};

use crate::cmd::OutputFormat;
use crate::cmd::common;

/// Pools and tuning shared by the gateway and the admin commands.
#[derive(Args, Debug, Clone)]
pub struct RgwPoolArgs {
    /// Pool for users, keys and bucket records (created if missing).
    #[arg(long, default_value = "kelp.rgw.meta")]
    pub meta_pool: String,
    /// Pool for bucket index shards (created if missing).
    #[arg(long, default_value = "kelp.rgw.index")]
    pub index_pool: String,
    /// Pool for object data (created if missing).
    #[arg(long, default_value = "kelp.rgw.data")]
    pub data_pool: String,
    /// Keep object data in an erasure-coded pool made from this erasure-code profile (`kelp
    /// osd erasure-code-profile set NAME k=4 m=2 …`): the data pool is created erasure-coded
    /// if it does not exist, and refused if it exists replicated or with another profile. The
    /// metadata and index pools stay replicated (they keep omap, which erasure-coded pools
    /// refuse). Without this option an existing data pool of either kind is used as it is.
    #[arg(long, value_name = "PROFILE")]
    pub data_pool_profile: Option<String>,
    /// Index shards of a new bucket.
    #[arg(long, default_value_t = 11)]
    pub default_shards: u32,
    /// Seconds unreferenced data (overwritten or deleted objects) is kept before the garbage
    /// collector deletes it: reads that started before may still be streaming it.
    #[arg(long, default_value_t = 7200)]
    pub gc_min_wait_secs: u64,
    /// Seconds an upload may take before its unfinished data counts as abandoned.
    #[arg(long, default_value_t = 3600)]
    pub pending_grace_secs: u64,
    /// Reshard a bucket (to 2n+1 shards, while it keeps serving) once one of its index shards
    /// holds this many objects; 0 turns automatic resharding off.
    #[arg(long, default_value_t = 100_000)]
    pub reshard_max_objects_per_shard: u64,
    /// Seconds in a lifecycle "day": rules' Days count in these units (shorten only to test
    /// lifecycle rules, like Ceph's rgw_lc_debug_interval).
    #[arg(long, default_value_t = 86_400)]
    pub lc_day_secs: u64,
}

impl RgwPoolArgs {
    fn config(&self, gc_interval: Duration) -> RgwConfig {
        RgwConfig {
            meta_pool: self.meta_pool.clone(),
            index_pool: self.index_pool.clone(),
            data_pool: self.data_pool.clone(),
            data_pool_profile: self.data_pool_profile.clone(),
            default_shards: self.default_shards,
            gc_min_wait: Duration::from_secs(self.gc_min_wait_secs),
            pending_grace: Duration::from_secs(self.pending_grace_secs),
            gc_interval,
            reshard_max_objects_per_shard: self.reshard_max_objects_per_shard,
            lc_day: Duration::from_secs(self.lc_day_secs.max(1)),
            ..RgwConfig::default()
        }
    }
}

#[derive(Args, Debug)]
pub struct RgwArgs {
    /// TCP port to serve S3 on (0: any free port; see --data).
    #[arg(long, default_value_t = 7480)]
    pub port: u16,
    /// Address to listen on (0.0.0.0 to serve other machines).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Directory where the gateway writes `addr` (the address it listens on) once it serves,
    /// and its pid file.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Seconds between garbage-collection passes (0: this gateway never collects).
    #[arg(long, default_value_t = 300)]
    pub gc_interval_secs: u64,
    /// Seconds between lifecycle passes (checked at each garbage-collection pass, so at most
    /// that often; 0: this gateway never applies lifecycle rules).
    #[arg(long, default_value_t = 3600)]
    pub lc_interval_secs: u64,
    /// Seconds between counts of bucket usage (stored bytes and objects, for the metrics and
    /// the dashboard): buckets changed through this gateway are counted at each pass, every
    /// bucket every 30 passes (0: this gateway never counts).
    #[arg(long, default_value_t = 10)]
    pub usage_interval_secs: u64,
    #[command(flatten)]
    pub pools: RgwPoolArgs,
    /// This gateway's name in the service map (`kelp daemon ls` shows it as rgw.ID).
    /// Default: the address it serves S3 on.
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub metrics: common::MetricsArgs,
}

pub fn run_gateway(a: RgwArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    common::init_logging("info");
    let rt = common::runtime()?;
    rt.block_on(async {
        common::trim_heap_periodically();
        let rados = g.conf.connect().await?;
        let cfg = RgwConfig {
            lc_interval: Duration::from_secs(a.lc_interval_secs),
            usage_interval: Duration::from_secs(a.usage_interval_secs),
            ..a.pools.config(Duration::from_secs(a.gc_interval_secs))
        };
        let rgw = Rgw::open(rados, cfg)
            .await
            .context("opening the gateway's pools")?;
        let addr = SocketAddr::new(a.bind, a.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        if let Some(dir) = &a.data {
            std::fs::create_dir_all(dir)?;
            common::write_pid_file(&dir.join("pid"))?;
            let tmp = dir.join("addr.tmp");
            std::fs::write(&tmp, format!("{local}\n"))?;
            std::fs::rename(&tmp, dir.join("addr"))?;
        }
        eprintln!("kelp rgw: serving S3 on http://{local}");
        let name = format!("rgw.{}", a.id.clone().unwrap_or_else(|| local.to_string()));
        let mut addrs = std::collections::BTreeMap::new();
        addrs.insert("s3".to_string(), format!("http://{local}"));
        let _metrics = a
            .metrics
            .serve(
                &name,
                "rgw",
                |reg| {
                    rgw.metrics().register(reg);
                    common::register_msgr(reg, rgw.rados().messengers());
                },
                &mut addrs,
            )
            .await?;
        let beacons = rgw.rados().spawn_service_beacons(name, "rgw".into(), addrs);
        kelp_rgw::server::serve(rgw, listener, common::shutdown_signal()).await;
        beacons.abort();
        eprintln!("kelp rgw: stopped");
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(Subcommand, Debug)]
pub enum S3Command {
    /// Users: create (prints the keys), ls, info, rm.
    #[command(subcommand)]
    User(UserCommand),
    /// Access keys: create (another key pair for a user), rm.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Buckets: ls, stats, create (pre-sized), reshard (online), rm (with --purge-objects,
    /// deletes everything in it at RADOS speed).
    #[command(subcommand)]
    Bucket(BucketCommand),
    /// Garbage collection: `run` deletes now whatever is due.
    #[command(subcommand)]
    Gc(GcCommand),
    /// Lifecycle: `run` applies every bucket's lifecycle rules now (expiration, noncurrent
    /// versions, lone delete markers, incomplete multipart uploads).
    #[command(subcommand)]
    Lc(LcCommand),
    /// Load generator for any S3 service (like warp/COSBench): put, get or mixed objects of
    /// one size from N concurrent clients; per-second progress, then ops/s, MiB/s, latency.
    Bench(kelp_s3bench::BenchArgs),
}

#[derive(Args, Debug)]
pub struct AdminArgs {
    #[command(flatten)]
    pub pools: RgwPoolArgs,
}

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user with one key pair (generated unless given) and print it.
    Create {
        /// The user id.
        #[arg(long)]
        uid: String,
        /// The user's display name (shown as the owner in listings).
        #[arg(long, default_value = "")]
        display_name: String,
        /// Use this access key instead of a generated one (needs --secret-key).
        #[arg(long, requires = "secret_key")]
        access_key: Option<String>,
        /// Use this secret key instead of a generated one (needs --access-key).
        #[arg(long, requires = "access_key")]
        secret_key: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// List user ids.
    Ls {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show a user and its keys.
    Info {
        /// The user id.
        #[arg(long)]
        uid: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove a user that owns no buckets.
    Rm {
        /// The user id.
        #[arg(long)]
        uid: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// Add a key pair to a user (generated unless given) and print it.
    Create {
        /// The user id.
        #[arg(long)]
        uid: String,
        /// Use this access key instead of a generated one (needs --secret-key).
        #[arg(long, requires = "secret_key")]
        access_key: Option<String>,
        /// Use this secret key instead of a generated one (needs --access-key).
        #[arg(long, requires = "access_key")]
        secret_key: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove an access key.
    Rm {
        /// The access key to remove.
        #[arg(long)]
        access_key: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum BucketCommand {
    /// List buckets (all, or one user's).
    Ls {
        /// Only this user's buckets.
        #[arg(long)]
        uid: Option<String>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A bucket's owner, id, shards, object count and bytes.
    Stats {
        /// The bucket name.
        #[arg(long)]
        bucket: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Create a bucket for a user, optionally with a given number of index shards (pre-sized
    /// for a large bucket).
    Create {
        /// The bucket name.
        #[arg(long)]
        bucket: String,
        /// The user id.
        #[arg(long)]
        uid: String,
        /// Index shards to create the bucket with (default: `--default-shards`).
        #[arg(long)]
        num_shards: Option<u32>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Reshard a bucket's index to N shards while it keeps serving reads and writes.
    Reshard {
        /// The bucket name.
        #[arg(long)]
        bucket: String,
        /// The new number of index shards.
        #[arg(long)]
        num_shards: u32,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete a bucket; refused while it holds objects unless --purge-objects.
    Rm {
        /// The bucket name.
        #[arg(long)]
        bucket: String,
        /// Delete every object in the bucket first.
        #[arg(long)]
        purge_objects: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum GcCommand {
    /// Delete now the data whose garbage-collection time has come.
    Run {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum LcCommand {
    /// Apply every bucket's lifecycle rules now (ages in units of --lc-day-secs).
    Run {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

async fn open(a: &AdminArgs, g: &crate::cmd::common::Global) -> Result<Rgw> {
    let rados = g.conf.connect().await?;
    Ok(Rgw::open(rados, a.pools.config(Duration::ZERO)).await?)
}

fn key_of(access: Option<String>, secret: Option<String>) -> Option<AccessKey> {
    match (access, secret) {
        (Some(access_key), Some(secret_key)) => Some(AccessKey {
            access_key,
            secret_key,
        }),
        _ => None,
    }
}

fn print_user(u: &kelp_rgw::UserRecord, format: OutputFormat) -> Result<()> {
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(u)?),
        OutputFormat::Plain => {
            println!("uid:          {}", u.uid);
            println!("display name: {}", u.display_name);
            for k in &u.keys {
                println!("access key:   {}", k.access_key);
                println!("secret key:   {}", k.secret_key);
            }
        }
    }
    Ok(())
}

pub fn run_admin(cmd: S3Command, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    common::init_logging("warn");
    let rt = common::runtime()?;
    if let S3Command::Bench(mut args) = cmd {
        args.format = match g.format {
            OutputFormat::Json => kelp_s3bench::Format::Json,
            OutputFormat::Plain => kelp_s3bench::Format::Text,
        };
        rt.block_on(kelp_s3bench::run(&args, std::io::stdout()))?;
        return Ok(ExitCode::SUCCESS);
    }
    rt.block_on(async move {
        match cmd {
            S3Command::User(UserCommand::Create {
                uid,
                display_name,
                access_key,
                secret_key,
                admin,
            }) => {
                let rgw = open(&admin, g).await?;
                let name = if display_name.is_empty() {
                    uid.clone()
                } else {
                    display_name
                };
                let u = rgw
                    .create_user(&uid, &name, key_of(access_key, secret_key))
                    .await?;
                print_user(&u, g.format)?;
            }
            S3Command::User(UserCommand::Ls { admin }) => {
                let users = open(&admin, g).await?.users().await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&users)?),
                    OutputFormat::Plain => users.iter().for_each(|u| println!("{u}")),
                }
            }
            S3Command::User(UserCommand::Info { uid, admin }) => {
                let u = open(&admin, g).await?.user(&uid).await?;
                print_user(&u, g.format)?;
            }
            S3Command::User(UserCommand::Rm { uid, admin }) => {
                open(&admin, g).await?.remove_user(&uid).await?;
                eprintln!("user '{uid}' removed");
            }
            S3Command::Key(KeyCommand::Create {
                uid,
                access_key,
                secret_key,
                admin,
            }) => {
                let k = open(&admin, g)
                    .await?
                    .add_key(&uid, key_of(access_key, secret_key))
                    .await?;
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&k)?),
                    OutputFormat::Plain => {
                        println!("access key:   {}", k.access_key);
                        println!("secret key:   {}", k.secret_key);
                    }
                }
            }
            S3Command::Key(KeyCommand::Rm { access_key, admin }) => {
                open(&admin, g).await?.remove_key(&access_key).await?;
                eprintln!("access key '{access_key}' removed");
            }
            S3Command::Bucket(BucketCommand::Ls { uid, admin }) => {
                let rgw = open(&admin, g).await?;
                let list: Vec<(String, String)> = match uid {
                    Some(u) => rgw
                        .user_buckets(&u)
                        .await?
                        .into_iter()
                        .map(|(b, _)| (b, u.clone()))
                        .collect(),
                    None => rgw.all_buckets().await?,
                };
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = list
                            .iter()
                            .map(|(b, o)| serde_json::json!({"bucket": b, "owner": o}))
                            .collect();
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    }
                    OutputFormat::Plain => list.iter().for_each(|(b, o)| println!("{b}\t{o}")),
                }
            }
            S3Command::Bucket(BucketCommand::Stats { bucket, admin }) => {
                let rgw = open(&admin, g).await?;
                let b = rgw.bucket(&bucket).await?;
                let (objects, bytes) = rgw.bucket_usage(&b).await?;
                let v = serde_json::json!({
                    "bucket": b.name, "id": b.id, "owner": b.owner, "num_shards": b.shards,
                    "num_objects": objects, "size_bytes": bytes,
                    "generation": b.generation, "resharding_to": b.reshard.as_ref().map(|t| t.shards),
                });
                match g.format {
                    OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&v)?),
                    OutputFormat::Plain => {
                        println!("bucket:   {}", b.name);
                        println!("id:       {}", b.id);
                        println!("owner:    {}", b.owner);
                        println!("shards:   {}", b.shards);
                        println!("objects:  {objects}");
                        println!("bytes:    {bytes}");
                    }
                }
            }
            S3Command::Bucket(BucketCommand::Create {
                bucket,
                uid,
                num_shards,
                admin,
            }) => {
                let rgw = open(&admin, g).await?;
                rgw.user(&uid).await?;
                let b = rgw
                    .create_bucket(&uid, &bucket, num_shards, "", kelp_rgw::acl::CannedAcl::Private)
                    .await?;
                eprintln!("bucket '{}' created ({} index shards)", b.name, b.shards);
            }
            S3Command::Bucket(BucketCommand::Reshard {
                bucket,
                num_shards,
                admin,
            }) => {
                let s = open(&admin, g).await?.reshard(&bucket, num_shards).await?;
                eprintln!(
                    "bucket '{bucket}' resharded from {} to {} shards ({} entries copied, {} \
                     changes replayed while it served)",
                    s.from_shards, s.to_shards, s.copied, s.replayed
                );
            }
            S3Command::Bucket(BucketCommand::Rm {
                bucket,
                purge_objects,
                admin,
            }) => {
                let rgw = open(&admin, g).await?;
                let b = rgw.bucket(&bucket).await?;
                let n = rgw.delete_bucket(&b, purge_objects).await?;
                eprintln!("bucket '{bucket}' removed ({n} object(s) deleted)");
            }
            S3Command::Bench(_) => unreachable!("handled above"),
            S3Command::Lc(LcCommand::Run { admin }) => {
                let day = Duration::from_secs(admin.pools.lc_day_secs.max(1));
                let s = open(&admin, g).await?.lc_once(day).await?;
                if matches!(g.format, OutputFormat::Json) {
                    println!("{}", serde_json::to_string_pretty(&s)?);
                } else {
                    eprintln!(
                        "lifecycle: {} bucket(s) with rules; {} object(s) expired, {} noncurrent version(s) and {} delete marker(s) removed, {} upload(s) aborted",
                        s.buckets,
                        s.expired,
                        s.noncurrent_removed,
                        s.delete_markers_removed,
                        s.uploads_aborted
                    );
                }
            }
            S3Command::Gc(GcCommand::Run { admin }) => {
                let s = open(&admin, g).await?.gc_once().await?;
                eprintln!(
                    "garbage collected: {} unreferenced instance(s), {} abandoned upload(s)",
                    s.collected, s.abandoned
                );
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Opens (creating them if missing) the default gateway pools of a `kelp up` cluster, the
/// data pool erasure-coded with `data_pool_profile` if given.
pub async fn open_default_pools(
    rados: kelp_client::Rados,
    data_pool_profile: Option<String>,
) -> Result<Rgw> {
    let cfg = RgwConfig {
        data_pool_profile,
        ..RgwConfig::default()
    };
    Ok(Rgw::open(rados, cfg).await?)
}

/// Creates the default S3 user of a `kelp up` cluster (if missing) and returns its key.
pub async fn ensure_default_user(rados: kelp_client::Rados, uid: &str) -> Result<AccessKey> {
    let rgw = open_default_pools(rados, None).await?;
    match rgw.user(uid).await {
        Ok(u) => u
            .keys
            .first()
            .cloned()
            .with_context(|| format!("user '{uid}' has no access key")),
        Err(kelp_rgw::RgwError::NoSuchUser(_)) => {
            let u = rgw.create_user(uid, "Kelp default user", None).await?;
            Ok(u.keys[0].clone())
        }
        Err(e) => bail!(e),
    }
}

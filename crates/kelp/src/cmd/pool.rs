//! `kelp pool`: create, list, inspect, change and delete pools, replicated or erasure-coded
//! (`--erasure PROFILE`, or Ceph's positional `NAME PG_NUM erasure PROFILE`).

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use kelp_maps::{Pool, PoolSpec};
use kelp_proto::{MonCommand, MonReply};

use crate::cmd::OutputFormat;
use crate::cmd::common;

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Create a pool: replicated (default) or erasure-coded (--erasure [PROFILE]).
    ///
    /// Ceph's positional form works too: `kelp pool create NAME [PG_NUM] [replicated | erasure
    /// [PROFILE]]`. An erasure-coded pool's size is k+m of its profile, its min_size k+1 by
    /// default (at most k+m), and it gets a CRUSH rule of its own, named after it, from the
    /// profile's root, device class and failure domain; creation is refused when CRUSH has
    /// fewer failure domains than k+m.
    Create(CreateArgs),
    /// List pools (`detail`: one line per pool with its settings, like `ceph osd pool ls
    /// detail`).
    Ls(ListArgs),
    /// Delete a pool and every object in it. Needs --yes-i-really-mean-it.
    ///
    /// The pool leaves the OSD map at once (its objects can no longer be read or written, and
    /// its id is never given to another pool); every OSD then removes the objects of its PGs
    /// in the background, throttled by osd_target_transaction_size and osd_delete_sleep
    /// (central config), and the space comes back as it goes: `kelp progress` shows a
    /// pool-deletion item, `kelp osd df` the usage falling.
    Rm(RmArgs),
    /// Show a pool's settings (all, or one KEY).
    Get(GetArgs),
    /// Change a pool setting: size, min_size, crush_rule or fast_read.
    Set(SetArgs),
    /// Self-managed snapshot ids (what block images and file systems snapshot with):
    /// `create POOL` allocates the pool's next id and prints it; `rm POOL ID` removes one (its
    /// clones are trimmed in the background). Writers name the snapshots they know in their
    /// snapshot context (`kelp rados --snap-context`); readers read at one (`kelp rados
    /// --snap-id`).
    #[command(name = "selfmanaged-snap", subcommand)]
    SelfmanagedSnap(SnapCommand),
}

#[derive(Subcommand, Debug)]
pub enum SnapCommand {
    /// Allocate the pool's next snapshot id (printed; `--format json`: {"pool", "snap_id"}).
    Create { pool: String },
    /// Remove snapshot ID of the pool: reads at it find nothing, its clones are trimmed.
    Rm { pool: String, id: u64 },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The new pool's name.
    pub name: String,
    /// Ceph's positional form: `[PG_NUM] [replicated | erasure [PROFILE]]`, e.g. `32 erasure
    /// myprofile` (the same as `--pg-num 32 --erasure myprofile`).
    #[arg(value_name = "PG_NUM|TYPE|PROFILE", num_args = 0..=3)]
    pub ceph_args: Vec<String>,
    /// Number of placement groups (default 32).
    #[arg(long)]
    pub pg_num: Option<u32>,
    /// Replicas to keep (default 3). An erasure-coded pool's size is always k+m.
    #[arg(long)]
    pub size: Option<u32>,
    /// Fewest replicas that still serve I/O (default size - size/2). Erasure-coded: fewest
    /// shards, between k and k+m (default the profile's: k+1, at most k+m).
    #[arg(long)]
    pub min_size: Option<u32>,
    /// CRUSH rule name or id (default replicated_rule; an erasure-coded pool gets a rule of its
    /// own unless this names a `type erasure` rule).
    #[arg(long)]
    pub rule: Option<String>,
    /// Make an erasure-coded pool with this erasure-code profile (default: `default`, k=2 m=2
    /// one shard per host). Profiles: `kelp osd erasure-code-profile`.
    #[arg(
        long,
        value_name = "PROFILE",
        num_args = 0..=1,
        default_missing_value = kelp_maps::DEFAULT_EC_PROFILE
    )]
    pub erasure: Option<String>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// `detail`: one line per pool with its type (replicated, or erasure with the profile's
    /// name, k and m), size, min_size, CRUSH rule, PG count, flags and, for erasure-coded
    /// pools, stripe_width and fast_read.
    #[arg(value_parser = ["detail"])]
    pub detail: Option<String>,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The pool to delete.
    pub name: String,
    /// Confirms that every object of the pool is to be deleted.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// The pool.
    pub name: String,
    /// One of: id, name, type, size, min_size, pg_num, pgp_num, crush_rule, flags; for
    /// erasure-coded pools also erasure_code_profile, k, m, stripe_width, fast_read (default:
    /// all).
    pub key: Option<String>,
}

#[derive(Args, Debug)]
pub struct SetArgs {
    /// The pool.
    pub name: String,
    /// size, min_size, crush_rule or fast_read. An erasure-coded pool's size (k+m) cannot
    /// change and its min_size stays between k and k+m; fast_read (read every shard, decode
    /// from the first k answers) is for erasure-coded pools only.
    pub key: String,
    /// The new value (a number; for crush_rule the rule's name or id; for fast_read true or
    /// false).
    pub value: String,
}

/// The pool as `pool ls -f json` and `pool get` show it (Ceph's key names).
fn pool_json(p: &Pool) -> serde_json::Value {
    let mut v = serde_json::json!({
        "id": p.id, "name": p.name, "type": p.type_name(), "size": p.size,
        "min_size": p.min_size, "pg_num": p.pg_num, "pgp_num": p.pgp_num,
        "crush_rule": p.crush_rule,
        "flags": if p.hashpspool { vec!["hashpspool"] } else { vec![] },
    });
    if let (Some(code), Some(obj)) = (p.ec(), v.as_object_mut()) {
        let profile = p.ec_profile_name().unwrap_or_default();
        obj.insert("erasure_code_profile".into(), profile.into());
        obj.insert("k".into(), code.k.into());
        obj.insert("m".into(), code.m.into());
        obj.insert("stripe_width".into(), (code.k * code.stripe_unit).into());
        obj.insert("fast_read".into(), p.fast_read.into());
    }
    v
}

/// One line of `pool ls detail`, in the shape of `ceph osd pool ls detail`.
fn pool_detail_line(p: &Pool) -> String {
    let kind = match p.ec() {
        Some(code) => format!(
            "erasure profile {} k={} m={}",
            p.ec_profile_name().unwrap_or_default(),
            code.k,
            code.m
        ),
        None => "replicated".to_string(),
    };
    let mut line = format!(
        "pool {} '{}' {kind} size {} min_size {} crush_rule {} pg_num {} pgp_num {}",
        p.id, p.name, p.size, p.min_size, p.crush_rule, p.pg_num, p.pgp_num
    );
    if p.hashpspool {
        line.push_str(" flags hashpspool");
    }
    if let Some(code) = p.ec() {
        line.push_str(&format!(
            " stripe_width {} fast_read {}",
            code.k * code.stripe_unit,
            u8::from(p.fast_read)
        ));
    }
    line
}

/// `key: value` as `pool get` prints it (strings without quotes).
fn plain_value(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The pool `pool create` asks for: the options, plus Ceph's positional
/// `[PG_NUM] [replicated | erasure [PROFILE]]`.
fn create_spec(a: &CreateArgs) -> Result<PoolSpec> {
    let mut rest = a.ceph_args.iter().map(String::as_str).peekable();
    let pg_pos = match rest.peek().map(|w| w.parse::<u32>()) {
        Some(Ok(n)) => {
            rest.next();
            Some(n)
        }
        _ => None,
    };
    let mut erasure_pos = None;
    let mut replicated_pos = false;
    match rest.next() {
        None => {}
        Some("replicated") => replicated_pos = true,
        Some("erasure") => {
            erasure_pos = Some(
                rest.next()
                    .unwrap_or(kelp_maps::DEFAULT_EC_PROFILE)
                    .to_string(),
            )
        }
        Some(other) => bail!(
            "'{other}' is not a pool type: `kelp pool create NAME [PG_NUM] [replicated |              erasure [PROFILE]]`"
        ),
    }
    if let Some(extra) = rest.next() {
        bail!("unexpected argument '{extra}' after the pool type and profile");
    }
    let pg_num = match (a.pg_num, pg_pos) {
        (Some(opt), Some(pos)) if opt != pos => {
            bail!("PG_NUM {pos} and --pg-num {opt} disagree")
        }
        (opt, pos) => opt.or(pos),
    };
    let erasure = match (&a.erasure, erasure_pos) {
        (Some(_), _) if replicated_pos => {
            bail!("--erasure asks for an erasure-coded pool, `replicated` for a replicated one")
        }
        (Some(opt), Some(pos)) if *opt != pos => {
            bail!("profile '{pos}' and --erasure {opt} disagree")
        }
        (opt, pos) => opt.clone().or(pos),
    };
    Ok(PoolSpec {
        name: a.name.clone(),
        pg_num,
        size: a.size,
        min_size: a.min_size,
        crush_rule: a.rule.clone(),
        erasure,
    })
}

pub fn run(cmd: PoolCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    rt.block_on(async move {
        match cmd {
            PoolCommand::Create(a) => {
                let spec = create_spec(&a)?;
                let rados = g.conf.connect().await?;
                let id = rados.create_pool(spec).await?;
                let map = rados.osd_map();
                match map.pools.get(&id).filter(|p| p.ec().is_some()) {
                    Some(p) => eprintln!(
                        "erasure-coded pool '{}' created (id {id}; {})",
                        a.name,
                        pool_detail_line(p)
                    ),
                    None => eprintln!("pool '{}' created (id {id})", a.name),
                }
            }
            PoolCommand::Ls(a) => {
                let map = g.conf.connect().await?.osd_map();
                match g.format {
                    OutputFormat::Json => {
                        let v: Vec<_> = map.pools.values().map(pool_json).collect();
                        println!("{}", serde_json::to_string_pretty(&v)?);
                    }
                    OutputFormat::Plain if a.detail.is_some() => {
                        for p in map.pools.values() {
                            println!("{}", pool_detail_line(p));
                        }
                    }
                    OutputFormat::Plain => {
                        for p in map.pools.values() {
                            println!("{}", p.name);
                        }
                    }
                }
            }
            PoolCommand::Rm(a) => {
                if !a.yes_i_really_mean_it {
                    bail!(
                        "deleting pool '{}' destroys all its objects; pass --yes-i-really-mean-it",
                        a.name
                    );
                }
                let rados = g.conf.connect().await?;
                rados.delete_pool(&a.name).await?;
                eprintln!("pool '{}' deleted", a.name);
            }
            PoolCommand::Get(a) => {
                let map = g.conf.connect().await?.osd_map();
                let Some(p) = map.pool_by_name(&a.name) else {
                    bail!("pool '{}' does not exist", a.name);
                };
                let all = pool_json(p);
                match &a.key {
                    Some(k) => match all.get(k.as_str()) {
                        Some(v) if g.format == OutputFormat::Json => {
                            println!("{}", serde_json::json!({ k.as_str(): v }))
                        }
                        Some(v) => println!("{k}: {}", plain_value(v)),
                        None => bail!("unknown pool setting '{k}'"),
                    },
                    None if g.format == OutputFormat::Json => {
                        println!("{}", serde_json::to_string_pretty(&all)?)
                    }
                    None => {
                        if let Some(obj) = all.as_object() {
                            for (k, v) in obj {
                                println!("{k}: {}", plain_value(v));
                            }
                        }
                    }
                }
            }
            PoolCommand::SelfmanagedSnap(SnapCommand::Create { pool }) => {
                let rados = g.conf.connect().await?;
                let snap = rados.selfmanaged_snap_create(&pool).await?;
                match g.format {
                    crate::cmd::OutputFormat::Json => {
                        println!("{}", serde_json::json!({"pool": pool, "snap_id": snap}))
                    }
                    crate::cmd::OutputFormat::Plain => println!("{snap}"),
                }
            }
            PoolCommand::SelfmanagedSnap(SnapCommand::Rm { pool, id }) => {
                let rados = g.conf.connect().await?;
                rados.selfmanaged_snap_remove(&pool, id).await?;
                eprintln!("removed snapshot {id} of pool '{pool}'");
            }
            PoolCommand::Set(a) => {
                let rados = g.conf.connect().await?;
                let reply = rados
                    .mon_command(MonCommand::PoolSet {
                        name: a.name.clone(),
                        key: a.key.clone(),
                        value: a.value.clone(),
                    })
                    .await?;
                match reply {
                    MonReply::Done { epoch } => {
                        eprintln!(
                            "set pool '{}' {} = {} (osdmap epoch {epoch})",
                            a.name, a.key, a.value
                        )
                    }
                    other => bail!("unexpected reply {other:?}"),
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: PoolCommand,
    }

    fn spec(args: &[&str]) -> Result<PoolSpec> {
        let cli = Cli::try_parse_from([&["pool"][..], args].concat())?;
        match cli.cmd {
            PoolCommand::Create(a) => create_spec(&a),
            _ => bail!("not create"),
        }
    }

    #[test]
    fn create_takes_the_option_and_the_ceph_forms() {
        let s = spec(&["create", "p"]).unwrap();
        assert_eq!((s.pg_num, s.erasure), (None, None));
        let s = spec(&["create", "p", "--erasure"]).unwrap();
        assert_eq!(s.erasure.as_deref(), Some("default"));
        let s = spec(&["create", "p", "--erasure", "k4m2", "--pg-num", "16"]).unwrap();
        assert_eq!((s.pg_num, s.erasure.as_deref()), (Some(16), Some("k4m2")));
        let s = spec(&["create", "p", "64", "erasure", "k4m2"]).unwrap();
        assert_eq!((s.pg_num, s.erasure.as_deref()), (Some(64), Some("k4m2")));
        let s = spec(&["create", "p", "64", "erasure"]).unwrap();
        assert_eq!(s.erasure.as_deref(), Some("default"));
        let s = spec(&["create", "p", "erasure", "x", "--min-size", "3"]).unwrap();
        assert_eq!((s.pg_num, s.erasure.as_deref()), (None, Some("x")));
        assert_eq!(s.min_size, Some(3));
        let s = spec(&["create", "p", "8", "replicated", "--size", "2"]).unwrap();
        assert_eq!((s.pg_num, s.size, s.erasure), (Some(8), Some(2), None));
        for bad in [
            &["create", "p", "8", "mirrored"][..],
            &["create", "p", "8", "replicated", "x"],
            &["create", "p", "replicated", "--erasure"],
            &["create", "p", "8", "--pg-num", "16"],
            &["create", "p", "erasure", "a", "--erasure", "b"],
        ] {
            assert!(spec(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn detail_lines_say_the_pool_type() {
        let map = {
            let mut map = kelp_maps::OsdMap::new("f", "osd").unwrap();
            for i in 0..3 {
                let (_, inc) = map
                    .propose_osd_create(&format!("u{i}"), "h", kelp_crush::WEIGHT_ONE)
                    .unwrap();
                map.apply(&inc.unwrap()).unwrap();
            }
            let words = ["k=2", "m=1", "crush-failure-domain=osd"];
            let profile = kelp_ec::Profile::from_words(&words).unwrap();
            let inc = map.propose_ec_profile_set("p21", &profile, false).unwrap();
            map.apply(&inc.unwrap()).unwrap();
            for spec in [
                PoolSpec {
                    name: "rep".into(),
                    pg_num: Some(8),
                    ..PoolSpec::default()
                },
                PoolSpec {
                    name: "ec".into(),
                    pg_num: Some(8),
                    erasure: Some("p21".into()),
                    ..PoolSpec::default()
                },
            ] {
                let (_, inc) = map.propose_pool_create(&spec).unwrap();
                map.apply(&inc).unwrap();
            }
            map
        };
        let lines: Vec<String> = map.pools.values().map(pool_detail_line).collect();
        assert_eq!(
            lines,
            [
                "pool 1 'rep' replicated size 3 min_size 2 crush_rule 0 pg_num 8 pgp_num 8 flags \
                 hashpspool",
                "pool 2 'ec' erasure profile p21 k=2 m=1 size 3 min_size 2 crush_rule 1 pg_num 8 \
                 pgp_num 8 flags hashpspool stripe_width 8192 fast_read 0"
            ]
        );
        let ec = pool_json(map.pool_by_name("ec").unwrap());
        assert_eq!(ec["type"], "erasure");
        assert_eq!(ec["erasure_code_profile"], "p21");
        assert_eq!((ec["k"].as_u64(), ec["m"].as_u64()), (Some(2), Some(1)));
        assert_eq!(ec["fast_read"], false);
        let rep = pool_json(map.pool_by_name("rep").unwrap());
        assert_eq!(rep["type"], "replicated");
        assert!(rep.get("fast_read").is_none());
    }
}

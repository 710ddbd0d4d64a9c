//! `kelp crush …`: placement tools whose output matches Ceph's `crushtool` and `osdmaptool`
//! line for line, so results can be diffed against Ceph directly.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use kelp_crush::{
    CrushMap, ITEM_NONE, ItemId, PoolPlacement, Rule, Scratch, WEIGHT_ONE, crush_hash32_2,
    parse_text,
};

#[derive(Subcommand, Debug)]
pub enum CrushCommand {
    /// Map a range of inputs through a rule and print one line per input, exactly like
    /// `crushtool -i MAP --test --show-mappings` (`CRUSH rule R x X [a,b,c]`).
    Test(TestArgs),
    /// Map object names to their PG and OSDs, like `osdmaptool --test-map-object`
    /// (` object 'NAME' -> POOL.PS -> [a,b,c]`).
    MapObject(MapObjectArgs),
    /// Parse a text map and print it back in Ceph's decompiled format (`crushtool -d`).
    /// A map that prints back unchanged is read exactly as Ceph reads it.
    Show(ShowArgs),
    /// Generate a text map: one root, HOSTS hosts, OSDS-PER-HOST OSDs each, straw2, optimal
    /// tunables, and a replicated rule with failure domain host (id 0).
    Build(BuildArgs),
    /// Measure mapping throughput in-process (no printing): mappings per second.
    Bench(BenchArgs),
    /// The running cluster's CRUSH rules (`ls`, `dump`).
    #[command(subcommand)]
    Rule(crate::cmd::pg::RuleCommand),
}

/// Reweight overrides, as in crushtool: `--weight OSD W` with W from 0 (out) to 1 (in).
#[derive(Args, Debug, Clone, Default)]
pub struct WeightArgs {
    /// Override one device's reweight (0 = out, 1 = in, between = partly out). Repeatable.
    #[arg(long = "weight", num_args = 2, value_names = ["OSD", "W"], action = clap::ArgAction::Append)]
    weight: Vec<String>,
}

impl WeightArgs {
    /// The reweight vector: every placed device in, then the overrides (converted exactly as
    /// crushtool converts them: `(int)(float W * 65536)` clamped to [0, 1.0]).
    fn reweights(&self, map: &CrushMap) -> Result<Vec<u32>> {
        let mut weights = map.default_reweights();
        for pair in self.weight.chunks(2) {
            let [osd, w] = pair else {
                bail!("--weight takes two values: OSD WEIGHT");
            };
            let id: i32 = osd
                .trim_start_matches("osd.")
                .parse()
                .with_context(|| format!("--weight: '{osd}' is not an OSD id"))?;
            if id < 0 || id >= map.max_devices() {
                bail!(
                    "--weight: osd.{id} is not in the map (devices are 0..{})",
                    map.max_devices()
                );
            }
            let f: f32 = w
                .parse()
                .with_context(|| format!("--weight: '{w}' is not a number"))?;
            if !f.is_finite() {
                bail!("--weight: '{w}' is not a finite number");
            }
            let scaled = (f * 65536.0f32) as i64;
            weights[id as usize] = scaled.clamp(0, WEIGHT_ONE as i64) as u32;
        }
        Ok(weights)
    }
}

#[derive(Args, Debug)]
pub struct TestArgs {
    /// CRUSH map in Ceph's text format (as printed by `crushtool -d`).
    #[arg(long, short = 'm', value_name = "MAP.txt")]
    map: PathBuf,
    /// Rule id to test (as `crushtool --rule`).
    #[arg(long, short = 'r')]
    rule: u32,
    /// Number of replicas to ask for (result_max).
    #[arg(long, short = 'n')]
    num_rep: usize,
    /// First input x.
    #[arg(long, default_value_t = 0)]
    min_x: u32,
    /// Last input x (inclusive).
    #[arg(long, default_value_t = 1023)]
    max_x: u32,
    /// Hash each x with this pool id first, as a `hashpspool` pool does with its PG seeds
    /// (`crushtool --pool-id`). The printed x stays the unhashed one.
    #[arg(long)]
    pool_id: Option<u32>,
    #[command(flatten)]
    weights: WeightArgs,
    /// Print only the mappings that are short or contain a hole, as
    /// `bad mapping rule R x X num_rep N result [..]`, instead of every mapping.
    #[arg(long)]
    show_bad_mappings: bool,
}

#[derive(Args, Debug)]
pub struct MapObjectArgs {
    /// CRUSH map in Ceph's text format.
    #[arg(long, short = 'm', value_name = "MAP.txt")]
    map: PathBuf,
    /// The pool's CRUSH rule id.
    #[arg(long, short = 'r')]
    rule: u32,
    /// Pool id.
    #[arg(long)]
    pool_id: u32,
    /// Number of placement groups of the pool.
    #[arg(long)]
    pg_num: u32,
    /// Number of placement groups used for placement (defaults to pg_num).
    #[arg(long)]
    pgp_num: Option<u32>,
    /// Replica count (k+m for erasure-coded pools).
    #[arg(long)]
    size: usize,
    /// Treat the pool as erasure-coded: positions are kept, holes print as 2147483647.
    #[arg(long)]
    erasure: bool,
    /// The pool lacks the `hashpspool` flag (pre-Luminous pools).
    #[arg(long)]
    no_hashpspool: bool,
    /// Object namespace.
    #[arg(long, default_value = "")]
    namespace: String,
    /// Object locator key: hashed instead of the name when given.
    #[arg(long)]
    key: Option<String>,
    #[command(flatten)]
    weights: WeightArgs,
    /// Object names.
    #[arg(required = true, value_name = "NAME")]
    names: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// CRUSH map in Ceph's text format.
    #[arg(long, short = 'm', value_name = "MAP.txt")]
    map: PathBuf,
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// Number of hosts.
    #[arg(long, default_value_t = 3)]
    hosts: u32,
    /// OSDs per host (numbered consecutively).
    #[arg(long, default_value_t = 1)]
    osds_per_host: u32,
    /// Vary OSD weights deterministically between 0.5 and 4.0 instead of all 1.0.
    #[arg(long)]
    mixed_weights: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// CRUSH map in Ceph's text format.
    #[arg(long, short = 'm', value_name = "MAP.txt")]
    map: PathBuf,
    /// Rule id.
    #[arg(long, short = 'r', default_value_t = 0)]
    rule: u32,
    /// Replicas per mapping.
    #[arg(long, short = 'n', default_value_t = 3)]
    num_rep: usize,
    /// Number of inputs to map (x = 0..count).
    #[arg(long, default_value_t = 1_000_000)]
    count: u32,
}

pub fn run(cmd: CrushCommand, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    match cmd {
        CrushCommand::Test(a) => test(a),
        CrushCommand::MapObject(a) => map_object(a),
        CrushCommand::Show(a) => {
            let map = load(&a.map)?;
            print!("{}", map.to_text());
            Ok(ExitCode::SUCCESS)
        }
        CrushCommand::Build(a) => build(a),
        CrushCommand::Bench(a) => bench(a, g),
        CrushCommand::Rule(c) => crate::cmd::pg::run_rule(c, g),
    }
}

fn load(path: &Path) -> Result<CrushMap> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read CRUSH map {}", path.display()))?;
    parse_text(&text).with_context(|| format!("{}", path.display()))
}

fn check_rule(map: &CrushMap, rule: u32, num_rep: usize) -> Result<()> {
    if map.rule(rule).is_none() {
        let known: Vec<String> = map
            .rules()
            .map(|r| format!("{} ({})", r.id, r.name))
            .collect();
        bail!(
            "rule {rule} does not exist in this map; its rules are: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    }
    if num_rep == 0 || num_rep > kelp_crush::MAX_NUM_REP {
        bail!(
            "--num-rep {num_rep} is out of range: it must be between 1 and {}",
            kelp_crush::MAX_NUM_REP
        );
    }
    Ok(())
}

/// Appends `[a,b,c]` to `line`.
fn push_list(line: &mut Vec<u8>, items: &[ItemId]) {
    line.push(b'[');
    let mut buf = itoa::Buffer::new();
    for (i, &item) in items.iter().enumerate() {
        if i > 0 {
            line.push(b',');
        }
        line.extend_from_slice(buf.format(item).as_bytes());
    }
    line.push(b']');
}

fn test(a: TestArgs) -> Result<ExitCode> {
    let map = load(&a.map)?;
    check_rule(&map, a.rule, a.num_rep)?;
    if a.min_x > a.max_x {
        bail!("--min-x {} is greater than --max-x {}", a.min_x, a.max_x);
    }
    let reweights = a.weights.reweights(&map)?;
    if reweights.iter().all(|&w| w == 0) {
        // crushtool skips the test when the reweights sum to zero; print nothing either, so
        // outputs stay diffable, but say why.
        eprintln!("kelp: every device is out (all reweights are 0): nothing can be mapped");
        return Ok(ExitCode::SUCCESS);
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut result = Vec::with_capacity(a.num_rep);
    let mut scratch = Scratch::default();
    let mut line = Vec::with_capacity(128);
    let mut num = itoa::Buffer::new();
    let prefix = format!("CRUSH rule {} x ", a.rule);
    for x in a.min_x..=a.max_x {
        let input = a.pool_id.map_or(x, |p| crush_hash32_2(x, p));
        map.do_rule_into(
            a.rule,
            input,
            a.num_rep,
            &reweights,
            &mut result,
            &mut scratch,
        )?;
        line.clear();
        if a.show_bad_mappings {
            let bad = result.len() < a.num_rep || result.contains(&ITEM_NONE);
            if !bad {
                continue;
            }
            line.extend_from_slice(b"bad mapping rule ");
            line.extend_from_slice(num.format(a.rule).as_bytes());
            line.extend_from_slice(b" x ");
            line.extend_from_slice(num.format(x).as_bytes());
            line.extend_from_slice(b" num_rep ");
            line.extend_from_slice(num.format(a.num_rep).as_bytes());
            line.extend_from_slice(b" result ");
        } else {
            line.extend_from_slice(prefix.as_bytes());
            line.extend_from_slice(num.format(x).as_bytes());
            line.push(b' ');
        }
        push_list(&mut line, &result);
        line.push(b'\n');
        if let Err(e) = out.write_all(&line) {
            return broken_pipe_ok(e);
        }
    }
    if let Err(e) = out.flush() {
        return broken_pipe_ok(e);
    }
    Ok(ExitCode::SUCCESS)
}

/// `kelp crush test | head` must not print an error.
fn broken_pipe_ok(e: std::io::Error) -> Result<ExitCode> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(e).context("writing output")
    }
}

fn map_object(a: MapObjectArgs) -> Result<ExitCode> {
    let map = load(&a.map)?;
    check_rule(&map, a.rule, a.size)?;
    if a.pg_num == 0 {
        bail!("--pg-num must be at least 1");
    }
    let pgp_num = a.pgp_num.unwrap_or(a.pg_num);
    if pgp_num == 0 || pgp_num > a.pg_num {
        bail!("--pgp-num must be between 1 and --pg-num ({})", a.pg_num);
    }
    let reweights = a.weights.reweights(&map)?;
    let pool = PoolPlacement {
        pool_id: a.pool_id,
        pg_num: a.pg_num,
        pgp_num,
        hashpspool: !a.no_hashpspool,
        crush_rule: a.rule,
        size: a.size,
        erasure: a.erasure,
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for name in &a.names {
        let pg = pool.object_pg(name, a.key.as_deref(), &a.namespace);
        let raw = pool.raw_osds(&map, pg.seed, &reweights)?;
        let mut line = format!(" object '{name}' -> {pg} -> ").into_bytes();
        push_list(&mut line, &raw);
        line.push(b'\n');
        if let Err(e) = out.write_all(&line) {
            return broken_pipe_ok(e);
        }
    }
    if let Err(e) = out.flush() {
        return broken_pipe_ok(e);
    }
    Ok(ExitCode::SUCCESS)
}

fn build(a: BuildArgs) -> Result<ExitCode> {
    if a.hosts == 0 || a.osds_per_host == 0 {
        bail!("--hosts and --osds-per-host must be at least 1");
    }
    let mut map = CrushMap::with_default_types();
    let host_type = map.type_id("host").context("host type")?;
    let root_type = map.type_id("root").context("root type")?;
    let mut hosts = Vec::new();
    for h in 0..a.hosts {
        let mut items = Vec::new();
        for i in 0..a.osds_per_host {
            let id = (h * a.osds_per_host + i) as i32;
            map.add_device(id, &format!("osd.{id}"), None)?;
            let weight = if a.mixed_weights {
                // 0.5 … 4.0 in steps of 1/8, spread by a hash so neighbours differ.
                let step = crush_hash32_2(id as u32, 0x6b656c70) % 29;
                WEIGHT_ONE / 2 + step * (WEIGHT_ONE / 8)
            } else {
                WEIGHT_ONE
            };
            items.push((id, Some(weight)));
        }
        hosts.push(map.add_bucket(None, &format!("host{h}"), host_type, &items)?);
    }
    let root_items: Vec<(ItemId, Option<u32>)> = hosts.iter().map(|&h| (h, None)).collect();
    let root = map.add_bucket(None, "default", root_type, &root_items)?;
    map.finalize()?;
    map.add_rule(Rule::replicated(0, "replicated_rule", root, host_type))?;
    map.finalize()?;
    print!("{}", map.to_text());
    Ok(ExitCode::SUCCESS)
}

fn bench(a: BenchArgs, g: &crate::cmd::common::Global) -> Result<ExitCode> {
    let map = load(&a.map)?;
    check_rule(&map, a.rule, a.num_rep)?;
    let reweights = map.default_reweights();
    let mut result = Vec::with_capacity(a.num_rep);
    let mut scratch = Scratch::default();
    let mut checksum = 0u64;
    let start = Instant::now();
    for x in 0..a.count {
        map.do_rule_into(a.rule, x, a.num_rep, &reweights, &mut result, &mut scratch)?;
        checksum = checksum.wrapping_add(result.iter().map(|&o| o as u64).sum::<u64>());
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = a.count as f64 / secs;
    match g.format {
        crate::cmd::OutputFormat::Json => println!(
            "{}",
            serde_json::json!({
                "map": a.map.display().to_string(),
                "rule": a.rule,
                "num_rep": a.num_rep,
                "mappings": a.count,
                "seconds": secs,
                "mappings_per_s": rate,
                "checksum": checksum,
            })
        ),
        crate::cmd::OutputFormat::Plain => println!(
            "{} mappings of rule {} (num_rep {}) in {:.3} s: {:.0} mappings/s (checksum {})",
            a.count, a.rule, a.num_rep, secs, rate, checksum
        ),
    }
    Ok(ExitCode::SUCCESS)
}

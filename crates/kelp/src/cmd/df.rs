//! `kelp df` (Ceph's `ceph df`): the cluster's raw capacity and, per pool, the logical bytes
//! stored next to the raw bytes they take, so that what replication and erasure coding cost is
//! visible side by side.
//!
//! Every number comes from the leader monitor's statistics digest (the OSDs' reports, as for
//! `kelp status` and `kelp osd df`) and the OSD map: RAW STORAGE is the OSDs' store usage;
//! a pool's STORED and OBJECTS add up its PGs' counts as their primaries report them (logical
//! object bytes: for an erasure-coded pool, the objects' sizes, not their shards'); USED is
//! STORED times the pool's raw ratio (`size` copies, or `(k+m)/k` for erasure coding; small
//! erasure-coded objects round each shard up to 64 bytes, and the stores' own metadata is not
//! counted, so it is an estimate); MAX AVAIL is how many more logical bytes the pool takes
//! before the first of its OSDs reaches the full ratio, if new data spreads over its PGs as
//! CRUSH places them.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use kelp_maps::OsdMap;
use kelp_proto::{MonCommand, MonReply, PgMapDigest};

use crate::cmd::OutputFormat;
use crate::cmd::common;
use crate::cmd::status::human_bytes;

#[derive(Args, Debug)]
pub struct DfArgs {}

/// The cluster's raw capacity (all OSDs' stores).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawUsage {
    pub total: u64,
    pub avail: u64,
    pub used: u64,
    /// `used / total` (0 with no capacity reported).
    pub used_ratio: f64,
    /// OSDs whose report the numbers include.
    pub reporting_osds: usize,
}

/// One pool's line.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolUsage {
    pub name: String,
    pub id: u32,
    pub pg_num: u32,
    /// `replicated` or `erasure`.
    pub kind: &'static str,
    /// Replicas, or shards (`k + m`).
    pub size: u32,
    /// Erasure-coded pools: profile name, k, m.
    pub ec: Option<(String, u32, u32)>,
    /// Logical bytes of the pool's objects.
    pub stored: u64,
    pub objects: u64,
    /// Raw bytes per logical byte: `size`, or `(k+m)/k`.
    pub raw_ratio: f64,
    /// Raw bytes the objects take (`stored × raw_ratio`).
    pub used: u64,
    /// `stored / (stored + max_avail)`: how much of what the pool could hold it holds.
    pub percent_used: f64,
    /// Logical bytes the pool can still take before its fullest OSD reaches the full ratio.
    pub max_avail: u64,
}

/// What `kelp df` shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Df {
    pub raw: RawUsage,
    pub pools: Vec<PoolUsage>,
}

/// Computes `kelp df` from the map's pools and the leader's digest (pure).
pub fn compute(map: &OsdMap, digest: &PgMapDigest) -> Df {
    let t = &digest.totals;
    let raw = RawUsage {
        total: t.bytes_total,
        avail: t.bytes_avail,
        used: t.bytes_used,
        used_ratio: ratio(t.bytes_used, t.bytes_total),
        reporting_osds: digest.osds.iter().filter(|o| o.reported).count(),
    };
    // Room each OSD has before the full ratio, from its own report.
    let full = f64::from(digest.full_ratio_ppm) / 1e6;
    let headroom: BTreeMap<i32, u64> = digest
        .osds
        .iter()
        .filter(|o| o.reported)
        .map(|o| {
            let to_full = ((o.space.total as f64 * full) as u64).saturating_sub(o.space.used);
            (o.id, to_full.min(o.space.available))
        })
        .collect();
    let pools = map
        .pools
        .values()
        .map(|p| {
            let (mut stored, mut objects) = (0u64, 0u64);
            // PG placements per OSD (a PG of size 3 places on 3 OSDs).
            let mut placements: BTreeMap<i32, u64> = BTreeMap::new();
            for s in digest.pgs.iter().filter(|s| s.stat.pg.pool.0 == p.id) {
                stored += s.stat.num_bytes;
                objects += s.stat.num_objects;
                for &osd in s.stat.up.iter().filter(|&&o| o >= 0) {
                    *placements.entry(osd).or_default() += 1;
                }
            }
            let (raw_ratio, ec) = match p.ec() {
                Some(code) => (
                    f64::from(code.k + code.m) / f64::from(code.k),
                    Some((
                        p.ec_profile_name().unwrap_or_default().to_string(),
                        code.k,
                        code.m,
                    )),
                ),
                None => (f64::from(p.size), None),
            };
            let max_avail = max_avail(&placements, &headroom, raw_ratio);
            PoolUsage {
                name: p.name.clone(),
                id: p.id,
                pg_num: p.pg_num,
                kind: p.type_name(),
                size: p.size,
                ec,
                stored,
                objects,
                raw_ratio,
                used: (stored as f64 * raw_ratio).round() as u64,
                percent_used: ratio(stored, stored.saturating_add(max_avail)),
                max_avail,
            }
        })
        .collect();
    Df { raw, pools }
}

/// Logical bytes a pool takes before the first of its OSDs is full: new data spreads evenly
/// over its PG placements, so OSD `i` receives `placements_i / all placements` of the raw
/// bytes; it fills when that share reaches its headroom. An OSD without a report counts as
/// having no room.
fn max_avail(
    placements: &BTreeMap<i32, u64>,
    headroom: &BTreeMap<i32, u64>,
    raw_ratio: f64,
) -> u64 {
    let all: u64 = placements.values().sum();
    if all == 0 || raw_ratio <= 0.0 {
        return 0;
    }
    let raw = placements
        .iter()
        .map(|(osd, &n)| headroom.get(osd).copied().unwrap_or(0) as f64 * all as f64 / n as f64)
        .fold(f64::INFINITY, f64::min);
    (raw / raw_ratio) as u64
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The pool's type as the table shows it: `replicated 3`, `erasure 4+2`.
fn type_label(p: &PoolUsage) -> String {
    match &p.ec {
        Some((_, k, m)) => format!("erasure {k}+{m}"),
        None => format!("replicated {}", p.size),
    }
}

/// `kelp df -f json`, with Ceph's `ceph df -f json` key names (ratios as fractions), and
/// Kelp's own additions per pool (`type`, `size`, `raw_ratio`, erasure-code details).
pub fn to_json(df: &Df) -> serde_json::Value {
    let pools: Vec<serde_json::Value> = df
        .pools
        .iter()
        .map(|p| {
            let mut v = serde_json::json!({
                "name": p.name, "id": p.id, "type": p.kind, "size": p.size, "pg_num": p.pg_num,
                "raw_ratio": p.raw_ratio,
                "stats": {
                    "stored": p.stored, "objects": p.objects, "bytes_used": p.used,
                    "kb_used": p.used.div_ceil(1024), "percent_used": p.percent_used,
                    "max_avail": p.max_avail,
                },
            });
            if let (Some((profile, k, m)), Some(obj)) = (&p.ec, v.as_object_mut()) {
                obj.insert("erasure_code_profile".into(), profile.clone().into());
                obj.insert("k".into(), (*k).into());
                obj.insert("m".into(), (*m).into());
            }
            v
        })
        .collect();
    serde_json::json!({
        "stats": {
            "total_bytes": df.raw.total, "total_avail_bytes": df.raw.avail,
            "total_used_bytes": df.raw.used, "total_used_raw_bytes": df.raw.used,
            "total_used_raw_ratio": df.raw.used_ratio, "num_osds": df.raw.reporting_osds,
        },
        "pools": pools,
    })
}

/// `kelp df` as text, in the shape of `ceph df`.
pub fn to_text(df: &Df) -> String {
    let mut out = String::from("--- RAW STORAGE ---\n");
    out.push_str(&format!(
        "{:<6} {:>10} {:>10} {:>10} {:>10}\n",
        "", "SIZE", "AVAIL", "USED", "%RAW USED"
    ));
    out.push_str(&format!(
        "{:<6} {:>10} {:>10} {:>10} {:>10.2}\n",
        "TOTAL",
        human_bytes(df.raw.total),
        human_bytes(df.raw.avail),
        human_bytes(df.raw.used),
        df.raw.used_ratio * 100.0
    ));
    out.push_str("\n--- POOLS ---\n");
    let width = df
        .pools
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    out.push_str(&format!(
        "{:<width$} {:>4} {:>5} {:<14} {:>10} {:>8} {:>10} {:>6} {:>10}\n",
        "POOL", "ID", "PGS", "TYPE", "STORED", "OBJECTS", "USED", "%USED", "MAX AVAIL"
    ));
    for p in &df.pools {
        out.push_str(&format!(
            "{:<width$} {:>4} {:>5} {:<14} {:>10} {:>8} {:>10} {:>6.2} {:>10}\n",
            p.name,
            p.id,
            p.pg_num,
            type_label(p),
            human_bytes(p.stored),
            p.objects,
            human_bytes(p.used),
            p.percent_used * 100.0,
            human_bytes(p.max_avail)
        ));
    }
    out
}

pub fn run(_a: DfArgs, g: &common::Global) -> Result<ExitCode> {
    let rt = common::runtime()?;
    let (map, digest) = rt.block_on(async {
        let rados = g.conf.connect().await?;
        let digest = match rados.mon_command(MonCommand::PgStats).await? {
            MonReply::PgStats(d) => *d,
            other => bail!("unexpected reply from the monitors: {other:?}"),
        };
        // The digest was computed against the leader's map: use one at least that new, so
        // that every pool it counts is named.
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            rados.wait_for_epoch(digest.epoch),
        )
        .await;
        Ok((rados.osd_map(), digest))
    })?;
    let df = compute(&map, &digest);
    match g.format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&to_json(&df))?),
        OutputFormat::Plain => print!("{}", to_text(&df)),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kelp_maps::PoolSpec;
    use kelp_proto::{OsdSpace, OsdSummary, PgMapTotals, PgStat, PgSummary};
    use kelp_types::PgId;

    const GIB: u64 = 1 << 30;

    /// Three OSDs, a replicated pool of size 3 and a 2+1 erasure-coded pool, 4 PGs each.
    fn map() -> OsdMap {
        let mut map = OsdMap::new("f", "osd").unwrap();
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
                pg_num: Some(4),
                ..PoolSpec::default()
            },
            PoolSpec {
                name: "ec".into(),
                pg_num: Some(4),
                erasure: Some("p21".into()),
                ..PoolSpec::default()
            },
        ] {
            let (_, inc) = map.propose_pool_create(&spec).unwrap();
            map.apply(&inc).unwrap();
        }
        map
    }

    fn pg(pool: u32, seed: u32, up: Vec<i32>, objects: u64, bytes: u64) -> PgSummary {
        PgSummary {
            state_name: "active+clean".into(),
            stat: PgStat {
                pg: PgId::new(pool, seed),
                state: Vec::new(),
                acting: up.clone(),
                up,
                num_objects: objects,
                num_bytes: bytes,
                num_objects_degraded: 0,
                num_objects_misplaced: 0,
                num_objects_unfound: 0,
                last_update: (1, 1),
                reported_epoch: 1,
                scrub: None,
            },
            reported: true,
        }
    }

    fn osd(id: i32, total: u64, used: u64) -> OsdSummary {
        OsdSummary {
            id,
            up: true,
            in_: true,
            reported: true,
            space: OsdSpace {
                total,
                used,
                available: total - used,
            },
            num_pgs: 0,
            fullness: Default::default(),
            rates: Default::default(),
        }
    }

    fn digest(osds: Vec<OsdSummary>, pgs: Vec<PgSummary>) -> PgMapDigest {
        let totals = PgMapTotals {
            bytes_total: osds.iter().map(|o| o.space.total).sum(),
            bytes_used: osds.iter().map(|o| o.space.used).sum(),
            bytes_avail: osds.iter().map(|o| o.space.available).sum(),
            ..PgMapTotals::default()
        };
        PgMapDigest {
            epoch: 1,
            pgs,
            osds,
            totals,
            nearfull_ratio_ppm: 850_000,
            backfillfull_ratio_ppm: 900_000,
            full_ratio_ppm: 950_000,
            recovery: Default::default(),
            work: Default::default(),
            recovered_objects: Default::default(),
        }
    }

    #[test]
    fn stored_and_raw_bytes_per_pool_kind() {
        let map = map();
        let all = vec![0, 1, 2];
        let d = digest(
            vec![
                osd(0, 10 * GIB, GIB),
                osd(1, 10 * GIB, GIB),
                osd(2, 10 * GIB, GIB),
            ],
            (0..4)
                .map(|s| pg(1, s, all.clone(), 2, 300 << 20))
                .chain((0..4).map(|s| pg(2, s, all.clone(), 5, 600 << 20)))
                .collect(),
        );
        let df = compute(&map, &d);
        assert_eq!(df.raw.total, 30 * GIB);
        assert_eq!(df.raw.used, 3 * GIB);
        assert!((df.raw.used_ratio - 0.1).abs() < 1e-9);
        assert_eq!(df.raw.reporting_osds, 3);

        let rep = &df.pools[0];
        assert_eq!(
            (rep.name.as_str(), rep.kind, rep.size),
            ("rep", "replicated", 3)
        );
        assert_eq!((rep.stored, rep.objects), (1200 << 20, 8));
        assert_eq!(rep.used, 3 * (1200 << 20), "three copies");
        // every OSD holds every PG: 9.5 GiB to the full ratio minus 1 GiB used, per copy
        let room = (10.0 * 0.95 - 1.0) * GIB as f64;
        assert!(
            (rep.max_avail as f64 - room).abs() < 1e3,
            "{}",
            rep.max_avail
        );

        let ec = &df.pools[1];
        assert_eq!(ec.ec, Some(("p21".to_string(), 2, 1)));
        assert_eq!((ec.stored, ec.objects), (2400 << 20, 20));
        assert_eq!(ec.used, 3600 << 20, "1.5× the stored bytes");
        assert!((ec.raw_ratio - 1.5).abs() < 1e-9);
        // each OSD takes a third of 1.5× the data: twice what a size-3 pool can take
        assert!(
            (ec.max_avail as f64 - 2.0 * room).abs() < 1e3,
            "{}",
            ec.max_avail
        );
        let expect = ec.stored as f64 / (ec.stored + ec.max_avail) as f64;
        assert!((ec.percent_used - expect).abs() < 1e-9);
    }

    #[test]
    fn the_fullest_osd_bounds_max_avail() {
        let map = map();
        // osd.2 is nearly full; it holds every PG, so it decides
        let d = digest(
            vec![
                osd(0, 10 * GIB, GIB),
                osd(1, 10 * GIB, GIB),
                osd(2, 10 * GIB, 9 * GIB),
            ],
            (0..4).map(|s| pg(1, s, vec![0, 1, 2], 0, 0)).collect(),
        );
        let rep = &compute(&map, &d).pools[0];
        let room = (10.0 * 0.95 - 9.0) * GIB as f64;
        assert!(
            (rep.max_avail as f64 - room).abs() < 1e3,
            "{}",
            rep.max_avail
        );
        assert_eq!(rep.percent_used, 0.0);
        // a pool with no placement (its PGs unmapped) can take nothing
        let d = digest(vec![osd(0, 10 * GIB, 0)], Vec::new());
        let df = compute(&map, &d);
        assert!(df.pools.iter().all(|p| p.max_avail == 0 && p.stored == 0));
    }

    #[test]
    fn text_and_json_have_ceph_shape() {
        let map = map();
        let d = digest(
            vec![
                osd(0, 10 * GIB, GIB),
                osd(1, 10 * GIB, GIB),
                osd(2, 10 * GIB, GIB),
            ],
            (0..4)
                .map(|s| pg(2, s, vec![0, 1, 2], 1, 1 << 20))
                .collect(),
        );
        let df = compute(&map, &d);
        let text = to_text(&df);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "--- RAW STORAGE ---");
        assert!(
            lines[1].contains("SIZE") && lines[1].contains("%RAW USED"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("TOTAL") && lines[2].contains("30 GiB"),
            "{text}"
        );
        assert_eq!(lines[4], "--- POOLS ---");
        for col in [
            "POOL",
            "ID",
            "STORED",
            "OBJECTS",
            "USED",
            "%USED",
            "MAX AVAIL",
        ] {
            assert!(lines[5].contains(col), "{col}: {text}");
        }
        let ec_line = lines.iter().find(|l| l.starts_with("ec ")).unwrap();
        assert!(
            ec_line.contains("erasure 2+1") && ec_line.contains("4 MiB"),
            "{text}"
        );
        assert!(ec_line.contains("6 MiB"), "USED is 1.5× STORED: {text}");
        let rep_line = lines.iter().find(|l| l.starts_with("rep ")).unwrap();
        assert!(rep_line.contains("replicated 3"), "{text}");

        let j = to_json(&df);
        assert_eq!(j["stats"]["total_bytes"], 30 * GIB);
        assert_eq!(j["stats"]["total_used_raw_bytes"], 3 * GIB);
        let pools = j["pools"].as_array().unwrap();
        assert_eq!(pools.len(), 2);
        let ec = pools.iter().find(|p| p["name"] == "ec").unwrap();
        assert_eq!(ec["type"], "erasure");
        assert_eq!(ec["erasure_code_profile"], "p21");
        assert_eq!((ec["k"].as_u64(), ec["m"].as_u64()), (Some(2), Some(1)));
        assert_eq!(ec["stats"]["stored"], 4 << 20);
        assert_eq!(ec["stats"]["objects"], 4);
        assert_eq!(ec["stats"]["bytes_used"], 6 << 20);
        assert!(ec["stats"]["max_avail"].as_u64().unwrap() > 0);
        let pct = ec["stats"]["percent_used"].as_f64().unwrap();
        assert!(pct > 0.0 && pct < 1.0, "a fraction, as Ceph's: {pct}");
        let rep = pools.iter().find(|p| p["name"] == "rep").unwrap();
        assert_eq!(rep["type"], "replicated");
        assert!(rep.get("k").is_none());
    }
}

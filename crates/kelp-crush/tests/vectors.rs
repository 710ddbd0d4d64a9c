//! Ceph's own answers, checked exactly: every mapping file listed in
//! `shared/vectors/crush/manifest.json` (produced by `crushtool --test --show-mappings`) and every
//! object/PG vector in `shared/vectors/crush/osdmap/` (produced by `osdmaptool`), plus a
//! text → map → text round trip of every map.
//!
//! The vectors live outside the repository, beside it (`../shared/vectors`); set
//! `KELP_VECTORS_DIR` to point elsewhere. A missing directory fails the test: a placement
//! check that silently does nothing is worse than none.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use kelp_crush::{CrushMap, ITEM_NONE, PoolPlacement, crush_hash32_2, object_hash, parse_text};

fn vectors_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KELP_VECTORS_DIR") {
        return PathBuf::from(dir);
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/crush");
    assert!(
        dir.join("manifest.json").exists(),
        "CRUSH test vectors not found at {} (set KELP_VECTORS_DIR to the folder holding \
         manifest.json)",
        dir.display()
    );
    dir
}

fn load_map(cache: &mut HashMap<String, CrushMap>, dir: &Path, rel: &str) -> CrushMap {
    cache
        .entry(rel.to_string())
        .or_insert_with(|| {
            let text = fs::read_to_string(dir.join(rel)).expect("read map");
            parse_text(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
        })
        .clone()
}

fn parse_osd_list(s: &str) -> Vec<i32> {
    if s.is_empty() {
        return Vec::new();
    }
    s.split(',')
        .map(|v| v.trim().parse::<i64>().expect("osd id") as i32)
        .collect()
}

#[test]
fn every_crushtool_mapping_matches() {
    let dir = vectors_dir();
    let manifest: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().expect("files[]");
    assert!(!files.is_empty());
    let mut maps = HashMap::new();
    let mut checked = 0usize;
    let mut failures = Vec::new();
    for entry in files {
        let file = entry["file"].as_str().unwrap();
        let map = load_map(&mut maps, &dir, entry["map"].as_str().unwrap());
        let rule = entry["rule"].as_u64().unwrap() as u32;
        let num_rep = entry["num_rep"].as_u64().unwrap() as usize;
        let pool_id = entry["pool_id"].as_u64().map(|p| p as u32);
        let mut reweights = map.default_reweights();
        for (osd, w) in entry["weight_overrides_16_16"].as_object().unwrap() {
            let osd: usize = osd.trim_start_matches("osd.").parse().unwrap();
            reweights[osd] = w.as_u64().unwrap() as u32;
        }
        let text = fs::read_to_string(dir.join(file)).unwrap();
        let mut lines = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (x, osds) = line.split_once(' ').unwrap_or((line, ""));
            let x: u32 = x.parse().unwrap();
            let want = parse_osd_list(osds);
            let input = pool_id.map_or(x, |p| crush_hash32_2(x, p));
            let got = map.do_rule(rule, input, num_rep, &reweights).unwrap();
            if got != want && failures.len() < 20 {
                failures.push(format!("{file} x={x}: want {want:?} got {got:?}"));
            }
            lines += 1;
        }
        let expected = entry["x_max"].as_u64().unwrap() - entry["x_min"].as_u64().unwrap() + 1;
        assert_eq!(lines as u64, expected, "{file}: line count");
        checked += lines;
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
    eprintln!("checked {checked} mappings in {} files", files.len());
}

/// Pool parameters and marked-out OSDs from an osdmap vector file's `#` header.
struct OsdmapHeader {
    map: String,
    pool: PoolPlacement,
    out: Vec<usize>,
}

fn parse_header(text: &str) -> OsdmapHeader {
    let mut kv: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    let mut map = None;
    for line in text.lines().filter(|l| l.starts_with('#')) {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            match pair[0] {
                "pool" | "size" | "pg_num" | "pgp_num" | "crush_rule" | "rule"
                    if pair[1].parse::<u32>().is_ok() =>
                {
                    kv.entry(pair[0].to_string()).or_insert(pair[1].to_string());
                }
                "--mark-out" => {
                    let osd = pair[1].parse().unwrap();
                    if !out.contains(&osd) {
                        out.push(osd);
                    }
                }
                _ => {}
            }
            if pair[0].trim_end_matches(':') == "map" && pair[1].starts_with("maps/") {
                map.get_or_insert(pair[1].to_string());
            }
        }
    }
    let get = |k: &str| kv.get(k).map(|v| v.parse::<u32>().unwrap());
    let pg_num = get("pg_num").expect("pg_num in header");
    let pool = PoolPlacement {
        pool_id: get("pool").expect("pool in header"),
        pg_num,
        pgp_num: get("pgp_num").unwrap_or(pg_num),
        hashpspool: text.contains("hashpspool"),
        crush_rule: get("crush_rule").or(get("rule")).unwrap_or(0),
        size: get("size").expect("size in header") as usize,
        erasure: false,
    };
    OsdmapHeader {
        map: map.expect("crush map path in header"),
        pool,
        out,
    }
}

#[test]
fn every_osdmaptool_object_and_pg_matches() {
    let dir = vectors_dir();
    let mut maps = HashMap::new();
    let mut names: Vec<PathBuf> = fs::read_dir(dir.join("osdmap"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tsv"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "expected object and PG vector files");
    let mut failures = Vec::new();
    for path in names {
        let text = fs::read_to_string(&path).unwrap();
        let h = parse_header(&text);
        let map = load_map(&mut maps, &dir, &h.map);
        let mut reweights = map.default_reweights();
        for &o in &h.out {
            reweights[o] = 0;
        }
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let is_objects = file.starts_with("objects");
        let mut rows = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let cols: Vec<&str> = line.split('\t').collect();
            let mut check = |what: &str, want: String, got: String| {
                if want != got && failures.len() < 20 {
                    failures.push(format!("{file}: {line}: {what} want {want} got {got}"));
                }
            };
            if is_objects {
                // name raw_hash_hex pgid ps pps acting
                let raw = object_hash(cols[0], None, "");
                check(
                    "hash",
                    u32::from_str_radix(cols[1], 16).unwrap().to_string(),
                    raw.to_string(),
                );
                let pg = h.pool.object_pg(cols[0], None, "");
                check("pgid", cols[2].to_string(), pg.to_string());
                check("ps", cols[3].to_string(), pg.seed.to_string());
                check("pps", cols[4].to_string(), h.pool.pps(pg.seed).to_string());
                let acting = h.pool.raw_osds(&map, pg.seed, &reweights).unwrap();
                check(
                    "acting",
                    format!("{:?}", parse_osd_list(cols[5])),
                    format!("{acting:?}"),
                );
            } else {
                // pgid ps pps raw up acting acting_primary
                let ps: u32 = cols[1].parse().unwrap();
                check(
                    "pgid",
                    cols[0].to_string(),
                    format!("{}.{ps:x}", h.pool.pool_id),
                );
                check("pps", cols[2].to_string(), h.pool.pps(ps).to_string());
                let raw = h.pool.raw_osds(&map, ps, &reweights).unwrap();
                check(
                    "raw",
                    format!("{:?}", parse_osd_list(cols[3])),
                    format!("{raw:?}"),
                );
                let up = h.pool.up_osds(&raw, |_| true);
                check(
                    "up",
                    format!("{:?}", parse_osd_list(cols[4])),
                    format!("{up:?}"),
                );
                let primary = up.iter().copied().find(|&o| o != ITEM_NONE).unwrap_or(-1);
                check("primary", cols[6].to_string(), primary.to_string());
            }
            rows += 1;
        }
        assert!(rows > 0, "{file} has no rows");
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn text_round_trip_is_exact_and_keeps_mappings() {
    let dir = vectors_dir();
    let mut paths: Vec<PathBuf> = fs::read_dir(dir.join("maps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    for path in paths {
        let text = fs::read_to_string(&path).unwrap();
        let map = parse_text(&text).unwrap();
        let printed = map.to_text();
        // The vector maps are crushtool's decompile fixpoint: Kelp must print them identically.
        assert_eq!(
            printed,
            text,
            "{} does not print back identically",
            path.display()
        );
        let again = parse_text(&printed).unwrap();
        let reweights = map.default_reweights();
        for rule in map.rules() {
            for x in 0..500 {
                assert_eq!(
                    map.do_rule(rule.id, x, 3, &reweights).unwrap(),
                    again.do_rule(rule.id, x, 3, &reweights).unwrap()
                );
            }
        }
    }
}

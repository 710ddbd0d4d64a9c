//! One registry of configuration keys (`kelp_config::keys`), and nothing that disagrees with it:
//!
//! * `docs_table_matches_the_registry`: the table in docs/CONFIG.md between its `keys:begin`
//!   and `keys:end` markers is exactly what the registry generates
//!   (`KELP_UPDATE_DOCS=1` rewrites it instead of failing);
//! * `daemon_defaults_match_the_registry`: the built-in defaults of the OSD's and the monitor's
//!   config structs equal the registry's defaults;
//! * `config_help_prints_the_registry`: `kelp config help [KEY]` prints it, without a cluster,
//!   and refuses an unknown key.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kelp_config::keys;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn docs_table_matches_the_registry() {
    let path = repo_root().join("docs/CONFIG.md");
    let doc = std::fs::read_to_string(&path).expect("reading docs/CONFIG.md");
    let (begin, end) = ("<!-- keys:begin -->\n", "<!-- keys:end -->");
    let start = doc
        .find(begin)
        .expect("docs/CONFIG.md has no keys:begin marker")
        + begin.len();
    let stop = doc
        .find(end)
        .expect("docs/CONFIG.md has no keys:end marker");
    let want = keys::markdown_table();
    if doc[start..stop] == want {
        return;
    }
    if std::env::var("KELP_UPDATE_DOCS").is_ok_and(|v| v == "1") {
        let updated = format!("{}{want}{}", &doc[..start], &doc[stop..]);
        std::fs::write(&path, updated).expect("writing docs/CONFIG.md");
        return;
    }
    panic!(
        "docs/CONFIG.md's key table differs from the registry (crates/kelp-config/src/keys.rs); \
         regenerate it with KELP_UPDATE_DOCS=1 cargo test --release -p kelp --test \
         config_registry\n--- docs ---\n{}\n--- registry ---\n{want}",
        &doc[start..stop]
    );
}

#[test]
fn daemon_defaults_match_the_registry() {
    let secs = |d: Duration| d.as_secs_f64();
    // the OSD's recovery throttles
    let r = kelp_osd::recovery::RecoveryConfig::default();
    assert_eq!(
        r.max_backfills as u64,
        keys::OSD_MAX_BACKFILLS.default.as_u64()
    );
    assert_eq!(
        r.max_active as u64,
        keys::OSD_RECOVERY_MAX_ACTIVE.default.as_u64()
    );
    assert_eq!(secs(r.sleep), keys::OSD_RECOVERY_SLEEP.default.as_f64());
    assert_eq!(
        secs(r.snap_trim_sleep),
        keys::OSD_SNAP_TRIM_SLEEP.default.as_f64()
    );
    assert_eq!(
        u64::from(r.op_priority),
        keys::OSD_RECOVERY_OP_PRIORITY.default.as_u64()
    );
    // the remover of deleted pools' PGs
    assert_eq!(
        secs(r.delete_sleep),
        keys::OSD_DELETE_SLEEP.default.as_f64()
    );
    assert_eq!(
        r.delete_batch as u64,
        keys::OSD_TARGET_TRANSACTION_SIZE.default.as_u64()
    );
    // scrub
    let s = kelp_osd::ScrubConfig::default();
    assert_eq!(
        s.chunk_max as u64,
        keys::OSD_SCRUB_CHUNK_MAX.default.as_u64()
    );
    assert_eq!(secs(s.sleep), keys::OSD_SCRUB_SLEEP.default.as_f64());
    assert_eq!(
        secs(s.min_interval),
        keys::OSD_SCRUB_MIN_INTERVAL.default.as_f64()
    );
    assert_eq!(
        secs(s.max_interval),
        keys::OSD_SCRUB_MAX_INTERVAL.default.as_f64()
    );
    assert_eq!(
        secs(s.deep_interval),
        keys::OSD_DEEP_SCRUB_INTERVAL.default.as_f64()
    );
    assert_eq!(
        s.load_threshold,
        keys::OSD_SCRUB_LOAD_THRESHOLD.default.as_f64()
    );
    // heartbeats
    let h = kelp_osd::heartbeat::HeartbeatConfig::default();
    assert_eq!(
        secs(h.interval),
        keys::OSD_HEARTBEAT_INTERVAL.default.as_f64()
    );
    assert_eq!(secs(h.grace), keys::OSD_HEARTBEAT_GRACE.default.as_f64());
    // the PG log
    let o = kelp_osd::OsdConfig::new(0);
    assert_eq!(
        o.max_pg_log_entries as u64,
        keys::OSD_MAX_PG_LOG_ENTRIES.default.as_u64()
    );
    // the monitor's full ratios (millionths)
    let f = kelp_mon::pgmap::FullRatios::default();
    let ppm = |k: &keys::KeyDef| (k.default.as_f64() * 1e6).round() as u32;
    assert_eq!(f.nearfull_ppm, ppm(&keys::MON_OSD_NEARFULL_RATIO));
    assert_eq!(f.backfillfull_ppm, ppm(&keys::MON_OSD_BACKFILLFULL_RATIO));
    assert_eq!(f.full_ppm, ppm(&keys::MON_OSD_FULL_RATIO));
}

fn kelp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

#[test]
fn config_help_prints_the_registry() {
    let out = kelp(&["config", "help", "osd_max_backfills"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        keys::help_text(&keys::OSD_MAX_BACKFILLS)
    );
    let out = kelp(&["config", "help"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), keys::KEYS.len() + 1, "{text}");
    for k in keys::KEYS {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{} ", k.name))),
            "{} missing from:\n{text}",
            k.name
        );
    }
    let out = kelp(&["config", "help", "--format", "json", "mon_osd_full_ratio"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["default"], "0.95");
    assert_eq!(v["range"], "0..=1");
    let out = kelp(&["config", "help", "osd_max_backfils"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown config key 'osd_max_backfils'"),
        "{out:?}"
    );
}

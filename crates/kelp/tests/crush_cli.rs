//! `kelp crush …` as a user runs it: the real binary, its stdout compared line for line with
//! what Ceph's tools printed (the shared vectors), and clear failures on bad input.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn vectors() -> PathBuf {
    let dir = std::env::var("KELP_VECTORS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors/crush")
        });
    assert!(
        dir.join("manifest.json").exists(),
        "vectors missing at {}",
        dir.display()
    );
    dir
}

fn kelp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(args)
        .output()
        .expect("run kelp")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "kelp failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn crush_test_prints_what_crushtool_printed() {
    let dir = vectors();
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    for entry in manifest["files"].as_array().unwrap() {
        let file = entry["file"].as_str().unwrap();
        let map = dir.join(entry["map"].as_str().unwrap());
        let rule = entry["rule"].to_string();
        let mut args: Vec<String> = vec![
            "crush".into(),
            "test".into(),
            "--map".into(),
            map.display().to_string(),
            "--rule".into(),
            rule.clone(),
            "--num-rep".into(),
            entry["num_rep"].to_string(),
            "--min-x".into(),
            entry["x_min"].to_string(),
            "--max-x".into(),
            entry["x_max"].to_string(),
        ];
        if let Some(p) = entry["pool_id"].as_u64() {
            args.extend(["--pool-id".into(), p.to_string()]);
        }
        for (osd, w) in entry["weight_overrides"].as_object().unwrap() {
            args.extend(["--weight".into(), osd.clone(), w.to_string()]);
        }
        let args_ref: Vec<&str> = args.iter().map(String::as_str).collect();
        let got = stdout(&kelp(&args_ref));
        // The vector files hold "<x> <a,b,c>"; crushtool printed "CRUSH rule R x <x> [a,b,c]".
        let want: String = std::fs::read_to_string(dir.join(file))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (x, osds) = l.split_once(' ').unwrap_or((l, ""));
                format!("CRUSH rule {rule} x {x} [{osds}]\n")
            })
            .collect();
        assert!(
            got == want,
            "{file}: kelp crush test output differs from crushtool's"
        );
    }
}

#[test]
fn map_object_prints_what_osdmaptool_printed() {
    let dir = vectors();
    for (tsv, out) in [
        ("objects_b_hosts.tsv", None),
        ("objects_b_hosts_out4.tsv", Some("4")),
    ] {
        let text = std::fs::read_to_string(dir.join("osdmap").join(tsv)).unwrap();
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split('\t').collect())
            .collect();
        let map = dir.join("maps/b_hosts.txt").display().to_string();
        let mut args = vec![
            "crush",
            "map-object",
            "--map",
            &map,
            "--rule",
            "0",
            "--pool-id",
            "1",
            "--pg-num",
            "768",
            "--size",
            "3",
        ];
        if let Some(osd) = out {
            args.extend(["--weight", osd, "0"]);
        }
        args.push("--");
        args.extend(rows.iter().map(|r| r[0]));
        let got = stdout(&kelp(&args));
        let want: String = rows
            .iter()
            .map(|r| format!(" object '{}' -> {} -> [{}]\n", r[0], r[2], r[5]))
            .collect();
        assert_eq!(got, want, "{tsv}");
    }
}

#[test]
fn show_prints_maps_back_unchanged_and_build_makes_valid_maps() {
    let dir = vectors();
    for m in ["a_flat", "b_hosts", "c_racks", "d_ec", "e_classes"] {
        let path = dir.join(format!("maps/{m}.txt"));
        let got = stdout(&kelp(&["crush", "show", "--map", path.to_str().unwrap()]));
        assert_eq!(got, std::fs::read_to_string(&path).unwrap(), "{m}");
    }
    let built = stdout(&kelp(&[
        "crush",
        "build",
        "--hosts",
        "4",
        "--osds-per-host",
        "2",
    ]));
    let tmp = std::env::temp_dir().join(format!("kelp-built-{}.txt", std::process::id()));
    std::fs::write(&tmp, &built).unwrap();
    let shown = stdout(&kelp(&["crush", "show", "--map", tmp.to_str().unwrap()]));
    assert_eq!(shown, built, "a built map prints back unchanged");
    let mapped = stdout(&kelp(&[
        "crush",
        "test",
        "--map",
        tmp.to_str().unwrap(),
        "--rule",
        "0",
        "--num-rep",
        "3",
        "--max-x",
        "9",
    ]));
    assert_eq!(mapped.lines().count(), 10);
    std::fs::remove_file(&tmp).ok();
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let dir = vectors();
    let map = dir.join("maps/b_hosts.txt").display().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "crush",
                "test",
                "--map",
                &map,
                "--rule",
                "9",
                "--num-rep",
                "3",
            ],
            "rule 9 does not exist",
        ),
        (
            vec![
                "crush",
                "test",
                "--map",
                &map,
                "--rule",
                "0",
                "--num-rep",
                "0",
            ],
            "--num-rep 0 is out of range",
        ),
        (
            vec![
                "crush",
                "test",
                "--map",
                &map,
                "--rule",
                "0",
                "--num-rep",
                "3",
                "--min-x",
                "5",
                "--max-x",
                "1",
            ],
            "--min-x 5 is greater",
        ),
        (
            vec![
                "crush",
                "test",
                "--map",
                &map,
                "--rule",
                "0",
                "--num-rep",
                "3",
                "--weight",
                "99",
                "0",
            ],
            "osd.99 is not in the map",
        ),
        (
            vec![
                "crush",
                "test",
                "--map",
                &map,
                "--rule",
                "0",
                "--num-rep",
                "3",
                "--weight",
                "1",
                "half",
            ],
            "'half' is not a number",
        ),
        (
            vec![
                "crush",
                "test",
                "--map",
                "/nonexistent/map.txt",
                "--rule",
                "0",
                "--num-rep",
                "3",
            ],
            "cannot read CRUSH map",
        ),
        (
            vec![
                "crush",
                "map-object",
                "--map",
                &map,
                "--rule",
                "0",
                "--pool-id",
                "1",
                "--pg-num",
                "0",
                "--size",
                "3",
                "x",
            ],
            "--pg-num must be at least 1",
        ),
    ];
    for (args, want) in cases {
        let o = kelp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(
            err.contains(want),
            "{args:?}: stderr {err:?} lacks {want:?}"
        );
    }
    // A malformed map names the file and line.
    let tmp = std::env::temp_dir().join(format!("kelp-bad-{}.txt", std::process::id()));
    std::fs::write(
        &tmp,
        "device 0 osd.0\ntype 0 osd\ntype 1 host\nhost h {\n\talg straw\n}\n",
    )
    .unwrap();
    let o = kelp(&["crush", "show", "--map", tmp.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("line 5") && err.contains("straw2"), "{err}");
    std::fs::remove_file(&tmp).ok();
}

/// A reader that goes away ends the command like any Unix tool (killed by SIGPIPE, nothing on
/// stderr), although SIGPIPE is ignored in the process so that sockets closed by peers are
/// errors, not deaths.
#[test]
fn closed_stdout_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kelp"))
        .args(["crush", "build", "--hosts", "2000", "--osds-per-host", "10"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kelp");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "# begin crush map\n");
    drop(out);
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGPIPE),
        "{status:?}, stderr: {err}"
    );
    assert_eq!(err, "");
}

//! Erasure-code profiles and erasure-coded pools as an operator manages them, on a real
//! three-OSD cluster (`kelp up`: one host, failure domain osd): `kelp osd erasure-code-profile
//! set|get|ls|rm`, `kelp pool create --erasure` and Ceph's positional form, `pool ls detail`,
//! `pool get`, `pool set fast_read`, and the refusals an operator must be able to read: too few
//! failure domains (with the numbers), a profile in use, an erasure-coded pool's fixed size.
//!
//! No object is written to the erasure-coded pools (the OSDs' erasure-coded data path is not
//! part of this test), and nothing waits for their PGs to go active+clean.

mod heal_support;

use std::process::Output;

use heal_support::{Cluster, kelp};

/// `kelp ARGS -c CONF`.
fn run(c: &Cluster, args: &[&str]) -> Output {
    let conf = c.conf();
    let mut all = args.to_vec();
    all.extend(["-c", &conf]);
    kelp(&all)
}

/// Asserts that `kelp ARGS` fails and that its error names every needle.
fn refused(c: &Cluster, args: &[&str], needles: &[&str]) -> String {
    let out = run(c, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "kelp {args:?} was accepted: {err}");
    for n in needles {
        assert!(err.contains(n), "kelp {args:?}: {n:?} not in: {err}");
    }
    err
}

#[test]
fn erasure_code_profiles_and_pools_from_the_cli() {
    let c = Cluster::up(3, 8);

    // profiles: the default one exists; a new one reads back as Ceph prints it
    let ls = c.cli(&["osd", "erasure-code-profile", "ls"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), ["default"]);
    let set = [
        "osd",
        "erasure-code-profile",
        "set",
        "p21",
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
    ];
    c.cli(&set);
    c.cli(&set); // the same settings again: fine
    let get = c.cli(&["osd", "erasure-code-profile", "get", "p21"]);
    for line in [
        "k=2",
        "m=1",
        "crush-failure-domain=osd",
        "crush-root=default",
    ] {
        assert!(get.lines().any(|l| l == line), "{line} not in:\n{get}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&c.cli(&["osd", "erasure-code-profile", "get", "p21", "-f", "json"]))
            .unwrap();
    assert_eq!((&json["k"], &json["m"]), (&"2".into(), &"1".into()));
    let names: Vec<String> =
        serde_json::from_str(&c.cli(&["osd", "erasure-code-profile", "ls", "--format", "json"]))
            .unwrap();
    assert_eq!(names, ["default", "p21"]);
    refused(
        &c,
        &["osd", "erasure-code-profile", "set", "p21", "k=3", "m=1"],
        &["will not override erasure code profile p21", "--force"],
    );
    refused(
        &c,
        &["osd", "erasure-code-profile", "set", "bad", "k=0"],
        &["k must be at least 1"],
    );
    refused(
        &c,
        &["osd", "erasure-code-profile", "get", "nope"],
        &["erasure-code profile 'nope' does not exist"],
    );

    // an erasure-coded pool, and how it is shown
    c.cli(&[
        "pool",
        "create",
        "ecpool",
        "--pg-num",
        "8",
        "--erasure",
        "p21",
    ]);
    let detail = c.cli(&["pool", "ls", "detail"]);
    let line = detail
        .lines()
        .find(|l| l.contains("'ecpool'"))
        .unwrap_or_else(|| panic!("no ecpool in:\n{detail}"));
    assert!(
        line.contains("'ecpool' erasure profile p21 k=2 m=1 size 3 min_size 2")
            && line.contains("pg_num 8")
            && line.ends_with("stripe_width 8192 fast_read 0"),
        "{line}"
    );
    assert!(
        detail.lines().any(|l| l.contains("'data' replicated size")),
        "{detail}"
    );
    let pool: serde_json::Value =
        serde_json::from_str(&c.cli(&["pool", "get", "ecpool", "-f", "json"])).unwrap();
    assert_eq!(pool["type"], "erasure");
    assert_eq!(pool["erasure_code_profile"], "p21");
    assert_eq!(pool["size"], 3);
    let rules = c.cli(&["crush", "rule", "ls"]);
    assert!(
        rules.lines().any(|r| r == "ecpool"),
        "the pool's own rule: {rules}"
    );

    // Ceph's positional form
    c.cli(&["pool", "create", "ecpool2", "8", "erasure", "p21"]);
    assert!(
        c.cli(&["pool", "get", "ecpool2", "erasure_code_profile"])
            .contains("erasure_code_profile: p21")
    );

    // refusals, with what to do about them
    c.cli(&[
        "osd",
        "erasure-code-profile",
        "set",
        "p42",
        "k=4",
        "m=2",
        "crush-failure-domain=osd",
    ]);
    refused(
        &c,
        &["pool", "create", "big", "--pg-num", "8", "--erasure", "p42"],
        &[
            "profile 'p42' needs k+m = 6 failure domains of type osd under root default, the \
             CRUSH map has 3",
        ],
    );
    refused(
        &c,
        &["pool", "create", "hosts", "--pg-num", "8", "--erasure"],
        &[
            "profile 'default' needs k+m = 4 failure domains of type host under root default, \
             the CRUSH map has 1: use crush-failure-domain=osd or add hosts",
        ],
    );
    refused(
        &c,
        &["pool", "create", "sized", "--erasure", "p21", "--size", "4"],
        &["the size of an erasure-coded pool is k+m = 3"],
    );
    refused(
        &c,
        &["osd", "erasure-code-profile", "rm", "p21"],
        &["erasure-code profile 'p21' is used by pool(s) ecpool, ecpool2"],
    );
    refused(
        &c,
        &["pool", "set", "ecpool", "size", "4"],
        &["the size of an erasure-coded pool is k+m and cannot change"],
    );
    refused(
        &c,
        &["pool", "set", "data", "fast_read", "true"],
        &["fast_read applies to erasure-coded pools only"],
    );
    let names = c.cli(&["pool", "ls"]);
    assert!(
        !names
            .lines()
            .any(|n| ["big", "hosts", "sized"].contains(&n)),
        "{names}"
    );

    // fast_read
    c.cli(&["pool", "set", "ecpool", "fast_read", "true"]);
    assert!(
        c.cli(&["pool", "ls", "detail"])
            .lines()
            .any(|l| l.contains("'ecpool'") && l.ends_with("fast_read 1"))
    );
    assert_eq!(
        c.cli(&["pool", "get", "ecpool", "fast_read"]).trim(),
        "fast_read: true"
    );

    // once its pools are gone, the profile can go, and so do the pools' own rules
    for p in ["ecpool", "ecpool2"] {
        c.cli(&["pool", "rm", p, "--yes-i-really-mean-it"]);
    }
    c.cli(&["osd", "erasure-code-profile", "rm", "p21"]);
    let ls = c.cli(&["osd", "erasure-code-profile", "ls"]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), ["default", "p42"]);
    let rules = c.cli(&["crush", "rule", "ls"]);
    assert!(!rules.lines().any(|r| r.starts_with("ecpool")), "{rules}");
}

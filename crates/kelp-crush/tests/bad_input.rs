//! Malformed or unsupported maps are refused with an error that names the line and the
//! problem; nothing is ever mapped silently wrong.

use kelp_crush::{CrushError, CrushMap, parse_text};

const HEADER: &str = "tunable choose_local_tries 0
tunable choose_local_fallback_tries 0
tunable choose_total_tries 50
tunable chooseleaf_descend_once 1
tunable chooseleaf_vary_r 1
tunable chooseleaf_stable 1
device 0 osd.0
device 1 osd.1
type 0 osd
type 1 host
type 11 root
";

/// A valid map with `extra` lines spliced in before the buckets.
fn with(extra_before_buckets: &str, buckets: &str) -> String {
    format!("{HEADER}{extra_before_buckets}{buckets}")
}

const BUCKETS: &str = "host h0 {
\tid -2
\talg straw2
\thash 0
\titem osd.0 weight 1.000
\titem osd.1 weight 1.000
}
root default {
\tid -1
\talg straw2
\thash 0
\titem h0
}
rule r {
\tid 0
\ttype replicated
\tstep take default
\tstep chooseleaf firstn 0 type osd
\tstep emit
}
";

fn err_of(text: &str) -> (usize, String) {
    match parse_text(text) {
        Err(CrushError::Parse { line, message }) => (line, message),
        Err(other) => panic!("expected a parse error, got {other}"),
        Ok(_) => panic!("map was accepted:\n{text}"),
    }
}

#[test]
fn the_base_map_is_valid() {
    let map = parse_text(&with("", BUCKETS)).unwrap();
    let r = map.do_rule(0, 1, 2, &map.default_reweights()).unwrap();
    assert_eq!(r.len(), 2);
}

#[test]
fn unknown_keyword_names_its_line() {
    let (line, msg) = err_of(&with("frobnicate 3\n", BUCKETS));
    assert_eq!(line, 12);
    assert!(msg.contains("frobnicate"), "{msg}");
}

#[test]
fn other_bucket_algorithms_are_refused() {
    for alg in ["straw", "uniform", "list", "tree"] {
        let text = with(
            "",
            &BUCKETS.replacen("alg straw2", &format!("alg {alg}"), 1),
        );
        let (line, msg) = err_of(&text);
        assert_eq!(line, 14, "{msg}");
        assert!(msg.contains(alg) && msg.contains("straw2"), "{msg}");
    }
    let (_, msg) = err_of(&with("", &BUCKETS.replacen("alg straw2", "alg magic", 1)));
    assert!(msg.contains("unknown bucket algorithm 'magic'"), "{msg}");
}

#[test]
fn unknown_step_is_refused() {
    let text = with("", &BUCKETS.replace("step emit", "step scatter"));
    let (line, msg) = err_of(&text);
    assert_eq!(line, 30);
    assert!(msg.contains("unknown step 'scatter'"), "{msg}");
}

#[test]
fn dangling_references_are_refused() {
    let (line, msg) = err_of(&with(
        "",
        &BUCKETS.replace("item osd.1 weight", "item osd.7 weight"),
    ));
    assert_eq!(line, 17);
    assert!(
        msg.contains("osd.7") && msg.contains("not defined"),
        "{msg}"
    );
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("step take default", "step take nowhere"),
    ));
    assert!(msg.contains("nowhere"), "{msg}");
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("type osd\n\tstep emit", "type rack\n\tstep emit"),
    ));
    assert!(msg.contains("rack"), "{msg}");
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("step take default", "step take default class ssd"),
    ));
    assert!(msg.contains("class 'ssd' does not exist"), "{msg}");
}

#[test]
fn a_bucket_cannot_contain_itself_or_an_item_twice() {
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("\titem h0\n", "\titem h0\n\titem default\n"),
    ));
    assert!(
        msg.contains("default") && msg.contains("not defined"),
        "{msg}"
    );
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("\titem osd.1 weight 1.000\n", "\titem osd.0\n"),
    ));
    assert!(msg.contains("twice"), "{msg}");
}

#[test]
fn duplicate_ids_and_names_are_refused() {
    let (line, msg) = err_of(&with("device 1 osd.9\n", BUCKETS));
    assert_eq!(line, 12);
    assert!(msg.contains("device id 1"), "{msg}");
    let (_, msg) = err_of(&with("device 5 osd.1\n", BUCKETS));
    assert!(msg.contains("osd.1"), "{msg}");
    let (_, msg) = err_of(&with("", &BUCKETS.replace("\tid -1\n", "\tid -2\n")));
    assert!(msg.contains("-2"), "{msg}");
    let dup_rule = format!(
        "{BUCKETS}{}",
        BUCKETS
            .split("rule r {")
            .nth(1)
            .map(|r| format!("rule r2 {{{r}"))
            .unwrap()
    );
    let (_, msg) = err_of(&with("", &dup_rule));
    assert!(msg.contains("rule id 0"), "{msg}");
    let (_, msg) = err_of(&with("type 1 rack\n", BUCKETS));
    assert!(msg.contains("type id 1"), "{msg}");
}

#[test]
fn malformed_values_are_refused() {
    let (line, msg) = err_of(&with(
        "",
        &BUCKETS.replace("weight 1.000\n\titem osd.1", "weight heavy\n\titem osd.1"),
    ));
    assert_eq!(line, 16);
    assert!(msg.contains("heavy"), "{msg}");
    let (_, msg) = err_of(&with(
        "",
        &BUCKETS.replace("weight 1.000\n\titem osd.1", "weight -1\n\titem osd.1"),
    ));
    assert!(msg.contains("-1"), "{msg}");
    let (_, msg) = err_of(&format!("tunable choose_total_tries many\n{HEADER}"));
    assert!(msg.contains("many"), "{msg}");
    let (_, msg) = err_of(&format!("tunable warp_speed 9\n{HEADER}"));
    assert!(msg.contains("warp_speed"), "{msg}");
    let (_, msg) = err_of(&with("", &BUCKETS.replace("firstn 0", "sideways 0")));
    assert!(msg.contains("sideways"), "{msg}");
    let (_, msg) = err_of(&with("", &BUCKETS.replace("hash 0", "hash 3")));
    assert!(msg.contains("hash"), "{msg}");
}

#[test]
fn truncated_map_is_refused() {
    let text = with("", BUCKETS);
    let cut = &text[..text.len() - 3];
    let (_, msg) = err_of(cut);
    assert!(msg.contains("end of map"), "{msg}");
    let (_, msg) = err_of(&with("", "host h0 {\n\tid -2\n"));
    assert!(msg.contains("end of map"), "{msg}");
}

#[test]
fn choose_args_are_refused_not_ignored() {
    let (_, msg) = err_of(&with("", &format!("{BUCKETS}choose_args 1 {{\n}}\n")));
    assert!(msg.contains("choose_args"), "{msg}");
}

#[test]
fn legacy_tunables_parse_and_print_but_do_not_map() {
    // Without tunable lines a map means the legacy profile, which needs the permutation
    // fallback that Kelp does not implement: refuse to map rather than map differently.
    let text = with("", BUCKETS)
        .lines()
        .filter(|l| !l.starts_with("tunable"))
        .collect::<Vec<_>>()
        .join("\n");
    let map = parse_text(&text).unwrap();
    let err = map.do_rule(0, 1, 2, &map.default_reweights()).unwrap_err();
    assert!(matches!(err, CrushError::Unsupported(_)), "{err}");
    assert!(map.to_text().contains("# begin crush map"));
    assert!(
        !map.to_text().contains("tunable"),
        "legacy values are not printed"
    );
}

#[test]
fn mapping_requests_are_checked() {
    let map = parse_text(&with("", BUCKETS)).unwrap();
    let w = map.default_reweights();
    assert!(matches!(
        map.do_rule(5, 1, 2, &w),
        Err(CrushError::NoSuchRule { rule: 5, .. })
    ));
    assert!(matches!(
        map.do_rule(0, 1, 0, &w),
        Err(CrushError::BadNumRep { .. })
    ));
    assert!(matches!(
        map.do_rule(0, 1, 100_000, &w),
        Err(CrushError::BadNumRep { .. })
    ));
    // An empty reweight vector means every device is out: empty result, no panic.
    assert_eq!(map.do_rule(0, 1, 2, &[]).unwrap(), Vec::<i32>::new());
}

#[test]
fn api_refuses_invalid_buckets() {
    let mut map = CrushMap::with_default_types();
    map.add_device(0, "osd.0", None).unwrap();
    assert!(
        map.add_bucket(None, "h", 1, &[(3, None)]).is_err(),
        "undefined device"
    );
    assert!(
        map.add_bucket(None, "h", 99, &[(0, None)]).is_err(),
        "undefined type"
    );
    assert!(
        map.add_bucket(None, "h", 0, &[(0, None)]).is_err(),
        "type 0 is for devices"
    );
    assert!(
        map.add_bucket(Some(3), "h", 1, &[(0, None)]).is_err(),
        "positive bucket id"
    );
    assert!(map.add_bucket(None, "bad name", 1, &[(0, None)]).is_err());
    assert!(
        map.add_bucket(None, "a~b", 1, &[(0, None)]).is_err(),
        "'~' is for shadows"
    );
    let h = map.add_bucket(None, "h", 1, &[(0, None)]).unwrap();
    assert_eq!(h, -1);
    assert!(
        map.add_bucket(Some(-1), "h2", 1, &[(0, None)]).is_err(),
        "reused id"
    );
    assert!(map.add_bucket(None, "h", 1, &[]).is_err(), "reused name");
    map.finalize().unwrap();
}
